//! Attaching: find the loader's segment, trust nothing in it (every offset
//! recomputed from the header's counts against the mapping's real size), and
//! take the rank's lock.

use super::fork::register_lock_fd;
use super::*;

/// How long attach keeps looking when the loader is gone (a dead loader's
/// segment, or the outcome a loader left at exit) before it says so: long
/// enough for a loader being restarted to take the name, short enough that
/// a trainer learns at once, in effect, that its loader is not coming.
pub const GONE_GRACE: Duration = Duration::from_secs(1);
use crate::outcome::{Found, Outcome, OutcomeKind};
use crate::resume::Tail;

/// First pause of an attach that waits for a segment to be finished or a
/// rank to be freed; it doubles up to `ATTACH_POLL`.
const ATTACH_RETRY_FIRST: Duration = Duration::from_micros(200);

/// Longest pause of an attach that waits for a segment to appear (it is
/// woken at once by the /dev/shm watch; this bounds a missed event), or that
/// waits without a watch.
const ATTACH_POLL: Duration = Duration::from_millis(10);

/// An attach that has waited this long for a name that does not exist says,
/// once, on stderr, which loaders do (closest first), and waits on: a
/// misspelled `RINGFEED_NAME` is otherwise silent for its whole timeout.
pub const NAME_HINT_AFTER: Duration = Duration::from_secs(5);

/// Says on stderr, once, that `name` does not exist after `waited`, and
/// which loaders do. A closed stderr is not an error.
fn say_name_hint(name: &str, rank: u32, waited: Duration, timeout: Option<Duration>) {
    use std::io::Write;
    let more = match timeout {
        Some(t) => format!("waiting up to {:.0} s in all", t.as_secs_f64()),
        None => "waiting on (no timeout)".to_owned(),
    };
    let _ = writeln!(
        std::io::stderr().lock(),
        "ringfeed: rank {rank} has waited {:.0} s for a loader named {name:?}, and none is running here ({}); {more}; \
         check RINGFEED_NAME (or the name given to attach)",
        waited.as_secs_f64(),
        crate::loaders::name_hint(name)
    );
}

/// The loader's release as its header records it (at the same offset in
/// every ABI version): None when it is not there (a loader that predates
/// the field) or is not printable text.
fn loader_release(header: &[u8]) -> Option<String> {
    let field = header.get(LOADER_RELEASE_OFFSET..LOADER_RELEASE_OFFSET + LOADER_RELEASE_BYTES)?;
    let text = field.split(|&b| b == 0).next()?;
    let text = std::str::from_utf8(text).ok()?;
    let printable = !text.is_empty() && text.chars().all(|c| c.is_ascii_graphic());
    printable.then(|| text.to_string())
}

pub(super) fn corrupt(path: &str, what: impl Into<String>) -> AttachError {
    AttachError::Corrupt {
        path: path.to_string(),
        what: what.into(),
    }
}

/// Validates a mapped header against the mapping's real size and returns the
/// layout recomputed from its counts, and where its ranks sit in the job.
/// Exposed for the fuzz target.
pub fn validate_header(bytes: &[u8], path: &str) -> Result<(Layout, Job), AttachError> {
    if (bytes.len() as u64) < HEADER_BYTES {
        return Err(corrupt(
            path,
            format!(
                "it is {} bytes, smaller than a ring header ({HEADER_BYTES})",
                bytes.len()
            ),
        ));
    }
    let u32_at =
        |o: usize| u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
    let u64_at = |o: usize| u64::from(u32_at(o)) | (u64::from(u32_at(o + 4)) << 32);
    if u64_at(0) != MAGIC {
        return Err(corrupt(path, "bad magic (not made by ringfeed)"));
    }
    let abi = u32_at(8);
    if abi != ABI_VERSION {
        return Err(AttachError::AbiMismatch {
            path: path.to_string(),
            found: abi,
            expected: ABI_VERSION,
            loader_release: loader_release(bytes),
        });
    }
    if u64::from(u32_at(12)) != HEADER_BYTES || u64::from(u32_at(28)) != PAGE_BYTES {
        return Err(corrupt(
            path,
            "header or page size differs from this version's",
        ));
    }
    let geometry = RingGeometry {
        world_size: u32_at(16),
        slots_per_rank: u32_at(20),
        max_samples_per_slot: u32_at(24),
        slot_payload_bytes: u64_at(32),
    };
    let layout = Layout::compute(geometry).map_err(|e| corrupt(path, format!("geometry: {e}")))?;
    if layout.geometry.slot_payload_bytes != geometry.slot_payload_bytes {
        return Err(corrupt(path, "slot payload size is not page-aligned"));
    }
    check_offsets(
        &layout,
        [u64_at(40), u64_at(48), u64_at(56), u64_at(64), u64_at(72)],
        bytes.len(),
        path,
    )?;
    let start =
        (u32_at(84) & crate::layout::flags::START_KNOWN != 0).then(|| crate::layout::RunStart {
            epoch: u64_at(112),
            samples_consumed: u64_at(120),
            dataset_samples: u64_at(176),
        });
    let order = run_order(u32_at(84), u64_at);
    let (images, tokens) = sample_formats(u32_at(84), &u64_at, geometry, path)?;
    let job = Job::from_header(
        u32_at(100),
        u32_at(96),
        geometry.world_size,
        u64_at(104),
        start,
    )
    .map_err(|e| corrupt(path, e))?;
    let (keys, class_names) = names(u32_at(84), u64_at, geometry).map_err(|e| corrupt(path, e))?;
    let tail = run_tail(u32_at(84), u64_at, &job, geometry.max_samples_per_slot)
        .map_err(|e| corrupt(path, e))?;
    let job = Job {
        order,
        images,
        keys,
        class_names,
        tail,
        tokens,
        ..job
    };
    Ok((layout, job))
}

