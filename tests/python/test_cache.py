"""The disk data cache (issue 22) end to end, against s3s-fs on 127.0.0.1:
a cached dataset serves epochs with no remote byte and the same batches; half a
cache hits half of each epoch and fetches exactly the misses; kill -9 during the
fill leaves nothing that reads back wrong; a changed object and a corrupted entry
are refetched; a full disk and a second loader on the same cache leave the run
(and the accounting) right.

The server comes from tests/servers/servers.sh; where it is not installed the
module is skipped, saying so (RINGFEED_TEST_REQUIRE_REMOTE=1: a failure).
"""
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from e2e_util import as_nobody, crc32, kill_survivors, python_consumer, ringfeed_bin, wait_all
from test_remote_serve import start_server

REPO = Path(__file__).resolve().parents[2]
SERVERS = REPO / "tests" / "servers"
WORLD, BATCH, SEED = 2, 4, 5
N_OBJECTS, OBJECT_BYTES = 64, 16 << 10
FOOTER_BYTES = 64
ENTRY_BYTES = OBJECT_BYTES + FOOTER_BYTES


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """(env, boto3 client) of a running s3s-fs."""
    boto3 = pytest.importorskip("boto3")  # before the server starts: a skip here must not leak it
    state = tmp_path_factory.mktemp("servers")
    env = start_server(state, "s3")
    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                          aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
    yield env, client
    subprocess.run([str(SERVERS / "servers.sh"), "stop", "s3", str(state)], capture_output=True, timeout=60)


def put_dataset(s3, n=N_OBJECTS, size=OBJECT_BYTES, seed=1):
    """A fresh prefix of n objects of `size` bytes; returns (source, {key: bytes})."""
    env, client = s3
    bucket = "cache%s" % uuid.uuid4().hex[:8]
    client.create_bucket(Bucket=bucket)
    rng = random.Random(seed)
    objects = {}
    for i in range(n):
        key = "set/o%04d.bin" % i
        objects[key] = rng.randbytes(size)
        client.put_object(Bucket=bucket, Key=key, Body=objects[key])
    return "s3://%s/set/" % bucket, objects


def serve(source, env, cache_dir, epochs=1, extra=(), consumers=True, name=None):
    """Starts a loader (and its ranks); returns (loader, ranks)."""
    name = name or "cache-%s" % uuid.uuid4().hex[:8]
    if "--cache-size" not in extra:
        # Explicit: the default depends on the free space of the disk the
        # tests run on (issue 32: 0 B on a big, nearly full one).
        extra = ["--cache-size", "1G", *extra]
    args = [ringfeed_bin(), "serve", "--source", source, "--name", name, "--batch-size", str(BATCH),
            "--world-size", str(WORLD), "--epochs", str(epochs), "--seed", str(SEED),
            "--cache-dir", str(cache_dir),
            # List at every start: an object changed between runs must reach
            # the manifest (and its new ETag the data cache); the manifest
            # cache's own rule is test_remote_manifest_cache.py's.
            "--manifest-max-age", "0", *extra]
    loader = subprocess.Popen(args, stderr=subprocess.PIPE, env=dict(os.environ, **env))
    ranks = [subprocess.Popen(python_consumer("hash_consumer.py", name, r), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for r in range(WORLD)] if consumers else []
    return loader, ranks


def finish(loader, ranks):
    """Waits for a run; returns (rows per rank, loader log)."""
    try:
        results = wait_all(ranks, timeout=60)
        _, err = loader.communicate(timeout=60)
    finally:
        kill_survivors([loader] + ranks)
    log = err.decode()
    assert loader.returncode == 0, log
    rows = []
    for rank, (rc, out, perr) in enumerate(results):
        assert rc == 0, "rank %d: %s\nloader: %s" % (rank, perr.decode(), log)
        rows.append([tuple(int(x) for x in line.split()) for line in out.decode().splitlines()])
    return rows, log


def run(source, env, cache_dir, **kw):
    return finish(*serve(source, env, cache_dir, **kw))


def cache_figures(log):
    """The loader's last cache line as a dict."""
    m = re.search(r"data cache: (\d+) hits, (\d+) misses, (\d+) bytes from cache, (\d+) bytes from remote, "
                  r"(\d+) entries written, (\d+) corrupt refetched, (\d+) of (\d+) bytes used", log)
    assert m, log
    keys = ["hits", "misses", "cache_bytes", "remote_bytes", "written", "corrupt", "used", "limit"]
    return dict(zip(keys, (int(x) for x in m.groups())))


def remote_received_bytes(log):
    m = re.search(r"ringfeed: remote: \d+ requests, ([\d.]+) (B|KiB|MiB|GiB) received", log)
    assert m, log
    return float(m.group(1)) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m.group(2)]


