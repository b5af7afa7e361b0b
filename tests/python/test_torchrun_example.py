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
