//! What may be a key of a remote source, checked in one place for every way
//! keys arrive: S3/GCS/Azure listings, WebDAV listings and `--keys` files.
//!
//! A key becomes a path (the manifest's file names, which hold no NUL) and
//! an object_store `Path`, which cannot carry a control character (it
//! percent-encodes one, and the HTTP client then encodes the `%` again: a
//! GET of another name) nor a `.`, `..` or empty segment. Such a key is a
//! listing error that names it, escaped, never a panic or a wrong object.

/// Checks that `key` (relative to the source's prefix) can name an object:
/// not empty, no leading `/`, no empty, `.` or `..` segment, no control
/// character (C0, DEL or C1; NUL included). The error names the key escaped
/// (`"a\0b"`) and says why.
pub fn check_key(key: &str) -> Result<(), String> {
    let why = if key.is_empty() {
        "is empty".to_string()
    } else if let Some(c) = key.chars().find(|c| c.is_control()) {
        format!("holds the control character {c:?}")
    } else if key.starts_with('/') {
        "starts with `/`".to_string()
    } else if let Some(seg) = key
        .split('/')
        .find(|s| s.is_empty() || *s == "." || *s == "..")
    {
        format!("has a {seg:?} segment")
    } else {
        return Ok(());
    };
    Err(format!(
        "key {key:?} {why}, so it cannot name an object here: rename or remove it at the source \
         (or leave it out of --keys)"
    ))
}

#[cfg(test)]
mod tests {
    use super::check_key;

    #[test]
    fn ordinary_keys_pass() {
        for k in [
            "a",
            "a/b.bin",
            "é.bin",
            "a b/%20#?&.x",
            "..a/b..",
            ".hidden",
        ] {
            assert_eq!(check_key(k), Ok(()), "{k:?}");
        }
    }

    #[test]
    fn keys_that_cannot_be_paths_are_named_escaped() {
        for (k, shown) in [
            ("a\0b", r#""a\0b""#),
            ("x/\u{1}", r#""x/\u{1}""#),
            ("a\nb", r#""a\nb""#),
            ("\u{7f}", r#""\u{7f}""#),
            ("\u{9b}31m", r#""\u{9b}31m""#),
            ("", r#""""#),
            ("/a", r#""/a""#),
            ("a//b", r#""a//b""#),
            ("a/../b", r#""a/../b""#),
            ("./a", r#""./a""#),
            ("..", r#""..""#),
        ] {
            let e = check_key(k).unwrap_err();
            assert!(e.starts_with(&format!("key {shown} ")), "{e}");
            assert!(!e.contains('\0') && !e.contains('\n'), "{e}");
        }
    }
}
