//! A published manifest's **head**: the small text object that says which
//! manifest a source (or one job over it) uses, by the SHA-256 of the
//! manifest's bytes. Pure: parses bytes and writes to a `Vec`; where heads
//! live is `board`'s business.
//!
//! ```text
//! ringfeed-job-manifest 1
//! source <the source's identity, escaped>
//! sha256 <64 lowercase hex: the manifest's bytes>
//! bytes <decimal size of the manifest>
//! listed_at <Unix seconds: when the listing began>
//! published_at <Unix seconds: when this head was written>
//! job <the job id, escaped; "-" for a source's latest head>
//! end <crc32 of all preceding bytes, 8 lowercase hex>
//! ```
//!
//! Bytes 0x00-0x20, `%` and 0x7f of the escaped fields are written `%XX`
//! (uppercase hex), as in a tar index's names. Any bytes parse to `Ok` or
//! to an `Err` saying what is wrong, never a panic; a head longer than
//! [`HEAD_BYTES_MAX`] is refused before it is read. The head names no file:
//! the manifest's name is made from its hash ([`manifest_name`]), so a
//! hostile head cannot point a reader anywhere else.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The first line of every head.
pub const HEAD_MAGIC_LINE: &str = "ringfeed-job-manifest 1";
/// Most bytes a head may have (a source identity and a job id are short).
pub const HEAD_BYTES_MAX: u64 = 64 << 10;
/// Most bytes a published manifest may have: 100 M keys of 40 bytes with
/// ETags are about 8 GiB. A head claiming more is refused before a GET.
pub const MANIFEST_BYTES_MAX: u64 = 16 << 30;
/// Longest job id kept (`--job-id`, torchrun's --rdzv-id, SLURM_JOB_ID).
pub const JOB_ID_BYTES_MAX: usize = 256;

/// What a head says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    /// The identity of the source the manifest lists (its URL and endpoint
    /// variables, as the manifest cache names it).
    pub source: Vec<u8>,
    /// SHA-256 of the manifest's bytes.
    pub sha256: [u8; 32],
    /// Size of the manifest.
    pub bytes: u64,
    /// When the listing began (whole seconds).
    pub listed_at: SystemTime,
    /// When the head was written (whole seconds, the writer's clock).
    pub published_at: SystemTime,
    /// The job it was written for; None for a source's latest head.
    pub job: Option<Vec<u8>>,
}

impl Head {
    /// The head's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256 + self.source.len());
        out.extend_from_slice(HEAD_MAGIC_LINE.as_bytes());
        out.extend_from_slice(b"\nsource ");
        escape_into(&self.source, &mut out);
        out.extend_from_slice(format!("\nsha256 {}", hex(&self.sha256)).as_bytes());
        out.extend_from_slice(format!("\nbytes {}", self.bytes).as_bytes());
        out.extend_from_slice(format!("\nlisted_at {}", unix_secs(self.listed_at)).as_bytes());
        out.extend_from_slice(
            format!("\npublished_at {}", unix_secs(self.published_at)).as_bytes(),
        );
        out.extend_from_slice(b"\njob ");
        match &self.job {
            Some(job) => escape_into(job, &mut out),
            None => out.push(b'-'),
        }
        out.push(b'\n');
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(format!("end {crc:08x}\n").as_bytes());
        out
    }

    /// Reads a head (see the module docs for what is checked).
    pub fn parse(bytes: &[u8]) -> Result<Head, String> {
        if bytes.len() as u64 > HEAD_BYTES_MAX {
            return Err(format!(
                "{} bytes, more than a head's {HEAD_BYTES_MAX}",
                bytes.len()
            ));
        }
        let body_end = match bytes.strip_suffix(b"\n") {
            Some(b) => memchr::memrchr(b'\n', b).map_or(0, |i| i + 1),
            None => return Err("it does not end with a newline: cut short".to_string()),
        };
        let (body, end_line) = bytes.split_at(body_end);
        let end = end_line
            .strip_prefix(b"end ")
            .and_then(|e| e.strip_suffix(b"\n"))
            .ok_or("its last line is not `end CRC`: cut short or not a head")?;
        let crc = std::str::from_utf8(end)
            .ok()
            .filter(|e| e.len() == 8 && e.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')))
            .and_then(|e| u32::from_str_radix(e, 16).ok())
            .ok_or("its `end` line holds no CRC-32 of 8 lowercase hex digits")?;
        let found = crc32fast::hash(body);
        if found != crc {
            return Err(format!(
                "its CRC-32 is {found:08x}, its end line says {crc:08x}: damaged"
            ));
        }
        let mut lines = body.split(|&b| b == b'\n');
        if lines.next() != Some(HEAD_MAGIC_LINE.as_bytes()) {
            return Err(format!("its first line is not `{HEAD_MAGIC_LINE}`"));
        }
        let mut field = |name: &str| -> Result<&[u8], String> {
            let line = lines.next().unwrap_or_default();
            line.strip_prefix(name.as_bytes())
                .and_then(|l| l.strip_prefix(b" "))
                .ok_or_else(|| format!("the line `{name} ...` is missing or out of place"))
        };
        let source = unescape(field("source")?).map_err(|e| format!("source: {e}"))?;
        let sha256 = parse_sha256(field("sha256")?)?;
        let bytes = number(field("bytes")?, "bytes")?;
        if bytes > MANIFEST_BYTES_MAX {
            return Err(format!(
                "it names a manifest of {bytes} bytes, more than the {MANIFEST_BYTES_MAX} a published manifest may have"
            ));
        }
        let listed_at = UNIX_EPOCH + Duration::from_secs(number(field("listed_at")?, "listed_at")?);
        let published_at =
            UNIX_EPOCH + Duration::from_secs(number(field("published_at")?, "published_at")?);
        let job = match field("job")? {
            b"-" => None,
            job => {
                let job = unescape(job).map_err(|e| format!("job: {e}"))?;
                if job.is_empty() || job.len() > JOB_ID_BYTES_MAX {
                    return Err(format!(
                        "its job id is {} bytes (1 to {JOB_ID_BYTES_MAX})",
                        job.len()
                    ));
                }
                Some(job)
            }
        };
        // The body ends with a newline: one empty piece after the last field.
        if lines.next() != Some(&[][..]) || lines.next().is_some() {
            return Err("it has lines after `job`".to_string());
        }
        Ok(Head {
            source,
            sha256,
            bytes,
            listed_at,
            published_at,
            job,
        })
    }
}

