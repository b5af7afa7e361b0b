//! Names a trainer reads beside a batch (header bytes 1608–1671, flags bits
//! 6 and 7; docs/ring-layout.md, "Keys and class names"):
//!
//! - [`KeyArea`] ([`super::flags::KEYS_KNOWN`]): each slot keeps its batch's
//!   sample keys (the object's key relative to the source; for records also
//!   the record's index in it) in a fixed-stride area of its payload, after
//!   every other region. Entry i:
//!
//!   ```text
//!   0   u64  record: the record's index in its object (--record-bytes), else u64::MAX
//!   8   u32  len: key bytes stored (at most stride − 16)
//!   12  u32  flags: bit 0 the key was longer than the area allows and is cut to len bytes
//!   16  len  the key's bytes (not NUL-terminated; not necessarily UTF-8)
//!   ```
//!
//! - [`ClassNames`] ([`super::flags::CLASS_NAMES_KNOWN`]): the class names of
//!   the labels, in class order, in slot 0's payload at `offset`, written
//!   once before READY and never again (the same range of every slot is
//!   reserved and unused): `count` little-endian u32 ends (name i is
//!   `text[end(i−1) .. end(i)]`, end(−1) = 0), then the UTF-8 text.
//!
//! Both are pure byte formats here, shared by the loader that writes them
//! and the consumer that reads them; a consumer checks the regions against
//! the slot payload at attach and every length and end on every read.

/// Bytes of an entry's head (record, len, flags) before its key.
pub const KEY_HEAD_BYTES: u64 = 16;
/// Longest key an entry holds; a longer one is cut and flagged.
pub const KEY_BYTES_MAX: u64 = 4096;
/// An entry's `record` when the sample is not a record.
pub const NOT_A_RECORD: u64 = u64::MAX;
/// Most class names a ring records.
pub const CLASS_NAMES_MAX: u32 = 1 << 20;
/// Largest class names region (names and their ends).
pub const CLASS_NAMES_BYTES_MAX: u64 = 64 << 20;

/// Where a slot keeps its samples' keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyArea {
    /// Payload offset of entry 0 (8-aligned).
    pub offset: u64,
    /// Bytes from one entry to the next (a multiple of 8, at least 24).
    pub stride: u64,
}

/// One sample's key as a slot's key area holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleKey<'a> {
    /// The key's bytes (relative to the source).
    pub key: &'a [u8],
    /// The record's index in its object, for `--record-bytes`.
    pub record: Option<u64>,
    /// The key was longer than [`KEY_BYTES_MAX`] and is cut.
    pub cut: bool,
}

impl KeyArea {
    /// The area for keys of up to `key_bytes_max` bytes (capped at
    /// [`KEY_BYTES_MAX`]), starting at the first cache line past `after`
    /// with a byte to spare (a failed read's spare byte never lands in it).
    pub fn plan(after: u64, key_bytes_max: u64) -> KeyArea {
        let key = key_bytes_max.clamp(8, KEY_BYTES_MAX);
        KeyArea {
            offset: (after.saturating_add(1)).div_ceil(64).saturating_mul(64),
            stride: (KEY_HEAD_BYTES + key).div_ceil(8) * 8,
        }
    }

    /// Bytes the area takes for `samples` entries.
    pub fn bytes(&self, samples: u32) -> u64 {
        self.stride.saturating_mul(u64::from(samples))
    }

    /// Payload offset one past the area of `samples` entries.
    pub fn end(&self, samples: u32) -> u64 {
        self.offset.saturating_add(self.bytes(samples))
    }

    /// Checks an area read from a header against the slots it describes.
    pub fn check(&self, max_samples: u32, payload_bytes: u64) -> Result<(), String> {
        let fits = self
            .stride
            .checked_mul(u64::from(max_samples))
            .and_then(|b| b.checked_add(self.offset))
            .is_some_and(|end| end <= payload_bytes);
        if fits
            && self.offset.is_multiple_of(8)
            && self.stride.is_multiple_of(8)
            && self.stride > KEY_HEAD_BYTES
            && self.stride <= KEY_HEAD_BYTES + KEY_BYTES_MAX
        {
            Ok(())
        } else {
            Err(format!(
                "its key area {self:?} does not fit slots of {payload_bytes} bytes and {max_samples} samples"
            ))
        }
    }

