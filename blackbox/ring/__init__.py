"""The ring: the on-disk format, the write path, the file and reading it back.

The lowest stage. Nothing here imports another stage; every other stage reads
or writes rings through these modules:

- ``format``: byte layout, header, slots, strings, the commit rule (``FORMAT.md`` beside it);
- ``writer`` (and the optional C extension ``_cwriter``): the lock-free hot path;
- ``file``: where a ring lives, its name and sidecars, creating and mapping it, liveness;
- ``reader``: an untrusted ring read back, record by valid record;
- ``retention``: keeping a folder of rings within a count and a size.
"""
