"""The manifest cache through `ringfeed serve`: a second start takes the
manifest from the cache, a changed tree is listed again, and a file changed
in place (which the cache cannot see past a few thousand files) stops the
loader with its path and removes the cache entry, so the next start lists."""
import os
import shutil
import re
import subprocess
import time
import uuid

import pytest

from e2e_util import ringfeed_bin, serve_until_serving

# Directories changed less than this before a listing are not cached (the
# loader's default window is 2 s).
RACY_WINDOW_S = 2.1
# Past this many files (the loader's default) only directories are checked.
STAT_FILES_MAX = 4096


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    """Datasets made together, then old enough to be cached; one per test."""
    smalls = []
    for t in range(3):
        small = tmp_path_factory.mktemp("small")
        for i in range(10):
            sub = small / ("d%d" % (i % 3))
            sub.mkdir(exist_ok=True)
            (sub / ("f%02d" % i)).write_bytes(b"s" * (100 + i))
        smalls.append(small)
    big = tmp_path_factory.mktemp("big")
    for i in range(STAT_FILES_MAX + 4):
        (big / ("f%05d" % i)).write_bytes(b"b" * 10)
    time.sleep(RACY_WINDOW_S)
    return smalls, big


def start(source, *extra, batch_size=2):
    """Runs serve until it serves, then stops it with SIGINT; returns its
    manifest line and all it logged."""
    name = "e2e-cache-%s" % uuid.uuid4().hex[:8]
    _, text = serve_until_serving(["--source", str(source), "--name", name, "--batch-size", str(batch_size), "--world-size", "1"] + list(extra))
    manifest = [l for l in text.splitlines(keepends=True) if l.startswith("ringfeed: manifest:")]
    assert manifest, "no manifest line; stderr:\n" + text
    return manifest[0], text


def cache_path(line):
    """The cache file a manifest line names (read from or written to)."""
    m = re.search(r"(/\S+\.manifest)\b", line)
    assert m, line
    return m.group(1)


def test_a_second_start_takes_the_manifest_from_the_cache_and_a_new_file_is_listed(trees):
    small = trees[0][0]
    line, _ = start(small)
    assert "10 samples" in line and "listed (cached in " in line, line
    cache_file = line.split("cached in ")[1].split(")")[0]
    assert cache_file.startswith(os.environ["RINGFEED_CACHE_DIR"]), cache_file
    line, _ = start(small)
    assert "10 samples" in line and "from the cache" in line and "4 directories and 10 file sizes unchanged" in line, line

    (small / "d1" / "new").write_bytes(b"n")
    line, _ = start(small)
    assert "11 samples" in line and "listed" in line, line


def test_off_and_refresh(trees):
    small = trees[0][1]
    line, _ = start(small, "--manifest-cache", "off")
    assert "listed (manifest cache off)" in line, line
    line, _ = start(small)
    assert "no cached manifest" in line or "listed (cached in " in line, line
    cache_file = line.split("cached in ")[1].split(")")[0]
    os.remove(cache_file)
    line, _ = start(small, "--manifest-cache", "off")
    assert not os.path.exists(cache_file), "--manifest-cache off wrote " + cache_file
    line, _ = start(small, "--manifest-cache", "refresh")
    assert "listed (cached in " in line, line
    line, _ = start(small)
    assert "from the cache" in line, line


def test_a_file_changed_in_place_stops_the_loader_and_the_next_start_lists_again(trees):
    _, big = trees
    line, _ = start(big, "--no-shuffle")
    cache_file = line.split("cached in ")[1].split(")")[0]
    line, _ = start(big, "--no-shuffle")
    # Too many files to check each one: only the directory is.
    assert "from the cache" in line and "(1 directories unchanged)" in line, line
    # Same path, same inode, another size: no directory changes.
    (big / "f00000").write_bytes(b"longer than ten bytes")
    name = "e2e-cache-%s" % uuid.uuid4().hex[:8]
    run = subprocess.run(
        [ringfeed_bin(), "serve", "--source", str(big), "--name", name, "--batch-size", "2", "--world-size", "1", "--no-shuffle"],
        stderr=subprocess.PIPE, text=True, timeout=30,
    )
    assert run.returncode != 0, run.stderr
    assert str(big / "f00000") in run.stderr and "changed size" in run.stderr, run.stderr
    assert "this run's manifest came from the cache %s, which is now removed, so the next start lists the dataset again" % cache_file in run.stderr, run.stderr
    line, _ = start(big, "--no-shuffle")
    assert "listed" in line, line


