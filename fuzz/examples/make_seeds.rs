//! Writes the seed corpus of the `attach_next` fuzz target: real segments, made
//! by a real Producer in states a trainer meets, in the target's input format
//! `[rank, flags, segment bytes...]`.
//!
//! `cargo run --manifest-path fuzz/Cargo.toml --example make_seeds -- fuzz/seeds/attach_next`

use std::path::{Path, PathBuf};
use std::time::Duration;

use ringfeed_ring::layout::{ClassNames, Job, KeyArea};
use ringfeed_ring::{segment, AttachOptions, Consumer, Next, Producer, RingGeometry, SampleEntry};

fn geometry(world_size: u32, slots_per_rank: u32, max_samples_per_slot: u32) -> RingGeometry {
    RingGeometry {
        world_size,
        slots_per_rank,
        max_samples_per_slot,
        slot_payload_bytes: 4096,
    }
}

/// Publishes `n` batches of `samples` samples each to `rank`, each sample a
/// run of distinct bytes.
fn publish(p: &mut Producer, rank: u32, n: u64, samples: u64) {
    for step in 0..n {
        let mut claim = p.try_claim(rank).expect("claim").expect("a free slot");
        let len = 100;
        let table: Vec<SampleEntry> = (0..samples)
            .map(|i| SampleEntry {
                offset: i * len,
                len,
                index: step * 10 + i,
            })
            .collect();
        for (i, byte) in claim.payload_mut()[..(samples * len) as usize]
            .iter_mut()
            .enumerate()
        {
            *byte = (i % 251) as u8;
        }
        p.publish(claim, 0, step, &table).expect("publish");
    }
}

struct Seeds {
    dir: PathBuf,
    n: usize,
}

impl Seeds {
    /// Saves the live segment `name` as a seed for `rank`, cut to `keep`
    /// bytes when given (the target's "fit" flag pads it back with zeros).
    fn save(&mut self, what: &str, name: &str, rank: u8, keep: Option<usize>) {
        let mut bytes = std::fs::read(segment::shm_path(name)).expect("read the segment");
        let flags = match keep {
            Some(k) => {
                bytes.truncate(k);
                1
            }
            None => 0,
        };
        let mut input = vec![rank, flags];
        input.extend_from_slice(&bytes);
        self.n += 1;
        let path = self.dir.join(format!("seed-{:02}-{what}", self.n));
        std::fs::write(&path, input).expect("write the seed");
        println!("{} ({} bytes)", path.display(), bytes.len() + 2);
    }
}

fn main() {
    let dir = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new("fuzz/seeds/attach_next").to_path_buf());
    std::fs::create_dir_all(&dir).expect("create the seed directory");
    let mut seeds = Seeds { dir, n: 0 };
    let name = format!("fuzz-seeds-{}", std::process::id());
    let attach = AttachOptions {
        timeout: Some(Duration::from_secs(1)),
    };

    // The smallest ring with one batch waiting, whole and cut after the slot table.
    let mut p = Producer::create(&name, geometry(1, 1, 1)).expect("create");
    publish(&mut p, 0, 1, 1);
    seeds.save("one-batch", &name, 0, None);
    seeds.save("one-batch-short", &name, 0, Some(8192 + 192));
    drop(p);

    // Two ranks, both of rank 1's slots full.
    let mut p = Producer::create(&name, geometry(2, 2, 3)).expect("create");
    publish(&mut p, 1, 2, 3);
    seeds.save("rank1-full", &name, 1, None);
    drop(p);

    // A rank whose trainer took a batch and died holding it (attach reclaims).
    let mut p = Producer::create(&name, geometry(1, 2, 2)).expect("create");
    publish(&mut p, 0, 2, 2);
    let mut c = Consumer::attach(&name, 0, attach).expect("attach");
    assert!(matches!(c.next(Some(Duration::ZERO)), Ok(Next::Batch(_))));
    c.abandon();
    seeds.save("dead-trainer", &name, 0, None);
    drop(p);

    // A finished run, one batch left to take; and an aborted one.
    let mut p = Producer::create(&name, geometry(1, 2, 2)).expect("create");
    publish(&mut p, 0, 1, 2);
    p.finish();
    seeds.save("finished", &name, 0, None);
    drop(p);
    let mut p = Producer::create(&name, geometry(1, 2, 2)).expect("create");
    publish(&mut p, 0, 1, 2);
    p.abort(9);
    seeds.save("aborted", &name, 0, None);
    drop(p);

    // Keys in every slot and the class names in slot 0 (flags bits 6, 7).
    let keys = KeyArea::plan(2 * 100, 12);
    let classes = ["ant".to_string(), "bee".to_string(), "cow".to_string()];
    let job = Job {
        keys: Some(keys),
        class_names: ClassNames::plan(keys.end(2), &classes),
        ..Job::single(1)
    };
    let mut p = Producer::create_with_class_names(&name, geometry(1, 2, 2), job, &classes)
        .expect("create");
    let mut claim = p.try_claim(0).expect("claim").expect("a free slot");
    let table: Vec<SampleEntry> = (0..2)
        .map(|i| SampleEntry {
            offset: i * 100,
            len: 100,
            index: i,
        })
        .collect();
    for (i, byte) in claim.payload_mut()[..200].iter_mut().enumerate() {
        *byte = (i % 251) as u8;
    }
    keys.write(claim.payload_mut(), 0, &[b"ant/0001.jpg"], None);
    keys.write(claim.payload_mut(), 1, &[b"records.bin"], Some(9));
    p.publish(claim, 0, 0, &table).expect("publish");
    seeds.save("keys-and-names", &name, 0, None);
    drop(p);
}
