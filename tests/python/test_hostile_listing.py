"""Hostile listings and credentials in the source URL (issue 32, items 7, 8,
9 and 12), against a small WebDAV server of the test's own (PROPFIND Depth 1,
ranged GET, optional Basic authentication) so that each answer can be as bad
as a broken or hostile server's:

- a key with a NUL (a `--keys` line, a WebDAV `%00`) panicked the loader
  (exit 101) and left no outcome, so trainers waited out their timeout: now a
  listing error naming the key escaped, reported to a trainer at once;
- an endless PROPFIND answer was buffered whole (8.7 GB in 30 s): now an
  error naming the cap, memory bounded;
- `http://alice:SECRETPASS@host/ds/` printed and stored the password and did
  not send it: now Basic authentication, and the secret never appears in
  stderr, the outcome file, the data cache's `source` file or `cache list`;
- a name with a control character was asked for percent-encoded twice (404):
  now a listing error naming it; a name with `%` is asked for once-encoded.
"""
import resource
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import ringfeed
from e2e_util import kill_survivors, ringfeed_bin

SECRET = "SECRETPASS"
SIGNATURE = "SIGSECRET0123456789"


class DavServer:
    """A WebDAV server on 127.0.0.1 for the directory /ds/ (no subdirectories).

    `files`: decoded name -> bytes; `hrefs`: extra raw (encoded) names listed;
    `endless`: PROPFIND answers with a 207 that never ends; `auth`: the
    "user:password" every request must send as Basic authentication;
    `get_status` (settable while it runs): every GET answered with it."""

    def __init__(self, files=None, hrefs=(), endless=False, auth=None):
        self.files = dict(files or {})
        self.hrefs = list(hrefs)
        self.endless = endless
        self.auth = auth
        self.get_status = None
        self.gets = []
        self.unauthorized = 0
        self.stop_endless = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def authorized(self):
                if server.auth is None:
                    return True
                import base64
                want = "Basic " + base64.b64encode(server.auth.encode()).decode()
                if self.headers.get("Authorization") == want:
                    return True
                server.unauthorized += 1
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="ds"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return False

            def do_PROPFIND(self):
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                if not self.authorized():
                    return
                head = b'<?xml version="1.0" encoding="utf-8" ?>\n<D:multistatus xmlns:D="DAV:">\n'
                self_entry = (b"<D:response><D:href>/ds/</D:href><D:propstat><D:prop><D:resourcetype>"
                              b"<D:collection/></D:resourcetype></D:prop></D:propstat></D:response>\n")
                if server.endless:
                    self.send_response(207)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    entry = (b"<D:response><D:href>/ds/f.bin</D:href><D:propstat><D:prop><D:resourcetype/>"
                             b"<D:getcontentlength>1</D:getcontentlength></D:prop></D:propstat></D:response>\n")
                    chunk = entry * 8192
                    try:
                        for part in (head, self_entry):
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                        while not server.stop_endless.is_set():
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    except OSError:
                        pass
                    self.close_connection = True
                    return
                body = head + self_entry
                names = [urllib.parse.quote(k) for k in sorted(server.files)] + server.hrefs
                for href in names:
                    size = len(server.files.get(urllib.parse.unquote(href), b""))
                    body += ("<D:response><D:href>/ds/%s</D:href><D:propstat><D:prop><D:resourcetype/>"
                             "<D:getcontentlength>%d</D:getcontentlength></D:prop></D:propstat>"
                             "</D:response>\n" % (href, size)).encode()
                body += b"</D:multistatus>\n"
                self.send_response(207)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if not self.authorized():
                    return
                server.gets.append(self.path)
                if server.get_status is not None:
                    self.send_response(server.get_status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                name = urllib.parse.unquote(self.path.split("?")[0][len("/ds/"):])
                data = server.files.get(name)
                if data is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes="):
                    a, _, b = rng[len("bytes="):].partition("-")
                    a = int(a)
                    b = int(b) if b else len(data) - 1
                    part = data[a:b + 1]
                    self.send_response(206)
                    self.send_header("Content-Range", "bytes %d-%d/%d" % (a, a + len(part) - 1, len(data)))
                else:
                    part = data
                    self.send_response(200)
                self.send_header("Content-Length", str(len(part)))
                self.send_header("ETag", '"e%d"' % len(data))
                self.end_headers()
                self.wfile.write(part)

            do_HEAD = do_GET

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_endless.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        return False


def loader_name(what):
    return "hostile-%s-%s" % (what, uuid.uuid4().hex[:8])


def fails_at_once_for_the_trainer(cmd, name, *expected):
    """Starts the loader and, at once, a trainer: the loader fails with an
    error (not a panic) saying `expected`, and so does the trainer, promptly."""
    loader = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        start = time.monotonic()
        with pytest.raises(ringfeed.LoaderGoneError) as e:
            ringfeed.attach(name, 0, timeout=30)
        took = time.monotonic() - start
        _, err = loader.communicate(timeout=30)
    finally:
        kill_survivors([loader])
    assert loader.returncode == 1, (loader.returncode, err)
    assert "panicked" not in err, err
    for text in expected:
        assert text in err, err
        assert text in str(e.value), str(e.value)
    assert took < 10, took


def test_a_nul_in_a_keys_line_is_an_error_naming_it_that_a_trainer_gets_at_once(tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_bytes(b"good\t3\na\x00b\t5\n")
    name = loader_name("nulkeys")
    fails_at_once_for_the_trainer(
        [ringfeed_bin(), "serve", "--source", "http://127.0.0.1:9/ds/", "--keys", str(keys), "--name", name,
         "--batch-size", "1"],
        name, 'key "a\\0b"', "line 2")


def test_a_nul_in_a_webdav_listing_is_an_error_naming_it_that_a_trainer_gets_at_once(tmp_path):
    with DavServer(files={"ok.bin": b"abc"}, hrefs=["nul%00x.bin"]) as dav:
        name = loader_name("nuldav")
        fails_at_once_for_the_trainer(
            [ringfeed_bin(), "serve", "--source", "http://127.0.0.1:%d/ds/" % dav.port, "--name", name,
             "--batch-size", "1", "--manifest-cache", "off", "--cache", "off"],
            name, 'key "nul\\0x.bin"')


def test_a_control_character_in_a_webdav_name_is_named_and_never_asked_for_as_another_name(tmp_path):
    with DavServer(files={"ok.bin": b"abc", "ctl\x01x.bin": b"xyz"}) as dav:
        name = loader_name("ctldav")
        fails_at_once_for_the_trainer(
            [ringfeed_bin(), "serve", "--source", "http://127.0.0.1:%d/ds/" % dav.port, "--name", name,
             "--batch-size", "1", "--manifest-cache", "off", "--cache", "off"],
            name, 'key "ctl\\u{1}x.bin"', "control character")
        assert dav.gets == [], dav.gets


def serve_all(source, name, extra=(), env=None):
    """Serves `source` for one epoch to one Python trainer; returns (rc,
    stderr, the samples' bytes)."""
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", source, "--name", name, "--batch-size", "1",
         "--manifest-cache", "off"] + list(extra),
        stderr=subprocess.PIPE, text=True, env=env)
    got = []
    try:
        with ringfeed.attach(name, 0, timeout=30) as feed:
            while True:
                batch = feed.next(timeout=30)
                if batch is None:
                    break
                got += [bytes(batch.sample(i)) for i in range(len(batch))]
                batch.release()
        _, err = loader.communicate(timeout=30)
    finally:
        kill_survivors([loader])
    return loader.returncode, err, got


