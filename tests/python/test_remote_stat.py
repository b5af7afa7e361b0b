"""`ringfeed stat` on a loader serving a remote prefix shows the remote
engine's figures from the ring header's counters block (docs/ring-layout.md,
"Loader counters"): GETs, bytes, latency, retries by cause.

nginx with WebDAV behind tests/faultproxy answering 30% of GETs 503, so that
retries show. Skips when nginx is not installed (RINGFEED_TEST_REQUIRE_REMOTE=1
makes that a failure).
"""
import os
import re
import subprocess
import time
import uuid
from pathlib import Path

from e2e_util import kill_survivors, ringfeed_bin
from remote_util import FaultProxy
from test_remote_manifest_cache import nginx, prefix  # noqa: F401  (fixtures)


def test_stat_on_a_running_remote_loader_shows_gets_bytes_latency_and_retries(prefix, tmp_path):
    source, _, env = prefix
    upstream = source.split("://", 1)[1].split("/", 1)[0]
    proxy = FaultProxy(upstream, ["--methods", "GET", "--error-503", "0.3", "--seed", "7"], tmp_path)
    name = "rstat-%s" % uuid.uuid4().hex[:8]
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", source.replace(upstream, "127.0.0.1:%d" % proxy.port),
         "--name", name, "--batch-size", "4", "--world-size", "1", "--manifest-cache", "off", "--cache", "off"],
        stderr=subprocess.PIPE, env=dict(os.environ, **env),
    )
    try:
        # No trainer: the loader fills its slots, then waits; its counters stay.
        deadline = time.monotonic() + 60
        out = ""
        while time.monotonic() < deadline:
            stat = subprocess.run([ringfeed_bin(), "stat", name, "--once", "--interval", "0.2"],
                                  capture_output=True, text=True, timeout=30)
            out = stat.stdout
            m = re.search(r"remote: (\d+) GETs in flight .* (\d+) GETs, (\S+ \S+) received, "
                          r"GET latency p50 ([\d.]+) ms p99 ([\d.]+) ms, retries: (.*)", out)
            if m and int(m.group(2)) >= 8 and "throttled" in m.group(6):
                break
            time.sleep(0.2)
        assert m, out
        assert int(m.group(2)) >= 8, out
        assert not m.group(3).startswith("0 "), out
        assert float(m.group(4)) > 0 and float(m.group(5)) >= float(m.group(4)), out
        assert re.search(r"throttled \(429/503\) \d+", m.group(6)), out
        assert "cache:" not in out, "no disk cache, no cache line: " + out
    finally:
        kill_survivors([loader])
        proxy.stop()


def test_stat_shows_the_disk_cache_hits_misses_and_bytes_of_a_cached_remote_loader(prefix, tmp_path):
    source, _, env = prefix
    name = "rstatc-%s" % uuid.uuid4().hex[:8]
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", source, "--name", name, "--batch-size", "4", "--world-size", "1",
         "--manifest-cache", "off", "--cache-dir", str(tmp_path / "c")],
        stderr=subprocess.PIPE, env=dict(os.environ, **env),
    )
    try:
        # No trainer: the loader fills its slots from remote (misses), then waits.
        deadline = time.monotonic() + 60
        out, m = "", None
        while time.monotonic() < deadline:
            stat = subprocess.run([ringfeed_bin(), "stat", name, "--once", "--interval", "0.2"],
                                  capture_output=True, text=True, timeout=30)
            out = stat.stdout
            m = re.search(r"cache: \S+ hits \((\d+) hits, (\d+) misses\), (\S+ \S+) from cache, (\S+ \S+) from remote", out)
            if m and int(m.group(2)) >= 4:
                break
            time.sleep(0.2)
        assert m, out
        assert int(m.group(1)) == 0 and int(m.group(2)) >= 4, "a fresh cache: every read a miss: " + out
        assert not m.group(4).startswith("0 "), out
    finally:
        kill_survivors([loader])
