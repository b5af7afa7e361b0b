//! The ring against a simple model: random interleavings of publish, next,
//! release, double release, consumer crashes, loader reclaims and re-attaches.
//! After every operation the real ring must agree with the model on what can
//! be claimed, what is delivered (in order, with the right bytes) and what a
//! release answers.

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use proptest::prelude::*;
use ringfeed_ring::observer::Observer;
use ringfeed_ring::{
    AttachOptions, BatchRef, Consumer, Next, NextError, Producer, ReleaseError, RingGeometry,
    SampleEntry,
};

#[derive(Clone, Debug)]
enum Op {
    Publish(u32),
    Next(u32),
    Release(u32, usize),
    ReleaseAgain(u32),
    Crash(u32),
    LoaderReclaims,
    Reattach(u32),
}

fn op(w: u32) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..w).prop_map(Op::Publish),
        4 => (0..w).prop_map(Op::Next),
        4 => (0..w, 0..8usize).prop_map(|(r, i)| Op::Release(r, i)),
        1 => (0..w).prop_map(Op::ReleaseAgain),
        1 => (0..w).prop_map(Op::Crash),
        1 => Just(Op::LoaderReclaims),
        1 => (0..w).prop_map(Op::Reattach),
    ]
}

/// What a rank should look like.
#[derive(Default)]
struct RankModel {
    published: u64,
    consumed: u64,
    /// Payload bytes of the batches taken (what `stat` shows per rank).
    bytes_consumed: u64,
    released: BTreeSet<u64>,
    held: VecDeque<(u64, BatchRef)>,
    released_handles: Vec<BatchRef>,
    attached: bool,
}

/// Payload bytes of batch `seq`: 12 to 16, so that the byte counters see
/// batches of different sizes.
fn batch_len(seq: u64) -> u64 {
    12 + seq % 5
}

fn attach(name: &str, rank: u32) -> Consumer {
    Consumer::attach(
        name,
        rank,
        AttachOptions {
            timeout: Some(Duration::from_secs(2)),
        },
    )
    .expect("attach")
}

