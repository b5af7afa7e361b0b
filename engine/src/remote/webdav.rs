//! Listing an http(s):// source by WebDAV PROPFIND with `Depth: 1`, walking
//! the tree one directory per request. object_store's HTTP store asks for
//! `Depth: infinity`, which nginx (dav-ext) refuses; depth 1 works on nginx,
//! rclone, Apache and every other WebDAV server.
//!
//! An answer is streamed into the XML reader as it arrives, never buffered
//! whole: at most [`PROPFIND_BYTES_MAX`] bytes and [`PROPFIND_ENTRIES_MAX`]
//! entries per answer (an endless answer is an error naming the cap), and
//! every name is checked as a key ([`super::check_key`]).

use std::collections::HashSet;
use std::io::{BufRead, Read};
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::{BoxStream, FuturesUnordered};
use futures::StreamExt;
use object_store::client::{HttpConnector, HttpRequestBody};
use object_store::ClientOptions;
use quick_xml::events::Event;

use super::error::RemoteError;
use super::metrics::CountingConnector;
use super::redact::percent_decode;
use super::store::{Scheme, StoreHandle};
use super::RemoteObject;

/// PROPFIND requests in flight while walking.
pub const PROPFIND_IN_FLIGHT: usize = 16;
/// Deepest directory nesting walked (a loop of links stops here).
pub const WEBDAV_DEPTH_MAX: usize = 64;
/// Most bytes of one PROPFIND answer (about 500 000 entries of nginx's).
pub const PROPFIND_BYTES_MAX: u64 = 256 << 20;
/// Most `<response>` entries in one PROPFIND answer (one directory's).
pub const PROPFIND_ENTRIES_MAX: usize = 1_000_000;
/// Longest text of one field (a name, a size, an ETag).
pub const PROPFIND_FIELD_BYTES_MAX: usize = 64 << 10;

const PROPFIND_BODY: &str = r#"<?xml version="1.0" encoding="utf-8"?>
<propfind xmlns="DAV:"><prop><resourcetype/><getcontentlength/><getetag/></prop></propfind>"#;

/// One `<response>` of a multistatus answer.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct DavEntry {
    pub(crate) href: String,
    pub(crate) is_dir: bool,
    pub(crate) size: Option<u64>,
    pub(crate) etag: Option<String>,
}

/// Lists every file under the source's base URL (see the module docs).
pub async fn list_webdav(store: &StoreHandle) -> Result<Vec<RemoteObject>, RemoteError> {
    let base = store
        .http_base
        .clone()
        .ok_or_else(|| RemoteError::Listing {
            url: store.display.clone(),
            status: 0,
            scheme: store.scheme,
            detail: "WebDAV listing needs an http(s):// source".to_string(),
        })?;
    let shown = super::redact_url(&base);
    let err = |status: u16, detail: String| RemoteError::Listing {
        url: shown.clone(),
        status,
        scheme: Scheme::Http,
        detail,
    };
    let options = ClientOptions::new()
        .with_allow_http(true)
        .with_default_headers(store.http_headers.clone())
        .with_connect_timeout(std::time::Duration::from_millis(super::CONNECT_TIMEOUT_MS));
    let client = CountingConnector::new(Arc::clone(&store.metrics))
        .connect(&options)
        .map_err(|e| err(0, e.to_string()))?;
    let base_path = url_path(&base).to_string();
    let origin = base[..base.len() - base_path.len()].to_string();
    let mut seen = HashSet::new();
    let mut pending = FuturesUnordered::new();
    let mut queue = vec![(base_path.clone(), 0usize)];
    let mut out = Vec::new();
    loop {
        while pending.len() < PROPFIND_IN_FLIGHT {
            let Some((dir, depth)) = queue.pop() else {
                break;
            };
            if !seen.insert(dir.clone()) {
                continue;
            }
            let client = client.clone();
            let url = format!("{origin}{dir}");
            pending.push(async move { (dir, depth, propfind(&client, &url).await) });
        }
        let Some((dir, depth, result)) = pending.next().await else {
            break;
        };
        let entries =
            result.map_err(|(status, detail)| err(status, format!("PROPFIND {dir}: {detail}")))?;
        for entry in entries {
            match classify(entry, &dir, &base_path)
                .map_err(|e| err(0, format!("PROPFIND {dir}: {e}")))?
            {
                Listed::Itself => {}
                Listed::Dir(sub, rel) => {
                    if depth + 1 > WEBDAV_DEPTH_MAX {
                        return Err(err(
                            0,
                            format!("{rel:?} is nested deeper than {WEBDAV_DEPTH_MAX}"),
                        ));
                    }
                    queue.push((sub, depth + 1));
                }
                Listed::File(object) => out.push(object),
            }
        }
        store
            .metrics
            .keys_listed
            .store(out.len() as u64, std::sync::atomic::Ordering::Relaxed);
    }
    out.sort_unstable_by(|a, b| a.key.as_bytes().cmp(b.key.as_bytes()));
    Ok(out)
}