    /// Writes entry `i` of the area into `payload`: the key made of `parts`
    /// (cut at the stride), and the record. The caller keeps `i` below the
    /// slot's samples; an entry outside `payload` is skipped (it cannot be,
    /// once [`KeyArea::check`] passed).
    pub fn write(&self, payload: &mut [u8], i: u32, parts: &[&[u8]], record: Option<u64>) {
        let start = self.offset + u64::from(i) * self.stride;
        let end = start.checked_add(self.stride);
        let range = usize::try_from(start)
            .ok()
            .zip(end.and_then(|e| usize::try_from(e).ok()));
        let Some(entry) = range.and_then(|(s, e)| payload.get_mut(s..e)) else {
            return;
        };
        let (head, room) = entry.split_at_mut(KEY_HEAD_BYTES as usize);
        let mut len = 0;
        let mut cut = false;
        for part in parts {
            let take = part.len().min(room.len() - len);
            cut |= take < part.len();
            room[len..len + take].copy_from_slice(&part[..take]);
            len += take;
        }
        head[..8].copy_from_slice(&record.unwrap_or(NOT_A_RECORD).to_le_bytes());
        head[8..12].copy_from_slice(&(len as u32).to_le_bytes());
        head[12..16].copy_from_slice(&u32::from(cut).to_le_bytes());
    }

    /// Reads an entry (`stride` bytes): None when its length does not fit
    /// its stride (a corrupt or hostile loader's).
    pub fn read(entry: &[u8]) -> Option<SampleKey<'_>> {
        let head = entry.get(..KEY_HEAD_BYTES as usize)?;
        let word = |at: usize, n: usize| {
            let mut w = [0u8; 8];
            w[..n].copy_from_slice(&head[at..at + n]);
            u64::from_le_bytes(w)
        };
        let record = word(0, 8);
        let len = usize::try_from(word(8, 4)).ok()?;
        let key = entry.get(KEY_HEAD_BYTES as usize..)?.get(..len)?;
        Some(SampleKey {
            key,
            record: (record != NOT_A_RECORD).then_some(record),
            cut: word(12, 4) & 1 != 0,
        })
    }
}

/// Where slot 0's payload keeps the class names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassNames {
    /// Payload offset of the region (of slot 0; 8-aligned).
    pub offset: u64,
    /// Bytes of the region: `4 × count` ends, then the text.
    pub bytes: u64,
    /// Names in it.
    pub count: u32,
}

impl ClassNames {
    /// The region of `names` at the first cache line at or past `after`.
    /// None when there are none, or more than the limits allow.
    pub fn plan<S: AsRef<[u8]>>(after: u64, names: &[S]) -> Option<ClassNames> {
        let count = u32::try_from(names.len()).ok()?;
        if count == 0 || count > CLASS_NAMES_MAX {
            return None;
        }
        let text: u64 = names.iter().map(|n| n.as_ref().len() as u64).sum();
        let bytes = 4 * u64::from(count) + text;
        (bytes <= CLASS_NAMES_BYTES_MAX && text <= u64::from(u32::MAX)).then(|| ClassNames {
            offset: after.div_ceil(64).saturating_mul(64),
            bytes,
            count,
        })
    }

    /// The region's bytes for `names` (what [`ClassNames::plan`] sized).
    pub fn encode<S: AsRef<[u8]>>(names: &[S]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut end = 0u32;
        for n in names {
            end = end.saturating_add(n.as_ref().len() as u32);
            out.extend_from_slice(&end.to_le_bytes());
        }
        for n in names {
            out.extend_from_slice(n.as_ref());
        }
        out
    }

