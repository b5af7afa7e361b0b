//! Listing an http(s):// source by WebDAV PROPFIND with `Depth: 1`, walking
//! the tree one directory per request. object_store's HTTP store asks for
//! `Depth: infinity`, which nginx (dav-ext) refuses; depth 1 works on nginx,
//! rclone, Apache and every other WebDAV server.

use std::collections::HashSet;
use std::sync::Arc;

use futures::stream::FuturesUnordered;
use futures::StreamExt;
use object_store::client::{HttpConnector, HttpRequestBody};
use object_store::ClientOptions;
use quick_xml::events::Event;

use super::error::RemoteError;
use super::metrics::CountingConnector;
use super::store::{Scheme, StoreHandle};
use super::RemoteObject;

/// PROPFIND requests in flight while walking.
pub const PROPFIND_IN_FLIGHT: usize = 16;
/// Deepest directory nesting walked (a loop of links stops here).
pub const WEBDAV_DEPTH_MAX: usize = 64;

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
    let err = |status: u16, detail: String| RemoteError::Listing {
        url: base.clone(),
        status,
        scheme: Scheme::Http,
        detail,
    };
    let options = ClientOptions::new()
        .with_allow_http(true)
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
            let path = url_path(&entry.href).to_string();
            let decoded = percent_decode(&path);
            if path.trim_end_matches('/') == dir.trim_end_matches('/') {
                continue;
            }
            let Some(rel) = percent_decode(&path)
                .strip_prefix(&percent_decode(&base_path))
                .map(str::to_string)
            else {
                return Err(err(
                    0,
                    format!("the server named {decoded:?}, outside {base_path:?}"),
                ));
            };
            if entry.is_dir || path.ends_with('/') {
                if depth + 1 > WEBDAV_DEPTH_MAX {
                    return Err(err(
                        0,
                        format!("{decoded:?} is nested deeper than {WEBDAV_DEPTH_MAX}"),
                    ));
                }
                let mut sub = path.clone();
                if !sub.ends_with('/') {
                    sub.push('/');
                }
                queue.push((sub, depth + 1));
            } else {
                let size = entry
                    .size
                    .ok_or_else(|| err(0, format!("{decoded:?} has no getcontentlength")))?;
                // The ETag of a PROPFIND answer need not be the one a GET
                // sends (nginx's dav-ext formats its own), so If-Match would
                // fail on unchanged files: the size check guards these reads.
                let _ = entry.etag;
                out.push(RemoteObject {
                    key: rel,
                    size,
                    etag: None,
                });
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
    let body = response
        .into_body()
        .bytes()
        .await
        .map_err(|e| (status, e.to_string()))?;
    if status != 207 {
        let text = String::from_utf8_lossy(&body[..body.len().min(200)]).to_string();
        let hint = if status == 405 {
            " (the server does not speak WebDAV here: enable dav_ext_methods PROPFIND in nginx, or give --keys FILE)"
        } else {
            ""
        };
        return Err((status, format!("HTTP {status}{hint}: {text}")));
    }
    parse_multistatus(&body).map_err(|e| (status, format!("bad multistatus XML: {e}")))
}

/// Parses a `207 Multi-Status` body into its responses.
pub(crate) fn parse_multistatus(xml: &[u8]) -> Result<Vec<DavEntry>, String> {
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
            }
            Event::End(e) => {
                if let Some(f) = field.take() {
                    take_field(&mut entry, f, value.trim())?;
                    value.clear();
                }
                if e.local_name().as_ref() == b"response" {
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

/// Stores the text of `field` in `entry`.
fn take_field(entry: &mut DavEntry, field: &str, text: &str) -> Result<(), String> {
    if text.is_empty() {
        return Ok(()); // `<getetag></getetag>`: as if absent
    }
    match field {
        "href" => entry.href.push_str(text),
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

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
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
        let entries = parse_multistatus(xml).unwrap();
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
        let entries = parse_multistatus(xml).unwrap();
        assert_eq!(entries[0].href, "/d/amp&quote'.bin");
        assert_eq!(entries[0].size, Some(3));
        assert_eq!(entries[0].etag.as_deref(), Some("\"x&y\""));
        // Empty elements say nothing, and do not spill into later fields.
        assert_eq!(entries[1].href, "/d/e");
        assert_eq!((entries[1].size, entries[1].etag.as_deref()), (None, None));
    }
}
