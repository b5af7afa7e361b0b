"""Feed and Batch: the Python API over the C library, and the lifetime rules
that keep every zero-copy view valid.

Ownership, from the bottom up:

- ``_Handle`` owns one ``rf_feed*``. A ``weakref.finalize`` on it calls
  ``rf_detach`` (which unmaps the ring) when the last strong reference goes.
- Each taken batch has one *base*: a ctypes byte array laid over the slot
  payload. Every view (``sample()``, ``array()``, ``buffer()``, and anything
  numpy or torch derives from them) keeps the base alive through the buffer
  protocol. A ``weakref.finalize`` on the base releases the slot when the base
  dies, and holds the handle strongly until then: the mapping outlives every
  view, and the slot outlives every view.
- ``Batch`` and ``Feed`` only hold references; ``release()`` and ``close()``
  drop them, so the real release or detach happens when the last view dies.
"""

import collections
import ctypes
import functools
import _thread
import gc
import logging
import math
import operator
import os
import re
import sys
import threading
import time
import warnings
import weakref

import numpy as np

from . import _lib
from . import errors

_LIB = _lib.load()

# Longest single rf_next call. Between calls, Python delivers signals (Ctrl-C
# works while waiting) and gives back slots whose last view died on another
# thread. Above the engine's 100 ms liveness slice, so every call re-checks
# that the loader is alive and a dead loader is reported within this bound.
_NEXT_SLICE_S = 0.15
# Longest timeout passed to the C library, in ms (far beyond any real wait).
_TIMEOUT_MS_MAX = 2**62
_INT32_MAX = 2**31 - 1
# A trainer waiting this long to attach says why on the "ringfeed" logger
# (stderr when logging is not configured), then again every
# _ATTACH_NOTE_EVERY_S: a rank stuck at attach is otherwise silent for its
# whole timeout (forever with timeout=None).
_ATTACH_NOTE_AFTER_S = 5.0
_ATTACH_NOTE_EVERY_S = 60.0
_LOG = logging.getLogger("ringfeed")
_SAMPLE_DTYPE = np.dtype([("offset", "<u8"), ("len", "<u8"), ("index", "<u8")])
assert _SAMPLE_DTYPE.itemsize == ctypes.sizeof(_lib.rf_sample)

FeedInfo = collections.namedtuple(
    "FeedInfo",
    [
        "world_size",
        "rank",
        "slots_per_rank",
        "max_samples_per_slot",
        "slot_payload_bytes",
        "payload_region_address",
        "payload_region_bytes",
        "batches_expected",
        "first_rank",
        "job_world_size",
        "plan_digest",
        "start",
        "dataset_samples",
        "seed",
        "shuffled",
    ],
)
FeedInfo.__doc__ = """Shape of the ring a feed is attached to.

``payload_region_address`` / ``payload_region_bytes`` span the payload of
every slot: pin them once with ``cudaHostRegister`` (e.g.
``torch.cuda.cudart().cudaHostRegister(addr, nbytes, 0)``) to copy batches to
the GPU by DMA. ``batches_expected`` is the number of batches this rank gets in
the whole run, or None if the loader did not say. ``first_rank`` and
``job_world_size`` place the loader's ranks in the whole job: this feed is job
rank ``first_rank + rank`` of ``job_world_size`` (torchrun's RANK and
WORLD_SIZE); on one machine ``first_rank`` is 0 and ``job_world_size`` equals
``world_size``; both are None with a library too old to say.
``plan_digest`` digests the dataset's file list and the flags that decide the
order (seed, shuffle, batch size, world size, epochs, resume state), or is
None if the loader did not say: on a job over several machines, compare it
across ranks (``ringfeed.check_same_plan`` does, through torch.distributed) to
catch loaders started alike in name only. ``start`` is ``(epoch, samples)``,
the state the loader started at (its ``--resume``; ``(0, 0)`` without one),
from which ``Batch.step`` counts in that epoch, and ``dataset_samples`` the
samples of one epoch (dropped tail included); both None if the loader did not
say (see ``Batch.resume_state``). ``seed`` and ``shuffled`` are the loader's
``--seed`` and False under ``--no-shuffle``: with ``dataset_samples``, what
decides the order of every epoch (``Feed.order``); None if the loader did not
say.
"""


def _timeout_ms(timeout):
    """Seconds (None: forever) to the C library's milliseconds (-1: forever)."""
    if timeout is None:
        return -1
    try:
        seconds = float(timeout)
    except (TypeError, ValueError):
        raise errors.InvalidArgumentError("timeout must be a number of seconds or None, not %r" % (timeout,)) from None
    if math.isnan(seconds) or seconds < 0:
        raise errors.InvalidArgumentError("timeout must be >= 0 seconds or None, not %r" % (timeout,))
    if math.isinf(seconds):
        return -1
    return min(int(math.ceil(seconds * 1000.0)), _TIMEOUT_MS_MAX)


def _slice_s(deadline):
    """Seconds of the next C call: _NEXT_SLICE_S, or less to end at ``deadline``."""
    if deadline is None:
        return _NEXT_SLICE_S
    return max(0.0, min(_NEXT_SLICE_S, deadline - time.monotonic()))


def _ms(seconds):
    return int(math.ceil(seconds * 1000))


def _rank_from_env():
    """LOCAL_RANK, else RANK, else 0."""
    for var in ("LOCAL_RANK", "RANK"):
        rank = _env_count(var)
        if rank is None:
            continue
        if rank < 0:
            raise errors.RankError("%s=%d is negative; a rank is 0 or more (torchrun sets it)" % (var, rank))
        return rank
    return 0


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


def _detach(cell, fallback=None):
    """Detaches (unmaps the ring) the feed in ``cell``, a one-item list that
    whoever detaches empties (list.pop is atomic), so that it happens once:
    by the finalizer of the _Handle, or by attach() when an exception (Ctrl-C)
    struck between rf_attach and the _Handle. ``fallback`` is the pointer
    rf_attach returned, for an exception before it reached the cell. Never
    raises. In a forked child the library only unmaps the child's copy."""
    if _deferred_by_gc(_detach, cell, fallback):
        return
    try:
        ptr = cell.pop()
    except IndexError:
        return  # detached already
    ptr = ptr or fallback
    if not ptr or sys.is_finalizing():
        return  # nothing attached; or at exit the OS drops mapping and lock
    try:
        _LIB.rf_detach(ptr)
    except Exception:  # noqa: BLE001 - a finalizer must not raise
        pass


