"""WebDataset tar shards end to end (issue 23, acceptance 1): shard sets made
by Python's tarfile and by GNU tar (gnu and posix formats), with nested keys,
a name past 100 bytes, an empty member and a directory member, served from a
local directory and from real servers (nginx WebDAV, s3s-fs). Every sample
arrives exactly once per epoch, and each of its fields, read zero-copy by a
Python rank (Batch.fields) and a C rank (rf_tar_field_next), has its
member's bytes."""
import io
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from e2e_util import compile_c, crc32, kill_survivors, python_consumer, ringfeed_bin, wait_all
from test_remote_serve import SERVERS, start_server

WORLD, BATCH, EPOCHS, SEED = 2, 4, 2, 5
LONG = "a-directory-name-long-enough-that-the-whole-member-path-passes/one-hundred-bytes-of-ustar-name-field"


def samples_of_shard(rng, shard, count):
    """`count` samples [(key, [(ext, bytes)])] of a shard; one has a long key,
    one an empty field, keys nested under directories."""
    samples = []
    for i in range(count):
        key = "%s/part%d/%06d" % (shard, i % 2, i)
        if i == 3:
            key = "%s/%s/%06d" % (shard, LONG, i)
        fields = [("jpg", rng.randbytes(rng.choice([1, 511, 512, 513, 4000]))), ("cls", str(i).encode())]
        if i == 5:
            fields[1] = ("cls", b"")
        if i % 3 == 0:
            fields.append(("seg.png", rng.randbytes(rng.choice([0, 100, 2000]))))
        samples.append((key, fields))
    return samples


def write_tarfile(path, samples, fmt):
    with tarfile.open(path, "w", format=fmt) as t:
        d = tarfile.TarInfo("dirs-are-skipped")
        d.type = tarfile.DIRTYPE
        t.addfile(d)
        for key, fields in samples:
            for ext, data in fields:
                info = tarfile.TarInfo("%s.%s" % (key, ext))
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))


def write_gnu_tar(path, samples, fmt, staging):
    names = []
    for key, fields in samples:
        for ext, data in fields:
            name = "%s.%s" % (key, ext)
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_bytes(data)
            names.append(name)
    subprocess.run(["tar", "--format=%s" % fmt, "--no-recursion", "-cf", str(path), "-C", str(staging)] + names, check=True)


@pytest.fixture(scope="module")
def shard_sets(tmp_path_factory):
    """{"tarfile": (dir, expected), "gnu": (dir, expected)}; expected[i] is
    sample i's (key, {ext: (len, crc32)}) in manifest order."""
    rng = random.Random(23)
    sets = {}
    root = tmp_path_factory.mktemp("tar")
    for kind, formats in (("tarfile", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT]), ("gnu", ["gnu", "posix"])):
        d = root / kind
        d.mkdir()
        expected = []
        for n, fmt in enumerate(formats):
            shard = "shard-%03d" % n
            samples = samples_of_shard(rng, shard, 8)
            if kind == "tarfile":
                write_tarfile(d / (shard + ".tar"), samples, fmt)
            else:
                staging = root / ("staging-%s" % shard)
                write_gnu_tar(d / (shard + ".tar"), samples, fmt, staging)
                shutil.rmtree(staging)
            expected += [(key, {ext: (len(data), crc32(data)) for ext, data in fields}) for key, fields in samples]
        sets[kind] = (d, expected)
    return sets


@pytest.fixture(scope="module")
def c_reader(tmp_path_factory):
    return compile_c("tar_fields.c", tmp_path_factory.mktemp("cbin"))


