"""Feed and attach: a trainer's attachment to one rank of a loader, and the
loop that takes its batches. The lifetime rules live in ``_handle.py``, the
batch in ``_batch.py``, the job's and the resume's checks in ``_job.py`` and
``_resume.py``."""

import collections
import ctypes
import gc
import logging
import math
import os
import re
import time

import numpy as np

from . import _batch, _handle, _job, _lib, _progress
from . import errors
from ._batch import Batch
from ._lib import LIB

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
# As the library's GONE_GRACE: a gone loader (a dead one's segment, or the
# outcome one left at exit) is raised after this, giving a loader being
# restarted the time to take the name.
_GONE_GRACE_S = 1.0
_ATTACH_NOTE_EVERY_S = 60.0
_LOG = logging.getLogger("ringfeed")

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
        "shuffle_block",
        "images",
        "tail",
        "steps_per_epoch",
        "samples_per_epoch",
        "tokens",
    ],
)

ImageFormat = collections.namedtuple("ImageFormat", ["height", "width", "chw", "classes", "labels_offset", "bad_offset"])
ImageFormat.__doc__ = """The shape of a loader's decoded images (``serve --decode image``):
every sample is a uint8 RGB image of ``(3, height, width)`` when ``chw``, else
``(height, width, 3)``; ``classes`` is how many classes the labels index (0:
labels are -1). ``Batch.images``, ``Batch.labels`` and ``Batch.bad`` view
them; the offsets say where in the payload the labels and flags are."""
TokenFormat = collections.namedtuple(
    "TokenFormat",
    ["dtype", "seq_len", "doc_counts_offset", "doc_starts_offset", "doc_starts_max", "eos_token", "corpora"],
)
TokenFormat.__doc__ = """The layout of a loader's token windows (``serve --seq-len L``;
docs/tokens.md): every sample is ``seq_len + 1`` tokens of numpy ``dtype``
(inputs and targets shifted by one); ``doc_starts_max`` is each sample's
room for document starts; ``eos_token`` the token put between documents
(None: none); ``corpora`` the sources mixed. ``Batch.tokens``,
``Batch.doc_starts`` and ``Batch.cu_seqlens()`` view them."""
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
say. ``shuffle_block`` is ``(block_samples, window_blocks)`` under
``--shuffle block`` (docs/sampler.md, section 4), else None.

