//! The proxy binary in front of a small HTTP/1.1 keep-alive server of the
//! test's own, driven by a blocking client that records when the head and the
//! body of each response arrived.

mod support;

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;

use support::*;

#[test]
fn bodies_pass_byte_for_byte_on_one_keep_alive_connection() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&upstream.addr(), &[]);
    let mut client = proxy.connect();
    let big = client.get("/bytes/3000000").unwrap();
    assert_eq!((big.status, big.body.len()), (200, 3_000_000));
    assert!(
        big.body == expected_body(3_000_000),
        "a forwarded body differs from the upstream's"
    );
    assert_eq!(
        client.get("/chunked/100000").unwrap().body,
        expected_body(100_000)
    );
    assert_eq!(
        client
            .request("HEAD", "/bytes/5000", b"")
            .unwrap()
            .body
            .len(),
        0
    );
    assert_eq!(
        client.request("PUT", "/k", &[7u8; 70_000]).unwrap().body,
        b"got 70000"
    );
    assert_eq!(client.get("/bytes/0").unwrap().body.len(), 0);
    assert_eq!(proxy.counter("connections"), 1);
    assert_eq!(proxy.counter("requests"), 5);
    assert_eq!(proxy.counter("responses"), 5);
    assert_eq!(proxy.counter("requests_on_reused_connections"), 4);
}

#[test]
fn rtt_of_20_ms_adds_about_20_ms_per_round_trip() {
    let upstream = Upstream::start();
    let round_trips = |proxy: &Proxy| {
        let mut client = proxy.connect();
        client.get("/bytes/100").unwrap(); // the connection's own extra round trip
        fastest((0..15).map(|_| client.get("/bytes/100").unwrap().done_after))
    };
    let _alone = timing_alone();
    let plain = round_trips(&Proxy::start(&upstream.addr(), &[]));
    let delayed = round_trips(&Proxy::start(&upstream.addr(), &["--rtt-ms", "20"]));
    let added_ms = delayed.saturating_sub(plain).as_secs_f64() * 1e3;
    println!(
        "fastest round trip: {plain:?} without, {delayed:?} with --rtt-ms 20: +{added_ms:.1} ms"
    );
    assert!(
        (19.0..35.0).contains(&added_ms),
        "--rtt-ms 20 added {added_ms:.1} ms per round trip"
    );
}

#[test]
fn a_new_connection_pays_one_more_round_trip_like_a_handshake() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&upstream.addr(), &["--rtt-ms", "40"]);
    let _alone = timing_alone();
    let (first, later): (Vec<Duration>, Vec<Duration>) = (0..5)
        .map(|_| {
            let mut client = proxy.connect();
            let first = client.get("/bytes/10").unwrap().done_after;
            (first, client.get("/bytes/10").unwrap().done_after)
        })
        .unzip();
    let (first, later) = (fastest(first.into_iter()), fastest(later.into_iter()));
    assert!(
        first >= Duration::from_millis(80),
        "first request on a connection took {first:?}"
    );
    assert!(
        later >= Duration::from_millis(40),
        "second request took {later:?}"
    );
    assert!(
        first >= later + Duration::from_millis(30),
        "first {first:?}, second {later:?}"
    );
}

#[test]
fn throughput_of_a_large_body_is_not_capped_by_the_rtt() {
    const BODY_BYTES: usize = 48 << 20;
    let upstream = Upstream::start();
    let fetch = |proxy: &Proxy| {
        let mut client = proxy.connect();
        client.get("/bytes/1").unwrap();
        let response = client.get(&format!("/bytes/{BODY_BYTES}")).unwrap();
        assert_eq!(response.body.len(), BODY_BYTES);
        response.done_after
    };
    let _alone = timing_alone();
    let plain = fetch(&Proxy::start(&upstream.addr(), &[]));
    let delayed = fetch(&Proxy::start(&upstream.addr(), &["--rtt-ms", "20"]));
    let mib_per_s = |t: Duration| BODY_BYTES as f64 / (1 << 20) as f64 / t.as_secs_f64();
    println!(
        "48 MiB: {plain:?} ({:.0} MiB/s) without, {delayed:?} ({:.0} MiB/s) with --rtt-ms 20",
        mib_per_s(plain),
        mib_per_s(delayed)
    );
    // Pieces of at most 64 KiB waiting 10 ms one after another would take >= 7.7 s.
    assert!(
        delayed < plain * 3 + Duration::from_secs(1),
        "{delayed:?} with the rtt, {plain:?} without"
    );
    assert!(
        delayed < Duration::from_secs(6),
        "{delayed:?}: the delay line serialises its pieces"
    );
}

