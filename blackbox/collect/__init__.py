"""Collectors: what the recorder watches in the live job, written into its ring.

Each collector is given the ring's write functions and never raises into the
job. Nothing here imports torch: the torch-side collectors find the job's own
torch in ``sys.modules``.

- ``host``: RSS, children, the memory cgroup (v1, v2), MemAvailable, PSI;
- ``gpu``: accelerator memory through torch, once the job has set a device up;
- ``torch_hooks``: optimizer steps and phases, module events, the OOM observer, allocator history;
- ``exceptions``: chained excepthooks and ``capture_oom``;
- ``oom``: which exceptions are out-of-memory errors and the figures in their messages (pure);
- ``signals``: signal events and the faulthandler crash file;
- ``stacks``: Python stacks of the main thread (and named threads) at each tick, into the stack table.
"""
