//! `ringfeed run [serve flags] -- torchrun ...`: the loader and the job as
//! one command.
//!
//! It reads the job's shape from torchrun's flags, starts `ringfeed serve`
//! (this same binary) with the ranks those flags give and a name of its own,
//! waits for the loader's segment, then runs torchrun with RINGFEED_NAME set,
//! so that every rank's `attach()` finds the loader without being told.
//! SIGINT, SIGTERM and SIGHUP go to both; a loader that fails stops torchrun
//! and its error is the last thing printed; when torchrun ends, the loader is
//! stopped (if the trainers left batches untaken) and its segment removed.
//! Both children get a process group of their own, so a Ctrl-C reaches them
//! once, through this process, and die with it (PR_SET_PDEATHSIG).

mod children;
mod torchrun;

use std::ffi::OsString;
use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;

use crate::cli::say::say_err;
use crate::loader::signals;
use children::{exit_code, send, spawn, status_words, LoaderProc, Ready, POLL_MS};
pub use torchrun::{Launch, LaunchError};

/// After torchrun succeeded, how long the loader has to see the last
/// batches released and exit by itself before it is stopped.
const LOADER_FINISH_GRACE_MS: u64 = 3_000;
/// How long torchrun has to stop its ranks after a signal (its own
/// shutdown timeout is 30 s) before its process group is killed.
const TORCHRUN_STOP_TIMEOUT_MS: u64 = 60_000;
/// Exit status for a command line that cannot be run (as clap's).
pub const EXIT_USAGE: u8 = 2;
/// Exit status when torchrun cannot be executed (as a shell's).
pub const EXIT_CANNOT_EXEC: u8 = 126;
/// Exit status when torchrun is not found (as a shell's).
pub const EXIT_NOT_FOUND: u8 = 127;
/// The loader's flags that `run` derives from torchrun's, and refuses.
const DERIVED_FLAGS: [&str; 3] = ["--world-size", "--nnodes", "--node-rank"];
/// Bytes of a job id kept in a generated loader name.
const NAME_JOB_BYTES: usize = 24;

/// Arguments of `ringfeed run`: `[SERVE_FLAGS]... -- TORCHRUN...`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// `ringfeed serve`'s flags, passed to it as written (--source,
    /// --batch-size, --epochs, ...; --name is optional; --world-size,
    /// --nnodes and --node-rank come from torchrun's flags), then `--`, then
    /// torchrun (or python -m torch.distributed.run), its flags, the training
    /// script and its arguments.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required = true,
        value_name = "SERVE_FLAGS... -- TORCHRUN"
    )]
    pub args: Vec<OsString>,
}

impl RunArgs {
    /// The serve flags and the command, split at the first `--`; None
    /// without one.
    fn split(&self) -> Option<(&[OsString], &[OsString])> {
        let at = self.args.iter().position(|a| a == "--")?;
        Some((&self.args[..at], &self.args[at + 1..]))
    }
}

/// The arguments `serve` is started with: the user's flags as written, the
/// loader's name unless they gave one, and the ranks torchrun's flags give,
/// as the README's "Several machines" asks (the job's world size; with
/// several machines, their number and this one's place).
pub fn serve_argv(user_flags: &[OsString], name: &str, launch: &Launch) -> Vec<OsString> {
    let mut argv: Vec<OsString> = vec!["serve".into()];
    argv.extend(user_flags.iter().cloned());
    if flag_value(user_flags, "--name").is_none() {
        argv.extend(["--name".into(), name.into()]);
    }
    // The trainers say where the run starts (a checkpoint's load_state_dict),
    // so the same command resumes a job; an explicit --resume stands.
    if flag_value(user_flags, "--resume").is_none() {
        argv.extend(["--resume".into(), "auto".into()]);
    }
    argv.extend([
        "--world-size".into(),
        launch.world_size().to_string().into(),
    ]);
    if launch.nnodes > 1 {
        argv.extend([
            "--nnodes".into(),
            launch.nnodes.to_string().into(),
            "--node-rank".into(),
            launch.node_rank.to_string().into(),
        ]);
        // The nodes share node 0's listing of this job (its published manifest).
        if let (Some(job), None) = (&launch.rdzv_id, flag_value(user_flags, "--job-id")) {
            argv.extend(["--job-id".into(), job.into()]);
        }
    }
    argv
}

