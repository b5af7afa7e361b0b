//! The fields of a sample served from WebDataset tar shards (`ringfeed serve
//! --format tar`; docs/shards.md): the sample's bytes are its members' raw
//! tar bytes, and `rf_tar_field_next` walks them without copying.

use crate::{fail, guard, RF_END, RF_E_CORRUPT, RF_E_INVALID, RF_OK};
use ring::tar_fields::{next_field, TarFieldError};

/// One member (field) of a tar sample: pointers into the sample's own bytes,
/// valid as long as the sample is (until its batch is released). No string
/// is NUL-terminated.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rf_tar_field {
    /// The member's name: all of it, unless `name_prefix_len` > 0, when the
    /// full name is `name_prefix` + "/" + `name` (a ustar header's split).
    pub name: *const u8,
    /// Bytes of `name`.
    pub name_len: u64,
    /// The ustar prefix of the name, or NULL (length 0) when unused.
    pub name_prefix: *const u8,
    /// Bytes of `name_prefix`.
    pub name_prefix_len: u64,
    /// The extension, inside `name`: what follows the first '.' of its last
    /// path component that is not that component's first character
    /// (`000123.seg.png` -> `seg.png`); length 0 when there is none. The
    /// sample's key is the full name up to that '.'. As stored: WebDataset
    /// and the Python binding name the field by the extension lowercased
    /// (`s1.JPG` is field `jpg`), so compare with strncasecmp to match them.
    pub ext: *const u8,
    /// Bytes of `ext`.
    pub ext_len: u64,
    /// The member's data.
    pub data: *const u8,
    /// Bytes of `data`.
    pub len: u64,
}

const _: () = assert!(std::mem::size_of::<rf_tar_field>() == 64);