def serve_and_read(source, env, c_reader, extra=()):
    """Serves `source`; rank 0 reads with Python, rank 1 with C. Returns
    (rows per rank, loader log); a row is (epoch, index, key, ext, len, crc)."""
    name = "tar-%s" % uuid.uuid4().hex[:8]
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", source, "--name", name, "--batch-size", str(BATCH),
         "--world-size", str(WORLD), "--epochs", str(EPOCHS), "--seed", str(SEED), *extra],
        stderr=subprocess.PIPE, env=dict(os.environ, RINGFEED_LOG="info", **env),
    )
    procs = [
        subprocess.Popen(python_consumer("tar_consumer.py", name, 0), stdout=subprocess.PIPE, stderr=subprocess.PIPE),
        subprocess.Popen([c_reader, name, "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE),
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
        rank_rows = []
        for line in out.decode().splitlines():
            epoch, index, key, ext, length, h = line.split(" ")
            rank_rows.append((int(epoch), int(index), key, ext, int(length), int(h)))
        rows.append(rank_rows)
    return rows, log


def check_fields(rows, expected):
    per_epoch = defaultdict(Counter)
    got = defaultdict(dict)
    for rank_rows in rows:
        assert rank_rows, "a rank read nothing"
        for epoch, index, key, ext, length, h in rank_rows:
            got[(epoch, index)][ext] = (key, length, h)
    for (epoch, index), fields in got.items():
        key, want = expected[index]
        assert {ext: (k, l, h) for ext, (k, l, h) in fields.items()} == {ext: (key,) + v for ext, v in want.items()}, index
        per_epoch[epoch][index] += 1
    assert sorted(per_epoch) == list(range(EPOCHS))
    served = len(expected) // (WORLD * BATCH) * (WORLD * BATCH)
    for epoch, counts in per_epoch.items():
        assert len(counts) == served == len(expected), "epoch %d served %d of %d" % (epoch, len(counts), len(expected))


@pytest.mark.parametrize("kind", ["tarfile", "gnu"])
def test_local_shards_serve_every_sample_once_per_epoch_with_each_fields_bytes(shard_sets, c_reader, kind):
    d, expected = shard_sets[kind]
    rows, log = serve_and_read(str(d), {}, c_reader)
    check_fields(rows, expected)
    assert "every object is a .tar shard" in log, log
    assert "%d samples" % len(expected) in log, log


def test_a_second_start_takes_the_shard_indexes_from_the_index_cache(shard_sets, c_reader, tmp_path):
    d, expected = shard_sets["tarfile"]
    cache = {"RINGFEED_CACHE_DIR": str(tmp_path / "cache")}
    _, first = serve_and_read(str(d), cache, c_reader, ["--format", "tar"])
    assert "0 from the index cache, 0 from .tar.idx sidecars, 3 from their headers" in first, first
    rows, second = serve_and_read(str(d), cache, c_reader, ["--format", "tar"])
    assert "3 from the index cache, 0 from .tar.idx sidecars, 0 from their headers" in second, second
    check_fields(rows, expected)


def test_a_truncated_shard_is_refused_naming_it_and_the_offset(shard_sets, tmp_path):
    d, _ = shard_sets["tarfile"]
    bad = tmp_path / "bad"
    shutil.copytree(d, bad)
    shard = bad / "shard-001.tar"
    data = shard.read_bytes()
    shard.write_bytes(data[:3000])
    out = subprocess.run(
        [ringfeed_bin(), "serve", "--source", str(bad), "--name", "tar-bad-%s" % uuid.uuid4().hex[:6], "--batch-size", "2",
         "--manifest-cache", "off"], capture_output=True, text=True, timeout=60,
    )
    assert out.returncode != 0
    assert str(shard) in out.stderr and "at byte" in out.stderr and "truncated" in out.stderr, out.stderr


def test_a_directory_of_other_files_is_not_taken_for_shards(tmp_path):
    (tmp_path / "a.tar").write_bytes(b"")
    (tmp_path / "b.bin").write_bytes(b"x")
    out = subprocess.run(
        [ringfeed_bin(), "serve", "--source", str(tmp_path), "--name", "tar-mixed-%s" % uuid.uuid4().hex[:6],
         "--batch-size", "1", "--format", "tar", "--manifest-cache", "off"], capture_output=True, text=True, timeout=60,
    )
    assert out.returncode != 0
    assert "b.bin is not a tar shard" in out.stderr, out.stderr


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """servers(name) -> its environment: each server started once for the
    module (servers.sh refuses a second start in one state directory, whose
    pid file would hide the first), and every one started is stopped here."""
    state = tmp_path_factory.mktemp("servers")
    started = {}

    def get(name):
        if name not in started:
            started[name] = start_server(state, name)
        return started[name]

    yield get
    for name in started:
        subprocess.run([str(SERVERS / "servers.sh"), "stop", name, str(state)], capture_output=True, timeout=60)


@pytest.mark.parametrize("scheme,order", [("http", "exact"), ("s3", "exact"), ("http", "block")])
def test_remote_shards_serve_every_sample_once_per_epoch_with_each_fields_bytes(shard_sets, c_reader, servers, scheme, order, tmp_path):
    d, expected = shard_sets["gnu"]
    if scheme == "http":
        env = servers("nginx")
        shutil.copytree(d, Path(env["RINGFEED_TEST_NGINX_ROOT"]) / "shards", dirs_exist_ok=True)
        source = env["RINGFEED_TEST_NGINX_URL"].rstrip("/") + "/shards/"
    else:
        env = servers("s3")
        seeded = subprocess.run(
            [sys.executable, str(SERVERS / "seed.py"), "s3", "rfbucket", str(d), "--prefix", "shards/"],
            env=dict(os.environ, **env), capture_output=True, text=True, timeout=120,
        )
        assert seeded.returncode == 0, seeded.stderr
        source = "s3://rfbucket/shards/"
    # One server for the module: the same URL in each case, so each its own
    # cache, or a later case would take the earlier one's indexes.
    env = dict(env, RINGFEED_CACHE_DIR=str(tmp_path / "cache"))
    if order == "block":
        # Under the block order each block's samples come out of one ranged
        # GET of its bytes (reader::chunked), fields intact.
        rows, log = serve_and_read(source, env, c_reader, ("--shuffle", "block", "--shuffle-block", "4", "--shuffle-window", "2"))
        assert "each block of 4 samples is one ranged GET (4 chunks" in log, log
    else:
        rows, log = serve_and_read(source, env, c_reader)
    check_fields(rows, expected)
    assert "every object is a .tar shard" in log and "reader remote" in log, log
    assert "tar shards: 2 indexed" in log and "2 from their headers" in log, log


def sidecar_of(shard):
    """The shard's .tar.idx per TAR-INDEX.md, written from Python's tarfile
    (an implementation of its own, so the loader's parser is checked against
    another writer)."""
    lines = [b"ringfeed-tar-index 1", b"shard_bytes %d" % shard.stat().st_size]
    with tarfile.open(shard) as t:
        members = [m for m in t.getmembers() if m.isreg()]
    for m in members:
        name = b"".join(b"%%%02X" % b if b <= 0x20 or b in (0x25, 0x7F) else bytes([b]) for b in m.name.encode())
        lines.append(b"%d %d %d %s" % (m.offset, m.offset_data, m.size, name))
    body = b"\n".join(lines) + b"\n"
    return body + b"end %d %08x\n" % (len(members), crc32(body))


@pytest.mark.parametrize("scheme", ["http", "s3"])
def test_remote_shards_use_their_sidecar_then_the_index_cache(shard_sets, c_reader, servers, scheme, tmp_path):
    d, expected = shard_sets["tarfile"]
    with_idx = tmp_path / "with-idx"
    shutil.copytree(d, with_idx)
    (with_idx / "shard-001.tar.idx").write_bytes(sidecar_of(with_idx / "shard-001.tar"))
    if scheme == "http":
        env = servers("nginx")
        shutil.copytree(with_idx, Path(env["RINGFEED_TEST_NGINX_ROOT"]) / "with-idx")
        source = env["RINGFEED_TEST_NGINX_URL"].rstrip("/") + "/with-idx/"
    else:
        env = servers("s3")
        seeded = subprocess.run(
            [sys.executable, str(SERVERS / "seed.py"), "s3", "rfbucket", str(with_idx), "--prefix", "with-idx/"],
            env=dict(os.environ, **env), capture_output=True, text=True, timeout=120,
        )
        assert seeded.returncode == 0, seeded.stderr
        source = "s3://rfbucket/with-idx/"
    env = dict(env, RINGFEED_CACHE_DIR=str(tmp_path / "cache"))
    rows, log = serve_and_read(source, env, c_reader)
    check_fields(rows, expected)
    assert "0 from the index cache, 1 from .tar.idx sidecars, 2 from their headers" in log, log
    rows, log = serve_and_read(source, env, c_reader)
    check_fields(rows, expected)
    assert "3 from the index cache, 0 from .tar.idx sidecars, 0 from their headers" in log, log


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--format", "records"], "--format records needs --record-bytes N"),
        (["--format", "tar", "--record-bytes", "4"], "--record-bytes 4 with --format tar"),
    ],
)
def test_format_flags_that_contradict_are_refused_before_listing(tmp_path, flags, says):
    out = subprocess.run(
        [ringfeed_bin(), "serve", "--source", str(tmp_path / "not-listed"), "--name", "tar-flags-%s" % uuid.uuid4().hex[:6],
         "--batch-size", "1"] + flags, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 1 and says in out.stderr, out.stderr


def test_format_files_serves_each_shard_whole(shard_sets):
    d, _ = shard_sets["gnu"]
    name = "tar-files-%s" % uuid.uuid4().hex[:6]
    out = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(d), "--name", name, "--batch-size", "1", "--format", "files"],
        stderr=subprocess.PIPE, text=True,
    )
    try:
        for line in out.stderr:
            if line.startswith("ringfeed: manifest:"):
                assert "2 samples in 2 files" in line, line
                break
        else:
            raise AssertionError("serve never printed its manifest line")
    finally:
        # SIGINT: serve removes its ring if it made one by now.
        out.send_signal(signal.SIGINT)
        try:
            out.wait(timeout=30)
        finally:
            kill_survivors([out])


def test_a_truncated_remote_shard_is_refused_naming_its_url_and_the_offset(shard_sets, servers, tmp_path):
    d, _ = shard_sets["gnu"]
    env = servers("nginx")
    dest = Path(env["RINGFEED_TEST_NGINX_ROOT"]) / "truncated"
    shutil.copytree(d, dest)
    shard = dest / "shard-001.tar"
    shard.write_bytes(shard.read_bytes()[:5000])
    source = env["RINGFEED_TEST_NGINX_URL"].rstrip("/") + "/truncated/"
    out = subprocess.run(
        [ringfeed_bin(), "serve", "--source", source, "--name", "tar-rbad-%s" % uuid.uuid4().hex[:6], "--batch-size", "2"],
        capture_output=True, text=True, timeout=120, env=dict(os.environ, **env),
    )
    assert out.returncode == 1, out.stderr
    assert source + "shard-001.tar, header at byte" in out.stderr and "truncated" in out.stderr, out.stderr
