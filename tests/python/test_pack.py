"""`ringfeed pack`: a tree of files into WebDataset tar shards that Python's
tarfile and GNU tar read back byte for byte; deterministic; resumable after
kill -9 without rewriting finished shards; a remote DEST (s3s-fs) too.
"""
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from e2e_util import NOBODY, as_nobody, need_root_and_setpriv, ringfeed_bin

REPO = Path(__file__).resolve().parents[2]
SERVERS = REPO / "tests" / "servers"
SHARD = 64 * 1024
KEY_SPLIT = "."


def sample_key(name):
    """TAR-INDEX.md's key: up to the first '.' of the last component that is
    not its first character."""
    head, _, last = name.rpartition("/")
    dot = last.find(".", 1)
    base = last if dot < 0 else last[:dot]
    return (head + "/" if head else "") + base


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """Nested directories, empty files, odd names (space, newline, %, UTF-8,
    a component and a path past 100 bytes), samples of several fields and
    one larger than a shard."""
    root = tmp_path_factory.mktemp("pack-src")
    files = {}

    def put(rel, data):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(os.fsencode(p), "wb") as f:
            f.write(data)
        files[rel] = data

    for i in range(120):
        d = "d%d/e%d" % (i % 4, i % 3)
        put("%s/%06d.jpg" % (d, i), os.urandom((i * 977) % 5000))
        put("%s/%06d.cls" % (d, i), b"%d" % (i % 10))
        if i % 7 == 0:
            put("%s/%06d.seg.png" % (d, i), os.urandom(300))
    put("empty.txt", b"")
    put("empties/zero.bin", b"")
    put("odd/with space.txt", b"space")
    put("odd/new\nline.txt", b"newline")
    put("odd/100%.txt", b"percent")
    put("odd/caf\u00e9 \u65e5\u672c.txt", b"utf8")
    put("odd/" + "l" * 150 + ".txt", b"long name")
    put("/".join(["deep%02d" % i for i in range(12)]) + "/leaf.bin", b"long path")
    put("odd/.hidden.txt", b"hidden")
    # Not UTF-8 (Latin-1 é): a pax path with hdrcharset=BINARY.
    put(os.fsdecode(b"odd/caf\xe9.bin"), b"latin-1 name")
    put("big/one.bin", os.urandom(3 * SHARD))
    return root, files


def pack(src, dest, *extra, env=None, check=True):
    p = subprocess.run([ringfeed_bin(), "pack", "--source", str(src), "--dest", str(dest), *extra],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, **(env or {})))
    if check:
        assert p.returncode == 0, p.stderr
    return p


def shards(dest):
    return sorted(Path(dest).glob("shard-*.tar"))


def read_with_tarfile(dest):
    got = {}
    per_shard = []
    for shard in shards(dest):
        keys = set()
        with tarfile.open(shard) as t:
            for m in t:
                assert m.isfile() and m.mode == 0o644 and m.uid == 0 and m.gid == 0 and m.mtime == 0, m
                assert m.name not in got, "%s twice" % m.name
                got[m.name] = t.extractfile(m).read()
                keys.add(sample_key(m.name))
        per_shard.append(keys)
    return got, per_shard


def test_a_packed_tree_reads_back_with_python_tarfile_and_gnu_tar(tree, tmp_path):
    root, files = tree
    dest = tmp_path / "out"
    p = pack(root, dest, "--shard-size", str(SHARD))
    assert "shards in" in p.stderr
    got, per_shard = read_with_tarfile(dest)
    assert got == files
    # A sample is never split across shards.
    for i, keys in enumerate(per_shard):
        for j in range(i):
            assert not keys & per_shard[j], (i, j, keys & per_shard[j])
    # A shard passes --shard-size only when it holds one sample larger than it.
    for shard, keys in zip(shards(dest), per_shard):
        assert shard.stat().st_size <= SHARD or len(keys) == 1, (shard, shard.stat().st_size, keys)
        assert (dest / (shard.name + ".idx")).read_bytes().startswith(b"ringfeed-tar-index 1\nshard_bytes %d\n" % shard.stat().st_size)
    assert len(shards(dest)) > 5
    # GNU tar lists every shard and extracts the same bytes.
    out = tmp_path / "gnu"
    out.mkdir()
    for shard in shards(dest):
        listed = subprocess.run(["tar", "-tvf", str(shard)], capture_output=True, timeout=60)
        assert listed.returncode == 0, listed.stderr
        x = subprocess.run(["tar", "-xf", str(shard), "-C", str(out)], capture_output=True, timeout=60)
        assert x.returncode == 0, x.stderr
    extracted = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert extracted == files