/// The header's stored offsets against those its counts give, and its
/// segment size against the object's.
fn check_offsets(
    layout: &Layout,
    stored: [u64; 5],
    len: usize,
    path: &str,
) -> Result<(), AttachError> {
    let computed = [
        layout.segment_bytes,
        layout.rank_table_offset,
        layout.slot_table_offset,
        layout.payload_offset,
        layout.slot_meta_bytes,
    ];
    if stored != computed {
        return Err(corrupt(
            path,
            format!(
                "stored offsets {stored:?} differ from those computed from its counts {computed:?}"
            ),
        ));
    }
    if layout.segment_bytes != len as u64 {
        return Err(corrupt(
            path,
            format!(
                "header says {} bytes but the segment is {} bytes (truncated?)",
                layout.segment_bytes, len
            ),
        ));
    }
    Ok(())
}

/// The header's key area and class names region (offsets 1608 to 1647),
/// where its flags say it holds them, checked against the slots.
#[allow(clippy::type_complexity)]
fn names(
    flags: u32,
    u64_at: impl Fn(usize) -> u64,
    g: RingGeometry,
) -> Result<
    (
        Option<crate::layout::KeyArea>,
        Option<crate::layout::ClassNames>,
    ),
    String,
> {
    use crate::layout::{flags as f, ClassNames, KeyArea};
    let keys = (flags & f::KEYS_KNOWN != 0).then(|| KeyArea {
        offset: u64_at(1608),
        stride: u64_at(1616),
    });
    if let Some(k) = &keys {
        k.check(g.max_samples_per_slot, g.slot_payload_bytes)?;
    }
    let names = match flags & f::CLASS_NAMES_KNOWN != 0 {
        false => None,
        true => {
            let count = u32::try_from(u64_at(1640))
                .map_err(|_| format!("its class names count {} is not a u32", u64_at(1640)))?;
            let names = ClassNames {
                offset: u64_at(1624),
                bytes: u64_at(1632),
                count,
            };
            names.check(g.slot_payload_bytes)?;
            Some(names)
        }
    };
    Ok((keys, names))
}

/// The header's tail (offsets 240 to 255), when its flags say it holds one,
/// checked: a known tail word, and the steps of an epoch that the resume
/// rule gives for the header's sample count and step (`job` is read from
/// the same header, its tail not yet set). [`Tail::Drop`] without the flag.
fn run_tail(
    flags: u32,
    u64_at: impl Fn(usize) -> u64,
    job: &Job,
    batch_size: u32,
) -> Result<Tail, String> {
    if flags & crate::layout::flags::TAIL_KNOWN == 0 {
        return Ok(Tail::Drop);
    }
    let word = u64_at(240);
    let tail = Tail::from_word(word)
        .ok_or_else(|| format!("its tail mode {word} is neither 0 (drop) nor 1 (keep)"))?;
    let stored = u64_at(248);
    let dataset_samples = u64_at(176);
    let rule = Job { tail, ..*job }.steps_per_epoch(batch_size, dataset_samples);
    if rule != Some(stored) {
        return Err(format!(
            "it says {stored} steps per epoch, but {dataset_samples} samples in steps of {} x {batch_size} with the tail {} make {rule:?}",
            job.job_world_size,
            tail.name()
        ));
    }
    Ok(tail)
}

