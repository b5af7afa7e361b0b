"""End to end through `ringfeed serve`: one Python rank and one C rank, with
each reader backend; every sample's bytes must equal its file's."""
import os
import random
import subprocess
import sys
import time
import uuid
from collections import defaultdict

import numpy as np
import pytest

from e2e_util import compile_c, crc32, kill_survivors, python_consumer, ringfeed_bin, serve_until_serving, wait_all


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    rng = random.Random(5)
    files = []
    for i in range(301):
        sub = root / ("d%d" % (i % 7)) / ("e%d" % (i % 3))
        sub.mkdir(parents=True, exist_ok=True)
        data = bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 100, 4096, 5000, 70000])))
        path = sub / ("f%03d.bin" % i)
        path.write_bytes(data)
        files.append(path)
    # The manifest order: byte-wise order of relative paths.
    rel = sorted((str(p.relative_to(root)).encode(), p) for p in files)
    hashes = [(len(p.read_bytes()), crc32(p.read_bytes())) for _, p in rel]
    return root, hashes


@pytest.fixture(scope="module")
def c_consumer(tmp_path_factory):
    return compile_c("dump_hashes.c", tmp_path_factory.mktemp("cbin"))


def parse(out):
    rows = []
    for line in out.decode().splitlines():
        epoch, step, index, length, h = (int(x) for x in line.split())
        rows.append((epoch, step, index, length, h))
    return rows


