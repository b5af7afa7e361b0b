"""The README's torchrun recipe, for real: `ringfeed serve` over a tokenized
record dataset (--record-bytes), and `torchrun --nproc-per-node 2` running
examples/train_ddp.py with DDP on CPU (gloo). Both must exit 0: every rank got
the same number of batches, so DDP did not hang, and the loader saw every
batch released."""
import os
import shutil
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
        _, err = loader.communicate(timeout=30)
        # 300 records, W×B = 8 per step: 37 steps per epoch, 2 epochs, 2 ranks.
        assert loader.returncode == 0, err.decode()
        assert "148 batches, 592 samples" in err.decode(), err.decode()
    finally:
        if loader.poll() is None:
            loader.kill()
            loader.wait()
