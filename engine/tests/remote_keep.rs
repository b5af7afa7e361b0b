//! The fetch engine's `submit_keeping`: a read fetched in one GET hands back
//! the body's chunks (what the data cache writes, with no second GET and no
//! copy), equal to the bytes it put in the destination; a read split into
//! parts, or not asked to keep, hands back none.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use ringfeed::remote::{
    list, FetchCompletion, FetchConfig, FetchEngine, FetchRead, RemoteRuntime, StoreHandle,
};

#[test]
fn a_kept_read_hands_back_its_body_and_a_split_or_unasked_one_does_not() {
    let rt = Arc::new(RemoteRuntime::new(2).unwrap());
    let mem: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let small: Vec<u8> = (0..50_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i * 13 % 241) as u8).collect();
    for (k, v) in [("a.bin", &small), ("b.bin", &big), ("c.bin", &small)] {
        rt.block_on(mem.put(&Path::from(format!("p/{k}")), PutPayload::from(v.clone())))
            .unwrap();
    }
    let store = StoreHandle::from_store(mem, "p", "memory:///p");
    let objects = Arc::new(rt.block_on(list(&store, None)).unwrap());
    let cfg = FetchConfig {
        part_bytes: 64 << 10,
        ..FetchConfig::default()
    };
    let mut engine = FetchEngine::start(Arc::clone(&rt), store, objects, cfg).unwrap();
    let reads: [(u32, Range<u64>); 3] = [(0, 0..50_000), (1, 0..300_000), (2, 0..50_000)];
    let mut bufs: Vec<Vec<u8>> = reads
        .iter()
        .map(|(_, r)| vec![0u8; (r.end - r.start) as usize])
        .collect();
    let ops: Vec<FetchRead> = reads
        .iter()
        .zip(bufs.iter_mut())
        .enumerate()
        .map(|(i, ((object, range), buf))| FetchRead {
            object: *object,
            range: range.clone(),
            dest: buf.as_mut_ptr(),
            tag: i as u64,
        })
        .collect();
    // SAFETY: each dest is its own buffer, untouched until every completion
    // is reaped below.
    unsafe { engine.submit_keeping(&ops, &[true, true, false]).unwrap() };
    let mut done: Vec<FetchCompletion> = Vec::new();
    while engine.outstanding() > 0 {
        engine.reap(&mut done, 1, Duration::from_secs(60));
    }
    done.sort_by_key(|c| c.tag);
    assert!(done.iter().all(|c| c.result.is_ok()));
    let body: Vec<u8> = done[0]
        .chunks
        .iter()
        .flat_map(|c| c.iter().copied())
        .collect();
    assert_eq!(body, small, "the kept chunks are the object's bytes");
    assert_eq!(bufs[0], small, "and the destination got them too");
    assert!(done[1].chunks.is_empty(), "a read of 5 parts keeps nothing");
    assert_eq!(bufs[1], big);
    assert!(
        done[2].chunks.is_empty(),
        "a read not asked to keep keeps nothing"
    );
}
