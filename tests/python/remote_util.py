"""Helpers of the remote-source end-to-end tests (test_remote_e2e.py): which
test server is up, a tree with awkward names, seeding it into each store, and
a `ringfeed serve` run read by one Python rank and one C rank.

The servers are the ones tests/servers/up.sh starts (tests/run.sh sources it);
each is known by the variable it exports:

    s3       RINGFEED_TEST_S3_ENDPOINT     (with AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...)
    azurite  RINGFEED_TEST_AZURE_ENDPOINT  (with AZURE_STORAGE_ACCOUNT_NAME/KEY, ...)
    gcs      RINGFEED_TEST_GCS_ENDPOINT    (with GOOGLE_SERVICE_ACCOUNT)
    nginx    RINGFEED_TEST_NGINX_URL, RINGFEED_TEST_NGINX_ROOT
    rclone   RINGFEED_TEST_RCLONE_URL

A test whose server's variable is absent is skipped, unless CI is set (as CI
services and tests/run.sh under them set it): there a missing server fails.
"""

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest

from e2e_util import ROOT, crc32, kill_survivors, python_consumer, ringfeed_bin

sys.path.insert(0, str(ROOT / "tests" / "servers"))
import seed  # noqa: E402  (tests/servers/seed.py)

SERVER_ENV = {
    "s3": "RINGFEED_TEST_S3_ENDPOINT",
    "azurite": "RINGFEED_TEST_AZURE_ENDPOINT",
    "gcs": "RINGFEED_TEST_GCS_ENDPOINT",
    "nginx": "RINGFEED_TEST_NGINX_URL",
    "rclone": "RINGFEED_TEST_RCLONE_URL",
}
# The prefix the trees are uploaded under, and keys beside it that share its
# first letters but are not under it: a listing must leave them out.
PREFIX = "train/"
DECOYS = {"train-decoy.bin": b"not under train/", "trainx/decoy.bin": b"not under train/ either"}
PROXY_START_TIMEOUT_S = 20
RUN_TIMEOUT_S = 180


def in_ci():
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def need_server(name):
    """The server's variable; skips the test where it is absent (fails under CI)."""
    var = SERVER_ENV[name]
    value = os.environ.get(var)
    if value:
        return value
    why = "%s is not set: the %s test server is not up (run under tests/servers/up.sh, as tests/run.sh does)" % (var, name)
    if in_ci():
        pytest.fail("CI is set, so the remote tests must run: " + why)
    pytest.skip(why)


def unique(tag):
    """A bucket/container/directory name valid for every store (lowercase, digits, '-')."""
    return "rf-%s-%d-%s" % (tag, os.getpid(), os.urandom(3).hex())


# ---------------------------------------------------------------- the tree


# Names that trip encoders and orderings: spaces, '=', ',', '@', '~', ';',
# '&', quotes, parentheses, non-ASCII, upper case, and a-b / a.b / a/ which
# sort '-' < '.' < '/' byte-wise (a sort by path components would put a/
# first). Not '+' or '%': s3s-fs 0.14.1 stores a key "a+b" put by boto3 as
# "a b", and "%41" as "A" (it decodes the key twice).
ODD_NAMES = [
    "odd/with space.bin", "odd/semi;colon.bin", "odd/amp&quote'.bin", "odd/a=b,c@d.bin", "odd/paren(1).bin", "odd/tilde~x.bin",
    "odd/UPPER.bin", "odd/\u00e9quipe.bin", "odd/\u65e5\u672c.bin", "odd/a-b.bin", "odd/a.b", "odd/a/b.bin",
    "odd/dir with space/inner.bin", "top.bin",
]
SIZES = [0, 1, 100, 4096, 5000, 70000]
# One object larger than the fetch engine's 8 MiB parts: read as ranged GETs.
BIG_KEY, BIG_BYTES = "big/large.bin", (8 << 20) + 12345


def make_tree(root, files, seed_value=5, big=True):
    """`files` files (nested directories, the odd names, empty ones, one over
    8 MiB if `big`) and one empty directory under root; returns root."""
    rng = random.Random(seed_value)
    keys = list(ODD_NAMES) + ([BIG_KEY] if big else [])
    i = 0
    while len(keys) < files:
        keys.append("d%d/e%d/f%03d.bin" % (i % 7, i % 3, i))
        i += 1
    for n, key in enumerate(keys[:files]):
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        size = BIG_BYTES if key == BIG_KEY else SIZES[n % len(SIZES)]
        path.write_bytes(rng.randbytes(size))
    # Locally an empty directory is no sample (and it is not uploaded).
    (root / "emptydir").mkdir()
    return root


# Records per file, in turn: 24 per 8 files, so 48 files hold 144 records.
RECORDS_PER_FILE = [0, 1, 2, 3, 4, 5, 6, 3]