@pytest.mark.parametrize("io", ["uring", "pread"])
def test_python_and_c_ranks_get_every_sample_with_the_files_bytes(dataset, c_consumer, io):
    root, hashes = dataset
    name = "e2e-%s-%s" % (io, uuid.uuid4().hex[:8])
    world, batch, epochs = 2, 8, 2
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(root), "--name", name, "--batch-size", str(batch),
         "--world-size", str(world), "--epochs", str(epochs), "--seed", "7", "--io", io],
        stderr=subprocess.PIPE,
        env=dict(os.environ, RINGFEED_LOG="info"),  # the first-batch line below is logged at info
    )
    procs = [
        subprocess.Popen(python_consumer("hash_consumer.py", name, 0), stdout=subprocess.PIPE, stderr=subprocess.PIPE),
        subprocess.Popen([c_consumer, name, "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE),
    ]
    results = wait_all(procs, timeout=120)
    _, loader_err = loader.communicate(timeout=30)
    assert loader.returncode == 0, loader_err.decode()
    assert ("reader %s" % ("io_uring" if io == "uring" else "pread")) in loader_err.decode()
    # Serve reports when every rank had its first batch (time to first batch).
    assert "first batch of every rank published" in loader_err.decode() and "all 2 after" in loader_err.decode(), loader_err.decode()
    per_epoch = defaultdict(list)
    counts = []
    for rank, (rc, out, err) in enumerate(results):
        assert rc == 0, "rank %d: %s" % (rank, err.decode())
        rows = parse(out)
        counts.append(len(rows))
        for epoch, step, index, length, h in rows:
            assert (length, h) == hashes[index], "sample %d differs from its file (rank %d)" % (index, rank)
            per_epoch[epoch].append(index)
    n = len(hashes)
    steps = n // (world * batch)
    assert counts[0] == counts[1] == epochs * steps * batch
    assert sorted(per_epoch) == list(range(epochs))
    for epoch, indices in per_epoch.items():
        assert len(indices) == len(set(indices)) == steps * world * batch, "epoch %d" % epoch
    # Two epochs are two different shuffles of the same samples.
    assert per_epoch[0] != per_epoch[1]


def test_the_block_order_serves_every_sample_once_from_a_few_blocks_per_step(dataset, c_consumer):
    root, hashes = dataset
    name = "e2e-block-%s" % uuid.uuid4().hex[:8]
    world, batch, epochs, block, window = 2, 8, 2, 16, 2
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(root), "--name", name, "--batch-size", str(batch),
         "--world-size", str(world), "--epochs", str(epochs), "--seed", "7", "--shuffle", "block",
         "--shuffle-block", str(block), "--shuffle-window", str(window)],
        stderr=subprocess.PIPE,
    )
    procs = [
        subprocess.Popen(python_consumer("hash_consumer.py", name, 0), stdout=subprocess.PIPE, stderr=subprocess.PIPE),
        subprocess.Popen([c_consumer, name, "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE),
    ]
    results = wait_all(procs, timeout=120)
    _, loader_err = loader.communicate(timeout=30)
    assert loader.returncode == 0, loader_err.decode()
    per_step = defaultdict(list)
    for rank, (rc, out, err) in enumerate(results):
        assert rc == 0, "rank %d: %s" % (rank, err.decode())
        for epoch, step, index, length, h in parse(out):
            assert (length, h) == hashes[index], "sample %d differs from its file (rank %d)" % (index, rank)
            per_step[(epoch, step)].append(index)
    steps = len(hashes) // (world * batch)
    for epoch in range(epochs):
        indices = [i for step in range(steps) for i in per_step[(epoch, step)]]
        assert len(indices) == len(set(indices)) == steps * world * batch, "epoch %d" % epoch
        # A step's 16 positions lie in at most two windows of 2 blocks of 16.
        for step in range(steps):
            blocks = {i // block for i in per_step[(epoch, step)]}
            assert len(blocks) <= 2 * window, (epoch, step, sorted(per_step[(epoch, step)]))
    assert [per_step[(0, s)] for s in range(steps)] != [per_step[(1, s)] for s in range(steps)]


def test_auto_falls_back_to_pread_with_one_warning_naming_the_reason(dataset, c_consumer):
    root, hashes = dataset
    name = "e2e-fallback-%s" % uuid.uuid4().hex[:8]
    env = dict(os.environ, RINGFEED_IO_URING_DISABLE="1")
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(root), "--name", name, "--batch-size", "16", "--world-size", "1", "--io", "auto"],
        stderr=subprocess.PIPE, env=env,
    )
    (rc, out, err), = wait_all([subprocess.Popen([c_consumer, name, "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)], 120)
    _, loader_err = loader.communicate(timeout=30)
    text = loader_err.decode()
    assert rc == 0, err.decode()
    assert loader.returncode == 0, text
    assert text.count("io_uring is unavailable") == 1, text
    assert "RINGFEED_IO_URING_DISABLE" in text
    assert "reader pread" in text
    for epoch, step, index, length, h in parse(out):
        assert (length, h) == hashes[index]


def test_uring_fails_instead_of_falling_back(dataset):
    env = dict(os.environ, RINGFEED_IO_URING_DISABLE="1")
    p = subprocess.run(
        [ringfeed_bin(), "serve", "--source", str(dataset[0]), "--name", "e2e-nofallback", "--batch-size", "4", "--world-size", "1", "--io", "uring"],
        stderr=subprocess.PIPE, env=env, timeout=60,
    )
    assert p.returncode != 0
    assert "--io pread" in p.stderr.decode()


@pytest.mark.parametrize("args, needle", [
    (["--source", "/nonexistent/ringfeed-data"], "/nonexistent/ringfeed-data"),
    (["--source", "s3://bucket/prefix"], "s3://"),
    (["--record-bytes", "3"], "not a multiple"),
    (["--batch-size", "100000"], "cannot fill one step"),
    (["--name", "bad/name"], "invalid loader name"),
    (["--slot-bytes", "1"], "does not fit"),
])
def test_serve_errors_name_the_path_or_value(dataset, args, needle):
    base = {"--source": str(dataset[0]), "--name": "e2e-err-%s" % uuid.uuid4().hex[:8], "--batch-size": "4", "--world-size": "1"}
    it = iter(args)
    for k in it:
        base[k] = next(it)
    cmd = [ringfeed_bin(), "serve"]
    for k, v in base.items():
        cmd += [k, v]
    p = subprocess.run(cmd, stderr=subprocess.PIPE, timeout=60)
    assert p.returncode != 0
    assert needle in p.stderr.decode(), p.stderr.decode()


@pytest.mark.parametrize("sig", [15, 1], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_stops_the_loader_removes_its_segment_and_tells_the_trainers(dataset, c_consumer, sig):
    import signal

    name = "e2e-sig%d-%s" % (sig, uuid.uuid4().hex[:8])
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(dataset[0]), "--name", name, "--batch-size", "4", "--world-size", "2", "--epochs", "1000"],
        stderr=subprocess.PIPE,
        # The signal's default disposition, whatever the suite inherited: a suite started under
        # `nohup` passes SIGHUP on ignored, and the loader rightly keeps an ignored SIGHUP
        # ignored (test_nohup_keeps_the_loader_up...), so this test hung there.
        preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL),
    )
    # Rank 0 never attaches, so the run cannot finish; rank 1 reads until told.
    consumer = subprocess.Popen([c_consumer, name, "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 20
        while not os.path.exists("/dev/shm/ringfeed-" + name) and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        loader.send_signal(sig)
        _, loader_err = loader.communicate(timeout=10)
    except BaseException:
        kill_survivors([loader, consumer])  # a loader that did not stop must not outlive the test
        raise
    assert loader.returncode == 128 + sig, loader_err.decode()
    assert not os.path.exists("/dev/shm/ringfeed-" + name)
    (rc, _, err), = wait_all([consumer], 10)
    assert rc != 0
    assert "stopped before the end of the run" in err.decode() and "signal %d" % sig in err.decode(), err.decode()


def test_a_closed_stderr_does_not_stop_the_loader(dataset, c_consumer):
    # `ringfeed serve ... 2>&1 | grep -m1 serving` closes the pipe once the
    # line is found; every later log line must fail quietly, not kill it.
    root, hashes = dataset
    name = "e2e-epipe-%s" % uuid.uuid4().hex[:8]
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(root), "--name", name, "--batch-size", "8", "--epochs", "3"],
        stderr=subprocess.PIPE,
        env=dict(os.environ, RINGFEED_LOG="debug"),  # many lines, all into the closed pipe
    )
    for line in loader.stderr:
        if b"serving" in line:
            break
    loader.stderr.close()
    consumer = subprocess.Popen([c_consumer, name, "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    (rc, out, err), = wait_all([consumer], 60)
    assert rc == 0, err.decode()
    assert len(parse(out)) == 3 * (len(hashes) // 8) * 8
    assert loader.wait(timeout=30) == 0
    assert not os.path.exists("/dev/shm/ringfeed-" + name)


def need_private_mounts():
    """Skips the test where a private mount namespace cannot be made."""
    probe = subprocess.run(["unshare", "-m", "true"], stderr=subprocess.PIPE)
    if probe.returncode != 0:
        pytest.skip("cannot make a private mount namespace here: %s" % probe.stderr.decode().strip())


def serve_in_small_shm(size, args, stop_after_s=None):
    """Runs `ringfeed serve ARGS` with /dev/shm a fresh tmpfs of `size`, in a
    private mount namespace; SIGINT after `stop_after_s` seconds if given."""
    need_private_mounts()
    run = 'exec "$0" "$@"' if stop_after_s is None else 'exec timeout --preserve-status -s INT %d "$0" "$@"' % stop_after_s
    script = "mount -t tmpfs -o size=%s tmpfs /dev/shm && %s" % (size, run)
    return subprocess.run(["unshare", "-m", "sh", "-c", script, ringfeed_bin(), "serve"] + args, stderr=subprocess.PIPE, timeout=60)


def test_shm_too_small_is_a_clear_error_with_the_bytes_and_the_fixes(dataset):
    p = serve_in_small_shm("1m", ["--source", str(dataset[0]), "--name", "e2e-small-shm", "--batch-size", "64", "--world-size", "2", "--slots-per-rank", "8"])
    text = p.stderr.decode()
    assert p.returncode != 0
    assert "/dev/shm is too small" in text, text
    assert "--shm-size=" in text and "medium: Memory" in text, text
    assert "bytes) but only" in text, text
    # Slots of the 64 largest samples (4.5 MB) do not fit at all.
    assert "even 2 slots per rank take" in text and "lower --batch-size" in text, text


def test_shm_too_small_for_the_slots_asked_names_the_most_that_fit(dataset):
    # Slots of 2 samples (140 KB): 8 per rank do not fit in 1 MiB, 3 do.
    p = serve_in_small_shm("1m", ["--source", str(dataset[0]), "--name", "e2e-fewer-slots", "--batch-size", "2", "--world-size", "2", "--slots-per-rank", "8"])
    text = p.stderr.decode()
    assert p.returncode == 1, text
    assert "/dev/shm is too small" in text and "--shm-size=256m" in text, text
    assert "sizeLimit of at least 256Mi" in text, text  # a Kubernetes quantity: "256m" would be 0.256 bytes
    assert "or make the ring smaller: --slots-per-rank 3 fits" in text, text


def test_shm_too_small_for_an_oversized_slot_bytes_names_the_flag_and_the_size_the_data_needs(dataset):
    # The slots are made far larger than the data needs: the advice must
    # name --slot-bytes, not only /dev/shm's size.
    p = serve_in_small_shm("8m", ["--source", str(dataset[0]), "--name", "e2e-big-slots", "--batch-size", "2", "--world-size", "2", "--slots-per-rank", "4", "--slot-bytes", "4000000"])
    text = p.stderr.decode()
    assert p.returncode != 0
    assert "/dev/shm is too small" in text, text
    assert "lower --slot-bytes 4000000 to " in text, text
    assert "leave it out to size slots from the data" in text, text


def test_two_loaders_on_a_small_shm_one_stops_with_the_clear_error_and_neither_crashes(dataset, tmp_path):
    # Each ring fits alone, not both. Slot payloads are allocated when first
    # claimed, so /dev/shm's free bytes alone would let both pass the check at
    # create, fill up together and both stop. The check counts what the other
    # ring will still allocate, under a lock on /dev/shm: the loader that comes
    # second stops at create with the clear error (never SIGBUS), and the
    # first keeps serving.
    need_private_mounts()
    script = r"""
mount -t tmpfs -o size=100m tmpfs /dev/shm || exit 99
args="--source $2 --batch-size 64 --world-size 2 --slots-per-rank 8 --epochs 100"
"$1" serve $args --name first 2>"$3/first.err" & a=$!
"$1" serve $args --name second 2>"$3/second.err" & b=$!
wait -n $a $b; rc=$?
sleep 0.5
alive=0; kill -0 $a 2>/dev/null && alive=$((alive+1)); kill -0 $b 2>/dev/null && alive=$((alive+1))
kill $a $b 2>/dev/null; wait
echo "rc=$rc alive=$alive"
"""
    p = subprocess.run(["unshare", "-m", "bash", "-c", script, "x", ringfeed_bin(), str(dataset[0]), str(tmp_path)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    out = p.stdout.decode()
    errs = (tmp_path / "first.err").read_text() + (tmp_path / "second.err").read_text()
    assert "rc=1 alive=1" in out, out + p.stderr.decode() + errs
    assert errs.count("/dev/shm is too small") == 1, errs
    assert "/dev/shm filled up" not in errs, errs
    assert "--shm-size=" in errs, errs


def test_the_default_prefetch_shrinks_to_fit_a_small_shm_with_a_warning(dataset):
    # B=64 over this dataset: 3.2 MiB slots, 8 per rank by default (51.5 MiB
    # for 2 ranks; 10 epochs, so 20 batches per rank: the default is not
    # capped by them); 20 MiB of /dev/shm holds 3 per rank.
    p = serve_in_small_shm("20m", ["--source", str(dataset[0]), "--name", "e2e-fit-shm", "--batch-size", "64", "--world-size", "2", "--epochs", "10"], stop_after_s=3)
    text = p.stderr.decode()
    assert "too little for the default 8 slots per rank" in text and "using 3" in text, text
    assert "3 slots/rank" in text, text
    assert p.returncode == 130, text  # served until stopped by SIGINT


def test_one_slot_per_rank_warns_that_the_loop_must_release_each_batch(dataset):
    name = "e2e-k1-%s" % uuid.uuid4().hex[:8]
    rc, text = serve_until_serving(["--source", str(dataset[0]), "--name", name, "--batch-size", "4", "--slots-per-rank", "1"])
    assert rc == 130, text
    assert "--slots-per-rank 1: the loader cannot read ahead" in text, text
    assert "batch.release()" in text, text


def test_a_trainer_whose_local_world_size_differs_from_the_loaders_is_refused(dataset):
    name = "e2e-wsize-%s" % uuid.uuid4().hex[:8]
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(dataset[0]), "--name", name, "--batch-size", "4", "--world-size", "2"],
        stderr=subprocess.PIPE,
    )
    try:
        code = "import ringfeed\ntry:\n    ringfeed.attach(timeout=20)\nexcept ringfeed.RankError as e:\n    print(e)\n"
        env = dict(os.environ, RINGFEED_NAME=name, LOCAL_RANK="0", LOCAL_WORLD_SIZE="4")
        p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=60)
        text = p.stdout.decode()
        assert "serves 2 rank(s) on this machine" in text and "LOCAL_WORLD_SIZE=4" in text, text + p.stderr.decode()
    finally:
        loader.terminate()
        loader.communicate(timeout=10)


def test_a_file_that_vanishes_during_the_run_stops_the_loader_with_its_path(tmp_path, c_consumer):
    for i in range(64):
        (tmp_path / ("f%02d" % i)).write_bytes(b"x" * 1000)
    name = "e2e-vanish-%s" % uuid.uuid4().hex[:8]
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(tmp_path), "--name", name, "--batch-size", "4", "--world-size", "1",
         "--epochs", "100000", "--slots-per-rank", "1"],
        stderr=subprocess.PIPE,
    )
    consumer = subprocess.Popen([c_consumer, name, "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    import time
    time.sleep(1.0)
    (tmp_path / "f17").unlink()
    _, err = loader.communicate(timeout=30)
    text = err.decode()
    assert loader.returncode != 0
    assert str(tmp_path / "f17") in text, text
    # The OS error is named once, not repeated by the error chain.
    assert text.count("No such file or directory") == 1, text
    (rc, _, cerr), = wait_all([consumer], 10)
    assert rc != 0 and "stopped before the end of the run" in cerr.decode(), cerr.decode()
    # The trainer reports the loader's own error, naming the file.
    assert str(tmp_path / "f17") in cerr.decode(), cerr.decode()


@pytest.mark.parametrize("io", ["uring", "pread"])
@pytest.mark.parametrize("change", ["grows", "shrinks", "empty one grows"])
def test_a_file_that_changes_size_during_the_run_stops_the_loader_with_its_path_and_sizes(tmp_path, c_consumer, io, change):
    size = 0 if change == "empty one grows" else 1000
    src = tmp_path / "src"
    src.mkdir()
    contents = [b"" if (i == 17 and size == 0) else (b"%02d" % i) * 500 for i in range(64)]
    for i, data in enumerate(contents):
        (src / ("f%02d" % i)).write_bytes(data)
    name = "e2e-resize-%s" % uuid.uuid4().hex[:8]
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(src), "--name", name, "--batch-size", "4", "--world-size", "1",
         "--epochs", "100000", "--slots-per-rank", "1", "--io", io],
        stderr=subprocess.PIPE,
    )
    # The consumer's lines go to a file: a full pipe would stop it, and the loader with it.
    with open(tmp_path / "delivered.txt", "wb") as out:
        consumer = subprocess.Popen([c_consumer, name, "0"], stdout=out, stderr=subprocess.PIPE)
    try:
        import time
        time.sleep(1.0)
        with open(src / "f17", "r+b") as f:
            if change == "shrinks":
                f.truncate(600)
            else:
                f.seek(0, 2)
                f.write(b"y" * 24)
        _, err = loader.communicate(timeout=30)
        (rc, _, cerr), = wait_all([consumer], 10)
    finally:
        kill_survivors([loader, consumer])
    text = err.decode()
    assert loader.returncode != 0, text
    assert str(src / "f17") in text, text
    assert "changed size" in text and "expected %d bytes" % size in text, text
    assert "found 600" in text if change == "shrinks" else ("found %d" % (size + 24) in text and "grew" in text), text
    assert rc != 0 and "stopped before the end of the run" in cerr.decode(), cerr.decode()
    # The trainer reports the loader's own error, naming the file.
    assert str(src / "f17") in cerr.decode(), cerr.decode()
    # Every sample delivered before the stop holds its file's original bytes:
    # the probe byte of the failed read reached no published batch.
    rows = parse((tmp_path / "delivered.txt").read_bytes())
    assert len(rows) > 64, "the consumer took %d samples before the change" % len(rows)
    bad = [(index, length) for _, _, index, length, h in rows
           if (length, h) != (len(contents[index]), crc32(contents[index]))]
    assert not bad, bad[:10]


def test_stat_shows_each_rank_its_queue_its_wait_and_the_reader(dataset, c_consumer):
    name = "e2e-stat-%s" % uuid.uuid4().hex[:8]
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(dataset[0]), "--name", name, "--batch-size", "4", "--world-size", "2",
         "--epochs", "1000", "--io", "pread", "--slots-per-rank", "4"],
        stderr=subprocess.PIPE,
    )
    consumer = subprocess.Popen([c_consumer, name, "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        import time
        deadline = time.time() + 20
        text = ""
        rows = []
        while time.time() < deadline:
            p = subprocess.run([ringfeed_bin(), "stat", name, "--once", "--interval", "0.2"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=20)
            text = p.stdout.decode()
            rows = [line.split() for line in text.splitlines() if line.strip()[:1].isdigit()]
            # Steady state: rank 0's trainer attached, rank 1's 4 slots full.
            if p.returncode == 0 and "pid %d" % consumer.pid in text and len(rows) == 2 and rows[1][2] == "4":
                break
            time.sleep(0.1)
        assert "reader pread" in text, text
        assert [r[0] for r in rows] == ["0", "1"], text
        assert rows[0][1:3] == ["pid", str(consumer.pid)], text   # rank 0 has its trainer
        assert rows[1][1] == "none" and rows[1][2] == "4", text    # rank 1: nobody, 4 batches queued
        # Rates over the 0.2 s interval: rank 0's trainer takes batches and
        # bytes; rank 1 takes nothing.
        assert float(rows[0][6]) > 0 and float(rows[0][7]) > 0, text
        assert float(rows[1][5]) == 0 and float(rows[1][6]) == 0, text
    finally:
        for p in (consumer, loader):
            p.kill()
            p.wait()
        subprocess.run([ringfeed_bin(), "gc"], stdout=subprocess.DEVNULL)


def test_stat_of_a_loader_that_published_every_batch_shows_no_reads_in_flight(dataset):
    # 301 samples, B=32: 9 batches, all in rank 0's 16 slots with no trainer
    # attached, so the loader publishes the whole run and waits for releases.
    name = "e2e-statend-%s" % uuid.uuid4().hex[:8]
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(dataset[0]), "--name", name, "--batch-size", "32", "--world-size", "1",
         "--slots-per-rank", "16"],
        stderr=subprocess.PIPE,
    )
    try:
        import time
        deadline = time.time() + 20
        text = ""
        while time.time() < deadline:
            p = subprocess.run([ringfeed_bin(), "stat", name, "--once"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               timeout=20)
            text = p.stdout.decode()
            if "every batch published" in text:
                break
            time.sleep(0.05)
        assert "every batch published" in text and "9/9" in text, text
        # The count of the last reads was once left as it stood before they completed.
        assert "(0 reads in flight)" in text, text
        # Killed now, it leaves its segment: stat says it died, not that it finished.
        loader.kill()
        loader.wait()
        p = subprocess.run([ringfeed_bin(), "stat", name, "--once"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=20)
        text = p.stdout.decode()
        assert "DEAD" in text and "killed after publishing every batch" in text and "ringfeed gc" in text, text
        assert "finished" not in text, text
    finally:
        loader.kill()
        loader.wait()
        subprocess.run([ringfeed_bin(), "gc"], stdout=subprocess.DEVNULL)


def test_gc_removes_a_dead_loaders_segment_and_says_so(dataset):
    name = "e2e-gc-%s" % uuid.uuid4().hex[:8]
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(dataset[0]), "--name", name, "--batch-size", "4", "--world-size", "1"],
        stderr=subprocess.PIPE,
    )
    import time
    deadline = time.time() + 20
    while not os.path.exists("/dev/shm/ringfeed-" + name) and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    alive = subprocess.run([ringfeed_bin(), "gc"], stdout=subprocess.PIPE, timeout=20).stdout.decode()
    assert "kept    /dev/shm/ringfeed-%s" % name in alive, alive
    loader.kill()
    loader.wait()
    # stat of the dead loader says so, with no reads left in flight.
    st = subprocess.run([ringfeed_bin(), "stat", name, "--once"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=20)
    text = st.stdout.decode()
    assert "DEAD" in text and "ringfeed gc" in text and "(no reads in flight)" in text, (text, st.stderr.decode())
    p = subprocess.run([ringfeed_bin(), "gc"], stdout=subprocess.PIPE, timeout=20)
    assert p.returncode == 0
    assert "removed /dev/shm/ringfeed-%s" % name in p.stdout.decode(), p.stdout.decode()
    assert not os.path.exists("/dev/shm/ringfeed-" + name)


def test_a_rank_that_no_trainer_attaches_to_is_named_while_the_loader_waits(dataset, c_consumer):
    import time

    name = "e2e-missing-%s" % uuid.uuid4().hex[:8]
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(dataset[0]), "--name", name, "--batch-size", "8", "--world-size", "2"],
        stderr=subprocess.PIPE,
    )
    # Only rank 0 comes (LOCAL_WORLD_SIZE typo, or rank 1 crashed before
    # attaching): it takes what it can, then the run cannot go on.
    consumer = subprocess.Popen([c_consumer, name, "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(6)  # the loader names the ranks it waits for every 5 s
        loader.terminate()
        _, loader_err = loader.communicate(timeout=10)
        wait_all([consumer], 10)
    finally:
        kill_survivors([loader, consumer])
    text = loader_err.decode()
    assert "WARN" in text and "waiting for rank(s) [1]: no trainer is attached" in text, text
    assert "this machine needs 2 trainer(s), LOCAL_RANK 0 to 1" in text, text


def test_a_rank_that_took_its_last_batch_ends_without_waiting_for_slower_ranks(dataset):
    """Each rank advances on its own; its loop must end once it has every
    batch of the run, not when the slowest rank is done (here rank 1 never
    comes: before, rank 0 waited for END until the loader was stopped)."""
    import ringfeed

    root, hashes = dataset
    name = "e2e-finish-%s" % uuid.uuid4().hex[:8]
    world, batch, epochs = 2, 8, 2
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(root), "--name", name, "--batch-size", str(batch),
         "--world-size", str(world), "--epochs", str(epochs)],
        stderr=subprocess.PIPE,
    )
    try:
        taken = 0
        with ringfeed.attach(name, rank=0, timeout=30) as feed:
            while True:
                b = feed.next(timeout=20)  # TimeoutError here is the bug
                if b is None:
                    break
                taken += 1
                b.release()
        assert taken == epochs * (len(hashes) // (world * batch))
        assert loader.poll() is None, "the loader still waits for rank 1"
    finally:
        loader.terminate()
        _, loader_err = loader.communicate(timeout=30)
        kill_survivors([loader])
    assert loader.returncode == 128 + 15, loader_err.decode()


_LEASE_HOLDER = """
import fcntl, os, signal, sys, time
signal.signal(signal.SIGIO, signal.SIG_IGN)  # told to give the lease up: keep it
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def hold_lease(path, seconds):
    """A process that holds a write lease on `path` for `seconds`: any other
    process's open of it waits until the lease is given up, or for
    /proc/sys/fs/lease-break-time (45 s by default), the way a read of a hung
    network filesystem waits. Needs the file's owner (or CAP_LEASE)."""
    holder = subprocess.Popen([sys.executable, "-c", _LEASE_HOLDER, str(path), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held", "could not take a lease on %s" % path
    return holder


@pytest.mark.parametrize("io", ["uring", "pread"])
def test_a_stop_is_not_held_up_by_a_read_that_never_returns(tmp_path, io):
    """A dataset file whose open waits (another process holds a lease on it)
    stands for a read of a hung network filesystem. SIGTERM must still tell
    the trainer, remove the segment and end the loader."""
    import time

    import ringfeed

    root = tmp_path / "data"
    root.mkdir()
    for i in range(10):
        (root / ("f%02d" % i)).write_bytes(bytes([i]) * 1000)
    name = "e2e-hung-%s-%s" % (io, uuid.uuid4().hex[:8])
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(root), "--name", name, "--batch-size", "1", "--no-shuffle",
         "--slots-per-rank", "2", "--io", io, "--manifest-cache", "off"],
        stderr=subprocess.PIPE,
    )
    holder = None
    try:
        with ringfeed.attach(name, rank=0, timeout=30) as feed:
            # The loader is two batches ahead: samples 0 and 1 are read. File
            # 5's open will wait for the lease, for 45 s.
            holder = hold_lease(root / "f05", 120)
            for i in range(5):
                b = feed.next(timeout=20)
                assert bytes(b.sample(0))[:1] == bytes([i])
                b.release()
            with pytest.raises(ringfeed.TimeoutError):
                feed.next(timeout=2)  # the loader is stuck opening f05
            stopped = time.monotonic()
            loader.terminate()
            with pytest.raises(ringfeed.AbortedError):
                feed.next(timeout=20)
            told = time.monotonic() - stopped
        _, err = loader.communicate(timeout=20)
        took = time.monotonic() - stopped
    finally:
        kill_survivors([loader] + ([holder] if holder else []))
    text = err.decode()
    assert loader.returncode == 128 + 15, text
    assert told < 2, "the trainer learned of the stop %.1f s after SIGTERM" % told
    assert took < 15, "the loader took %.1f s to exit" % took
    assert not os.path.exists("/dev/shm/ringfeed-" + name)
    assert "read(s) still under way" in text, text


@pytest.mark.parametrize("io", ["uring", "pread"])
def test_a_file_whose_open_waits_for_a_lease_is_read_once_it_is_given_up(tmp_path, io):
    """A lease (Samba, an NFS server) makes an open wait a little: the loader
    waits too, rather than fail (a non-blocking open would fail at once)."""
    import ringfeed

    for i in range(8):
        (tmp_path / ("f%d" % i)).write_bytes(bytes([i]) * 3000)
    holder = hold_lease(tmp_path / "f3", 2)
    name = "e2e-lease-%s-%s" % (io, uuid.uuid4().hex[:8])
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(tmp_path), "--name", name, "--batch-size", "2", "--no-shuffle",
         "--io", io, "--manifest-cache", "off"],
        stderr=subprocess.PIPE, text=True,
    )
    try:
        got = []
        with ringfeed.attach(name, rank=0, timeout=30) as feed:
            for batch in feed:
                with batch:
                    got += [bytes(batch.sample(j)) for j in range(len(batch))]
        _, err = loader.communicate(timeout=30)
    finally:
        kill_survivors([loader, holder])
    assert loader.returncode == 0, err
    assert got == [bytes([i]) * 3000 for i in range(8)]


