"""Errors raised for bad input, and the recorder's warning category.

Every error that a user can cause with bad input (a missing file, a file that
is not a ring, a damaged header) is a :class:`BlackboxError`. Its message is one
line that says what was expected and what was found, so the CLI can print it
as-is and exit non-zero without a traceback.
"""

from __future__ import annotations


def one_line(text: str) -> str:
    """``text`` with control characters escaped: file names in a message may hold newlines or
    terminal escapes, and a message is one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


class BlackboxError(Exception):
    """Base class of every error blackbox raises for bad input."""


class RingNotFoundError(BlackboxError):
    """The path given does not exist or holds no ring files."""


class NothingThereError(RingNotFoundError):
    """Nothing at all at the path (a file that is optional may be absent)."""


class NotARingError(BlackboxError):
    """The file does not start with the ring magic (empty, garbage, another format)."""


class UnsupportedVersionError(BlackboxError):
    """The ring was written in a format version this reader does not know."""


class CorruptHeaderError(BlackboxError):
    """The header's magic is right but its fields or checksum are not."""


class UnsafeInputError(BlackboxError):
    """An input is a symbolic link, a special file (FIFO, device, socket) or a file of the wrong owner:
    refused unread (recovery may run as root over folders other users wrote)."""


class BundleDestinationError(BlackboxError):
    """The bundle's destination (-o) is neither a usable folder nor a pyarrow filesystem URI."""


class BlackboxWarning(RuntimeWarning):
    """Issued when the recorder cannot do its job; the training job carries on."""
