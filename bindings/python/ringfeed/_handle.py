"""The attachment and the slots it holds: the lifetime rules that keep every
zero-copy view valid.

Ownership, from the bottom up:

- ``Handle`` owns one ``rf_feed*``. A ``weakref.finalize`` on it calls
  ``rf_detach`` (which unmaps the ring) when the last strong reference goes.
- Each taken batch has one *base*: a ctypes byte array laid over the slot
  payload. Every view (``sample()``, ``array()``, ``buffer()``, and anything
  numpy or torch derives from them) keeps the base alive through the buffer
  protocol. A ``weakref.finalize`` on the base releases the slot when the base
  dies (``give_back``), and holds the handle strongly until then: the
  mapping outlives every view, and the slot outlives every view.
- ``Batch`` (``_batch.py``) and ``Feed`` (``_feed.py``) only hold references;
  ``release()`` and ``close()`` drop them, so the real release or detach
  happens when the last view dies.
"""

import _thread
import collections
import ctypes
import gc
import os
import sys
import threading
import warnings
import weakref

from . import _lib
from ._lib import LIB


# A collection of a reference cycle runs the weakref callbacks (the
# finalizers below) of the cycle's objects before the __del__ methods of its
# other objects, which may still read a view of a batch: a slot given back
# then would be refilled under that read, and a feed detached then would be
# unmapped under it (a segfault). While a collection runs, the finalizers
# wait for its end, in the order they came.
_GC_RUNNING = [False]
_GC_DEFERRED = collections.deque()


def _on_gc(phase, _info):
    if phase == "start":
        _GC_RUNNING[0] = True
        return
    _GC_RUNNING[0] = False
    while True:
        try:
            finalizer, args = _GC_DEFERRED.popleft()
        except IndexError:
            return
        finalizer(*args)


gc.callbacks.append(_on_gc)


def _deferred_by_gc(finalizer, *args):
    """True (and the call queued) while a collection runs."""
    if not _GC_RUNNING[0]:
        return False
    _GC_DEFERRED.append((finalizer, args))
    return True


def detach(cell, fallback=None):
    """Detaches (unmaps the ring) the feed in ``cell``, a one-item list that
    whoever detaches empties (list.pop is atomic), so that it happens once:
    by the finalizer of the Handle, or by attach() when an exception (Ctrl-C)
    struck between rf_attach and the Handle. ``fallback`` is the pointer
    rf_attach returned, for an exception before it reached the cell. Never
    raises. In a forked child the library only unmaps the child's copy."""
    if _deferred_by_gc(detach, cell, fallback):
        return
    try:
        ptr = cell.pop()
    except IndexError:
        return  # detached already
    ptr = ptr or fallback
    if not ptr or sys.is_finalizing():
        return  # nothing attached; or at exit the OS drops mapping and lock
    try:
        LIB.rf_detach(ptr)
    except Exception:  # noqa: BLE001 - a finalizer must not raise
        pass


# In the library's RF_E_BUSY message when this very process holds the rank
# (AttachError::RankHeldByThisProcess, returned at once): the one RF_E_BUSY
# that retrying cannot end, and would only spin on. The code alone does not
# tell it apart without a new return code in the C ABI.
HELD_BY_THIS_PROCESS = "already attached by this process"

# The _Handles of this process, to tell a trainer that attaches a rank it
# still holds what holds it (waiting would wait on itself).
LIVE_HANDLES = weakref.WeakSet()


class Handle:
    """One attached ``rf_feed*``, shared by the Feed and every live batch base.

    ``call_lock`` serialises the C calls on the feed (the library allows one
    thread at a time); a slot whose last view dies while another thread is in
    a call is queued in ``pending`` and given back by the next call.
    """

    __slots__ = ("ptr", "pid", "name", "rank", "call_lock", "pending", "queued", "claims", "undelivered", "in_transit", "feeds",
                 "resume", "awaited_start", "images", "classes", "tail", "tokens", "__weakref__")

    def __init__(self, cell, name, rank):
        self.ptr = cell[0]
        # The process that attached: a forked child must not wait on a
        # call_lock that a thread of its parent held at the fork.
        self.pid = os.getpid()
        self.name = name
        self.rank = rank
        self.call_lock = threading.Lock()
        self.pending = collections.deque()
        # Set when a slot is queued in `pending`: wakes a next() that waits for it.
        self.queued = threading.Event()
        # One Claim per batch taken and not yet given back (or queued).
        self.claims = set()
        # The loader's ImageFormat when it decodes images (serve --decode image).
        self.images = None
        # The class names the loader recorded (a tuple of str; empty: none).
        self.classes = ()
        # The loader's TokenFormat when it serves token windows (serve --seq-len).
        self.tokens = None
        # A batch rf_next took that never reached the caller (an exception,
        # such as Ctrl-C, struck first): the next next() returns it.
        self.undelivered = None
        # The Batch _call_next made, until next() has it in hand: an
        # exception that strikes in between (leaving call_lock, returning)
        # puts it back as `undelivered` instead of dropping it.
        self.in_transit = None
        # The open Feeds on this handle (for the message of a second attach).
        self.feeds = weakref.WeakSet()
        # ((start epoch, start samples), dataset samples, samples per step,
        # tail) for Batch.resume_state, or None if the loader did not say;
        # set by attach().
        self.resume = None
        # How every epoch ends: _lib.RF_TAIL_DROP or RF_TAIL_KEEP (attach()).
        self.tail = 0
        # The loader waits for its ranks to say where the run starts
        # (--resume auto) and has not said yet.
        self.awaited_start = False
        # atexit=False: at interpreter exit the OS unmaps; unmapping earlier
        # could pull memory from under a daemon thread still reading a view.
        weakref.finalize(self, detach, cell).atexit = False
        LIVE_HANDLES.add(self)

    @property
    def held(self):
        return len(self.claims) + (self.undelivered is not None)

    def release_now(self, raw):
        """rf_release under call_lock (held by the caller). Returns (rc, message)."""
        rc = LIB.rf_release(self.ptr, ctypes.byref(raw))
        return rc, (LIB.last_error() if rc != _lib.RF_OK else "")

    def drain_pending(self):
        """Gives back queued slots; the caller holds call_lock. An entry
        leaves the queue only once given back: a Ctrl-C in between leaves it
        for the next call (which finds it given back, RF_E_STALE, at worst),
        never loses it. Finalizers only append, so the head is ours."""
        while self.pending:
            rc, message = self.release_now(self.pending[0])
            self.pending.popleft()
            _warn_if_failed(rc, message)