def test_the_same_tree_packs_to_byte_identical_shards(tree, tmp_path):
    root, _ = tree
    pack(root, tmp_path / "one", "--shard-size", str(SHARD))
    pack(root, tmp_path / "two", "--shard-size", str(SHARD))
    names = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert ".ringfeed-pack.plan" not in names, "a finished pack leaves only shards and indexes"
    assert names == sorted(p.name for p in (tmp_path / "two").iterdir())
    for name in names:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name


def test_pack_killed_mid_way_goes_on_without_rewriting_finished_shards_and_ends_identical(tree, tmp_path):
    root, _ = tree
    whole = tmp_path / "whole"
    pack(root, whole, "--shard-size", str(SHARD))
    dest = tmp_path / "killed"
    proc = subprocess.Popen([ringfeed_bin(), "pack", "--source", str(root), "--dest", str(dest), "--shard-size", str(SHARD)],
                            stderr=subprocess.PIPE, env=dict(os.environ, RINGFEED_PACK_TEST_MEMBER_DELAY_MS="10"))
    deadline = time.monotonic() + 60
    while not (dest / "shard-000003.tar.idx").exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "pack wrote no fourth shard in 60 s"
        time.sleep(0.01)
    time.sleep(0.05)  # into the next shard
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    done = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in shards(dest) if (dest / (p.name + ".idx")).exists()}
    total = len(shards(whole))
    assert 4 <= len(done) < total, (sorted(done), total)
    assert any(p.name.endswith(".tmp") for p in dest.iterdir()), "killed in the middle of a shard"
    p = pack(root, dest, "--shard-size", str(SHARD))
    assert "%d written now, %d kept" % (total - len(done), len(done)) in p.stderr, p.stderr
    for name, stamp in done.items():
        st = (dest / name).stat()
        assert (st.st_ino, st.st_mtime_ns) == stamp, "%s was rewritten" % name
    assert sorted(p.name for p in dest.iterdir()) == sorted(p.name for p in whole.iterdir())
    for f in whole.iterdir():
        assert (dest / f.name).read_bytes() == f.read_bytes(), f.name


def test_a_damaged_shard_of_a_finished_pack_is_named_and_written_again_once_deleted(tree, tmp_path):
    root, _ = tree
    dest = tmp_path / "out"
    pack(root, dest, "--shard-size", str(SHARD))
    whole = {p.name: p.read_bytes() for p in dest.iterdir()}
    with open(dest / "shard-000001.tar", "r+b") as f:
        f.truncate(1000)
    (dest / "shard-000002.tar.idx").unlink()
    p = pack(root, dest, "--shard-size", str(SHARD), check=False)
    assert p.returncode == 1 and "shard-000001.tar differs" in p.stderr, p.stderr
    (dest / "shard-000001.tar").unlink()
    p = pack(root, dest, "--shard-size", str(SHARD), check=False)
    assert p.returncode == 1 and "shard-000002.tar differs" in p.stderr, p.stderr
    (dest / "shard-000002.tar").unlink()
    p = pack(root, dest, "--shard-size", str(SHARD))
    assert "2 written now, %d kept" % (len(shards(dest)) - 2) in p.stderr, p.stderr
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == whole