def _serve_job(root, loaders, consumers, io="auto"):
    """Runs one loader per (name, extra args) and one Python consumer per
    (name, rank argument, extra env); returns each consumer's rows."""
    procs = [
        subprocess.Popen(
            [ringfeed_bin(), "serve", "--source", str(root), "--name", name, "--batch-size", "8", "--epochs", "2",
             "--seed", "11", "--io", io] + extra,
            stderr=subprocess.PIPE,
        )
        for name, extra in loaders
    ]
    try:
        results = wait_all(
            [subprocess.Popen(python_consumer("hash_consumer.py", name, rank), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=dict(os.environ, **env))
             for name, rank, env in consumers],
            timeout=120,
        )
        for p in procs:
            _, err = p.communicate(timeout=30)
            assert p.returncode == 0, err.decode()
    finally:
        kill_survivors(procs)
    rows = []
    for i, (rc, out, err) in enumerate(results):
        assert rc == 0, "consumer %d: %s" % (i, err.decode())
        rows.append(parse(out))
    return rows


def _torchrun_env(node, local_rank, nnodes=2, per_node=2):
    return {"RANK": str(node * per_node + local_rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(nnodes * per_node),
            "LOCAL_WORLD_SIZE": str(per_node)}


@pytest.mark.parametrize("io", ["uring", "pread"])
def test_a_job_on_two_machines_gets_exactly_the_batches_it_would_get_on_one(dataset, io):
    # Two loaders on this machine stand in for the loaders of two machines:
    # `--world-size 4 --nnodes 2 --node-rank N`, each with two trainers that
    # take their rank from torchrun's variables. Job rank r must get exactly
    # what rank r of one loader serving all 4 ranks gets, so that across the
    # machines every sample comes once per epoch.
    root, hashes = dataset
    tag = uuid.uuid4().hex[:8]
    one = _serve_job(root, [("e2e-one-" + tag, ["--world-size", "4"])],
                     [("e2e-one-" + tag, r, {}) for r in range(4)], io)
    names = ["e2e-node%d-%s" % (n, tag) for n in range(2)]
    two = _serve_job(root, [(names[n], ["--world-size", "4", "--nnodes", "2", "--node-rank", str(n)]) for n in range(2)],
                     [(names[n], "env", _torchrun_env(n, l)) for n in range(2) for l in range(2)], io)
    steps = len(hashes) // (4 * 8)
    per_epoch = defaultdict(list)
    for rank in range(4):
        assert len(two[rank]) == 2 * steps * 8, "job rank %d" % rank
        assert two[rank] == one[rank], "job rank %d got other batches on two machines than on one" % rank
        for epoch, step, index, length, h in two[rank]:
            assert (length, h) == hashes[index]
            per_epoch[epoch].append(index)
    for epoch, indices in per_epoch.items():
        assert len(indices) == len(set(indices)) == steps * 4 * 8, "epoch %d" % epoch


@pytest.mark.parametrize("loader_args, node, needles", [
    # The README's one-machine command run on each of two machines: both
    # would serve the same samples.
    (["--world-size", "2"], 1, ["WORLD_SIZE=4", "--world-size 4 --nnodes 2 --node-rank N", "same samples"]),
    # Two machines both started as node 0.
    (["--world-size", "4", "--nnodes", "2", "--node-rank", "0"], 1, ["RANK=2", "--node-rank 0", "with --node-rank 1"]),
    # The whole job's world size, --nnodes forgotten: one step to the fix.
    (["--world-size", "4"], 0, ["LOCAL_WORLD_SIZE=2", "--world-size 4 --nnodes 2 --node-rank N"]),
])
def test_a_trainer_whose_job_ranks_differ_from_its_loaders_is_refused(dataset, loader_args, node, needles):
    name = "e2e-job-%s" % uuid.uuid4().hex[:8]
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(dataset[0]), "--name", name, "--batch-size", "4"] + loader_args,
        stderr=subprocess.PIPE,
    )
    try:
        code = "import ringfeed\ntry:\n    ringfeed.attach(timeout=20)\nexcept ringfeed.RankError as e:\n    print(e)\n"
        env = dict(os.environ, RINGFEED_NAME=name, **_torchrun_env(node, 0))
        p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=60)
        text = p.stdout.decode()
        for needle in needles:
            assert needle in text, text + p.stderr.decode()
        # The usual explicit form, rank=int(LOCAL_RANK), is checked the same way.
        code = "import os, ringfeed\ntry:\n    ringfeed.attach(rank=int(os.environ['LOCAL_RANK']), timeout=20)\nexcept ringfeed.RankError as e:\n    print(e)\n"
        p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=60)
        for needle in needles:
            assert needle in p.stdout.decode(), p.stdout.decode() + p.stderr.decode()
        # Outside torchrun the rank is the caller's business.
        code = "import ringfeed\nf = ringfeed.attach(rank=0, timeout=20)\nprint(f.info.first_rank, f.info.job_world_size)\n"
        bare = {k: v for k, v in env.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_RANK")}
        p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=bare, timeout=60)
        assert p.returncode == 0, p.stderr.decode()
        assert p.stdout.decode().split() == ["0", loader_args[1]]  # --world-size: the job
        if "--nnodes" in loader_args:
            stat = subprocess.run([ringfeed_bin(), "stat", name, "--once", "--interval", "0.2"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, timeout=30)
            out = stat.stdout.decode()
            assert "a job of 4 ranks" in out and "job ranks 0 to 1" in out, out + stat.stderr.decode()
    finally:
        loader.terminate()
        loader.communicate(timeout=10)


@pytest.mark.parametrize("io", ["uring", "pread"])
def test_a_record_file_replaced_by_another_size_stops_serve_before_any_of_its_records(tmp_path, io):
    # Record mode reads one record at a time, so a read inside a replaced
    # file used to deliver the new file's bytes (and with io_uring, shards
    # that had opened the old file and shards that opened the new one mixed
    # them). Every open of a kept file now checks its size: the loader stops
    # with an error naming the file before a record of it is published.
    import ringfeed

    src = tmp_path / "records"
    src.mkdir()
    rng = random.Random(11)
    originals = []
    for i in range(10):
        data = bytes(rng.getrandbits(8) for _ in range(400))
        (src / ("f%03d" % i)).write_bytes(data)
        originals.append(data)
    name = "e2e-replaced-%s-%s" % (io, uuid.uuid4().hex[:8])
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(src), "--name", name, "--batch-size", "2", "--record-bytes", "40",
         "--no-shuffle", "--slots-per-rank", "2", "--io", io, "--manifest-cache", "off"],
        stderr=subprocess.PIPE,
    )
    try:
        delivered = []
        error = None
        with ringfeed.attach(name, rank=0, timeout=20) as feed:
            # The loader has read ahead 2 batches (4 records of f000) at most.
            new = src / "new"
            new.write_bytes(b"\x01" * 800)
            os.rename(new, src / "f009")
            try:
                for batch in feed:
                    for k, index in enumerate(batch.indices):
                        delivered.append((int(index), bytes(batch.sample(k))))
                    batch.release()
            except ringfeed.AbortedError as e:
                error = str(e)
        _, err = loader.communicate(timeout=30)
    finally:
        kill_survivors([loader])
    text = err.decode()
    for index, data in delivered:
        assert data == originals[index // 10][(index % 10) * 40:(index % 10) * 40 + 40], "record %d: not the file's bytes" % index
    # Every record before f009 at most, in order. With K=2 the loader reads
    # f009 (batch 45) only once batch 43 is released, so at least 88 came;
    # batch 44 may still be in flight when f009's open fails and stops the run.
    indices = [i for i, _ in delivered]
    assert indices == list(range(len(indices))) and 88 <= len(indices) <= 90, indices
    assert loader.returncode == 1, text
    assert "f009: file changed size since the manifest was built: expected 400 bytes, found 800 when it was opened" in text, text
    # The trainer hears the loader's own words, naming the file.
    assert error is not None and "f009: file changed size" in error, error


def _take_every_batch(name, world_size):
    """Attaches every rank in this process and takes the whole run, step by
    step; returns [(epoch, step, [rank 0's indices, rank 1's, ...],
    resume_state, the C library's rf_resume_state)] and the feeds' info."""
    import ctypes

    import ringfeed
    from ringfeed import _lib

    feeds = [ringfeed.attach(name, r, timeout=30) for r in range(world_size)]
    steps = []
    try:
        while True:
            batches = [f.next(timeout=30) for f in feeds]
            if all(b is None for b in batches):
                return steps, feeds[0].info
            assert None not in batches, "ranks ended at different steps"
            assert len({(b.epoch, b.step, b.resume_state) for b in batches}) == 1
            b = batches[0]
            raw = _lib.rf_batch(epoch=b.epoch, step=b.step)
            epoch, samples = ctypes.c_uint64(), ctypes.c_uint64()
            rc = _lib.LIB.rf_resume_state(feeds[0]._handle.ptr, ctypes.byref(raw), ctypes.byref(epoch), ctypes.byref(samples))
            assert rc == 0, _lib.LIB.last_error()
            steps.append((b.epoch, b.step, [list(x.indices) for x in batches], b.resume_state, (epoch.value, samples.value)))
            for x in batches:
                x.release()
    finally:
        for f in feeds:
            f.close()


def test_resume_state_of_a_batch_restarts_the_loader_at_the_next_step_with_any_world_size(tmp_path):
    # After `--resume 0:16` the steps count from 16: (step + 1) * W * B alone
    # would replay 16 samples. Batch.resume_state (and rf_resume_state) add
    # the loader's start; a loader restarted there with another W serves
    # exactly the samples of the steps after it, in the same order.
    root = tmp_path / "data"
    root.mkdir()
    for i in range(88):  # 88 - 16 and 88 are multiples of W*B = 8 and of 4
        (root / ("f%02d" % i)).write_bytes(b"%d" % i)
    common = ["--source", str(root), "--batch-size", "4", "--seed", "5", "--epochs", "2"]
    tag = uuid.uuid4().hex[:8]

    def run(name, world_size, resume):
        loader = subprocess.Popen([ringfeed_bin(), "serve", "--name", name, "--world-size", str(world_size),
                                   "--resume", resume] + common, stderr=subprocess.PIPE, text=True)
        try:
            steps, info = _take_every_batch(name, world_size)
            assert loader.wait(timeout=30) == 0, loader.stderr.read()
        finally:
            kill_survivors([loader])
        return steps, info

    first, info = run("e2e-resume-a-" + tag, 2, "0:16")
    assert (info.start, info.dataset_samples) == ((0, 16), 88)
    assert [(e, s, state) for e, s, _, state, _ in first[:2]] == [(0, 0, (0, 24)), (0, 1, (0, 32))]
    assert (first[8][:2], first[8][3]) == ((0, 8), (1, 0))  # the last step of epoch 0
    assert (first[9][:2], first[9][3]) == ((1, 0), (1, 8))  # epoch 1 counts from 0
    assert all(state == c_state for _, _, _, state, c_state in first)
    # Checkpoint after step 3 of epoch 0, restart on one rank.
    state = first[3][3]
    assert state == (0, 48)
    second, info = run("e2e-resume-b-" + tag, 1, "%d:%d" % state)
    assert info.start == state
    order = lambda steps: [(e, i) for e, _, ranks, _, _ in steps for indices in ranks for i in indices]  # noqa: E731
    assert order(second) == order(first[4:])
    assert second[0][3] == (0, 52) and second[-1][3] == (2, 0)  # (epochs, 0): the run is done


def test_a_trainer_attaches_again_to_a_loader_restarted_after_its_loader_died(tmp_path):
    # The LoaderGoneError advice: restart `ringfeed serve` and attach again.
    # The dead loader's feed, still open (or kept alive by the traceback of
    # the error being handled), holds its rank on the dead segment only: the
    # new attach must not be refused as "already attached by this process".
    import ringfeed

    root = tmp_path / "data"
    root.mkdir()
    for i in range(64):
        (root / ("f%02d" % i)).write_bytes(b"x" * 100)
    name = "e2e-restart-" + uuid.uuid4().hex[:8]
    args = [ringfeed_bin(), "serve", "--source", str(root), "--name", name, "--batch-size", "2"]
    loaders = [subprocess.Popen(args, stderr=subprocess.DEVNULL)]
    try:
        feed = ringfeed.attach(name, 0, timeout=30)
        feed.next(timeout=30).release()
        loaders[0].kill()
        loaders[0].wait()
        try:
            while True:
                batch = feed.next(timeout=5)
                batch.release()
        except ringfeed.LoaderGoneError:
            loaders.append(subprocess.Popen(args, stderr=subprocess.DEVNULL))
            again = ringfeed.attach(name, 0, timeout=30)  # inside the handler: the traceback holds the old feed
        assert not feed.closed
        got = sum(len(b) for b in again)
        assert got == 64
        assert loaders[1].wait(timeout=30) == 0
        # The old feed still refuses politely, and closes.
        with pytest.raises(ringfeed.LoaderGoneError):
            feed.next(timeout=1)
        feed.close()
    finally:
        kill_survivors(loaders)


def test_nohup_keeps_the_loader_up_and_an_inherited_ignored_sigint_still_stops_it(dataset):
    # `nohup ringfeed serve ... &` starts it with SIGHUP ignored: the hang-up
    # of the ssh session must not stop it. A script's `serve &` starts it
    # with SIGINT ignored: SIGINT must still stop it, during the listing as
    # after it.
    import signal

    def ignore(*sigs):
        return lambda: [signal.signal(s, signal.SIG_IGN) for s in sigs]

    name = "e2e-nohup-" + uuid.uuid4().hex[:8]
    args = [ringfeed_bin(), "serve", "--source", str(dataset[0]), "--name", name, "--batch-size", "4"]
    loader = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, preexec_fn=ignore(signal.SIGHUP, signal.SIGINT))
    try:
        for line in loader.stderr:
            if line.startswith("ringfeed: serving"):
                break
        loader.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert loader.poll() is None, "SIGHUP under nohup stopped the loader"
        loader.send_signal(signal.SIGINT)
        assert loader.wait(timeout=10) == 128 + signal.SIGINT
        assert not os.path.exists("/dev/shm/ringfeed-" + name)
        # The first thing it does is to take the inherited "ignore" back (a
        # signal before that, right after exec, is lost to any program).
        early = subprocess.Popen(args, stderr=subprocess.DEVNULL, preexec_fn=ignore(signal.SIGINT))
        deadline = time.monotonic() + 10
        while _ignored_signals(early.pid) & (1 << (signal.SIGINT - 1)):
            assert time.monotonic() < deadline, "SIGINT still ignored"
            time.sleep(0.001)
        early.send_signal(signal.SIGINT)
        assert early.wait(timeout=10) in (128 + signal.SIGINT, -signal.SIGINT)
    finally:
        kill_survivors([loader] + ([early] if "early" in locals() else []))


