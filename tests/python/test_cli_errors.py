"""Mistakes on the command line end at once, before a ring is made, with a
message that names the flag or variable and how to fix it: no hang, no
panic, no segment left behind."""

import os
import subprocess
import uuid

import pytest

from e2e_util import ringfeed_bin, serve_until_serving


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("small")
    for i in range(40):
        (root / ("f%02d" % i)).write_bytes(bytes([i]) * 1000)
    return root


def run(args, env=None, timeout=20):
    p = subprocess.run([ringfeed_bin()] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                       env=dict(os.environ, **(env or {})))
    return p.returncode, p.stdout.decode(), p.stderr.decode()


CASES = [
    # (extra serve flags, environment, words the message must hold)
    (["--epochs", str(2**64 - 1)], {}, ["epochs", "lower --epochs"]),
    (["--epochs", "0"], {}, ["--epochs 0"]),
    (["--epochs", "1", "--resume", "1:0"], {}, ["nothing to serve", "the run is complete", "raise --epochs and keep this --resume"]),
    # 40 samples, B=4, W=1: 38 consumed leaves 2, fewer than a step of 4.
    (["--epochs", "2", "--resume", "1:38"], {}, ["nothing to serve", "the 2 samples left of that epoch", "fewer than one step", "= 4)", "the run is complete", "raise --epochs and keep this --resume"]),
    (["--slots-per-rank", "0"], {}, ["--slots-per-rank 0"]),
    (["--slot-bytes", "0"], {}, ["--slot-bytes 0"]),
    (["--queue-depth", "0"], {}, ["--queue-depth 0"]),
    (["--slot-bytes", "100"], {}, ["f00", "1000 bytes", "--slot-bytes 100", "4000"]),
    # Every sample fits, but not 4 of the largest together: refused at the
    # start, not at the first batch that draws them.
    (["--slot-bytes", "3999"], {}, ["--slot-bytes 3999", "4 largest samples together (4000 bytes)", "raise --slot-bytes to 4000"]),
    ([], {"LOCAL_WORLD_SIZE": "0", "WORLD_SIZE": "2"}, ["LOCAL_WORLD_SIZE=0", "--world-size"]),
    ([], {"LOCAL_WORLD_SIZE": "-1"}, ["LOCAL_WORLD_SIZE=\"-1\"", "--world-size"]),
    (["--shuffle-window", "3"], {}, ["--shuffle-window 3", "shape only the block order", "add --shuffle block"]),
    (["--no-shuffle", "--shuffle", "block"], {}, ["--no-shuffle and --shuffle block contradict"]),
    (["--shuffle", "block", "--shuffle-block", "0"], {}, ["--shuffle-block 0 is outside 1..=16777216"]),
]

# clap's own errors (exit 2): the value reaches our parser even when it starts with '-'.
CLAP_CASES = [
    (["--resume", "-1:0"], ['epoch "-1" is not a whole number']),
    (["--resume", "0:-4"], ['samples "-4" is not a whole number']),
    (["--resume", "99999999999999999999:0"], ["is not a whole number from 0 to"]),
]


@pytest.mark.parametrize("flags,words", CLAP_CASES, ids=[" ".join(c[0]) for c in CLAP_CASES])
def test_serve_refuses_a_bad_resume_state_naming_the_part(small_dataset, flags, words):
    rc, _, err = run(["serve", "--source", str(small_dataset), "--name", "clierr-x", "--batch-size", "4"] + flags)
    assert rc == 2, err
    for w in words:
        assert w in err, (w, err)


@pytest.mark.parametrize("flags,env,words", CASES, ids=[" ".join(c[0]) or str(c[1]) for c in CASES])
def test_serve_refuses_a_bad_flag_at_once_naming_it(small_dataset, flags, env, words):
    name = "clierr-%s" % uuid.uuid4().hex[:8]
    rc, _, err = run(["serve", "--source", str(small_dataset), "--name", name, "--batch-size", "4"] + flags, env=env)
    assert rc == 1, err
    assert "panicked" not in err, err
    for w in words:
        assert w in err, (w, err)
    assert not os.path.exists("/dev/shm/ringfeed-" + name)