def entries(cache_dir):
    return sorted(p for p in (Path(cache_dir) / "data").glob("*/*/*-*") if p.is_file())


def check_bytes(rows, objects):
    keys = sorted(objects)
    for rank_rows in rows:
        for _epoch, _step, index, length, h in rank_rows:
            data = objects[keys[index]]
            assert (length, h) == (len(data), crc32(data)), "sample %d has wrong bytes" % index


@pytest.fixture(scope="module")
def dataset(s3):
    source, objects = put_dataset(s3)
    return source, objects


@pytest.fixture(scope="module")
def reference(s3, dataset, tmp_path_factory):
    """Batches of 2 epochs with the cache off: what every cached run must match."""
    source, objects = dataset
    rows, _ = run(source, s3[0], tmp_path_factory.mktemp("nocache"), epochs=2, extra=["--cache", "off"])
    check_bytes(rows, objects)
    return rows


def test_a_cached_dataset_serves_later_runs_with_no_remote_byte_and_the_same_batches(s3, dataset, reference, tmp_path):
    source, objects = dataset
    rows, log = run(source, s3[0], tmp_path, epochs=1)
    first = cache_figures(log)
    assert (first["hits"], first["misses"]) == (0, N_OBJECTS), log
    assert first["written"] == N_OBJECTS and first["used"] == N_OBJECTS * ENTRY_BYTES, log
    assert len(entries(tmp_path)) == N_OBJECTS
    # Epochs 1 and 2 of a run that finds the whole dataset cached.
    rows, log = run(source, s3[0], tmp_path, epochs=2)
    figures = cache_figures(log)
    assert (figures["hits"], figures["misses"], figures["remote_bytes"]) == (2 * N_OBJECTS, 0, 0), log
    assert remote_received_bytes(log) == 0, log
    # The remote engine's own count: the one listing page, and no GET.
    assert re.search(r"ringfeed: remote: 1 requests,", log), log
    assert rows == reference