Per epoch, beside the whole run's ``batches_expected``: ``tail`` is how every
epoch ends, ``"drop"`` (``serve --tail drop``, the default: the samples that
do not fill a whole step of ``job_world_size x max_samples_per_slot`` are left
out, every batch is full) or ``"keep"`` (``--tail keep``: every sample once an
epoch, the last steps' batches short or empty); ``steps_per_epoch`` the steps
(batches) every rank takes in a whole epoch, the same for every rank, which is
``len(feed)``; ``samples_per_epoch`` the samples a whole epoch serves, all
ranks together. A run resumed mid-epoch serves fewer steps in its first epoch
(``Feed.steps_in_epoch``). ``steps_per_epoch`` and ``samples_per_epoch`` are
None if the loader does not say how many samples it serves.
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


class Feed:
    """A trainer's attachment to one rank of a loader. Made by ``attach()``.

    Use a Feed from one thread. Views of its batches may die on any thread.
    """

    def __init__(self, handle, info):
        self._handle = handle
        self._info = info
        self._classes = handle.classes
        self._name = handle.name
        self._rank = handle.rank
        self._tracker = _progress.Tracker()
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
    def classes(self):
        """The class names of the labels, in ImageFolder order (label ``i``
        names ``classes[i]``): a new list of str. From the tree's class
        directories (``serve --decode image``), or from the shards' indexes
        when ``ringfeed pack`` wrote them; empty when the loader knows none
        (no labels, or only their count: ``info.images.classes``)."""
        return list(self._classes)

    @property
    def order(self):
        """``(dataset_samples, seed, shuffled)``: what decides the sample order
        of every epoch, whatever the world size and batch size (plain ints
        and a bool); under ``--shuffle block`` ``(dataset_samples, seed,
        True, block_samples, window_blocks)``. A resume state holds only under the order it was saved
        under: save this in the checkpoint with ``Batch.resume_state`` and
        give both to ``check_resume`` when training goes on from it. None if
        the loader does not say (an older ``ringfeed serve``)."""
        i = self._info
        if i.dataset_samples is None or i.seed is None:
            return None
        if i.shuffle_block is not None:
            return (i.dataset_samples, i.seed, i.shuffled) + tuple(i.shuffle_block)
        return (i.dataset_samples, i.seed, i.shuffled)

    def request_start(self, epoch, samples, order=None):
        """Asks the loader to start the run at a checkpoint's resume state
        ``(epoch, samples)`` (``Batch.resume_state``), under the checkpoint's
        ``order`` (``Feed.order``, or None to leave it unchecked). Call it on
        every rank before the first batch; ``ringfeed.torch.Loader``'s
        ``load_state_dict`` does.

        A loader started with ``--resume auto`` (as ``ringfeed run`` starts
        it) waits for every rank's request, starts there, and stops with an
        error naming each rank's request if they differ. Any other loader
        cannot be moved: this then checks that it starts there
        (``check_resume``), raising ``ResumeMismatchError`` with the flag to
        fix; after a restart of the trainers alone it logs the steps served
        past the checkpoint instead."""
        from . import _resume

        handle = self._handle
        if handle is None:
            raise ValueError("the feed of %r rank %d is closed" % (self._name, self._rank))
        if handle.awaited_start:
            _learn_start(handle, self)
        mode = ctypes.c_uint32(0)
        if not LIB.has("rf_request_start") or LIB.rf_get_start_mode(handle.ptr, ctypes.byref(mode)) != _lib.RF_OK:
            mode.value = _lib.RF_START_FIXED
        if mode.value != _lib.RF_START_AWAITING:
            return _resume.check_resume(self, (epoch, samples), order)
        if order is not None:
            _resume.check_order(self, order)
        with handle.call_lock:
            rc = LIB.rf_request_start(handle.ptr, 1, epoch, samples)
            message = LIB.last_error() if rc < 0 else ""
        if rc != _lib.RF_OK:
            raise errors.error_for(rc, message)

    @property
    def progress(self):
        """Where this rank is in the run: a ``ringfeed.Progress`` named tuple
        (epoch, step of it and its steps, epochs, steps done and in the whole
        run, samples/s and the ETA at this process's rate)."""
        handle = self._handle
        if handle is None:
            raise ValueError("the feed of %r rank %d is closed" % (self._name, self._rank))
        return _progress.progress(self, handle, self._tracker)

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
        if not LIB.has("rf_get_taken"):
            return None
        taken = ctypes.c_uint64()
        with handle.call_lock:
            rc = LIB.rf_get_taken(handle.ptr, ctypes.byref(taken))
            if rc != _lib.RF_OK:
                raise errors.error_for(rc, LIB.last_error())
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

    def __len__(self):
        """This rank's steps (batches) in a whole epoch: ``info.steps_per_epoch``,
        the same for every rank. With ``--tail keep`` the last ones may be
        short or empty; a run resumed mid-epoch serves fewer in its first
        epoch (``steps_in_epoch``). ``for batch in feed`` runs every epoch:
        ``len(feed)`` is one epoch of it, as a DataLoader's length is."""
        steps = self._info.steps_per_epoch
        if steps is None:
            raise TypeError(
                "loader %r does not say how many samples it serves (an older ringfeed serve), so this feed has no "
                "length: restart it with this version" % self._name)
        return steps

    def __bool__(self):
        # A feed is true, whatever its length (a length of 0, or none).
        return True

    def __getitem__(self, index):
        raise TypeError(
            "a ringfeed Feed is iterated, not indexed: for a torch DataLoader, wrap ringfeed.torch.Loader(feed, ...) "
            "(an IterableDataset of one epoch per loop): torch.utils.data.DataLoader(ringfeed.torch.Loader(feed), "
            "batch_size=None)")

    def steps_in_epoch(self, epoch):
        """Steps every rank takes in ``epoch`` of this loader's run:
        ``len(feed)``, fewer in the epoch a resumed loader starts in (the
        steps left after its ``--resume``), 0 for an epoch before it. None
        while a loader under ``--resume auto`` has not said where it starts
        (it has once this rank has a batch), or if it does not say how many
        samples it serves."""
        handle = self._handle
        if handle is not None and handle.awaited_start:
            _learn_start(handle, self)
        info = self._info
        if info.start is None or info.dataset_samples is None:
            return None
        start_epoch, start_samples = info.start
        if epoch < start_epoch:
            return 0
        before = start_samples if epoch == start_epoch else 0
        tail = _lib.RF_TAIL_KEEP if info.tail == "keep" else _lib.RF_TAIL_DROP
        return _lib.epoch_steps(info.dataset_samples, min(before, info.dataset_samples), _step_samples(info), tail)

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
        loader lives) and raises ringfeed.FeedTimeoutError after that.

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
            rc = LIB.rf_next(handle.ptr, ctypes.byref(_lib.rf_batch()), 0)
            raise errors.error_for(rc, LIB.last_error() if rc < 0 else "this feed was attached by the parent of this forked process (rf_next returned %d)" % rc)
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
        claim = _handle.Claim()
        batch = None
        with handle.call_lock:
            try:
                handle.drain_pending()
                if handle.undelivered is not None:
                    raw = handle.undelivered
                    handle.undelivered = None
                    rc, message = _lib.RF_OK, ""
                else:
                    rc = LIB.rf_next(handle.ptr, ctypes.byref(raw), timeout_ms)
                    message = LIB.last_error() if rc < 0 else ""
                if rc == _lib.RF_OK:
                    if handle.resume is None and handle.awaited_start:
                        _learn_start(handle, self)
                    batch = Batch(handle, raw, claim)
                    handle.in_transit = batch
                    self._tracker.saw(batch)
            except BaseException:
                # Either no Batch was armed (take_back wins), or one was and
                # died while the exception unwound, its finalizer queueing the
                # slot because we hold call_lock: take it off the queue.
                if raw.generation != 0 and (claim.take_back(handle) or _handle.unqueue(handle.pending, raw)):
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


