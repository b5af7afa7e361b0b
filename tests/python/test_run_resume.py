"""Resume with `ringfeed run`, as a torch user does: examples/train_ddp.py
saves its model and the Loader's state_dict() in a checkpoint; the job is
killed; the SAME command, with no --resume flag, goes on from the checkpoint
(its loader runs `serve --resume auto` and starts where the ranks'
load_state_dict() asks). The samples trained before the kill, then after the
restart, are exactly those of one uninterrupted run, in its order, also when
the restart has another world size; a checkpoint of another sample order is
refused, naming the fix.

Real processes throughout: `ringfeed run`, torchrun, DDP over gloo on CPU.
Each rank logs the indices of the samples it trained on (SAMPLES_LOG), and
STOP_AFTER_STEP holds every rank after its checkpoint until the job is
killed. A small dataset keeps the four torchrun jobs short."""
import os
import signal
import subprocess

import pytest

from e2e_util import ringfeed_bin
from test_run import EXAMPLE, _env, _Lines, _loader_name, _processes_of, _records, _torchrun

# 2 files of 60 records: 120 samples. 2 ranks × batch 4 = 8 a step, 15 steps
# an epoch; 2 epochs. The first run is killed after step 10 of epoch 0, so
# the restart goes on across the epoch boundary.
SHARDS, RECORDS, EPOCHS = 2, 60, 2
STOP_AFTER_STEP = 10
JOB_TIMEOUT_S = 240


def _serve_flags(data, *more):
    return ["--source", str(data), "--batch-size", "4", "--record-bytes", "256", "--epochs", str(EPOCHS), *more]


def _command(data, ranks, *more):
    return [ringfeed_bin(), "run", *_serve_flags(data, *more),
            "--", _torchrun(), "--standalone", "--nproc-per-node", str(ranks), EXAMPLE]


def _trained(log_dir):
    """Every sample index trained, in the job's order: step by step, and in a
    step rank by rank (the order the loader deals a step's samples in)."""
    batches = []
    for name in os.listdir(log_dir):
        rank = int(name[len("rank-"):-len(".log")])
        with open(os.path.join(log_dir, name)) as f:
            for line in f:
                epoch, step, *indices = (int(word) for word in line.split())
                batches.append(((epoch, step, rank), indices))
    batches.sort()
    keys = [key for key, _ in batches]
    assert len(keys) == len(set(keys)), "a rank trained a step twice: %s" % keys
    return [i for _, indices in batches for i in indices]


def _job(command, log_dir, checkpoint, **extra):
    """Runs a job to its end: (exit status, output)."""
    log_dir.mkdir()
    job = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=JOB_TIMEOUT_S,
                         env=_env(SAMPLES_LOG=str(log_dir), CHECKPOINT=str(checkpoint), **extra))
    return job.returncode, job.stdout.decode(errors="replace")


def _killed_after_checkpoint(command, log_dir, checkpoint):
    """Runs a job until every rank trained step STOP_AFTER_STEP and rank 0
    saved its checkpoint there, then kills it (SIGTERM to `ringfeed run`)."""
    log_dir.mkdir()
    run = _Lines(command, _env(SAMPLES_LOG=str(log_dir), CHECKPOINT=str(checkpoint), STOP_AFTER_STEP=str(STOP_AFTER_STEP)))
    name = None
    try:
        for rank in (0, 1):
            run.wait_for("rank %d stopped after step %d" % (rank, STOP_AFTER_STEP), timeout=JOB_TIMEOUT_S)
        name = _loader_name(run.text())
        run.proc.send_signal(signal.SIGTERM)
        rc, out = run.finish(timeout=90)
        assert rc == 143, out
        assert not os.path.exists("/dev/shm/ringfeed-" + name), "the killed job's loader left its segment:\n" + out
        return out
    finally:
        run.kill()
        for pid in _processes_of(name) if name else []:
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """The dataset, one uninterrupted run's samples, and a checkpoint of a
    2-rank run killed after step STOP_AFTER_STEP with the samples it trained."""
    tmp = tmp_path_factory.mktemp("run_resume")
    data = _records(tmp / "data", shards=SHARDS, records=RECORDS)
    rc, out = _job(_command(data, 2), tmp / "whole", tmp / "whole.pt")
    assert rc == 0, out
    whole = _trained(tmp / "whole")
    assert len(whole) == SHARDS * RECORDS * EPOCHS and sorted(set(whole)) == list(range(SHARDS * RECORDS)), whole
    checkpoint = tmp / "ckpt.pt"
    out = _killed_after_checkpoint(_command(data, 2), tmp / "first", checkpoint)
    # Step 10 of epoch 0 done by both ranks: 11 steps of 8 samples.
    assert "checkpoint %s: restart the loader with --resume 0:88" % checkpoint in out, out
    first = _trained(tmp / "first")
    assert len(first) == 88, first
    return tmp, data, whole, checkpoint, first


def _resumed(first_run, ranks, label):
    tmp, data, whole, checkpoint, first = first_run
    resumed_checkpoint = tmp / (label + ".pt")
    resumed_checkpoint.write_bytes(checkpoint.read_bytes())  # each restart from the same checkpoint
    rc, out = _job(_command(data, ranks), tmp / label, resumed_checkpoint)
    assert rc == 0, out
    return out, first, _trained(tmp / label), whole


def test_the_same_command_goes_on_from_the_checkpoint_and_trains_what_one_uninterrupted_run_does(first_run):
    out, first, rest, whole = _resumed(first_run, 2, "same")
    assert "ringfeed run: loader %r for 2 rank(s)" % _loader_name(out) in out.replace('"', "'"), out
    assert first + rest == whole
    # The rest of epoch 0 (4 steps) and epoch 1 (15), 2 ranks, and the
    # loader saw each released.
    assert "ringfeed: done: 38 batches, 152 samples" in out, out


def test_a_restart_with_one_rank_instead_of_two_goes_on_exactly(first_run):
    out, first, rest, whole = _resumed(first_run, 1, "one_rank")
    assert "for 1 rank(s)" in out, out
    assert first + rest == whole
    # 32 samples left of epoch 0 and 120 of epoch 1, 4 a step.
    assert "ringfeed: done: 38 batches, 152 samples" in out, out


def test_a_checkpoint_of_another_seed_is_refused_naming_the_fix_and_the_job_fails(first_run):
    tmp, data, _, checkpoint, _ = first_run
    rc, out = _job(_command(data, 2, "--seed", "12345"), tmp / "other_seed", checkpoint)
    assert rc != 0, out
    assert "ResumeMismatchError" in out, out
    assert "it runs with --seed 12345, the checkpoint's run with --seed" in out, out
    assert "restart the loader with the checkpoint run's dataset and flags, or start the run over" in out, out
    # Refused before a single batch was trained.
    assert _trained(tmp / "other_seed") == [], out
    assert not os.path.exists("/dev/shm/ringfeed-" + _loader_name(out)), out
