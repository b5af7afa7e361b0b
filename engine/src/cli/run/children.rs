//! The two processes `ringfeed run` starts, the loader and torchrun: each
//! in a process group of its own, so that a terminal's Ctrl-C reaches them
//! once, through `run`, and sent SIGTERM if `run` dies (PR_SET_PDEATHSIG).
//! The loader's stderr is passed on line by line, its last lines kept to be
//! repeated when it fails.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ChildStderr, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::cli::say::say_err;
use crate::loader::signals;
use crate::ring::observer::Observer;
use crate::ring::outcome::Outcome;
use crate::ring::segment;

/// How often the children and the signal flag are looked at.
pub(super) const POLL_MS: u64 = 20;
/// How long a stopped loader has to exit (it waits up to 5 s for reads
/// under way) before it is killed.
const LOADER_STOP_TIMEOUT_MS: u64 = 10_000;
/// Lines of the loader's stderr kept, to repeat when it fails.
const LOADER_TAIL_LINES: usize = 20;
/// Of those, how many are repeated at the end.
const LOADER_LINES_SHOWN: usize = 6;

/// A child's exit as a shell reports it: its code, or 128 + the signal that
/// ended it.
pub(super) fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(sig)) => 128u8.saturating_add(u8::try_from(sig).unwrap_or(0)),
        (None, None) => 1,
    }
}

/// "exit 1", or "killed by signal 9".
pub(super) fn status_words(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        (None, None) => "an unknown status".to_owned(),
    }
}

/// Sends `sig` to process `pid`; one already gone is not an error.
pub(super) fn send(pid: u32, sig: i32) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill has no memory effects; a pid that is gone gives ESRCH.
        unsafe { libc::kill(pid, sig) };
    }
}

