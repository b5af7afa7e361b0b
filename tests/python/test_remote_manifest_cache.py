"""A remote prefix's listing in the manifest cache (docs/manifest.md, "Remote
prefixes"): a second start serves from the cached listing at once and lists
again in the background; an object added between two runs is caught by that
re-list, which stops the run, names the key and removes the cache file; a
listing older than --manifest-max-age is listed again before serving.

Against nginx with WebDAV (tests/servers/servers.sh), which skips when it is
not installed (RINGFEED_TEST_REQUIRE_REMOTE=1 makes that a failure).
"""
import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from e2e_util import kill_survivors, python_consumer, ringfeed_bin, wait_all
from test_remote_serve import start_server, SERVERS

FILES = 40


@pytest.fixture
def nginx(tmp_path):
    state = tmp_path / "servers"
    state.mkdir()
    env = start_server(state, "nginx")
    yield env
    subprocess.run([str(SERVERS / "servers.sh"), "stop", "nginx", str(state)], capture_output=True, timeout=60)


@pytest.fixture
def prefix(nginx, tmp_path):
    """A fresh prefix on nginx of FILES small files; (URL, its directory, env)."""
    root = Path(nginx["RINGFEED_TEST_NGINX_ROOT"]) / ("set-%s" % uuid.uuid4().hex[:8])
    for i in range(FILES):
        p = root / ("d%d" % (i % 3)) / ("f%03d.bin" % i)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(bytes([i]) * (100 + i))
    # Each test gets a cache directory of its own.
    env = dict(nginx, RINGFEED_CACHE_DIR=str(tmp_path / "cache"))
    return nginx["RINGFEED_TEST_NGINX_URL"].rstrip("/") + "/" + root.name + "/", root, env


def serve(source, env, *flags, consume=True, timeout=60):
    """Runs `serve` with one rank (consumed by a Python rank unless
    `consume` is false); returns (exit code, loader log)."""
    name = "rcache-%s" % uuid.uuid4().hex[:8]
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", source, "--name", name, "--batch-size", "4",
         "--world-size", "1", "--seed", "3", *flags],
        stderr=subprocess.PIPE, env=dict(os.environ, **env),
    )
    procs = [subprocess.Popen(python_consumer("hash_consumer.py", name, 0), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)] if consume else []
    try:
        if procs:
            (rc, _, perr), = wait_all(procs, timeout=timeout)
        _, err = loader.communicate(timeout=timeout)
    finally:
        kill_survivors([loader] + procs)
    log = err.decode()
    if procs and loader.returncode == 0:
        assert rc == 0, perr.decode() + log
    return loader.returncode, log


def cache_file_of(log):
    m = re.search(r"(?:cached in|from the cache) (\S+\.manifest)", log)
    assert m, log
    return m.group(1)


def test_a_second_start_serves_from_the_cached_listing_and_relists_in_the_background(prefix):
    source, _, env = prefix
    rc, first = serve(source, env)
    assert rc == 0, first
    assert "listed (cached in" in first, first
    cache_file = cache_file_of(first)
    assert os.path.exists(cache_file)
    stamp = os.stat(cache_file).st_mtime_ns
    rc, second = serve(source, env, "--epochs", "200")
    assert rc == 0, second
    assert "from the cache %s (listed" % cache_file in second, second
    assert "listing again in the background" in second, second
    assert "%d samples in %d files" % (FILES, FILES) in second, second
    # The background re-list found the prefix unchanged and refreshed the file.
    assert re.search(r"listed \S+ again in the background: unchanged, %d objects" % FILES, second), second
    assert os.stat(cache_file).st_mtime_ns != stamp


def test_an_object_added_between_runs_is_caught_by_the_background_relist(prefix):
    source, root, env = prefix
    rc, first = serve(source, env)
    assert rc == 0, first
    cache_file = cache_file_of(first)
    (root / "d1" / "new.bin").write_bytes(b"added after the listing")
    # No trainer: the loader waits with its slots full until the re-list stops it.
    rc, log = serve(source, env, consume=False)
    assert rc != 0, log
    assert "from the cache" in log, log
    assert "changed since its cached listing" in log and "d1/new.bin added" in log, log
    assert "is removed" in log and "start again" in log, log
    assert not os.path.exists(cache_file), "the stale cache file was kept"
    # The next start lists the changed prefix, and serves it.
    rc, again = serve(source, env)
    assert rc == 0, again
    assert "listed (cached in" in again and "%d samples" % (FILES + 1) in again, again


def test_a_listing_past_the_max_age_is_listed_again_and_zero_always_lists(prefix):
    source, _, env = prefix
    rc, first = serve(source, env)
    assert rc == 0, first
    time.sleep(2.2)
    rc, expired = serve(source, env, "--manifest-max-age", "1s")
    assert rc == 0, expired
    assert "past --manifest-max-age 1 s" in expired and "listed (cached in" in expired, expired
    rc, always = serve(source, env, "--manifest-max-age", "0")
    assert rc == 0, always
    assert "--manifest-max-age 0: a remote prefix is listed at every start" in always, always
    rc, bad = serve(source, env, "--manifest-max-age", "5x", consume=False)
    assert rc != 0 and "--manifest-max-age" in bad and "30m or 1h" in bad, bad


def test_a_cached_start_serves_with_no_listing_request_before_its_first_batch(prefix, tmp_path):
    """Listed once through a clean proxy; then a proxy on the same port
    refuses every PROPFIND (the WebDAV listing): a start from the cache
    still serves every sample, so it listed nothing before serving."""
    from remote_util import FaultProxy

    source, _, env = prefix
    upstream = source.split("://", 1)[1].split("/", 1)[0]
    (tmp_path / "clean").mkdir()
    clean = FaultProxy(upstream, [], tmp_path / "clean")
    port = clean.port
    proxied = source.replace(upstream, "127.0.0.1:%d" % port)
    try:
        rc, first = serve(proxied, env)
        assert rc == 0 and "listed (cached in" in first, first
    finally:
        clean.stop()
    (tmp_path / "refusing").mkdir()
    refusing = FaultProxy(upstream, ["--listen", "127.0.0.1:%d" % port, "--methods", "PROPFIND", "--error-503", "1"],
                          tmp_path / "refusing")
    try:
        rc, cached = serve(proxied, env, "--manifest-max-age", "1h")
        assert rc == 0, cached
        assert "from the cache" in cached and "%d samples" % FILES in cached, cached
        # The same proxy makes a listing fail, so the one above made none.
        rc, listed = serve(proxied, env, "--manifest-max-age", "0", consume=False, timeout=120)
        assert rc != 0 and "503" in listed, listed
    finally:
        refusing.stop()


def test_an_object_changed_between_runs_stops_the_run_and_removes_the_cache(prefix):
    """Whether a read (If-Match, 412) or the background re-list sees it
    first, a changed object stops the run naming it, and the cache entry
    goes, so the next start lists the prefix afresh."""
    source, root, env = prefix
    rc, first = serve(source, env)
    assert rc == 0, first
    cache_file = cache_file_of(first)
    changed = root / "d0" / "f000.bin"
    changed.write_bytes(b"rewritten with another size")
    rc, log = serve(source, env, "--no-shuffle")
    assert rc != 0, log
    assert "d0/f000.bin" in log and "changed" in log, log
    assert not os.path.exists(cache_file), "the stale cache file was kept: " + log
    rc, again = serve(source, env)
    assert rc == 0 and "listed (cached in" in again, again
