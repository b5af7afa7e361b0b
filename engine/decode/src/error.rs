//! `DecodeError`: why one image could not become an output. Short messages
//! that name what was wrong; the loader prefixes the sample's key.

use std::fmt;

/// The image formats recognised by their first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// JPEG (`FF D8 FF`).
    Jpeg,
    /// PNG (`89 50 4E 47 0D 0A 1A 0A`).
    Png,
    /// WebP (`RIFF....WEBP`).
    WebP,
}

impl Format {
    /// Lower-case name: "jpeg", "png", "webp".
    pub fn name(self) -> &'static str {
        match self {
            Format::Jpeg => "jpeg",
            Format::Png => "png",
            Format::WebP => "webp",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why `Decoder::decode_into` failed. Every variant is a property of the
/// input (so `--on-bad-sample zero` may stand a zero image in for it) except
/// `OutputSize`, which is the caller's bug, and `Stopped`, which is the
/// caller's stop. `OutOfMemory` is the machine's, but also the sample's
/// doing: it is served as a bad sample too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The data ends before the image does.
    Truncated {
        /// The format the data started as.
        format: Format,
    },
    /// The data is malformed; `what` is the decoder's word for it.
    Corrupt {
        /// The format the data started as.
        format: Format,
        /// What the decoder found wrong.
        what: String,
    },
    /// The data starts like no supported image format.
    NotAnImage {
        /// Its first bytes (up to 8), in hex; empty for 0 bytes.
        first_bytes: String,
    },
    /// The header's dimensions exceed the pixel limit: refused before any
    /// pixel buffer is allocated.
    TooManyPixels {
        /// Width from the header.
        width: u64,
        /// Height from the header.
        height: u64,
        /// The spec's `max_pixels`.
        limit: u64,
    },
    /// A valid image that uses a feature this decoder lacks (e.g. a 12-bit
    /// or arithmetic-coded JPEG, an animated WebP).
    Unsupported {
        /// The format.
        format: Format,
        /// The feature.
        what: String,
    },
    /// Decoding it would take more memory at once than the whole budget
    /// (`MemoryBudget::total`): refused from its headers, before any
    /// pixel buffer is allocated.
    OverBudget {
        /// The format.
        format: Format,
        /// Width from the header.
        width: u32,
        /// Height from the header.
        height: u32,
        /// What its decode would hold at once, in bytes.
        needed: u64,
        /// The budget, in bytes.
        budget: u64,
    },
    /// A pixel buffer could not be allocated (the machine is out of
    /// memory, or the process's address space limit was reached).
    OutOfMemory {
        /// The allocation that failed, in bytes.
        bytes: u64,
    },
    /// The caller's stop condition became true while the decode waited for
    /// memory (not the sample's fault).
    Stopped,
    /// `out` is not `spec.output_len()` bytes long (a caller bug).
    OutputSize {
        /// `spec.output_len()`.
        expected: usize,
        /// `out.len()`.
        got: usize,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated { format } => write!(f, "truncated {format}: the data ends mid-image"),
            DecodeError::Corrupt { format, what } => write!(f, "corrupt {format}: {what}"),
            DecodeError::NotAnImage { first_bytes } if first_bytes.is_empty() => {
                write!(f, "not an image: 0 bytes")
            }
            DecodeError::NotAnImage { first_bytes } => write!(
                f,
                "not an image (starts {first_bytes}; JPEG, PNG and WebP are supported)"
            ),
            DecodeError::TooManyPixels { width, height, limit } => write!(
                f,
                "{width}x{height} pixels is over the limit of {limit} (a decompression bomb?): raise max_pixels if it is real"
            ),
            DecodeError::Unsupported { format, what } => write!(f, "unsupported {format}: {what}"),
            DecodeError::OverBudget { format, width, height, needed, budget } => write!(
                f,
                "decoding this {width}x{height} {format} needs {} at once, more than the decode memory budget of {}: raise the budget if it is real",
                mib(*needed),
                mib(*budget)
            ),
            DecodeError::OutOfMemory { bytes } => write!(
                f,
                "could not allocate {} for its pixels (out of memory)",
                mib(*bytes)
            ),
            DecodeError::Stopped => write!(f, "stopped while waiting for decode memory"),
            DecodeError::OutputSize { expected, got } => write!(
                f,
                "output buffer is {got} bytes, the spec needs {expected} (h * w * 3)"
            ),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Bytes as MiB with one decimal ("700.0 MiB").
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
}

/// Up to the first 8 bytes as lower-case hex pairs separated by spaces.
pub(crate) fn hex_prefix(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(24);
    for (i, b) in bytes.iter().take(8).enumerate() {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}
