"""`ringfeed serve --source s3://...` (and http://, az://, gs://) end to end: a tree
served from a real server gives every sample exactly once per epoch, with the
local files' bytes, in the SAME batches as serving the local directory with
the same seed.

Servers come from tests/servers/servers.sh (s3s-fs, nginx with WebDAV,
Azurite, fake-gcs-server). A server that is not installed skips its case, saying so; set
RINGFEED_TEST_REQUIRE_REMOTE=1 to make that a failure.
"""
import os
import random
import shlex
import shutil
import subprocess
import sys
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from e2e_util import crc32, kill_survivors, python_consumer, ringfeed_bin, wait_all

REPO = Path(__file__).resolve().parents[2]
SERVERS = REPO / "tests" / "servers"
WORLD, BATCH, EPOCHS, SEED = 2, 4, 2, 11


def _skip_or_fail(why):
    if os.environ.get("RINGFEED_TEST_REQUIRE_REMOTE") == "1":
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory):
    state = tmp_path_factory.mktemp("servers")
    yield state
    for name in ("s3", "nginx", "azurite", "gcs"):
        if (state / ("%s.pid" % name)).exists():
            subprocess.run([str(SERVERS / "servers.sh"), "stop", name, str(state)], capture_output=True, timeout=60)


def start_server(state, name):
    """Starts `name` and returns the environment it exported."""
    started = subprocess.run(
        [str(SERVERS / "servers.sh"), "start", name, str(state)], capture_output=True, text=True, timeout=180
    )
    if started.returncode != 0:
        _skip_or_fail("cannot start the %s test server: %s" % (name, (started.stderr or started.stdout)[-600:]))
    env = {}
    for line in (state / ("%s.env" % name)).read_text().splitlines():
        words = shlex.split(line)
        if words[:1] == ["export"]:
            for word in words[1:]:
                key, _, value = word.partition("=")
                env[key] = value
    return env


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A tree with nested directories, empty files and names whose byte-wise
    order differs from a per-directory walk (`a.b` < `a/b`)."""
    root = tmp_path_factory.mktemp("data")
    rng = random.Random(21)
    paths = []
    for i in range(97):
        sub = root / ("d%d" % (i % 5)) / ("e%d" % (i % 2))
        sub.mkdir(parents=True, exist_ok=True)
        paths.append(sub / ("f%03d.bin" % i))
    paths += [root / "a.b", root / "a" / "b", root / "Z", root / "a-", root / "é.bin"]
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(rng.choice([0, 1, 300, 4096, 9000, 70000])))
    rel = sorted((p.relative_to(root).as_posix().encode(), p) for p in paths)
    hashes = [(len(p.read_bytes()), crc32(p.read_bytes())) for _, p in rel]
    return root, hashes


def serve_and_consume(source, env, extra=()):
    """Serves `source` to WORLD Python ranks; returns each rank's rows
    (epoch, step, index, len, crc32) and the loader's log."""
    name = "remote-%s" % uuid.uuid4().hex[:8]
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", source, "--name", name, "--batch-size", str(BATCH),
         "--world-size", str(WORLD), "--epochs", str(EPOCHS), "--seed", str(SEED), *extra],
        stderr=subprocess.PIPE,
        env=dict(os.environ, **env),
    )
    procs = [
        subprocess.Popen(python_consumer("hash_consumer.py", name, r), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for r in range(WORLD)
    ]
    try:
        results = wait_all(procs, timeout=120)
        _, err = loader.communicate(timeout=60)
    finally:
        kill_survivors([loader] + procs)
    log = err.decode()
    assert loader.returncode == 0, log
    rows = []
    for rank, (rc, out, perr) in enumerate(results):
        assert rc == 0, "rank %d: %s\nloader: %s" % (rank, perr.decode(), log)
        rows.append([tuple(int(x) for x in line.split()) for line in out.decode().splitlines()])
    return rows, log


def check_every_sample_once_per_epoch(rows, hashes):
    per_epoch = defaultdict(Counter)
    for rank_rows in rows:
        for epoch, _step, index, length, h in rank_rows:
            assert (length, h) == hashes[index], "sample %d differs from its file" % index
            per_epoch[epoch][index] += 1
    step = WORLD * BATCH
    served = len(hashes) // step * step
    assert sorted(per_epoch) == list(range(EPOCHS))
    for epoch, counts in per_epoch.items():
        assert len(counts) == served and set(counts.values()) == {1}, "epoch %d: %s" % (epoch, counts.most_common(3))


@pytest.fixture(scope="module")
def local_rows(dataset):
    root, hashes = dataset
    rows, _ = serve_and_consume(str(root), {})
    check_every_sample_once_per_epoch(rows, hashes)
    return rows


def upload(state, scheme, root):
    """Puts the tree on the scheme's server; returns (--source URL, env)."""
    if scheme == "s3":
        env = start_server(state, "s3")
        seeded = subprocess.run(
            [sys.executable, str(SERVERS / "seed.py"), "s3", "rfbucket", str(root), "--prefix", "set/one/"],
            env=dict(os.environ, **env), capture_output=True, text=True, timeout=120,
        )
        assert seeded.returncode == 0, seeded.stderr
        # Directory markers, as consoles make them: skipped by the listing.
        data = Path(env["RINGFEED_TEST_S3_DATA"])
        boto3 = pytest.importorskip("boto3")
        s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                          aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
        for marker in ("set/one/d0/", "set/one/"):
            try:
                s3.put_object(Bucket="rfbucket", Key=marker, Body=b"")
            except Exception as e:  # s3s-fs keeps buckets as directories: a marker may be refused
                print("marker %s not stored (%s); %s" % (marker, e, data))
        return "s3://rfbucket/set/one/", env
    if scheme == "http":
        env = start_server(state, "nginx")
        dest = Path(env["RINGFEED_TEST_NGINX_ROOT"]) / "set"
        shutil.copytree(root, dest)
        return env["RINGFEED_TEST_NGINX_URL"].rstrip("/") + "/set/", env
    if scheme == "az":
        env = start_server(state, "azurite")
        seeded = subprocess.run(
            [sys.executable, str(SERVERS / "seed.py"), "azure", "rfcontainer", str(root), "--prefix", "set/"],
            env=dict(os.environ, **env), capture_output=True, text=True, timeout=120,
        )
        assert seeded.returncode == 0, seeded.stderr
        return "az://rfcontainer/set/", env
    if scheme == "gs":
        env = start_server(state, "gcs")
        seeded = subprocess.run(
            [sys.executable, str(SERVERS / "seed.py"), "gcs", "rfbucket", str(root), "--prefix", "set/"],
            env=dict(os.environ, **env), capture_output=True, text=True, timeout=120,
        )
        assert seeded.returncode == 0, seeded.stderr
        # The emulator speaks plain http, which object_store's GCS client
        # refuses unless told (as AWS_ALLOW_HTTP does for S3).
        return "gs://rfbucket/set/", dict(env, GOOGLE_ALLOW_HTTP="true")
    raise AssertionError(scheme)


@pytest.fixture(scope="module")
def uploaded(dataset, state_dir):
    """uploaded(scheme) -> (--source URL, env): the tree on that scheme's
    server, started and seeded once per module."""
    done = {}

    def get(scheme):
        if scheme not in done:
            done[scheme] = upload(state_dir, scheme, dataset[0])
        return done[scheme]

    return get


@pytest.mark.parametrize("scheme", ["s3", "http", "az", "gs"])
def test_a_tree_served_remotely_gives_the_local_directorys_batches(dataset, local_rows, uploaded, scheme):
    root, hashes = dataset
    source, env = uploaded(scheme)
    rows, log = serve_and_consume(source, env)
    check_every_sample_once_per_epoch(rows, hashes)
    assert "reader remote" in log, log
    # The remote figures in the loader's last words (and in --metrics).
    assert "ringfeed: remote: " in log and "retries: none" in log, log
    assert "%d samples" % len(hashes) in log, log
    # The same seed gives the same batches, step by step, rank by rank.
    assert rows == local_rows


def test_a_keys_file_serves_just_its_keys_in_byte_wise_order(dataset, uploaded, tmp_path):
    root, hashes = dataset
    source, env = uploaded("s3")
    rel = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    # Half the keys, written out of order, half with sizes (the rest HEADs).
    chosen = rel[::2]
    lines = ["# a comment"]
    for i, key in enumerate(reversed(chosen)):
        lines.append("%s\t%d" % (key, (root / key).stat().st_size) if i % 2 else key)
    keys = tmp_path / "keys.txt"
    keys.write_text("\n".join(lines) + "\n")
    rows, log = serve_and_consume(source, env, ["--keys", str(keys)])
    want = [hashes[rel.index(k)] for k in sorted(chosen, key=str.encode)]
    check_every_sample_once_per_epoch(rows, want)
    assert "%d samples" % len(chosen) in log, log


def test_a_missing_object_stops_the_run_naming_its_key(dataset, uploaded, tmp_path):
    root, _ = dataset
    _, env = uploaded("s3")
    keys = tmp_path / "keys.txt"
    keys.write_text("d0/e0/f000.bin\t%d\nno/such/key.bin\t5\n" % (root / "d0/e0/f000.bin").stat().st_size)
    name = "remote-missing-%s" % uuid.uuid4().hex[:8]
    loader = subprocess.run(
        [ringfeed_bin(), "serve", "--source", "s3://rfbucket/set/one/", "--keys", str(keys), "--name", name,
         "--batch-size", "1", "--world-size", "1", "--no-shuffle"],
        env=dict(os.environ, **env), capture_output=True, text=True, timeout=120,
    )
    assert loader.returncode != 0
    assert "no/such/key.bin" in loader.stderr and "404" in loader.stderr, loader.stderr