def test_a_second_serve_of_a_running_name_is_refused_before_listing(small_dataset):
    import time

    name = "clierr-%s" % uuid.uuid4().hex[:8]
    first = subprocess.Popen([ringfeed_bin(), "serve", "--source", str(small_dataset), "--name", name, "--batch-size", "4",
                              "--epochs", "1000"], stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 20
        while not os.path.exists("/dev/shm/ringfeed-" + name) and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        rc, _, err = run(["serve", "--source", str(small_dataset), "--name", name, "--batch-size", "4"])
        assert rc == 1 and "already running (pid %d)" % first.pid in err and "another --name" in err, err
        assert "manifest" not in err, err  # refused before listing the dataset
        assert first.poll() is None  # the first one runs on, its segment untouched
        assert os.path.exists("/dev/shm/ringfeed-" + name)
    finally:
        first.kill()
        first.wait()
        subprocess.run([ringfeed_bin(), "gc"], stdout=subprocess.DEVNULL)


def test_demo_refuses_a_bad_sample_size_before_writing_anything():
    rc, out, err = run(["demo", "--max-sample-bytes", "0"])
    assert rc == 1 and "--max-sample-bytes 0" in err and "panicked" not in err, err
    assert "wrote" not in out


@pytest.mark.parametrize("interval", ["inf", "0", "-1", "nan"])
def test_stat_refuses_an_interval_out_of_range(interval):
    rc, _, err = run(["stat", "--interval=" + interval, "nobody"])
    assert rc == 1 and "--interval" in err and "panicked" not in err, err


def test_stat_of_a_name_nobody_serves_says_so():
    name = "clierr-%s" % uuid.uuid4().hex[:8]
    rc, _, err = run(["stat", "--once", name])
    assert rc == 1 and "no loader named" in err and "is running here" in err, err


def test_gc_into_a_closed_pipe_ends_quietly():
    p = subprocess.run("%s gc | head -c 0" % ringfeed_bin(), shell=True, stderr=subprocess.PIPE, timeout=20,
                       executable="/bin/bash")
    assert "panicked" not in p.stderr.decode() and "Broken pipe" not in p.stderr.decode(), p.stderr.decode()


def test_a_log_filter_that_would_silence_ringfeed_is_named():
    # "bogus" parses as a filter (a module named bogus) and turns ringfeed's own log off.
    rc, _, err = run(["stat", "nobody", "--once"], env={"RINGFEED_LOG": "bogus"})
    assert 'RINGFEED_LOG="bogus"' in err and "leaves ringfeed's own log silent" in err and "try debug" in err, err
    rc, _, err = run(["stat", "nobody", "--once"], env={"RINGFEED_LOG": "debug "})
    assert "leaves ringfeed's own log silent" in err and "spaces around a word" in err, err
    rc, _, err = run(["stat", "nobody", "--once"], env={"RINGFEED_LOG": "ringfeed=debug"})
    assert "RINGFEED_LOG" not in err, err


@pytest.mark.parametrize("flags,env,words", [
    (["--batch-size", "0"], {}, ["batch size is 0", "--batch-size"]),
    (["--batch-size", str(2**20 + 1)], {}, ["above the limit", "--batch-size"]),
    (["--batch-size", "4", "--world-size", "129"], {}, ["world size 129", "at most 128 ranks", "--nnodes and --node-rank"]),
    (["--batch-size", "4", "--world-size", "512", "--nnodes", "2"], {}, ["256 ranks per machine", "128"]),
    (["--batch-size", "4", "--world-size", "4", "--nnodes", "2", "--node-rank", "2"], {}, ["--node-rank 2", "--nnodes 2", "0 to 1"]),
    (["--batch-size", "4", "--world-size", "5", "--nnodes", "2"], {}, ["world size 5", "--nnodes 2", "--nproc-per-node"]),
    (["--batch-size", "4", "--nnodes", "2"], {}, ["--nnodes 2", "pass --world-size"]),
    (["--batch-size", "4", "--nnodes", "0"], {}, ["--nnodes 0"]),
    (["--batch-size", "4", "--slots-per-rank", "1025"], {}, ["--slots-per-rank 1025", "at most 1024"]),
    (["--batch-size", "4", "--slot-bytes", str(2**36 + 1)], {}, ["--slot-bytes %d" % (2**36 + 1), "64.0 GiB"]),
    (["--batch-size", "4"], {"LOCAL_WORLD_SIZE": "200"}, ["world size 200"]),
])
def test_batch_and_world_size_are_checked_before_the_source_is_listed(flags, env, words):
    # The source does not exist: an error about it would mean it was looked at first.
    rc, _, err = run(["serve", "--source", "/nonexistent-ringfeed-source", "--name", "x"] + flags, env)
    assert rc != 0
    assert "nonexistent" not in err, err
    for w in words:
        assert w in err, err


def test_a_ring_too_large_for_its_flags_or_data_names_what_to_lower(tmp_path):
    """The ring's limits, reached by the flags together or by the data (the
    B largest samples of sparse 40 GB files), name the flag to change."""
    big = tmp_path / "big"
    big.mkdir()
    for n in "ab":
        with open(big / n, "wb") as f:
            f.truncate(40 << 30)
    huge = tmp_path / "huge"
    huge.mkdir()
    with open(huge / "one", "wb") as f:
        f.truncate(70 << 30)
    many = tmp_path / "many"
    many.mkdir()
    for i in range(130):
        (many / ("f%03d" % i)).write_bytes(b"x")
    sized = tmp_path / "sized"
    sized.mkdir()
    for i in range(129):
        (sized / ("f%03d" % i)).write_bytes(b"x")
    with open(sized / "z-sparse", "wb") as f:
        f.truncate(60 << 30)
    cases = [
        (["--source", str(big), "--batch-size", "2"], ["2 largest samples together, 80.0 GiB", "lower --batch-size"], []),
        (["--source", str(huge), "--batch-size", "1"], ["a sample of 70.0 GiB", "split such files", "--record-bytes"], []),
        (["--source", str(many), "--batch-size", "1", "--world-size", "128", "--slots-per-rank", "1024", "--slot-bytes", str(60 << 30)],
         ["128 rank(s) x 1024 slots of 60.0 GiB", "16.0 TiB", "lower --slots-per-rank, --batch-size or --slot-bytes"], []),
        # Slots sized from the data: --slot-bytes cannot make them smaller, so it is not offered.
        (["--source", str(sized), "--batch-size", "1", "--world-size", "128", "--slots-per-rank", "1024"],
         ["128 rank(s) x 1024 slots of 60.0 GiB", "lower --slots-per-rank or --batch-size"], ["--slot-bytes"]),
    ]
    for flags, words, absent in cases:
        name = "clierr-%s" % uuid.uuid4().hex[:8]
        rc, _, err = run(["serve", "--name", name, "--manifest-cache", "off"] + flags)
        assert rc == 1, err
        for w in words:
            assert w in err, (w, err)
        for w in absent:
            assert w not in err, (w, err)
        assert not os.path.exists("/dev/shm/ringfeed-" + name)


def test_serve_warns_when_its_environment_shows_a_job_on_several_machines():
    # torchrun's variables of a 2-machine job, and no --nnodes: each
    # machine's loader would serve the same samples. The source does not
    # exist, so serve then stops; the warning came first.
    rc, _, err = run(["serve", "--source", "/nonexistent-ringfeed-source", "--name", "x", "--batch-size", "4"],
                     {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"})
    assert rc != 0
    assert "describe a job on 2 machines" in err and "--world-size 16 --nnodes 2 --node-rank N" in err, err
    rc, _, err = run(["serve", "--source", "/nonexistent-ringfeed-source", "--name", "x", "--batch-size", "4",
                      "--nnodes", "2", "--node-rank", "1"], {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"})
    assert "describe a job" not in err, err


@pytest.mark.parametrize("flags, words", [
    # 40 samples: a step of 3 leaves sample 39 out of every epoch, one of 6 leaves 36 to 39.
    (["--batch-size", "3", "--no-shuffle"], ["drops the same last 1 of the 40 samples (sample 39, from ", "f39 on)", "step divide 40"]),
    (["--batch-size", "3", "--world-size", "2", "--no-shuffle"], ["last 4 of the 40 samples (samples 36 to 39, from ", "f36 on)", "= 6 samples"]),
    (["--batch-size", "3", "--no-shuffle", "--record-bytes", "500"], ["last 2 of the 80 samples (samples 78 to 79, from record 78 on, byte 0 of ", "f39)"]),
    # A shuffle drops other samples every epoch; a step that divides the dataset drops none.
    (["--batch-size", "3"], None),
    (["--batch-size", "4", "--no-shuffle"], None),
    # A run that is only the rest of a resumed epoch drops that epoch's own tail, said nowhere else.
    (["--batch-size", "3", "--no-shuffle", "--resume", "0:3", "--epochs", "1"], None),
])
def test_a_tail_that_no_epoch_serves_is_warned_about(small_dataset, flags, words):
    name = "clierr-%s" % uuid.uuid4().hex[:8]
    rc, err = serve_until_serving(["--source", str(small_dataset), "--name", name, "--manifest-cache", "off"] + flags)
    assert rc == 130, err
    if words is None:
        assert "never served" not in err, err
    else:
        for w in words:
            assert w in err, (w, err)
        assert "never served" in err


@pytest.mark.parametrize("kind", ["fifo", "junk", "directory"])
def test_an_object_ringfeed_did_not_make_under_a_ring_name_is_named_and_left_alone(small_dataset, kind):
    """stat, serve, gc and attach on /dev/shm/ringfeed-NAME when NAME is a
    FIFO, a directory or a file of other bytes: each says what it is at once
    (stat used to wait forever on a FIFO; serve and gc removed the file as a
    dead loader's), and nothing removes it."""
    import ringfeed

    name = "clierr-%s-%s" % (kind, uuid.uuid4().hex[:8])
    path = "/dev/shm/ringfeed-" + name
    if kind == "fifo":
        os.mkfifo(path)
        what = "it is a FIFO"
    elif kind == "directory":
        os.mkdir(path)
        what = "it is a directory"
    else:
        with open(path, "wb") as f:
            f.write(b"not a ring" * 1000)
        what = "ringfeed did not write"
    try:
        rc, _, err = run(["stat", name, "--once"], timeout=10)
        assert rc == 1 and what in err, err
        rc, _, err = run(["serve", "--source", str(small_dataset), "--name", name, "--batch-size", "2"], timeout=10)
        assert rc == 1 and "not a ringfeed segment: ringfeed leaves it alone" in err, err
        rc, out, err = run(["gc"], timeout=10)
        assert rc == 0 and "skipped %s" % path in out, out + err
        with pytest.raises(ringfeed.CorruptSegmentError) as e:
            ringfeed.attach(name, rank=0, timeout=10)
        assert path in str(e.value), str(e.value)
        assert os.path.lexists(path)
    finally:
        if os.path.isdir(path):
            os.rmdir(path)
        elif os.path.lexists(path):
            os.unlink(path)