def _undeliver(handle):
    """Puts the batch in transit back (see ``Handle.in_transit``): the next
    next() returns it."""
    batch, handle.in_transit = handle.in_transit, None
    if batch is None:
        return
    taken = _batch.disown(batch)
    if taken is not None:
        raw, claim = taken
        if claim.take_back(handle):
            handle.undelivered = raw


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
        rank = _job.env_rank()
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
        if _handle.HELD_BY_THIS_PROCESS not in str(e):
            raise
        gc.collect()
        try:
            handle = _attach_in_slices(name, rank, timeout_ms)
        except errors.RankBusyError as again:
            if _handle.HELD_BY_THIS_PROCESS in str(again):
                _raise_held_here(name, rank, again)
            raise
    raw = _lib.rf_info()
    rc = LIB.rf_get_info(handle.ptr, ctypes.byref(raw))
    if rc != _lib.RF_OK:
        raise errors.error_for(rc, LIB.last_error())
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
        shuffle_block=None,
        images=None,
        tail=None,
        steps_per_epoch=None,
        samples_per_epoch=None,
        tokens=None,
    )
    if LIB.has("rf_get_job"):
        job = _lib.rf_job()
        rc = LIB.rf_get_job(handle.ptr, ctypes.byref(job))
        if rc != _lib.RF_OK:
            raise errors.error_for(rc, LIB.last_error())
        info = info._replace(first_rank=job.first_rank, job_world_size=job.job_world_size, plan_digest=job.plan_digest or None)
    if LIB.has("rf_get_start"):
        epoch, samples, dataset_samples = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
        rc = LIB.rf_get_start(handle.ptr, ctypes.byref(epoch), ctypes.byref(samples), ctypes.byref(dataset_samples))
        if rc == _lib.RF_OK:
            info = info._replace(start=(epoch.value, samples.value), dataset_samples=dataset_samples.value)
        elif rc == _lib.RF_TIMEOUT:
            # --resume auto: the ranks say where the run starts; known once
            # this rank has its first batch (_learn_start).
            info = info._replace(dataset_samples=dataset_samples.value)
            handle.awaited_start = True
        elif rc != _lib.RF_E_VERSION:
            raise errors.error_for(rc, LIB.last_error())
    if LIB.has("rf_get_order"):
        seed, shuffled = ctypes.c_uint64(), ctypes.c_uint32()
        rc = LIB.rf_get_order(handle.ptr, ctypes.byref(seed), ctypes.byref(shuffled))
        if rc == _lib.RF_OK:
            info = info._replace(seed=seed.value, shuffled=bool(shuffled.value))
        elif rc != _lib.RF_E_VERSION:
            raise errors.error_for(rc, LIB.last_error())
    if LIB.has("rf_get_order_block") and info.seed is not None:
        block, window = ctypes.c_uint32(), ctypes.c_uint32()
        rc = LIB.rf_get_order_block(handle.ptr, ctypes.byref(block), ctypes.byref(window))
        if rc != _lib.RF_OK:
            raise errors.error_for(rc, LIB.last_error())
        if block.value:
            info = info._replace(shuffle_block=(block.value, window.value))
    if LIB.has("rf_get_image_format"):
        fmt = _lib.rf_image_format()
        rc = LIB.rf_get_image_format(handle.ptr, ctypes.byref(fmt))
        if rc != _lib.RF_OK:
            raise errors.error_for(rc, LIB.last_error())
        if fmt.is_image:
            info = info._replace(images=ImageFormat(fmt.height, fmt.width, bool(fmt.chw), fmt.classes,
                                                    fmt.labels_offset, fmt.bad_offset))
            handle.images = info.images
    handle.classes = _class_names(handle)
    info = _epoch_info(handle, info)
    handle.tail = _lib.RF_TAIL_KEEP if info.tail == "keep" else _lib.RF_TAIL_DROP
    if LIB.has("rf_get_token_format"):
        fmt = _lib.rf_token_format()
        rc = LIB.rf_get_token_format(handle.ptr, ctypes.byref(fmt))
        if rc != _lib.RF_OK:
            raise errors.error_for(rc, LIB.last_error())
        if fmt.is_tokens:
            info = info._replace(tokens=TokenFormat(
                np.dtype(fmt.dtype.decode("ascii")), fmt.seq_len, fmt.doc_counts_offset, fmt.doc_starts_offset,
                fmt.doc_starts_max, fmt.eos_token if fmt.has_eos else None, fmt.corpora))
            handle.tokens = info.tokens
    if info.start is not None:
        handle.resume = (info.start, info.dataset_samples, _step_samples(info), handle.tail)
    _job.check_job(info, name, rank_from_env)
    return Feed(handle, info)