def test_a_changed_input_or_shard_size_is_refused_naming_what_changed(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        (src / ("%d.bin" % i)).write_bytes(b"x" * i)
    dest = tmp_path / "out"
    # Interrupted: the plan is still there and names what changed.
    proc = subprocess.Popen([ringfeed_bin(), "pack", "--source", str(src), "--dest", str(dest), "--shard-size", "4KiB"],
                            stderr=subprocess.PIPE, env=dict(os.environ, RINGFEED_PACK_TEST_MEMBER_DELAY_MS="2000"))
    deadline = time.monotonic() + 30
    while not (dest / ".ringfeed-pack.plan").exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.01)
    proc.kill()
    proc.wait(timeout=10)
    (src / "9.bin").write_bytes(b"new")
    p = pack(src, dest, "--shard-size", "4KiB", check=False)
    assert p.returncode == 1
    assert "the input changed since" in p.stderr and "5 files of 10 bytes, now 6 files of 13 bytes" in p.stderr, p.stderr
    (src / "9.bin").unlink()
    p = pack(src, dest, "--shard-size", "16KiB", check=False)
    assert p.returncode == 1 and "--shard-size 4096" in p.stderr, p.stderr
    # Finished: DEST holds only shards and indexes (serve takes it as tar
    # shards), and a rerun over another input is refused by its shards.
    pack(src, dest, "--shard-size", "4KiB")
    assert all(p.name.startswith("shard-") for p in dest.iterdir()), sorted(dest.iterdir())
    (src / "0.bin").write_bytes(b"changed")
    p = pack(src, dest, "--shard-size", "4KiB", check=False)
    assert p.returncode == 1 and "already holds 2 shards, and they are not this input's" in p.stderr, p.stderr
    p = pack(src, dest, "--shard-size", "8KiB", check=False)
    assert p.returncode == 1 and "not this input's" in p.stderr, p.stderr
    p = pack(src, src / "inside", check=False)
    assert p.returncode == 1 and "is inside --source" in p.stderr, p.stderr
    assert not (src / "inside").exists()
    p = pack(tmp_path / "missing", dest, check=False)
    assert p.returncode == 1 and "does not exist" in p.stderr, p.stderr
    (tmp_path / "empty").mkdir()
    p = pack(tmp_path / "empty", tmp_path / "out2", check=False)
    assert p.returncode == 1 and "holds no files" in p.stderr, p.stderr
    p = pack(src, tmp_path / "out3", "--shard-size", "0", check=False)
    assert p.returncode == 1 and "--shard-size 0 is below 4096 bytes" in p.stderr, p.stderr
    p = pack(src, tmp_path / "out3", "--shard-size", "12 parsecs", check=False)
    assert p.returncode == 2 and "unknown unit" in p.stderr, p.stderr


def start_server(state, name="s3"):
    started = subprocess.run([str(SERVERS / "servers.sh"), "start", name, str(state)], capture_output=True, text=True,
                             timeout=180)
    if started.returncode != 0:
        if os.environ.get("RINGFEED_TEST_REQUIRE_REMOTE") == "1":
            pytest.fail(started.stderr[-600:])
        pytest.skip("cannot start the %s test server: %s" % (name, (started.stderr or started.stdout)[-600:]))
    env = {}
    for line in (state / ("%s.env" % name)).read_text().splitlines():
        words = shlex.split(line)
        if words[:1] == ["export"]:
            for word in words[1:]:
                key, _, value = word.partition("=")
                env[key] = value
    return env


def test_a_remote_source_packs_to_a_remote_dest_through_s3_as_a_local_tree_packs_locally(tree, tmp_path):
    # object_store's listing refuses a key with a newline ("illegal character
    # sequence"): that name stays out of the remote copy.
    _, files = tree
    root = tmp_path / "tree"
    for rel, data in files.items():
        if "\n" not in rel and rel.isprintable() and "\udce9" not in rel:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
    state = tmp_path / "servers"
    state.mkdir()
    env = start_server(state)
    try:
        import boto3
        s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                          aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
        seeded = subprocess.run([sys.executable, str(SERVERS / "seed.py"), "s3", "packed", str(root), "--prefix", "raw/"],
                                capture_output=True, text=True, timeout=120, env=dict(os.environ, **env))
        assert seeded.returncode == 0, seeded.stderr
        pack("s3://packed/raw/", "s3://packed/set/", "--shard-size", str(SHARD), env=env)
        local = tmp_path / "local"
        pack(root, local, "--shard-size", str(SHARD))
        names = sorted(p.name for p in local.iterdir())
        listed = sorted(o["Key"][len("set/"):] for o in s3.list_objects_v2(Bucket="packed", Prefix="set/")["Contents"])
        assert listed == names
        for name in names:
            if name == ".ringfeed-pack.plan":
                continue  # it names the source, and digests ETags instead of mtimes
            body = s3.get_object(Bucket="packed", Key="set/" + name)["Body"].read()
            assert body == (local / name).read_bytes(), name
        p = pack("s3://packed/raw/", "s3://packed/raw/shards/", env=env, check=False)
        assert p.returncode == 1 and "is inside --source" in p.stderr, p.stderr
        # A rerun keeps every shard.
        p = pack("s3://packed/raw/", "s3://packed/set/", "--shard-size", str(SHARD), env=env)
        assert "0 written now, %d kept" % len(shards(local)) in p.stderr, p.stderr
    finally:
        subprocess.run([str(SERVERS / "servers.sh"), "stop", "s3", str(state)], capture_output=True, timeout=60)


