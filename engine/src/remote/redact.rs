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
//! Behind it, [`scrub`], for every line ringfeed writes (stderr, stdout, the
//! outcome file, the ring's abort message): any URL in the text has its
//! password and the values of its signing query parameters
//! (`X-Amz-Signature`, `sig`, `token`, ...: [`secret_param`]) replaced,
//! whichever variable or file it came from (`AWS_ENDPOINT_URL`, a profile's
//! `endpoint_url`, a proxy, a redirect); and the secrets of every URL opened
//! in this process ([`remember_secrets`]) and of every URL in its
//! environment ([`remember_env_secrets`]) are replaced wherever they show up
//! on their own, should a message of a library quote them apart from their
//! URL.

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
    redact_with(url, &|_| true)
}

/// Whether a query parameter named `name` carries a secret: a signature, a
/// credential, a token, a key, a password, a session, an OAuth code. In a
/// URL quoted inside a message only these values are redacted, so that the
/// others (an S3 listing's `prefix=`) still say what was asked.
pub fn secret_param(name: &str) -> bool {
    const WORDS: [&str; 10] = [
        "sig",
        "token",
        "credential",
        "secret",
        "pass",
        "pwd",
        "auth",
        "key",
        "session",
        "code",
    ];
    let name = percent_decode(name).to_ascii_lowercase();
    WORDS.iter().any(|w| name.contains(w))
}

/// The places (start, end) of the URLs in `text`: a scheme, `://`, and what
/// follows up to a space, a quote or an angle bracket (closing punctuation
/// at the end left out).
fn urls_in(text: &str) -> Vec<(usize, usize)> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find("://").map(|i| from + i) {
        let scheme_ok = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'.' | b'-');
        let mut start = at;
        while start > from && scheme_ok(bytes[start - 1]) {
            start -= 1;
        }
        let stop =
            |b: u8| b.is_ascii_whitespace() || matches!(b, b'"' | b'\'' | b'<' | b'>' | b'`');
        let mut end = at + 3;
        while end < bytes.len() && !stop(bytes[end]) {
            end += 1;
        }
        let next = end.max(at + 3);
        while end > at + 3 && matches!(bytes[end - 1], b')' | b']' | b'.' | b',' | b';' | b':') {
            end -= 1;
        }
        if start < at {
            out.push((start, end));
        }
        from = next;
    }
    out
}

/// `text` with every URL in it redacted: its password, and the values of
/// its query parameters that carry secrets ([`secret_param`]).
fn redact_urls_in(text: &str) -> Cow<'_, str> {
    let found = urls_in(text);
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for (start, end) in found {
        out.push_str(&text[last..start]);
        out.push_str(&redact_with(&text[start..end], &secret_param));
        last = end;
    }
    if last == 0 {
        return Cow::Borrowed(text);
    }
    out.push_str(&text[last..]);
    if out == text {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(out)
    }
}

/// Remembers, for [`scrub`], the secrets of every URL in this process's
/// environment: an endpoint (`AWS_ENDPOINT_URL`, `AWS_ENDPOINT_URL_S3`,
/// `AZURE_STORAGE_ENDPOINT`, `GOOGLE_...`), a proxy (`HTTPS_PROXY`), a
/// credentials endpoint, whichever variable holds it.
pub fn remember_env_secrets() {
    let values = std::env::vars_os().filter_map(|(_, v)| v.into_string().ok());
    remember_urls_in(values);
}

/// Remembers the secrets of every URL in `values`: passwords, and the
/// values of signing parameters only (a `page=100000` of some URL in the
/// environment must not blank every "100000" ringfeed prints).
fn remember_urls_in(values: impl Iterator<Item = String>) {
    for value in values {
        for (start, end) in urls_in(&value) {
            remember_secrets_with(&value[start..end], &secret_param);
        }
    }
}

/// [`redact_url`], redacting the query parameters `redact_param` names
/// (a bare value, `?SECRET`, always).
fn redact_with(url: &str, redact_param: &dyn Fn(&str) -> bool) -> String {
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
                    Some((name, _)) if redact_param(name) => format!("{name}={REDACTED}"),
                    Some(_) => p.to_string(),
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
    remember_secrets_with(url, &|_| true);
}

/// [`remember_secrets`], remembering the values of the query parameters
/// `secret` names (a bare value always).
fn remember_secrets_with(url: &str, secret: &dyn Fn(&str) -> bool) {
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
            let value = match p.split_once('=') {
                Some((name, value)) if secret(name) => value,
                Some(_) => continue,
                None => p,
            };
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

/// `text` with the secrets of every URL in it, and every remembered
/// secret, replaced by [`REDACTED`].
pub fn scrub(text: &str) -> Cow<'_, str> {
    let text = if text.contains("://") {
        redact_urls_in(text)
    } else {
        Cow::Borrowed(text)
    };
    let secrets = SECRETS.lock().unwrap_or_else(|p| p.into_inner());
    if !secrets.iter().any(|s| text.contains(s.as_str())) {
        return text;
    }
    let mut out = text.into_owned();
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
    fn any_url_in_a_text_loses_its_password_and_signatures_and_keeps_the_rest() {
        let text = "Error performing GET http://user:PASSWORD@127.0.0.1:9/bkt?list-type=2&prefix=p%2F in 5 s \
                    (via 'https://h/o?X-Amz-Credential=AK&X-Amz-Signature=SIG1&x-id=GetObject'), \
                    see <az://c/p?sv=1&sig=SIG2>.";
        let want = "Error performing GET http://user:REDACTED@127.0.0.1:9/bkt?list-type=2&prefix=p%2F in 5 s \
                    (via 'https://h/o?X-Amz-Credential=REDACTED&X-Amz-Signature=REDACTED&x-id=GetObject'), \
                    see <az://c/p?sv=1&sig=REDACTED>.";
        assert_eq!(scrub(text), want);
        assert_eq!(
            scrub("endpoint http://u:pw@h)."),
            "endpoint http://u:REDACTED@h)."
        );
        assert!(matches!(scrub("no url: a://"), Cow::Borrowed(_)));
        assert!(matches!(scrub("s3://b/p/ and /x"), Cow::Borrowed(_)));
        assert!(secret_param("X-Amz-Security-Token") && secret_param("access_token"));
        assert!(!secret_param("prefix") && !secret_param("list-type") && !secret_param("sv"));
    }

    #[test]
    fn the_secrets_of_urls_in_the_environment_are_scrubbed_from_any_text() {
        let env = [
            "x".to_string(),
            "http://svc:EnvPass-777@h:1/?token=EnvToken-888&page=4455667".to_string(),
        ];
        remember_urls_in(env.into_iter());
        let text = "a library said: auth EnvPass-777 refused, token EnvToken-888, 4455667 left";
        assert_eq!(
            scrub(text),
            "a library said: auth REDACTED refused, token REDACTED, 4455667 left"
        );
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
