"""The families a live loader's /metrics holds, as a standard parser reads them:
each family's name, type, HELP text, sample names and label names equal the
committed expectation, metrics_families.json (values aside). A local loader
shows the ring's families and the endpoint's own; a loader of a remote source
(nginx over http://) with its data cache on shows every family.

This pins the exposition across changes of how it is written (issue 28 moved
it onto the prometheus-client crate): a renamed metric, a changed type, help
text or label fails here, naming the difference. To change a metric on
purpose, change docs/metrics.md and this file's expectation with it."""
import json
import os
import re
import subprocess
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from e2e_util import kill_survivors, ringfeed_bin
from remote_util import make_tree, seed_store

classic = pytest.importorskip("prometheus_client.parser")
openmetrics = pytest.importorskip("prometheus_client.openmetrics.parser")

EXPECTED = Path(__file__).with_name("metrics_families.json")
STARTUP_TIMEOUT_S = 60
# Families only a loader of a remote source (and its data cache) writes.
REMOTE_ONLY = ("ringfeed_remote_", "ringfeed_cache_")


def parse(ctype, body):
    """The families of a response, read by the parser its Content-Type names."""
    if ctype.startswith("application/openmetrics-text"):
        return list(openmetrics.text_string_to_metric_families(body))
    assert ctype.startswith("text/plain; version=0.0.4"), ctype
    return list(classic.text_string_to_metric_families(body))


def families_of(url):
    """{family name: [type, help, sample names, label names]} of one scrape."""
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        ctype, body = r.headers["Content-Type"], r.read().decode("utf-8")
    out = {}
    for f in parse(ctype, body):
        assert f.name not in out, "family %s twice" % f.name
        names = sorted({s.name for s in f.samples})
        labels = sorted({k for s in f.samples for k in s.labels if k != "le"})
        out[f.name] = [f.type, f.documentation, names, labels]
    return out


def scrape_loader(source, extra=(), env=None):
    """Starts `ringfeed serve --metrics` on `source`, scrapes it once it
    serves, and stops it."""
    name = "families-%d-%s" % (os.getpid(), uuid.uuid4().hex[:8])
    with tempfile.TemporaryFile(mode="w+") as log:
        p = subprocess.Popen(
            [ringfeed_bin(), "serve", "--source", str(source), "--name", name, "--batch-size", "4",
             "--world-size", "2", "--slots-per-rank", "2", "--metrics", "127.0.0.1:0", *extra],
            stderr=log, text=True, env=dict(os.environ, **(env or {})),
        )
        try:
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while True:
                log.seek(0)
                text = log.read()
                url = re.search(r"metrics at (http://\S+/metrics)", text)
                if url and re.search(r"^ringfeed: serving", text, re.M):
                    return families_of(url.group(1))
                assert p.poll() is None, "the loader exited (%s):\n%s" % (p.returncode, text)
                assert time.monotonic() < deadline, "the loader did not serve in time:\n" + text
                time.sleep(0.05)
        finally:
            kill_survivors([p])


def expected():
    return {name: fam for name, fam in json.loads(EXPECTED.read_text()).items()}


def check(seen, want):
    missing = sorted(set(want) - set(seen))
    extra = sorted(set(seen) - set(want))
    changed = ["%s: expected %s, got %s" % (n, want[n], seen[n]) for n in sorted(set(want) & set(seen))
               if want[n] != seen[n]]
    assert not (missing or extra or changed), (
        "the scrape's families differ from %s:\nmissing: %s\nnot expected: %s\nchanged:\n%s\nseen: %s"
        % (EXPECTED.name, missing, extra, "\n".join(changed), json.dumps(seen, indent=1, sort_keys=True)))


def test_a_local_loader_shows_the_ring_families_as_expected(tmp_path):
    make_tree(tmp_path / "data", 24, big=False)
    want = {n: f for n, f in expected().items() if not n.startswith(REMOTE_ONLY)}
    check(scrape_loader(tmp_path / "data"), want)


def test_a_remote_loader_with_its_cache_shows_every_family_as_expected(tmp_path):
    make_tree(tmp_path / "data", 24, big=False)
    source = seed_store("nginx", tmp_path / "data", "families")
    seen = scrape_loader(source, ["--cache-dir", str(tmp_path / "cache"), "--cache-size", "1G",
                                  "--manifest-max-age", "0"])
    check(seen, expected())