# In the library's RF_E_BUSY message when this very process holds the rank
# (AttachError::RankHeldByThisProcess, returned at once): the one RF_E_BUSY
# that retrying cannot end, and would only spin on. The code alone does not
# tell it apart without a new return code in the C ABI.
_HELD_BY_THIS_PROCESS = "already attached by this process"

# The _Handles of this process, to tell a trainer that attaches a rank it
# still holds what holds it (waiting would wait on itself).
_LIVE_HANDLES = weakref.WeakSet()


class _Handle:
    """One attached ``rf_feed*``, shared by the Feed and every live batch base.

    ``call_lock`` serialises the C calls on the feed (the library allows one
    thread at a time); a slot whose last view dies while another thread is in
    a call is queued in ``pending`` and given back by the next call.
    """

    __slots__ = ("ptr", "pid", "name", "rank", "call_lock", "pending", "queued", "claims", "undelivered", "in_transit", "feeds",
                 "resume", "__weakref__")

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
        # One _Claim per batch taken and not yet given back (or queued).
        self.claims = set()
        # A batch rf_next took that never reached the caller (an exception,
        # such as Ctrl-C, struck first): the next next() returns it.
        self.undelivered = None
        # The Batch _call_next made, until next() has it in hand: an
        # exception that strikes in between (leaving call_lock, returning)
        # puts it back as `undelivered` instead of dropping it.
        self.in_transit = None
        # The open Feeds on this handle (for the message of a second attach).
        self.feeds = weakref.WeakSet()
        # ((start epoch, start samples), dataset samples, samples per step)
        # for Batch.resume_state, or None if the loader did not say; set by
        # attach().
        self.resume = None
        # atexit=False: at interpreter exit the OS unmaps; unmapping earlier
        # could pull memory from under a daemon thread still reading a view.
        weakref.finalize(self, _detach, cell).atexit = False
        _LIVE_HANDLES.add(self)

    @property
    def held(self):
        return len(self.claims) + (self.undelivered is not None)

    def release_now(self, raw):
        """rf_release under call_lock (held by the caller). Returns (rc, message)."""
        rc = _LIB.rf_release(self.ptr, ctypes.byref(raw))
        return rc, (_lib.last_error(_LIB) if rc != _lib.RF_OK else "")

    def drain_pending(self):
        """Gives back queued slots; the caller holds call_lock. An entry
        leaves the queue only once given back: a Ctrl-C in between leaves it
        for the next call (which finds it given back, RF_E_STALE, at worst),
        never loses it. Finalizers only append, so the head is ours."""
        while self.pending:
            rc, message = self.release_now(self.pending[0])
            self.pending.popleft()
            _warn_if_failed(rc, message)


def _undeliver(handle):
    """Puts the batch in transit back (see ``_Handle.in_transit``): the next
    next() returns it."""
    batch, handle.in_transit = handle.in_transit, None
    if batch is None:
        return
    gone = batch._finalizer.detach()  # (base, _give_back, (handle, raw, claim), {}), or None
    if gone is not None:
        _, _, (_, raw, claim), _ = gone
        if claim.take_back(handle):
            handle.undelivered = raw


def _unqueue(queue, raw):
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


class _Claim:
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


# Marks a claim its batch's finalizer took back (see _Claim.given_back).
_BY_FINALIZER = object()


def _give_back(handle, raw, claim):
    """Finalizer of a batch base: the last view died, release the slot.

    Runs on whichever thread dropped the last view, possibly in the middle of
    another call on this feed (garbage collection: then after the collection,
    see _on_gc); it never blocks and never raises.
    """
    if sys.is_finalizing() or _deferred_by_gc(_give_back, handle, raw, claim):
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


@functools.lru_cache(maxsize=256)
def _base_type(nbytes):
    # A Python subclass of the ctypes array: unlike the array type itself, its
    # instances accept weak references (needed by weakref.finalize).
    return type("SlotPayload", (ctypes.c_ubyte * nbytes,), {})