/// The name of the manifest whose bytes hash to `sha256`, beside its heads.
pub fn manifest_name(sha256: &[u8; 32]) -> String {
    format!("manifest-{}.rfm", hex(sha256))
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whole Unix seconds of `t` (0 before the epoch).
pub fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn parse_sha256(text: &[u8]) -> Result<[u8; 32], String> {
    let bad = || "its sha256 is not 64 lowercase hex digits".to_string();
    if text.len() != 64 {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    for (i, pair) in text.chunks_exact(2).enumerate() {
        let digit = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        out[i] = (digit(pair[0]).ok_or_else(bad)? << 4) | digit(pair[1]).ok_or_else(bad)?;
    }
    Ok(out)
}

fn number(text: &[u8], name: &str) -> Result<u64, String> {
    std::str::from_utf8(text)
        .ok()
        .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| format!("its {name} is not a whole number"))
}

fn escape_into(bytes: &[u8], out: &mut Vec<u8>) {
    for &b in bytes {
        if b <= 0x20 || b == b'%' || b == 0x7f {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        } else {
            out.push(b);
        }
    }
}

fn unescape(text: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        match text[i] {
            b'%' => {
                let hex = text
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .filter(|h| h.bytes().all(|c| c.is_ascii_hexdigit()))
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("a `%` at byte {i} is not followed by 2 hex digits"))?;
                out.push(hex);
                i += 3;
            }
            b if b <= 0x20 || b == 0x7f => {
                return Err(format!("byte {i} is {b:#04x}, which must be escaped"))
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(job: Option<&[u8]>) -> Head {
        Head {
            source: b"s3://b/p/ AWS_ENDPOINT_URL=http://127.0.0.1:9000".to_vec(),
            sha256: [0xab; 32],
            bytes: 12345,
            listed_at: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            published_at: UNIX_EPOCH + Duration::from_secs(1_700_000_042),
            job: job.map(<[u8]>::to_vec),
        }
    }

    #[test]
    fn a_head_reads_back_as_written_with_and_without_a_job() {
        for job in [None, Some(&b"slurm-77.0 a%b\n"[..])] {
            let h = head(job);
            assert_eq!(Head::parse(&h.encode()), Ok(h));
        }
    }

    #[test]
    fn a_head_is_refused_for_any_flipped_byte_or_cut() {
        let bytes = head(Some(b"job7")).encode();
        for i in 0..bytes.len() {
            for bit in [0x01u8, 0x20, 0x80] {
                let mut bad = bytes.clone();
                bad[i] ^= bit;
                assert!(
                    Head::parse(&bad).is_err(),
                    "byte {i} ^ {bit:#x} was accepted"
                );
            }
        }
        for len in 0..bytes.len() {
            assert!(Head::parse(&bytes[..len]).is_err(), "cut at {len} accepted");
        }
    }

    #[test]
    fn a_head_claiming_a_huge_manifest_or_past_its_size_is_refused() {
        let mut h = head(None);
        h.bytes = MANIFEST_BYTES_MAX + 1;
        let e = Head::parse(&h.encode()).unwrap_err();
        assert!(e.contains("more than"), "{e}");
        let long = vec![b'x'; HEAD_BYTES_MAX as usize + 1];
        assert!(Head::parse(&long).unwrap_err().contains("more than a head"));
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_parse_or_fail_without_a_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600)) {
            let _ = Head::parse(&bytes);
        }
    }

    #[test]
    fn the_manifest_name_comes_from_the_hash_alone() {
        assert_eq!(
            manifest_name(&[0; 32]),
            format!("manifest-{}.rfm", "0".repeat(64))
        );
    }
}