def _class_names(handle):
    """The class names the loader recorded, in class order (a tuple of str;
    empty when it recorded none, or the library predates them)."""
    if not LIB.has("rf_get_class_name"):
        return ()
    count = ctypes.c_uint32()
    rc = LIB.rf_get_class_count(handle.ptr, ctypes.byref(count))
    if rc != _lib.RF_OK:
        raise errors.error_for(rc, LIB.last_error())
    names = []
    ptr, n = ctypes.c_void_p(), ctypes.c_uint64()
    for i in range(count.value):
        rc = LIB.rf_get_class_name(handle.ptr, i, ctypes.byref(ptr), ctypes.byref(n))
        if rc != _lib.RF_OK:
            raise errors.error_for(rc, LIB.last_error() if rc < 0 else "class %d of %d is missing" % (i, count.value))
        names.append(ctypes.string_at(ptr.value, n.value).decode("utf-8", "replace") if n.value else "")
    return tuple(names)
def _step_samples(info):
    """Samples one step of the job takes (W x B)."""
    job_world_size = info.job_world_size if info.job_world_size is not None else info.world_size
    return job_world_size * info.max_samples_per_slot


def _epoch_info(handle, info):
    """``info`` with the loader's tail and per-epoch figures (rf_get_epoch).
    A loader that predates --tail drops the tail, which it says; one that
    does not say how many samples it serves leaves the figures None."""
    if not LIB.has("rf_get_epoch"):
        return info
    raw = _lib.rf_epoch()
    rc = LIB.rf_get_epoch(handle.ptr, ctypes.byref(raw))
    if rc == _lib.RF_E_VERSION:
        return info._replace(tail="drop")
    if rc != _lib.RF_OK:
        raise errors.error_for(rc, LIB.last_error())
    return info._replace(tail=_lib.TAIL_NAMES.get(raw.tail, "drop"), steps_per_epoch=raw.steps_per_epoch,
                         samples_per_epoch=raw.samples_per_epoch)


