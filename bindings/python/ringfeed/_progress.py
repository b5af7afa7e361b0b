"""Where a trainer is in the run: ``Feed.progress``. The run's shape comes
from the loader (``rf_get_run_shape``: epochs, steps in a whole epoch, batch
size); the place from this rank's own batches; the rate from this process's
batches since its first."""

import collections
import ctypes
import time

from . import _lib
from ._lib import LIB

Progress = collections.namedtuple(
    "Progress", ["epoch", "step", "epoch_steps", "epochs", "steps_done", "steps_total", "samples_per_s", "eta_s"]
)
Progress.__doc__ = """Where this rank is in the run (``Feed.progress``).

``epoch`` is the epoch of the last batch taken (epochs count from 0, as
``Batch.epoch``; before the first batch, the epoch the run starts in),
``step`` the steps of it this rank has taken (the last batch's ``step`` + 1)
and ``epoch_steps`` the steps this rank gets in that epoch, so ``step /
epoch_steps`` is the epoch's share done; ``epochs`` is the run's
``--epochs``. ``steps_done`` is the batches this rank has taken in the run
(``Feed.taken``, by earlier processes of the rank too) and ``steps_total``
the batches it gets in the whole run (``FeedInfo.batches_expected``).
``samples_per_s`` is this process's rate since its first batch (None before
a second one) and ``eta_s`` the seconds left at that rate (None while
unknown). Fields the loader does not say (an older ``ringfeed serve``) are
None."""


class Tracker:
    """A feed's batches as progress sees them: the last one's place, and the
    count and time of this process's first, for the rate."""

    __slots__ = ("epoch", "step", "first_at", "count")

    def __init__(self):
        self.epoch = None
        self.step = None
        self.first_at = None
        self.count = 0

    def saw(self, batch):
        """Notes a batch that next() returned."""
        self.epoch, self.step = batch.epoch, batch.step
        self.count += 1
        if self.first_at is None:
            self.first_at = time.monotonic()


def epoch_steps(shape, epoch, first_epoch, steps_total):
    """Steps a rank gets in ``epoch``: a whole epoch's, or, for the first
    epoch of a resumed run, what the run's total leaves for it. The one
    place the binding counts an epoch's steps (the loader's figures say the
    rule: ``Sampler::steps_per_epoch``)."""
    whole = shape.epoch_steps
    if first_epoch is None or epoch != first_epoch or steps_total is None:
        return whole
    later = max(0, shape.epochs - first_epoch - 1) * whole
    return max(0, steps_total - later)


def run_shape(handle):
    """The loader's rf_run_shape, or None when it does not say."""
    if not LIB.has("rf_get_run_shape"):
        return None
    shape = _lib.rf_run_shape()
    with handle.call_lock:
        rc = LIB.rf_get_run_shape(handle.ptr, ctypes.byref(shape))
    return shape if rc == _lib.RF_OK else None


def steps_total(handle):
    """This rank's batches in the whole run, read now (under ``--resume
    auto`` it is known only once the run started), or None."""
    raw = _lib.rf_info()
    with handle.call_lock:
        rc = LIB.rf_get_info(handle.ptr, ctypes.byref(raw))
    if rc != _lib.RF_OK or raw.batches_expected == _lib.BATCHES_UNKNOWN:
        return None
    return raw.batches_expected


def progress(feed, handle, tracker):
    """The Progress of ``feed`` (see ``Progress``)."""
    shape = run_shape(handle)
    total = steps_total(handle)
    taken = feed.taken
    start = feed.info.start
    first_epoch = start[0] if start is not None else None
    if tracker.epoch is None:
        epoch, step = first_epoch, 0
    else:
        epoch, step = tracker.epoch, tracker.step + 1
    per_epoch = epoch_steps(shape, epoch, first_epoch, total) if shape is not None and epoch is not None else None
    rate = eta = None
    if tracker.count >= 2 and shape is not None:
        seconds = time.monotonic() - tracker.first_at
        if seconds > 0:
            steps_per_s = (tracker.count - 1) / seconds
            rate = steps_per_s * shape.batch_size
            if total is not None and taken is not None and steps_per_s > 0:
                eta = max(0, total - taken) / steps_per_s
    return Progress(
        epoch=epoch,
        step=step,
        epoch_steps=per_epoch,
        epochs=shape.epochs if shape is not None else None,
        steps_done=taken,
        steps_total=total,
        samples_per_s=rate,
        eta_s=eta,
    )