def _ignored_signals(pid):
    """The SigIgn mask of a process (0 once it is gone)."""
    try:
        with open("/proc/%d/status" % pid) as f:
            return next(int(line.split()[1], 16) for line in f if line.startswith("SigIgn:"))
    except (FileNotFoundError, StopIteration):
        return 0


def test_live_stat_follows_the_trainers_draining_the_last_batches_until_the_loader_exits(dataset):
    # Every batch published ("ended") while the last ones are still queued
    # for the trainer: stat went quiet there, though the run was not over.
    import ringfeed

    name = "e2e-statlive-%s" % uuid.uuid4().hex[:8]
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(dataset[0]), "--name", name, "--batch-size", "32", "--world-size", "1",
         "--slots-per-rank", "16"],
        stderr=subprocess.PIPE, text=True,
    )
    stat = None
    try:
        for line in loader.stderr:
            if line.startswith("ringfeed: serving"):
                break
        stat = subprocess.Popen([ringfeed_bin(), "stat", name, "--interval", "0.1"], stdout=subprocess.PIPE, text=True)
        time.sleep(1.0)
        assert stat.poll() is None, "stat quit while 9 batches were still queued for the trainer"
        with ringfeed.attach(name, 0, timeout=10) as feed:
            assert sum(1 for _ in feed) == 9
        assert loader.wait(timeout=30) == 0
        out, _ = stat.communicate(timeout=10)
        assert stat.returncode == 0
        assert "waiting for trainers to take and release the last" in out, out
        last = out.split('loader "')[-1]  # the last frame
        assert "finished: every batch was published and the loader exited" in last, last
    finally:
        kill_survivors([loader] + ([stat] if stat else []))