/// Starts `cmd` in a process group of its own, to be sent SIGTERM when this
/// process dies.
pub(super) fn spawn(cmd: &mut Command) -> std::io::Result<Child> {
    let parent = libc::pid_t::try_from(std::process::id()).unwrap_or(0);
    cmd.process_group(0);
    // SAFETY: runs in the child between fork and exec, and calls only prctl
    // and getppid, which are async-signal-safe; it touches no memory of ours.
    unsafe {
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            // This process died before prctl: nothing would ever stop the child.
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// The loader: its process, and the last lines of its stderr, which is
/// passed on line by line as it comes.
pub(super) struct LoaderProc {
    pub(super) name: String,
    child: Child,
    tail: Arc<Mutex<VecDeque<String>>>,
    drained: Arc<AtomicBool>,
    /// This process has sent it a signal: its exit is not a failure.
    pub(super) stopped: bool,
    status: Option<ExitStatus>,
    /// Its outcome file, held once it exited (`Outcome::hold`): `ringfeed
    /// gc` leaves it while the trainers run; removed when this is dropped.
    outcome: Option<std::fs::File>,
}

impl LoaderProc {
    pub(super) fn start(argv: Vec<OsString>, name: &str) -> Result<LoaderProc> {
        let exe = std::env::current_exe()
            .context("cannot find the ringfeed binary to start its loader")?;
        let mut child = spawn(
            Command::new(&exe)
                .args(argv)
                .stdin(Stdio::null())
                .stderr(Stdio::piped()),
        )
        .with_context(|| format!("cannot start the loader ({} serve)", exe.display()))?;
        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(LOADER_TAIL_LINES)));
        let drained = Arc::new(AtomicBool::new(false));
        if let Some(stderr) = child.stderr.take() {
            let (tail, drained) = (Arc::clone(&tail), Arc::clone(&drained));
            std::thread::spawn(move || pass_on(stderr, &tail, &drained));
        }
        Ok(LoaderProc {
            name: name.to_owned(),
            child,
            tail,
            drained,
            stopped: false,
            status: None,
            outcome: None,
        })
    }

    /// Its exit status, once it has exited.
    pub(super) fn exited(&mut self) -> Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = self
                .child
                .try_wait()
                .context("cannot wait for the loader")?;
            if self.status.is_some() {
                self.outcome = Outcome::hold(&self.name);
            }
        }
        Ok(self.status)
    }

    /// Whether `status`, its exit, is a failure of its own: an error (it
    /// exits 1, or 2 for a bad flag, even when a signal came during its
    /// error's exit), or an end no signal of this process asked for.
    pub(super) fn failed_on_its_own(&self, status: ExitStatus) -> bool {
        match status.code() {
            Some(0) => false,
            // A signal makes `serve` exit 128 + its number.
            Some(code) if self.stopped => code < 128,
            Some(_) => true,
            None => !self.stopped,
        }
    }

    /// Whether its segment is gone.
    pub(super) fn segment_gone(&self) -> bool {
        !segment::shm_path(&self.name).exists()
    }

    /// Sends it `sig`, if it still runs.
    pub(super) fn signal(&mut self, sig: i32) -> Result<()> {
        if self.exited()?.is_none() {
            self.stopped = true;
            send(self.child.id(), sig);
        }
        Ok(())
    }

    /// Waits up to `timeout` for it to exit.
    pub(super) fn wait_for(&mut self, timeout: Duration) -> Result<Option<ExitStatus>> {
        let deadline = Instant::now() + timeout;
        while self.exited()?.is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(POLL_MS));
        }
        self.exited()
    }

    /// Stops it: SIGTERM, then SIGKILL if it does not exit in time; then
    /// removes its segment if it left one (killed, it cannot).
    pub(super) fn stop(&mut self) -> Result<ExitStatus> {
        // One that was sent a signal already is on its way out.
        if !self.stopped {
            self.signal(libc::SIGTERM)?;
        }
        let status = match self.wait_for(Duration::from_millis(LOADER_STOP_TIMEOUT_MS))? {
            Some(status) => status,
            None => {
                say_err!(
                    "ringfeed run: the loader {:?} did not stop within {} s of SIGTERM; killing it",
                    self.name,
                    LOADER_STOP_TIMEOUT_MS / 1000
                );
                let _ = self.child.kill();
                let status = self.child.wait().context("cannot wait for the loader")?;
                self.status = Some(status);
                status
            }
        };
        self.remove_segment();
        Ok(status)
    }

    /// Removes the outcome file this loader left, if it is still there and
    /// is this loader's (never another's of the same name), once it exited:
    /// `ringfeed run`'s trainers have read it, or are gone.
    fn remove_outcome(&mut self) {
        if !matches!(self.exited(), Ok(Some(_))) {
            return;
        }
        self.outcome = None;
        if Outcome::read(&self.name).is_some_and(|o| o.pid == self.child.id()) {
            Outcome::remove(&self.name);
        }
    }

    /// Removes the loader's segment if it is still there and is this
    /// loader's (never another's of the same name), once it has exited.
    pub(super) fn remove_segment(&self) {
        let Ok(obs) = Observer::open(&self.name) else {
            return;
        };
        if obs.snapshot().loader_pid != self.child.id() {
            return;
        }
        if let Err(e) = segment::shm_unlink(&self.name) {
            say_err!(
                "ringfeed run: cannot remove {} ({e}): run `ringfeed gc`",
                segment::shm_path(&self.name).display()
            );
        }
    }

    /// Waits until its segment exists (trainers can attach), it exits, or
    /// a signal comes.
    pub(super) fn wait_for_segment(&mut self) -> Result<Ready> {
        let path = segment::shm_path(&self.name);
        loop {
            if let Some(status) = self.exited()? {
                return Ok(Ready::Exited(status));
            }
            let sig = signals::STOP.swap(0, Ordering::Relaxed) as i32;
            if sig != 0 {
                return Ok(Ready::Signal(sig));
            }
            if path.exists() {
                return Ok(Ready::Yes);
            }
            std::thread::sleep(Duration::from_millis(POLL_MS));
        }
    }

    /// Says that it failed, repeating the last lines of its stderr, and
    /// returns its exit status.
    pub(super) fn report_failure(&self, status: ExitStatus, what: &str) -> u8 {
        // Its stderr closes when it exits; let the last lines arrive.
        let deadline = Instant::now() + Duration::from_secs(1);
        while !self.drained.load(Ordering::Acquire) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(POLL_MS));
        }
        let lines: Vec<String> = match self.tail.lock() {
            Ok(tail) => tail
                .iter()
                .rev()
                .take(LOADER_LINES_SHOWN)
                .rev()
                .cloned()
                .collect(),
            Err(_) => Vec::new(),
        };
        say_err!(
            "ringfeed run: the loader {:?} failed ({}){what}. Its last lines:",
            self.name,
            status_words(status)
        );
        for line in &lines {
            say_err!("    {line}");
        }
        exit_code(status)
    }
}

/// How the wait for the loader's segment ended.
pub(super) enum Ready {
    /// The segment exists.
    Yes,
    /// This process received the signal.
    Signal(i32),
    /// The loader exited first.
    Exited(ExitStatus),
}

impl Drop for LoaderProc {
    /// `ringfeed run` ends: its torchrun has ended, so no trainer of its
    /// loader is left to read the loader's outcome (issue 39).
    fn drop(&mut self) {
        self.remove_outcome();
    }
}

/// Passes the loader's stderr on to ours, line by line, keeping the last
/// lines in `tail`; sets `drained` at its end.
fn pass_on(stderr: ChildStderr, tail: &Mutex<VecDeque<String>>, drained: &AtomicBool) {
    let mut reader = BufReader::new(stderr);
    let mut line = Vec::new();
    while matches!(reader.read_until(b'\n', &mut line), Ok(n) if n > 0) {
        let text = String::from_utf8_lossy(&line).trim_end().to_owned();
        say_err!("{text}");
        if let Ok(mut tail) = tail.lock() {
            if tail.len() == LOADER_TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(text);
        }
        line.clear();
    }
    // SYNC POINT: pairs with report_failure's Acquire: the tail holds every line.
    drained.store(true, Ordering::Release);
}
