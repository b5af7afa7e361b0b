"""Every test server works on this machine: a small tree uploaded to each is
listed and read back byte for byte with a standard client (boto3, WebDAV
PROPFIND over HTTP, the GCS JSON API, the Azure blob REST API), and the S3
server refuses a wrong signature.

    tests/servers/up.sh python -m pytest -q tests/servers/test_smoke.py

(up.sh starts the servers and exports their environment; boto3 is needed.)
"""

import base64
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import seed  # noqa: E402

PROXY_START_TIMEOUT_S = 20
DAV = "{DAV:}"


def env(name):
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"${name} is not set: run under tests/servers/up.sh (it starts the servers and sets it)")
    return value


@pytest.fixture
def tree(tmp_path):
    """A small tree with nesting, a space in a name and one 300 KB file; {key: bytes}."""
    files = {
        "a.bin": b"one",
        "d1/d2/big.bin": os.urandom(300_000),
        "d1/with space.txt": b"spaced",
        "d1/z.bin": bytes(range(256)),
    }
    root = tmp_path / "tree"
    for key, data in files.items():
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root, files


def get(url, headers=None):
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=seed.HTTP_TIMEOUT_S) as response:
        return response.read()


def propfind(url, depth):
    """(status, [(href, is_collection)]) of a PROPFIND."""
    request = urllib.request.Request(url, method="PROPFIND", headers={"Depth": depth})
    try:
        with urllib.request.urlopen(request, timeout=seed.HTTP_TIMEOUT_S) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, []
    entries = []
    for item in ET.fromstring(body).iter(f"{DAV}response"):
        href = urllib.parse.unquote(urllib.parse.urlparse(item.findtext(f"{DAV}href")).path)
        entries.append((href, item.find(f".//{DAV}collection") is not None))
    return status, entries


# ---------------------------------------------------------------- S3


def test_s3s_fs_lists_and_reads_back_a_tree_and_checks_signatures(tree):
    from botocore.exceptions import ClientError

    root, files = tree
    seed.seed_s3("smoke", root, "p/")
    client = seed.s3_client()
    keys = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket="smoke", Prefix="p/", PaginationConfig={"PageSize": 2}):
        keys += [o["Key"] for o in page.get("Contents", [])]
    assert keys == ["p/" + k for k in sorted(files)]
    for key, data in files.items():
        assert client.get_object(Bucket="smoke", Key="p/" + key)["Body"].read() == data
    os.environ["AWS_SECRET_ACCESS_KEY"], secret = "wrong-secret", os.environ["AWS_SECRET_ACCESS_KEY"]
    try:
        with pytest.raises(ClientError) as refused:
            seed.s3_client().get_object(Bucket="smoke", Key="p/a.bin")
    finally:
        os.environ["AWS_SECRET_ACCESS_KEY"] = secret
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def faultproxy_binary():
    built = [REPO / "target" / kind / "faultproxy" for kind in ("release", "debug")]
    built = [p for p in built if p.is_file()]
    if not built:
        pytest.fail("no target/*/faultproxy: build it first (cargo build --release -p faultproxy)")
    return max(built, key=lambda p: p.stat().st_mtime)