#[test]
fn fraction_of_503s_is_close_to_the_requested_one_and_connections_stay_open() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&upstream.addr(), &["--error-503", "0.1", "--seed", "1"]);
    let mut injected = 0;
    for _ in 0..4 {
        let mut client = proxy.connect();
        for _ in 0..250 {
            let response = client.get("/bytes/1000").unwrap();
            if response.status == 503 {
                assert!(String::from_utf8_lossy(&response.body).contains("<Code>SlowDown</Code>"));
                injected += 1;
            } else {
                assert_eq!((response.status, response.body), (200, expected_body(1000)));
            }
        }
    }
    assert!(
        (70..=130).contains(&injected),
        "{injected} of 1000 requests got 503 at --error-503 0.1"
    );
    assert_eq!(proxy.counter("injected_503"), injected);
    assert_eq!(
        upstream.requests.load(Ordering::Relaxed),
        1000 - injected,
        "a 503'd request reached the upstream"
    );
    assert_eq!(proxy.counter("connections"), 4);
    let printed = proxy.stop();
    let summary = printed.lines().last().unwrap();
    assert!(summary.starts_with("faultproxy summary: "), "{printed}");
    assert!(
        summary.contains(&format!(" injected_503={injected} ")),
        "{summary}"
    );
}

#[test]
fn a_rate_bucket_answers_the_requests_past_its_rate_503_slowdown_with_retry_after() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(
        &upstream.addr(),
        &[
            "--rate",
            "100",
            "--rate-burst",
            "10",
            "--retry-after-s",
            "3",
        ],
    );
    let mut client = proxy.connect();
    let started = std::time::Instant::now();
    let (mut ok, mut slowed) = (0u64, 0u64);
    while started.elapsed() < Duration::from_millis(500) {
        let response = client.get("/bytes/100").unwrap();
        if response.status == 503 {
            let text = String::from_utf8_lossy(&response.body).into_owned();
            assert!(text.contains("<Code>SlowDown</Code>"), "{text}");
            assert_eq!(response.header("retry-after").as_deref(), Some("3"));
            slowed += 1;
        } else {
            assert_eq!((response.status, response.body), (200, expected_body(100)));
            ok += 1;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    // The burst of 10, then 100 a second (a little slack for the clock).
    assert!(
        ok as f64 <= 10.0 + 100.0 * secs + 3.0 && ok as f64 >= 100.0 * secs * 0.8,
        "{ok} admitted in {secs:.2} s at --rate 100"
    );
    assert!(slowed > 0, "nothing was refused");
    assert_eq!(proxy.counter("rate_limited"), slowed);
    assert_eq!(
        proxy.counter("injected_503"),
        0,
        "the bucket's 503s are counted apart"
    );
    assert_eq!(upstream.requests.load(Ordering::Relaxed), ok);
}

#[test]
fn a_rate_bucket_503_takes_the_whole_round_trip() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(
        &upstream.addr(),
        &["--rate", "0.001", "--rate-burst", "1", "--rtt-ms", "40"],
    );
    let _alone = timing_alone();
    let mut client = proxy.connect();
    assert_eq!(
        client.get("/bytes/10").unwrap().status,
        200,
        "the burst of one"
    );
    let refused = fastest((0..5).map(|_| {
        let r = client.get("/bytes/10").unwrap();
        assert_eq!(r.status, 503);
        r.done_after
    }));
    assert!(
        refused >= Duration::from_millis(38),
        "a refusal came back after {refused:?}, under the 40 ms round trip"
    );
}

#[test]
fn every_request_gets_429_at_fraction_one_and_head_gets_no_body() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&upstream.addr(), &["--error-429", "1"]);
    let mut client = proxy.connect();
    assert_eq!(client.get("/bytes/10").unwrap().status, 429);
    let head = client.request("HEAD", "/bytes/10", b"").unwrap();
    assert_eq!(head.status, 429);
    assert_eq!(
        client.request("PUT", "/k", &[1u8; 5000]).unwrap().status,
        429
    );
    assert_eq!(
        client.get("/bytes/10").unwrap().status,
        429,
        "the PUT body was not skipped"
    );
    assert_eq!(upstream.requests.load(Ordering::Relaxed), 0);
    assert_eq!(proxy.counter("injected_429"), 4);
}

#[test]
fn faults_apply_only_to_the_methods_named() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(
        &upstream.addr(),
        &["--error-503", "1", "--methods", "GET,HEAD"],
    );
    let mut client = proxy.connect();
    assert_eq!(client.request("PUT", "/k", b"abc").unwrap().status, 200);
    assert_eq!(client.get("/bytes/3").unwrap().status, 503);
}