/// The value of `flag` in `flags` (`--flag V` or `--flag=V`), the last one.
fn flag_value(flags: &[OsString], flag: &str) -> Option<OsString> {
    let mut found = None;
    for (i, f) in flags.iter().enumerate() {
        let Some(f) = f.to_str() else { continue };
        if f == flag {
            found = flags.get(i + 1).cloned();
        } else if let Some(v) = f.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            found = Some(v.into());
        }
    }
    found
}

/// Refuses a serve flag that torchrun's flags decide.
fn check_serve_flags(flags: &[OsString], launch: &Launch) -> Result<(), String> {
    for f in flags.iter().filter_map(|f| f.to_str()) {
        let Some(flag) = DERIVED_FLAGS
            .iter()
            .find(|d| f == **d || f.strip_prefix(**d).is_some_and(|r| r.starts_with('=')))
        else {
            continue;
        };
        return Err(format!(
            "{flag} comes from torchrun's flags in ringfeed run (here --world-size {}, --nnodes {}, --node-rank {}): leave it out of the serve flags",
            launch.world_size(),
            launch.nnodes,
            launch.node_rank
        ));
    }
    Ok(())
}

/// A loader name unique to this run: the job's id (torchrun's --rdzv-id,
/// else SLURM_JOB_ID) if there is one, this process's id and a random part.
fn loader_name(launch: &Launch) -> String {
    use std::hash::{BuildHasher, Hasher};
    let job = launch
        .rdzv_id
        .clone()
        .or_else(|| std::env::var("SLURM_JOB_ID").ok())
        .unwrap_or_default();
    let job: String = job
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(NAME_JOB_BYTES)
        .collect();
    // RandomState is seeded from the OS's randomness: two runs started in
    // the same process-id slot still differ.
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish() as u32;
    let pid = std::process::id();
    if job.is_empty() {
        format!("run-{pid}-{random:08x}")
    } else {
        format!("run-{job}-{pid}-{random:08x}")
    }
}

/// Whether `program` can be started: as a path, or found on PATH. Returns
/// the exit status and message of a failure.
fn check_program(program: &OsString) -> Result<(), (u8, String)> {
    use std::os::unix::fs::PermissionsExt;
    let path = Path::new(program);
    let executable = |p: &Path| {
        p.is_file()
            && p.metadata()
                .is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
    };
    if path.components().count() > 1 {
        if !path.exists() {
            return Err((
                EXIT_NOT_FOUND,
                format!(
                    "{} does not exist: give the path of torchrun (or python)",
                    path.display()
                ),
            ));
        }
        if !executable(path) {
            return Err((
                EXIT_CANNOT_EXEC,
                format!("{} is not an executable file", path.display()),
            ));
        }
        return Ok(());
    }
    let dirs = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&dirs).any(|d| executable(&d.join(path))) {
        return Ok(());
    }
    Err((
        EXIT_NOT_FOUND,
        format!(
            "{} is not on PATH: install torch in this environment (pip install torch), activate it, or give its path",
            path.display()
        ),
    ))
}

/// Runs the loader and torchrun; returns the exit status: torchrun's, 128 +
/// the signal that stopped `run`, the loader's when it failed first, or
/// [`EXIT_USAGE`] / [`EXIT_NOT_FOUND`] / [`EXIT_CANNOT_EXEC`].
pub fn run(args: &RunArgs) -> Result<u8> {
    signals::unignore_stop_signals();
    signals::install();
    let Some((serve_flags, command)) = args.split() else {
        say_err!("ringfeed run: error: no -- before torchrun: write ringfeed run [serve flags] -- torchrun [torchrun flags] train.py [args]");
        return Ok(EXIT_USAGE);
    };
    let launch = match torchrun::parse(command, &|var| std::env::var(var).ok()) {
        Ok(launch) => launch,
        Err(e) => {
            say_err!("ringfeed run: error: {e}");
            return Ok(EXIT_USAGE);
        }
    };
    if let Err(e) = check_serve_flags(serve_flags, &launch) {
        say_err!("ringfeed run: error: {e}");
        return Ok(EXIT_USAGE);
    }
    if let Some(Err((code, e))) = command.first().map(check_program) {
        say_err!("ringfeed run: error: {e}");
        return Ok(code);
    }
    let name = match flag_value(serve_flags, "--name") {
        Some(name) => name.to_string_lossy().into_owned(),
        None => loader_name(&launch),
    };
    let mut loader = LoaderProc::start(serve_argv(serve_flags, &name, &launch), &name)?;
    let place = if launch.nnodes > 1 {
        format!(", machine {} of {}", launch.node_rank, launch.nnodes)
    } else {
        String::new()
    };
    say_err!(
        "ringfeed run: loader {name:?} for {} rank(s) ({} per machine{place}); torchrun starts once it is ready (`ringfeed stat {name}` shows it)",
        launch.world_size(),
        launch.nproc_per_node
    );
    match loader.wait_for_segment()? {
        Ready::Yes => {}
        Ready::Signal(sig) => {
            loader.signal(sig)?;
            loader.stop()?;
            say_err!("ringfeed run: stopped by signal {sig} before torchrun started; the loader is stopped");
            return Ok(128u8.saturating_add(u8::try_from(sig).unwrap_or(0)));
        }
        Ready::Exited(status) => {
            return Ok(loader.report_failure(status, " before torchrun started"))
        }
    }
    // On a terminal, the loader's progress as one live line here.
    let _display =
        crate::cli::progress::Display::start(&name, crate::cli::progress::Show::TerminalOnly);
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..]).env("RINGFEED_NAME", &name);
    let job = match spawn(&mut cmd) {
        Ok(job) => job,
        Err(e) => {
            loader.stop()?;
            say_err!(
                "ringfeed run: error: cannot start {} ({e}); the loader is stopped",
                command[0].to_string_lossy()
            );
            return Ok(EXIT_CANNOT_EXEC);
        }
    };
    supervise(job, loader, launch.max_restarts)
}

