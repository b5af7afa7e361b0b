//! A source URL as it may be shown or stored: one redaction for every
//! place a URL reaches a person, a file or a trainer (stderr, the outcome
//! file, the data cache's `source` file, `cache list`, errors).
//!
//! Redacted: the password of `user:password@` (the user name stays, to say
//! whose), and the value of every query parameter (`X-Amz-Signature`,
//! `X-Goog-Credential`, Azure's `sig`, `token`, ...: a query on a source URL
//! is there to authenticate; its names stay, to say which). Everything else
//! is kept, so the redacted URL still says which data set.
//!
//! Behind it, [`scrub`]: the secrets of every URL opened in this process
//! ([`remember_secrets`]) are replaced wherever they show up in a line for
//! stderr or the outcome file, should a message of a library quote a
//! request's URL.

use std::borrow::Cow;
use std::sync::Mutex;

/// Shorter secrets are not scrubbed from free text (a `sv=1` would blank
/// every `1`); the URL itself is always redacted whole.
const SCRUB_MIN_CHARS: usize = 6;

static SECRETS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// What a redacted secret is shown as.
pub const REDACTED: &str = "REDACTED";

/// `url` with its secrets replaced by [`REDACTED`] (see the module docs).
/// A string without `scheme://` is given back as it is.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let mut out = format!("{scheme}://");
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            match userinfo.split_once(':') {
                Some((user, _)) => out.push_str(&format!("{user}:{REDACTED}")),
                None => out.push_str(userinfo),
            }
            out.push('@');
            out.push_str(host);
        }
        None => out.push_str(authority),
    }
    let (path_query, fragment) = match tail.split_once('#') {
        Some((a, f)) => (a, Some(f)),
        None => (tail, None),
    };
    match path_query.split_once('?') {
        Some((path, query)) => {
            out.push_str(path);
            out.push('?');
            let params: Vec<String> = query
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some((name, _)) => format!("{name}={REDACTED}"),
                    None if p.is_empty() => String::new(),
                    // A bare value (`?SECRET`) may be a token itself.
                    None => REDACTED.to_string(),
                })
                .collect();
            out.push_str(&params.join("&"));
        }
        None => out.push_str(path_query),
    }
    if fragment.is_some() {
        out.push('#');
        out.push_str(REDACTED);
    }
    out
}

/// The secrets of `url` (its password and query values, as written and
/// percent-decoded), remembered for [`scrub`] for the rest of the process.
pub fn remember_secrets(url: &str) {
    let redacted = redact_url(url);
    if redacted == url {
        return;
    }
    let mut found = Vec::new();
    if let Some(((_, pass), _)) = split_userinfo(url) {
        found.push(pass);
    }
    if let Some((_, rest)) = url.split_once("://") {
        let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
        if let Some((_, raw)) = authority
            .rsplit_once('@')
            .and_then(|(u, _)| u.split_once(':'))
        {
            found.push(raw.to_string());
        }
    }
    let authority_end = url.split_once("://").map_or(0, |(s, rest)| {
        s.len() + 3 + rest.find(['/', '?', '#']).unwrap_or(rest.len())
    });
    if let Some((_, query)) = url[authority_end..].split_once('?') {
        let query = query.split('#').next().unwrap_or("");
        for p in query.split('&') {
            let value = p.split_once('=').map_or(p, |(_, v)| v);
            found.push(value.to_string());
            found.push(percent_decode(value));
        }
    }
    let mut secrets = SECRETS.lock().unwrap_or_else(|p| p.into_inner());
    for f in found {
        if f.chars().count() >= SCRUB_MIN_CHARS && !secrets.contains(&f) {
            secrets.push(f);
        }
    }
    // Longest first: a secret that holds another is replaced whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
}

/// `text` with every remembered secret replaced by [`REDACTED`].
pub fn scrub(text: &str) -> Cow<'_, str> {
    let secrets = SECRETS.lock().unwrap_or_else(|p| p.into_inner());
    if !secrets.iter().any(|s| text.contains(s.as_str())) {
        return Cow::Borrowed(text);
    }
    let mut out = text.to_string();
    for s in secrets.iter() {
        out = out.replace(s.as_str(), REDACTED);
    }
    Cow::Owned(out)
}

/// The user name and password of an http(s) URL's `user:password@`,
/// percent-decoded, and the URL without them; `None` when it has none.
pub(crate) fn split_userinfo(url: &str) -> Option<((String, String), String)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (userinfo, host) = rest[..authority_end].rsplit_once('@')?;
    let (user, pass) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    Some((
        (percent_decode(user), percent_decode(pass)),
        format!("{scheme}://{host}{}", &rest[authority_end..]),
    ))
}

/// The `Authorization` value of HTTP Basic authentication.
pub(crate) fn basic_auth(user: &str, pass: &str) -> String {
    format!("Basic {}", base64(format!("{user}:{pass}").as_bytes()))
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> shift) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `%XX` escapes decoded; invalid UTF-8 replaced.
pub(crate) fn percent_decode(s: &str) -> String {
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
    fn passwords_and_query_values_are_redacted_and_the_rest_kept() {
        let cases = [
            ("http://alice:SECRETPASS@h:8/ds/", "http://alice:REDACTED@h:8/ds/"),
            (
                "https://b.s3.amazonaws.com/p/?X-Amz-Credential=AK%2F1&X-Amz-Signature=SECRET&x",
                "https://b.s3.amazonaws.com/p/?X-Amz-Credential=REDACTED&X-Amz-Signature=REDACTED&REDACTED",
            ),
            ("az://c/p?sv=1&sig=SECRET", "az://c/p?sv=REDACTED&sig=REDACTED"),
            ("abfs://c@acct.dfs.core.windows.net/p", "abfs://c@acct.dfs.core.windows.net/p"),
            ("s3://b/p/", "s3://b/p/"),
            ("http://u:p@h?t=SECRET#frag", "http://u:REDACTED@h?t=REDACTED#REDACTED"),
            ("http://u:pa@ss@h/x@y", "http://u:REDACTED@h/x@y"),
            ("/local/dir", "/local/dir"),
        ];
        for (url, want) in cases {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }

    #[test]
    fn remembered_secrets_are_scrubbed_from_any_text() {
        remember_secrets("http://u:Pa%2Fss-1234@h/d/?X-Amz-Signature=abcdef123&sv=1");
        let text = "GET http://u:Pa/ss-1234@h/d/k?X-Amz-Signature=abcdef123 failed (sv=1)";
        assert_eq!(
            scrub(text),
            "GET http://u:REDACTED@h/d/k?X-Amz-Signature=REDACTED failed (sv=1)"
        );
        assert!(matches!(scrub("nothing here"), Cow::Borrowed(_)));
    }

    #[test]
    fn userinfo_is_split_off_and_decoded() {
        assert_eq!(
            split_userinfo("http://al%40ce:p%3As@h:1/d/?q"),
            Some((("al@ce".into(), "p:s".into()), "http://h:1/d/?q".into()))
        );
        assert_eq!(split_userinfo("http://h/d@x"), None);
        assert_eq!(
            basic_auth("Aladdin", "open sesame"),
            "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
        );
        assert_eq!(base64(b"a"), "YQ==");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(percent_decode("%4"), "%4");
    }
}