/// The header's record of the order (offsets 184 to 207), when its flags
/// say it holds one.
fn run_order(flags: u32, u64_at: impl Fn(usize) -> u64) -> Option<crate::layout::RunOrder> {
    (flags & crate::layout::flags::ORDER_KNOWN != 0).then(|| crate::layout::RunOrder {
        seed: u64_at(184),
        shuffled: u64_at(192) != 0,
        // High half: block samples, low half: window blocks.
        block_samples: (u64_at(200) >> 32) as u32,
        window_blocks: u64_at(200) as u32,
    })
}

/// The header's image format (offsets 208 to 239), when its flags
/// (`flags`, offset 84) say it holds one; not yet checked.
fn image_format(flags: u32, u64_at: impl Fn(usize) -> u64) -> Option<crate::layout::ImageFormat> {
    (flags & crate::layout::flags::IMAGES_KNOWN != 0).then(|| crate::layout::ImageFormat {
        height: (u64_at(208) >> 32) as u32,
        width: u64_at(208) as u32,
        chw: u64_at(216) & 1 != 0,
        classes: (u64_at(216) >> 32) as u32,
        labels_offset: u64_at(224),
        bad_offset: u64_at(232),
    })
}

/// The header's image and token formats, when its flags say it holds
/// them, each checked against the slots it describes.
fn sample_formats(
    flags: u32,
    u64_at: &impl Fn(usize) -> u64,
    geometry: RingGeometry,
    path: &str,
) -> Result<SampleFormats, AttachError> {
    let (n, payload) = (geometry.max_samples_per_slot, geometry.slot_payload_bytes);
    let images = image_format(flags, u64_at)
        .map(|i| {
            i.check(n, payload)
                .map(|()| i)
                .map_err(|e| corrupt(path, e))
        })
        .transpose()?;
    let tokens = token_format(flags, u64_at)
        .map(|t| {
            t.check(n, payload)
                .map(|()| t)
                .map_err(|e| corrupt(path, e))
        })
        .transpose()?;
    Ok((images, tokens))
}

/// What a header says its samples are (images, token windows), if anything.
type SampleFormats = (
    Option<crate::layout::ImageFormat>,
    Option<crate::layout::TokenFormat>,
);

/// The header's token format (offsets 1544 to 1607), when its flags say it
/// holds one; not yet checked.
fn token_format(flags: u32, u64_at: impl Fn(usize) -> u64) -> Option<crate::layout::TokenFormat> {
    use crate::layout::{TokenFormat, TOKENS_OFFSET, TOKEN_WORDS};
    (flags & crate::layout::flags::TOKENS_KNOWN != 0).then(|| {
        let mut words = [0u64; TOKEN_WORDS];
        for (i, w) in words.iter_mut().enumerate() {
            *w = u64_at(TOKENS_OFFSET + 8 * i);
        }
        TokenFormat::from_words(words)
    })
}

