"""Remote sources end to end (issue 21, acceptance 2 and 3), against the real
servers tests/servers/up.sh starts: s3:// (s3s-fs, which checks SigV4),
az:// (Azurite), gs:// (fake-gcs-server), http:// (nginx, WebDAV depth 1;
rclone, depth infinity).

Each store gets the same tree (nested directories, awkward names, empty
files, one object read in ranged parts, a directory marker, decoy keys
beside the prefix); `ringfeed serve --source URL` is read by one Python rank
and one C rank, and must give every sample exactly once per epoch with its
file's bytes, in the same batches as `ringfeed serve --source LOCAL_DIR` with
the same seed. Then faults through tests/faultproxy, and the clear errors.

Skipped only where a server's variable is absent and CI is unset (see
remote_util.SERVER_ENV); under CI a missing server fails.
"""

import os
import re
import subprocess
import time
import urllib.parse
import uuid

import pytest

import ringfeed
from e2e_util import compile_c, crc32, kill_survivors, ringfeed_bin, wait_all
from remote_util import (
    PREFIX, FaultProxy, check_run, free_port, make_record_tree, make_tree, need_server, s3_bucket_and_prefix,
    sample_hashes, scrape, seed, seed_store, serve_cmd, serve_two_ranks,
)

FILES = 320  # 20 steps of 2 ranks x 8: every sample is served in every epoch
RECORD_FILES, RECORD_BYTES = 48, 512  # 144 records: 9 steps of 2 x 8
# Slots stay small: one sample is over 8 MiB, and CI's /dev/shm may be 64 MiB.
SLOTS = ["--slots-per-rank", "2"]


_compiled = {}


def server(name):
    """Names the server a test needs, for the c_consumer fixture."""
    def mark(test):
        test.server = name
        return test
    return mark


def compiled_c_consumer(tmp_path_factory):
    """tests/c/dump_hashes.c, compiled once for the module."""
    if "bin" not in _compiled:
        _compiled["bin"] = compile_c("dump_hashes.c", tmp_path_factory.mktemp("cbin"))
    return _compiled["bin"]


@pytest.fixture
def c_consumer(request, tmp_path_factory):
    """The C trainer, once the test's server is known to be up: a test is
    skipped for a missing server before anything is built or run."""
    need_server(getattr(request.function, "server", None) or request.node.callspec.params["scheme"])
    return compiled_c_consumer(tmp_path_factory)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """(root, hashes by manifest index, the local run of root)."""
    root = make_tree(tmp_path_factory.mktemp("tree"), FILES)
    local = serve_two_ranks(root, compiled_c_consumer(tmp_path_factory), extra=SLOTS, label="local")
    hashes = sample_hashes(root)
    check_run(local, hashes, local, what="the local run")
    return root, hashes, local


@pytest.mark.parametrize("scheme", ["s3", "azurite", "gcs", "nginx", "rclone"])
def test_a_remote_tree_serves_the_same_batches_and_bytes_as_the_local_directory(request, c_consumer, scheme):
    root, hashes, local = request.getfixturevalue("tree")  # after c_consumer: not built for a skipped test
    source = seed_store(scheme, root, "same")
    run = serve_two_ranks(source, c_consumer, extra=SLOTS, label=scheme)
    check_run(run, hashes, local, what=source)


@server("s3")
def test_record_bytes_over_s3_serves_each_record_as_the_local_run_does(tmp_path, c_consumer):
    need_server("s3")
    root = make_record_tree(tmp_path / "records", RECORD_FILES, RECORD_BYTES)
    hashes = sample_hashes(root, RECORD_BYTES)
    assert len(hashes) == 144
    extra = ["--record-bytes", str(RECORD_BYTES)]
    local = serve_two_ranks(root, c_consumer, extra=extra, label="rec-local")
    check_run(local, hashes, local, what="the local record run")
    source = seed_store("s3", root, "rec")
    check_run(serve_two_ranks(source, c_consumer, extra=extra, label="rec-s3"), hashes, local, what=source)


# ---------------------------------------------------------------- faults


FAULT_FILES, FAULT_BATCH = 1200, 16  # 1200 GETs: a reset (1%) all but certain
FAULT_FLAGS = ["--error-503", "0.05", "--reset", "0.01", "--stall", "0.005", "--stall-ms", "10000",
               "--methods", "GET", "--seed", "21"]
METRICS_LINE = re.compile(r"metrics at (http://\S+/metrics)")
# The loader's retry counter on /metrics, by cause label: throttled,
# server_error, connect, stall, body_interrupted, timeout, other (docs/metrics.md).
RETRIES_METRIC = "ringfeed_remote_retries_total"