def make_record_tree(root, files, record_bytes, seed_value=9):
    """Files of 0 to 6 whole records each (RECORDS_PER_FILE), nested; returns root."""
    rng = random.Random(seed_value)
    for i in range(files):
        path = root / ("r%d" % (i % 4)) / ("part-%04d.rec" % i)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(record_bytes * RECORDS_PER_FILE[i % len(RECORDS_PER_FILE)]))
    return root


def manifest(root):
    """Relative keys of every file under root, in byte-wise order (the manifest order)."""
    keys = [p.relative_to(root).as_posix() for p in Path(root).rglob("*") if p.is_file()]
    return sorted(keys, key=lambda k: k.encode())


def sample_hashes(root, record_bytes=None):
    """(len, crc32) of every sample by manifest index: a file each, or with
    `record_bytes` each record of each file in order."""
    out = []
    for key in manifest(root):
        data = (Path(root) / key).read_bytes()
        if record_bytes is None:
            out.append((len(data), crc32(data)))
        else:
            out += [(record_bytes, crc32(data[i:i + record_bytes])) for i in range(0, len(data), record_bytes)]
    return out


# ---------------------------------------------------------------- seeding


def _write_tree(files, where):
    for key, data in files.items():
        (where / key).parent.mkdir(parents=True, exist_ok=True)
        (where / key).write_bytes(data)
    return where


# Directory markers put beside the tree in buckets: 0-byte keys ending in '/'
# of directories that hold keys, which a listing must skip. (object_store
# strips the '/', so the marker of an empty directory would look like an
# empty object; those are left out.)
MARKERS = ["d0/", "odd/a/"]


def seed_store(scheme, root, tag):
    """Uploads root under PREFIX (and the decoys beside it) to a fresh bucket,
    container or WebDAV directory of `scheme`'s server; returns the source
    URL (ending in '/')."""
    need_server(scheme)
    name = unique(tag)
    with tempfile.TemporaryDirectory() as tmp:
        decoys = _write_tree(DECOYS, Path(tmp))
        if scheme == "s3":
            seed.seed_s3(name, root, PREFIX)
            seed.seed_s3(name, decoys, "")
            for marker in MARKERS:
                seed.s3_client().put_object(Bucket=name, Key=PREFIX + marker, Body=b"")
            return "s3://%s/%s" % (name, PREFIX)
        if scheme == "azurite":
            seed.seed_azure(name, root, PREFIX)
            seed.seed_azure(name, decoys, "")
            for marker in MARKERS:
                seed.azure_request("PUT", "%s/%s%s" % (name, PREFIX, marker), headers={"x-ms-blob-type": "BlockBlob"})
            return "az://%s/%s" % (name, PREFIX)
        if scheme == "gcs":
            seed.seed_gcs(name, root, PREFIX)
            seed.seed_gcs(name, decoys, "")
            for marker in MARKERS:
                url = "%s/upload/storage/v1/b/%s/o?uploadType=media&name=%s" % (
                    need_server("gcs").rstrip("/"), name, urllib.parse.quote(PREFIX + marker, safe=""))
                seed.http("POST", url, b"", {"Content-Type": "application/octet-stream"})
            return "gs://%s/%s" % (name, PREFIX)
        if scheme == "nginx":
            # nginx serves its root directory as is: a copy is an upload.
            base = Path(os.environ["RINGFEED_TEST_NGINX_ROOT"]) / name
            shutil.copytree(root, base / PREFIX)
            _write_tree(DECOYS, base)
            return need_server("nginx") + name + "/" + PREFIX
        if scheme == "rclone":
            # Through rclone's own WebDAV PUTs: its directory cache sees them at once.
            url = need_server("rclone") + name + "/"
            seed.seed_webdav(url + PREFIX, root)
            seed.seed_webdav(url, decoys)
            return url + PREFIX
    raise ValueError("no server for %r" % scheme)


def s3_bucket_and_prefix(source):
    parsed = urllib.parse.urlparse(source)
    return parsed.netloc, parsed.path.lstrip("/")


# ---------------------------------------------------------------- runs


def serve_cmd(source, name, batch, world, epochs, seed_value, extra=()):
    return [ringfeed_bin(), "serve", "--source", str(source), "--name", name, "--batch-size", str(batch),
            "--world-size", str(world), "--epochs", str(epochs), "--seed", str(seed_value),
            "--manifest-cache", "off"] + list(extra)


class Run:
    """What one served run gave: the loader's exit code and log, and every
    sample each rank read as (epoch, step, rank, index, len, crc32)."""

    def __init__(self, rc, log, rows):
        self.rc, self.log, self.rows = rc, log, rows

    def batches(self):
        """{(epoch, step, rank): [indices in batch order]}."""
        out = defaultdict(list)
        for epoch, step, rank, index, _, _ in self.rows:
            out[(epoch, step, rank)].append(index)
        return dict(out)