/// Waits for torchrun, forwarding signals and watching the loader, then
/// stops the loader and says how the run ended.
fn supervise(mut job: Child, mut loader: LoaderProc, max_restarts: u32) -> Result<u8> {
    let mut signalled: Option<i32> = None;
    // The loader failed while torchrun ran: torchrun was told to stop.
    let mut loader_failed_first: Option<ExitStatus> = None;
    let mut kill_at: Option<Instant> = None;
    let job_status = loop {
        let sig = signals::STOP.swap(0, Ordering::Relaxed) as i32;
        if sig != 0 {
            signalled.get_or_insert(sig);
            send(job.id(), sig);
            loader.signal(sig)?;
            kill_at.get_or_insert(Instant::now() + Duration::from_millis(TORCHRUN_STOP_TIMEOUT_MS));
        }
        if let Some(status) = job.try_wait().context("cannot wait for torchrun")? {
            break status;
        }
        if loader_failed_first.is_none() && signalled.is_none() {
            let exited = loader.exited()?;
            if let Some(status) = exited.filter(|s| loader.failed_on_its_own(*s)) {
                // With --max-restarts torchrun would restart ranks that
                // wait for a loader that is gone: stop it.
                say_err!(
                    "ringfeed run: the loader {:?} failed ({}); stopping torchrun",
                    loader.name,
                    status_words(status)
                );
                loader_failed_first = Some(status);
                send(job.id(), libc::SIGTERM);
                kill_at.get_or_insert(
                    Instant::now() + Duration::from_millis(TORCHRUN_STOP_TIMEOUT_MS),
                );
            }
        }
        if kill_at.is_some_and(|at| Instant::now() >= at) {
            say_err!(
                "ringfeed run: torchrun did not stop within {} s; killing its process group",
                TORCHRUN_STOP_TIMEOUT_MS / 1000
            );
            if let Ok(pgid) = libc::pid_t::try_from(job.id()) {
                // SAFETY: kill has no memory effects; torchrun leads its own group.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
            }
            kill_at = None;
        }
        std::thread::sleep(Duration::from_millis(POLL_MS));
    };
    let loader_status = finish_loader(&mut loader, job_status.success() && signalled.is_none())?;
    if let Some(sig) = signalled {
        let segment = if loader.segment_gone() {
            "its segment removed".to_owned()
        } else {
            "its segment left (run `ringfeed gc`)".to_owned()
        };
        say_err!(
            "ringfeed run: stopped by signal {sig}: torchrun ended with {}, the loader with {}, {segment}",
            status_words(job_status),
            status_words(loader_status)
        );
        return Ok(128u8.saturating_add(u8::try_from(sig).unwrap_or(0)));
    }
    if let Some(status) = loader_failed_first {
        return Ok(loader.report_failure(status, ", and torchrun was stopped"));
    }
    let job_code = exit_code(job_status);
    if loader.failed_on_its_own(loader_status) {
        let code = loader.report_failure(
            loader_status,
            &format!(
                " while torchrun ran (torchrun: {})",
                status_words(job_status)
            ),
        );
        return Ok(if job_code != 0 { job_code } else { code });
    }
    if job_code != 0 {
        let restarts = if max_restarts > 0 {
            format!(" (after up to {max_restarts} restart(s))")
        } else {
            String::new()
        };
        say_err!(
            "ringfeed run: torchrun ended with {}{restarts}; the loader {:?} is stopped",
            status_words(job_status),
            loader.name
        );
    }
    Ok(job_code)
}