def test_boto3_writes_and_reads_a_tree_through_faultproxy_injecting_503s(tree, tmp_path):
    from botocore.config import Config
    import boto3

    _, files = tree
    seed.s3_client().create_bucket(Bucket="smoke-proxy")
    upstream = urllib.parse.urlparse(env("AWS_ENDPOINT_URL")).netloc
    port_file = tmp_path / "proxy.port"
    proxy = subprocess.Popen(
        [str(faultproxy_binary()), "--upstream", upstream, "--error-503", "0.3", "--rtt-ms", "10",
         "--seed", "4", "--status-listen", "127.0.0.1:0", "--port-file", str(port_file)],
        stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + PROXY_START_TIMEOUT_S
        while not port_file.exists():
            assert time.monotonic() < deadline and proxy.poll() is None, "faultproxy did not start"
            time.sleep(0.05)
        port, status_port = port_file.read_text().split()
        # The proxy passes the Host header through, so SigV4 still verifies.
        client = boto3.client(
            "s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id=env("AWS_ACCESS_KEY_ID"),
            aws_secret_access_key=env("AWS_SECRET_ACCESS_KEY"), region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, retries={"mode": "standard", "max_attempts": 10}))
        # PUTs send Expect: 100-continue; a 503 to one closes its connection.
        for key, data in files.items():
            client.put_object(Bucket="smoke-proxy", Key=key, Body=data)
        for _ in range(5):
            for key, data in files.items():
                assert client.get_object(Bucket="smoke-proxy", Key=key)["Body"].read() == data
        counters = json.loads(get(f"http://127.0.0.1:{status_port}/"))
        assert counters["injected_503"] > 0 and counters["responses"] >= 6 * len(files), counters
    finally:
        proxy.terminate()
        out, _ = proxy.communicate(timeout=10)
    assert "faultproxy summary: " in out


# ---------------------------------------------------------------- WebDAV


def walk_depth_1(base_url, path):
    """Every file under path, found with PROPFIND Depth 1 alone, as nginx allows."""
    status, entries = propfind(base_url.rstrip("/") + urllib.parse.quote(path), "1")
    assert status == 207, f"PROPFIND Depth 1 {path}: {status}"
    files = []
    for href, is_collection in entries:
        if href.rstrip("/") == path.rstrip("/"):
            continue
        files += walk_depth_1(base_url, href) if is_collection else [href]
    return files


def check_webdav(url, files, path="/smoke/"):
    for key, data in files.items():
        assert get(url.rstrip("/") + urllib.parse.quote(path + key)) == data


def test_nginx_webdav_lists_by_depth_1_and_refuses_depth_infinity(tree):
    root, files = tree
    url = env("RINGFEED_TEST_NGINX_URL")
    seed.seed_webdav(url + "smoke/", root)
    assert sorted(walk_depth_1(url, "/smoke/")) == sorted("/smoke/" + k for k in files)
    assert propfind(url + "smoke/", "infinity")[0] == 403
    check_webdav(url, files)


def test_rclone_webdav_lists_at_depth_infinity(tree):
    root, files = tree
    url = env("RINGFEED_TEST_RCLONE_URL")
    seed.seed_webdav(url + "smoke/", root)
    status, entries = propfind(url + "smoke/", "infinity")
    assert status == 207
    assert sorted(h for h, is_dir in entries if not is_dir) == sorted("/smoke/" + k for k in files)
    check_webdav(url, files)


# ---------------------------------------------------------------- Azure


def test_azurite_lists_and_reads_back_a_tree_and_checks_signatures(tree):
    root, files = tree
    seed.seed_azure("smoke", root, "p/")
    _, _, body = seed.azure_request("GET", "smoke", {"restype": "container", "comp": "list", "prefix": "p/"})
    names = [n.text for n in ET.fromstring(body).iter("Name")]
    assert names == ["p/" + k for k in sorted(files)]
    for key, data in files.items():
        assert seed.azure_request("GET", "smoke/p/" + key)[2] == data
    os.environ["AZURE_STORAGE_ACCOUNT_KEY"], key = base64.b64encode(b"w" * 64).decode(), os.environ["AZURE_STORAGE_ACCOUNT_KEY"]
    try:
        with pytest.raises(RuntimeError, match="answered 403"):
            seed.azure_request("GET", "smoke/p/a.bin")
    finally:
        os.environ["AZURE_STORAGE_ACCOUNT_KEY"] = key


# ---------------------------------------------------------------- GCS


