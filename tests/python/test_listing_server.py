"""The parallel listing against a server whose only cost is latency
(tests/servers/listserver.py: real HTTP, real ListObjectsV2 pages and continuation
tokens): for every key shape, the parallel listing gives exactly the keys and sizes of
the sequential one, and exactly the keys the server holds. The figures at 1M keys and
20 ms are bench/list_bench.py's; this checks correctness at 100k keys and 2 ms.
"""
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "tests" / "servers" / "listserver.py"
KEYS = 100_000
SHAPES = ("seq", "hex", "nested", "skewed")


def remote_list_bin():
    lib_dir = os.environ.get("RINGFEED_LIB_DIR") or str(ROOT / "target" / "release")
    path = Path(lib_dir) / "examples" / "remote_list"
    if not path.exists():
        pytest.skip("%s is not built: cargo build --release --example remote_list" % path)
    return str(path)


def start_listserver(shape, keys, delay_ms):
    """Starts the server; returns (process, port). The caller stops it."""
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--keys", str(keys), "--shape", shape, "--delay-ms", str(delay_ms)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    line = proc.stdout.readline()
    match = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
    if not match:
        proc.kill()
        proc.wait()
        pytest.fail("listserver did not start: %r" % line)
    return proc, int(match.group(1))


def s3_env(port):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("AWS_", "AZURE_", "GOOGLE_")):
            del env[k]
    env.update(
        AWS_ENDPOINT_URL="http://127.0.0.1:%d" % port, AWS_ALLOW_HTTP="true", AWS_ACCESS_KEY_ID="listtest",
        AWS_SECRET_ACCESS_KEY="listtestsecret", AWS_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true",
    )
    return env


@pytest.mark.parametrize("shape", SHAPES)
def test_parallel_listing_gives_exactly_the_sequential_listing_for_every_key_shape(shape):
    binary = remote_list_bin()
    proc, port = start_listserver(shape, KEYS, 2)
    try:
        t = time.monotonic()
        run = subprocess.run([binary, "s3://list/data/", "--workers", "64"], env=s3_env(port),
                             capture_output=True, text=True, timeout=300)
        took = time.monotonic() - t
    finally:
        proc.kill()
        proc.wait()
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert "sequential: %d keys" % KEYS in out, out
    assert "parallel (64 workers): %d keys" % KEYS in out, out
    assert "identical listings" in out, out
    print("%s: %s (%.1f s)" % (shape, out.strip().splitlines()[-1], took))
