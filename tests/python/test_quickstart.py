"""The README's quick start as a new user runs it (issue 39, item 2): `ringfeed
run --source DIR ... -- torchrun --standalone --nproc-per-node N
examples/train_ddp.py` over an ordinary directory of files of different sizes
(odd ones, empty ones, one larger than the example's context), with the
example as shipped in its small mode (SMALL=1, for a CPU in CI). Before, the
example stopped with "does not fit ... samples differ in size ... pass
collate=" on any directory whose files were not all of one size."""
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e_util import ROOT, ringfeed_bin

README = ROOT / "README.md"


def quick_start_line():
    """The README's one-command quick start: the `ringfeed run` line that
    trains examples/train_ddp.py."""
    for line in README.read_text().splitlines():
        if line.startswith("ringfeed run ") and "examples/train_ddp.py" in line:
            return line.strip()
    raise AssertionError("README.md has no `ringfeed run ... examples/train_ddp.py` quick start line")


def test_the_readme_quick_start_trains_on_files_of_mixed_sizes_in_under_a_minute(tmp_path):
    pytest.importorskip("torch")
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    if torchrun is None:
        pytest.fail("torchrun not found next to %s; install torch" % sys.executable)
    data = tmp_path / "train"
    data.mkdir()
    rng = random.Random(39)
    sizes = [0, 1, 3, 4097] + [rng.randrange(2, 3000) for _ in range(156)]
    for i, size in enumerate(sizes):
        (data / ("doc-%03d.txt" % i)).write_bytes(bytes(rng.randrange(256) for _ in range(size)))
    assert len(set(sizes)) > 100
    # The README's line, with this machine's numbers: /data/train is the
    # directory above, 8 GPUs are 2 CPU processes, the batch is 8.
    line = quick_start_line()
    words = line.split()
    assert words[:2] == ["ringfeed", "run"] and "--" in words and "--source" in words, line
    assert "torchrun" in words and "--standalone" in words, "the quick start should run torchrun standalone: " + line

    def value_after(flag, value):
        i = words.index(flag)
        words[i + 1] = value

    value_after("--source", str(data))
    value_after("--batch-size", "8")
    value_after("--nproc-per-node", "2")
    words[0] = ringfeed_bin()
    words[words.index("torchrun")] = torchrun
    words = [str(ROOT / w) if w == "examples/train_ddp.py" else w for w in words]
    env = dict(os.environ, SMALL="1", OMP_NUM_THREADS="1")
    start = time.monotonic()
    p = subprocess.run(words, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, timeout=240, cwd=tmp_path)
    took = time.monotonic() - start
    out = p.stdout.decode()
    assert p.returncode == 0, out
    assert "does not fit" not in out and "collate" not in out, out
    # 160 files, 16 a step: 10 steps an epoch, every epoch of the README's
    # --epochs, each rank.
    epochs = int(re.search(r"--epochs (\d+)", line).group(1))
    assert re.search(r"ringfeed: done: %d batches, %d samples" % (2 * 10 * epochs, 160 * epochs), out), out
    assert "epoch %d step 0 loss" % (epochs - 1) in out, out
    assert took < 60, "the quick start took %.0f s on the CPU in small mode (wanted under a minute):\n%s" % (took, out)