impl Consumer {
    /// Attaches to rank `rank` of loader `name`, waiting for the loader to
    /// appear and the rank to be free for at most `opts.timeout`.
    pub fn attach(name: &str, rank: u32, opts: AttachOptions) -> Result<Consumer, AttachError> {
        segment::validate_name(name)?;
        let path = segment::shm_path(name).display().to_string();
        let start = Instant::now();
        let expired = || opts.timeout.is_some_and(|t| start.elapsed() >= t);
        let timeout_err = || AttachError::Timeout {
            name: name.to_string(),
            path: path.clone(),
            waited_ms: start.elapsed().as_millis() as u64,
            running: crate::loaders::name_hint(name),
        };
        let remaining = || {
            opts.timeout.map_or(ATTACH_POLL, |t| {
                t.saturating_sub(start.elapsed()).min(ATTACH_POLL)
            })
        };
        // Made on the first miss; None after that if inotify is unavailable.
        let mut watch: Option<Option<segment::ShmWatch>> = None;
        let mut retry_pause = ATTACH_RETRY_FIRST;
        let mut hinted = false;
        loop {
            let fd = match segment::shm_open(name, libc::O_RDWR, 0) {
                Ok(fd) => fd,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    // A loader that already exited (failed, or served its
                    // run) is not coming back: say so within GONE_GRACE, in
                    // its words (the grace lets a loader being restarted
                    // take the name first).
                    let ended = ended_loader(name);
                    if let Some(e) = ended {
                        if start.elapsed() >= GONE_GRACE || expired() {
                            return Err(e);
                        }
                    } else if expired() {
                        return Err(timeout_err());
                    } else if !hinted && start.elapsed() >= NAME_HINT_AFTER {
                        hinted = true;
                        say_name_hint(name, rank, start.elapsed(), opts.timeout);
                    }
                    match &watch {
                        // Watch first, then look again: a segment created in
                        // between is found by that second look.
                        None => watch = Some(segment::ShmWatch::new().ok()),
                        Some(Some(w)) => {
                            w.wait(remaining());
                        }
                        Some(None) => std::thread::sleep(remaining()),
                    }
                    continue;
                }
                Err(_) if segment::is_a_directory(name) => {
                    return Err(corrupt(&path, "it is a directory"))
                }
                Err(e) => {
                    return Err(AttachError::Io {
                        what: "cannot open",
                        path,
                        source: e,
                    })
                }
            };
            if let Some(kind) = segment::not_regular(&fd) {
                // Not a file at all: no loader will ever make this one ready.
                return Err(corrupt(&path, format!("it is {kind}")));
            }
            // Before a byte of it is read: another user's loader may hold the
            // name (names are shared by every user of the machine).
            check_owner(&fd, name, &path)?;
            match Self::attach_fd(fd, name, rank) {
                // A loader still building its segment, or a rank whose previous
                // consumer is still detaching: wait and retry within the timeout.
                Err(Retry::Later(e)) => {
                    if expired() {
                        return Err(e.unwrap_or_else(timeout_err));
                    }
                    std::thread::sleep(retry_pause.min(remaining()));
                    retry_pause = (retry_pause * 2).min(ATTACH_POLL);
                }
                Err(Retry::Gone(e)) if start.elapsed() >= GONE_GRACE || expired() => return Err(e),
                Err(Retry::Gone(_)) => {
                    std::thread::sleep(retry_pause.min(remaining()));
                    retry_pause = (retry_pause * 2).min(ATTACH_POLL);
                }
                Err(Retry::Never(e)) => return Err(e),
                Ok(c) => return Ok(c),
            }
        }
    }

    /// Attaches through an already open segment descriptor (tests, fuzzing).
    pub fn attach_to_fd(fd: OwnedFd, name: &str, rank: u32) -> Result<Consumer, AttachError> {
        Self::attach_fd(fd, name, rank).map_err(|r| match r {
            Retry::Later(Some(e)) | Retry::Never(e) | Retry::Gone(e) => e,
            Retry::Later(None) => corrupt(name, "the loader has not finished creating the segment"),
        })
    }

    fn attach_fd(fd: OwnedFd, name: &str, rank: u32) -> Result<Consumer, Retry> {
        let path = segment::shm_path(name).display().to_string();
        let io_err = |what, source| {
            Retry::Never(AttachError::Io {
                what,
                path: path.clone(),
                source,
            })
        };
        let size = segment::file_size(&fd).map_err(|e| io_err("cannot stat", e))?;
        if size < HEADER_BYTES {
            return Err(too_small(&fd, size, &path));
        }
        // Not through `fd`: the rank lock taken on `fd` below must end when
        // the descriptor is closed, even in a forked child that keeps the
        // mapping (see `LOCK_FDS`).
        let map = segment::map_apart(&fd, size).map_err(|e| io_err("cannot map", e))?;
        // SAFETY: the mapping is `size` bytes long and stays alive for this
        // borrow. Racing writes by another process can only make validation
        // fail; the copy taken by validate_header is what we keep.
        let bytes = unsafe { std::slice::from_raw_parts(map.as_ptr(), size as usize) };
        // SAFETY: as above; Header is made of atomics and HEADER_BYTES <= size.
        let header = unsafe { &*(map.as_ptr() as *const crate::layout::Header) };
        // SYNC POINT: Acquire pairs with the loader's Release store of READY:
        // every header field written before it is visible now.
        ready_or_retry(header, &fd, &path)?;
        let (layout, job) = validate_header(bytes, &path).map_err(Retry::Never)?;
        if !crate::name_tag::matches(bytes, name) {
            return Err(Retry::Never(AttachError::NameMismatch {
                name: name.to_string(),
                path,
            }));
        }
        let world_size = layout.geometry.world_size;
        if rank >= world_size {
            return Err(Retry::Never(AttachError::RankOutOfRange {
                name: name.to_string(),
                rank,
                world_size,
            }));
        }
        let view = View::new(map, layout);
        let loader_pid = view.header().loader_pid.load(Ordering::Relaxed);
        if !segment::byte_is_locked(&fd, LOADER_LOCK_BYTE)
            .map_err(|e| io_err("cannot check the loader lock of", e))?
        {
            // A dead loader's segment: say so at once (in its own words if
            // it left them) rather than wait out the timeout for a restart
            // that may never come.
            let gone = ended_loader(name).unwrap_or(AttachError::LoaderGone {
                name: name.to_string(),
                pid: loader_pid,
            });
            return Err(Retry::Gone(gone));
        }
        let block = view.rank(rank);
        lock_rank(&fd, name, rank, block).map_err(|e| match e {
            Ok(retry) => retry,
            Err(source) => io_err("cannot lock", source),
        })?;
        // We hold the rank lock: we are now the writer of the consumer fields.
        // Give back whatever a previous consumer of this rank took and never
        // released, then continue with the next batch it did not take.
        let slots = view.rank_slots(rank);
        let (_, wake) = protocol::reclaim(block, &slots, &view.header().producer_sleeping);
        if wake {
            futex::wake_all(&block.release_futex);
        }
        let consumed = block.consumed.load(Ordering::Relaxed);
        block
            .consumer_pid
            .store(std::process::id(), Ordering::Relaxed);
        block.attach_count.fetch_add(1, Ordering::Relaxed);
        block.consumer_sleeping.store(0, Ordering::Relaxed);
        let k = layout.geometry.slots_per_rank as usize;
        let held = HeldHere::record(&fd, rank);
        Ok(Consumer {
            _held: held,
            name: name.to_string(),
            rank,
            job,
            lock_entry: register_lock_fd(fd.as_raw_fd()),
            fd: ManuallyDrop::new(fd),
            view,
            loader_pid,
            consumed,
            tables: vec![Vec::new(); k],
            abandoned: false,
            start_requested: false,
            forks_at_attach: forks_so_far(),
            pid: std::process::id(),
            last_liveness: None,
        })
    }
}