def test_fake_gcs_server_lists_and_reads_back_a_tree(tree):
    root, files = tree
    seed.seed_gcs("smoke", root, "p/")
    endpoint = env("RINGFEED_TEST_GCS_ENDPOINT")
    names, token = [], None
    while True:
        query = {"prefix": "p/", "maxResults": "2", **({"pageToken": token} if token else {})}
        page = json.loads(get(f"{endpoint}/storage/v1/b/smoke/o?" + urllib.parse.urlencode(query)))
        names += [item["name"] for item in page.get("items", [])]
        token = page.get("nextPageToken")
        if not token:
            break
    assert names == ["p/" + k for k in sorted(files)]
    for key, data in files.items():
        name = urllib.parse.quote("p/" + key, safe="")
        assert get(f"{endpoint}/download/storage/v1/b/smoke/o/{name}?alt=media") == data
    # object_store reads through the XML-style path with ranges; those work (its XML PUT does not).
    big = files["d1/d2/big.bin"]
    ranged = urllib.request.Request(f"{endpoint}/smoke/p/d1/d2/big.bin", headers={"Range": "bytes=1000-1999"})
    with urllib.request.urlopen(ranged, timeout=seed.HTTP_TIMEOUT_S) as response:
        assert (response.status, response.read()) == (206, big[1000:2000])
    service_account = json.loads(Path(env("GOOGLE_SERVICE_ACCOUNT")).read_text())
    assert service_account["gcs_base_url"] == endpoint and service_account["disable_oauth"] is True


# ---------------------------------------------------------------- start/stop


def test_a_second_start_in_one_state_dir_is_refused_and_stop_leaves_nothing_running(tmp_path):
    """A second start would overwrite the first's pid file, and the first
    would never be stopped (test_tar_shards.py left 3 nginx and 1 s3s-fs so)."""
    script = str(HERE / "servers.sh")
    first = subprocess.run([script, "start", "nginx", str(tmp_path)], capture_output=True, text=True, timeout=180)
    assert first.returncode == 0, first.stderr
    pid = int((tmp_path / "nginx.pid").read_text())
    try:
        second = subprocess.run([script, "start", "nginx", str(tmp_path)], capture_output=True, text=True, timeout=180)
        assert second.returncode == 1 and "nginx already runs from" in second.stderr and str(pid) in second.stderr, second.stderr
        assert int((tmp_path / "nginx.pid").read_text()) == pid
    finally:
        subprocess.run([script, "stop", "nginx", str(tmp_path)], capture_output=True, timeout=60)
    assert not Path("/proc/%d" % pid).exists() or b"zombie" in Path("/proc/%d/status" % pid).read_bytes().lower()
    # A pid file naming a process that is not the server (here: init) is
    # neither a reason to refuse nor a process to kill.
    (tmp_path / "nginx.pid").write_text("1\n")
    subprocess.run([script, "stop", "nginx", str(tmp_path)], capture_output=True, timeout=60, check=True)
    assert Path("/proc/1").exists() and not (tmp_path / "nginx.pid").exists()


# ---------------------------------------------------------------- leftovers


def test_leftovers_names_a_process_tied_to_the_run_only_by_its_environment(tmp_path):
    """tests/run.sh ends with tests/leftovers.sh RUN_TMP: a loader of a remote
    URL, started from the checkout, names nothing under RUN_TMP on its command
    line, cwd or open files, only in the TMPDIR it inherits; it was missed."""
    script = str(REPO / "tests" / "leftovers.sh")
    run = tmp_path / "run"
    run.mkdir()
    leaked = subprocess.Popen(["sleep", "60"], cwd="/", env=dict(os.environ, TMPDIR=str(run)),
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        found = subprocess.run(["bash", script, str(run)], capture_output=True, text=True, timeout=60)
        assert found.returncode == 1, found.stderr
        assert "pid %d is still running (its environment names %s)" % (leaked.pid, run) in found.stderr, found.stderr
    finally:
        leaked.kill()
        leaked.wait()
    clean = subprocess.run(["bash", script, str(run)], capture_output=True, text=True, timeout=60)
    assert clean.returncode == 0, clean.stderr