def test_a_name_with_a_percent_sign_is_asked_for_encoded_once(tmp_path):
    files = {"a%b.bin": b"percent", "c d#e.bin": b"space-hash"}
    with DavServer(files=files) as dav:
        rc, err, got = serve_all("http://127.0.0.1:%d/ds/" % dav.port, loader_name("pct"), ["--cache", "off"])
    assert rc == 0, err
    assert sorted(got) == sorted(files.values()), (got, dav.gets)
    assert "/ds/a%25b.bin" in dav.gets and not any("%2525" in g for g in dav.gets), dav.gets


def outcome_text(name):
    path = Path("/dev/shm/.ringfeed-%s.outcome" % name)
    return path.read_text() if path.exists() else ""


def test_credentials_in_the_url_are_sent_as_basic_auth_and_never_shown_or_stored(tmp_path):
    files = {"f%d.bin" % i: bytes([i]) * (100 + i) for i in range(6)}
    cache_dir = tmp_path / "cache"
    with DavServer(files=files, auth="alice:" + SECRET) as dav:
        source = "http://alice:%s@127.0.0.1:%d/ds/" % (SECRET, dav.port)
        name = loader_name("auth")
        rc, err, got = serve_all(source, name, ["--cache-dir", str(cache_dir), "--cache-size", "10M"])
        assert rc == 0, err
        assert sorted(got) == sorted(files.values())
        assert dav.unauthorized == 0, dav.unauthorized
        outcome = outcome_text(name)
    listed = subprocess.run([ringfeed_bin(), "cache", "list", "--cache-dir", str(cache_dir)],
                            capture_output=True, text=True, timeout=30)
    assert listed.returncode == 0, listed.stderr
    sources = [p.read_text() for p in (cache_dir / "data").glob("*/source")]
    assert sources and all("alice:REDACTED@" in s or "alice" not in s for s in sources), sources
    for where, text in [("stderr", err), ("outcome", outcome), ("cache source", "".join(sources)),
                        ("cache list", listed.stdout + listed.stderr)]:
        assert SECRET not in text, (where, text)
    assert "127.0.0.1:%d" % dav.port in listed.stdout, listed.stdout


