"""Where a rank sits in its job: torchrun's variables checked against the
ranks the loader serves (at attach), and ``check_same_plan`` across the
machines of a job, which also lines the ranks up after a restart."""

import logging
import os

from . import errors

_LOG = logging.getLogger("ringfeed")


def env_rank():
    """LOCAL_RANK, else RANK, else 0."""
    for var in ("LOCAL_RANK", "RANK"):
        rank = _env_count(var)
        if rank is None:
            continue
        if rank < 0:
            raise errors.RankError("%s=%d is negative; a rank is 0 or more (torchrun sets it)" % (var, rank))
        return rank
    return 0


def _env_count(var):
    """An environment variable torchrun sets, as an int, or None if unset."""
    text = os.environ.get(var)
    if text is None or text.strip() == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise errors.RankError("%s=%r is not a number" % (var, text)) from None


def check_job(info, name, rank_from_env):
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
