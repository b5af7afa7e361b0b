//! Keys and class names beside the batches (layout/names.rs, header bytes
//! 1608–1671, flags bits 6 and 7): a real producer's round trip, and a
//! consumer that trusts none of it: a region that does not fit its slots is
//! refused at attach, and a hostile entry or end written after attach is an
//! error, never a read outside the mapping.
#![cfg(not(loom))]

use std::time::Duration;

use memmap2::MmapMut;
use ringfeed_ring::consumer::{validate_header, Next};
use ringfeed_ring::layout::{flags, ClassNames, Job, KeyArea};
use ringfeed_ring::segment;
use ringfeed_ring::{
    AttachOptions, ClassNameError, Consumer, KeyError, Producer, RingGeometry, SampleEntry,
};

/// Two ranks, two slots each, four samples a batch, one page of payload.
const GEOMETRY: RingGeometry = RingGeometry {
    world_size: 2,
    slots_per_rank: 2,
    max_samples_per_slot: 4,
    slot_payload_bytes: 4096,
};
const SHORT: AttachOptions = AttachOptions {
    timeout: Some(Duration::from_millis(50)),
};
const CLASSES: [&str; 3] = ["ant", "bee", "cow"];
const FLAGS_AT: usize = 84;
const KEY_OFFSET_AT: usize = 1608;
const KEY_STRIDE_AT: usize = 1616;
const NAMES_OFFSET_AT: usize = 1624;
const NAMES_BYTES_AT: usize = 1632;
const NAMES_COUNT_AT: usize = 1640;

fn unique(test: &str) -> String {
    format!("names-{}-{test}", std::process::id())
}

/// A ring of GEOMETRY with keys (after the first 1 KiB of data) and the
/// class names, rank 0's first batch published with two keyed samples,
/// and a writable mapping to scribble on.
struct Ring {
    name: String,
    _producer: Producer,
    keys: KeyArea,
    names: ClassNames,
    map: MmapMut,
}

impl Drop for Ring {
    fn drop(&mut self) {
        let _ = segment::shm_unlink(&self.name);
    }
}

fn ring(test: &str) -> Ring {
    let name = unique(test);
    let keys = KeyArea::plan(1024, 20);
    let names = ClassNames::plan(keys.end(4), &CLASSES).unwrap();
    let job = Job {
        keys: Some(keys),
        class_names: Some(names),
        ..Job::single(2)
    };
    let classes: Vec<String> = CLASSES.iter().map(|c| c.to_string()).collect();
    let mut producer = Producer::create_with_class_names(&name, GEOMETRY, job, &classes).unwrap();
    let mut claim = producer.try_claim(0).unwrap().unwrap();
    keys.write(claim.payload_mut(), 0, &[b"cow/", b"7.jpg"], None);
    keys.write(claim.payload_mut(), 1, &[b"corpus.bin"], Some(3));
    let samples = [
        SampleEntry {
            offset: 0,
            len: 10,
            index: 5,
        },
        SampleEntry {
            offset: 10,
            len: 10,
            index: 6,
        },
    ];
    producer.publish(claim, 0, 0, &samples).unwrap();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(segment::shm_path(&name))
        .unwrap();
    // SAFETY: the test writes through this mapping only where it means to
    // corrupt the segment.
    let map = unsafe { MmapMut::map_mut(&file) }.unwrap();
    Ring {
        name,
        _producer: producer,
        keys,
        names,
        map,
    }
}

fn payload_of(consumer: &Consumer, slot: u32) -> usize {
    let l = consumer.layout();
    l.payload_offset_of(slot) as usize
}

#[test]
fn keys_and_class_names_round_trip_and_only_a_held_batch_has_keys() {
    let r = ring("round-trip");
    let mut consumer = Consumer::attach(&r.name, 0, SHORT).unwrap();
    assert_eq!(consumer.job().keys, Some(r.keys));
    assert_eq!(consumer.class_count(), 3);
    let names: Vec<&[u8]> = (0..3)
        .map(|i| consumer.class_name(i).unwrap().unwrap())
        .collect();
    assert_eq!(names, [&b"ant"[..], b"bee", b"cow"]);
    assert_eq!(consumer.class_name(3), Ok(None));
    let Next::Batch(b) = consumer.next(Some(Duration::ZERO)).unwrap() else {
        panic!("no batch")
    };
    let k = consumer
        .sample_key(b.slot, b.generation, Some(b.data), 0)
        .unwrap();
    assert_eq!((k.key, k.record), (&b"cow/7.jpg"[..], None));
    let k = consumer.sample_key(b.slot, b.generation, None, 1).unwrap();
    assert_eq!((k.key, k.record), (&b"corpus.bin"[..], Some(3)));
    assert!(matches!(
        consumer.sample_key(b.slot, b.generation, None, 2),
        Err(KeyError::OutOfRange { i: 2, n: 2 })
    ));
    let other_feed = b.data.wrapping_add(1);
    assert!(matches!(
        consumer.sample_key(b.slot, b.generation, Some(other_feed), 0),
        Err(KeyError::NotHeld { .. })
    ));
    assert!(
        matches!(
            consumer.sample_key(2, 1, None, 0),
            Err(KeyError::NotHeld { .. })
        ),
        "rank 1's slot"
    );
    assert!(
        matches!(
            consumer.sample_key(b.slot, b.generation + 1, None, 0),
            Err(KeyError::NotHeld { .. })
        ),
        "a generation not taken"
    );
    consumer.release(b.slot, b.generation).unwrap();
    assert!(
        matches!(
            consumer.sample_key(b.slot, b.generation, None, 0),
            Err(KeyError::NotHeld { .. })
        ),
        "released"
    );
}