    /// Payload offset one past the region.
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.bytes)
    }

    /// Checks a region read from a header against a slot payload.
    pub fn check(&self, payload_bytes: u64) -> Result<(), String> {
        let fits = self
            .offset
            .checked_add(self.bytes)
            .is_some_and(|end| end <= payload_bytes);
        if fits
            && self.count > 0
            && self.count <= CLASS_NAMES_MAX
            && 4 * u64::from(self.count) <= self.bytes
        {
            Ok(())
        } else {
            Err(format!(
                "its class names region {self:?} does not fit a slot of {payload_bytes} bytes"
            ))
        }
    }

    /// Name `i` of `region` (this region's `bytes` bytes): None past the
    /// last, or when its ends do not lie in the text in order.
    pub fn name(region: &[u8], count: u32, i: u32) -> Option<&[u8]> {
        if i >= count {
            return None;
        }
        let table = 4 * count as usize;
        let text = region.get(table..)?;
        let end_of = |k: u32| -> Option<usize> {
            let at = 4 * k as usize;
            let w = region.get(at..at + 4)?;
            usize::try_from(u32::from_le_bytes([w[0], w[1], w[2], w[3]])).ok()
        };
        let start = if i == 0 { 0 } else { end_of(i - 1)? };
        let end = end_of(i)?;
        text.get(start..end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_round_trips_and_a_long_one_is_cut_and_flagged() {
        let area = KeyArea::plan(100, 10);
        assert_eq!(area.offset, 128, "past the last byte, on a cache line");
        assert_eq!(area.stride, 32);
        let mut payload = vec![0xAAu8; 128 + 3 * 32];
        area.check(3, payload.len() as u64).unwrap();
        area.write(&mut payload, 0, &[b"cat/", b"0001.jpg"], None);
        area.write(&mut payload, 1, &[b"corpus.bin"], Some(7));
        area.write(&mut payload, 2, &[b"0123456789abcdefXYZ"], None);
        let entry = |i: usize| &payload[128 + i * 32..128 + (i + 1) * 32];
        let k = KeyArea::read(entry(0)).unwrap();
        assert_eq!(
            (k.key, k.record, k.cut),
            (&b"cat/0001.jpg"[..], None, false)
        );
        let k = KeyArea::read(entry(1)).unwrap();
        assert_eq!((k.key, k.record), (&b"corpus.bin"[..], Some(7)));
        let k = KeyArea::read(entry(2)).unwrap();
        assert_eq!((k.key, k.cut), (&b"0123456789abcdef"[..], true));
        // A hostile length past the stride reads as nothing.
        let mut bad = entry(0).to_vec();
        bad[8..12].copy_from_slice(&17u32.to_le_bytes());
        assert_eq!(KeyArea::read(&bad), None);
        assert!(KeyArea::read(&bad[..10]).is_none());
    }

    #[test]
    fn hostile_areas_are_refused_without_overflow() {
        for area in [
            KeyArea {
                offset: u64::MAX - 7,
                stride: 32,
            },
            KeyArea {
                offset: 0,
                stride: u64::MAX - 7,
            },
            KeyArea {
                offset: 4,
                stride: 32,
            },
            KeyArea {
                offset: 0,
                stride: 16,
            },
            KeyArea {
                offset: 0,
                stride: 1 << 20,
            },
            KeyArea {
                offset: 4000,
                stride: 32,
            },
        ] {
            assert!(area.check(4, 4096).is_err(), "{area:?}");
        }
        for names in [
            ClassNames {
                offset: u64::MAX,
                bytes: 8,
                count: 1,
            },
            ClassNames {
                offset: 0,
                bytes: u64::MAX,
                count: 1,
            },
            ClassNames {
                offset: 0,
                bytes: 7,
                count: 2,
            },
            ClassNames {
                offset: 0,
                bytes: 64,
                count: 0,
            },
            ClassNames {
                offset: 0,
                bytes: 4 << 30,
                count: u32::MAX,
            },
        ] {
            assert!(names.check(4096).is_err(), "{names:?}");
        }
    }

    #[test]
    fn class_names_round_trip_and_bad_ends_read_as_nothing() {
        let names = ["ant", "bee", "", "cow"];
        let plan = ClassNames::plan(10, &names).unwrap();
        assert_eq!((plan.offset, plan.count, plan.bytes), (64, 4, 16 + 9));
        let region = ClassNames::encode(&names);
        assert_eq!(region.len() as u64, plan.bytes);
        plan.check(4096).unwrap();
        let got: Vec<&[u8]> = (0..4)
            .map(|i| ClassNames::name(&region, 4, i).unwrap())
            .collect();
        assert_eq!(got, [&b"ant"[..], b"bee", b"", b"cow"]);
        assert_eq!(ClassNames::name(&region, 4, 4), None);
        let mut bad = region.clone();
        bad[4..8].copy_from_slice(&1u32.to_le_bytes()); // end(1) < end(0)
        assert_eq!(ClassNames::name(&bad, 4, 1), None);
        bad[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(ClassNames::name(&bad, 4, 3), None);
        assert_eq!(
            ClassNames::name(&region, u32::MAX, 0),
            None,
            "a count past the region"
        );
        assert!(ClassNames::plan::<&str>(0, &[]).is_none());
    }
}
