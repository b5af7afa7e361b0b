"""One listing per job (issue 40, item 3): node 0 lists a remote prefix and publishes its
manifest beside the data (`PREFIX/.ringfeed/`); the job's other nodes read it in one GET.

Four loaders on this machine stand in for four nodes (`--nnodes 4 --node-rank K`, each with
its own cache directory, as separate machines would have), against the latency-only list
server (tests/servers/listserver.py, which counts its ListObjectsV2 requests and keeps PUT
objects as S3 does, `If-None-Match: *` included):

- the job's LIST requests are one listing's worth, not four; two nodes that start before
  node 0 wait for it, one that starts after it is done reads it; every sample is served
  exactly once across the four nodes, with the server's bytes;
- a published manifest changed after it was published (a flipped byte; a stale copy of an
  older listing put in its place) is refused by its SHA-256, and node 0 lists afresh;
- against s3s-fs (a real S3 server): the publish path with conditional put, a restarted
  node 0 that keeps its job's manifest, and a listing that leaves `.ringfeed/` out.
"""
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid
import zlib
from collections import Counter
from pathlib import Path

import pytest

from e2e_util import kill_survivors, python_consumer, ringfeed_bin
from remote_util import need_server

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "tests" / "servers" / "listserver.py"
sys.path.insert(0, str(ROOT / "tests" / "servers"))
import listserver  # noqa: E402  (its keys and bodies, to check the bytes served)

KEYS, NODES, BATCH = 20_000, 4, 50
RUN_TIMEOUT_S = 240


