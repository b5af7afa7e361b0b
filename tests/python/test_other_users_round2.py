"""Another user on the machine, second round (issue 36, items 1 to 4 and 6): as
nobody (``setpriv --reuid=65534``) plant a profile in ``./~/.aws`` for a root
loader run with HOME unset, a link in place of a shared cache's ``manifests/``,
a hard link to root's ring under another job's name, a directory where a
loader leaves its outcome; and put a password in an endpoint variable. Root's
loader, trainer and gc must not run the planted code, delete through the link,
serve the wrong job's batches, wait out a timeout in silence, or print the
password. Each of these was reproduced on 807f3a5 (see each test's story)."""

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from e2e_util import NOBODY, need_root_and_setpriv, ringfeed_bin

ringfeed = pytest.importorskip("ringfeed")

# A uid with no entry in the password database (no home to find).
NO_PASSWD_UID = 54321


@pytest.fixture(autouse=True)
def _as_root():
    # Skipped without root and setpriv, a failure under tests/run.sh (RINGFEED_TEST_REQUIRE_ROOT=1).
    need_root_and_setpriv()


@pytest.fixture
def world_dir():
    """A sticky world-writable directory, as /tmp is: anyone may plant there."""
    d = tempfile.mkdtemp(dir="/tmp", prefix="ringfeed-w-")
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _remove(*paths):
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.unlink(path)


def _outcome(name):
    return "/dev/shm/.ringfeed-%s.outcome" % name


def _plant_aws_profile(w):
    """As nobody: W/~/.aws/config whose credential_process writes `id` to W/PWNED."""
    evil = os.path.join(w, "evil.sh")
    body = ('#!/bin/sh\nid > "%s/PWNED"\n'
            'echo \'{"Version":1,"AccessKeyId":"AKIAEVIL","SecretAccessKey":"evil"}\'\n') % w
    config = "[default]\ncredential_process = %s\n" % evil
    script = 'mkdir -p "$1/~/.aws"; printf "%s" "$3" > "$2"; chmod 755 "$2"; printf "%s" "$4" > "$1/~/.aws/config"'
    subprocess.run(NOBODY + ["sh", "-ec", script, "sh", w, evil, body, config], check=True, timeout=30)
    assert os.path.isfile(os.path.join(w, "~", ".aws", "config"))
    return evil