def test_a_signature_in_the_url_never_shows_in_stderr_or_the_outcome(tmp_path):
    name = loader_name("sig")
    source = "http://bob:%s@127.0.0.1:9/ds/?X-Amz-Credential=AKIA%%2F1&X-Amz-Signature=%s" % (SECRET, SIGNATURE)
    proc = subprocess.run([ringfeed_bin(), "serve", "--source", source, "--name", name, "--batch-size", "1",
                           "--manifest-cache", "off"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    outcome = outcome_text(name)
    assert "127.0.0.1:9" in proc.stderr and "X-Amz-Signature=REDACTED" in proc.stderr, proc.stderr
    for text in (proc.stderr, outcome):
        assert SIGNATURE not in text and SECRET not in text and "AKIA" not in text, text


MEASURE = """import resource, subprocess, sys
p = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=120)
sys.stdout.write("%d\\n%d\\n" % (p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.stdout.write(p.stderr)
"""


def test_an_endless_propfind_answer_is_an_error_naming_the_cap_with_memory_bounded(tmp_path):
    with DavServer(endless=True) as dav:
        name = loader_name("endless")
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-c", MEASURE, ringfeed_bin(), "serve", "--source",
             "http://127.0.0.1:%d/ds/" % dav.port, "--name", name, "--batch-size", "1",
             "--manifest-cache", "off", "--cache", "off"],
            capture_output=True, text=True, timeout=150)
        took = time.monotonic() - start
    rc, max_rss_kib, err = proc.stdout.split("\n", 2)
    assert int(rc) == 1, proc.stdout
    assert "PROPFIND" in err and ("more than 1000000 entries" in err or "longer than" in err), err
    assert int(max_rss_kib) < 1024 * 1024, max_rss_kib
    assert took < 120, took
    print("endless PROPFIND: failed after %.1f s, max RSS %d MiB" % (took, int(max_rss_kib) // 1024))


def serve_cached(source, cache_dir, what):
    """One run with the manifest cache on (the data cache off), read to its end
    by one trainer, or until it fails; returns (exit code, stderr)."""
    name = loader_name(what)
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", source, "--name", name, "--batch-size", "1",
         "--cache", "off", "--cache-dir", str(cache_dir)],
        stderr=subprocess.PIPE, text=True)
    try:
        try:
            with ringfeed.attach(name, 0, timeout=30) as feed:
                for batch in feed:
                    batch.release()
        except ringfeed.Error:
            pass  # the loader failed: its stderr says why
        _, err = loader.communicate(timeout=60)
    finally:
        kill_survivors([loader])
    return loader.returncode, err


def test_a_403_on_a_cached_listing_keeps_it_and_a_404_or_412_forgets_it(tmp_path):
    """Issue 28: after any remote read failure on a cached listing the listing
    was forgotten, though only a 404 (gone) or a 412 (changed) says it is
    stale; a refused credential says nothing of it."""
    files = {"f%d.bin" % i: bytes([i]) * (50 + i) for i in range(6)}
    cache_dir = tmp_path / "cache"
    with DavServer(files=files) as dav:
        source = "http://127.0.0.1:%d/ds/" % dav.port
        rc, err = serve_cached(source, cache_dir, "c403a")
        assert rc == 0, err
        manifests = list((cache_dir / "manifests").glob("*.manifest"))
        assert len(manifests) == 1, (manifests, err)
        dav.get_status = 403
        rc, err = serve_cached(source, cache_dir, "c403b")
        assert rc != 0 and "403" in err, err
        assert manifests[0].exists(), "a 403 made the cached listing be forgotten: " + err
        dav.get_status = None
        rc, err = serve_cached(source, cache_dir, "c403c")
        assert rc == 0 and "from the cache" in err, err
        dav.get_status = 404
        rc, err = serve_cached(source, cache_dir, "c404")
        assert rc != 0, err
        assert not manifests[0].exists(), "a 404 on a cached listing kept it: " + err
        # Listed and cached again; then a 412 (the object changed under the
        # ETag the cached listing holds) forgets it too.
        dav.get_status = None
        rc, err = serve_cached(source, cache_dir, "c412a")
        assert rc == 0 and manifests[0].exists(), err
        dav.get_status = 412
        rc, err = serve_cached(source, cache_dir, "c412b")
        assert rc != 0, err
        assert not manifests[0].exists(), "a 412 on a cached listing kept it: " + err

