"""`serve --tail keep` (issue 37, item 1): an evaluation pass sees every
sample exactly once an epoch, over 3 ranks and a dataset that is not a
multiple of world size x batch size, for every format (files, records, tar
shards, decoded images), in the manifest's order with --shuffle none, under
the block shuffle, resumed with another world size (--resume E:S and
--resume auto), and under `ringfeed run` with torchrun, where every rank
does one all_reduce a step: the ranks take the same number of steps, so the
collectives line up, and the last steps' batches are short or empty.

Real loaders; the ranks are threads of this process (one attachment each),
or torchrun's processes."""
import io
import math
import os
import random
import signal
import subprocess
import tarfile
import threading
import uuid
import zlib
from pathlib import Path

import pytest

import ringfeed
from e2e_util import kill_survivors, ringfeed_bin, serve_until_serving

WORLD, BATCH, EPOCHS = 3, 4, 2
# 53 samples: 4 whole steps of 12 and a last step of 5: rank 0 gets 4 samples,
# rank 1 one, rank 2 an empty batch.
N = 53
RECORD_BYTES = 16


def _files(root):
    """N files of different sizes; each sample's crc32 by manifest index."""
    rng = random.Random(37)
    root.mkdir()
    crcs = []
    for i in range(N):
        data = rng.randbytes(rng.randrange(1, 300))
        (root / ("%03d.bin" % i)).write_bytes(data)
        crcs.append(zlib.crc32(data))
    return crcs


def _records(root):
    """N records of RECORD_BYTES in two files (31 and 22 records)."""
    rng = random.Random(38)
    root.mkdir()
    crcs = []
    for name, count in (("a.bin", 31), ("b.bin", N - 31)):
        data = rng.randbytes(RECORD_BYTES * count)
        (root / name).write_bytes(data)
        crcs += [zlib.crc32(data[i * RECORD_BYTES:(i + 1) * RECORD_BYTES]) for i in range(count)]
    return crcs


def _tar(root):
    """N WebDataset samples in 3 shards; a sample's crc32 is its .txt
    member's (its key)."""
    root.mkdir()
    crcs = []
    index = 0
    for shard, count in enumerate((18, 18, N - 36)):
        with tarfile.open(root / ("shard-%d.tar" % shard), "w") as t:
            for _ in range(count):
                key = "s%d/%04d" % (shard, index)
                body = key.encode()
                info = tarfile.TarInfo(key + ".txt")
                info.size = len(body)
                t.addfile(info, io.BytesIO(body))
                crcs.append(zlib.crc32(body))
                index += 1
    return crcs


def _images(root):
    """54 images in 3 class directories (4 whole steps, a last of 6:
    4, 2 and an empty batch); no bytes to check, the label instead."""
    from test_images import CLASSES, make_tree

    n = make_tree(root, per_class=18)
    return [i // 18 for i in range(n)]  # label of each index: its class directory


FORMATS = {
    "files": (_files, []),
    "records": (_records, ["--record-bytes", str(RECORD_BYTES)]),
    "tar": (_tar, ["--format", "tar"]),
    "images": (_images, ["--decode", "image", "--crop", "center:16"]),
}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """{format: (directory, expected value of each index, serve flags)}."""
    root = tmp_path_factory.mktemp("tail")
    out = {}
    for kind, (make, flags) in FORMATS.items():
        if kind == "images":
            pytest.importorskip("PIL.Image")
        out[kind] = (root / kind, make(root / kind), flags)
    return out


def _name(what):
    return "tail-%s-%s" % (what, uuid.uuid4().hex[:8])


def _serve(source, name, world, *flags):
    return subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(source), "--name", name, "--manifest-cache", "off",
         "--world-size", str(world), "--batch-size", str(BATCH), "--seed", "9", *flags],
        stderr=subprocess.PIPE, text=True)


def _value(kind, batch, i):
    """What identifies sample i of a batch: its bytes' crc32, its .txt
    member's, or its image's label."""
    if kind == "images":
        return int(batch.labels[i])
    if kind == "tar":
        return zlib.crc32(batch.fields(i)["txt"])
    return zlib.crc32(batch.sample(i))


