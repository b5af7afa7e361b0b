"""Every fenced block of README.md, bindings/python/README.md and docs/*.md is
run, covered by a named test, or skipped with a reason (issue 39, item 2), so a
doc that drifts from the code fails CI.

The scheme (tests/README.md, "Doc tests"): the line before each block is a marker

    <!-- doc-test: run ID -->             RUNS[ID] below says how this test runs it
    <!-- doc-test: covered-by WHAT ... --> tests/python/test_x.py::test_name (the
                                          function must exist) or a script's path
    <!-- doc-test: skip REASON -->        output samples, pseudo-code, layouts,
                                          what needs GPUs, clouds or several machines

A block with no marker fails, as does a RUNS entry whose block is gone, a
substitution that no longer matches its block, or a covered-by test that does
not exist. A run block is executed in a scratch directory with small datasets
under $DATA (the docs' /data/... paths), `ringfeed` (RINGFEED_BIN) and this
venv's python and torchrun first on PATH, each loader under a name of its own,
8 GPUs as 2 CPU processes, one epoch, the examples in their small modes
(SMALL=1, STEPS=2), and a timeout: it must exit 0, and so must every loader it
started in the background. Python blocks run as a script against a loader the
RUNS entry starts (RINGFEED_NAME, LOCAL_RANK=0); C blocks are compiled with the
`cc` line of their own comment and run the same way.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from e2e_util import ROOT, lib_dir, ringfeed_bin

DOCS = ["README.md", "bindings/python/README.md"] + sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))
MARKER = re.compile(r"^\s*<!-- doc-test: (run|covered-by|skip)\b\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
SCALE = [  # every shell block: a CI machine's numbers
    (re.compile(r"--nproc-per-node \d+"), "--nproc-per-node 2"),
    (re.compile(r"--world-size \d+"), "--world-size 2"),
    (re.compile(r"--epochs \d+"), "--epochs 1"),
    (re.compile(r"\bjob1\b"), "${RF_NAME}"),
    (re.compile(r"(?<![\w.$])/data/"), "$DATA/"),
]


@dataclass
class Block:
    doc: str
    line: int  # of the opening fence, from 1
    lang: str
    text: str
    kind: str = None  # run, covered-by, skip; None: no marker
    arg: str = ""

    def where(self):
        return "%s:%d (```%s)" % (self.doc, self.line, self.lang)


def doc_blocks():
    """Every fenced block of the docs, with the marker on the line before it."""
    blocks, stray = [], []
    for doc in DOCS:
        lines = (ROOT / doc).read_text().splitlines()
        i = 0
        while i < len(lines):
            m = FENCE.match(lines[i])
            if not m:
                marker = MARKER.match(lines[i])
                if marker and not (i + 1 < len(lines) and FENCE.match(lines[i + 1])):
                    stray.append("%s:%d" % (doc, i + 1))
                i += 1
                continue
            indent, fence, lang = m.groups()
            end = i + 1
            while end < len(lines) and not lines[end].strip().startswith(fence):
                end += 1
            body = textwrap.dedent("\n".join(lines[i + 1:end])) + "\n"
            marker = MARKER.match(lines[i - 1]) if i > 0 else None
            block = Block(doc, i + 1, lang or "(none)", body)
            if marker:
                block.kind, block.arg = marker.group(1), marker.group(2)
            blocks.append(block)
            i = end + 1
    return blocks, stray


# ---------------------------------------------------------------------------
# How each `run` block is run. subs: (old, new) pairs, each of which must occur
# in the block (a doc that changed fails here, naming the pair); before/after:
# shell lines around the block; preamble, check: Python before and after a
# Python block (check asserts what the block computed); expect: regexes its
# output must match.

SERVE_4K = "ringfeed serve --source $DATA/train --name $RF_NAME --batch-size 8 --epochs 1 &\n"
SERVE_IMAGES = ("ringfeed serve --source $DATA/imagenet/val --name $RF_NAME --batch-size 4 --epochs 1 "
                "--decode image --crop center:224 &\n")
DRAIN = ('python -c "import ringfeed, sys\n'
         'for b in ringfeed.attach(sys.argv[1], timeout=60): b.release()" %s\n')
TORCHRUN = {"SMALL": "1", "STEPS": "2", "OMP_NUM_THREADS": "1"}
TRAINED = r"epoch 0 step 0 loss \d"  # examples/train_ddp.py's line

RUNS = {
    "readme-serve-torchrun": dict(env=TORCHRUN, timeout=150, expect=[TRAINED]),
    "readme-images": dict(
        env=TORCHRUN, timeout=150,
        subs=[("--name val", "--name ${RF_NAME}-val"), ("VAL_LOADER=val", "VAL_LOADER=${RF_NAME}-val"),
              ("--batch-size 64", "--batch-size 4")],
        expect=[r"rank 0 epoch 0 step 0 loss", r"epoch 0 val top-1 \S+ of 8 images"]),
    "readme-python": dict(before=SERVE_4K, check="assert x.shape == (8, 2048) and batch.step == 7\n"),
    "readme-c": dict(before=SERVE_4K),
    "bindings-python": dict(
        before=SERVE_4K, subs=[("x.cuda()", "x")],
        preamble="B, L = 8, 2048\nmodel = lambda x: x.float().mean()\n", check="assert batch.step == 7\n"),
    "bindings-torch-loader": dict(
        before=SERVE_4K, preamble="import torch\nL = 2048\nckpt = None\n",
        check="assert tokens.shape == (8, L) and ckpt['data']['step'] == 7, ckpt\n"),
    "readme-diff": dict(
        before=SERVE_4K,
        preamble=("import ringfeed, torch\nL = 2048\n"
                  "with ringfeed.attach() as _feed:  # a fresh run's state_dict, as a checkpoint holds it\n"
                  "    sd = {'version': 1, 'resume_state': [0, 0], 'order': list(_feed.order), 'epoch': 0, 'step': 0}\n"),
        check="assert loader.step == 7 and x.shape == (8, L), (loader.step, x.shape)\n"),
    "training-serve-torchrun": dict(env=TORCHRUN, timeout=150, expect=[TRAINED]),
    "training-python": dict(before=SERVE_4K, check="assert x.shape == (8, 2048) and batch.step == 7\n"),
    "training-torch-loader": dict(
        before=SERVE_4K,
        preamble=("import ringfeed, torch\nL = 2048\n"
                  "with ringfeed.attach() as _feed:  # a fresh run's state_dict, as a checkpoint holds it\n"
                  "    sd = {'version': 1, 'resume_state': [0, 0], 'order': list(_feed.order), 'epoch': 0, 'step': 0}\n"),
        check="assert x.shape == (8, L) and sd['step'] == 7, sd\n"),
    "training-c": dict(before=SERVE_4K),
    "training-val-serve": dict(
        subs=[("--name val", "--name ${RF_NAME}-val"), ("--batch-size 64", "--batch-size 3"),
              ("--crop center:224", "--crop center:224 --epochs 1 &")],
        after=DRAIN % "${RF_NAME}-val"),
    "training-val-python": dict(  # 8 images, 3 a batch: a short last batch
        before=("ringfeed serve --source $DATA/imagenet/val --name $RF_NAME --batch-size 3 --tail keep "
                "--shuffle none --decode image --crop center:224 --epochs 1 &\n"),
        subs=[('ringfeed.attach("val")', "ringfeed.attach()")],
        preamble=("import os, torch, torch.distributed as dist, ringfeed, ringfeed.torch\n"
                  "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:%s' % os.environ['PORT'], "
                  "rank=0, world_size=1)\n"
                  "model = lambda x: torch.randn(len(x), 2)\n"),
        check="assert correct[1] == 8, correct  # every val image once\nprint('val', accuracy)\n"),
    "training-run-records": dict(env=TORCHRUN, timeout=150, expect=[TRAINED]),
    "training-checkpoint": dict(  # the first run saves at step 0; the second goes on from it
        env=TORCHRUN, timeout=200, subs=[("CHECKPOINT=ckpt.pt", "CHECKPOINT=$SCRATCH/ckpt.pt")],
        expect=[r"checkpoint \S+/ckpt.pt: restart the loader with --resume 0:16",
                r"ringfeed: done: 6 batches, 48 samples"]),  # the second run: the 48 after the checkpoint
    "tokens-python": dict(
        before="ringfeed serve --source $DATA/train.bin --token-dtype uint16 --name $RF_NAME --seq-len 64 --batch-size 4 --epochs 1 &\n",
        preamble="import ringfeed\n",
        check="assert tokens.shape == (4, 65), tokens.shape\n"),
    "pack": dict(
        subs=[("s3://bucket/raw/", "/data/images"), ("s3://bucket/shards/", "$SCRATCH/shards-1g"),
              ("--dest /data/images-shards", "--dest $SCRATCH/images-shards"),
              ("--source /data/images-shards", "--source $SCRATCH/images-shards"),
              ("--name train --batch-size 64", "--name $RF_NAME --batch-size 8"),
              ("--shuffle block", "--shuffle block --epochs 1 &")],
        after=DRAIN % "$RF_NAME"),
    "metrics": dict(
        subs=[("--source /data ", "--source /data/train "), ("--name job1", "--name job1 --epochs 1"),
              ("--metrics 127.0.0.1:9464", "--metrics 127.0.0.1:$PORT &"), ("http://127.0.0.1:9464/", "http://127.0.0.1:$PORT/")],
        expect=[r"ringfeed_rank_wait_seconds_total\{rank=\"0\"\}"],
        after=DRAIN % "$RF_NAME", wait_metrics=True),
    "cache-list-clear": dict(  # a cache of its own, not the other tests'
        before="export RINGFEED_CACHE_DIR=$SCRATCH/cache\n", subs=[("6f0d2c9a4e1b7d35", "--all")],
        expect=[r"no cached datasets in \S+/cache-list-clear/cache"]),
    "images-loader": dict(
        before=SERVE_IMAGES, preamble="import ringfeed, ringfeed.torch\nmean, std = 0.5 * 255, 0.25 * 255\n",
        check="assert x.shape == (4, 3, 224, 224) and set(labels.tolist()) <= {0, 1}, labels\n"),
    "images-classes": dict(before=SERVE_IMAGES, preamble="import ringfeed\ni = 0\n",
                           check="assert feed.classes == ['n01440764', 'n01443537'], feed.classes\n"),
}


def find_run(run_id):
    blocks, _ = doc_blocks()
    found = [b for b in blocks if b.kind == "run" and b.arg == run_id]
    assert len(found) == 1, "doc-test run %s: %d blocks carry it (want 1)" % (run_id, len(found))
    return found[0]


# ---------------------------------------------------------------------------
# The bookkeeping: every block accounted for, every entry still a block.

def test_every_doc_block_is_run_covered_or_skipped():
    blocks, stray = doc_blocks()
    assert len(blocks) > 40, "found only %d fenced blocks in %s: is the parser broken?" % (len(blocks), DOCS)
    bare = [b.where() for b in blocks if b.kind is None]
    assert not bare, (
        "these doc blocks have no `<!-- doc-test: run ID | covered-by TEST | skip REASON -->` "
        "on the line before them (tests/README.md, \"Doc tests\"):\n  " + "\n  ".join(bare))
    assert not stray, "doc-test markers not followed by a fenced block: %s" % stray


def test_every_run_entry_has_its_block_and_every_run_block_its_entry():
    blocks, _ = doc_blocks()
    ids = [b.arg for b in blocks if b.kind == "run"]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    assert not dup, "doc-test run ids used twice: %s" % dup
    assert not set(RUNS) - set(ids), "RUNS entries whose doc block is gone: %s" % sorted(set(RUNS) - set(ids))
    missing = sorted(set(ids) - set(RUNS))
    assert not missing, "run blocks with no RUNS entry in %s: %s" % (__file__, missing)


def test_covered_by_names_tests_that_exist_and_skips_say_why():
    blocks, _ = doc_blocks()
    bad = []
    for b in blocks:
        if b.kind == "skip" and len(b.arg.split()) < 2:
            bad.append("%s: skip needs a reason" % b.where())
        if b.kind != "covered-by":
            continue
        targets = b.arg.split()
        if not targets:
            bad.append("%s: covered-by names no test" % b.where())
        for target in targets:
            path, _, func = target.partition("::")
            f = ROOT / path
            if not f.is_file():
                bad.append("%s: covered-by %s: no file %s" % (b.where(), target, path))
            elif func and not re.search(r"^\s*(async\s+)?def %s\(" % re.escape(func), f.read_text(), re.M):
                bad.append("%s: covered-by %s: %s has no test %s" % (b.where(), target, path, func))
    assert not bad, "\n".join(bad)


# ---------------------------------------------------------------------------
# Running the run blocks.

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _make_data(data):
    """Small stand-ins for the docs' /data/... paths."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(39)
    for d in ("a", "b"):  # 64 files of 4096 bytes: 2048 uint16 tokens each
        (data / "train" / d).mkdir(parents=True)
        for i in range(32):
            (data / "train" / d / ("%03d.bin" % i)).write_bytes(rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
    (data / "tokens").mkdir()
    (data / "tokens" / "shard-0.bin").write_bytes(rng.integers(0, 256, 4096 * 64, dtype=np.uint8).tobytes())
    for split, per_class in (("train", 8), ("val", 4)):
        for cls in ("n01440764", "n01443537"):
            d = data / "imagenet" / split / cls
            d.mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, (240, 256, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(d / ("%s_%d.JPEG" % (cls, i)), quality=80)
    shutil.copytree(data / "imagenet" / "train", data / "images")
    shutil.copytree(data / "imagenet" / "val", data / "val")
    (data / "train.bin").write_bytes(rng.integers(0, 50000, 64 * 65, dtype=np.uint16).tobytes())


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("docs")
    data = root / "data"
    _make_data(data)
    bindir = root / "bin"
    bindir.mkdir()
    (bindir / "ringfeed").symlink_to(ringfeed_bin())
    venv_bin = Path(sys.executable).parent
    if not (venv_bin / "torchrun").exists():
        pytest.fail("torchrun not found next to %s; install torch" % sys.executable)
    return dict(root=root, data=data, path=os.pathsep.join([str(bindir), str(venv_bin), os.environ["PATH"]]))


def _substitute(block, spec):
    text = block.text
    for old, new in spec.get("subs", []):
        assert old in text, "%s (doc-test run %s): %r is no longer in the block; update RUNS in %s" % (
            block.where(), block.arg, old, __file__)
        text = text.replace(old, new)
    if block.lang in ("sh", "bash", "console", "(none)"):
        for pattern, new in SCALE:
            text = pattern.sub(new, text)
    return text


def _c_program(text, work):
    """The C block as a program (its lines in main(), `rank` 0) and its own cc line."""
    cc = re.search(r"/\*[^*]*?\b(cc -.*?)\s*\*/", text)
    assert cc, "the C block has no `/* cc ... */` comment saying how to build it"
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#include"))
    (work / "app.c").write_text(
        '#include <stdint.h>\n#include <stdio.h>\n#include "ringfeed.h"\n'
        "int main(void) {\n    uint32_t rank = 0;\n%s\n"
        '    if (rc != RF_END) { fprintf(stderr, "rc %%d: %%s\\n", rc, rf_last_error()); return 1; }\n'
        "    return 0;\n}\n" % body)
    build = cc.group(1).replace(" app.c", " %s/app.c" % work)
    build = re.sub(r"(\$PWD/)?target/release", lib_dir(), build)
    return "%s -o %s/app\n%s/app\n" % (build, work, work)


def _script(block, spec, work, name):
    text = _substitute(block, spec)
    if block.lang == "diff":  # a Python diff: the program after it
        text = "".join(line[1:] + "\n" for line in text.splitlines() if line[:1] in ("+", " "))
    if block.lang in ("python", "diff"):
        (work / "snippet.py").write_text(spec.get("preamble", "") + text + spec.get("check", ""))
        body = "RINGFEED_NAME=$RF_NAME LOCAL_RANK=0 python %s/snippet.py\n" % work
    elif block.lang == "c":
        body = _c_program(text.replace('"job1"', '"%s"' % name), work)
    else:
        body = text
    if spec.get("wait_metrics"):
        # the block's curl runs once the loader's endpoint is up
        body = body.replace("curl ", 'for _ in $(seq 100); do curl -s "http://127.0.0.1:$PORT/metrics" >/dev/null && break; '
                            "sleep 0.1; done\ncurl ", 1)
    return ("set -euo pipefail\n%s\n%s\n%s\n"
            'for j in $(jobs -p); do wait "$j"; done\n') % (spec.get("before", ""), body, spec.get("after", ""))


@pytest.mark.parametrize("run_id", sorted(RUNS))
def test_a_doc_block_runs(run_id, scratch):
    block, spec = find_run(run_id), RUNS[run_id]
    work = scratch["root"] / run_id
    work.mkdir()
    name = "doctest-%d-%s" % (os.getpid(), run_id)
    script = _script(block, spec, work, name)
    (work / "block.sh").write_text(script)
    env = dict(os.environ, PATH=scratch["path"], DATA=str(scratch["data"]), SCRATCH=str(work), RF_NAME=name,
               PORT=str(_free_port()), PET_MASTER_PORT=str(_free_port()), MASTER_PORT=str(_free_port()),
               PYTHONUNBUFFERED="1", **spec.get("env", {}))
    env.pop("RINGFEED_NAME", None)
    timeout = spec.get("timeout", 60)
    start = time.monotonic()
    # Output to a file, not a pipe: a loader left running must not hold the test.
    with open(work / "output.txt", "w+b") as log:
        p = subprocess.Popen(["bash", str(work / "block.sh")], cwd=ROOT, env=env, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # what the block left behind
            except ProcessLookupError:
                pass
            p.wait()
            for seg in Path("/dev/shm").glob("*%s*" % name):
                seg.unlink(missing_ok=True)
        log.seek(0)
        out = log.read().decode(errors="replace")[-6000:]
    took = time.monotonic() - start
    assert took < timeout, "%s (doc-test run %s) did not end within %d s; as run:\n%s\n--- output:\n%s" % (
        block.where(), run_id, timeout, script, out)
    assert p.returncode == 0, "%s (doc-test run %s) failed (exit %d) after %.1f s; as run:\n%s\n--- output:\n%s" % (
        block.where(), run_id, p.returncode, took, script, out)
    for want in spec.get("expect", []):
        assert re.search(want, out), "%s (doc-test run %s): no %r in its output:\n%s" % (block.where(), run_id, want, out)
