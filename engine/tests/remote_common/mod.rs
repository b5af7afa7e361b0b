//! A tiny HTTP/1.1 object server for the remote tests: ranged GET, HEAD and
//! WebDAV PROPFIND (depth 0 and 1 only, as nginx), with faults injected on
//! demand: 503s, bodies cut mid-way (a reset), stalls after the headers,
//! bodies that trickle, headers sent late, Range ignored or answered wrong,
//! and 403s for chosen keys.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Faults the next GETs meet; each counter is used up one GET at a time.
#[derive(Default)]
pub struct Faults {
    /// GETs to answer `503 SlowDown`.
    pub status_503: AtomicUsize,
    /// GETs whose body stops half-way and whose connection is closed.
    pub cut_body: AtomicUsize,
    /// GETs that send headers, then nothing for `stall_ms`.
    pub stall: AtomicUsize,
    /// How long a stall lasts.
    pub stall_ms: AtomicUsize,
    /// GETs whose body is sent one byte at a time, `trickle_gap_ms` apart.
    pub trickle: AtomicUsize,
    /// The pause between two bytes of a trickled body.
    pub trickle_gap_ms: AtomicUsize,
    /// Every GET waits this long before its response headers (0: none).
    pub header_delay_ms: AtomicUsize,
    /// Ranged GETs answered `200 OK` with the whole object (Range ignored).
    pub ignore_range: AtomicUsize,
    /// Ranged GETs answered 206 with the object's first bytes and a
    /// Content-Range that says so, whatever range was asked.
    pub wrong_range: AtomicUsize,
    /// GETs that send headers, wait `hold_ms`, then send their whole body
    /// (a slow answer that does come, unlike a stall).
    pub hold: AtomicUsize,
    /// How long a held GET waits before its body.
    pub hold_ms: AtomicUsize,
    /// Non-zero: a held GET sends the first half of its body before it
    /// waits (a GET that stalls mid-body, then goes on).
    pub hold_after_half: AtomicUsize,
    /// `Retry-After` seconds sent with each 503 (0: none).
    pub retry_after_s: AtomicUsize,
    /// Keys answered 403.
    pub forbidden: Mutex<HashSet<String>>,
    /// Every GET seen.
    pub gets: AtomicUsize,
}

fn take(c: &AtomicUsize) -> bool {
    c.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
        .is_ok()
}

/// A running server; objects live under `/data/`.
pub struct TestServer {
    pub url: String,
    pub objects: Arc<Mutex<BTreeMap<String, Vec<u8>>>>,
    pub faults: Arc<Faults>,
}

impl TestServer {
    pub fn start(objects: BTreeMap<String, Vec<u8>>) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let objects = Arc::new(Mutex::new(objects));
        let faults = Arc::new(Faults::default());
        let (o, f) = (Arc::clone(&objects), Arc::clone(&faults));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (o, f) = (Arc::clone(&o), Arc::clone(&f));
                std::thread::spawn(move || serve(conn, &o, &f));
            }
        });
        TestServer {
            url: format!("http://127.0.0.1:{port}/data"),
            objects,
            faults,
        }
    }
}

fn etag(data: &[u8]) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for &b in data {
        h = (h ^ b as u64).wrapping_mul(0x100000001b3);
    }
    format!("\"{h:016x}-{}\"", data.len())
}

fn serve(conn: TcpStream, objects: &Mutex<BTreeMap<String, Vec<u8>>>, faults: &Faults) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut out = conn;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let (method, target) = (
            parts.next().unwrap_or("").to_string(),
            parts.next().unwrap_or("").to_string(),
        );
        let mut headers = BTreeMap::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
        let body_len: usize = headers
            .get("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; body_len];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let path = decode(&target);
        let Some(key) = path
            .strip_prefix("/data/")
            .map(str::to_string)
            .or_else(|| (path == "/data").then(String::new))
        else {
            respond(&mut out, "404 Not Found", &[], b"");
            continue;
        };
        let keep = match method.as_str() {
            "GET" | "HEAD" => get(&mut out, &method, &key, &headers, objects, faults),
            "PROPFIND" => propfind(&mut out, &key, &headers, objects),
            _ => {
                respond(&mut out, "405 Method Not Allowed", &[], b"");
                true
            }
        };
        if !keep {
            return;
        }
    }
}

fn respond(out: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) {
    let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = out.write_all(head.as_bytes());
    let _ = out.write_all(body);
}