def _bare_serve(w, source, name, extra_env=(), user=()):
    """`ringfeed serve` under `env -i` (no HOME), run in W: the issue's command."""
    env = ["env", "-i", "PATH=/usr/bin:/bin", "AWS_EC2_METADATA_DISABLED=true", "AWS_REGION=us-east-1",
           "AWS_ENDPOINT_URL=http://127.0.0.1:9", "AWS_ALLOW_HTTP=true", "RINGFEED_CACHE_DIR=" + w + "/cache",
           *extra_env]
    binary = shutil.copy(ringfeed_bin(), os.path.join(w, "ringfeed-bin"))
    os.chmod(binary, 0o755)
    try:
        return subprocess.run(list(user) + env + [binary, "serve", "--source", source, "--name", name,
                                                  "--batch-size", "1"],
                              cwd=w, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        _remove(_outcome(name))


def test_a_root_loader_with_home_unset_never_runs_a_credential_process_planted_in_the_working_directory(world_dir):
    # Item 1: aws-config left `~` literal with HOME unset and read ./~/.aws/config:
    # W/PWNED held uid=0(root).
    _plant_aws_profile(world_dir)
    p = _bare_serve(world_dir, "s3://bkt/p/", "home-aws-%s" % uuid.uuid4().hex[:8])
    assert not os.path.exists(os.path.join(world_dir, "PWNED")), (open(os.path.join(world_dir, "PWNED")).read(),
                                                                     p.stderr)
    assert p.returncode == 1, p.stderr
    # The home it looked in instead is root's, from the password database.
    home = pwd.getpwuid(0).pw_dir
    assert "%s/.aws/config" % home in p.stderr, p.stderr
    assert "~/.aws/config" not in p.stderr.split("set AWS_ACCESS_KEY_ID")[0], p.stderr


def test_a_loader_whose_uid_has_no_home_reads_no_home_file_and_says_so(world_dir):
    # Item 1, no password entry: nothing to take HOME from; nothing under a home is read.
    with pytest.raises(KeyError):
        pwd.getpwuid(NO_PASSWD_UID)
    _plant_aws_profile(world_dir)
    user = ["setpriv", "--reuid=%d" % NO_PASSWD_UID, "--regid=%d" % NO_PASSWD_UID, "--clear-groups"]
    p = _bare_serve(world_dir, "s3://bkt/p/", "home-none-%s" % uuid.uuid4().hex[:8], user=user)
    assert not os.path.exists(os.path.join(world_dir, "PWNED")), p.stderr
    assert "no home directory: HOME is not set and uid %d has no entry in the password database" % NO_PASSWD_UID \
        in p.stderr, p.stderr
    assert "~/.aws/config (not read: no home directory)" in p.stderr, p.stderr


def test_an_azure_cli_profile_planted_in_the_working_directory_is_not_a_root_loaders_login(world_dir):
    # Item 1, Azure: ringfeed's own home_file() built `~/.azure` from the
    # working directory; a planted ./~/.azure/azureProfile.json switched root
    # to `az login`.
    subprocess.run(NOBODY + ["sh", "-ec", 'mkdir -p "$1/~/.azure" && echo {} > "$1/~/.azure/azureProfile.json"',
                             "sh", world_dir], check=True, timeout=30)
    p = _bare_serve(world_dir, "az://cont/p/", "home-az-%s" % uuid.uuid4().hex[:8],
                    extra_env=["AZURE_STORAGE_ACCOUNT_NAME=acct", "AZURE_ENDPOINT=http://127.0.0.1:9",
                               "AZURE_ALLOW_HTTP=true"])
    start = [line for line in p.stderr.splitlines() if "credentials for az://" in line]
    assert start, p.stderr
    real = os.path.join(pwd.getpwuid(0).pw_dir, ".azure", "azureProfile.json")
    if os.path.exists(real):
        assert real in start[0], start[0]
    else:
        assert "Azure CLI" not in start[0], start[0]
    assert "~" not in start[0] and world_dir not in start[0], start[0]


def test_gc_of_a_shared_cache_dir_never_deletes_through_another_users_link(world_dir):
    # Item 2: nobody's `ln -s /root/secretdir SHARED/manifests`; root's gc
    # deleted every *.manifest in the target as "not a usable manifest cache file".
    secret = tempfile.mkdtemp(dir="/tmp", prefix="ringfeed-secret-")
    try:
        os.chmod(secret, 0o700)
        precious = os.path.join(secret, "0123456789abcdef.manifest")
        with open(precious, "wb") as f:
            f.write(b"root's own file, not a manifest")
        subprocess.run(NOBODY + ["ln", "-s", secret, os.path.join(world_dir, "manifests")], check=True, timeout=30)
        p = subprocess.run([ringfeed_bin(), "gc", "--cache-dir", world_dir], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=60)
        assert os.path.exists(precious), (p.stdout, p.stderr)
        assert "not this user's to clean" in p.stderr and "nothing removed there" in p.stderr, (p.stdout, p.stderr)
    finally:
        shutil.rmtree(secret, ignore_errors=True)


def test_gc_still_cleans_its_own_manifest_cache_in_a_sticky_shared_dir(world_dir):
    # The same rule admits what serve admits: root's own manifests/ in a sticky dir.
    manifests = os.path.join(world_dir, "manifests")
    os.mkdir(manifests, 0o700)
    junk = os.path.join(manifests, "0000000000000000.manifest")
    with open(junk, "wb") as f:
        f.write(b"garbage")
    p = subprocess.run([ringfeed_bin(), "gc", "--cache-dir", world_dir], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=60)
    assert not os.path.exists(junk), (p.stdout, p.stderr)
    assert "removed %s: not a usable manifest cache file" % junk in p.stdout, p.stdout


def _serve(data, name, *extra):
    loader = subprocess.Popen([ringfeed_bin(), "serve", "--source", data, "--name", name, "--batch-size", "1",
                               "--world-size", "1", "--epochs", "100000", "--manifest-cache", "off", *extra],
                              stderr=subprocess.PIPE, text=True)
    for line in loader.stderr:
        if line.startswith("ringfeed: serving"):
            return loader
    loader.kill()
    raise AssertionError("the loader did not start: %s" % loader.stderr.read())


def _link_as_nobody(target, link):
    """`ln TARGET LINK` as nobody: needs fs.protected_hardlinks=0 (turned off
    for this one call, as many containers have it); the fix does not rely on it."""
    knob = "/proc/sys/fs/protected_hardlinks"
    with open(knob) as f:
        before = f.read().strip()
    try:
        with open(knob, "w") as f:
            f.write("0")
    except OSError:
        pytest.skip("cannot turn fs.protected_hardlinks off here, so nobody cannot link root's ring")
    try:
        subprocess.run(NOBODY + ["ln", target, link], check=True, timeout=30)
    finally:
        with open(knob, "w") as f:
            f.write(before)


def test_a_hard_link_to_another_jobs_ring_is_refused_by_a_trainer_of_its_name(tmp_path):
    # Item 3: nobody hard-links root's ring of job A as job B's; root's
    # trainer of B attached and took A's batches.
    data = tmp_path / "a"
    data.mkdir()
    for i in range(4):
        (data / ("s%d" % i)).write_bytes(b"JOB-A %d" % i)
    a, b = ("hl-a-%s" % uuid.uuid4().hex[:8]), ("hl-b-%s" % uuid.uuid4().hex[:8])
    link = "/dev/shm/ringfeed-" + b
    loader = _serve(str(data), a)
    try:
        _link_as_nobody("/dev/shm/ringfeed-" + a, link)
        assert os.stat(link).st_nlink == 2 and os.stat(link).st_uid == 0
        start = time.monotonic()
        with pytest.raises(ringfeed.UntrustedLoaderError) as e:
            ringfeed.attach(b, 0, timeout=5)
        assert time.monotonic() - start < 2.0
        assert "is not the ring of loader %r" % b in str(e.value).replace('"', "'"), str(e.value)
        # Job A's own trainer is not stopped by the link.
        code = ("import ringfeed; f = ringfeed.attach(%r, 0, timeout=10); bt = f.next(timeout=10); "
                "print(bytes(bt.sample(0))); bt.release(); f.close()") % a
        p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=60)
        assert p.returncode == 0 and "JOB-A" in p.stdout, (p.stdout, p.stderr)
    finally:
        loader.send_signal(signal.SIGINT)
        loader.communicate(timeout=30)
        _remove(link, _outcome(a))