def _take(name, world, kind, stop_after=None, start=None):
    """Every rank's batches, one thread a rank: {rank: [(epoch, step,
    [(index, value)], resume_state)]}, and each rank's (len(feed),
    feed.info). ``stop_after``: each rank stops after that many batches;
    ``start``: each asks the loader to start there (--resume auto)."""
    got, lens, errors = {}, {}, []

    def rank(r):
        try:
            with ringfeed.attach(name, r, timeout=30) as feed:
                lens[r] = (len(feed), feed.info)
                if start is not None:
                    feed.request_start(*start)
                out = got.setdefault(r, [])
                for batch in feed:
                    assert len(batch) <= BATCH
                    if kind == "images":
                        assert batch.images.shape == (len(batch), 3, 16, 16)
                    out.append((batch.epoch, batch.step,
                                [(int(x), _value(kind, batch, i)) for i, x in enumerate(batch.indices)],
                                batch.resume_state))
                    batch.release()
                    if stop_after is not None and len(out) == stop_after:
                        break
        except BaseException as e:  # noqa: BLE001 - raised below
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    assert sorted(got) == list(range(world)), got
    return got, lens


def _finish(loader):
    _, err = loader.communicate(timeout=60)
    assert loader.returncode == 0, err
    return err


def _check_epoch(got, epoch, world, expected, first=0, steps=None):
    """The batches of ``epoch``: every rank the same steps 0..steps-1, with
    B samples each but the last step's; every sample from position
    ``first`` of the epoch once, with its bytes (or label). Returns the
    indices in (step, rank) order: the order's positions as served."""
    n = len(expected)
    if steps is None:
        steps = math.ceil((n - first) / (world * BATCH))
    by_step = {}
    for r in range(world):
        mine = [b for b in got[r] if b[0] == epoch]
        assert [b[1] for b in mine] == list(range(steps)), "rank %d, epoch %d" % (r, epoch)
        for _, step, samples, _ in mine:
            last_step_left = (n - first) - step * world * BATCH - r * BATCH
            assert len(samples) == max(0, min(BATCH, last_step_left)), (r, epoch, step)
            for index, value in samples:
                assert value == expected[index], (index, value)
            by_step[(step, r)] = [index for index, _ in samples]
    served = [i for key in sorted(by_step) for i in by_step[key]]
    assert len(served) == n - first and len(set(served)) == len(served), served
    return served


@pytest.mark.parametrize("kind", list(FORMATS))
def test_every_sample_once_an_epoch_in_the_same_steps_for_every_rank(datasets, kind):
    source, expected, flags = datasets[kind]
    name = _name(kind)
    loader = _serve(source, name, WORLD, "--tail", "keep", "--epochs", str(EPOCHS), *flags)
    try:
        got, lens = _take(name, WORLD, kind)
        err = _finish(loader)
    finally:
        kill_survivors([loader])
    steps = math.ceil(len(expected) / (WORLD * BATCH))
    for length, info in lens.values():
        assert length == steps == info.steps_per_epoch and info.tail == "keep"
        assert info.samples_per_epoch == len(expected) and info.batches_expected == EPOCHS * steps
    for epoch in range(EPOCHS):
        served = _check_epoch(got, epoch, WORLD, expected)
        assert sorted(served) == list(range(len(expected)))
    # The last step's batch is the epoch's end: the next state is the next epoch.
    for r in range(WORLD):
        assert got[r][steps - 1][3] == (1, 0) and got[r][steps - 2][3] == (0, (steps - 1) * WORLD * BATCH)
    assert "steps an epoch, tail kept" in err, err


def test_shuffle_none_serves_the_manifest_order_and_the_block_order_every_sample_once(datasets):
    source, expected, flags = datasets["records"]
    for order, more in (("none", ["--shuffle", "none"]),
                        ("block", ["--shuffle", "block", "--shuffle-block", "4", "--shuffle-window", "2"])):
        name = _name(order)
        loader = _serve(source, name, WORLD, "--tail", "keep", "--epochs", "1", *flags, *more)
        try:
            got, _ = _take(name, WORLD, "records")
            _finish(loader)
        finally:
            kill_survivors([loader])
        served = _check_epoch(got, 0, WORLD, expected)
        if order == "none":
            assert served == list(range(N))
        else:
            assert sorted(served) == list(range(N)) and served != list(range(N))