fn get(
    out: &mut TcpStream,
    method: &str,
    key: &str,
    headers: &BTreeMap<String, String>,
    objects: &Mutex<BTreeMap<String, Vec<u8>>>,
    faults: &Faults,
) -> bool {
    faults.gets.fetch_add(1, Ordering::SeqCst);
    let delay_ms = faults.header_delay_ms.load(Ordering::SeqCst);
    if method == "GET" && delay_ms > 0 {
        std::thread::sleep(Duration::from_millis(delay_ms as u64));
    }
    if faults.forbidden.lock().unwrap().contains(key) {
        respond(
            out,
            "403 Forbidden",
            &[],
            b"<Error><Code>AccessDenied</Code></Error>",
        );
        return true;
    }
    let Some(data) = objects.lock().unwrap().get(key).cloned() else {
        respond(out, "404 Not Found", &[], b"");
        return true;
    };
    if method == "GET" && take(&faults.status_503) {
        let retry_after = faults.retry_after_s.load(Ordering::SeqCst);
        let headers = match retry_after {
            0 => vec![],
            s => vec![("Retry-After", s.to_string())],
        };
        respond(
            out,
            "503 Service Unavailable",
            &headers,
            b"<Error><Code>SlowDown</Code></Error>",
        );
        return true;
    }
    let tag = etag(&data);
    if let Some(m) = headers.get("if-match") {
        if m != &tag && m != "*" {
            respond(out, "412 Precondition Failed", &[], b"");
            return true;
        }
    }
    let lm = ("Last-Modified", "Wed, 21 Oct 2015 07:28:00 GMT".to_string());
    let (status, range) = match headers.get("range").and_then(|r| r.strip_prefix("bytes=")) {
        Some(_) if method == "GET" && take(&faults.ignore_range) => ("200 OK", 0..data.len()),
        Some(r) => {
            let (a, b) = r.split_once('-').unwrap();
            let a: usize = a.parse().unwrap();
            let b: usize = b.parse::<usize>().unwrap().min(data.len() - 1);
            if method == "GET" && take(&faults.wrong_range) {
                ("206 Partial Content", 0..b + 1 - a)
            } else {
                ("206 Partial Content", a..b + 1)
            }
        }
        None => ("200 OK", 0..data.len()),
    };
    let body = &data[range.clone()];
    let mut hs = vec![("ETag", tag), lm, ("Accept-Ranges", "bytes".to_string())];
    if status.starts_with("206") {
        hs.push((
            "Content-Range",
            format!("bytes {}-{}/{}", range.start, range.end - 1, data.len()),
        ));
    }
    if method == "HEAD" {
        let mut head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n", data.len());
        for (k, v) in &hs {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let _ = out.write_all(head.as_bytes());
        return true;
    }
    if take(&faults.cut_body) {
        let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n", body.len());
        for (k, v) in &hs {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let _ = out.write_all(head.as_bytes());
        let _ = out.write_all(&body[..body.len() / 2]);
        let _ = out.flush();
        let _ = out.shutdown(std::net::Shutdown::Both);
        return false;
    }
    if take(&faults.stall) {
        let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n", body.len());
        for (k, v) in &hs {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let _ = out.write_all(head.as_bytes());
        let _ = out.flush();
        std::thread::sleep(Duration::from_millis(
            faults.stall_ms.load(Ordering::SeqCst) as u64,
        ));
        let _ = out.shutdown(std::net::Shutdown::Both);
        return false;
    }
    if method == "GET" && take(&faults.hold) {
        let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n", body.len());
        for (k, v) in &hs {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let _ = out.write_all(head.as_bytes());
        let first = match faults.hold_after_half.load(Ordering::SeqCst) {
            0 => 0,
            _ => body.len() / 2,
        };
        let _ = out.write_all(&body[..first]);
        let _ = out.flush();
        std::thread::sleep(Duration::from_millis(
            faults.hold_ms.load(Ordering::SeqCst) as u64
        ));
        // The client may have given up (closed): the write fails, no matter.
        return out.write_all(&body[first..]).is_ok() && out.flush().is_ok();
    }
    if take(&faults.trickle) {
        let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n", body.len());
        for (k, v) in &hs {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let _ = out.write_all(head.as_bytes());
        let gap = Duration::from_millis(faults.trickle_gap_ms.load(Ordering::SeqCst) as u64);
        for b in body {
            // The client gave up (closed its end): stop trickling.
            if out.write_all(std::slice::from_ref(b)).is_err() || out.flush().is_err() {
                return false;
            }
            std::thread::sleep(gap);
        }
        return true;
    }
    respond(out, status, &hs, body);
    true
}

fn propfind(
    out: &mut TcpStream,
    key: &str,
    headers: &BTreeMap<String, String>,
    objects: &Mutex<BTreeMap<String, Vec<u8>>>,
) -> bool {
    if headers.get("depth").map(String::as_str) != Some("1") {
        // As nginx's dav-ext: only depths 0 and 1.
        respond(out, "403 Forbidden", &[], b"");
        return true;
    }
    let dir = if key.is_empty() || key.ends_with('/') {
        key.to_string()
    } else {
        format!("{key}/")
    };
    let objects = objects.lock().unwrap();
    let mut xml = String::from("<?xml version=\"1.0\"?><D:multistatus xmlns:D=\"DAV:\">");
    let mut entry = |href: &str, size: Option<usize>| {
        xml.push_str(&format!(
            "<D:response><D:href>{}</D:href><D:propstat><D:prop>",
            encode(href)
        ));
        match size {
            None => xml.push_str("<D:resourcetype><D:collection/></D:resourcetype>"),
            Some(n) => xml.push_str(&format!(
                "<D:resourcetype/><D:getcontentlength>{n}</D:getcontentlength>"
            )),
        }
        xml.push_str("</D:prop><D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response>");
    };
    entry(&format!("/data/{dir}"), None);
    let mut subdirs = HashSet::new();
    for (k, v) in objects.iter() {
        let Some(rest) = k.strip_prefix(&dir) else {
            continue;
        };
        match rest.split_once('/') {
            Some((sub, _)) => {
                if subdirs.insert(sub.to_string()) {
                    entry(&format!("/data/{dir}{sub}/"), None);
                }
            }
            None => entry(&format!("/data/{dir}{rest}"), Some(v.len())),
        }
    }
    xml.push_str("</D:multistatus>");
    respond(
        out,
        "207 Multi-Status",
        &[("Content-Type", "application/xml".to_string())],
        xml.as_bytes(),
    );
    true
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'/' | b'-' | b'_' | b'.' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Deterministic pseudo-random bytes.
pub fn bytes_for(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
