"""Views: recovered timelines and metadata drawn for people and other tools.

Pure functions of a timeline table and its metadata: ``summary`` (Markdown),
``plot`` (a matplotlib Figure), ``perfetto`` (trace-event JSON), ``live`` (one
frame of ``blackbox watch``), ``stacks`` (summary.md's stack sections, folded
stacks). Writing files is the caller's job.
"""
