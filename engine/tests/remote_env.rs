//! Store construction from the environment: a missing or incomplete set of
//! credentials is an error naming the variable to set. One test function,
//! since it changes the process environment.

use ringfeed::remote::{RemoteError, StoreHandle};

fn open_err(url: &str) -> String {
    match StoreHandle::open(url) {
        Err(e @ RemoteError::MissingCredentials { .. }) => e.to_string(),
        other => panic!("{url}: expected missing credentials, got {other:?}"),
    }
}

#[test]
fn missing_credentials_name_the_variable_to_set() {
    for v in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_SKIP_SIGNATURE",
        "AWS_ENDPOINT_URL",
        "AWS_ALLOW_HTTP",
        "RINGFEED_AWS_INSTANCE_CREDENTIALS",
        "AWS_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_ROLE_ARN",
        "AZURE_STORAGE_ACCOUNT_NAME",
        "AZURE_STORAGE_USE_EMULATOR",
    ] {
        std::env::remove_var(v);
    }
    // No profile files, and never the instance metadata address.
    let dir = tempfile::tempdir().unwrap();
    std::env::set_var("AWS_CONFIG_FILE", dir.path().join("no-config"));
    std::env::set_var(
        "AWS_SHARED_CREDENTIALS_FILE",
        dir.path().join("no-credentials"),
    );
    std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    let text = open_err("s3://bucket/prefix");
    assert!(
        text.contains("no AWS credentials found")
            && text.contains("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
            && text.contains("AWS_PROFILE=NAME")
            && text.contains("no-credentials")
            && text.contains("disabled by AWS_EC2_METADATA_DISABLED"),
        "{text}"
    );

    std::env::set_var("AWS_ACCESS_KEY_ID", "k");
    let text = open_err("s3://bucket/prefix");
    assert!(text.contains("set AWS_SECRET_ACCESS_KEY"), "{text}");

    std::env::set_var("AWS_SECRET_ACCESS_KEY", "s");
    std::env::set_var("AWS_ENDPOINT_URL", "http://127.0.0.1:9");
    let text = open_err("s3://bucket/prefix");
    assert!(text.contains("AWS_ALLOW_HTTP=true"), "{text}");

    std::env::set_var("AWS_ALLOW_HTTP", "true");
    StoreHandle::open("s3://bucket/prefix").unwrap();

    let text = open_err("az://container/prefix");
    assert!(text.contains("AZURE_STORAGE_ACCOUNT_NAME"), "{text}");
}