def test_a_webdav_dest_gets_the_shards_of_a_local_pack_put_whole(tree, tmp_path):
    root, _ = tree
    state = tmp_path / "servers"
    state.mkdir()
    env = start_server(state, "nginx")
    try:
        url = env["RINGFEED_TEST_NGINX_URL"].rstrip("/") + "/packed/"
        pack(root, url, "--shard-size", str(SHARD), env=env)
        local = tmp_path / "local"
        pack(root, local, "--shard-size", str(SHARD))
        served = Path(env["RINGFEED_TEST_NGINX_ROOT"]) / "packed"
        assert sorted(p.name for p in served.iterdir()) == sorted(p.name for p in local.iterdir())
        for f in local.iterdir():
            assert (served / f.name).read_bytes() == f.read_bytes(), f.name
        p = pack(root, url, "--shard-size", str(SHARD), env=env)
        assert "0 written now, %d kept" % len(shards(local)) in p.stderr, p.stderr
    finally:
        subprocess.run([str(SERVERS / "servers.sh"), "stop", "nginx", str(state)], capture_output=True, timeout=60)


def serves_tar_shards():
    """Whether this build's serve reads tar shards (the tar source, issue 23)."""
    p = subprocess.run([ringfeed_bin(), "serve", "--help"], capture_output=True, text=True, timeout=30)
    return "--format" in p.stdout


def serve_and_read(source, mode, seed, *flags, epochs=2, world=2, batch=4):
    from e2e_util import kill_survivors, python_consumer, wait_all
    name = "pack-%s-%d-%d" % (mode, os.getpid(), time.monotonic_ns() % 10**9)
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(source), "--name", name, "--batch-size", str(batch),
         "--world-size", str(world), "--epochs", str(epochs), "--seed", str(seed), "--manifest-cache", "off", *flags],
        stderr=subprocess.PIPE)
    try:
        procs = [subprocess.Popen(python_consumer("field_consumer.py", name, r, mode), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE) for r in range(world)]
        results = wait_all(procs, timeout=120)
        _, err = loader.communicate(timeout=30)
        assert loader.returncode == 0, err.decode()
    finally:
        kill_survivors([loader])
    rows = []
    for rank, (rc, out, err) in enumerate(results):
        assert rc == 0, "rank %d: %s" % (rank, err.decode())
        rows += [(rank,) + tuple(int(x) for x in line.split()) for line in out.decode().splitlines()]
    return sorted(rows)