/// What one entry of the answer for `dir` is.
enum Listed {
    /// `dir` itself.
    Itself,
    /// A directory below: the URL path to ask for (ends in `/`), and its
    /// key relative to the base.
    Dir(String, String),
    /// A file.
    File(RemoteObject),
}

/// Reads one entry of the answer for `dir` (a URL path under `base_path`):
/// its name must lie under the base and be a key ([`super::check_key`]).
fn classify(entry: DavEntry, dir: &str, base_path: &str) -> Result<Listed, String> {
    let path = url_path(&entry.href).to_string();
    let decoded = percent_decode(&path);
    if path.trim_end_matches('/') == dir.trim_end_matches('/') {
        return Ok(Listed::Itself);
    }
    let Some(rel) = decoded.strip_prefix(&percent_decode(base_path)) else {
        return Err(format!(
            "the server named {decoded:?}, outside {base_path:?}"
        ));
    };
    super::check_key(rel.trim_end_matches('/'))?;
    if entry.is_dir || path.ends_with('/') {
        let mut sub = path.clone();
        if !sub.ends_with('/') {
            sub.push('/');
        }
        return Ok(Listed::Dir(sub, rel.to_string()));
    }
    let size = entry
        .size
        .ok_or_else(|| format!("{decoded:?} has no getcontentlength"))?;
    // The ETag of a PROPFIND answer need not be the one a GET sends
    // (nginx's dav-ext formats its own), so If-Match would fail on
    // unchanged files: the size check guards these reads.
    Ok(Listed::File(RemoteObject {
        key: rel.to_string(),
        size,
        etag: None,
    }))
}

/// The keys of one PROPFIND answer for the directory `base_path` (a URL
/// path ending in `/`), as a listing of it would take them: files as keys
/// relative to it, subdirectories as keys ending in `/`. An entry that is
/// outside it or cannot be a key is an error. Streams `xml` under the caps
/// of a real answer. A thin entry point for fuzzing (`fuzz/`) and tests.
pub fn webdav_answer_keys(xml: &[u8], base_path: &str) -> Result<Vec<String>, String> {
    let mut keys = Vec::new();
    for entry in parse_multistatus(xml, PROPFIND_ENTRIES_MAX)? {
        match classify(entry, base_path, base_path)? {
            Listed::Itself => {}
            Listed::Dir(_, rel) => keys.push(rel),
            Listed::File(object) => keys.push(object.key),
        }
    }
    Ok(keys)
}

async fn propfind(
    client: &object_store::client::HttpClient,
    url: &str,
) -> Result<Vec<DavEntry>, (u16, String)> {
    let method = http::Method::from_bytes(b"PROPFIND").map_err(|e| (0, e.to_string()))?;
    let request = http::Request::builder()
        .method(method)
        .uri(url)
        .header("Depth", "1")
        .header("Content-Type", "application/xml")
        .body(HttpRequestBody::from(PROPFIND_BODY.to_string()))
        .map_err(|e| (0, e.to_string()))?;
    let response = client
        .execute(request)
        .await
        .map_err(|e| (0, e.to_string()))?;
    let status = response.status().as_u16();
    let mut stream = response.into_body().bytes_stream();
    if status != 207 {
        // The start of the answer, for the message; the rest is not read.
        let mut body = Vec::new();
        while body.len() < 200 {
            match stream.next().await {
                Some(Ok(chunk)) => body.extend_from_slice(&chunk[..chunk.len().min(200)]),
                _ => break,
            }
        }
        let text = String::from_utf8_lossy(&body[..body.len().min(200)]).to_string();
        let hint = if status == 405 {
            " (the server does not speak WebDAV here: enable dav_ext_methods PROPFIND in nginx, or give --keys FILE)"
        } else {
            ""
        };
        return Err((status, format!("HTTP {status}{hint}: {text}")));
    }
    // quick-xml reads a `BufRead`: on a blocking thread, pulling the body's
    // chunks from the runtime as the parser asks for more.
    let handle = tokio::runtime::Handle::current();
    let body = StreamBody {
        stream,
        handle,
        chunk: Bytes::new(),
        total: 0,
    };
    tokio::task::spawn_blocking(move || parse_multistatus(body, PROPFIND_ENTRIES_MAX))
        .await
        .map_err(|e| (status, format!("the parser of the answer stopped: {e}")))?
        .map_err(|e| (status, format!("bad multistatus answer: {e}")))
}

