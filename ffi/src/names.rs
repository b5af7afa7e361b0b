//! Names beside the batches (docs/ring-layout.md, "Keys and class names"):
//! each sample's key, and the class names of the labels. Pointers into the
//! ring, checked against the regions the loader declared; no string is
//! NUL-terminated.

use crate::{
    fail, guard, rf_batch, rf_feed, RF_END, RF_E_CORRUPT, RF_E_INVALID, RF_E_STALE, RF_E_VERSION,
    RF_OK,
};
use ring::KeyError;

/// A sample's key (`rf_batch_key`): the object's key relative to the
/// source (`cat/0001.jpg`), or a tar sample's key (`shard-dir/000123`), and
/// for `--record-bytes` the record's index in that object.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rf_key {
    /// The key's bytes, in the slot: valid until the batch is released. Not
    /// NUL-terminated, not necessarily UTF-8.
    pub key: *const u8,
    /// Bytes of `key`.
    pub len: u64,
    /// The record's index in its object (`serve --record-bytes`), else
    /// UINT64_MAX.
    pub record: u64,
    /// 1 when the key was longer than 4096 bytes and `key` holds its first
    /// 4096; else 0.
    pub cut: u32,
    /// Zero.
    pub reserved: u32,
}

const _: () = assert!(std::mem::size_of::<rf_key>() == 32);

/// Fills `*out` with the key of sample `i` of `batch` (taken by `rf_next`
/// on this feed and not released).
///
/// Returns RF_OK; RF_E_INVALID for NULL pointers or `i` not below
/// `batch->n_samples`; RF_E_STALE when `batch` is not held by this feed
/// (released already, or another feed's); RF_E_VERSION when the loader
/// keeps no keys (an older `ringfeed serve`); RF_E_CORRUPT when the
/// loader's entry is malformed.
///
/// # Safety
/// `feed` comes from rf_attach and was not detached; `batch` is readable;
/// `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rf_batch_key(
    feed: *const rf_feed,
    batch: *const rf_batch,
    i: u32,
    out: *mut rf_key,
) -> i32 {
    guard(|| {
        if feed.is_null() || batch.is_null() || out.is_null() {
            return fail(
                RF_E_INVALID,
                "rf_batch_key: feed, batch and out must not be NULL",
            );
        }
        // SAFETY: a live feed from rf_attach; `batch` readable by contract.
        let (consumer, b) = unsafe { (&(*feed).consumer, &*batch) };
        match consumer.sample_key(b.slot, b.generation, Some(b.data), i) {
            Ok(k) => {
                let key = rf_key {
                    key: k.key.as_ptr(),
                    len: k.key.len() as u64,
                    record: k.record.unwrap_or(u64::MAX),
                    cut: u32::from(k.cut),
                    reserved: 0,
                };
                // SAFETY: `out` is non-NULL and writable by contract.
                unsafe { *out = key };
                RF_OK
            }
            Err(e) => {
                let code = match e {
                    KeyError::NotKept { .. } => RF_E_VERSION,
                    KeyError::NotHeld { .. } => RF_E_STALE,
                    KeyError::OutOfRange { .. } => RF_E_INVALID,
                    KeyError::Corrupt { .. } => RF_E_CORRUPT,
                };
                fail(code, format!("rf_batch_key: {e}"))
            }
        }
    })
}

/// Fills `*count` with the number of class names the loader recorded (the
/// labels' classes, in ImageFolder order: `serve --decode image` over a
/// tree's class directories, or shards packed from one); 0 when it
/// recorded none (no labels, or only their count: `rf_image_format`).
///
/// # Safety
/// `feed` comes from rf_attach and was not detached; `count` is writable.
#[no_mangle]
pub unsafe extern "C" fn rf_get_class_count(feed: *const rf_feed, count: *mut u32) -> i32 {
    guard(|| {
        if feed.is_null() || count.is_null() {
            return fail(
                RF_E_INVALID,
                "rf_get_class_count: feed and count must not be NULL",
            );
        }
        // SAFETY: a live feed; `count` non-NULL and writable by contract.
        unsafe { *count = (*feed).consumer.class_count() };
        RF_OK
    })
}

/// Fills `*name` and `*len` with class name `i` (label `i` names it): a
/// pointer into the ring, valid while the feed is attached, UTF-8, not
/// NUL-terminated. Returns RF_OK, RF_END when `i` is not below
/// `rf_get_class_count` (so a loop may call until RF_END), RF_E_CORRUPT
/// when the loader's names region is malformed, RF_E_INVALID for NULL
/// pointers.
///
/// # Safety
/// `feed` comes from rf_attach and was not detached; `name` and `len` are
/// writable.
#[no_mangle]
pub unsafe extern "C" fn rf_get_class_name(
    feed: *const rf_feed,
    i: u32,
    name: *mut *const u8,
    len: *mut u64,
) -> i32 {
    guard(|| {
        if feed.is_null() || name.is_null() || len.is_null() {
            return fail(
                RF_E_INVALID,
                "rf_get_class_name: feed, name and len must not be NULL",
            );
        }
        // SAFETY: a live feed from rf_attach.
        let consumer = unsafe { &(*feed).consumer };
        match consumer.class_name(i) {
            Ok(Some(bytes)) => {
                // SAFETY: both non-NULL and writable by contract.
                unsafe {
                    *name = bytes.as_ptr();
                    *len = bytes.len() as u64;
                }
                RF_OK
            }
            Ok(None) => RF_END,
            Err(e) => fail(RF_E_CORRUPT, e),
        }
    })
}