/// Walks the fields of a tar sample (`sample`, `len` bytes: `b.data +
/// b.samples[i].offset`, `b.samples[i].len`). Set `*cursor` to 0, then call
/// until it returns RF_END:
///
/// ```c
/// uint64_t cursor = 0; rf_tar_field f; int rc;
/// while ((rc = rf_tar_field_next(p, n, &cursor, &f)) == RF_OK) {
///     // f.ext, f.ext_len: "jpg"; f.data, f.len: the member's bytes
/// }
/// // rc == RF_END: done; RF_E_CORRUPT: not tar members, rf_last_error() says where
/// ```
///
/// Regular files only: directories, links, pax and GNU long-name headers are
/// read (the latter for names), not returned. RF_E_INVALID for NULL
/// pointers or a cursor past `len`.
///
/// # Safety
/// `sample` points to `len` readable bytes (or `len` is 0); `cursor` and
/// `out` are writable.
#[no_mangle]
pub unsafe extern "C" fn rf_tar_field_next(
    sample: *const u8,
    len: u64,
    cursor: *mut u64,
    out: *mut rf_tar_field,
) -> i32 {
    guard(|| {
        if (sample.is_null() && len > 0) || cursor.is_null() || out.is_null() {
            return fail(
                RF_E_INVALID,
                "rf_tar_field_next: sample (when len > 0), cursor and out must not be NULL",
            );
        }
        let Ok(len) = usize::try_from(len) else {
            return fail(
                RF_E_INVALID,
                "rf_tar_field_next: len does not fit in this machine's address space",
            );
        };
        // SAFETY: `cursor` is non-NULL and writable by contract.
        let at = unsafe { *cursor };
        let mut pos = match usize::try_from(at) {
            Ok(pos) if pos <= len => pos,
            _ => {
                return fail(
                    RF_E_INVALID,
                    format!(
                    "rf_tar_field_next: cursor {at} is past the sample's {len} bytes; start at 0"
                ),
                )
            }
        };
        let bytes: &[u8] = if len == 0 {
            &[]
        } else {
            // SAFETY: non-NULL and `len` readable bytes by contract, alive
            // for this call (the slices returned point into them, and the
            // caller keeps the sample alive while it uses them).
            unsafe { std::slice::from_raw_parts(sample, len) }
        };
        match next_field(bytes, &mut pos) {
            Ok(Some(field)) => {
                let ptr = |s: &[u8]| {
                    if s.is_empty() {
                        std::ptr::null()
                    } else {
                        s.as_ptr()
                    }
                };
                let f = rf_tar_field {
                    name: field.name.as_ptr(),
                    name_len: field.name.len() as u64,
                    name_prefix: ptr(field.name_prefix),
                    name_prefix_len: field.name_prefix.len() as u64,
                    ext: field.ext.as_ptr(),
                    ext_len: field.ext.len() as u64,
                    data: field.data.as_ptr(),
                    len: field.data.len() as u64,
                };
                // SAFETY: non-NULL and writable by contract.
                unsafe {
                    *out = f;
                    *cursor = pos as u64;
                }
                RF_OK
            }
            Ok(None) => {
                // SAFETY: as above.
                unsafe { *cursor = pos as u64 };
                RF_END
            }
            Err(
                err @ (TarFieldError::Truncated { .. }
                | TarFieldError::BadChecksum { .. }
                | TarFieldError::Malformed { .. }),
            ) => fail(
                RF_E_CORRUPT,
                format!(
                    "rf_tar_field_next: {err}; is the loader serving tar shards (--format tar)?"
                ),
            ),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RF_E_CORRUPT;

    fn empty_field() -> rf_tar_field {
        rf_tar_field {
            name: std::ptr::null(),
            name_len: 0,
            name_prefix: std::ptr::null(),
            name_prefix_len: 0,
            ext: std::ptr::null(),
            ext_len: 0,
            data: std::ptr::null(),
            len: 0,
        }
    }

    /// A one-member sample: a ustar header for `a/000001.jpg` and 3 bytes.
    fn sample() -> Vec<u8> {
        let mut h = vec![0u8; 512];
        h[..12].copy_from_slice(b"a/000001.jpg");
        h[124..136].copy_from_slice(b"00000000003\0");
        h[156] = b'0';
        h[257..263].copy_from_slice(b"ustar\0");
        h[148..156].copy_from_slice(b"        ");
        let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        h.extend_from_slice(b"abc");
        h
    }

    #[test]
    fn the_walk_gives_each_field_then_the_end() {
        let s = sample();
        let (mut cursor, mut f) = (0u64, empty_field());
        // SAFETY: valid pointers and lengths.
        let rc = unsafe { rf_tar_field_next(s.as_ptr(), s.len() as u64, &mut cursor, &mut f) };
        assert_eq!(rc, RF_OK);
        // SAFETY: the field points into `s`, alive here.
        let (ext, data) = unsafe {
            (
                std::slice::from_raw_parts(f.ext, f.ext_len as usize),
                std::slice::from_raw_parts(f.data, f.len as usize),
            )
        };
        assert_eq!((ext, data), (&b"jpg"[..], &b"abc"[..]));
        assert_eq!(cursor, s.len() as u64);
        // SAFETY: as above.
        let rc = unsafe { rf_tar_field_next(s.as_ptr(), s.len() as u64, &mut cursor, &mut f) };
        assert_eq!(rc, RF_END);
    }

    #[test]
    fn bad_arguments_and_bad_bytes_are_codes_with_a_message() {
        let mut s = sample();
        let (mut cursor, mut f) = (0u64, empty_field());
        // SAFETY: NULL `out` is what is tested; nothing is written.
        let rc = unsafe {
            rf_tar_field_next(
                s.as_ptr(),
                s.len() as u64,
                &mut cursor,
                std::ptr::null_mut(),
            )
        };
        assert_eq!(rc, RF_E_INVALID);
        cursor = s.len() as u64 + 1;
        // SAFETY: valid pointers; the cursor is out of range on purpose.
        let rc = unsafe { rf_tar_field_next(s.as_ptr(), s.len() as u64, &mut cursor, &mut f) };
        assert_eq!(rc, RF_E_INVALID);
        s[0] ^= 1;
        cursor = 0;
        // SAFETY: valid pointers; the header's checksum is wrong on purpose.
        let rc = unsafe { rf_tar_field_next(s.as_ptr(), s.len() as u64, &mut cursor, &mut f) };
        assert_eq!(rc, RF_E_CORRUPT);
        // SAFETY: rf_last_error returns a NUL-terminated string of this thread.
        let msg = unsafe { std::ffi::CStr::from_ptr(crate::rf_last_error()) }
            .to_string_lossy()
            .into_owned();
        assert!(msg.contains("checksum at byte 0"), "{msg}");
        // An empty sample has no fields, and a NULL pointer with it is fine.
        cursor = 0;
        // SAFETY: len 0 with a NULL sample is allowed.
        let rc = unsafe { rf_tar_field_next(std::ptr::null(), 0, &mut cursor, &mut f) };
        assert_eq!(rc, RF_END);
    }
}