#[test]
fn a_loader_without_keys_or_names_says_so_and_old_trainers_fields_stay_zero() {
    let name = unique("none");
    let producer = Producer::create(&name, GEOMETRY).unwrap();
    let consumer = Consumer::attach(&name, 0, SHORT).unwrap();
    assert_eq!(
        (consumer.class_count(), consumer.class_name(0)),
        (0, Ok(None))
    );
    assert!(matches!(
        consumer.sample_key(0, 1, None, 0),
        Err(KeyError::NotKept { .. })
    ));
    let bytes = std::fs::read(segment::shm_path(&name)).unwrap();
    assert!(bytes[1608..1672].iter().all(|&b| b == 0));
    drop(consumer);
    drop(producer);
}

#[test]
fn a_key_area_or_names_region_that_does_not_fit_its_slots_is_corrupt() {
    let r = ring("header");
    let bytes = std::fs::read(segment::shm_path(&r.name)).unwrap();
    let (_, job) = validate_header(&bytes, "ring").unwrap();
    assert_eq!((job.keys, job.class_names), (Some(r.keys), Some(r.names)));
    let put = |b: &mut Vec<u8>, at: usize, v: u64| b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    let cases: [(&str, usize, u64); 10] = [
        ("key area past the payload", KEY_OFFSET_AT, 4096 - 8),
        ("key area offset overflows", KEY_OFFSET_AT, u64::MAX - 7),
        ("key stride overflows", KEY_STRIDE_AT, u64::MAX - 7),
        ("key stride of a head alone", KEY_STRIDE_AT, 16),
        (
            "key stride past the longest key",
            KEY_STRIDE_AT,
            16 + 4096 + 8,
        ),
        ("unaligned key area", KEY_OFFSET_AT, 1028),
        ("names past the payload", NAMES_OFFSET_AT, 4090),
        ("names length overflows", NAMES_BYTES_AT, u64::MAX),
        ("names count not a u32", NAMES_COUNT_AT, 1 << 32),
        ("more names than their ends fit", NAMES_COUNT_AT, 1000),
    ];
    for (what, at, value) in cases {
        let mut b = bytes.clone();
        put(&mut b, at, value);
        let err = validate_header(&b, "ring")
            .err()
            .unwrap_or_else(|| panic!("{what}: accepted"));
        assert!(err.to_string().contains("ring"), "{what}: {err}");
    }
    // The same fields with their flag bits clear are not read at all: an
    // older loader's zeros, or anything else, mean no keys and no names.
    let mut b = bytes.clone();
    let f = u32::from_le_bytes(b[FLAGS_AT..FLAGS_AT + 4].try_into().unwrap())
        & !(flags::KEYS_KNOWN | flags::CLASS_NAMES_KNOWN);
    b[FLAGS_AT..FLAGS_AT + 4].copy_from_slice(&f.to_le_bytes());
    put(&mut b, KEY_STRIDE_AT, u64::MAX);
    let (_, job) = validate_header(&b, "ring").unwrap();
    assert_eq!((job.keys, job.class_names), (None, None));
}

#[test]
fn a_hostile_key_entry_or_name_end_written_after_attach_is_an_error() {
    let mut r = ring("hostile");
    let mut consumer = Consumer::attach(&r.name, 0, SHORT).unwrap();
    let Next::Batch(b) = consumer.next(Some(Duration::ZERO)).unwrap() else {
        panic!("no batch")
    };
    // Entry 0's length, past its stride.
    let at = payload_of(&consumer, b.slot) + r.keys.offset as usize + 8;
    r.map[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        consumer.sample_key(b.slot, b.generation, None, 0),
        Err(KeyError::Corrupt { i: 0, .. })
    ));
    // Name 1's end before name 0's, then past the region.
    let ends = payload_of(&consumer, 0) + r.names.offset as usize;
    r.map[ends + 4..ends + 8].copy_from_slice(&1u32.to_le_bytes());
    assert_eq!(
        consumer.class_name(1),
        Err(ClassNameError {
            name: r.name.clone(),
            i: 1
        })
    );
    r.map[ends + 8..ends + 12].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(consumer.class_name(2).is_err());
    assert_eq!(consumer.class_name(0).unwrap(), Some(&b"ant"[..]));
    consumer.release(b.slot, b.generation).unwrap();
}
