"""Recovery: rings in, one answer out, in one pass and one direction.

``pipeline.recover_rings`` reads each ring (``ring.reader``), turns it into a
timeline (``timeline``), gathers the facts outside it once (``evidence``),
diagnoses the death (``diagnosis``, pure), and assembles the metadata
(``metadata``, pure). ``bundle`` is the only module that writes a bundle; what
the views render (summary, picture) is handed to it, never imported by it.
"""
