"""check_resume and the arithmetic of resume states: a checkpoint goes on
only with a loader that starts where it does, under the same sample order."""

import logging
import operator

from . import _lib
from . import errors
from ._lib import LIB

_LOG = logging.getLogger("ringfeed")


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
    tail = tail_of(info)
    want = (0, 0) if state is None else two_counts(state, "state", "(epoch, samples), a Batch.resume_state")
    if order is not None:
        check_order(feed, order)
    start = info.start
    taken = feed.taken or 0
    at = advance(start, taken, n, per_step, tail)
    wanted = _normal(want, n, per_step, tail)
    if wanted == at:
        return
    if taken and _normal(start, n, per_step, tail) <= wanted < at:
        steps = _steps_between(wanted, at, n, per_step, tail)
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


def two_counts(value, what, shape):
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


def check_order(feed, order):
    """Raises ResumeMismatchError when ``order`` (a saved Feed.order) is not
    the loader's."""
    try:
        # A block order adds (block_samples, window_blocks); the others, and
        # checkpoints saved before the block order existed, have three.
        saved_n, saved_seed, saved_shuffled, *saved_block = order
        saved_n, saved_seed = operator.index(saved_n), operator.index(saved_seed)
        saved_block = tuple(operator.index(v) for v in saved_block) or None
        if saved_block is not None and len(saved_block) != 2:
            raise ValueError(saved_block)
    except (TypeError, ValueError):
        raise errors.InvalidArgumentError(
            "order must be (dataset_samples, seed, shuffled) or, under --shuffle block, (dataset_samples, seed, "
            "shuffled, block_samples, window_blocks), a Feed.order, not %r" % (order,)
        ) from None
    saved_shuffled = bool(saved_shuffled)
    mine = feed.order
    if mine is None:
        raise errors.error_for(
            _lib.RF_E_VERSION,
            "loader %r does not record its --seed and shuffle (an older ringfeed serve): restart it with this "
            "version to check the order, or pass order=None" % feed.name,
        )
    n, seed, shuffled, *block = mine
    block = tuple(block) or None
    wrong = []
    if n != saved_n:
        wrong.append(
            "it serves %d samples, the checkpoint's run %d (the dataset changed since: files added or removed, "
            "or another --source or --record-bytes)" % (n, saved_n)
        )
    if shuffled != saved_shuffled:
        wrong.append("it runs %s, the checkpoint's run %s" % (
            "with a shuffle" if shuffled else "with --no-shuffle", "with --no-shuffle" if not saved_shuffled else "with a shuffle"))
    if shuffled and saved_shuffled and block != saved_block:
        def name(b):
            return "--shuffle block --shuffle-block %d --shuffle-window %d" % b if b else "the exact shuffle"
        wrong.append("it runs %s, the checkpoint's run %s" % (name(block), name(saved_block)))
    if shuffled and saved_shuffled and seed != saved_seed:
        wrong.append("it runs with --seed %d, the checkpoint's run with --seed %d" % (seed, saved_seed))
    if not wrong:
        return
    raise errors.ResumeMismatchError(
        "loader %r serves another sample order than the run this checkpoint was saved in: %s. A resume state holds "
        "only under the order it was saved under; restart the loader with the checkpoint run's dataset and flags, "
        "or start the run over" % (feed.name, "; ".join(wrong))
    )


def tail_of(info):
    """The loader's tail as the library names it (RF_TAIL_DROP, RF_TAIL_KEEP)."""
    return _lib.RF_TAIL_KEEP if info.tail == "keep" else _lib.RF_TAIL_DROP


def _normal(state, n, per_step, tail=_lib.RF_TAIL_DROP):
    """A state as the loader goes on from it: one with no step left of its
    epoch goes on with the next epoch (rf_resume_normal_tail: the loader's
    own rule, ring::resume)."""
    return LIB.resume_rule("rf_resume_normal", state[0], state[1], n, per_step, tail=tail)


def advance(start, steps, n, per_step, tail=_lib.RF_TAIL_DROP):
    """The state ``steps`` steps after ``start`` (rf_resume_advance_tail)."""
    return LIB.resume_rule("rf_resume_advance", start[0], start[1], steps, n, per_step, tail=tail)


def _steps_between(a, b, n, per_step, tail=_lib.RF_TAIL_DROP):
    """Steps from state ``a`` to the later state ``b`` (both normal)."""
    if a[0] == b[0]:
        return (b[1] - a[1]) // per_step
    per_epoch = _lib.epoch_steps(n, 0, per_step, tail)
    first = _lib.epoch_steps(n, a[1], per_step, tail)
    return first + (b[0] - a[0] - 1) * per_epoch + b[1] // per_step
