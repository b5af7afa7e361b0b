"""examples/train_gpt.py for real (issue 38, item 6): `ringfeed run` serving a
mixture of two token corpora (a Megatron pair and a datatrove file, written
by the example's --make-corpus) to `torchrun --nproc-per-node 2`, training the
small GPT with DDP on CPU (gloo) in SMALL mode: both exit 0, the loss falls,
and the position ids restart at document starts."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from e2e_util import ROOT, ringfeed_bin

EXAMPLE = str(ROOT / "examples" / "train_gpt.py")


def test_a_small_gpt_trains_through_ringfeed_run_on_a_mixture_of_two_corpora(tmp_path):
    pytest.importorskip("torch")
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    if torchrun is None:
        pytest.fail("torchrun not found next to %s; install torch" % sys.executable)
    made = subprocess.run([sys.executable, EXAMPLE, "--make-corpus", str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert made.returncode == 0, made.stderr
    env = dict(os.environ, SMALL="1", LOG="1", OMP_NUM_THREADS="1")
    job = subprocess.run(
        [ringfeed_bin(), "run", "--source", str(tmp_path / "web" / "corpus_text_document"), "--source",
         str(tmp_path / "books"), "--weights", "0.7,0.3", "--seq-len", "64", "--batch-size", "4", "--epochs", "1",
         "--samples-per-epoch", "480",
         "--", torchrun, "--standalone", "--nproc-per-node", "2", EXAMPLE],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=240)
    out = job.stdout
    assert job.returncode == 0, out
    assert "did not take every batch" not in out, out
    losses = [float(x) for x in re.findall(r"step \d+ loss ([0-9.]+)", out)]
    assert len(losses) >= 4, out
    assert losses[-1] < losses[0] - 1.0, "the loss did not fall: %s\n%s" % (losses, out)
    # Position ids restart at 0 where a document starts (the first cut of window 0).
    m = re.search(r"document pieces end at \[(\d+)[^\]]*\]; position ids of window 0 start \[([^\]]*)\]", out)
    assert m, out
    first_cut = int(m.group(1))
    pos = [int(v) for v in m.group(2).split(",")]
    assert pos[0] == 0
    if first_cut < len(pos):
        assert pos[first_cut] == 0, out