def start_listserver(keys, delay_ms=5):
    proc = subprocess.Popen([sys.executable, str(SERVER), "--keys", str(keys), "--shape", "seq",
                             "--delay-ms", str(delay_ms)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    match = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
    if not match:
        proc.kill()
        proc.wait()
        pytest.fail("listserver did not start: %r" % line)
    return proc, int(match.group(1))


def s3_env(port):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "GOOGLE_"))}
    env.update(AWS_ENDPOINT_URL="http://127.0.0.1:%d" % port, AWS_ALLOW_HTTP="true", AWS_ACCESS_KEY_ID="jobtest",
               AWS_SECRET_ACCESS_KEY="jobtestsecret", AWS_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true")
    return env


def stats(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/_stats" % port, timeout=10) as r:
        return json.loads(r.read())


def http(port, method, key, body=None):
    req = urllib.request.Request("http://127.0.0.1:%d/list/%s" % (port, key), data=body, method=method)
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read()


def ringfeed_keys(port):
    """The keys under data/.ringfeed/ the server holds."""
    url = "http://127.0.0.1:%d/list?list-type=2&prefix=data/.ringfeed/" % port
    with urllib.request.urlopen(url, timeout=10) as r:
        return re.findall(r"<Key>([^<]+)</Key>", r.read().decode())


class Node:
    """One `ringfeed serve` standing in for a machine, and its one trainer."""

    def __init__(self, tmp, port, rank, extra=(), job="jobA", source="s3://list/data/", wait="60s"):
        self.name = "jm-%d-%s" % (rank, uuid.uuid4().hex[:6])
        self.err_path = tmp / ("%s.err" % self.name)
        cmd = [ringfeed_bin(), "serve", "--source", source, "--name", self.name, "--batch-size", str(BATCH),
               "--world-size", str(NODES), "--nnodes", str(NODES), "--node-rank", str(rank), "--epochs", "1",
               "--seed", "5", "--cache", "off", "--cache-dir", str(tmp / ("cache-%s-%d" % (job, rank))),
               "--job-manifest-wait", wait] + (["--job-id", job] if job else []) + list(extra)
        self.env = s3_env(port)
        self.loader = subprocess.Popen(cmd, env=self.env, stderr=open(self.err_path, "w"), stdout=subprocess.DEVNULL)
        self.consumer = subprocess.Popen(python_consumer("hash_consumer.py", self.name, 0), env=self.env,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def log(self):
        return self.err_path.read_text()

    def wait_for(self, text, timeout=60):
        deadline = time.monotonic() + timeout
        while text not in self.log():
            assert self.loader.poll() is None or text in self.log(), "node exited without %r:\n%s" % (text, self.log())
            assert time.monotonic() < deadline, "no %r in time:\n%s" % (text, self.log())
            time.sleep(0.05)

    def finish(self):
        try:
            out, err = self.consumer.communicate(timeout=RUN_TIMEOUT_S)
            self.loader.wait(timeout=RUN_TIMEOUT_S)
        finally:
            kill_survivors([self.consumer, self.loader])
        assert self.consumer.returncode == 0, "trainer of %s failed: %s\nloader:\n%s" % (self.name, err, self.log())
        assert self.loader.returncode == 0, self.log()
        return [tuple(int(x) for x in line.split()) for line in out.splitlines()]


def one_listing(tmp, port, tag):
    """LIST requests of one node listing the prefix alone (published elsewhere: not beside the data)."""
    before = stats(port)["list_requests"]
    run = subprocess.run([ringfeed_bin(), "manifest", "build", "s3://list/data/", "--job-manifest",
                          str(tmp / ("ref-%s" % tag)), "--cache-dir", str(tmp / ("ref-cache-%s" % tag))],
                         env=s3_env(port), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert run.returncode == 0, run.stderr
    return stats(port)["list_requests"] - before


def check_exactly_once(rows, keys):
    counts = Counter(index for _, _, index, _, _ in rows)
    steps = KEYS // (NODES * BATCH)
    assert len(counts) == steps * NODES * BATCH and set(counts.values()) == {1}, "not every sample exactly once"
    for _, _, index, length, crc in rows:
        data = listserver.body(keys[index])
        assert (length, crc) == (len(data), zlib.crc32(data)), "sample %d has other bytes" % index


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The job of four nodes, run once; the tests below read what it left."""
    tmp = tmp_path_factory.mktemp("jobmanifest")
    proc, port = start_listserver(KEYS)
    try:
        singles = [one_listing(tmp, port, t) for t in ("a", "b")]
        before = stats(port)["list_requests"]
        early = [Node(tmp, port, 1), Node(tmp, port, 2)]
        time.sleep(1.0)
        node0 = Node(tmp, port, 0)
        node0.wait_for("published for the job's other nodes")
        late = Node(tmp, port, 3)
        nodes = [node0] + early + [late]
        rows = [row for n in nodes for row in n.finish()]
        job_lists = stats(port)["list_requests"] - before
        yield {"tmp": tmp, "port": port, "singles": singles, "job_lists": job_lists, "rows": rows, "nodes": nodes}
    finally:
        proc.kill()
        proc.wait()


def test_four_nodes_list_once_and_serve_every_sample_exactly_once(served):
    singles, job_lists = served["singles"], served["job_lists"]
    print("LIST requests: one node alone %s; the job of %d nodes %d" % (singles, NODES, job_lists))
    assert 0 < job_lists <= 1.5 * max(singles) and job_lists < 2 * min(singles), (singles, job_lists)
    node0, *others = served["nodes"]
    assert "published for the job's other nodes" in node0.log()
    for n in others:
        assert "read from node 0's, for job jobA" in n.log(), n.log()
    keys = [k for k in listserver.make_keys("seq", KEYS, 0)]
    check_exactly_once(served["rows"], keys)
    published = ringfeed_keys(served["port"])
    assert any(k.endswith(".rfm") for k in published) and any("-job-" in k for k in published), published


def restart(served, rank, job="jobA", extra=(), wait="60s"):
    """A node of the job started again: its loader's exit code and log."""
    n = Node(served["tmp"], served["port"], rank, job=job, extra=extra, wait=wait)
    try:
        n.loader.wait(timeout=RUN_TIMEOUT_S)
        n.consumer.wait(timeout=RUN_TIMEOUT_S)
    finally:
        kill_survivors([n.consumer, n.loader])
    return n.loader.returncode, n.log()


def blob_key(port):
    blobs = [k for k in ringfeed_keys(port) if k.endswith(".rfm")]
    assert len(blobs) == 1, blobs
    return blobs[0]


def test_a_published_manifest_changed_after_publishing_is_refused_by_its_hash(served, tmp_path):
    port = served["port"]
    key = blob_key(port)
    good = http(port, "GET", key)
    # A flipped byte.
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x01
    http(port, "PUT", key, bytes(bad))
    try:
        code, log = restart(served, 1)
        assert code != 0 and "is refused" in log and "SHA-256" in log and "tampered, or a stale copy" in log, log
        # A stale copy: an older listing of the prefix (fewer keys), valid in every other way.
        old_proc, old_port = start_listserver(KEYS - 200)
        try:
            subprocess.run([ringfeed_bin(), "manifest", "build", "s3://list/data/", "--cache-dir", str(tmp_path / "c")],
                           env=s3_env(old_port), check=True, capture_output=True, timeout=RUN_TIMEOUT_S)
            stale = http(old_port, "GET", blob_key(old_port))
        finally:
            old_proc.kill()
            old_proc.wait()
        assert stale != good
        http(port, "PUT", key, stale)
        code, log = restart(served, 2)
        assert code != 0 and "is refused" in log and "SHA-256" in log, log
        # Node 0 of a new job finds the latest head naming the refused manifest: it lists
        # afresh and publishes again, and serves.
        before = stats(port)["list_requests"]
        n = Node(served["tmp"], port, 0, job="jobB")
        n.wait_for("published for the job's other nodes")
        assert "is refused" in n.log() and "making the manifest of s3://list/data/ again" in n.log(), n.log()
        assert stats(port)["list_requests"] > before
        readers = [Node(served["tmp"], port, r, job="jobB") for r in (1, 2, 3)]
        rows = [row for node in [n] + readers for row in node.finish()]
        check_exactly_once(rows, listserver.make_keys("seq", KEYS, 0))
    finally:
        http(port, "PUT", key, good)


def test_a_node_waiting_in_vain_for_a_place_given_fails_naming_node_0(served, tmp_path):
    start = time.monotonic()
    code, log = restart(served, 1, job="nobody-publishes", extra=["--job-manifest", str(tmp_path / "place")], wait="2s")
    assert code != 0 and "node 0 did not publish" in log and "--job-manifest-wait" in log, log
    assert time.monotonic() - start < 60


# ---------------------------------------------------------------- s3s-fs


def test_the_publish_path_against_a_real_s3_server(tmp_path):
    need_server("s3")
    import seed  # tests/servers/seed.py

    bucket = "rf-jm-%d-%s" % (os.getpid(), os.urandom(3).hex())
    data = tmp_path / "data"
    for i in range(40):
        (data / ("d%d" % (i % 3))).mkdir(parents=True, exist_ok=True)
        (data / ("d%d" % (i % 3)) / ("f%02d.bin" % i)).write_bytes(os.urandom(100 + i))
    seed.seed_s3(bucket, data, "train/")
    s3 = seed.s3_client()
    source = "s3://%s/train/" % bucket

    def node(rank, job, extra=()):
        name = "jms3-%d-%s" % (rank, uuid.uuid4().hex[:6])
        cmd = [ringfeed_bin(), "serve", "--source", source, "--name", name, "--batch-size", "4", "--world-size", "2",
               "--nnodes", "2", "--node-rank", str(rank), "--epochs", "1", "--cache", "off",
               "--cache-dir", str(tmp_path / ("cache-%s-%d" % (job, rank))), "--job-id", job] + list(extra)
        loader = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        consumer = subprocess.Popen(python_consumer("hash_consumer.py", name, 0), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        try:
            out, err = consumer.communicate(timeout=RUN_TIMEOUT_S)
            log = loader.communicate(timeout=RUN_TIMEOUT_S)[1]
        finally:
            kill_survivors([consumer, loader])
        assert loader.returncode == 0 and consumer.returncode == 0, log + err
        return log, [line.split()[2] for line in out.splitlines()]

    def published():
        listed = s3.list_objects_v2(Bucket=bucket, Prefix="train/.ringfeed/").get("Contents", [])
        return sorted(o["Key"] for o in listed)

    log0, served0 = node(0, "s3job")
    assert "published for the job's other nodes" in log0, log0
    keys = published()
    assert any(k.endswith(".rfm") for k in keys) and any("-job-" in k for k in keys), keys
    log1, served1 = node(1, "s3job")
    assert "read from node 0's, for job s3job" in log1, log1
    assert sorted(served0 + served1, key=int) == [str(i) for i in range(40)]
    # Node 0 restarted within its job keeps the job's manifest (its head was written create-only).
    log0b, _ = node(0, "s3job")
    assert "node 0 restarted" in log0b, log0b
    # A new job whose node 0 lists afresh with .ringfeed/ beside the data publishes the same
    # manifest: the published objects are not samples.
    blobs = [k for k in keys if k.endswith(".rfm")]
    log0c, served0c = node(0, "s3job2", ["--manifest-cache", "refresh"])
    assert "published for the job's other nodes" in log0c and blobs[0].rsplit("/", 1)[1] in log0c, log0c
    assert [k for k in published() if k.endswith(".rfm")] == blobs
    assert "40 samples" in log0c, log0c