@pytest.mark.parametrize("kind", list(FORMATS))
@pytest.mark.parametrize("how", ["flag", "auto"])
def test_a_run_stopped_mid_epoch_and_resumed_with_another_world_size_serves_the_rest_once(datasets, kind, how):
    """3 ranks take 2 steps (24 samples) and stop; the run goes on with 2
    ranks from the state their last batch gave (--resume 0:24, or --resume
    auto with each rank's request_start): the rest of epoch 0 in
    ceil(rest / 8) steps, then every sample of epoch 1."""
    source, expected, flags = datasets[kind]
    n = len(expected)
    name = _name("first")
    loader = _serve(source, name, WORLD, "--tail", "keep", "--epochs", str(EPOCHS), *flags)
    try:
        first, _ = _take(name, WORLD, kind, stop_after=2)
        loader.send_signal(signal.SIGINT)
        loader.communicate(timeout=30)
    finally:
        kill_survivors([loader])
    states = {b[3] for r in first for b in first[r][-1:]}
    assert states == {(0, 2 * WORLD * BATCH)}, first
    before = [i for r in first for b in first[r] for i, _ in b[2]]
    state = states.pop()
    name = _name("rest")
    resume = ["--resume", "%d:%d" % state] if how == "flag" else ["--resume", "auto"]
    loader = _serve(source, name, 2, "--tail", "keep", "--epochs", str(EPOCHS), *flags, *resume)
    try:
        rest, lens = _take(name, 2, kind, start=state if how == "auto" else None)
        _finish(loader)
    finally:
        kill_survivors([loader])
    steps_left = math.ceil((n - state[1]) / (2 * BATCH))
    epoch0 = _check_epoch(rest, 0, 2, expected, first=state[1], steps=steps_left)
    assert sorted(before + epoch0) == list(range(n)), "epoch 0: every sample once across the restart"
    epoch1 = _check_epoch(rest, 1, 2, expected)
    assert sorted(epoch1) == list(range(n))
    for length, info in lens.values():
        assert length == math.ceil(n / (2 * BATCH)), "len() is a whole epoch's steps"


def test_ringfeed_run_keeps_every_ranks_all_reduce_in_step(datasets, tmp_path):
    """`ringfeed run --tail keep -- torchrun`: each rank all_reduces its
    batch's sample count every step (gloo); a rank with fewer steps would
    hang its peers. The sums are every sample of every epoch."""
    from test_run import _env, _torchrun

    source, expected, _ = datasets["files"]
    log = tmp_path / "log"
    log.mkdir()
    script = Path(__file__).parent / "procs" / "eval_ranks.py"
    job = subprocess.run(
        [ringfeed_bin(), "run", "--source", str(source), "--batch-size", str(BATCH), "--epochs", str(EPOCHS),
         "--tail", "keep", "--manifest-cache", "off", "--",
         _torchrun(), "--standalone", "--nproc-per-node", str(WORLD), str(script), str(log)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=240, env=_env())
    out = job.stdout.decode(errors="replace")
    assert job.returncode == 0, out
    steps = math.ceil(N / (WORLD * BATCH))
    served = {e: [] for e in range(EPOCHS)}
    for r in range(WORLD):
        lines = (log / ("rank-%d.log" % r)).read_text().split("\n")
        assert lines[0] == "len %d" % steps, lines[0]
        totals = [line for line in lines if line.startswith("epoch-total")]
        assert totals == ["epoch-total %d %d %d" % (e, steps, N) for e in range(EPOCHS)], totals
        for line in lines:
            if line.startswith("batch "):
                epoch, _step, *indices = (int(w) for w in line.split()[1:])
                served[epoch] += indices
    for epoch in range(EPOCHS):
        assert sorted(served[epoch]) == list(range(N)), epoch


def test_a_dropping_loader_says_at_start_how_many_samples_an_epoch_leaves_out(datasets):
    source, _, _ = datasets["files"]

    def start_lines(*flags):
        rc, err = serve_until_serving(["--source", str(source), "--name", _name("says"), "--manifest-cache", "off",
                                       "--epochs", "2", *flags])
        assert rc in (0, 130), err
        return err

    err = start_lines("--world-size", str(WORLD), "--batch-size", str(BATCH))
    assert "each epoch serves 48 of the 53 samples in 4 steps and leaves out 5, a different 5 every epoch" in err, err
    assert "--tail keep serves every sample once an epoch" in err, err
    err = start_lines("--world-size", str(WORLD), "--batch-size", str(BATCH), "--shuffle", "none")
    assert "every epoch drops the same last 5 of the 53 samples (samples 48 to 52" in err and "--tail keep" in err, err
    # Nothing left out: nothing said.
    for flags in (["--tail", "keep"], ["--world-size", "1", "--batch-size", "1"]):
        err = start_lines(*flags, *(["--world-size", str(WORLD), "--batch-size", str(BATCH)] if flags[0] == "--tail" else []))
        assert "leaves out" not in err and "drops the same" not in err, err


def test_a_resume_at_the_end_of_the_last_epoch_has_nothing_to_serve_and_says_so(datasets):
    source, _, _ = datasets["files"]
    run = subprocess.run(
        [ringfeed_bin(), "serve", "--source", str(source), "--name", _name("end"), "--manifest-cache", "off",
         "--world-size", str(WORLD), "--batch-size", str(BATCH), "--tail", "keep", "--epochs", "2",
         "--resume", "1:%d" % N], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0, run.stderr
    assert "nothing to serve: the run starts at epoch 1, 53 samples consumed, every sample of that epoch" in run.stderr, run.stderr
