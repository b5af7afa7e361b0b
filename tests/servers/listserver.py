#!/usr/bin/env python3
"""A listing server whose only cost is latency: real HTTP, real S3 ListObjectsV2 XML pages,
real continuation tokens, keys synthesised from a seed.

    python3 tests/servers/listserver.py --keys 1000000 --shape hex --delay-ms 20 [--port 0]

It prints `listening on 127.0.0.1:PORT` once it accepts connections, then serves until killed.
Bucket `list` holds the keys under the prefix `data/`:

- ListObjectsV2: `GET /list?list-type=2&prefix=&start-after=&continuation-token=&max-keys=
  &delimiter=`: pages of at most 1000 keys (`max-keys` lower), in byte-wise key order; each
  answered after --delay-ms, every request concurrently (asyncio), so N requests in flight
  take one delay, not N: what a real store's front end does, without its CPU bound.
- `GET /_stats`: requests served, ListObjectsV2 requests among them and the keys their pages
  held (a client parses each), the most in flight at once, and the PUTs, object GETs and
  DELETEs, as JSON (no delay).
- `PUT /list/KEY` stores an object (in memory; `If-None-Match: *` answers 412 when KEY exists,
  as S3's conditional put), which listings then show like any key; `DELETE /list/KEY` removes
  a stored one. A loader publishes its manifest this way (`.ringfeed/`).
- `GET /list/KEY` (with or without `Range: bytes=a-b`) and `HEAD`: the object's bytes, a
  function of its key (see `body`), so a loader can serve from it.
- WebDAV: `PROPFIND /list/PATH/` with `Depth: 1` answers the directory's files and
  subdirectories (a multistatus), after the same delay.

Key shapes (--shape), all from --seed:
  seq      data/sample-000000000.bin ... (decimal, dense)
  hex      data/<32 hex digits>.bin   (hashes: uniform over 16 symbols)
  nested   data/<class 0..999>/<part 0..9>/img-<n>.jpg (three levels)
  skewed   90% under data/big/..., the rest spread over 1,000 small prefixes

Nothing is authenticated (any signature is accepted): this is a test of listing, not of
SigV4, which s3s-fs checks.
"""

import argparse
import asyncio
import bisect
import hashlib
import random
import sys
import urllib.parse
from email.utils import formatdate

BUCKET = "list"
PREFIX = "data/"
PAGE_MAX = 1000
SHAPES = ("seq", "hex", "nested", "skewed")
HEADER_BYTES_MAX = 64 << 10
BODY_BYTES_MAX = 1 << 30
LAST_MODIFIED = "2026-01-01T00:00:00.000Z"


def make_keys(shape, n, seed):
    """The sorted keys (as str, ASCII only, so byte order is str order) of a shape."""
    rng = random.Random(seed)
    if shape == "seq":
        keys = ["%ssample-%09d.bin" % (PREFIX, i) for i in range(n)]
    elif shape == "hex":
        keys = {"%s%032x.bin" % (PREFIX, rng.getrandbits(128)) for _ in range(n)}
        while len(keys) < n:
            keys.add("%s%032x.bin" % (PREFIX, rng.getrandbits(128)))
        keys = list(keys)
    elif shape == "nested":
        keys = ["%sc%03d/p%d/img-%07d.jpg" % (PREFIX, rng.randrange(1000), rng.randrange(10), i) for i in range(n)]
    elif shape == "skewed":
        big = n * 9 // 10
        keys = ["%sbig/%08d.bin" % (PREFIX, i) for i in range(big)]
        keys += ["%ssmall-%03d/%08d.bin" % (PREFIX, rng.randrange(1000), i) for i in range(n - big)]
    else:
        raise SystemExit("listserver: unknown shape %r: use one of %s" % (shape, ", ".join(SHAPES)))
    keys.sort()
    return keys


def size_of(key):
    """An object's size: 1–4 KiB, a function of the key."""
    return 1024 + int.from_bytes(hashlib.blake2b(key.encode(), digest_size=2).digest(), "little") % 3073