def test_gc_removes_the_cached_manifest_of_a_directory_that_is_gone(trees):
    small = trees[0][2]
    line, _ = start(small)
    cache_file = line.split("cached in ")[1].split(")")[0]
    assert os.path.exists(cache_file)
    for d in sorted(small.rglob("*"), reverse=True):
        d.rmdir() if d.is_dir() else d.unlink()
    small.rmdir()
    kept = cache_path(start(trees[0][1])[0])
    assert os.path.exists(kept), kept
    out = subprocess.run([ringfeed_bin(), "gc"], stdout=subprocess.PIPE, text=True, timeout=20).stdout
    assert "removed %s: %s no longer exists" % (cache_file, small) in out, out
    assert not os.path.exists(cache_file)
    # The cache of a directory that is still there stays.
    assert os.path.exists(kept), out
    assert kept not in out, out


def test_gc_removes_the_cached_manifest_of_a_directory_now_a_file_or_under_one(tmp_path):
    # The listed directory replaced by a file; another's parent replaced by
    # a file (ENOTDIR): both are gone, as a missing one is.
    roots = [tmp_path / "a" / "data", tmp_path / "b" / "data"]
    for root in roots:
        root.mkdir(parents=True)
        for i in range(3):
            (root / ("f%d" % i)).write_bytes(b"g" * 10)
    time.sleep(RACY_WINDOW_S)  # old enough to be cached
    caches = [cache_path(start(root)[0]) for root in roots]
    shutil.rmtree(roots[0])
    roots[0].write_bytes(b"now a file")
    shutil.rmtree(roots[1].parent)
    roots[1].parent.write_bytes(b"now a file")
    out = subprocess.run([ringfeed_bin(), "gc"], stdout=subprocess.PIPE, text=True, timeout=20).stdout
    assert "removed %s: %s is now a file" % (caches[0], roots[0]) in out, out
    assert "removed %s: %s no longer exists" % (caches[1], roots[1]) in out, out
    assert not any(os.path.exists(c) for c in caches), out


def test_an_unusable_cache_dir_is_one_warning_naming_it_and_serving_goes_on(tmp_path):
    source = tmp_path / "data"
    source.mkdir()
    for i in range(4):
        (source / ("f%d" % i)).write_bytes(b"u" * 100)
    time.sleep(RACY_WINDOW_S)  # old enough to be stored: the store is what fails
    not_a_dir = tmp_path / "not-a-dir"
    not_a_dir.write_bytes(b"")
    line, stderr = start(source, "--cache-dir", str(not_a_dir))
    assert "listed" in line, stderr
    warnings = [l for l in stderr.splitlines() if "WARN" in l]
    assert len(warnings) == 1 and "cannot write the manifest cache" in warnings[0] and str(not_a_dir) in warnings[0], stderr


def test_with_record_bytes_a_count_from_a_stale_cache_is_listed_again_before_it_is_reported(tmp_path):
    """With --record-bytes the number of samples comes from file sizes, which
    the cache cannot see past a few thousand files: a plan that fails on the
    cached count (too few samples for one step) must list again first."""
    big = tmp_path / "records"
    big.mkdir()
    n = STAT_FILES_MAX + 4
    for i in range(n):
        (big / ("f%05d" % i)).write_bytes(b"r" * 10)
    time.sleep(RACY_WINDOW_S)
    line, _ = start(big, "--record-bytes", "10")
    assert "%d samples" % n in line and "listed (cached in " in line, line
    for i in range(n):  # one more record in every file; the directory is unchanged
        with open(big / ("f%05d" % i), "ab") as f:
            f.write(b"r" * 10)
    _, text = start(big, "--record-bytes", "10", batch_size=n + 10)
    assert "ringfeed: error" not in text, text
    assert "manifest: %d samples" % (2 * n) in text and "ringfeed: serving" in text, text