def read_one_rank(source, name, log, extra=(), before_last_release=None):
    """Serves `source` to one in-process Python rank; returns [(epoch, step,
    indices, [(len, crc32)])] and the loader's exit code. Calls
    `before_last_release()` while the last batch is still held (every GET of
    the run has completed, and the loader is still up)."""
    total = FAULT_FILES // FAULT_BATCH
    loader = subprocess.Popen(serve_cmd(source, name, FAULT_BATCH, 1, 1, 3, ["--slots-per-rank", "16"] + list(extra)),
                              stderr=log, env=dict(os.environ, RINGFEED_LOG="info"))
    got = []
    try:
        with ringfeed.attach(name, 0, timeout=60) as feed:
            for batch in feed:
                samples = []
                for i in range(len(batch)):
                    view = batch.sample(i)
                    samples.append((len(view), crc32(view)))
                    view.release()
                got.append((batch.epoch, batch.step, batch.indices.tolist(), samples))
                if len(got) == total and before_last_release is not None:
                    before_last_release()
                batch.release()
        loader.wait(timeout=60)
    finally:
        kill_survivors([loader])
    return got, loader.returncode


@server("nginx")
def test_through_503s_resets_and_stalls_the_run_is_byte_identical_and_the_retries_are_counted(tmp_path):
    need_server("nginx")
    root = tmp_path / "faulty"
    for i in range(FAULT_FILES):
        path = root / ("s%d" % (i % 10)) / ("%04d.bin" % i)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(2000 + (i * 37) % 6000))  # never empty: every GET carries a body to cut
    hashes = sample_hashes(root)
    with open(tmp_path / "local.log", "w+b") as log:
        clean, rc = read_one_rank(root, "fault-local-" + uuid.uuid4().hex[:8], log)
        assert rc == 0, (tmp_path / "local.log").read_text()
    clean_url = seed_store("nginx", root, "fault")
    upstream = urllib.parse.urlparse(clean_url).netloc
    proxy = FaultProxy(upstream, FAULT_FLAGS, tmp_path)
    parsed = urllib.parse.urlparse(clean_url)
    source = "http://127.0.0.1:%d%s" % (proxy.port, parsed.path)
    seen = {}
    log_path = tmp_path / "fault.log"

    def at_the_end():
        text = log_path.read_text()
        url = METRICS_LINE.search(text)
        assert url, "no metrics address in the loader's log:\n" + text
        seen["metrics"] = scrape(url.group(1))
        seen["proxy"] = proxy.counters()

    started = time.monotonic()
    try:
        with open(log_path, "w+b") as log:
            faulty, rc = read_one_rank(source, "fault-" + uuid.uuid4().hex[:8], log, ["--metrics", "127.0.0.1:0"], at_the_end)
    finally:
        summary = proxy.stop()
    took_s = time.monotonic() - started
    text = log_path.read_text()
    assert rc == 0, text + "\nfaultproxy: " + summary
    # Byte-identical to the clean run: the same batches, every sample its file's bytes.
    assert faulty == clean, "the run through faults differs from the clean run; faultproxy: " + summary
    assert all(s == hashes[i] for _, _, indices, samples in faulty for i, s in zip(indices, samples))
    assert len(faulty) == FAULT_FILES // FAULT_BATCH
    counters = seen["proxy"]
    assert counters["injected_503"] > 0 and counters["resets"] > 0, counters
    # Every injected fault hit a GET of the loader, and each must have been
    # retried: a 503 as throttling, a stall once the stall detector (shorter
    # than the proxy's 10 s) gave up on it. A hedged GET (asked again while
    # the first was slow) is the exception: a fault on a hedge is not
    # retried (the GET it hedged goes on), and a stall a hedge answered
    # first is cancelled, not retried; so each hedge may account for one.
    retries = {labels: v for (name, labels), v in seen["metrics"].items() if name == RETRIES_METRIC}
    assert retries, "no %s on /metrics: %s" % (RETRIES_METRIC, sorted({n for n, _ in seen["metrics"]}))
    hedges = seen["metrics"].get(("ringfeed_remote_hedges_total", ""), 0)
    assert retries.get('cause="throttled"', 0) + hedges >= counters["injected_503"], (retries, hedges, counters)
    assert retries.get('cause="stall"', 0) + hedges >= counters["stalls"], (retries, hedges, counters)
    assert sum(retries.values()) + hedges >= counters["injected_503"] + counters["resets"] + counters["stalls"], (
        retries, hedges, counters)
    # The loader's last words say so too.
    assert re.search(r"remote: .*retries: .*throttled \d+", text), text
    print("faults: %s; retries %s; %.1f s" % (summary.strip(), retries, took_s))


# ---------------------------------------------------------------- clear errors