def test_serving_the_packed_shards_gives_the_samples_of_serving_the_raw_tree(tmp_path):
    if not serves_tar_shards():
        pytest.skip("this build's serve does not read tar shards yet (the tar source of issue 23)")
    # One file per sample: nested directories, odd names, empty files, and
    # names whose byte order is not a per-directory walk's ("a.b" < "a/b").
    src = tmp_path / "src"
    names = ["d%d/e%d/%04d.bin" % (i % 3, i % 2, i) for i in range(150)]
    names += ["a.b", "a/b", "Z", "a-", "caf\u00e9.bin", "sp ace.txt", "100%.txt", "l" * 140 + ".txt", "empty"]
    for i, rel in enumerate(names):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(os.urandom(0 if rel == "empty" else (i * 131) % 3000))
    dest = tmp_path / "packed"
    pack(src, dest, "--shard-size", "32KiB")
    assert len(shards(dest)) > 3
    for seed, flags in [(5, ()), (6, ("--shuffle", "block", "--shuffle-block", "16", "--shuffle-window", "2"))]:
        raw = serve_and_read(src, "raw", seed, *flags)
        packed = serve_and_read(dest, "tar", seed, *flags)
        assert len(raw) == 2 * (len(names) // 8) * 8
        assert packed == raw


def test_a_file_larger_than_the_read_ahead_is_streamed_in_bounded_memory(tmp_path):
    import zlib
    src = tmp_path / "src"
    src.mkdir()
    big = 100 << 20
    with open(src / "big.bin", "wb") as f:  # sparse but for its ends
        f.write(b"head")
        f.seek(big - 4)
        f.write(b"tail")
    (src / "small.txt").write_bytes(b"small")
    # The peak of pack alone: ru_maxrss of a child forked from this test
    # process counts the pages it shared with it before exec (hundreds of
    # MiB once torch is imported in the same pytest run), so a fresh small
    # interpreter forks and execs pack and reports its child's ru_maxrss.
    measure = ("import os, sys\n"
               "pid = os.fork()\n"
               "if pid == 0:\n"
               "    os.execv(sys.argv[1], sys.argv[1:])\n"
               "_, status, usage = os.wait4(pid, 0)\n"
               "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)\n")
    out = subprocess.run([sys.executable, "-c", measure, ringfeed_bin(), "pack", "--source", str(src),
                          "--dest", str(tmp_path / "out"), "--shard-size", "1MiB"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=300).stdout.split()
    assert out and out[0] == "0", out
    rss_kib = int(out[1])
    assert rss_kib < 80 << 10, "pack held %d KiB for a 100 MiB file" % rss_kib
    got = {}
    for shard in shards(tmp_path / "out"):
        with tarfile.open(shard) as t:
            for m in t:
                crc, f = 0, t.extractfile(m)
                while chunk := f.read(1 << 20):
                    crc = zlib.crc32(chunk, crc)
                got[m.name] = (m.size, crc)
    with open(src / "big.bin", "rb") as f:
        crc = 0
        while chunk := f.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    assert got == {"big.bin": (big, crc), "small.txt": (5, zlib.crc32(b"small"))}


def test_a_file_changed_in_place_while_packing_stops_the_run_naming_it(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(300):
        (src / ("%03d.bin" % i)).write_bytes(b"%03d" % i)
    dest = tmp_path / "out"
    # Reads run up to 128 files ahead of the writer, which sleeps 20 ms a
    # member here: the last file is read seconds after the run starts.
    proc = subprocess.Popen([ringfeed_bin(), "pack", "--source", str(src), "--dest", str(dest), "--shard-size", "8KiB"],
                            stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, RINGFEED_PACK_TEST_MEMBER_DELAY_MS="20"))
    deadline = time.monotonic() + 30
    while not (dest / ".ringfeed-pack.plan").exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.01)
    os.utime(src / "299.bin", ns=(0, 123_456_789))  # same size, same bytes: only its mtime moves
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "299.bin changed while packing (its mtime moved" in err, err
    assert not list(dest.glob(".*.tmp")), "the shard being written was abandoned"


# Issue 32: pack as root beside other users.

def _victim(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's secret, not for shards")
    os.chmod(victim, 0o600)
    os.chmod(tmp_path, 0o755)  # nobody may name it in a link (links need no access anyway)
    return victim


def _small_tree(root, n=60):
    root.mkdir(mode=0o755)
    for i in range(n):
        (root / ("%03d.bin" % i)).write_bytes(b"%03d" % i * 100)
        os.chmod(root / ("%03d.bin" % i), 0o644)


# Run as nobody: plants a link to argv[2] at every temporary name of the old
# pack in DEST argv[1], over and over, until killed.
PLANTER = """
import os, sys
dest, victim = sys.argv[1], sys.argv[2]
while True:
    for n in range(400):
        for suffix in (".tar.tmp", ".tar.idx.tmp"):
            try:
                os.symlink(victim, os.path.join(dest, ".shard-%06d%s" % (n, suffix)))
            except OSError:
                pass
"""


def test_pack_into_a_shared_sticky_dest_never_writes_through_links_another_user_planted(tmp_path, sticky_shared_dir):
    need_root_and_setpriv()
    victim = _victim(tmp_path)
    src = tmp_path / "src"
    _small_tree(src, n=600)
    dest = sticky_shared_dir / "out"
    dest.mkdir()
    os.chmod(dest, 0o1777)
    # Every name the old pack used for its temporaries, planted for each shard
    # before it starts (the old pack cleared those at its start)...
    as_nobody("cd %s; for i in $(seq 0 40); do n=$(printf %%06d $i);"
               " ln -s %s .shard-$n.tar.tmp; ln -s %s .shard-$n.tar.idx.tmp; done;"
               " ln -s %s ..ringfeed-pack.plan.tmp" % (shlex.quote(str(dest)), victim, victim, victim))
    # ...and planted again and again while it runs, for the shards still to
    # come: the old pack wrote the victim and published links as shards.
    planter = subprocess.Popen(NOBODY + ["/usr/bin/python3", "-c", PLANTER, str(dest), str(victim)])
    try:
        time.sleep(0.3)
        p = pack(src, dest, "--shard-size", "8KiB")
    finally:
        planter.kill()
        planter.wait(timeout=10)
    assert victim.read_bytes() == b"root's secret, not for shards"
    published = sorted(dest.glob("shard-*"))
    assert len(published) >= 60, published
    for f in published:
        st = os.lstat(f)
        assert not os.path.islink(f) and st.st_uid == 0, (f, st)
    members = sum(len(tarfile.open(s).getnames()) for s in shards(dest))
    assert members == 600
    # The planted links are left as they were, and nothing was read through them.
    assert os.path.islink(dest / ".shard-000001.tar.tmp")


def test_a_world_writable_dest_without_the_sticky_bit_is_refused(tmp_path, sticky_shared_dir):
    src = tmp_path / "src"
    _small_tree(src, n=4)
    dest = sticky_shared_dir / "open"
    dest.mkdir()
    os.chmod(dest, 0o777)
    p = pack(src, dest, check=False)
    assert p.returncode == 1, p.stderr
    assert "writable by every user and not sticky (mode 0777)" in p.stderr, p.stderr
    assert "chmod +t" in p.stderr
    assert not list(dest.iterdir())


def test_a_plan_or_shard_planted_by_another_user_in_dest_is_not_trusted(tmp_path, sticky_shared_dir):
    need_root_and_setpriv()
    victim = _victim(tmp_path)
    src = tmp_path / "src"
    _small_tree(src, n=8)
    dest = sticky_shared_dir / "out"
    dest.mkdir()
    os.chmod(dest, 0o1777)
    as_nobody("printf 'forged plan' > %s/.ringfeed-pack.plan" % shlex.quote(str(dest)))
    p = pack(src, dest, check=False)
    assert p.returncode == 1, p.stderr
    assert ".ringfeed-pack.plan belongs to uid 65534" in p.stderr and "not trusted" in p.stderr, p.stderr
    os.unlink(dest / ".ringfeed-pack.plan")
    as_nobody("ln -s /dev/zero %s/shard-000000.tar" % shlex.quote(str(dest)))
    p = pack(src, dest, check=False)
    assert p.returncode == 1, p.stderr
    assert "shard-000000.tar is not a regular file (a symlink)" in p.stderr, p.stderr
    assert victim.read_bytes() == b"root's secret, not for shards"


def test_a_link_out_of_the_source_is_skipped_naming_it_unless_asked_for(tmp_path, sticky_shared_dir):
    need_root_and_setpriv()
    victim = _victim(tmp_path)
    src = sticky_shared_dir / "src"
    _small_tree(src, n=4)
    os.chmod(src, 0o777)
    (src / "inside.txt").write_bytes(b"inside")
    os.symlink("inside.txt", src / "ok-link.txt")  # inside the source: packed
    as_nobody("ln -s %s %s/leak.txt; ln -s %s %s/leak2.txt" % (victim, src, victim, src))
    out = tmp_path / "out"
    p = pack(src, out)
    assert "skipped 2 link(s) to files outside it (%s/leak.txt, %s/leak2.txt)" % (src, src) in p.stderr, p.stderr
    assert "--follow-links-outside" in p.stderr
    names = [n for s in shards(out) for n in tarfile.open(s).getnames()]
    assert "ok-link.txt" in names and "leak.txt" not in names, names
    assert all(b"root's secret" not in s.read_bytes() for s in shards(out))
    # Asked for: followed (root packs what root may read).
    out2 = tmp_path / "out2"
    p = pack(src, out2, "--follow-links-outside")
    names = [n for s in shards(out2) for n in tarfile.open(s).getnames()]
    assert "leak.txt" in names and "skipped" not in p.stderr, (names, p.stderr)
    # A source file only its owner may read: the shards are 0600 too.
    for s in shards(out2):
        assert os.stat(s).st_mode & 0o777 == 0o600, oct(os.stat(s).st_mode)
    for s in shards(out):
        assert os.stat(s).st_mode & 0o777 == 0o644, oct(os.stat(s).st_mode)


def test_a_dest_inside_the_source_through_dotdot_is_refused_before_it_is_made(tmp_path):
    src = tmp_path / "src"
    _small_tree(src, n=2)
    (tmp_path / "other").mkdir()
    p = pack(src, "%s/other/../src/x" % tmp_path, check=False)
    assert p.returncode == 1, p.stderr
    assert "is inside --source" in p.stderr, p.stderr
    assert not (src / "x").exists(), "x was created inside SRC"