def serve_two_ranks(source, c_consumer, batch=8, epochs=2, seed_value=11, extra=(), env=None, label="e2e"):
    """`ringfeed serve` for 2 ranks, rank 0 a Python trainer and rank 1 the C
    one (tests/c/dump_hashes.c); waits for all three. Everything goes to
    files, so no process can block on a full pipe; a loader that fails stops
    the ranks at once, instead of after their attach timeout."""
    name = "%s-%s" % (label, os.urandom(4).hex())
    files = [tempfile.TemporaryFile() for _ in range(5)]  # loader log, 2 x (stdout, stderr)
    log, outs = files[0], files[1:]
    try:
        loader = subprocess.Popen(serve_cmd(source, name, batch, 2, epochs, seed_value, extra), stderr=log,
                                  env=dict(env if env is not None else os.environ, RINGFEED_LOG="info"))
        commands = [python_consumer("hash_consumer.py", name, 0), [c_consumer, name, "1"]]
        ranks = [subprocess.Popen(cmd, stdout=outs[2 * i], stderr=outs[2 * i + 1]) for i, cmd in enumerate(commands)]
        try:
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while any(r.poll() is None for r in ranks) and time.monotonic() < deadline:
                if loader.poll() not in (None, 0):
                    break
                time.sleep(0.05)
            if all(r.poll() is not None for r in ranks):
                loader.wait(timeout=60)
        finally:
            kill_survivors([loader] + ranks)

        def text(f):
            f.seek(0)
            return f.read().decode("utf-8", "replace")

        rows = []
        for rank, proc in enumerate(ranks):
            out, err = text(outs[2 * rank]), text(outs[2 * rank + 1])
            assert proc.returncode == 0, "rank %d of %s exited %s: %s\nloader (exit %s) log:\n%s" % (
                rank, source, proc.returncode, err, loader.returncode, text(log))
            for line in out.splitlines():
                epoch, step, index, length, h = (int(x) for x in line.split())
                rows.append((epoch, step, rank, index, length, h))
        return Run(loader.returncode, text(log), rows)
    finally:
        for f in files:
            f.close()


def check_run(run, hashes, reference, world=2, batch=8, epochs=2, what="remote"):
    """Every sample exactly once per epoch, with its file's bytes, in the same
    batches (epoch, step, rank, indices) as the local reference run."""
    assert run.rc == 0, "the %s loader exited %d:\n%s" % (what, run.rc, run.log)
    n = len(hashes)
    per_epoch = defaultdict(list)
    for epoch, step, rank, index, length, h in run.rows:
        assert index < n, "%s: sample index %d, but the tree has %d samples" % (what, index, n)
        assert (length, h) == hashes[index], "%s: sample %d (epoch %d step %d rank %d) differs from the local file" % (
            what, index, epoch, step, rank)
        per_epoch[epoch].append(index)
    assert sorted(per_epoch) == list(range(epochs)), sorted(per_epoch)
    for epoch, indices in per_epoch.items():
        assert sorted(indices) == list(range(n)), "%s, epoch %d: %d samples, %d distinct, of %d" % (
            what, epoch, len(indices), len(set(indices)), n)
    mine, theirs = run.batches(), reference.batches()
    assert len(mine) == len(theirs) == epochs * n // batch  # steps x ranks
    differ = [k for k in sorted(theirs) if mine.get(k) != theirs[k]]
    assert not differ, "%s: %d batches differ from the local run, first %s: %s vs local %s" % (
        what, len(differ), differ[0], mine.get(differ[0]), theirs[differ[0]])


# ---------------------------------------------------------------- faultproxy


def faultproxy_bin():
    built = [ROOT / "target" / kind / "faultproxy" for kind in ("release", "debug")]
    built = [p for p in built if p.is_file()]
    if not built:
        raise RuntimeError("no target/*/faultproxy: build it first (cargo build --release -p faultproxy)")
    return str(max(built, key=lambda p: p.stat().st_mtime))


class FaultProxy:
    """tests/faultproxy in front of `upstream` (HOST:PORT) with `flags`."""

    def __init__(self, upstream, flags, work_dir):
        port_file = Path(work_dir) / "faultproxy.port"
        self.proc = subprocess.Popen([faultproxy_bin(), "--upstream", upstream, "--status-listen", "127.0.0.1:0",
                                      "--port-file", str(port_file)] + list(flags),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + PROXY_START_TIMEOUT_S
        while not (port_file.exists() and len(port_file.read_text().split()) == 2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("faultproxy did not start: %s" % self.output)
            time.sleep(0.05)
        self.port, self.status_port = (int(x) for x in port_file.read_text().split())
        self.output = ""

    def counters(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/" % self.status_port, timeout=10) as r:
            return json.loads(r.read())

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.output, _ = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            kill_survivors([self.proc])
            self.output = "(faultproxy did not stop on SIGTERM)"
        return self.output


def scrape(url):
    """{(metric name, labels text): value} of a Prometheus text page."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        name, _, labels = key.partition("{")
        out[(name, labels.rstrip("}"))] = float(value)
    return out


def free_port():
    """A port nothing listens on (bound, then closed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