def test_gc_run_by_another_user_skips_what_is_not_theirs_and_succeeds(tmp_path):
    # A user's gc met root's segments (mode 0600) and exited 1 "(permissions?)";
    # a directory with a segment's name got the same hint.
    import shutil
    import tempfile

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run gc as another user")
    tag = uuid.uuid4().hex[:8]
    seg = "/dev/shm/ringfeed-e2e-gcroot-" + tag
    odd = "/dev/shm/ringfeed-e2e-gcdir-" + tag
    with open(seg, "wb") as f:  # a dead root loader's segment, as far as gc can tell
        f.write(b"\0" * 8192)
    os.chmod(seg, 0o600)
    os.mkdir(odd)
    bindir = tempfile.mkdtemp(dir="/tmp")
    try:
        os.chmod(bindir, 0o755)
        binary = shutil.copy(ringfeed_bin(), bindir)
        p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", binary, "gc"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=20, env=dict(os.environ, HOME="/nonexistent"))
        assert p.returncode == 0, (p.stdout, p.stderr)
        assert "skipped %s: another user's (uid 0)" % seg in p.stdout, p.stdout
        assert "skipped %s: a directory, not a ringfeed segment" % odd in p.stdout, p.stdout
        assert os.path.exists(seg)
    finally:
        shutil.rmtree(bindir, ignore_errors=True)
        os.rmdir(odd)
        os.unlink(seg)