def small_s3_source(tmp_path, tag):
    root = tmp_path / "small"
    root.mkdir()
    for i in range(64):
        (root / ("f%02d" % i)).write_bytes(bytes([i]) * 1000)
    return seed_store("s3", root, tag)


def c_attach(c_consumer, name):
    proc = subprocess.run([c_consumer, name, "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)
    return proc.returncode, proc.stderr.decode()


def error_line(log):
    """The loader's one `ringfeed: error:` line: what it says, not its log
    lines (object_store's retry notes name causes the error itself must)."""
    lines = [line for line in log.splitlines() if line.startswith("ringfeed: error:")]
    assert len(lines) == 1, "expected one `ringfeed: error:` line in the loader's stderr:\n" + log
    return lines[0]


def fails_before_serving(source, env, c_consumer, timeout_s=180):
    """Runs a loader expected to fail at listing; returns (its error line,
    what a Python trainer's attach raised, the C trainer's stderr)."""
    name = "rerr-" + uuid.uuid4().hex[:8]
    p = subprocess.run(serve_cmd(source, name, 2, 1, 1, 0), stderr=subprocess.PIPE, env=env, timeout=timeout_s)
    text = error_line(p.stderr.decode())
    assert p.returncode != 0, text
    with pytest.raises(ringfeed.LoaderGoneError) as e:
        ringfeed.attach(name, 0, timeout=30)
    rc, c_err = c_attach(c_consumer, name)
    assert rc != 0
    return text, str(e.value), c_err


@server("s3")
def test_a_key_deleted_mid_run_stops_the_run_naming_the_key_and_both_trainers_hear_it(tmp_path, c_consumer):
    source = small_s3_source(tmp_path, "del")
    bucket, prefix = s3_bucket_and_prefix(source)
    name = "rerr-del-" + uuid.uuid4().hex[:8]
    with open(tmp_path / "loader.log", "w+b") as log:
        loader = subprocess.Popen(serve_cmd(source, name, 2, 2, 100000, 0, ["--slots-per-rank", "1", "--no-shuffle"]), stderr=log)
        c_rank = subprocess.Popen([c_consumer, name, "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            with ringfeed.attach(name, 0, timeout=60) as feed:
                feed.next(timeout=60).release()
                seed.s3_client().delete_object(Bucket=bucket, Key=prefix + "f17")
                with pytest.raises(ringfeed.AbortedError) as e:
                    while True:
                        feed.next(timeout=60).release()
            (rc, _, c_err), = wait_all([c_rank], 30)
            loader.wait(timeout=30)
        finally:
            kill_survivors([loader, c_rank])
    text = (tmp_path / "loader.log").read_text()
    assert loader.returncode != 0, text
    text = error_line(text)
    for who, said in (("the loader", text), ("the Python trainer", str(e.value)), ("the C trainer", c_err.decode())):
        assert "f17" in said and "404" in said, "%s did not name the deleted key f17 and HTTP 404: %s" % (who, said)
    assert rc != 0


@server("s3")
def test_a_wrong_secret_is_a_403_naming_aws_secret_access_key(tmp_path, c_consumer):
    source = small_s3_source(tmp_path, "secret")
    env = dict(os.environ, AWS_SECRET_ACCESS_KEY="not-the-secret-0123456789")
    text, py_err, c_err = fails_before_serving(source, env, c_consumer)
    for who, said in (("the loader", text), ("the Python trainer", py_err), ("the C trainer", c_err)):
        assert "403" in said and "AWS_SECRET_ACCESS_KEY" in said, "%s: %s" % (who, said)


@server("s3")
def test_a_missing_bucket_is_named_with_the_fix(c_consumer):
    need_server("s3")
    bucket = "rf-nosuch-" + uuid.uuid4().hex[:8]
    text, py_err, c_err = fails_before_serving("s3://%s/%s" % (bucket, PREFIX), dict(os.environ), c_consumer)
    for who, said in (("the loader", text), ("the Python trainer", py_err), ("the C trainer", c_err)):
        assert bucket in said and "bucket" in said.replace(bucket, "") and "404" in said, "%s: %s" % (who, said)


@server("s3")
def test_an_unreachable_endpoint_is_named(c_consumer):
    need_server("s3")
    endpoint = "http://127.0.0.1:%d" % free_port()
    env = dict(os.environ, AWS_ENDPOINT_URL=endpoint)
    started = time.monotonic()
    text, py_err, c_err = fails_before_serving("s3://rf-unreachable/%s" % PREFIX, env, c_consumer)
    for who, said in (("the loader", text), ("the Python trainer", py_err), ("the C trainer", c_err)):
        assert endpoint.split("//")[1] in said and re.search("refused|connect", said, re.I), "%s: %s" % (who, said)
    print("unreachable endpoint reported after %.1f s" % (time.monotonic() - started))