def test_a_directory_planted_at_the_outcome_is_replaced_by_a_root_loader_whose_error_reaches_the_trainer(tmp_path):
    # Item 4: nobody's `mkdir /dev/shm/.ringfeed-NAME.outcome`; root's loader
    # of NAME failed (a missing source), could not write its outcome, said
    # nothing, and root's trainer waited its whole timeout.
    name = "planted-dir-%s" % uuid.uuid4().hex[:8]
    outcome = _outcome(name)
    subprocess.run(NOBODY + ["mkdir", "-p", outcome + "/inside"], check=True, timeout=30)
    try:
        p = subprocess.run([ringfeed_bin(), "serve", "--source", str(tmp_path / "missing"), "--name", name,
                            "--batch-size", "1"], stderr=subprocess.PIPE, text=True, timeout=60)
        assert p.returncode != 0
        start = time.monotonic()
        with pytest.raises(ringfeed.LoaderGoneError) as e:
            ringfeed.attach(name, 0, timeout=20)
        took = time.monotonic() - start
        assert took < 3.0, took
        assert "missing" in str(e.value), str(e.value)
        st = os.lstat(outcome)
        assert os.path.isfile(outcome) and st.st_uid == 0, st
        assert "removed %s, a directory of uid 65534" % outcome in p.stderr, p.stderr
    finally:
        _remove(outcome)


def test_a_loader_that_cannot_remove_a_planted_outcome_says_so_and_a_trainer_does_not_wait_its_timeout(tmp_path):
    # Item 4, a loader that may not remove it (another user, in sticky
    # /dev/shm): it says so; a trainer that finds the directory and no loader
    # says so in about a second.
    name = "planted-undeletable-%s" % uuid.uuid4().hex[:8]
    outcome = _outcome(name)
    subprocess.run(NOBODY + ["mkdir", outcome], check=True, timeout=30)
    try:
        start = time.monotonic()
        with pytest.raises(ringfeed.UntrustedLoaderError) as e:
            ringfeed.attach(name, 0, timeout=20)
        took = time.monotonic() - start
        assert took < 3.0, took
        assert "is a directory of uid 65534" in str(e.value) and "no ringfeed loader makes" in str(e.value), \
            str(e.value)
        user = ["setpriv", "--reuid=%d" % NO_PASSWD_UID, "--regid=%d" % NO_PASSWD_UID, "--clear-groups"]
        binary = shutil.copy(ringfeed_bin(), str(tmp_path / "ringfeed-bin"))
        os.chmod(tmp_path, 0o755)
        p = subprocess.run(user + [binary, "serve", "--source", "/nonexistent-dir", "--name", name,
                                   "--batch-size", "1", "--manifest-cache", "off"],
                           stderr=subprocess.PIPE, text=True, timeout=60, cwd="/")
        assert p.returncode != 0
        assert "%s is a directory of uid 65534" % outcome in p.stderr, p.stderr
        assert "cannot remove it" in p.stderr and "will not be told how this loader ends" in p.stderr, p.stderr
    finally:
        _remove(outcome)


@pytest.mark.parametrize("var", ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT"])
def test_a_password_or_signature_in_an_endpoint_variable_is_never_printed_nor_left_in_the_outcome(var):
    # Item 6: AWS_ENDPOINT_URL=http://user:PASSWORD@host printed PASSWORD in
    # stderr and the outcome file; only the source URL was scrubbed.
    name = "endpoint-secret-%s" % uuid.uuid4().hex[:8]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID="AKIATEST", AWS_SECRET_ACCESS_KEY="test-secret", AWS_REGION="us-east-1",
               AWS_ALLOW_HTTP="true", AWS_EC2_METADATA_DISABLED="true", AWS_ENDPOINT_URL="http://127.0.0.1:9")
    env[var] = "http://svc-user:Pw4Endpoint@127.0.0.1:9/?X-Amz-Signature=Sig4Endpoint"
    try:
        p = subprocess.run([ringfeed_bin(), "serve", "--source", "s3://bkt/p/", "--name", name, "--batch-size", "1",
                            "--manifest-cache", "off"], stderr=subprocess.PIPE, text=True, timeout=120, env=env)
        assert p.returncode != 0
        with open(_outcome(name)) as f:
            outcome = f.read()
    finally:
        _remove(_outcome(name))
    for text in (p.stderr, outcome):
        assert "Pw4Endpoint" not in text and "Sig4Endpoint" not in text, text
    if var.startswith("AWS_ENDPOINT"):
        assert "svc-user:REDACTED@127.0.0.1:9" in p.stderr, p.stderr