@pytest.mark.parametrize("io, mode", [("pread", "files"), ("pread", "records"), ("uring", "files"), ("uring", "records")])
def test_a_file_replaced_by_a_fifo_stops_the_loader_naming_it_instead_of_a_hang(tmp_path, c_consumer, io, mode):
    # Opening a FIFO with no writer blocks until one comes. pread's opens and
    # record mode's refuse it at once; io_uring's whole-file reads open inside
    # the ring, where the open waits, and the loader finds the FIFO once no
    # read has completed for a second.
    record = mode == "records"
    for i in range(64):
        (tmp_path / ("f%02d" % i)).write_bytes(b"x" * (4000 if record else 1000))
    name = "e2e-fifo-%s" % uuid.uuid4().hex[:8]
    extra = ["--record-bytes", "100"] if record else []
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(tmp_path), "--name", name, "--batch-size", "4", "--world-size", "1",
         "--epochs", "100000", "--slots-per-rank", "1", "--no-shuffle", "--io", io] + extra,
        stderr=subprocess.PIPE, text=True,
    )
    consumer = None
    try:
        for line in loader.stderr:
            if line.startswith("ringfeed: serving"):
                break
        # Before the consumer comes, so the file's first open is of the FIFO
        # (record mode keeps a file open once read).
        (tmp_path / "f17").unlink()
        os.mkfifo(tmp_path / "f17")
        consumer = subprocess.Popen([c_consumer, name, "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, err = loader.communicate(timeout=30)
        assert loader.returncode == 1, err
        assert "%s: is now a FIFO, not the regular file the manifest listed" % (tmp_path / "f17") in err, err
    finally:
        kill_survivors([loader] + ([consumer] if consumer else []))


def _nofile(n):
    """A preexec_fn giving the child a descriptor limit (`ulimit -n n`)."""
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


def _serve_under_nofile(n, *args):
    """`ringfeed serve ARGS` under `ulimit -n n`, its stderr piped."""
    return subprocess.Popen([ringfeed_bin(), "serve", *args], stderr=subprocess.PIPE, text=True, preexec_fn=_nofile(n))


def test_record_mode_under_a_small_descriptor_limit_reads_without_keeping_files_open(tmp_path):
    for i in range(40):
        (tmp_path / ("f%02d" % i)).write_bytes(bytes([i]) * (50 * 4096))
    name = "e2e-fewfds-%s" % uuid.uuid4().hex[:8]
    loader = _serve_under_nofile(24, "--source", str(tmp_path), "--name", name, "--batch-size", "64", "--record-bytes", "4096",
                                 "--io", "uring", "--queue-depth", "1")
    try:
        import ringfeed

        with ringfeed.attach(name, 0, timeout=30) as feed:
            for batch in feed:
                with batch:
                    a = batch.array(np.uint8, (len(batch), 4096))
                    assert all((a[j] == batch.indices[j] // 50).all() for j in range(len(batch)))
                    del a  # the view holds the slot
        _, err = loader.communicate(timeout=30)
        assert loader.returncode == 0, err
    finally:
        kill_survivors([loader])


def test_pread_workers_under_a_small_descriptor_limit_wait_for_each_others_files_instead_of_failing(tmp_path):
    # 16 pread workers each hold a file open while they read it; with
    # `ulimit -n 10` the loader's own descriptors leave fewer than 16, so
    # their opens meet EMFILE. That stopped the run ("Too many open files")
    # though a descriptor would be free microseconds later.
    for i in range(600):
        (tmp_path / ("f%03d" % i)).write_bytes(bytes([i % 251]) * 4096)
    name = "e2e-fewfds-p-%s" % uuid.uuid4().hex[:8]
    loader = _serve_under_nofile(10, "--source", str(tmp_path), "--name", name, "--batch-size", "32", "--io", "pread",
                                 "--epochs", "20", "--manifest-cache", "off")
    try:
        import ringfeed

        seen = 0
        with ringfeed.attach(name, 0, timeout=30) as feed:
            for batch in feed:
                with batch:
                    a = batch.array(np.uint8, (len(batch), 4096))
                    assert all((a[j] == batch.indices[j] % 251).all() for j in range(len(batch)))
                    seen += len(batch)
                    del a  # the view holds the slot
        _, err = loader.communicate(timeout=30)
        assert loader.returncode == 0, err
        assert seen == 20 * 576
        if "no file descriptors left" in err:
            assert "ulimit -n 10" in err and err.count("no file descriptors left") == 1, err
    finally:
        kill_survivors([loader])


def test_io_uring_without_a_descriptor_free_says_to_raise_the_limit_not_that_it_is_blocked(tmp_path):
    (tmp_path / "f").write_bytes(b"x" * 4096)
    p = subprocess.run(
        [ringfeed_bin(), "serve", "--source", str(tmp_path), "--name", "e2e-nofd-" + uuid.uuid4().hex[:8], "--batch-size", "1",
         "--io", "uring", "--manifest-cache", "off"],
        stderr=subprocess.PIPE, text=True, timeout=60,
        preexec_fn=_nofile(7),
    )
    assert p.returncode == 1, p.stderr
    assert "raise `ulimit -n`" in p.stderr and "seccomp" not in p.stderr, p.stderr


def test_what_the_listing_leaves_out_is_said_once(tmp_path):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "x").write_bytes(b"1")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "y").write_bytes(b"2")
    os.symlink(tmp_path / "elsewhere", src / "train")
    os.mkfifo(src / "pipe")
    rc, err = serve_until_serving(["--source", str(src), "--name", "e2e-skip-" + uuid.uuid4().hex[:8], "--batch-size", "1",
                                   "--manifest-cache", "off"])
    assert "skipped 1 link(s) to a directory or other non-file, not followed (first: %s)" % (src / "train") in err, err
    assert "1 socket(s), FIFO(s) or device(s) (one: %s)" % (src / "pipe") in err, err
    assert err.count("skipped") == 1, err


def test_a_link_to_a_file_outside_the_source_is_not_served_unless_asked_for(tmp_path):
    # Issue 32: `ln -s /root-only-file SRC/leak.txt` put root-only bytes in
    # front of every trainer of a root loader.
    src = tmp_path / "src"
    src.mkdir()
    (src / "x").write_bytes(b"1")
    secret = tmp_path / "secret"
    secret.write_bytes(b"root only")
    os.chmod(secret, 0o600)
    os.symlink(secret, src / "leak.txt")
    time.sleep(2.1)  # older than the cache's racy window, so the listing is stored
    cache = tmp_path / "cache"
    said = "skipped 1 link(s) to files outside it (%s)" % (src / "leak.txt")
    for how in ("listed (cached in ", "from the cache "):
        rc, err = serve_until_serving(["--source", str(src), "--name", "e2e-out-" + uuid.uuid4().hex[:8], "--batch-size", "1",
                                       "--cache-dir", str(cache)])
        assert how in err and said in err and "--follow-links-outside" in err, err
        assert "manifest: 1 samples in 1 files" in err, err
    rc, err = serve_until_serving(["--source", str(src), "--name", "e2e-out-" + uuid.uuid4().hex[:8], "--batch-size", "1",
                                   "--cache-dir", str(cache), "--follow-links-outside"])
    assert "manifest: 2 samples in 2 files" in err and "outside it" not in err, err


def test_a_link_the_listing_did_not_follow_is_said_again_when_the_manifest_comes_from_the_cache(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "x").write_bytes(b"1")
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", src / "train")
    time.sleep(2.1)  # older than the cache's racy window, so the listing is stored
    said = "skipped 1 link(s) to a directory or other non-file, not followed (first: %s)" % (src / "train")
    for how in ("listed (cached in ", "from the cache "):
        rc, err = serve_until_serving(["--source", str(src), "--name", "e2e-skipc-" + uuid.uuid4().hex[:8], "--batch-size", "1"])
        assert how in err, err
        assert said in err and err.count("skipped") == 1, err
