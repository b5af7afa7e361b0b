#!/usr/bin/env python3
"""Uploads a local directory tree to one of the test servers, creating the
bucket or container first. Keys are the files' paths relative to the directory
(with '/'), under an optional prefix.

    seed.py s3 BUCKET DIR [--prefix P]        AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... (boto3)
    seed.py azure CONTAINER DIR [--prefix P]  RINGFEED_TEST_AZURE_ENDPOINT, AZURE_STORAGE_ACCOUNT_*
    seed.py gcs BUCKET DIR [--prefix P]       RINGFEED_TEST_GCS_ENDPOINT (JSON API; its XML PUT fails)
    seed.py webdav URL DIR                    any WebDAV server (MKCOL + PUT)

The environment is what `servers.sh start` exported. Only the standard
library, except boto3 for S3. Azure requests are signed with SharedKey here
(Azurite checks the signature). Also importable: the smoke test uses
azure_request() to list and read back.
"""

import argparse
import base64
import email.utils
import hashlib
import hmac
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

AZURE_API_VERSION = "2021-12-02"
HTTP_TIMEOUT_S = 60


def tree(root):
    """(key, path) of every regular file under root, keys in byte-wise order."""
    root = Path(root)
    if not root.is_dir():
        sys.exit(f"seed.py: {root} is not a directory: give the local tree to upload")
    files = [p for p in root.rglob("*") if p.is_file()]
    return sorted(((p.relative_to(root).as_posix(), p) for p in files), key=lambda kp: kp[0].encode())


def need_env(name):
    value = os.environ.get(name)
    if not value:
        sys.exit(f"seed.py: ${name} is not set: `source` the env that tests/servers/servers.sh start printed")
    return value


def http(method, url, body=b"", headers=None, ok=(200, 201)):
    """One request; returns (status, headers, body), or raises RuntimeError naming
    the method, URL, status and the start of the answer."""
    request = urllib.request.Request(url, data=body if method in ("PUT", "POST") else None, method=method)
    for key, value in (headers or {}).items():
        request.add_header(key, value)
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as e:
        if e.code in ok:
            return e.code, e.headers, e.read()
        raise RuntimeError(f"{method} {url} answered {e.code}: {e.read()[:300]!r}") from None


# ---------------------------------------------------------------- S3


def s3_client():
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=need_env("AWS_ENDPOINT_URL"),
        aws_access_key_id=need_env("AWS_ACCESS_KEY_ID"),
        aws_secret_access_key=need_env("AWS_SECRET_ACCESS_KEY"),
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
        config=Config(s3={"addressing_style": "path"}),
    )


def seed_s3(bucket, root, prefix):
    client = s3_client()
    existing = [b["Name"] for b in client.list_buckets().get("Buckets", [])]
    if bucket not in existing:
        client.create_bucket(Bucket=bucket)
    for key, path in tree(root):
        client.put_object(Bucket=bucket, Key=prefix + key, Body=path.read_bytes())


# ---------------------------------------------------------------- Azure


def azure_request(method, path, query=None, body=b"", headers=None, ok=(200, 201)):
    """A SharedKey-signed request to Azurite's blob endpoint; path starts with
    the container. Returns (status, headers, body)."""
    endpoint = need_env("RINGFEED_TEST_AZURE_ENDPOINT").rstrip("/")
    account = need_env("AZURE_STORAGE_ACCOUNT_NAME")
    key = base64.b64decode(need_env("AZURE_STORAGE_ACCOUNT_KEY"))
    query = dict(query or {})
    headers = dict(headers or {})
    if method in ("PUT", "POST"):
        # urllib would add a form Content-Type of its own, outside the signature.
        headers.setdefault("Content-Type", "application/octet-stream")
    headers["x-ms-date"] = email.utils.formatdate(usegmt=True)
    headers["x-ms-version"] = AZURE_API_VERSION
    length = str(len(body)) if body else ""
    ms_headers = "".join(f"{k.lower()}:{v}\n" for k, v in sorted(headers.items()) if k.lower().startswith("x-ms-"))
    # Azurite (path-style) signs /account/account/path: the account, then the
    # URL's path as sent (percent-encoded).
    resource = f"/{account}/{account}/{urllib.parse.quote(path)}" + "".join(
        f"\n{k.lower()}:{v}" for k, v in sorted(query.items())
    )
    standard = [method, "", "", length, "", headers.get("Content-Type", ""), "", "", "", "", "", ""]
    to_sign = "\n".join(standard) + "\n" + ms_headers + resource
    signature = base64.b64encode(hmac.new(key, to_sign.encode(), hashlib.sha256).digest()).decode()
    headers["Authorization"] = f"SharedKey {account}:{signature}"
    url = f"{endpoint}/{urllib.parse.quote(path)}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    return http(method, url, body, headers, ok)


def seed_azure(container, root, prefix):
    # 409: the container exists already.
    azure_request("PUT", container, {"restype": "container"}, ok=(201, 409))
    for key, path in tree(root):
        azure_request("PUT", f"{container}/{prefix}{key}", body=path.read_bytes(), headers={"x-ms-blob-type": "BlockBlob"})


# ---------------------------------------------------------------- GCS


def seed_gcs(bucket, root, prefix):
    endpoint = need_env("RINGFEED_TEST_GCS_ENDPOINT").rstrip("/")
    body = json.dumps({"name": bucket}).encode()
    http("POST", f"{endpoint}/storage/v1/b", body, {"Content-Type": "application/json"}, ok=(200, 409))
    for key, path in tree(root):
        name = urllib.parse.quote(prefix + key, safe="")
        url = f"{endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}"
        http("POST", url, path.read_bytes(), {"Content-Type": "application/octet-stream"})


# ---------------------------------------------------------------- WebDAV


def seed_webdav(url, root):
    parsed = urllib.parse.urlparse(url)
    server = f"{parsed.scheme}://{parsed.netloc}/"
    base_path = parsed.path.strip("/")
    base_path = base_path + "/" if base_path else ""
    made = set()
    for key, path in tree(root):
        # The collections of the URL's own path too: not every server makes them on PUT.
        key = base_path + key
        parts = key.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            collection = "/".join(parts[:i]) + "/"
            if collection not in made:
                # 405: it exists already.
                http("MKCOL", server + urllib.parse.quote(collection), ok=(201, 405))
                made.add(collection)
        http("PUT", server + urllib.parse.quote(key), path.read_bytes(), ok=(200, 201, 204))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=["s3", "azure", "gcs", "webdav"])
    parser.add_argument("target", help="bucket, container, or the WebDAV URL")
    parser.add_argument("dir", help="the local tree to upload")
    parser.add_argument("--prefix", default="", help="put every key under this prefix (end it with /)")
    args = parser.parse_args()
    try:
        if args.kind == "s3":
            seed_s3(args.target, args.dir, args.prefix)
        elif args.kind == "azure":
            seed_azure(args.target, args.dir, args.prefix)
        elif args.kind == "gcs":
            seed_gcs(args.target, args.dir, args.prefix)
        else:
            if args.prefix:
                sys.exit("seed.py: --prefix is for buckets; for WebDAV put the prefix in the URL")
            seed_webdav(args.target, args.dir)
    except RuntimeError as e:
        sys.exit(f"seed.py: {e}")
    print(f"seed.py: uploaded {len(tree(args.dir))} files to {args.kind} {args.target}")


if __name__ == "__main__":
    main()
