"""One exception hierarchy: every error of ringfeed is a ``ringfeed.Error``.

Each negative return code of the C library has its own class; the message is
the library's own (``rf_last_error``), which names the loader, the rank and
what to do.
"""

import builtins

from . import _lib


class Error(RuntimeError):
    """Base of every ringfeed error. ``code`` is the C return code (or None)."""

    code = None


class InvalidArgumentError(Error, ValueError):
    """A bad argument: an invalid loader name, a missing RINGFEED_NAME, a bad timeout."""

    code = _lib.RF_E_INVALID


class CorruptSegmentError(Error):
    """The segment is corrupt, truncated, or not a ringfeed segment."""

    code = _lib.RF_E_CORRUPT


class VersionMismatchError(Error):
    """The loader and this library speak different ring ABI versions."""

    code = _lib.RF_E_VERSION


class RankError(Error, ValueError):
    """The rank is negative or not below the loader's world size."""

    code = _lib.RF_E_RANK


class RankBusyError(Error):
    """Another live process is attached to this rank."""

    code = _lib.RF_E_BUSY


class LoaderGoneError(Error):
    """The loader died (or was killed) before the end of the run."""

    code = _lib.RF_E_LOADER_GONE


class AbortedError(Error):
    """The loader stopped early on purpose (a signal or an error of its own)."""

    code = _lib.RF_E_ABORTED


class StaleBatchError(Error):
    """A release of a batch that is not (or no longer) held."""

    code = _lib.RF_E_STALE


class IOFailureError(Error):
    """An operating-system call failed inside the library."""

    code = _lib.RF_E_IO


class InternalError(Error):
    """A bug inside ringfeed; please report the message."""

    code = _lib.RF_E_INTERNAL


class FeedTimeoutError(Error, builtins.TimeoutError):
    """No loader appeared (attach), or no batch came (next), within the timeout.

    Also a builtin ``TimeoutError``, so ``except TimeoutError`` catches it.
    """

    code = _lib.RF_TIMEOUT


#: The old name of :class:`FeedTimeoutError`, kept for a release. It is not in
#: ``ringfeed.__all__``: ``from ringfeed import *`` shadowed the builtin with it.
TimeoutError = FeedTimeoutError


class AllSlotsHeldError(Error):
    """The next batch goes into a slot that still holds a batch this process
    took and has not given back, so no wait could end: a rank's batches take
    its ``slots_per_rank`` slots in turn, and holding one batch (or a view of
    it) stops the rank that many batches later. Raised at once, whatever the
    timeout; nothing was taken, so call next() again after giving it back."""

    code = _lib.RF_E_HELD


class ForkedError(Error):
    """The feed was attached by the parent of this forked process (a fork-based
    DataLoader worker, multiprocessing with 'fork'): a child cannot take or give
    back the parent's batches. Take batches in the process that attached (a
    torch DataLoader over a feed needs num_workers=0), or attach in the child
    and not in the parent."""

    code = _lib.RF_E_FORKED


class UntrustedLoaderError(Error):
    """The loader's segment belongs to another user (not this one, not root):
    loader names are shared by every user of the machine, so another user's
    loader may hold the name and serve anything. Raised at once; the message
    names the owner. Use another loader name, or trust that uid on purpose
    with ``RINGFEED_TRUST_UID=UID``."""

    code = _lib.RF_E_UNTRUSTED


class ResumeMismatchError(Error, ValueError):
    """A checkpoint's resume state does not fit the loader it is to go on
    with: the loader starts elsewhere, or serves another sample order (other
    dataset size, seed or shuffle). Raised by ``check_resume``, not by the C
    library; the message names the loader flag to fix."""


_BY_CODE = {
    cls.code: cls
    for cls in (
        InvalidArgumentError,
        CorruptSegmentError,
        VersionMismatchError,
        RankError,
        RankBusyError,
        LoaderGoneError,
        AbortedError,
        StaleBatchError,
        IOFailureError,
        InternalError,
        FeedTimeoutError,
        AllSlotsHeldError,
        ForkedError,
        UntrustedLoaderError,
    )
}


def error_for(code, message):
    """The exception for C return code ``code`` with ``message``."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return Error("ringfeed: unknown return code %d: %s" % (code, message))
    return cls(message or "ringfeed: return code %d" % code)