/// A response body as a `BufRead`, at most [`PROPFIND_BYTES_MAX`] bytes;
/// runs only on a blocking thread (it blocks on the runtime for each chunk).
struct StreamBody {
    stream: BoxStream<'static, Result<Bytes, object_store::client::HttpError>>,
    handle: tokio::runtime::Handle,
    chunk: Bytes,
    total: u64,
}

impl Read for StreamBody {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = {
            let buf = self.fill_buf()?;
            let n = buf.len().min(out.len());
            out[..n].copy_from_slice(&buf[..n]);
            n
        };
        self.consume(n);
        Ok(n)
    }
}

impl BufRead for StreamBody {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        while self.chunk.is_empty() {
            match self.handle.block_on(self.stream.next()) {
                None => break,
                Some(Err(e)) => return Err(std::io::Error::other(e.to_string())),
                Some(Ok(chunk)) => {
                    self.total += chunk.len() as u64;
                    if self.total > PROPFIND_BYTES_MAX {
                        return Err(std::io::Error::other(format!(
                            "the answer is longer than {PROPFIND_BYTES_MAX} bytes, the most one PROPFIND \
                             may send (a directory of some 500 000 entries): split the directory, or give --keys FILE"
                        )));
                    }
                    self.chunk = chunk;
                }
            }
        }
        Ok(&self.chunk)
    }

    fn consume(&mut self, n: usize) {
        let _ = self.chunk.split_to(n.min(self.chunk.len()));
    }
}

/// Parses a `207 Multi-Status` answer into its responses, read as it
/// comes: `xml` is read once, front to back, never whole; more than
/// `entries_max` responses, or a field longer than
/// [`PROPFIND_FIELD_BYTES_MAX`], is an error that names the cap. The
/// entries' names are as the server wrote them (percent-encoded), not yet
/// checked as keys.
pub(crate) fn parse_multistatus(
    xml: impl BufRead,
    entries_max: usize,
) -> Result<Vec<DavEntry>, String> {
    let mut reader = quick_xml::Reader::from_reader(xml);
    let mut out = Vec::new();
    let mut entry = DavEntry::default();
    let mut field: Option<&'static str> = None;
    let mut value = String::new();
    let mut buf = Vec::new();
    loop {
        let event = reader
            .read_event_into(&mut buf)
            .map_err(|e| e.to_string())?;
        match event {
            Event::Start(e) => match e.local_name().as_ref() {
                b"response" => entry = DavEntry::default(),
                b"collection" => entry.is_dir = true,
                b"href" => field = Some("href"),
                b"getcontentlength" => field = Some("len"),
                b"getetag" => field = Some("etag"),
                _ => {}
            },
            // An empty element has no text and no end event of its own.
            Event::Empty(e) if e.local_name().as_ref() == b"collection" => entry.is_dir = true,
            // A field's text may come in pieces: text, then an entity
            // (`&amp;` is an event of its own), then text again. Gathered
            // whole and read at the field's end.
            Event::Text(t) if field.is_some() => {
                let text = t.decode().map_err(|e| e.to_string())?;
                let text = quick_xml::escape::unescape(&text).map_err(|e| e.to_string())?;
                value.push_str(&text);
                field_cap(&value)?;
            }
            Event::GeneralRef(r) if field.is_some() => {
                if let Some(c) = r.resolve_char_ref().map_err(|e| e.to_string())? {
                    value.push(c);
                } else {
                    let name = r.decode().map_err(|e| e.to_string())?;
                    let resolved = quick_xml::escape::resolve_predefined_entity(&name)
                        .ok_or_else(|| format!("unknown entity &{name};"))?;
                    value.push_str(resolved);
                }
                field_cap(&value)?;
            }
            Event::End(e) => {
                if let Some(f) = field.take() {
                    take_field(&mut entry, f, value.trim())?;
                    value.clear();
                }
                if e.local_name().as_ref() == b"response" {
                    if out.len() >= entries_max {
                        return Err(format!(
                            "more than {entries_max} entries in one answer, the most one PROPFIND may \
                             give: split the directory, or give --keys FILE"
                        ));
                    }
                    out.push(std::mem::take(&mut entry));
                }
            }
            Event::Eof => break,
            _ => {}
        }
        buf.clear();
    }
    Ok(out)
}

fn field_cap(value: &str) -> Result<(), String> {
    if value.len() > PROPFIND_FIELD_BYTES_MAX {
        return Err(format!(
            "a field of an entry is longer than {PROPFIND_FIELD_BYTES_MAX} bytes"
        ));
    }
    Ok(())
}