fn run(w: u32, k: u32, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let name = format!("model-{}-{}", std::process::id(), rand_suffix());
    let g = RingGeometry {
        world_size: w,
        slots_per_rank: k,
        max_samples_per_slot: 4,
        slot_payload_bytes: 4096,
    };
    let mut p = Producer::create(&name, g).expect("create");
    let observer = Observer::open(&name).expect("observer");
    let mut consumers: Vec<Option<Consumer>> = (0..w).map(|r| Some(attach(&name, r))).collect();
    let mut model: Vec<RankModel> = (0..w)
        .map(|_| RankModel {
            attached: true,
            ..Default::default()
        })
        .collect();
    let kk = u64::from(k);
    for op in ops {
        match op {
            Op::Publish(r) => {
                let m = &mut model[r as usize];
                let seq = m.published;
                let free = seq < kk || m.released.contains(&(seq - kk));
                let claim = p.try_claim(r).expect("claim");
                prop_assert_eq!(claim.is_some(), free, "rank {} seq {}: claimable", r, seq);
                if let Some(mut c) = claim {
                    let buf = c.payload_mut();
                    buf[..8].copy_from_slice(&seq.to_le_bytes());
                    buf[8..12].copy_from_slice(&r.to_le_bytes());
                    let s = [SampleEntry {
                        offset: 0,
                        len: batch_len(seq),
                        index: seq * u64::from(w) + u64::from(r),
                    }];
                    p.publish(c, 0, seq, &s).expect("publish");
                    m.published += 1;
                }
            }
            Op::Next(r) => {
                let m = &mut model[r as usize];
                let Some(c) = consumers[r as usize].as_mut() else {
                    continue;
                };
                let got = c.try_next().expect("next");
                prop_assert_eq!(got.is_some(), m.published > m.consumed);
                if let Some(b) = got {
                    prop_assert_eq!(b.seq, m.consumed);
                    prop_assert_eq!(b.step, m.consumed);
                    // SAFETY: the batch is held and its consumer attached.
                    let bytes = unsafe { b.sample_bytes(0) };
                    prop_assert_eq!(&bytes[..8], &m.consumed.to_le_bytes());
                    prop_assert_eq!(&bytes[8..12], &r.to_le_bytes());
                    // SAFETY: as above.
                    prop_assert_eq!(
                        unsafe { b.sample_table() }[0].index,
                        m.consumed * u64::from(w) + u64::from(r)
                    );
                    prop_assert_eq!(b.data_len, batch_len(m.consumed));
                    m.bytes_consumed += batch_len(m.consumed);
                    m.held.push_back((m.consumed, b));
                    m.consumed += 1;
                } else {
                    // Nothing published: a wait could only end if the slot of
                    // the next batch is not still held by this consumer.
                    let held_by_us = m.consumed >= kk && !m.released.contains(&(m.consumed - kk));
                    match c.next(Some(Duration::ZERO)) {
                        Err(NextError::SlotHeld { slot, step, .. }) => {
                            prop_assert!(held_by_us, "rank {}: SlotHeld for a free slot", r);
                            prop_assert_eq!(step, m.consumed - kk);
                            prop_assert_eq!(u64::from(slot), u64::from(r) * kk + (m.consumed % kk));
                        }
                        Ok(Next::Timeout) => prop_assert!(
                            !held_by_us,
                            "rank {}: timeout while its own slot is held",
                            r
                        ),
                        other => prop_assert!(false, "rank {}: unexpected {:?}", r, other),
                    }
                }
            }
            Op::Release(r, i) => {
                let m = &mut model[r as usize];
                let Some(c) = consumers[r as usize].as_mut() else {
                    continue;
                };
                if m.held.is_empty() {
                    continue;
                }
                let (seq, b) = m.held.remove(i % m.held.len()).expect("in range");
                c.release(b.slot, b.generation)
                    .expect("release of a held batch");
                m.released.insert(seq);
                m.released_handles.push(b);
            }
            Op::ReleaseAgain(r) => {
                let m = &model[r as usize];
                let Some(c) = consumers[r as usize].as_mut() else {
                    continue;
                };
                let Some(b) = m.released_handles.last() else {
                    continue;
                };
                let e = c
                    .release(b.slot, b.generation)
                    .expect_err("second release must be refused");
                prop_assert!(
                    matches!(
                        e,
                        ReleaseError::AlreadyReleased { .. } | ReleaseError::Stale { .. }
                    ),
                    "{:?}",
                    e
                );
            }
            Op::Crash(r) => {
                if let Some(c) = consumers[r as usize].take() {
                    c.abandon();
                    model[r as usize].attached = false;
                }
            }
            Op::LoaderReclaims => {
                let reclaimed = p.reclaim_dead_consumers();
                for (r, m) in model.iter_mut().enumerate() {
                    let expected = if m.attached { 0 } else { m.held.len() as u64 };
                    let got = reclaimed
                        .iter()
                        .find(|x| x.rank as usize == r)
                        .map_or(0, |x| x.batches);
                    prop_assert_eq!(got, expected, "rank {} reclaimed", r);
                    if !m.attached {
                        for (seq, b) in m.held.drain(..) {
                            m.released.insert(seq);
                            m.released_handles.push(b);
                        }
                    }
                }
            }
            Op::Reattach(r) => {
                let m = &mut model[r as usize];
                if m.attached {
                    continue;
                }
                consumers[r as usize] = Some(attach(&name, r));
                // Attaching reclaims what the dead consumer held; the new one
                // continues with the next batch nobody took.
                for (seq, b) in m.held.drain(..) {
                    m.released.insert(seq);
                    m.released_handles.push(b);
                }
                m.attached = true;
            }
        }
        // `stat`'s view: batches and bytes taken per rank, across crashes
        // and re-attaches.
        let snap = observer.snapshot();
        for (r, m) in model.iter().enumerate() {
            prop_assert_eq!(snap.ranks[r].consumed, m.consumed, "rank {} consumed", r);
            prop_assert_eq!(
                snap.ranks[r].bytes_consumed,
                m.bytes_consumed,
                "rank {} bytes consumed",
                r
            );
        }
    }
    drop(consumers);
    drop(p);
    Ok(())
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn ring_agrees_with_the_model_under_random_interleavings(
        (w, k, ops) in (1u32..4, 1u32..4).prop_flat_map(|(w, k)| (Just(w), Just(k), proptest::collection::vec(op(w), 1..300)))
    ) {
        run(w, k, ops)?;
    }
}

/// `ringfeed stat`'s wait time of a rank grows while its consumer waits, not
/// only once the wait ends: a trainer starved for minutes (a C trainer's
/// `rf_next` with no timeout is one wait) must show it while it lasts.
#[test]
fn a_long_wait_is_counted_while_it_lasts() {
    let name = format!("model-wait-{}-{}", std::process::id(), rand_suffix());
    let g = RingGeometry {
        world_size: 1,
        slots_per_rank: 2,
        max_samples_per_slot: 1,
        slot_payload_bytes: 4096,
    };
    let producer = Producer::create(&name, g).expect("create");
    let mut consumer = attach(&name, 0);
    let waiter = std::thread::spawn(move || {
        matches!(
            consumer.next(Some(Duration::from_millis(1500))),
            Ok(Next::Timeout)
        )
    });
    std::thread::sleep(Duration::from_millis(800));
    let observed = Observer::open(&name).expect("observe").snapshot().ranks[0].wait;
    assert!(
        waiter.join().expect("waiter"),
        "nothing was published: the wait times out"
    );
    assert!(
        observed >= Duration::from_millis(400),
        "after 800 ms of a 1.5 s wait, stat saw only {observed:?}"
    );
    let total = Observer::open(&name).expect("observe").snapshot().ranks[0].wait;
    assert!(
        total >= Duration::from_millis(1400) && total < Duration::from_secs(3),
        "{total:?} for a 1.5 s wait"
    );
    drop(producer);
}