def _raise_held_here(name, rank, error):
    """Raises RankBusyError saying what of this process holds the rank: an
    open Feed, or batches (or their views) of a closed one; else ``error``,
    the library's own message."""
    pid = os.getpid()
    handle = next((h for h in list(_handle.LIVE_HANDLES) if (h.name, h.rank, h.pid) == (name, rank, pid)), None)
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
    calls), and returns the Handle. Retries a missing loader and a busy
    rank until the deadline; the error then says how long the whole wait
    was. A loader that is gone (it died, failed or served its run: the
    library says which, in the loader's words) is raised at once. Logs
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
            rc = LIB.rf_attach(encoded, rank, _ms(_slice_s(deadline)), ctypes.byref(ptr))
            if rc == _lib.RF_OK:
                cell[0] = ptr.value
                return _handle.Handle(cell, name, rank)
        except BaseException:
            # Ctrl-C after rf_attach attached: the rank must not stay held
            # by nobody. Once the Handle holds the cell, its finalizer may
            # have detached already; the cell makes it happen once.
            _handle.detach(cell, ptr.value)
            raise
        message = LIB.last_error()
        gone_grace = rc == _lib.RF_E_LOADER_GONE and time.monotonic() - start < _GONE_GRACE_S
        waiting = (rc in (_lib.RF_TIMEOUT, _lib.RF_E_BUSY) or gone_grace) and _handle.HELD_BY_THIS_PROCESS not in message
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
        # The library's words: they name the loaders that do run here,
        # closest first (a misspelled RINGFEED_NAME), over the whole wait.
        why = re.sub(r"within \d+ ms", "within %d ms" % int(waited_s * 1000), message, count=1)
    else:
        why = message
    more = "no timeout" if deadline is None else "giving up in %s" % _seconds(max(0.0, deadline - now))
    return "rank %d has waited %s to attach to loader %r (%s): %s" % (rank, _seconds(waited_s), name, more, why)


def _seconds(s):
    return ("%.1f s" if s < 10 else "%.0f s") % s


def abi_version():
    """The ring ABI version the loaded library speaks."""
    return int(LIB.rf_abi_version())


def _learn_start(handle, feed):
    """Under --resume auto: once a batch came, the loader's start is decided
    and in the header; the batch's resume_state needs it."""
    epoch, samples, dataset_samples = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
    rc = LIB.rf_get_start(handle.ptr, ctypes.byref(epoch), ctypes.byref(samples), ctypes.byref(dataset_samples))
    if rc != _lib.RF_OK:
        return
    info = feed._info._replace(start=(epoch.value, samples.value), dataset_samples=dataset_samples.value)
    raw = _lib.rf_info()
    if LIB.rf_get_info(handle.ptr, ctypes.byref(raw)) == _lib.RF_OK and raw.batches_expected != _lib.BATCHES_UNKNOWN:
        # Known now too: the loader counted the run from the agreed start.
        info = info._replace(batches_expected=raw.batches_expected)
    feed._info = info
    handle.resume = (info.start, info.dataset_samples, _step_samples(info), handle.tail)
    handle.awaited_start = False