#[test]
fn resets_cut_responses_mid_body_with_an_rst() {
    const BODY_BYTES: usize = 200_000;
    let upstream = Upstream::start();
    let proxy = Proxy::start(&upstream.addr(), &["--reset", "0.3", "--seed", "3"]);
    let mut resets = 0;
    for _ in 0..40 {
        let mut client = proxy.connect();
        match client.get(&format!("/bytes/{BODY_BYTES}")) {
            Ok(response) => assert_eq!(response.body, expected_body(BODY_BYTES)),
            Err(e) => {
                assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}");
                resets += 1;
            }
        }
    }
    assert!(
        (3..=24).contains(&resets),
        "{resets} of 40 responses reset at --reset 0.3"
    );
    assert_eq!(proxy.counter("resets"), resets);
}

#[test]
fn a_reset_response_delivers_its_headers_and_at_most_half_its_body() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&upstream.addr(), &["--reset", "1"]);
    let stream = TcpStream::connect(("127.0.0.1", proxy.port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(READ_TIMEOUT_S)))
        .unwrap();
    (&stream)
        .write_all(b"GET /bytes/100000 HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut received = Vec::new();
    let mut buf = [0u8; 65536];
    let error = loop {
        match (&stream).read(&mut buf) {
            Ok(0) => panic!(
                "the connection closed with FIN, not RST, after {} bytes",
                received.len()
            ),
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e) => break e,
        }
    };
    assert_eq!(error.kind(), io::ErrorKind::ConnectionReset);
    let text = String::from_utf8_lossy(&received);
    // The kernel may drop unread bytes when the RST lands, so only an upper bound holds.
    if !received.is_empty() {
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text:.40}");
    }
    assert!(
        received.len() < 50_000 + 100,
        "{} bytes arrived before the reset",
        received.len()
    );
}

#[test]
fn stalls_hold_the_body_after_the_headers() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&upstream.addr(), &["--stall", "1", "--stall-ms", "1500"]);
    let mut client = proxy.connect();
    let response = client.get("/bytes/1000").unwrap();
    assert_eq!(response.body, expected_body(1000));
    assert!(
        response.head_after < Duration::from_millis(1000),
        "headers after {:?}",
        response.head_after
    );
    let held = response.done_after - response.head_after;
    assert!(
        held >= Duration::from_millis(1490),
        "body held only {held:?} after the headers"
    );
    assert_eq!(proxy.counter("stalls"), 1);
}

#[test]
fn trickles_send_the_body_at_the_given_rate() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(
        &upstream.addr(),
        &["--trickle", "1", "--trickle-bytes-per-s", "20000"],
    );
    let mut client = proxy.connect();
    let response = client.get("/bytes/10000").unwrap();
    assert_eq!(response.body, expected_body(10_000));
    // 2,000 bytes every 100 ms: the fifth piece leaves at 400 ms.
    assert!(
        response.done_after >= Duration::from_millis(400),
        "10 kB took {:?}",
        response.done_after
    );
    assert_eq!(proxy.counter("trickles"), 1);
}

#[test]
fn the_same_seed_injects_the_same_faults() {
    let upstream = Upstream::start();
    let statuses = |seed: &str| -> Vec<u16> {
        let proxy = Proxy::start(&upstream.addr(), &["--error-503", "0.5", "--seed", seed]);
        let mut client = proxy.connect();
        (0..40)
            .map(|_| client.get("/bytes/10").unwrap().status)
            .collect()
    };
    let first = statuses("5");
    assert_eq!(first, statuses("5"));
    assert_ne!(first, statuses("6"));
}

#[test]
fn an_upstream_that_is_down_is_answered_502_naming_it() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let upstream = format!("127.0.0.1:{port}");
    let proxy = Proxy::start(&upstream, &[]);
    let response = proxy.connect().get("/x").unwrap();
    assert_eq!(response.status, 502);
    let text = String::from_utf8_lossy(&response.body);
    assert!(
        text.contains(&format!("cannot connect to the upstream {upstream}")),
        "{text}"
    );
    assert_eq!(proxy.counter("upstream_connect_errors"), 1);
}

#[test]
fn a_fraction_out_of_range_is_refused_naming_the_flag() {
    let output = Command::new(env!("CARGO_BIN_EXE_faultproxy"))
        .args(["--upstream", "127.0.0.1:1", "--error-503", "1.5"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--error-503 1.5 is not a fraction"),
        "{stderr}"
    );
}
