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
        "AZURE_STORAGE_ACCOUNT_NAME",
        "AZURE_STORAGE_USE_EMULATOR",
    ] {
        std::env::remove_var(v);
    }
    let text = open_err("s3://bucket/prefix");
    assert!(
        text.contains("AWS_ACCESS_KEY_ID") && text.contains("AWS_SECRET_ACCESS_KEY"),
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
