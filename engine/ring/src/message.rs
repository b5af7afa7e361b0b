//! Text in the shared header: the loader's abort message, stored in 8-byte
//! atomic words so that it follows the header's rule (every shared field is
//! an atomic with exactly one writer) and a hostile length cannot make a
//! reader go past the field.

use crate::layout::{Header, ABORT_MESSAGE_MAX_BYTES};
use crate::sync::Ordering;

/// The longest prefix of `text` that fits in `max` bytes, cut at a character
/// boundary.
fn fitting(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Stores `text` (cut to [`ABORT_MESSAGE_MAX_BYTES`]) as the abort message.
/// Relaxed stores: the loader's Release store of ABORTED publishes them.
pub fn write_abort_message(header: &Header, text: &str) {
    let text = fitting(text, ABORT_MESSAGE_MAX_BYTES).as_bytes();
    for (i, word) in header.abort_message.iter().enumerate() {
        let mut bytes = [0u8; 8];
        let start = (i * 8).min(text.len());
        let end = (start + 8).min(text.len());
        bytes[..end - start].copy_from_slice(&text[start..end]);
        word.store(u64::from_le_bytes(bytes), Ordering::Relaxed);
    }
    header
        .abort_message_bytes
        .store(text.len() as u64, Ordering::Relaxed);
}

/// The abort message, or None if there is none. Call after an Acquire load
/// of ABORTED. A length past the field is clamped; bytes that are not UTF-8
/// are replaced, never trusted.
pub fn read_abort_message(header: &Header) -> Option<String> {
    let len = header.abort_message_bytes.load(Ordering::Relaxed);
    let len = usize::try_from(len)
        .unwrap_or(usize::MAX)
        .min(ABORT_MESSAGE_MAX_BYTES);
    if len == 0 {
        return None;
    }
    let mut bytes = Vec::with_capacity(len);
    for word in &header.abort_message {
        bytes.extend_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
    }
    bytes.truncate(len);
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Box<Header> {
        // SAFETY: Header is made of atomics, for which all-zero bytes are a
        // valid value (as the loader's fallocate leaves them).
        unsafe { Box::new(std::mem::zeroed()) }
    }

    #[test]
    fn a_message_reads_back_as_written() {
        let h = header();
        assert_eq!(read_abort_message(&h), None);
        write_abort_message(
            &h,
            "cannot read s3://b/k: 403 Forbidden; set AWS_SECRET_ACCESS_KEY",
        );
        assert_eq!(
            read_abort_message(&h).as_deref(),
            Some("cannot read s3://b/k: 403 Forbidden; set AWS_SECRET_ACCESS_KEY")
        );
        write_abort_message(&h, "short");
        assert_eq!(read_abort_message(&h).as_deref(), Some("short"));
    }

    #[test]
    fn a_long_message_is_cut_at_a_character_boundary() {
        let h = header();
        let text = "é".repeat(ABORT_MESSAGE_MAX_BYTES);
        write_abort_message(&h, &text);
        let back = read_abort_message(&h).unwrap();
        assert_eq!(back.len(), ABORT_MESSAGE_MAX_BYTES);
        assert!(back.chars().all(|c| c == 'é'));
    }

    #[test]
    fn a_hostile_length_or_bad_bytes_cannot_go_past_the_field() {
        let h = header();
        h.abort_message_bytes.store(u64::MAX, Ordering::Relaxed);
        h.abort_message[0].store(u64::MAX, Ordering::Relaxed);
        let back = read_abort_message(&h).unwrap();
        assert!(back.starts_with('\u{fffd}'));
        assert!(back.len() <= 3 * ABORT_MESSAGE_MAX_BYTES);
    }
}
