//! The conformance suite: what every read engine must do, written once.
//!
//! Each behaviour is a function generic over an [`EngineFactory`], which
//! says how to open the engine under test over a table of test files. The
//! semantics checked are the ones `ringfeed::reader` documents for every
//! backend: bytes land exactly where asked, a file that vanished, shrank or
//! grew is an error naming it and both sizes, keep-open mode reads a file as
//! it was when first opened, `submit` is all or none, `reap` polls and
//! times out, and drop waits for reads under way.
//!
//! An engine joins with one line in `main.rs`:
//!
//! ```text
//! conformance_suite!(uring, crate::Uring);
//! ```
//!
//! which makes a module `uring` holding one `#[test]` per behaviour
//! (`uring::vanished_file_is_an_error_that_names_it`, ...), so a failure
//! names the engine and the behaviour, and `cargo test -- pread::` runs one
//! engine's suite.

use std::sync::Arc;

use ringfeed::reader::{FileTable, ReadEngine, ReaderConfig};

pub mod bytes;
pub mod changes;
pub mod lifecycle;

/// A read engine the suite runs against: its name, and how to open it.
pub trait EngineFactory {
    /// What the engine's `ReadEngine::backend_name` must say; the suite
    /// checks it, so that a factory cannot quietly hand out another backend.
    const BACKEND: &'static str;

    /// The engine over `files`, tuned by `cfg` (fields of other backends
    /// are ignored), or None where this machine cannot run it: the factory
    /// says why on stderr, and the test passes without checking anything.
    fn open(files: Arc<FileTable>, cfg: &ReaderConfig) -> Option<Box<dyn ReadEngine>>;

    /// Why behaviour `group::behaviour` cannot be checked against this
    /// engine, or None (the default) to check it. A skipped behaviour says
    /// its reason on stderr and passes without checking anything.
    fn skip(_group: &str, _behaviour: &str) -> Option<&'static str> {
        None
    }
}

/// `E`'s engine over `files`, checked to be the backend `E` names; None to
/// skip.
pub fn open<E: EngineFactory>(
    files: Arc<FileTable>,
    cfg: &ReaderConfig,
) -> Option<Box<dyn ReadEngine>> {
    let engine = E::open(files, cfg)?;
    assert_eq!(engine.backend_name(), E::BACKEND, "the factory's engine");
    Some(engine)
}

/// `conformance_suite!(module, factory)`: every behaviour of the suite as a
/// `#[test]` in a new module `module`, run against the engine that
/// `factory` (a path to an [`EngineFactory`] from the crate root, such as
/// `crate::Pread`) opens.
macro_rules! conformance_suite {
    ($module:ident, $factory:path) => {
        /// The conformance suite against this engine.
        mod $module {
            $crate::conformance::conformance_tests!(
                $factory;
                bytes::reads_many_small_files_and_large_ranges_byte_exact,
                bytes::reads_many_small_files_and_large_ranges_byte_exact_in_keep_open_mode,
                bytes::reads_records_of_kept_open_files_byte_exact,
                bytes::reads_files_past_the_keep_open_limit,
                bytes::reads_files_under_a_root_byte_exact_and_errors_name_the_full_path,
                bytes::spare_byte_is_untouched_when_the_file_did_not_change,
                bytes::zero_length_read_completes_without_io,
                bytes::read_longer_than_one_chunk_is_split,
                changes::vanished_file_is_an_error_that_names_it,
                changes::vanished_kept_open_file_is_an_error_that_names_it,
                changes::truncated_file_is_a_changed_size_error,
                changes::truncated_kept_open_file_is_a_changed_size_error,
                changes::grown_file_is_a_grew_error,
                changes::grown_kept_open_file_is_a_grew_error,
                changes::empty_file_is_probed,
                changes::a_kept_file_changed_before_its_first_read_is_refused_at_open,
                changes::a_kept_file_is_read_as_it_was_opened_by_every_thread,
                lifecycle::submit_refuses_too_many_or_invalid_reads,
                lifecycle::reap_returns_when_nothing_is_in_flight_or_the_timeout_passes,
                lifecycle::drop_with_reads_in_flight_waits_for_them,
                lifecycle::poll_only_reaping_sees_completions_of_reads_from_disk_with_one_thread,
                lifecycle::poll_only_reaping_sees_completions_of_reads_from_disk_with_three_threads,
            );

            /// The kernel caps a registered file table at RLIMIT_NOFILE.
            /// Under a low limit io_uring gets fewer open/read/close slots
            /// than reads in flight, and reads queue for a slot; pread keeps
            /// fewer files open. The limit is process-wide: a child process
            /// runs the checks.
            #[test]
            fn reads_still_complete_when_rlimit_nofile_is_below_the_queue_depth() {
                $crate::support::run_child_test(
                    concat!(stringify!($module), "::low_nofile_child"),
                    &[],
                );
            }

            #[test]
            #[ignore = "run in a child process by reads_still_complete_when_rlimit_nofile_is_below_the_queue_depth"]
            fn low_nofile_child() {
                use $crate::conformance::EngineFactory as _;
                if let Some(why) = <$factory>::skip("lifecycle", "reads_complete_under_an_rlimit_nofile_of_48") {
                    eprintln!("skipping: {why}");
                    return;
                }
                if $crate::support::in_child() {
                    $crate::conformance::lifecycle::reads_complete_under_an_rlimit_nofile_of_48::<
                        $factory,
                    >();
                    println!("{}", $crate::support::CHILD_MARKER);
                }
            }
        }
    };
}

/// One `#[test]` per `group::behaviour`, calling
/// `crate::conformance::group::behaviour::<factory>()`.
macro_rules! conformance_tests {
    ($factory:path; $($group:ident :: $behaviour:ident),* $(,)?) => {
        $(
            #[test]
            fn $behaviour() {
                use $crate::conformance::EngineFactory as _;
                if let Some(why) = <$factory>::skip(stringify!($group), stringify!($behaviour)) {
                    eprintln!("skipping {}::{}: {why}", stringify!($group), stringify!($behaviour));
                    return;
                }
                $crate::conformance::$group::$behaviour::<$factory>();
            }
        )*
    };
}

pub(crate) use {conformance_suite, conformance_tests};