/// Once torchrun has ended: lets the loader finish by itself if the job
/// succeeded (its trainers released the last batches), else stops it.
fn finish_loader(loader: &mut LoaderProc, job_succeeded: bool) -> Result<ExitStatus> {
    if job_succeeded {
        if let Some(status) = loader.wait_for(Duration::from_millis(LOADER_FINISH_GRACE_MS))? {
            loader.remove_segment();
            return Ok(status);
        }
        say_err!(
            "ringfeed run: torchrun succeeded but its ranks did not take every batch within {} s; stopping the loader {:?}",
            LOADER_FINISH_GRACE_MS / 1000,
            loader.name
        );
    }
    if let Some(status) = loader.exited()? {
        loader.remove_segment();
        return Ok(status);
    }
    loader.stop()
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    use super::*;
    use crate::ring::segment;

    fn words(line: &str) -> Vec<OsString> {
        line.split_whitespace().map(OsString::from).collect()
    }

    fn launch(nproc_per_node: u32, nnodes: u32, node_rank: u32) -> Launch {
        Launch {
            nproc_per_node,
            nnodes,
            node_rank,
            max_restarts: 0,
            rdzv_id: None,
        }
    }

    #[test]
    fn serve_gets_the_users_flags_then_the_name_and_the_ranks_of_the_readmes_several_machines() {
        let flags = words("--source /data --batch-size 32 --epochs 3");
        assert_eq!(
            serve_argv(&flags, "run-1", &launch(8, 1, 0)),
            words("serve --source /data --batch-size 32 --epochs 3 --name run-1 --resume auto --world-size 8")
        );
        assert_eq!(
            serve_argv(&flags, "run-1", &launch(8, 2, 1)),
            words("serve --source /data --batch-size 32 --epochs 3 --name run-1 --resume auto --world-size 16 --nnodes 2 --node-rank 1")
        );
        // A --name of the user's is theirs.
        let named = words("--name=job1 --source /data --batch-size 32");
        assert_eq!(flag_value(&named, "--name"), Some("job1".into()));
        assert_eq!(
            serve_argv(&named, "ignored", &launch(2, 1, 0)),
            words("serve --name=job1 --source /data --batch-size 32 --resume auto --world-size 2")
        );
        // Several machines share node 0's listing of the job torchrun names.
        let mut job = launch(8, 2, 0);
        job.rdzv_id = Some("job7".into());
        assert_eq!(
            serve_argv(&flags, "run-1", &job),
            words("serve --source /data --batch-size 32 --epochs 3 --name run-1 --resume auto --world-size 16 --nnodes 2 --node-rank 0 --job-id job7")
        );
        // So is a --resume: the trainers cannot move that loader.
        let resumed = words("--source /data --resume 2:64");
        assert_eq!(
            serve_argv(&resumed, "run-1", &launch(2, 1, 0)),
            words("serve --source /data --resume 2:64 --name run-1 --world-size 2")
        );
    }

    #[test]
    fn serve_flags_that_torchrun_decides_are_refused() {
        for flags in ["--world-size 4", "--nnodes=2", "--source /d --node-rank 1"] {
            let e = check_serve_flags(&words(flags), &launch(2, 1, 0))
                .err()
                .unwrap_or_default();
            assert!(
                e.contains("comes from torchrun's flags") && e.contains("--world-size 2"),
                "{flags}: {e}"
            );
        }
        assert!(check_serve_flags(&words("--source /d --world-sizes 4"), &launch(2, 1, 0)).is_ok());
    }

    #[test]
    fn a_generated_name_is_a_valid_loader_name_with_the_job_id_and_differs_each_time() {
        let mut l = launch(2, 1, 0);
        l.rdzv_id = Some("my job/7 with a very long id that goes on and on".into());
        let (a, b) = (loader_name(&l), loader_name(&l));
        assert_ne!(a, b);
        for name in [&a, &b] {
            assert!(segment::validate_name(name).is_ok(), "{name}");
            assert!(name.starts_with("run-my-job-7-with-a-very-"), "{name}");
        }
    }

    #[test]
    fn a_child_ended_by_a_signal_exits_as_a_shell_reports_it() {
        assert_eq!(exit_code(ExitStatus::from_raw(15)), 143);
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
    }
}
