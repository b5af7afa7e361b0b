"""`AWS_PROFILE=NAME ringfeed serve --source s3://...` with the keys only in a
profile file, or printed by the profile's `credential_process`, against
s3s-fs (which checks SigV4): every sample exactly once per epoch, one start
line naming the source and never the secret; a profile with a wrong secret
fails with the server's 403 naming the profile.

AWS_ACCESS_KEY_ID and the other credential variables are removed from the
loader's environment; AWS_SHARED_CREDENTIALS_FILE / AWS_CONFIG_FILE point
into a temp dir; AWS_EC2_METADATA_DISABLED=true, so no run can reach the
instance metadata address (169.254.169.254).
"""
import os
import stat
import subprocess

import pytest

from e2e_util import ringfeed_bin
from test_remote_serve import (  # noqa: F401  (fixtures used by name)
    check_every_sample_once_per_epoch,
    dataset,
    serve_and_consume,
    state_dir,
    upload,
)

CREDENTIAL_VARS = [
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_SKIP_SIGNATURE",
]


@pytest.fixture(scope="module")
def profiles(dataset, state_dir, tmp_path_factory):
    """The tree on s3s-fs; returns (--source URL, server env without keys,
    profile directory, secret)."""
    source, env = upload(state_dir, "s3", dataset[0])
    key, secret = env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]
    d = tmp_path_factory.mktemp("aws")
    script = d / "print-creds.sh"
    script.write_text(
        "#!/bin/sh\nprintf '%%s' '{\"Version\": 1, \"AccessKeyId\": \"%s\", \"SecretAccessKey\": \"%s\"}'\n"
        % (key, secret)
    )
    script.chmod(stat.S_IRWXU)
    (d / "credentials").write_text(
        "[train]\naws_access_key_id = %s\naws_secret_access_key = %s\n\n"
        "[wrong]\naws_access_key_id = %s\naws_secret_access_key = not-the-secret\n" % (key, secret, key)
    )
    # A credential_process whose credentials expired long ago (the keys are
    # right: s3s-fs does not know they expired, so only the loader can say so).
    expired = d / "print-expired-creds.sh"
    expired.write_text(
        "#!/bin/sh\nprintf '%%s' '{\"Version\": 1, \"AccessKeyId\": \"%s\", \"SecretAccessKey\": \"%s\", "
        "\"SessionToken\": \"t\", \"Expiration\": \"2001-01-01T00:00:00Z\"}'\n" % (key, secret)
    )
    expired.chmod(stat.S_IRWXU)
    (d / "config").write_text(
        "[profile proc]\ncredential_process = %s\n\n[profile old]\ncredential_process = %s\n" % (script, expired)
    )
    server_env = {k: v for k, v in env.items() if k not in CREDENTIAL_VARS}
    server_env.update(
        AWS_SHARED_CREDENTIALS_FILE=str(d / "credentials"),
        AWS_CONFIG_FILE=str(d / "config"),
        AWS_EC2_METADATA_DISABLED="true",
    )
    return source, server_env, secret


@pytest.fixture
def no_key_env(monkeypatch):
    for var in CREDENTIAL_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize(
    "profile, words",
    [("train", "AWS profile 'train' from "), ("proc", "credential_process of AWS profile 'proc'")],
)
def test_keys_only_in_a_profile_serve_every_sample_once(dataset, profiles, no_key_env, profile, words):
    root, hashes = dataset
    source, env, secret = profiles
    rows, log = serve_and_consume(source, dict(env, AWS_PROFILE=profile))
    check_every_sample_once_per_epoch(rows, hashes)
    lines = [line for line in log.splitlines() if "credentials for s3://" in line]
    assert len(lines) == 1 and words in lines[0], log
    assert secret not in log, log


def test_a_wrong_secret_in_a_profile_is_refused_naming_the_profile(profiles, no_key_env):
    source, env, secret = profiles
    run = subprocess.run(
        [ringfeed_bin(), "serve", "--source", source, "--name", "creds-wrong-%d" % os.getpid(),
         "--batch-size", "4", "--epochs", "1", "--manifest-max-age", "0"],
        env=dict(os.environ, **env, AWS_PROFILE="wrong"), capture_output=True, text=True, timeout=120,
    )
    assert run.returncode != 0
    assert "403" in run.stderr and "AWS profile 'wrong'" in run.stderr and "refused" in run.stderr, run.stderr
    assert secret not in run.stderr and "not-the-secret" not in run.stderr, run.stderr


def test_no_credentials_anywhere_says_what_was_tried_and_the_fix(profiles, no_key_env, tmp_path):
    source, env, _ = profiles
    env = dict(env, AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"))
    run = subprocess.run(
        [ringfeed_bin(), "serve", "--source", source, "--name", "creds-none-%d" % os.getpid(),
         "--batch-size", "4", "--epochs", "1"],
        env=dict(os.environ, **env), capture_output=True, text=True, timeout=120,
    )
    assert run.returncode != 0
    assert "no AWS credentials found" in run.stderr and "AWS_PROFILE=NAME" in run.stderr, run.stderr


def test_expired_credentials_from_a_credential_process_are_refused_at_start_naming_when_and_the_source(
    profiles, no_key_env
):
    source, env, secret = profiles
    run = subprocess.run(
        [ringfeed_bin(), "serve", "--source", source, "--name", "creds-old-%d" % os.getpid(),
         "--batch-size", "4", "--epochs", "1", "--manifest-max-age", "0"],
        env=dict(os.environ, **env, AWS_PROFILE="old"), capture_output=True, text=True, timeout=120,
    )
    assert run.returncode != 0, run.stderr
    assert "expired at 2001-01-01T00:00:00Z" in run.stderr, run.stderr
    assert "credential_process of AWS profile 'old'" in run.stderr, run.stderr
    assert secret not in run.stderr, run.stderr