/// Ok when the segment open as `fd` belongs to a user this process trusts
/// (`segment::trust`), else `Untrusted` naming its owner.
pub(crate) fn check_owner(fd: &OwnedFd, name: &str, path: &str) -> Result<(), AttachError> {
    match segment::trust::owner_of(fd) {
        Ok(owner) if !segment::trust::owner_trusted(owner) => Err(AttachError::Untrusted {
            name: name.to_string(),
            path: path.to_string(),
            owner,
            euid: crate::safe_file::euid(),
        }),
        Ok(_) => Ok(()),
        Err(e) => Err(AttachError::Io {
            what: "cannot stat",
            path: path.to_string(),
            source: e,
        }),
    }
}

/// Ok once the header's loader finished creating the segment (read with
/// Acquire: every header field written before READY is visible); a foreign
/// magic is refused at once, a segment still being created is retried
/// while its loader lives.
fn ready_or_retry(header: &crate::layout::Header, fd: &OwnedFd, path: &str) -> Result<(), Retry> {
    let st = header.state.load(Ordering::Acquire);
    // A loader still creating the segment has written no magic yet; any
    // other magic is a foreign file, refused at once.
    let magic = header.magic.load(Ordering::Relaxed);
    if magic != 0 && magic != MAGIC {
        return Err(Retry::Never(corrupt(
            path,
            "bad magic (not made by ringfeed)",
        )));
    }
    if st == state::CREATING {
        let alive = segment::byte_is_locked(fd, LOADER_LOCK_BYTE).unwrap_or(false);
        let e = corrupt(
            path,
            "the loader died before it finished creating the segment; remove it with `ringfeed gc`",
        );
        return Err(if alive {
            Retry::Later(None)
        } else {
            Retry::Never(e)
        });
    }
    Ok(())
}

/// A segment smaller than its header. A loader names its segment only once
/// it is locked and sized (`Producer::create`): one this small is garbage,
/// or, unlocked, left by a loader that died (of a version that named it
/// before locking it). Empty, it is reported once GONE_GRACE has passed,
/// which lets a loader being restarted replace it.
fn too_small(fd: &OwnedFd, size: u64, path: &str) -> Retry {
    let alive = segment::byte_is_locked(fd, LOADER_LOCK_BYTE).unwrap_or(false);
    if alive {
        return Retry::Later(Some(corrupt(
            path,
            format!("it is {size} bytes, smaller than a ring header ({HEADER_BYTES})"),
        )));
    }
    let e = corrupt(
        path,
        format!("it is {size} bytes with no loader behind it (one died creating it); remove it with `ringfeed gc`"),
    );
    if size == 0 {
        Retry::Gone(e)
    } else {
        Retry::Never(e)
    }
}