def unqueue(queue, raw):
    """Removes ``raw`` (by identity) from the pending queue; True if it was there."""
    for i, queued in enumerate(queue):
        if queued is raw:
            del queue[i]
            return True
    return False


def _warn_if_failed(rc, message):
    # RF_E_FORKED: a forked child's copy of a batch died; the parent keeps it.
    if rc not in (_lib.RF_OK, _lib.RF_E_FORKED):
        warnings.warn("ringfeed: giving back a slot failed: %s" % message, RuntimeWarning, stacklevel=2)


class Claim:
    """One batch taken by rf_next, given back exactly once: by the finalizer of
    its base, or by next() itself when an exception (Ctrl-C) struck between
    rf_next and the Batch reaching the caller."""

    __slots__ = ("given_back", "settled")

    def __init__(self):
        # False, or who took it back: True (next()) or _BY_FINALIZER.
        self.given_back = False
        # Set by the finalizer once the slot is given back or queued.
        self.settled = False

    def take_back(self, handle, by=True):
        """True once: the caller is the one to give the slot back."""
        if self.given_back:
            return False
        self.given_back = by
        handle.claims.discard(self)
        return True


# Marks a claim its batch's finalizer took back (see Claim.given_back).
_BY_FINALIZER = object()


def give_back(handle, raw, claim):
    """Finalizer of a batch base: the last view died, release the slot.

    Runs on whichever thread dropped the last view, possibly in the middle of
    another call on this feed (garbage collection: then after the collection,
    see _on_gc); it never blocks and never raises.
    """
    if sys.is_finalizing() or _deferred_by_gc(give_back, handle, raw, claim):
        return
    try:
        _give_back_now(handle, raw, claim)
    except BaseException as e:  # noqa: BLE001 - a finalizer must not raise
        # A Ctrl-C (an asynchronous exception) struck in here: Python would
        # print and drop it, and the slot could stay taken for good. Queue
        # the slot for the next call unless it is back already, then raise
        # the KeyboardInterrupt again where the main thread runs.
        # Only a slot this finalizer took is its to queue: next() may have
        # taken the claim back, and then hands the slot out again itself.
        try:
            if not claim.given_back:
                claim.take_back(handle, _BY_FINALIZER)
            if claim.given_back is _BY_FINALIZER and not claim.settled:
                claim.settled = True
                handle.claims.discard(claim)
                handle.pending.append(raw)
                handle.queued.set()
        finally:
            if isinstance(e, KeyboardInterrupt):
                # From another thread, a little later: raised from here, it
                # would strike again before this finalizer returns.
                try:
                    timer = threading.Timer(0.01, _thread.interrupt_main)
                    timer.daemon = True
                    timer.start()
                except RuntimeError:
                    pass  # the interpreter is shutting down


def _give_back_now(handle, raw, claim):
    if not claim.take_back(handle, _BY_FINALIZER):
        return  # next() took it back (undelivered): not ours
    if handle.call_lock.acquire(blocking=False):
        try:
            handle.drain_pending()
            rc, message = handle.release_now(raw)
            claim.settled = True
        finally:
            handle.call_lock.release()
        # A next() of another thread may be waiting for this slot.
        handle.queued.set()
        _warn_if_failed(rc, message)
    else:
        # Settled before the append, not after: an interrupt can strike
        # only once the append's call has returned, and must not queue the
        # slot a second time.
        claim.settled = True
        handle.pending.append(raw)
        handle.queued.set()