class Batch:
    """One batch of this rank: metadata copied out, bytes viewed in place.

    The slot is given back to the loader exactly once, when both the batch has
    been released (``release()``, leaving a ``with`` block, or dropping the
    Batch) and every view made from it is gone. ``release()`` never leaves a
    dangling view: while views are alive it only defers.
    """

    __slots__ = ("_base", "_finalizer", "_table", "_resume", "epoch", "step", "slot", "generation", "nbytes", "data_ptr")

    def __init__(self, handle, raw, claim):
        n = raw.n_samples
        # The sample table lives in the library's private memory, reused when
        # this slot is reused: copy it (24 bytes a sample).
        table_bytes = ctypes.string_at(raw.samples, n * _SAMPLE_DTYPE.itemsize) if n else b""
        self._table = np.frombuffer(table_bytes, dtype=_SAMPLE_DTYPE)
        self.epoch = raw.epoch
        self.step = raw.step
        self.slot = raw.slot
        self.generation = raw.generation
        self.nbytes = raw.data_len
        self.data_ptr = raw.data or 0
        self._resume = handle.resume
        self._base = _base_type(raw.data_len).from_address(self.data_ptr)
        self._finalizer = weakref.finalize(self._base, _give_back, handle, raw, claim)
        self._finalizer.atexit = False
        handle.claims.add(claim)

    def __len__(self):
        return len(self._table)

    def __copy__(self):
        # Another Batch on the same slot (copy.copy): shares its base, so the
        # slot is given back once both are released and their views gone.
        twin = object.__new__(Batch)
        for attr in Batch.__slots__:
            object.__setattr__(twin, attr, getattr(self, attr))
        return twin

    def __reduce__(self):
        raise TypeError(
            "a ringfeed Batch cannot be pickled, deep-copied or sent to another process: its bytes are a view of "
            "the loader's ring. Send a copy of the data instead (e.g. batch.array().copy(), or "
            "torch.from_numpy(batch.array()).clone())"
        )

    def __repr__(self):
        state = "released" if self.released else ("releasing" if self._base is None else "held")
        return "<ringfeed.Batch epoch=%d step=%d samples=%d nbytes=%d %s>" % (
            self.epoch,
            self.step,
            len(self),
            self.nbytes,
            state,
        )

    @property
    def resume_state(self):
        """``(epoch, samples)``: once every rank of the job has trained on its
        batch of this step, ``ringfeed serve ... --resume EPOCH:SAMPLES`` (same
        dataset, seed and batch size, any world size) goes on with the next
        step. Save it in your checkpoint. None if the loader does not record
        where it started (an older ``ringfeed serve``).

        ``step`` counts from the loader's own ``--resume`` point in the epoch
        it started in, so ``(step + 1) * W * B`` alone is the state only for a
        loader started at the beginning of an epoch; this adds that start.
        After an epoch's last step it is ``(epoch + 1, 0)``: the epoch's
        dropped tail is not carried over (docs/sampler.md, section 3).
        """
        # The rule of Job::resume_state_after (engine/src/ring/layout.rs),
        # which rf_resume_state applies: computed here, because a released
        # batch may outlive its feed's attachment. The end-to-end resume test
        # checks that both agree on every batch.
        if self._resume is None:
            return None
        (start_epoch, start_samples), dataset_samples, per_step = self._resume
        if self.epoch < start_epoch:
            return None  # not a batch of this loader
        done = (start_samples if self.epoch == start_epoch else 0) + (self.step + 1) * per_step
        # After the epoch's last step: its dropped tail is not carried over.
        return _normal((self.epoch, done), dataset_samples, per_step)

    @property
    def indices(self):
        """Manifest index of each sample: a new numpy uint64 array."""
        return np.array(self._table["index"], dtype=np.uint64)

    @property
    def offsets(self):
        """Byte offset of each sample from the start of the batch payload."""
        return np.array(self._table["offset"], dtype=np.uint64)

    @property
    def lengths(self):
        """Byte length of each sample."""
        return np.array(self._table["len"], dtype=np.uint64)

    @property
    def released(self):
        """True once the slot is given back to the loader (all views gone)."""
        return not self._finalizer.alive

    def release(self):
        """Gives the slot back now, or, while views are alive, when the last
        one dies. A second call does nothing."""
        self._base = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def _live_base(self):
        if self._base is None:
            raise ValueError("this batch was released: it can make no new views (views made before stay valid)")
        return self._base

    def buffer(self):
        """Zero-copy memoryview of the whole payload (``nbytes`` bytes)."""
        return memoryview(self._live_base()).cast("B")

    def sample(self, i):
        """Zero-copy memoryview of sample ``i``'s bytes."""
        base = self._live_base()
        n = len(self._table)
        if not -n <= i < n:
            raise IndexError("sample %d out of range: the batch has %d samples" % (i, n))
        entry = self._table[i]
        start = int(entry["offset"])
        return memoryview(base).cast("B")[start : start + int(entry["len"])]

    def array(self, dtype="uint8", shape=None):
        """Zero-copy numpy view of the payload as ``shape`` items of ``dtype``.

        Needs fixed-size samples laid end to end (sample i at offset i*len):
        raises ValueError saying why otherwise. ``shape`` defaults to
        (samples, len // itemsize); one entry may be -1. The array is writable:
        the slot belongs to this process until it is given back.
        """
        base = self._live_base()
        dt = np.dtype(dtype)
        if dt.itemsize == 0 or dt.hasobject:
            raise ValueError("dtype %s cannot view raw bytes" % dt)
        sample_bytes = self._fixed_sample_bytes()
        total = len(self._table) * sample_bytes
        if total % dt.itemsize:
            raise ValueError("the batch's %d bytes are not a whole number of %s items (%d bytes each)" % (total, dt, dt.itemsize))
        if shape is None:
            if sample_bytes % dt.itemsize:
                raise ValueError("a sample of %d bytes is not a whole number of %s items; pass a shape" % (sample_bytes, dt))
            shape = (len(self._table), sample_bytes // dt.itemsize)
        shape = _check_shape(shape, total // dt.itemsize, dt, total)
        flat = np.frombuffer(base, dtype=dt, count=total // dt.itemsize, offset=0)
        return flat.reshape(shape)

    def _fixed_sample_bytes(self):
        """The common sample length, checking samples are equal-sized and end to end."""
        if len(self._table) == 0:
            return 0
        lens = self._table["len"]
        sample_bytes = int(lens[0])
        unequal = np.flatnonzero(lens != sample_bytes)
        if unequal.size:
            i = int(unequal[0])
            raise ValueError("samples differ in size (sample 0 has %d bytes, sample %d has %d): use sample(i)" % (sample_bytes, i, int(lens[i])))
        expected = np.arange(len(lens), dtype=np.uint64) * np.uint64(sample_bytes)
        apart = np.flatnonzero(self._table["offset"] != expected)
        if apart.size:
            i = int(apart[0])
            raise ValueError(
                "samples are not laid end to end (sample %d is at offset %d, not %d): use sample(i)"
                % (i, int(self._table["offset"][i]), int(expected[i]))
            )
        return sample_bytes


def _check_shape(shape, count, dt, total):
    """The shape as a tuple if it holds exactly ``count`` items, else ValueError."""
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    shape = tuple(int(d) for d in shape)
    if any(d < -1 for d in shape) or shape.count(-1) > 1:
        raise ValueError("invalid shape %r: dimensions must be >= 0, with at most one -1" % (shape,))
    known = 1
    for d in shape:
        if d != -1:
            known *= d
    if -1 in shape:
        if known == 0 or count % known:
            raise ValueError("shape %r cannot hold the batch's %d %s items (%d bytes)" % (shape, count, dt, total))
        return tuple(count // known if d == -1 else d for d in shape)
    if known != count:
        raise ValueError(
            "shape %r holds %d %s items (%d bytes) but the batch has %d bytes"
            % (shape, known, dt, known * dt.itemsize, total)
        )
    return shape


class Feed:
    """A trainer's attachment to one rank of a loader. Made by ``attach()``.

    Use a Feed from one thread. Views of its batches may die on any thread.
    """

    def __init__(self, handle, info):
        self._handle = handle
        self._info = info
        self._name = handle.name
        self._rank = handle.rank
        handle.feeds.add(self)

    def __reduce__(self):
        raise TypeError(
            "a ringfeed Feed cannot be pickled or sent to another process (a 'spawn' or 'forkserver' worker): "
            "it is an attachment of this process to one rank. Take batches in this process (a torch DataLoader "
            "over a feed needs num_workers=0: the loader does the reading), or attach in the other process instead"
        )

    @property
    def name(self):
        """The loader's name."""
        return self._name

    @property
    def rank(self):
        """This feed's rank."""
        return self._rank

    @property
    def info(self):
        """The ring's shape: a FeedInfo named tuple."""
        return self._info

    @property
    def order(self):
        """``(dataset_samples, seed, shuffled)``: what decides the sample order
        of every epoch, whatever the world size and batch size (plain ints
        and a bool). A resume state holds only under the order it was saved
        under: save this in the checkpoint with ``Batch.resume_state`` and
        give both to ``check_resume`` when training goes on from it. None if
        the loader does not say (an older ``ringfeed serve``)."""
        i = self._info
        if i.dataset_samples is None or i.seed is None:
            return None
        return (i.dataset_samples, i.seed, i.shuffled)

    @property
    def closed(self):
        """True after close()."""
        return self._handle is None

    @property
    def held(self):
        """Batches taken by next() whose slot is not given back yet."""
        handle = self._handle
        return handle.held if handle is not None else 0

    @property
    def taken(self):
        """Batches this rank has taken in the run, by this process and by the
        processes attached to it before (a trainer restarted after a crash
        goes on with batch number ``taken``, counted from 0). None with a
        library too old to say."""
        handle = self._handle
        if handle is None:
            raise ValueError("the feed of %r rank %d is closed" % (self._name, self._rank))
        if handle.pid != os.getpid():
            raise errors.error_for(_lib.RF_E_FORKED, "this feed was attached by the parent of this forked process; attach in the child")
        if not hasattr(_LIB, "rf_get_taken"):
            return None
        taken = ctypes.c_uint64()
        with handle.call_lock:
            rc = _LIB.rf_get_taken(handle.ptr, ctypes.byref(taken))
            if rc != _lib.RF_OK:
                raise errors.error_for(rc, _lib.last_error(_LIB))
            # A batch an interrupted next() took is this process's next one.
            return taken.value - (handle.undelivered is not None)

    def close(self):
        """Stops using the feed. The ring is detached now if no batch or view
        is alive, else when the last one dies. A second call does nothing."""
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.feeds.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __iter__(self):
        """Every batch of this rank, waiting as long as needed, until the run ends."""
        while True:
            box = [self.next()]
            if box[0] is None:
                return
            # Yielded from a list, not a local: this frame keeps no reference
            # while the caller uses the batch nor during the next next(), so
            # a batch the caller dropped has its slot back by then.
            yield box.pop()

    def __repr__(self):
        state = "closed" if self.closed else "held=%d" % self.held
        return "<ringfeed.Feed name=%r rank=%d %s>" % (self._name, self._rank, state)

    def next(self, timeout=None):
        """The next batch, or None once the run is over.

        Waits up to ``timeout`` seconds (None: as long as it takes, while the
        loader lives) and raises ringfeed.TimeoutError after that.

        When the next batch's slot still holds a batch of this process, only
        this process can free it: with ``timeout=None`` next() raises
        AllSlotsHeldError at once rather than wait forever; with a finite
        timeout it waits for a view to die on another thread, and raises
        AllSlotsHeldError if none does in time.
        """
        handle = self._handle
        if handle is None:
            raise ValueError("the feed of %r rank %d is closed" % (self._name, self._rank))
        if handle.pid != os.getpid():
            # A forked child: the library says so (RF_E_FORKED) without
            # touching the ring. Not under call_lock, which a thread of the
            # parent may have held at the fork, and not the parent's
            # undelivered batch either.
            rc = _LIB.rf_next(handle.ptr, ctypes.byref(_lib.rf_batch()), 0)
            raise errors.error_for(rc, _lib.last_error(_LIB) if rc < 0 else "this feed was attached by the parent of this forked process (rf_next returned %d)" % rc)
        timeout_ms = _timeout_ms(timeout)
        deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000.0
        while True:
            slice_s = _slice_s(deadline)
            handle.queued.clear()
            try:
                rc, batch, message = self._call_next(handle, _ms(slice_s))
            except BaseException:
                _undeliver(handle)
                raise
            handle.in_transit = None
            if batch is not None:
                return batch  # first thing: a Ctrl-C from here on would drop it unseen
            out_of_time = deadline is not None and time.monotonic() >= deadline
            if rc == _lib.RF_E_HELD and (handle.pending or (deadline is not None and not out_of_time)):
                if not handle.pending:
                    handle.queued.wait(slice_s)  # for a view to die on another thread
                continue  # give back what died meanwhile, look again
            if rc != _lib.RF_TIMEOUT or out_of_time:
                return self._result(handle, rc, batch, message, timeout)

    def _call_next(self, handle, timeout_ms):
        """One rf_next call, returning (rc, Batch or None, message).

        A batch taken reaches the caller, or, if an exception (Ctrl-C) strikes
        between rf_next and the return, stays held and is what the next call
        returns: never lost, never skipped. rf_next writes the batch only on
        success, and a real batch has generation >= 1."""
        raw = _lib.rf_batch()
        claim = _Claim()
        batch = None
        with handle.call_lock:
            try:
                handle.drain_pending()
                if handle.undelivered is not None:
                    raw = handle.undelivered
                    handle.undelivered = None
                    rc, message = _lib.RF_OK, ""
                else:
                    rc = _LIB.rf_next(handle.ptr, ctypes.byref(raw), timeout_ms)
                    message = _lib.last_error(_LIB) if rc < 0 else ""
                if rc == _lib.RF_OK:
                    batch = Batch(handle, raw, claim)
                    handle.in_transit = batch
            except BaseException:
                # Either no Batch was armed (take_back wins), or one was and
                # died while the exception unwound, its finalizer queueing the
                # slot because we hold call_lock: take it off the queue.
                if raw.generation != 0 and (claim.take_back(handle) or _unqueue(handle.pending, raw)):
                    handle.undelivered = raw
                raise
        return rc, batch, message

    def _result(self, handle, rc, batch, message, timeout):
        if rc == _lib.RF_OK:
            return batch
        if rc == _lib.RF_END:
            return None
        if rc == _lib.RF_TIMEOUT:
            raise errors.TimeoutError(
                "no batch for rank %d of loader %r within %s s; `ringfeed stat %s` shows what the loader is doing"
                % (self._rank, self._name, timeout, self._name)
            )
        if rc == _lib.RF_E_HELD:
            message += (
                ". A batch stays held until it is released and every view of it (sample(), array(), "
                "buffer(), tensors made from them) is gone; this process holds %d batch(es) of rank %d"
                % (handle.held, self._rank)
            )
        raise errors.error_for(rc, message)


def attach(name=None, rank=None, timeout=30.0):
    """Attaches to rank ``rank`` of the loader ``name`` and returns a Feed.

    ``name`` defaults to $RINGFEED_NAME. ``rank`` defaults to $LOCAL_RANK,
    else $RANK, else 0 (torchrun sets LOCAL_RANK; the loader serves the ranks
    of one machine). Waits up to ``timeout`` seconds (None: forever) for the
    loader to appear and the rank to be free; a wait past 5 s logs why on the
    ``ringfeed`` logger (stderr unless logging is configured), then every
    minute.

    Raises ``RankError`` when torchrun's variables disagree with the ranks
    the loader serves: LOCAL_WORLD_SIZE with its rank count, WORLD_SIZE with
    its job's size, and RANK with this rank's place in the job (when the rank
    is LOCAL_RANK). The message names the loader flag to fix.
    """
    if name is None:
        name = os.environ.get("RINGFEED_NAME")
        if not name:
            raise errors.InvalidArgumentError("no loader name: pass name= or set RINGFEED_NAME")
    if not isinstance(name, str):
        raise errors.InvalidArgumentError("the loader name must be a str, not %s" % type(name).__name__)
    if "\0" in name:
        raise errors.InvalidArgumentError("invalid loader name %r: it contains a NUL character" % name)
    rank_from_env = rank is None
    if rank_from_env:
        rank = _rank_from_env()
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
        raise errors.RankError("rank must be an int, not %r" % (rank,))
    rank = int(rank)
    if rank > _INT32_MAX:
        raise errors.RankError("rank %d is out of range (at most %d)" % (rank, _INT32_MAX))
    timeout_ms = _timeout_ms(timeout)
    try:
        handle = _attach_in_slices(name, rank, timeout_ms)
    except errors.RankBusyError as e:
        # The library refuses at once a rank this process holds on this very
        # segment (a rank held on a dead loader's segment, replaced since,
        # does not count). A Feed or batch that only a reference cycle keeps
        # alive is freed by a collection; otherwise say what holds it.
        if _HELD_BY_THIS_PROCESS not in str(e):
            raise
        gc.collect()
        try:
            handle = _attach_in_slices(name, rank, timeout_ms)
        except errors.RankBusyError as again:
            if _HELD_BY_THIS_PROCESS in str(again):
                _raise_held_here(name, rank, again)
            raise
    raw = _lib.rf_info()
    rc = _LIB.rf_get_info(handle.ptr, ctypes.byref(raw))
    if rc != _lib.RF_OK:
        raise errors.error_for(rc, _lib.last_error(_LIB))
    info = FeedInfo(
        world_size=raw.world_size,
        rank=raw.rank,
        slots_per_rank=raw.slots_per_rank,
        max_samples_per_slot=raw.max_samples_per_slot,
        slot_payload_bytes=raw.slot_payload_bytes,
        payload_region_address=raw.payload_region or 0,
        payload_region_bytes=raw.payload_region_bytes,
        batches_expected=None if raw.batches_expected == _lib.BATCHES_UNKNOWN else raw.batches_expected,
        first_rank=None,
        job_world_size=None,
        plan_digest=None,
        start=None,
        dataset_samples=None,
        seed=None,
        shuffled=None,
    )
    if hasattr(_LIB, "rf_get_job"):
        job = _lib.rf_job()
        rc = _LIB.rf_get_job(handle.ptr, ctypes.byref(job))
        if rc != _lib.RF_OK:
            raise errors.error_for(rc, _lib.last_error(_LIB))
        info = info._replace(first_rank=job.first_rank, job_world_size=job.job_world_size, plan_digest=job.plan_digest or None)
    if hasattr(_LIB, "rf_get_start"):
        epoch, samples, dataset_samples = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
        rc = _LIB.rf_get_start(handle.ptr, ctypes.byref(epoch), ctypes.byref(samples), ctypes.byref(dataset_samples))
        if rc == _lib.RF_OK:
            info = info._replace(start=(epoch.value, samples.value), dataset_samples=dataset_samples.value)
        elif rc != _lib.RF_E_VERSION:
            raise errors.error_for(rc, _lib.last_error(_LIB))
    if hasattr(_LIB, "rf_get_order"):
        seed, shuffled = ctypes.c_uint64(), ctypes.c_uint32()
        rc = _LIB.rf_get_order(handle.ptr, ctypes.byref(seed), ctypes.byref(shuffled))
        if rc == _lib.RF_OK:
            info = info._replace(seed=seed.value, shuffled=bool(shuffled.value))
        elif rc != _lib.RF_E_VERSION:
            raise errors.error_for(rc, _lib.last_error(_LIB))
    if info.start is not None:
        job_world_size = info.job_world_size if info.job_world_size is not None else info.world_size
        handle.resume = (info.start, info.dataset_samples, job_world_size * info.max_samples_per_slot)
    _check_job(info, name, rank_from_env)
    return Feed(handle, info)


def _raise_held_here(name, rank, error):
    """Raises RankBusyError saying what of this process holds the rank: an
    open Feed, or batches (or their views) of a closed one; else ``error``,
    the library's own message."""
    pid = os.getpid()
    handle = next((h for h in list(_LIVE_HANDLES) if (h.name, h.rank, h.pid) == (name, rank, pid)), None)
    if handle is None:
        raise error
    if len(handle.feeds):
        what = "a Feed of it is still open"
    else:
        what = (
            "its Feed was closed or dropped, but %d batch(es) of it are not given back: a batch, or an array, "
            "tensor or memoryview made from one, is still alive (a loop variable such as `batch`, a list, "
            "a saved traceback)" % handle.held
        )
    raise errors.RankBusyError(
        "rank %d of loader %r is already attached by this process (pid %d): %s. Keep using that feed, or close "
        "it and drop its batches and their views before attaching again" % (rank, name, handle.pid, what)
    ) from None


def _attach_in_slices(name, rank, timeout_ms):
    """rf_attach in calls of at most _NEXT_SLICE_S, so that Ctrl-C stops a
    trainer waiting for its loader (Python runs signal handlers between
    calls), and returns the _Handle. Retries a missing loader, a dead
    loader's segment (a restarted loader replaces it) and a busy rank until
    the deadline; the error then says how long the whole wait was. Logs
    why it still waits after _ATTACH_NOTE_AFTER_S, then every
    _ATTACH_NOTE_EVERY_S."""
    start = time.monotonic()
    deadline = None if timeout_ms < 0 else start + timeout_ms / 1000.0
    next_note = _ATTACH_NOTE_AFTER_S
    encoded = name.encode("utf-8")
    while True:
        ptr = ctypes.c_void_p()
        cell = [None]
        try:
            rc = _LIB.rf_attach(encoded, rank, _ms(_slice_s(deadline)), ctypes.byref(ptr))
            if rc == _lib.RF_OK:
                cell[0] = ptr.value
                return _Handle(cell, name, rank)
        except BaseException:
            # Ctrl-C after rf_attach attached: the rank must not stay held
            # by nobody. Once the _Handle holds the cell, its finalizer may
            # have detached already; the cell makes it happen once.
            _detach(cell, ptr.value)
            raise
        message = _lib.last_error(_LIB)
        waiting = rc in (_lib.RF_TIMEOUT, _lib.RF_E_BUSY, _lib.RF_E_LOADER_GONE) and _HELD_BY_THIS_PROCESS not in message
        now = time.monotonic()
        if not waiting or (deadline is not None and now >= deadline):
            if rc == _lib.RF_TIMEOUT:
                waited_ms = int((now - start) * 1000)
                message = re.sub(r"within \d+ ms", "within %d ms" % waited_ms, message, count=1)
            raise errors.error_for(rc, message)
        if now - start >= next_note:
            _LOG.warning("ringfeed: %s", _waiting_note(name, rank, rc, message, now - start, deadline, now))
            next_note += _ATTACH_NOTE_EVERY_S


def _waiting_note(name, rank, rc, message, waited_s, deadline, now):
    """What a trainer still waiting to attach logs: why it waits, and how
    much longer it will."""
    if rc == _lib.RF_TIMEOUT:
        why = "no loader named %r is running yet; start one with `ringfeed serve --name %s ...`, or check RINGFEED_NAME" % (
            name,
            name,
        )
    else:
        why = message
    more = "no timeout" if deadline is None else "giving up in %s" % _seconds(max(0.0, deadline - now))
    return "rank %d has waited %s to attach to loader %r (%s): %s" % (rank, _seconds(waited_s), name, more, why)


def _seconds(s):
    return ("%.1f s" if s < 10 else "%.0f s") % s


def _env_count(var):
    """An environment variable torchrun sets, as an int, or None if unset."""
    text = os.environ.get(var)
    if text is None or text.strip() == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise errors.RankError("%s=%r is not a number" % (var, text)) from None


def _check_job(info, name, rank_from_env):
    """torchrun's variables must match the ranks the loader serves: otherwise
    some ranks would never be served, DDP would wait forever for ranks the
    loader does not know, or two machines would train on the same samples.
    LOCAL_WORLD_SIZE and WORLD_SIZE are checked whenever they are set; RANK
    when WORLD_SIZE is set too and the rank is LOCAL_RANK (taken from the
    environment, or passed as the same number). A library too old to say
    where the loader's ranks sit checks LOCAL_WORLD_SIZE only. (The handle
    detaches when dropped.)"""
    local_world_size = _env_count("LOCAL_WORLD_SIZE")
    world_size = _env_count("WORLD_SIZE")
    if (rank_from_env and info.world_size > 1 and local_world_size is None and world_size is None
            and _env_count("LOCAL_RANK") is None and _env_count("RANK") is None):
        _LOG.warning(
            "ringfeed: attached to rank 0 of loader %r, which serves %d ranks, with no torchrun environment (LOCAL_RANK, "
            "LOCAL_WORLD_SIZE and WORLD_SIZE are not set): this process gets rank 0's batches only, %d of every "
            "%d samples, and the loader waits for the other ranks. Start the trainers with torchrun "
            "--nproc-per-node %d, or the loader with --world-size 1",
            name, info.world_size, info.max_samples_per_slot, info.world_size * info.max_samples_per_slot,
            info.world_size,
        )
    if local_world_size is not None and local_world_size != info.world_size:
        if info.job_world_size == info.world_size:
            other = "start the loader with --world-size %d (one loader per machine serves that machine's ranks)"
        else:
            other = "start each machine's loader with --world-size W --nnodes N where W / N = %d"
        fix = _several_machines_fix(world_size, local_world_size) or other % local_world_size
        raise errors.RankError(
            "loader %r serves %d rank(s) on this machine but this job has LOCAL_WORLD_SIZE=%d; %s"
            % (name, info.world_size, local_world_size, fix)
        )
    if info.job_world_size is None or world_size is None:
        return
    ranks = "ranks %d to %d" % (info.first_rank, info.first_rank + info.world_size - 1)
    if world_size != info.job_world_size:
        fix = _several_machines_fix(world_size, info.world_size) or "start the loaders with --world-size %d" % world_size
        raise errors.RankError(
            "loader %r serves %s of a job of %d ranks, but this job has WORLD_SIZE=%d; %s"
            % (name, ranks, info.job_world_size, world_size, fix)
        )
    local_rank = _env_count("LOCAL_RANK")
    if not rank_from_env and local_rank != info.rank:
        return  # a rank of the caller's own choosing
    job_rank = _env_count("RANK")
    if job_rank is not None and job_rank != info.first_rank + info.rank:
        have = info.first_rank // info.world_size
        want = job_rank // info.world_size
        raise errors.RankError(
            "loader %r serves %s of %d (it was started with --node-rank %d), so rank %d here is job rank %d, "
            "but this process has RANK=%d (torchrun's GROUP_RANK of this machine is %s); start this machine's "
            "loader with --node-rank %d"
            % (name, ranks, info.job_world_size, have, info.rank, info.first_rank + info.rank, job_rank,
               os.environ.get("GROUP_RANK", "not set"), want)
        )


def _several_machines_fix(world_size, per_machine):
    """The fix for a job of ``world_size`` ranks, ``per_machine`` on each
    machine, when that means several machines; else None."""
    if world_size is None or not per_machine or world_size <= per_machine or world_size % per_machine:
        return None
    machines = world_size // per_machine
    return (
        "the job runs on %d machines of %d ranks, so start the loader on each with --world-size %d --nnodes %d "
        "--node-rank N (N = that machine's node rank); otherwise every machine gets the same samples"
        % (machines, per_machine, world_size, machines)
    )


def check_same_plan(feed, group=None):
    """Checks, across the ranks of a torch.distributed job, that every rank's
    loader serves the same plan: the same files in the same order, and the
    same seed, shuffle, batch size, world size, epochs and resume state.

    On several machines each machine runs its own loader over its own copy
    of the dataset; two loaders started with other flags, or over copies
    that differ by a file, would feed some samples twice and others never,
    and nothing on one machine can see it. Call this once after
    ``init_process_group`` and ``attach()`` on every rank (it is a
    collective: ``all_gather_object``; with NCCL, after
    ``torch.cuda.set_device``). Raises ``RankError`` on every rank, naming
    the job ranks of each plan. Returns quietly when torch.distributed is not
    initialized (a single process).

    It also lines the ranks up after a restart. When torchrun restarts every
    rank after a crash (``--max-restarts``) while the loader runs on, each
    rank goes on after the batches its rank had taken, and those can differ
    by a step: one rank had taken the batch of the next step when another
    died. Data-parallel ranks would then pair different steps, and the rank
    with one batch more would wait for a partner at the end of the run. So a
    rank behind takes and gives back, untrained, the batches it lacks, and
    says so on the ``ringfeed`` logger: like the batches the crashed
    trainers had taken, they are not trained this epoch (at most once across
    a crash; for exactly once, restart from a checkpoint with
    ``serve --resume``).
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    info = feed.info
    mine = (info.plan_digest, dist.get_rank(), info.job_world_size, feed.taken)
    every = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, mine, group=group)
    plans = {}
    for digest, job_rank, job_world_size, *_ in every:  # a rank of an older binding sends 3 fields
        plans.setdefault((digest, job_world_size), []).append(job_rank)
    if len(plans) <= 1:
        _line_up(feed, mine[3], [entry[3] for entry in every if len(entry) > 3 and entry[3] is not None])
        return
    parts = []
    for (digest, job_world_size), ranks in sorted(plans.items(), key=lambda kv: min(kv[1])):
        shown = "unknown (an older loader)" if digest is None else "%016x" % digest
        parts.append("job rank(s) %s: plan %s of a job of %d" % (_runs(sorted(ranks)), shown, job_world_size))
    raise errors.RankError(
        "the loaders of this job do not serve the same plan (%s); start every machine's loader with the same "
        "--world-size, --batch-size, --seed, --epochs, --resume, --record-bytes and --no-shuffle, over copies of "
        "the dataset that hold the same files (compare the sample count and bytes in each loader's banner)"
        % "; ".join(parts)
    )


def check_resume(feed, state, order=None):
    """Checks that ``feed``'s loader goes on where a checkpoint does, under
    the sample order the checkpoint was saved under. Call it on every rank
    before training from a checkpoint, after ``check_same_plan`` (which
    lines the ranks up after a restart).

    ``state`` is the ``Batch.resume_state`` saved in the checkpoint,
    ``(epoch, samples)``, or None for a run that starts afresh (its loader
    must start at the beginning). ``order`` is the ``Feed.order`` saved with
    it, or None to leave the order unchecked (a checkpoint saved without it).

    Raises ``ResumeMismatchError``, naming the ``ringfeed serve`` flag to
    fix, when the loader starts elsewhere (``--resume`` left out, or another
    state) or serves another order: another sample count (files added or
    removed), ``--seed`` or ``--no-shuffle``. Either would train some samples
    twice and others never, with no error anywhere else. When the trainers
    restart while the loader runs on (torchrun ``--max-restarts``), the
    loader is past the checkpoint by the steps they took before the crash:
    those are not trained again (at most once across a crash, as in
    ``check_same_plan``), and this logs how many on the ``ringfeed`` logger
    instead of raising.
    """
    info = feed.info
    if info.start is None or info.dataset_samples is None:
        raise errors.error_for(
            _lib.RF_E_VERSION,
            "loader %r does not record where it started (an older ringfeed serve): restart it with this version "
            "to check a resume" % feed.name,
        )
    n = info.dataset_samples
    job_world_size = info.job_world_size if info.job_world_size is not None else info.world_size
    per_step = job_world_size * info.max_samples_per_slot
    want = (0, 0) if state is None else _two_counts(state, "state", "(epoch, samples), a Batch.resume_state")
    if order is not None:
        _check_order(feed, order)
    start = info.start
    taken = feed.taken or 0
    at = _advance(start, taken, n, per_step)
    wanted = _normal(want, n, per_step)
    if wanted == at:
        return
    if taken and _normal(start, n, per_step) <= wanted < at:
        steps = _steps_between(wanted, at, n, per_step)
        _LOG.warning(
            "ringfeed: rank %d of loader %r goes on at epoch %d, %d samples consumed, %d step(s) after the checkpoint's "
            "epoch %d, %d samples: the loader served them to the trainers before their restart, and they are not "
            "trained again (at most once across a crash; for exactly once, restart the loader too with "
            "`ringfeed serve ... --resume %d:%d`)",
            feed.rank, feed.name, at[0], at[1], steps, want[0], want[1], want[0], want[1],
        )
        return
    where = "with no --resume" if tuple(start) == (0, 0) else "with --resume %d:%d" % tuple(start)
    if taken:
        where += ", and is at epoch %d, %d samples consumed after the %d batch(es) this rank took" % (at[0], at[1], taken)
    if state is None:
        raise errors.ResumeMismatchError(
            "loader %r was started %s, but this run starts afresh, from no checkpoint: it would skip the samples "
            "before that. Restart the loader without --resume, or go on from the checkpoint that state belongs to"
            % (feed.name, where)
        )
    raise errors.ResumeMismatchError(
        "loader %r was started %s, but the checkpoint goes on from epoch %d, %d samples consumed: some samples "
        "would be trained twice or never. Restart the loader with `ringfeed serve ... --resume %d:%d` (the same "
        "dataset, --seed and --no-shuffle as the checkpoint's run; any world size)"
        % (feed.name, where, want[0], want[1], want[0], want[1])
    )


def _two_counts(value, what, shape):
    """``value`` as a pair of ints >= 0 (a tuple or list, as a checkpoint
    gives it back), or InvalidArgumentError naming ``what``."""
    try:
        a, b = value
        a, b = operator.index(a), operator.index(b)
    except (TypeError, ValueError):
        raise errors.InvalidArgumentError("%s must be %s, not %r" % (what, shape, value)) from None
    if a < 0 or b < 0:
        raise errors.InvalidArgumentError("%s must be %s of counts >= 0, not %r" % (what, shape, value))
    return (a, b)


def _check_order(feed, order):
    """Raises ResumeMismatchError when ``order`` (a saved Feed.order) is not
    the loader's."""
    try:
        saved_n, saved_seed, saved_shuffled = order
        saved_n, saved_seed = operator.index(saved_n), operator.index(saved_seed)
    except (TypeError, ValueError):
        raise errors.InvalidArgumentError(
            "order must be (dataset_samples, seed, shuffled), a Feed.order, not %r" % (order,)
        ) from None
    saved_shuffled = bool(saved_shuffled)
    mine = feed.order
    if mine is None:
        raise errors.error_for(
            _lib.RF_E_VERSION,
            "loader %r does not record its --seed and shuffle (an older ringfeed serve): restart it with this "
            "version to check the order, or pass order=None" % feed.name,
        )
    n, seed, shuffled = mine
    wrong = []
    if n != saved_n:
        wrong.append(
            "it serves %d samples, the checkpoint's run %d (the dataset changed since: files added or removed, "
            "or another --source or --record-bytes)" % (n, saved_n)
        )
    if shuffled != saved_shuffled:
        wrong.append("it runs %s, the checkpoint's run %s" % (
            "with a shuffle" if shuffled else "with --no-shuffle", "with --no-shuffle" if not saved_shuffled else "with a shuffle"))
    if shuffled and saved_shuffled and seed != saved_seed:
        wrong.append("it runs with --seed %d, the checkpoint's run with --seed %d" % (seed, saved_seed))
    if not wrong:
        return
    raise errors.ResumeMismatchError(
        "loader %r serves another sample order than the run this checkpoint was saved in: %s. A resume state holds "
        "only under the order it was saved under; restart the loader with the checkpoint run's dataset and flags, "
        "or start the run over" % (feed.name, "; ".join(wrong))
    )


def _normal(state, n, per_step):
    """A state as the loader goes on from it: one with less than a step left
    of its epoch goes on with the next epoch."""
    epoch, samples = state
    if samples + per_step > n:
        return (epoch + 1, 0)
    return (epoch, samples)


def _advance(start, steps, n, per_step):
    """The state ``steps`` steps after ``start``."""
    epoch, samples = _normal(start, n, per_step)
    left = (n - samples) // per_step
    if steps < left:
        return _normal((epoch, samples + steps * per_step), n, per_step)
    steps -= left
    per_epoch = n // per_step
    return (epoch + 1 + steps // per_epoch, (steps % per_epoch) * per_step)


def _steps_between(a, b, n, per_step):
    """Steps from state ``a`` to the later state ``b`` (both normal)."""
    if a[0] == b[0]:
        return (b[1] - a[1]) // per_step
    per_epoch = n // per_step
    return (n - a[1]) // per_step + (b[0] - a[0] - 1) * per_epoch + b[1] // per_step


def _line_up(feed, taken, every_taken):
    """Takes and gives back the batches this rank lacks to be at the step of
    the rank furthest on (see check_same_plan)."""
    if taken is None or not every_taken or taken >= max(every_taken):
        return
    behind = max(every_taken) - taken
    skipped = []
    for _ in range(behind):
        batch = feed.next()
        if batch is None:
            break
        skipped.append("epoch %d step %d" % (batch.epoch, batch.step))
        batch.release()
    if len(skipped) > 4:
        skipped[2:-1] = ["... (%d more) ..." % (len(skipped) - 3)]
    _LOG.warning(
        "ringfeed: rank %d of loader %r had taken %d batch(es) and another rank of the job %d (every rank restarted after "
        "a crash, when one had already taken the batch of the next step): gave back %s untrained, so that every "
        "rank goes on with the same step. Its samples are not trained this epoch, like the batches the crashed "
        "trainers had taken (at most once across a crash; for exactly once, restart from a checkpoint with "
        "`ringfeed serve --resume`)",
        feed.rank, feed.name, taken, taken + behind, ", ".join(skipped) or "nothing (the run is over)",
    )


def _runs(numbers):
    """[0, 1, 2, 5] as "0-2, 5"."""
    out = []
    for n in numbers:
        if out and out[-1][1] == n - 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return ", ".join("%d" % a if a == b else "%d-%d" % (a, b) for a, b in out)


def abi_version():
    """The ring ABI version the loaded library speaks."""
    return int(_LIB.rf_abi_version())
