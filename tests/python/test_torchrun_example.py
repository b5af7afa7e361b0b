"""The README's torchrun recipe, for real: `ringfeed serve` over a tokenized
record dataset (--record-bytes), and `torchrun --nproc-per-node 2` running
examples/train_ddp.py with DDP on CPU (gloo). Both must exit 0: every rank got
the same number of batches, so DDP did not hang, and the loader saw every
batch released."""
import os
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from e2e_util import ROOT, ringfeed_bin

SEQ_TOKENS = 128


def test_torchrun_trains_ddp_from_the_ring_on_a_record_dataset(tmp_path):
    pytest.importorskip("torch")
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    if torchrun is None:
        pytest.fail("torchrun not found next to %s; install torch" % sys.executable)
    record_bytes = SEQ_TOKENS * 2
    for shard in range(3):
        (tmp_path / ("shard-%d.bin" % shard)).write_bytes(os.urandom(record_bytes * 100))
    name = "torchrun-%s" % uuid.uuid4().hex[:8]
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(tmp_path), "--name", name, "--batch-size", "4",
         "--record-bytes", str(record_bytes), "--world-size", "2", "--epochs", "2"],
        stderr=subprocess.PIPE,
    )
    env = dict(os.environ, RINGFEED_NAME=name, OMP_NUM_THREADS="1")
    try:
        job = subprocess.run(
            [torchrun, "--standalone", "--nproc-per-node", "2", str(ROOT / "examples" / "train_ddp.py")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, timeout=240,
        )
        out = job.stdout.decode()
        assert job.returncode == 0, out
        assert "epoch 1 step" in out and "loss" in out, out
        # Printed every 20 steps: 8 samples a step; step 20 of epoch 1 is 168.
        assert "epoch 0 step 0 loss" in out and "(resume: --resume 0:8)" in out, out
        assert "epoch 1 step 20 loss" in out and "(resume: --resume 1:168)" in out, out
        _, err = loader.communicate(timeout=30)
        # 300 records, W×B = 8 per step: 37 steps per epoch, 2 epochs, 2 ranks.
        assert loader.returncode == 0, err.decode()
        assert "148 batches, 592 samples" in err.decode(), err.decode()
    finally:
        if loader.poll() is None:
            loader.kill()
            loader.wait()


def test_the_example_goes_on_from_its_checkpoint_only_with_a_loader_resumed_there(tmp_path):
    """examples/train_ddp.py with CHECKPOINT: a first run saves the model and
    the data state; a second run against a loader started without --resume
    stops on every rank, naming the --resume to add, instead of training the
    first samples again; with the loader resumed there it trains to the end."""
    pytest.importorskip("torch")
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    record_bytes = SEQ_TOKENS * 2
    data = tmp_path / "data"
    data.mkdir()
    for shard in range(3):
        (data / ("shard-%d.bin" % shard)).write_bytes(os.urandom(record_bytes * 100))
    checkpoint = tmp_path / "ckpt.pt"

    def run(*flags):
        name = "torchrun-ckpt-%s" % uuid.uuid4().hex[:8]
        loader = subprocess.Popen(
            [ringfeed_bin(), "serve", "--source", str(data), "--name", name, "--batch-size", "4",
             "--record-bytes", str(record_bytes), "--world-size", "2", *flags],
            stderr=subprocess.PIPE)
        env = dict(os.environ, RINGFEED_NAME=name, OMP_NUM_THREADS="1", CHECKPOINT=str(checkpoint))
        try:
            job = subprocess.run(
                [torchrun, "--standalone", "--nproc-per-node", "2", str(ROOT / "examples" / "train_ddp.py")],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, timeout=240)
            if loader.poll() is None and job.returncode != 0:
                loader.terminate()
            _, err = loader.communicate(timeout=30)
            return job.returncode, job.stdout.decode(), loader.returncode, err.decode()
        finally:
            if loader.poll() is None:
                loader.kill()
                loader.wait()

    # 300 records, 8 a step: 37 steps an epoch; checkpoints at steps 0 and 20.
    rc, out, loader_rc, err = run("--epochs", "1")
    assert rc == 0 and loader_rc == 0, out + err
    assert "checkpoint %s: restart the loader with --resume 0:168" % checkpoint in out, out
    rc, out, loader_rc, err = run("--epochs", "2")
    assert rc != 0, out
    assert "ResumeMismatchError" in out and "was started with no --resume" in out, out
    assert "--resume 0:168" in out, out
    rc, out, loader_rc, err = run("--epochs", "2", "--resume", "0:168")
    assert rc == 0 and loader_rc == 0, out + err
    # The rest of epoch 0 (16 steps) and epoch 1 (37), 2 ranks.
    assert "106 batches" in err, err


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("node1_seed", ["0", "1"], ids=["same plan", "node 1 started with another seed"])
def test_torchrun_on_two_machines_each_with_its_own_loader(tmp_path, node1_seed):
    """The README's recipe for several machines: two torchrun launchers
    (`--nnodes 2 --node-rank N`, one process each, meeting on 127.0.0.1)
    stand in for two machines, each with its own loader (`--world-size 2
    --nnodes 2 --node-rank N`) over its own copy of the dataset. Started
    alike, both train to the end; with another --seed on one machine the
    example's check_same_plan stops both ranks, naming the plans, instead of
    training on overlapping samples."""
    pytest.importorskip("torch")
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    record_bytes = SEQ_TOKENS * 2
    shards = [os.urandom(record_bytes * 100) for _ in range(3)]
    tag = uuid.uuid4().hex[:8]
    port = str(_free_port())
    loaders, launchers = [], []
    try:
        for node in range(2):
            data = tmp_path / ("machine%d" % node)
            data.mkdir()
            for i, shard in enumerate(shards):
                (data / ("shard-%d.bin" % i)).write_bytes(shard)
            loaders.append(subprocess.Popen(
                [ringfeed_bin(), "serve", "--source", str(data), "--name", "tr2-%d-%s" % (node, tag), "--batch-size", "4",
                 "--record-bytes", str(record_bytes), "--world-size", "2", "--nnodes", "2", "--node-rank", str(node),
                 "--seed", "0" if node == 0 else node1_seed],
                stderr=subprocess.PIPE,
            ))
        for node in range(2):
            env = dict(os.environ, RINGFEED_NAME="tr2-%d-%s" % (node, tag), OMP_NUM_THREADS="1")
            launchers.append(subprocess.Popen(
                [torchrun, "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node), "--master-addr", "127.0.0.1",
                 "--master-port", port, str(ROOT / "examples" / "train_ddp.py")],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
            ))
        outs = [p.communicate(timeout=240)[0].decode() for p in launchers]
        if node1_seed == "0":
            for node, p in enumerate(launchers):
                assert p.returncode == 0, "machine %d: %s" % (node, outs[node])
            for node, p in enumerate(loaders):
                _, err = p.communicate(timeout=30)
                # 300 records, W×B = 8 per step: 37 steps; one rank per machine.
                assert p.returncode == 0 and "37 batches, 148 samples" in err.decode(), err.decode()
        else:
            for node, p in enumerate(launchers):
                assert p.returncode != 0, "machine %d trained on another plan: %s" % (node, outs[node])
                assert "do not serve the same plan" in outs[node] and "job rank(s) 0: plan" in outs[node] \
                    and "job rank(s) 1: plan" in outs[node] and "--seed" in outs[node], outs[node]
    finally:
        for p in launchers:
            if p.poll() is None:
                p.kill()
                p.wait()
        for p in loaders:  # SIGTERM: a loader stopped so removes its segment
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for node in range(2):
            assert not os.path.exists("/dev/shm/ringfeed-tr2-%d-%s" % (node, tag)), "a loader left its segment"


_LINE_UP_RANK = r"""
import json, sys
import torch.distributed as dist
import ringfeed
name, rank, store = sys.argv[1], int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
feed = ringfeed.attach(name, rank, timeout=30)
before = feed.taken
ringfeed.check_same_plan(feed)
after = feed.taken
steps = []
for batch in feed:
    steps.append(batch.step)
    dist.all_reduce(__import__("torch").zeros(1))  # a DDP step: both ranks must be at the same one
    batch.release()
feed.close()
dist.destroy_process_group()
print(json.dumps({"before": before, "after": after, "steps": steps}))
"""


def test_check_same_plan_lines_the_ranks_up_when_every_rank_restarts_after_a_crash(tmp_path):
    """torchrun --max-restarts restarts every rank while the loader runs on;
    each rank goes on after the batches its rank had taken, and one rank may
    have taken the next step's batch before another died. Without lining up,
    rank 0 trained step k+1 beside rank 1's step k for the rest of the run,
    and the rank with one batch more waited for a partner at its end."""
    pytest.importorskip("torch")
    record_bytes = 64
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "shard.bin").write_bytes(os.urandom(record_bytes * 80))
    name = "lineup-%s" % uuid.uuid4().hex[:8]
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(tmp_path / "data"), "--name", name, "--batch-size", "4",
         "--record-bytes", str(record_bytes), "--world-size", "2", "--epochs", "1", "--no-shuffle"],
        stderr=subprocess.PIPE,
    )
    ranks = []
    try:
        import ringfeed

        # The first attempt: rank 0 took steps 0-2, rank 1 steps 0-1, then
        # both went away (a crash, and torchrun stopping the other).
        for rank, steps in ((0, 3), (1, 2)):
            with ringfeed.attach(name, rank, timeout=30) as feed:
                for _ in range(steps):
                    feed.next(timeout=30).release()
        store = tmp_path / "store"
        env = dict(os.environ, OMP_NUM_THREADS="1")
        ranks = [subprocess.Popen([sys.executable, "-c", _LINE_UP_RANK, name, str(r), str(store)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=env) for r in range(2)]
        outs = [p.communicate(timeout=120) for p in ranks]
        import json

        for r, (p, (out, err)) in enumerate(zip(ranks, outs)):
            assert p.returncode == 0, "rank %d: %s" % (r, err.decode())
        got = [json.loads(out.decode().strip().splitlines()[-1]) for out, _ in outs]
        assert (got[0]["before"], got[1]["before"]) == (3, 2), got
        assert (got[0]["after"], got[1]["after"]) == (3, 3), got
        # 80 records, 8 a step: steps 0-9; both go on with step 3.
        assert got[0]["steps"] == got[1]["steps"] == list(range(3, 10)), got
        err1 = outs[1][1].decode()
        assert "rank 1 of loader %r had taken 2 batch(es) and another rank of the job 3" % name in err1, err1
        assert "gave back epoch 0 step 2 untrained" in err1, err1
        assert "gave back" not in outs[0][1].decode(), outs[0][1].decode()
        _, err = loader.communicate(timeout=30)
        assert loader.returncode == 0, err.decode()
    finally:
        for p in ranks + [loader]:
            if p.poll() is None:
                p.kill()
                p.wait()
