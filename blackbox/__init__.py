"""blackbox: a crash-survivable flight recorder for machine-learning training jobs.

    import blackbox
    blackbox.arm()                  # maps an on-disk ring; survives SIGKILL
    blackbox.step()                 # per training step
    with blackbox.phase("forward"):
        ...
    blackbox.mark("checkpoint", 3)
    blackbox.on_alert(lambda alert: print(alert))   # memory near its limit, a leak, the time left

After a death: ``blackbox recover RING -o bundle/`` (or :func:`recover`).
"""

from ._api import active, arm, capture_oom, disarm, mark, phase, recover, step
from ._errors import (
    BlackboxError,
    BlackboxWarning,
    CorruptHeaderError,
    NotARingError,
    RingNotFoundError,
    UnsupportedVersionError,
)
from ._recorder import Recorder
from ._version import __version__
from .collect.alert_actions import on_alert
from .collect.alerts import Alert

__all__ = [
    "Alert",
    "BlackboxError",
    "BlackboxWarning",
    "CorruptHeaderError",
    "NotARingError",
    "Recorder",
    "RingNotFoundError",
    "UnsupportedVersionError",
    "__version__",
    "active",
    "arm",
    "capture_oom",
    "disarm",
    "mark",
    "on_alert",
    "phase",
    "recover",
    "step",
]

# `blackbox run` arms a process once it imports numpy; where that import was this package's own (a job that
# imports blackbox first), its bootstrap (run/bootstrap.py, ARM_WHEN_IMPORTED) left the arming to this line
_arm_when_imported = globals().pop("_arm_when_imported", None)
if _arm_when_imported is not None:
    _arm_when_imported()
del _arm_when_imported
