//! The readers, against files in a temporary directory.
//!
//! Every read engine runs one conformance suite (`conformance/`): each
//! behaviour is written once, generic over an [`EngineFactory`], and an
//! engine joins with one `conformance_suite!` line below, which makes a
//! module of tests named after it (`uring::...`, `pread::...`). What is
//! truly one backend's stays in a module of its own (`uring_probe`: the
//! probe and the fallback to pread); what surrounds the engines and is the
//! same for all (`--io` words, file tables, config limits) is in `setup`;
//! the figures are in `bench` (ignored tests that print them).
//!
//! io_uring tests skip (with a message) where the kernel or a seccomp filter
//! refuses io_uring, unless `RINGFEED_TEST_REQUIRE_URING=1` makes that a
//! failure. `RINGFEED_IO_URING_DISABLE=1` refuses it on purpose, so that the
//! suite runs pread alone, and `Auto` falls back (tests/run.sh runs both).
//!
//! [`EngineFactory`]: conformance::EngineFactory

use std::sync::Arc;

use ringfeed::reader::{FileTable, IoChoice, ReadEngine, ReaderConfig};

mod bench;
mod conformance;
mod remote_cached;
mod remote_memory;
mod setup;
mod support;
mod uring_probe;

use conformance::{conformance_suite, EngineFactory};

/// The io_uring engine, forced (`--io uring`).
pub struct Uring;

impl EngineFactory for Uring {
    const BACKEND: &'static str = "io_uring";

    fn open(files: Arc<FileTable>, cfg: &ReaderConfig) -> Option<Box<dyn ReadEngine>> {
        support::open_choice(IoChoice::Uring, files, cfg)
    }
}

/// The pread thread pool (`--io pread`).
pub struct Pread;

impl EngineFactory for Pread {
    const BACKEND: &'static str = "pread";

    fn open(files: Arc<FileTable>, cfg: &ReaderConfig) -> Option<Box<dyn ReadEngine>> {
        support::open_choice(IoChoice::Pread, files, cfg)
    }
}

conformance_suite!(uring, crate::Uring);
conformance_suite!(pread, crate::Pread);
conformance_suite!(remote, crate::remote_memory::RemoteMemory);
conformance_suite!(chunked, crate::remote_memory::ChunkedMemory);
conformance_suite!(cached, crate::remote_cached::CachedMemory);