/// Takes rank `rank`'s lock on `fd`: `Err(Ok(retry))` when another
/// consumer holds it, `Err(Err(e))` when it cannot be taken.
fn lock_rank(
    fd: &OwnedFd,
    name: &str,
    rank: u32,
    block: &crate::layout::RankBlock,
) -> Result<(), Result<Retry, std::io::Error>> {
    match segment::try_lock_byte(fd, segment::rank_lock_byte(rank)) {
        Ok(true) => {}
        Ok(false) => {
            let pid = block.consumer_pid.load(Ordering::Relaxed);
            // The pid alone could be another PID namespace's process (a
            // trainer in another container sharing /dev/shm), or the dead
            // consumer whose pid we were given again while the loader
            // reclaims its slots: only an attachment on record here is ours.
            if pid == std::process::id() && held_here(fd, rank) {
                return Err(Ok(Retry::Never(AttachError::RankHeldByThisProcess {
                    name: name.to_string(),
                    rank,
                    pid,
                })));
            }
            return Err(Ok(Retry::Later(Some(AttachError::RankBusy {
                name: name.to_string(),
                rank,
                pid,
            }))));
        }
        Err(e) => return Err(Err(e)),
    }
    Ok(())
}

/// The ranks this process has attached and not detached, by segment file
/// (device, inode) and rank: what tells "this process holds the rank" from
/// an equal pid in another PID namespace.
static HELD_HERE: std::sync::Mutex<Vec<(u64, u64, u32)>> = std::sync::Mutex::new(Vec::new());

fn held_here_list() -> std::sync::MutexGuard<'static, Vec<(u64, u64, u32)>> {
    HELD_HERE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// True if this process attached `rank` of the segment open as `fd` and has
/// not detached it.
pub(super) fn held_here(fd: &OwnedFd, rank: u32) -> bool {
    segment::file_id(fd).is_ok_and(|(dev, ino)| held_here_list().contains(&(dev, ino, rank)))
}

/// A consumer's entry in [`HELD_HERE`], removed when it is dropped.
pub(super) struct HeldHere(Option<(u64, u64, u32)>);

impl HeldHere {
    fn record(fd: &OwnedFd, rank: u32) -> HeldHere {
        let entry = segment::file_id(fd).ok().map(|(dev, ino)| (dev, ino, rank));
        if let Some(e) = entry {
            held_here_list().push(e);
        }
        HeldHere(entry)
    }
}

impl Drop for HeldHere {
    fn drop(&mut self) {
        if let Some(e) = self.0 {
            let mut list = held_here_list();
            if let Some(i) = list.iter().position(|&x| x == e) {
                list.swap_remove(i);
            }
        }
    }
}

pub(super) enum Retry {
    /// Not yet: retry until the timeout, then report this error (or a timeout).
    Later(Option<AttachError>),
    /// Final.
    Never(AttachError),
    /// The loader is gone: final once [`GONE_GRACE`] has passed.
    Gone(AttachError),
}

/// The error for loader `name` if it left a fresh outcome (`ring::outcome`),
/// or if what lies at its outcome's place is no loader's (a directory, link,
/// FIFO: a loader could not write there).
fn ended_loader(name: &str) -> Option<AttachError> {
    let outcome = match Outcome::look(name) {
        Found::Nothing => return None,
        Found::Planted { kind, owner } => {
            return Some(AttachError::OutcomePlanted {
                name: name.to_string(),
                path: crate::outcome::outcome_path(name).display().to_string(),
                kind,
                owner,
            })
        }
        Found::Outcome(o) => o,
    };
    if outcome.age() > crate::outcome::OUTCOME_FRESH {
        return None;
    }
    let (name, pid, ago_s) = (name.to_string(), outcome.pid, outcome.age().as_secs());
    Some(match outcome.kind {
        OutcomeKind::Ended => AttachError::LoaderEnded { name, pid, ago_s },
        OutcomeKind::Failed => AttachError::LoaderFailed {
            name,
            pid,
            ago_s,
            message: outcome.message,
        },
    })
}