/// Stores the text of `field` in `entry`.
fn take_field(entry: &mut DavEntry, field: &str, text: &str) -> Result<(), String> {
    if text.is_empty() {
        return Ok(()); // `<getetag></getetag>`: as if absent
    }
    match field {
        "href" => {
            entry.href.push_str(text);
            field_cap(&entry.href)?;
        }
        "len" => {
            entry.size = Some(
                text.parse()
                    .map_err(|e| format!("getcontentlength {text:?}: {e}"))?,
            )
        }
        "etag" => entry.etag = Some(text.to_string()),
        _ => {}
    }
    Ok(())
}

/// The path of an absolute URL (`http://h:1/a/b` → `/a/b`), or the string
/// itself when it is already a path.
fn url_path(url: &str) -> &str {
    match url.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/", |i| &rest[i..]),
        None => url,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multistatus_of_nginx_gives_dirs_files_sizes_and_etags() {
        let xml = br#"<?xml version="1.0" encoding="utf-8" ?>
<D:multistatus xmlns:D="DAV:">
<D:response><D:href>/data/</D:href><D:propstat><D:prop><D:resourcetype><D:collection/></D:resourcetype></D:prop><D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response>
<D:response><D:href>/data/a%20b.bin</D:href><D:propstat><D:prop><D:resourcetype></D:resourcetype><D:getcontentlength>12</D:getcontentlength><D:getetag>"5-c"</D:getetag></D:prop></D:propstat></D:response>
</D:multistatus>"#;
        let entries = parse_multistatus(&xml[..], 10).unwrap();
        assert_eq!(entries.len(), 2);
        assert!(entries[0].is_dir);
        assert_eq!(entries[1].href, "/data/a%20b.bin");
        assert_eq!(entries[1].size, Some(12));
        assert_eq!(entries[1].etag.as_deref(), Some("\"5-c\""));
        assert_eq!(percent_decode("/data/a%20b.bin"), "/data/a b.bin");
        assert_eq!(url_path("http://h:8/x/y/"), "/x/y/");
    }

    #[test]
    fn an_entity_in_a_name_is_kept_whole() {
        // nginx and rclone escape '&' in hrefs; the parser hands the entity
        // over as an event of its own, between two pieces of text (a file
        // `amp&quote'.bin` was listed as `ampquote'.bin`, then 404).
        let xml = br#"<D:multistatus xmlns:D="DAV:"><D:response><D:href>/d/amp&amp;quote&apos;.bin</D:href><D:propstat><D:prop><D:getcontentlength> 3 </D:getcontentlength><D:getetag>"x&#38;y"</D:getetag></D:prop></D:propstat></D:response><D:response><D:href>/d/e</D:href><D:propstat><D:prop><D:getcontentlength/><D:getetag></D:getetag><D:resourcetype/></D:prop></D:propstat></D:response></D:multistatus>"#;
        let entries = parse_multistatus(&xml[..], 10).unwrap();
        assert_eq!(entries[0].href, "/d/amp&quote'.bin");
        assert_eq!(entries[0].size, Some(3));
        assert_eq!(entries[0].etag.as_deref(), Some("\"x&y\""));
        // Empty elements say nothing, and do not spill into later fields.
        assert_eq!(entries[1].href, "/d/e");
        assert_eq!((entries[1].size, entries[1].etag.as_deref()), (None, None));
    }

    #[test]
    fn an_answer_past_the_byte_cap_is_an_error_naming_it() {
        // Elements of 64 KiB of text, no entries: only the byte cap can end
        // it (each element's text is one event, so the parser's own buffer
        // stays small).
        let element = format!("<x>{}</x>", "a".repeat((64 << 10) - 7));
        let chunk = Bytes::from(element.repeat(16));
        let stream = futures::stream::repeat_with(move || Ok(chunk.clone())).boxed();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let body = StreamBody {
            stream,
            handle: runtime.handle().clone(),
            chunk: Bytes::new(),
            total: 0,
        };
        let err = parse_multistatus(body, PROPFIND_ENTRIES_MAX).unwrap_err();
        assert!(
            err.contains(&format!("longer than {PROPFIND_BYTES_MAX} bytes")),
            "{err}"
        );
    }

    #[test]
    fn a_name_past_the_field_cap_is_an_error_naming_it() {
        let long = "a".repeat(PROPFIND_FIELD_BYTES_MAX + 1);
        let xml = format!(
            "<D:multistatus xmlns:D=\"DAV:\"><D:response><D:href>/d/{long}</D:href></D:response></D:multistatus>"
        );
        let err = parse_multistatus(xml.as_bytes(), 10).unwrap_err();
        assert!(
            err.contains(&format!("longer than {PROPFIND_FIELD_BYTES_MAX} bytes")),
            "{err}"
        );
    }
}
