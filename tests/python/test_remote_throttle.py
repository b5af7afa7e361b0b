"""Several loaders against one throttling store, and one loader against a
store that holds some answers (issue 40, items 1 and 2): nginx behind
tests/faultproxy (`--rate`: a token bucket answering the rest 503 SlowDown;
`--stall`: answers held before their body). What is asserted is what must
hold on any machine: every object exactly once with its bytes, the rate
limit set by the 503s, hedges sent, won and kept within their budget. The
figures (goodput, requests per object, the held epoch against the clean
one) are bench/throttle_bench.py's to print.

Run them against another build with RINGFEED_BIN and RINGFEED_LIB (the
binding of this checkout is used either way)."""

import os
import tempfile
from pathlib import Path

import pytest

import throttle_util as tu
from e2e_util import ringfeed_bin
from remote_util import faultproxy_bin, need_server

OBJECTS = 2400
OBJECT_BYTES = 8192
# The budget of hedges: 16 at once, then one per 20 answers (remote/hedge.rs).
HEDGE_BURST = 16
HEDGE_FRACTION = 0.05


@pytest.fixture(scope="module")
def store():
    """(nginx HOST:PORT, {index: (len, crc32)}) with the objects under set-<pid>/."""
    url = need_server("nginx")
    root = os.environ["RINGFEED_TEST_NGINX_ROOT"]
    prefix = "throttle-%d-%s" % (os.getpid(), os.urandom(3).hex())
    crcs = tu.seed_objects(root, prefix, OBJECTS, OBJECT_BYTES)
    return url.split("//")[1].rstrip("/"), prefix, crcs


def lib():
    return os.environ.get("RINGFEED_LIB") or str(Path(ringfeed_bin()).parent / "libringfeed.so")


def test_three_loaders_on_one_throttled_bucket_serve_every_object_once_under_a_rate_limit(store):
    nginx, prefix, crcs = store
    with tempfile.TemporaryDirectory() as work:
        proxy = tu.Proxy(faultproxy_bin(), nginx, ["--rtt-ms", "10", "--rate", "1200"], work)
        try:
            source = "http://127.0.0.1:%d/%s/" % (proxy.port, prefix)
            result = tu.run_loaders(ringfeed_bin(), lib(), source, 3, metrics=True)
            counters = proxy.counters()
        finally:
            proxy.stop()
    wrong = tu.check_exactly_once(result, crcs)
    assert not wrong, "\n".join(wrong)
    assert counters["rate_limited"] > 0, "the bucket never refused: the test throttles nothing (%s)" % counters
    for i, l in enumerate(result["loaders"]):
        limit = tu.scraped(l["scrape"], "ringfeed_remote_rate_limit")
        cuts = tu.scraped(l["scrape"], "ringfeed_remote_rate_cuts_total")
        assert limit is not None and limit > 0, "loader %d: no rate limit after the store's 503s: %s" % (i, l["scrape"])
        assert cuts is not None and cuts >= 1, "loader %d: the 503s cut nothing" % i
    served = counters["requests"] - counters["rate_limited"]
    print("3 loaders at 1200/s: %.2f s, %d requests (%d refused), %.3f per object, served %d" % (
        result["secs"], counters["requests"], counters["rate_limited"], counters["requests"] / (3 * OBJECTS), served))


def test_answers_held_before_their_body_are_hedged_and_every_object_comes_once(store):
    nginx, prefix, crcs = store
    flags = ["--rtt-ms", "10", "--stall", "0.02", "--stall-ms", "2000", "--methods", "GET", "--seed", "3"]
    with tempfile.TemporaryDirectory() as work:
        proxy = tu.Proxy(faultproxy_bin(), nginx, flags, work)
        try:
            source = "http://127.0.0.1:%d/%s/" % (proxy.port, prefix)
            result = tu.run_loaders(ringfeed_bin(), lib(), source, 1, metrics=True)
            counters = proxy.counters()
        finally:
            proxy.stop()
    wrong = tu.check_exactly_once(result, crcs)
    assert not wrong, "\n".join(wrong)
    assert counters["stalls"] > 0, "the proxy held nothing: %s" % counters
    scrape = result["loaders"][0]["scrape"]
    hedges = tu.scraped(scrape, "ringfeed_remote_hedges_total")
    won = tu.scraped(scrape, "ringfeed_remote_hedges_won_total")
    assert hedges is not None and won is not None, "no hedge figures in /metrics: %s" % scrape
    assert won >= 1, "%d answers held 2 s and no hedge won (%s hedges)" % (counters["stalls"], hedges)
    assert won <= hedges <= HEDGE_BURST + HEDGE_FRACTION * counters["requests"], (
        "%d hedges for %d requests: over the budget" % (hedges, counters["requests"]))
    print("held %d of %d: epoch %.2f s, hedges %d (%d won)" % (
        counters["stalls"], counters["requests"], result["loaders"][0]["done_s"], hedges, won))