def test_half_a_cache_hits_half_of_each_epoch_and_fetches_exactly_the_misses(s3, dataset, reference, tmp_path):
    source, objects = dataset
    half = N_OBJECTS // 2 * ENTRY_BYTES
    rows, log = run(source, s3[0], tmp_path, epochs=1, extra=["--cache-size", str(half)])
    assert "data cache full" in log and "keeping these %d" % (N_OBJECTS // 2) in log, log
    rows, log = run(source, s3[0], tmp_path, epochs=2, extra=["--cache-size", str(half)])
    f = cache_figures(log)
    # Every object is read once per epoch; the same half hits each time.
    assert (f["hits"], f["misses"]) == (N_OBJECTS, N_OBJECTS), log
    assert f["remote_bytes"] == f["misses"] * OBJECT_BYTES == remote_received_bytes(log), log
    assert f["used"] <= half and len(entries(tmp_path)) == N_OBJECTS // 2
    assert rows == reference


def test_kill_9_during_the_fill_never_leaves_an_entry_that_reads_back_wrong(s3, tmp_path):
    n = 128
    source, objects = put_dataset(s3, n=n, size=256 << 10, seed=3)
    rng = random.Random(9)
    mid_write = 0
    for _ in range(20):
        # Most of what earlier runs cached goes, so that each kill lands in a
        # fill (the next start derives the usage again from the disk).
        for entry in entries(tmp_path):
            if rng.random() < 0.75:
                entry.unlink()
        loader, ranks = serve(source, s3[0], tmp_path, epochs=1)
        time.sleep(rng.uniform(0.05, 0.6))
        loader.send_signal(signal.SIGKILL)
        kill_survivors([loader] + ranks)
        mid_write += bool(list((tmp_path / "data").glob("*/.tmp.*")))
    print("kills that left a write half done: %d of 20" % mid_write)
    rows, log = run(source, s3[0], tmp_path, epochs=2)
    check_bytes(rows, objects)
    f = cache_figures(log)
    assert f["corrupt"] == 0 and "corrupt" not in log.replace("0 corrupt refetched", ""), log
    assert f["hits"] + f["misses"] == 2 * n, log
    # The accounting matches the disk: dead writers' reservations were dropped.
    on_disk = sum(p.stat().st_size for p in entries(tmp_path))
    assert f["used"] == on_disk, (f, on_disk)
    assert not list((tmp_path / "data").glob("*/.tmp.*"))


@pytest.fixture(scope="module")
def azurite(tmp_path_factory):
    """Azurite's environment: Azure lists ETags (s3s-fs lists none)."""
    state = tmp_path_factory.mktemp("azurite")
    yield start_server(state, "azurite")
    subprocess.run([str(SERVERS / "servers.sh"), "stop", "azurite", str(state)], capture_output=True, timeout=60)


def test_an_object_changed_in_place_new_etag_same_size_is_fetched_again(azurite, tmp_path, monkeypatch):
    sys.path.insert(0, str(SERVERS))
    import seed  # tests/servers/seed.py: signed Azurite requests

    for k, v in azurite.items():
        monkeypatch.setenv(k, v)
    container = "cache%s" % uuid.uuid4().hex[:8]
    rng = random.Random(4)
    objects = {"set/o%02d.bin" % i: rng.randbytes(4096) for i in range(16)}
    seed.azure_request("PUT", container, {"restype": "container"}, ok=(201, 409))

    def put(key):
        seed.azure_request("PUT", "%s/%s" % (container, key), body=objects[key], headers={"x-ms-blob-type": "BlockBlob"})

    for key in objects:
        put(key)
    source = "az://%s/set/" % container
    _, log = run(source, azurite, tmp_path, epochs=1)
    assert cache_figures(log)["written"] == 16, log
    key = sorted(objects)[5]
    objects[key] = bytes(b ^ 0xFF for b in objects[key])
    put(key)
    rows, log = run(source, azurite, tmp_path, epochs=1)
    check_bytes(rows, objects)
    f = cache_figures(log)
    assert (f["hits"], f["misses"]) == (15, 1), log


def test_an_object_listed_without_an_etag_is_fetched_again_when_its_size_changes(s3, tmp_path):
    source, objects = put_dataset(s3, n=16, seed=4)
    run(source, s3[0], tmp_path, epochs=1)
    bucket = source.split("/")[2]
    key = sorted(objects)[5]
    objects[key] = objects[key] + b"longer"
    s3[1].put_object(Bucket=bucket, Key=key, Body=objects[key])
    rows, log = run(source, s3[0], tmp_path, epochs=1)
    check_bytes(rows, objects)
    f = cache_figures(log)
    assert (f["hits"], f["misses"]) == (15, 1), log


# 16 KiB is checked on the loader's thread; past it, on the checking thread
# (engine/src/cache/verify.rs), whose completion waits for the check.
@pytest.mark.parametrize("size", [OBJECT_BYTES, 96 << 10])
def test_a_flipped_byte_in_a_cached_file_is_caught_and_the_sample_refetched(s3, tmp_path, size):
    source, objects = put_dataset(s3, n=16, size=size, seed=6)
    run(source, s3[0], tmp_path, epochs=1)
    victim = entries(tmp_path)[3]
    data = bytearray(victim.read_bytes())
    data[100] ^= 0x10
    victim.write_bytes(bytes(data))
    rows, log = run(source, s3[0], tmp_path, epochs=1)
    check_bytes(rows, objects)
    f = cache_figures(log)
    assert (f["corrupt"], f["misses"], f["hits"]) == (1, 1, 15), log
    assert "is corrupt" in log and victim.name in log, log


def test_a_full_disk_leaves_the_run_going_from_remote(s3, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    source, objects = put_dataset(s3, n=48, size=64 << 10, seed=7)
    data = tmp_path / "data"
    data.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(data)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs: %s" % mounted.stderr)
    try:
        rows, log = run(source, s3[0], tmp_path, epochs=1, extra=["--cache-size", "1G"])
        check_bytes(rows, objects)
        assert log.count("caching stops for this run") == 1, log
        # What did fit before the disk filled is read back from it.
        rows, log = run(source, s3[0], tmp_path, epochs=1, extra=["--cache-size", "1G"])
        check_bytes(rows, objects)
        f = cache_figures(log)
        assert f["hits"] + f["misses"] == 48 and f["hits"] > 0, log
    finally:
        subprocess.run(["umount", str(data)], capture_output=True)


def test_two_loaders_share_one_cache_without_passing_its_size_or_counting_twice(s3, tmp_path):
    source, objects = put_dataset(s3, n=128, seed=8)
    limit = 100 * ENTRY_BYTES
    a = serve(source, s3[0], tmp_path, epochs=2, extra=["--cache-size", str(limit)])
    b = serve(source, s3[0], tmp_path, epochs=2, extra=["--cache-size", str(limit)])
    (rows_a, log_a), (rows_b, log_b) = finish(*a), finish(*b)
    check_bytes(rows_a, objects)
    check_bytes(rows_b, objects)
    on_disk = [p.stat().st_size for p in entries(tmp_path)]
    usage = int((tmp_path / "data" / "usage").read_text())
    assert usage == sum(on_disk) <= limit, (usage, sum(on_disk), limit)
    assert len(on_disk) == 100
    for log in (log_a, log_b):
        assert cache_figures(log)["used"] <= limit


def test_cache_list_names_the_source_and_clear_removes_its_entries(s3, tmp_path):
    source, objects = put_dataset(s3, n=8, seed=10)
    run(source, s3[0], tmp_path, epochs=1)

    def cli(*args):
        done = subprocess.run([ringfeed_bin(), "cache", *args, "--cache-dir", str(tmp_path)],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout

    listed = cli("list")
    line = next(l for l in listed.splitlines() if source in l)
    dataset_id, count = line.split()[:2]
    assert int(count) == 8, listed
    cleared = cli("clear", dataset_id)
    assert "removed %s (8 entries" % dataset_id in cleared, cleared
    assert entries(tmp_path) == [] and int((tmp_path / "data" / "usage").read_text()) == 0
    assert "no cached datasets" in cli("list")
    bad = subprocess.run([ringfeed_bin(), "cache", "clear", "0000000000000000", "--cache-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0 and "ringfeed cache list" in bad.stderr, bad.stderr


def test_a_cache_directory_that_cannot_be_made_is_a_warning_and_the_run_reads_remote(s3, dataset, reference, tmp_path):
    source, objects = dataset
    blocker = tmp_path / "not-a-dir"
    blocker.write_bytes(b"a file where the cache directory should be")
    rows, log = run(source, s3[0], blocker, epochs=2)
    assert "cannot use the data cache" in log and "reading everything from remote" in log, log
    assert "data cache: " not in log.split("ringfeed: done:")[1], log
    assert rows == reference


# Issue 32: a cache beside other users.

def test_links_and_a_fifo_planted_in_a_shared_cache_dir_neither_write_through_nor_hang(s3, dataset, reference, tmp_path, sticky_shared_dir):
    source, objects = dataset
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's file, not a counter")
    os.chmod(victim, 0o600)
    # Another user got there first: the cache directory itself is theirs,
    # with usage and lock linked to root's file and a FIFO named like an
    # unfinished write.
    cache = sticky_shared_dir / "cache"
    as_nobody("mkdir -p {c}/data/{ds}; ln -s {v} {c}/data/usage; ln -s {v} {c}/data/lock; mkfifo {c}/data/{ds}/.tmp.100.1.1;"
               " chmod -R a+rwx {c}".format(c=cache, v=victim, ds="0123456789abcdef"))
    started = time.monotonic()
    rows, log = run(source, s3[0], cache, epochs=2)
    assert time.monotonic() - started < 50, "start-up waited"
    assert victim.read_bytes() == b"root's file, not a counter"
    assert "cannot use the data cache" in log and "belongs to uid 65534" in log, log
    assert rows == reference
    # In the sticky shared directory itself: data/ is made ours, 0700; what
    # another user plants inside it is never opened.
    cache2 = sticky_shared_dir / "cache2"
    cache2.mkdir()
    os.chmod(cache2, 0o1777)
    rows, log = run(source, s3[0], cache2, epochs=1)
    assert os.stat(cache2 / "data").st_mode & 0o777 == 0o700, log


def put_shards(s3, shards=3, per_shard=24, size=4096, seed=9):
    """A fresh prefix of `shards` tar shards of `per_shard` samples (one
    field, `size` bytes) each; returns the source."""
    import io
    import tarfile

    env, client = s3
    bucket = "cshard%s" % uuid.uuid4().hex[:8]
    client.create_bucket(Bucket=bucket)
    rng = random.Random(seed)
    for s in range(shards):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
            for i in range(per_shard):
                data = rng.randbytes(size)
                info = tarfile.TarInfo("s%02d/k%04d.bin" % (s, i))
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
        client.put_object(Bucket=bucket, Key="set/shard%03d.tar" % s, Body=buf.getvalue())
    return "s3://%s/set/" % bucket


BLOCK = ["--format", "tar", "--shuffle", "block", "--shuffle-block", "4", "--shuffle-window", "2"]


def test_packed_shards_under_the_block_order_are_cached_by_range_and_later_epochs_read_no_remote_byte(s3, tmp_path):
    source = put_shards(s3)
    rows, log = run(source, s3[0], tmp_path, epochs=2, extra=BLOCK)
    f = cache_figures(log)
    # Each block's range is fetched once and written as an entry of its own
    # (epoch 2 here is served by the chunk layer's memory, which holds
    # these few chunks).
    chunks = int(re.search(r"one ranged GET \((\d+) chunks", log).group(1))
    assert (f["misses"], f["written"], f["corrupt"]) == (chunks, chunks, 0), log
    # A later run: not one byte from remote, the same batches.
    rows2, log2 = run(source, s3[0], tmp_path, epochs=2, extra=BLOCK)
    f2 = cache_figures(log2)
    assert (f2["misses"], f2["remote_bytes"], f2["written"]) == (0, 0, 0), log2
    assert f2["hits"] == chunks, log2
    assert rows2 == rows


def test_a_flipped_byte_in_a_cached_shard_range_is_caught_and_the_range_refetched(s3, tmp_path):
    source = put_shards(s3, seed=10)
    rows, log = run(source, s3[0], tmp_path, epochs=1, extra=BLOCK)
    written = cache_figures(log)["written"]
    victim = entries(tmp_path)[2]
    data = bytearray(victim.read_bytes())
    data[700] ^= 0x08
    victim.write_bytes(bytes(data))
    rows2, log2 = run(source, s3[0], tmp_path, epochs=1, extra=BLOCK)
    f = cache_figures(log2)
    assert (f["corrupt"], f["misses"], f["hits"]) == (1, 1, written - 1), log2
    assert "is corrupt" in log2 and victim.name in log2 and "(bytes " in log2, log2
    assert rows2 == rows


def test_kill_9_during_a_fill_of_shard_ranges_never_leaves_an_entry_that_reads_back_wrong(s3, tmp_path):
    source = put_shards(s3, shards=6, per_shard=64, size=16 << 10, seed=11)
    reference, _ = run(source, s3[0], tmp_path / "nocache", epochs=1, extra=BLOCK + ["--cache", "off"])
    rng = random.Random(12)
    for _ in range(8):
        for entry in entries(tmp_path):
            if rng.random() < 0.75:
                entry.unlink()
        loader, ranks = serve(source, s3[0], tmp_path, epochs=1, extra=BLOCK)
        time.sleep(rng.uniform(0.05, 0.5))
        loader.send_signal(signal.SIGKILL)
        kill_survivors([loader] + ranks)
    rows, log = run(source, s3[0], tmp_path, epochs=1, extra=BLOCK)
    assert rows == reference
    f = cache_figures(log)
    assert f["corrupt"] == 0 and "corrupt" not in log.replace("0 corrupt refetched", ""), log
    on_disk = sum(p.stat().st_size for p in entries(tmp_path))
    assert f["used"] == on_disk, (f, on_disk)
    assert not list((tmp_path / "data").glob("*/.tmp.*"))


def test_two_loaders_share_one_cache_of_shard_ranges_without_passing_its_size(s3, tmp_path):
    source = put_shards(s3, shards=4, per_shard=64, size=4096, seed=13)
    reference, _ = run(source, s3[0], tmp_path / "nocache", epochs=2, extra=BLOCK + ["--cache", "off"])
    # 64 ranges of 4 samples (16 KiB of data each, with tar headers more);
    # room for about half of them.
    limit = 40 * (4 * (4096 + 512) + 64)
    a = serve(source, s3[0], tmp_path, epochs=2, extra=BLOCK + ["--cache-size", str(limit)])
    b = serve(source, s3[0], tmp_path, epochs=2, extra=BLOCK + ["--cache-size", str(limit)])
    (rows_a, log_a), (rows_b, log_b) = finish(*a), finish(*b)
    assert rows_a == reference and rows_b == reference
    on_disk = [p.stat().st_size for p in entries(tmp_path)]
    usage = int((tmp_path / "data" / "usage").read_text())
    assert usage == sum(on_disk) <= limit, (usage, sum(on_disk), limit)
    assert len(on_disk) > 0
    for log in (log_a, log_b):
        assert cache_figures(log)["used"] <= limit