def etag_of(key):
    return '"%s"' % hashlib.blake2b(key.encode(), digest_size=16).hexdigest()


def body(key):
    """An object's bytes: its key's blake2b digest, repeated to its size."""
    block = hashlib.blake2b(key.encode(), digest_size=64).digest()
    n = size_of(key)
    return (block * (n // len(block) + 1))[:n]


def stored_etag(data):
    return '"%s"' % hashlib.md5(data).hexdigest()


def xml_escape(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class Listing:
    def __init__(self, keys):
        self.keys = keys
        self.known = set(keys)
        self.stored = {}  # key -> bytes, objects PUT by clients
        # Each key's <Contents> made once at start, so a page costs a join, not 1,000
        # hashes: the server's CPU must not be what a listing waits on.
        self.contents = [
            "<Contents><Key>%s</Key><LastModified>%s</LastModified><ETag>%s</ETag>"
            "<Size>%d</Size><StorageClass>STANDARD</StorageClass></Contents>"
            % (xml_escape(key), LAST_MODIFIED, xml_escape(etag_of(key)), size_of(key))
            for key in keys
        ]

    def contents_of(self, key, size, etag):
        return ("<Contents><Key>%s</Key><LastModified>%s</LastModified><ETag>%s</ETag>"
                "<Size>%d</Size><StorageClass>STANDARD</StorageClass></Contents>"
                % (xml_escape(key), LAST_MODIFIED, xml_escape(etag), size))

    def store(self, key, data):
        """Adds or replaces a client's object, kept in key order with the rest."""
        if key in self.known and key not in self.stored:
            return False
        at = bisect.bisect_left(self.keys, key)
        entry = self.contents_of(key, len(data), stored_etag(data))
        if key in self.stored:
            self.contents[at] = entry
        else:
            self.keys.insert(at, key)
            self.contents.insert(at, entry)
            self.known.add(key)
        self.stored[key] = data
        return True

    def remove(self, key):
        if key not in self.stored:
            return False
        at = bisect.bisect_left(self.keys, key)
        del self.keys[at]
        del self.contents[at]
        self.known.discard(key)
        del self.stored[key]
        return True

    def page(self, q):
        prefix = q.get("prefix", "")
        delimiter = q.get("delimiter", "")
        after = q.get("start-after", "")
        token = q.get("continuation-token")
        if token is not None:
            try:
                after = bytes.fromhex(token).decode()
            except ValueError:
                return 400, error_xml("InvalidArgument", "bad continuation-token")
        try:
            max_keys = max(0, min(PAGE_MAX, int(q.get("max-keys", PAGE_MAX))))
        except ValueError:
            return 400, error_xml("InvalidArgument", "bad max-keys")
        start = max(bisect.bisect_left(self.keys, prefix), bisect.bisect_right(self.keys, after))
        contents, prefixes, last, i = [], [], None, start
        if not delimiter:
            # The common case (a recursive listing): one slice, no per-key Python.
            end = bisect.bisect_left(self.keys, successor(prefix)) if prefix else len(self.keys)
            i = min(start + max_keys, end)
            contents = range(start, i)
            last = self.keys[i - 1] if i > start else None
        while i < len(self.keys) and len(contents) + len(prefixes) < max_keys:
            key = self.keys[i]
            if not key.startswith(prefix):
                break
            rest = key[len(prefix):]
            cut = rest.find(delimiter) if delimiter else -1
            if cut >= 0:
                common = prefix + rest[: cut + len(delimiter)]
                prefixes.append(common)
                # Skip every key under the common prefix.
                i = bisect.bisect_left(self.keys, successor(common))
                last = self.keys[i - 1]
                continue
            contents.append(i)
            last = key
            i += 1
        truncated = i < len(self.keys) and self.keys[i].startswith(prefix)
        out = ['<?xml version="1.0" encoding="UTF-8"?>\n'
               '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">',
               "<Name>%s</Name><Prefix>%s</Prefix><KeyCount>%d</KeyCount><MaxKeys>%d</MaxKeys>"
               % (BUCKET, xml_escape(prefix), len(contents) + len(prefixes), max_keys),
               "<IsTruncated>%s</IsTruncated>" % ("true" if truncated else "false")]
        if truncated and last is not None:
            out.append("<NextContinuationToken>%s</NextContinuationToken>" % last.encode().hex())
        out.extend(self.contents[i] for i in contents)
        for p in prefixes:
            out.append("<CommonPrefixes><Prefix>%s</Prefix></CommonPrefixes>" % xml_escape(p))
        out.append("</ListBucketResult>")
        return 200, "".join(out).encode()

    def propfind(self, path):
        """Depth 1 of directory `path` (no leading or trailing slash)."""
        prefix = path + "/" if path else ""
        start = bisect.bisect_left(self.keys, prefix)
        files, dirs, i = [], [], start
        while i < len(self.keys) and self.keys[i].startswith(prefix):
            rest = self.keys[i][len(prefix):]
            cut = rest.find("/")
            if cut >= 0:
                d = prefix + rest[: cut + 1]
                dirs.append(d)
                i = bisect.bisect_left(self.keys, successor(d))
                continue
            files.append(self.keys[i])
            i += 1
        if not files and not dirs:
            return 404, b""
        href = lambda p: urllib.parse.quote("/%s/%s" % (BUCKET, p))
        out = ['<?xml version="1.0" encoding="utf-8"?>\n<D:multistatus xmlns:D="DAV:">',
               "<D:response><D:href>%s</D:href><D:propstat><D:prop><D:resourcetype><D:collection/>"
               "</D:resourcetype></D:prop><D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response>"
               % href(prefix)]
        for d in dirs:
            out.append("<D:response><D:href>%s</D:href><D:propstat><D:prop><D:resourcetype><D:collection/>"
                       "</D:resourcetype></D:prop><D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response>"
                       % href(d))
        for f in files:
            out.append("<D:response><D:href>%s</D:href><D:propstat><D:prop><D:resourcetype/>"
                       "<D:getcontentlength>%d</D:getcontentlength><D:getetag>%s</D:getetag></D:prop>"
                       "<D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response>"
                       % (href(f), size_of(f), xml_escape(etag_of(f))))
        out.append("</D:multistatus>")
        return 207, "".join(out).encode()


def successor(prefix):
    """The least string greater than every string that starts with `prefix` (ASCII keys)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def error_xml(code, message):
    return ('<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>%s</Message></Error>'
            % (code, xml_escape(message))).encode()


class Server:
    def __init__(self, listing, delay_s):
        self.listing = listing
        self.delay_s = delay_s
        self.requests = 0
        self.list_requests = 0
        self.keys_returned = 0
        self.puts = 0
        self.object_gets = 0
        self.deletes = 0
        self.in_flight = 0
        self.in_flight_max = 0

    async def handle(self, reader, writer):
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = (lines[0].split(" ") + ["", ""])[:3]
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                length = int(headers.get("content-length", "0") or 0)
                body_in = b""
                if length:
                    if length > BODY_BYTES_MAX:
                        return
                    body_in = await reader.readexactly(length)
                self.requests += 1
                status, extra, payload = await self.answer(method, target, headers, body_in)
                reason = {200: "OK", 204: "No Content", 206: "Partial Content", 207: "Multi-Status",
                          400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
                          412: "Precondition Failed", 416: "Range Not Satisfiable"}[status]
                hdrs = ["HTTP/1.1 %d %s" % (status, reason), "Date: " + formatdate(usegmt=True),
                        "Content-Length: %d" % len(payload), "Connection: keep-alive"] + extra
                writer.write(("\r\n".join(hdrs) + "\r\n\r\n").encode() + (b"" if method == "HEAD" else payload))
                await writer.drain()
        finally:
            writer.close()

    async def answer(self, method, target, headers, body_in):
        url = urllib.parse.urlsplit(target)
        path = urllib.parse.unquote(url.path).lstrip("/")
        q = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        if path == "_stats":
            return 200, ["Content-Type: application/json"], (
                '{"requests": %d, "list_requests": %d, "keys_returned": %d, "in_flight_max": %d, "puts": %d, '
                '"object_gets": %d, "deletes": %d}' % (self.requests, self.list_requests, self.keys_returned,
                                                       self.in_flight_max, self.puts, self.object_gets,
                                                       self.deletes)).encode()
        self.in_flight += 1
        self.in_flight_max = max(self.in_flight_max, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        if method == "GET" and path in (BUCKET, BUCKET + "/") and q.get("list-type") == "2":
            self.list_requests += 1
            status, payload = self.listing.page(q)
            # Keys the pages held: a client parses every one, used or not.
            self.keys_returned += payload.count(b"<Contents>")
            return status, ["Content-Type: application/xml"], payload
        if method == "PROPFIND" and (path == BUCKET or path.startswith(BUCKET + "/")):
            status, payload = self.listing.propfind(path[len(BUCKET):].strip("/"))
            return status, ['Content-Type: application/xml; charset="utf-8"'], payload
        if method == "PUT" and path.startswith(BUCKET + "/"):
            key = path[len(BUCKET) + 1:]
            if headers.get("if-none-match") == "*" and key in self.listing.known:
                return 412, [], error_xml("PreconditionFailed", key)
            if not self.listing.store(key, body_in):
                return 405, [], error_xml("MethodNotAllowed", "synthesised keys are read-only: " + key)
            self.puts += 1
            return 200, ["ETag: " + stored_etag(body_in)], b""
        if method == "DELETE" and path.startswith(BUCKET + "/"):
            self.deletes += 1
            self.listing.remove(path[len(BUCKET) + 1:])
            return 204, [], b""
        if method in ("GET", "HEAD") and path.startswith(BUCKET + "/"):
            key = path[len(BUCKET) + 1:]
            if key not in self.listing.known:
                return 404, [], error_xml("NoSuchKey", key)
            if method == "GET":
                self.object_gets += 1
            stored = self.listing.stored.get(key)
            data = body(key) if stored is None else stored
            tag = etag_of(key) if stored is None else stored_etag(stored)
            extra = ["ETag: " + tag, "Last-Modified: Thu, 01 Jan 2026 00:00:00 GMT",
                     "Accept-Ranges: bytes", "Content-Type: application/octet-stream"]
            rng = headers.get("range", "")
            if rng.startswith("bytes=") and method == "GET":
                a, _, b = rng[6:].partition("-")
                try:
                    first = int(a)
                    last = min(int(b) if b else len(data) - 1, len(data) - 1)
                except ValueError:
                    return 416, [], b""
                if first > last:
                    return 416, ["Content-Range: bytes */%d" % len(data)], b""
                extra.append("Content-Range: bytes %d-%d/%d" % (first, last, len(data)))
                return 206, extra, data[first:last + 1]
            return 200, extra, data
        return 405, [], error_xml("MethodNotAllowed", "%s %s" % (method, path))


async def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--shape", default="seq", choices=SHAPES)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--delay-ms", type=float, default=20.0)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    listing = Listing(make_keys(args.shape, args.keys, args.seed))
    server = Server(listing, args.delay_ms / 1000.0)
    srv = await asyncio.start_server(server.handle, "127.0.0.1", args.port, backlog=1024,
                                     limit=HEADER_BYTES_MAX)
    port = srv.sockets[0].getsockname()[1]
    print("listening on 127.0.0.1:%d (%d keys, shape %s, %.1f ms per request)"
          % (port, len(listing.keys), args.shape, args.delay_ms), flush=True)
    async with srv:
        await srv.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
