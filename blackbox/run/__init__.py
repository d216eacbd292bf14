"""``blackbox run``: arm every Python process of a job with no code change.

``launcher`` starts the job with ``bootstrap`` importable as its
``sitecustomize``, forwards signals, and recovers what the job left;
``bootstrap`` is what runs inside each of the job's Python processes.
"""
