//! Issue 32, item 13: a trainer attaching beside a loader that is still
//! creating its segment must wait for it, however long creation takes.
//!
//! A loader used to shm_open its segment under its name and take its liveness
//! lock right after; a trainer that looked in between found an empty segment
//! with no lock, and once its 1 s grace (counted from the start of its attach)
//! had passed, failed with "is 0 bytes with no loader behind it". The test
//! hook `TEST_PAUSE_IN_CREATE_MS` holds that moment open for 2.5 s. Its own
//! test binary: the hook is process-wide.
#![cfg(not(loom))]

use std::sync::atomic::Ordering;
use std::time::Duration;

use ringfeed_ring::gc::{self, GcOutcome};
use ringfeed_ring::producer::TEST_PAUSE_IN_CREATE_MS;
use ringfeed_ring::{AttachOptions, Consumer, Producer, RingGeometry};

#[test]
fn a_trainer_and_gc_beside_a_loader_paused_in_creation_wait_for_it() {
    let name = format!("window-{}", std::process::id());
    let g = RingGeometry {
        world_size: 1,
        slots_per_rank: 2,
        max_samples_per_slot: 4,
        slot_payload_bytes: 4096,
    };
    TEST_PAUSE_IN_CREATE_MS.store(2500, Ordering::Relaxed);
    let loader = {
        let name = name.clone();
        std::thread::spawn(move || Producer::create(&name, g))
    };
    std::thread::sleep(Duration::from_millis(200));
    let trainer = {
        let name = name.clone();
        std::thread::spawn(move || {
            Consumer::attach(
                &name,
                0,
                AttachOptions {
                    timeout: Some(Duration::from_secs(20)),
                },
            )
        })
    };
    // gc in the window: nothing of the loader's may be taken for dead.
    let swept = gc::collect().expect("gc");
    assert!(
        !swept
            .iter()
            .any(|o| matches!(o, GcOutcome::Removed { name: n, .. } if *n == name)),
        "gc removed a starting loader's segment: {swept:?}"
    );
    let attached = trainer.join().expect("trainer thread");
    let producer = loader.join().expect("loader thread");
    TEST_PAUSE_IN_CREATE_MS.store(0, Ordering::Relaxed);
    let producer = producer.expect("the loader creates its ring");
    let consumer = attached.expect("attach waits for the loader instead of calling it dead");
    assert_eq!(consumer.rank(), 0);
    drop(consumer);
    drop(producer);
}
