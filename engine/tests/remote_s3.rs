//! The remote engine against a real, signature-checking S3 server (s3s-fs).
//!
//! Needs, from the environment:
//! - `RINGFEED_TEST_S3_ENDPOINT`: the server, e.g. `http://127.0.0.1:9000`;
//! - `RINGFEED_TEST_S3_BUCKET`: an existing bucket (default `ringfeed-test`);
//! - `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`: the server's keys.
//!
//! Without the endpoint the test is skipped with a printed reason, except
//! under `CI=true`, where it fails.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use ringfeed::remote::{
    list, list_parallel, FetchConfig, FetchEngine, FetchRead, RemoteError, RemoteRuntime,
    StoreHandle,
};

fn endpoint() -> Option<String> {
    match std::env::var("RINGFEED_TEST_S3_ENDPOINT") {
        Ok(v) if !v.is_empty() => Some(v),
        _ => {
            let reason = "RINGFEED_TEST_S3_ENDPOINT is not set (start s3s-fs and export it, with \
                          AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and RINGFEED_TEST_S3_BUCKET)";
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("CI=true but {reason}");
            }
            eprintln!("skipping the S3 test: {reason}");
            None
        }
    }
}

fn data(i: usize) -> Vec<u8> {
    let len = match i {
        0 => 20 << 20, // three 8 MiB parts
        _ => 1000 + (i * 7919) % 150_000,
    };
    let mut x = (i as u64 + 1).wrapping_mul(0x9E3779B97F4A7C15);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn fetch_one(engine: &mut FetchEngine, object: u32, len: u64) -> Result<Vec<u8>, RemoteError> {
    let mut buf = vec![0u8; len as usize];
    let read = FetchRead {
        object,
        range: 0..len,
        dest: buf.as_mut_ptr(),
        tag: 7,
    };
    // SAFETY: `buf` holds `len` bytes and is not touched until the completion is reaped.
    unsafe { engine.submit(&[read]) }?;
    let mut done = Vec::new();
    while engine.outstanding() > 0 {
        engine.reap(&mut done, 1, Duration::from_secs(60));
    }
    done.pop().map_or(Ok(()), |c| c.result).map(|()| buf)
}

#[test]
fn s3_server_serves_listings_and_exact_bytes_and_errors_name_the_fix() {
    let Some(endpoint) = endpoint() else { return };
    let bucket =
        std::env::var("RINGFEED_TEST_S3_BUCKET").unwrap_or_else(|_| "ringfeed-test".to_string());
    // One test function: it sets process environment, which other threads must not race.
    std::env::set_var("AWS_ENDPOINT_URL", &endpoint);
    std::env::set_var("AWS_ALLOW_HTTP", "true");
    if std::env::var("AWS_REGION").is_err() {
        std::env::set_var("AWS_REGION", "us-east-1");
    }
    let rt = Arc::new(RemoteRuntime::new(2).unwrap());
    let prefix = format!("remote-test-{}", std::process::id());
    let url = format!("s3://{bucket}/{prefix}");
    let store = StoreHandle::open(&url).unwrap();
    const N: usize = 120;
    for i in 0..N {
        let key = Path::from(format!("{prefix}/d{}/obj-{i:04}", i % 4));
        rt.block_on(store.meta.put(&key, PutPayload::from(data(i))))
            .unwrap();
    }

    let one = rt.block_on(list(&store, None)).unwrap();
    let many = rt.block_on(list_parallel(&store, 8, None)).unwrap();
    assert_eq!(one.len(), N);
    assert_eq!(one, many);
    let objects = Arc::new(one);

    let cfg = FetchConfig {
        window_initial: 64,
        ..FetchConfig::default()
    };
    let mut engine = FetchEngine::start(
        Arc::clone(&rt),
        store.clone(),
        Arc::clone(&objects),
        cfg.clone(),
    )
    .unwrap();
    let mut bufs: Vec<Vec<u8>> = objects.iter().map(|o| vec![0u8; o.size as usize]).collect();
    let reads: Vec<FetchRead> = bufs
        .iter_mut()
        .enumerate()
        .map(|(i, b)| FetchRead {
            object: i as u32,
            range: 0..b.len() as u64,
            dest: b.as_mut_ptr(),
            tag: i as u64,
        })
        .collect();
    // SAFETY: one buffer per read, untouched until every completion is reaped.
    unsafe { engine.submit(&reads).unwrap() };
    let mut done = Vec::new();
    while engine.outstanding() > 0 {
        engine.reap(&mut done, 1, Duration::from_secs(60));
    }
    for c in &done {
        assert!(c.result.is_ok(), "{:?}", c.result);
    }
    for (o, b) in objects.iter().zip(&bufs) {
        let i: usize = o.key.rsplit('-').next().unwrap().parse().unwrap();
        assert!(*b == data(i), "bytes of {}", o.key);
    }
    eprintln!("s3 metrics: {:?}", engine.metrics().snapshot());

    // A changed object (another size) is caught and named.
    let changed = objects
        .iter()
        .position(|o| o.key.ends_with("obj-0005"))
        .unwrap();
    let key = store.path_of(&objects[changed].key);
    rt.block_on(store.meta.put(&key, PutPayload::from_static(b"short")))
        .unwrap();
    let err = fetch_one(&mut engine, changed as u32, objects[changed].size).unwrap_err();
    assert!(
        matches!(err, RemoteError::Changed { .. }) && err.to_string().contains("obj-0005"),
        "{err}"
    );

    // A deleted object: 404 naming the key.
    rt.block_on(store.meta.delete(&key)).unwrap();
    let err = fetch_one(&mut engine, changed as u32, objects[changed].size).unwrap_err();
    assert!(
        err.to_string().contains("HTTP 404") && err.to_string().contains("obj-0005"),
        "{err}"
    );
    drop(engine);

    // A wrong secret: the server checks signatures, so 403 naming the variables.
    let secret = std::env::var("AWS_SECRET_ACCESS_KEY").unwrap();
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "not-the-secret");
    let bad = StoreHandle::open(&url).unwrap();
    std::env::set_var("AWS_SECRET_ACCESS_KEY", &secret);
    let mut engine =
        FetchEngine::start(Arc::clone(&rt), bad.clone(), Arc::clone(&objects), cfg).unwrap();
    let err = fetch_one(&mut engine, 1, objects[1].size).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("AWS_SECRET_ACCESS_KEY") && text.contains(&objects[1].key),
        "{text}"
    );
    let text = rt.block_on(list(&bad, None)).unwrap_err().to_string();
    assert!(text.contains("AWS_SECRET_ACCESS_KEY"), "{text}");
    drop(engine);

    // A missing bucket: the listing says so.
    let missing = StoreHandle::open("s3://no-such-bucket-ringfeed/x").unwrap();
    let text = rt.block_on(list(&missing, None)).unwrap_err().to_string();
    assert!(text.contains("no-such-bucket-ringfeed"), "{text}");

    for o in objects.iter() {
        let _ = rt.block_on(store.meta.delete(&store.path_of(&o.key)));
    }

    // Enough keys for the parallel listing to split its key space (start-after).
    let many_url = format!("s3://{bucket}/{prefix}-many");
    let many_store = StoreHandle::open(&many_url).unwrap();
    let keys: Vec<Path> = (0..2500)
        .map(|i| many_store.path_of(&format!("k/{i:05}")))
        .collect();
    rt.block_on(
        futures::stream::iter(
            keys.iter()
                .map(|k| many_store.meta.put(k, PutPayload::from_static(b"x"))),
        )
        .buffer_unordered(32)
        .collect::<Vec<_>>(),
    )
    .into_iter()
    .for_each(|r| assert!(r.is_ok(), "{r:?}"));
    let ranges = std::sync::atomic::AtomicU64::new(0);
    let progress = |p: ringfeed::remote::ListProgress| {
        ranges.fetch_max(p.ranges_done, std::sync::atomic::Ordering::Relaxed);
    };
    let one = rt.block_on(list(&many_store, None)).unwrap();
    let many = rt
        .block_on(list_parallel(&many_store, 8, Some(&progress)))
        .unwrap();
    assert_eq!(one.len(), 2500);
    assert_eq!(one, many);
    assert!(ranges.into_inner() > 1, "the key space was never split");
    rt.block_on(
        futures::stream::iter(keys.iter().map(|k| many_store.meta.delete(k)))
            .buffer_unordered(32)
            .collect::<Vec<_>>(),
    );
}
