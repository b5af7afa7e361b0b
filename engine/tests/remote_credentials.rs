//! S3 credentials as users hold them, against a signature-checking server
//! (s3s-fs): keys only in a profile of the shared credentials file, a
//! profile whose `credential_process` prints them, a profile with a wrong
//! secret (a 403 that names the profile), a `credential_process` that
//! prints credentials that expired in 2001 (refused at open, naming when),
//! a profile that does not exist.
//!
//! Needs `RINGFEED_TEST_S3_ENDPOINT`, `RINGFEED_TEST_S3_BUCKET` (default
//! `ringfeed-test`, an existing bucket) and the server's keys in
//! `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`, which the test moves into
//! profile files and removes from the environment. Skipped without the
//! endpoint, except under `CI=true`. One test function: it changes the
//! process environment. The instance metadata service is disabled
//! (`AWS_EC2_METADATA_DISABLED=true`): no test may reach 169.254.169.254.

use std::os::unix::fs::PermissionsExt;

use object_store::{ObjectStoreExt, PutPayload};
use ringfeed::remote::{list, RemoteError, RemoteRuntime, Scheme, StoreHandle};

fn endpoint() -> Option<String> {
    match std::env::var("RINGFEED_TEST_S3_ENDPOINT") {
        Ok(v) if !v.is_empty() => Some(v),
        _ => {
            let reason = "RINGFEED_TEST_S3_ENDPOINT is not set (start s3s-fs and export it, with \
                          AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and RINGFEED_TEST_S3_BUCKET)";
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("CI=true but {reason}");
            }
            eprintln!("skipping the S3 credentials test: {reason}");
            None
        }
    }
}

#[test]
fn s3_credentials_from_a_profile_or_its_credential_process_are_used_and_a_refusal_names_the_profile(
) {
    let Some(endpoint) = endpoint() else { return };
    let bucket =
        std::env::var("RINGFEED_TEST_S3_BUCKET").unwrap_or_else(|_| "ringfeed-test".to_string());
    let key = std::env::var("AWS_ACCESS_KEY_ID").unwrap();
    let secret = std::env::var("AWS_SECRET_ACCESS_KEY").unwrap();
    for v in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_SKIP_SIGNATURE",
    ] {
        std::env::remove_var(v);
    }
    std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    std::env::set_var("AWS_ENDPOINT_URL", &endpoint);
    std::env::set_var("AWS_ALLOW_HTTP", "true");
    std::env::set_var("AWS_REGION", "us-east-1");

    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("print-creds.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nprintf '%s' '{{\"Version\": 1, \"AccessKeyId\": \"{key}\", \
             \"SecretAccessKey\": \"{secret}\", \"Expiration\": \"2099-01-01T00:00:00Z\"}}'\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o700)).unwrap();
    // Right keys that expired long ago: s3s-fs would take them, the loader must not.
    let expired_script = dir.path().join("print-expired-creds.sh");
    std::fs::write(
        &expired_script,
        format!(
            "#!/bin/sh\nprintf '%s' '{{\"Version\": 1, \"AccessKeyId\": \"{key}\", \
             \"SecretAccessKey\": \"{secret}\", \"SessionToken\": \"t\", \
             \"Expiration\": \"2001-01-01T00:00:00Z\"}}'\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&expired_script, std::fs::Permissions::from_mode(0o700)).unwrap();
    let credentials = dir.path().join("credentials");
    std::fs::write(
        &credentials,
        format!(
            "[train]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n\n\
             [wrong]\naws_access_key_id = {key}\naws_secret_access_key = not-the-secret\n"
        ),
    )
    .unwrap();
    let config = dir.path().join("config");
    std::fs::write(
        &config,
        format!(
            "[profile proc]\ncredential_process = {}\n\n[profile broken]\ncredential_process = {}\n\n\
             [profile old]\ncredential_process = {}\n",
            script.display(),
            dir.path().join("no-such-command").display(),
            expired_script.display()
        ),
    )
    .unwrap();
    std::env::set_var("AWS_SHARED_CREDENTIALS_FILE", &credentials);
    std::env::set_var("AWS_CONFIG_FILE", &config);

    let rt = RemoteRuntime::new(2).unwrap();
    let prefix = format!("creds-{}", std::process::id());
    let url = format!("s3://{bucket}/{prefix}");

    // Keys only in the profile: written and listed back.
    std::env::set_var("AWS_PROFILE", "train");
    let store = StoreHandle::open(&url).unwrap();
    let fix = Scheme::S3.permission_fix();
    assert!(
        fix.contains("AWS profile 'train' from") && fix.contains("credentials"),
        "{fix}"
    );
    rt.block_on(
        store
            .meta
            .put(&store.path_of("a.bin"), PutPayload::from_static(b"abc")),
    )
    .unwrap();
    let listed = rt.block_on(list(&store, None)).unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!((listed[0].key.as_str(), listed[0].size), ("a.bin", 3));

    // The keys printed by credential_process.
    std::env::set_var("AWS_PROFILE", "proc");
    let store = StoreHandle::open(&url).unwrap();
    let fix = Scheme::S3.permission_fix();
    assert!(
        fix.contains("credential_process of AWS profile 'proc'"),
        "{fix}"
    );
    let got = rt
        .block_on(async { store.meta.get(&store.path_of("a.bin")).await?.bytes().await })
        .unwrap();
    assert_eq!(&got[..], b"abc");

    // A wrong secret: the server's 403 names the profile the keys came from.
    std::env::set_var("AWS_PROFILE", "wrong");
    let store = StoreHandle::open(&url).unwrap();
    let text = rt.block_on(list(&store, None)).unwrap_err().to_string();
    assert!(
        text.contains("refused")
            && text.contains("AWS profile 'wrong'")
            && !text.contains("not-the-secret"),
        "{text}"
    );

    // A credential_process that cannot run: an error naming the source.
    std::env::set_var("AWS_PROFILE", "broken");
    match StoreHandle::open(&url) {
        Err(e @ RemoteError::CredentialSource { .. }) => {
            let text = e.to_string();
            assert!(text.contains("profile 'broken'"), "{text}");
        }
        other => panic!("expected a credential source error, got {other:?}"),
    }

    // Expired credentials from a credential_process: refused when the store
    // opens, saying when they expired and where they came from.
    std::env::set_var("AWS_PROFILE", "old");
    match StoreHandle::open(&url) {
        Err(e @ RemoteError::CredentialSource { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("expired at 2001-01-01T00:00:00Z")
                    && text.contains("credential_process of AWS profile 'old'")
                    && !text.contains(&secret),
                "{text}"
            );
        }
        other => panic!("expected an expired credentials error, got {other:?}"),
    }

    // A profile that is in neither file.
    std::env::set_var("AWS_PROFILE", "nosuch");
    let text = StoreHandle::open(&url).unwrap_err().to_string();
    assert!(text.contains("nosuch"), "{text}");

    std::env::set_var("AWS_PROFILE", "train");
    let store = StoreHandle::open(&url).unwrap();
    let _ = rt.block_on(store.meta.delete(&store.path_of("a.bin")));
}
