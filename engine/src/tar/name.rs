//! How a tar member's name splits into a sample key and a field extension,
//! the WebDataset way (TAR-INDEX.md, docs/shards.md): the key is everything
//! up to the first '.' of the last path component that is not that
//! component's first character; the extension is the rest after that dot.

/// Splits a member name into `(key, ext)`.
///
/// `a/b/000123.seg.png` gives `("a/b/000123", "seg.png")`; `a/.hidden.txt`
/// gives `("a/.hidden", "txt")`; `README` gives `("README", "")`. The dot
/// itself belongs to neither part. Pure and total: any bytes split.
pub fn split_key(name: &[u8]) -> (&[u8], &[u8]) {
    let component_start = match memchr::memrchr(b'/', name) {
        Some(slash) => slash + 1,
        None => 0,
    };
    // A dot that opens the component (a hidden file's) is part of the key.
    let search_from = component_start + 1;
    if search_from >= name.len() {
        return (name, &[]);
    }
    match memchr::memchr(b'.', &name[search_from..]) {
        Some(at) => {
            let dot = search_from + at;
            (&name[..dot], &name[dot + 1..])
        }
        None => (name, &[]),
    }
}

#[cfg(test)]
mod tests {
    use super::split_key;

    fn split(name: &str) -> (&str, &str) {
        let (key, ext) = split_key(name.as_bytes());
        (
            std::str::from_utf8(key).unwrap(),
            std::str::from_utf8(ext).unwrap(),
        )
    }

    #[test]
    fn the_first_dot_of_the_last_component_splits_key_from_extension() {
        assert_eq!(split("a/b/000123.seg.png"), ("a/b/000123", "seg.png"));
        assert_eq!(split("000123.jpg"), ("000123", "jpg"));
        assert_eq!(split("000123.cls"), ("000123", "cls"));
    }

    #[test]
    fn dots_in_directory_names_are_part_of_the_key() {
        assert_eq!(
            split("v1.2/data.x/000001.json"),
            ("v1.2/data.x/000001", "json")
        );
        assert_eq!(split("v1.2/000001"), ("v1.2/000001", ""));
    }

    #[test]
    fn a_leading_dot_belongs_to_the_key() {
        assert_eq!(split("a/.hidden.txt"), ("a/.hidden", "txt"));
        assert_eq!(split(".hidden"), (".hidden", ""));
        assert_eq!(split("..x"), (".", "x"));
        assert_eq!(split("a/."), ("a/.", ""));
    }

    #[test]
    fn a_name_without_a_dot_is_all_key() {
        assert_eq!(split("README"), ("README", ""));
        assert_eq!(split(""), ("", ""));
        assert_eq!(split("dir/"), ("dir/", ""));
    }

    #[test]
    fn a_trailing_dot_gives_an_empty_extension() {
        assert_eq!(split("a/b."), ("a/b", ""));
    }

    #[test]
    fn non_utf8_bytes_split_like_any_other() {
        let (key, ext) = split_key(b"d\xff/k\xfe.e\x80");
        assert_eq!(key, b"d\xff/k\xfe");
        assert_eq!(ext, b"e\x80");
    }
}
