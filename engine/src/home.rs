//! The home directory, settled once at start, before any credential chain
//! or cache path is built from it.
//!
//! Credentials are found under a home: aws-config's `~/.aws/config` and
//! `~/.aws/credentials` (and its SSO cache), object_store's GCS application
//! default credentials (`~/.config/gcloud/...`), the Azure CLI's
//! `~/.azure/azureProfile.json`; so is ringfeed's default cache directory.
//! With HOME unset (a systemd service, `env -i`, some schedulers) aws-config
//! leaves the `~` literal and reads `./~/.aws/config` from the working
//! directory: a root loader started in a directory another user can write
//! then ran that user's `credential_process` as root (issue 36). An empty or
//! relative HOME is the working directory again, for every one of them.
//!
//! So [`settle`], first thing in `main` (one thread, before tokio starts):
//! an absolute HOME is kept; otherwise HOME becomes the effective uid's home
//! from the password database (`getpwuid_r`), as a login shell would set it;
//! and when there is none, no home-based file is read at all (the AWS
//! profile files and the Azure CLI's directory are pointed at `/dev/null`,
//! HOME is left unset, so object_store looks for no GCS file) and a
//! warning says so. No path is ever built from a literal `~` or the working
//! directory. `XDG_*` directories count only when absolute (the XDG spec
//! says a relative one is invalid).

use std::ffi::{CStr, OsString};
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::sync::OnceLock;

/// Where the home directory came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Home {
    /// An absolute `HOME` in the environment, kept.
    FromEnv(PathBuf),
    /// `HOME` was unset, empty or relative: the effective uid's home from
    /// the password database, now in `HOME`.
    FromPasswd {
        /// The home.
        dir: PathBuf,
        /// What HOME was (None: unset).
        was: Option<OsString>,
    },
    /// No usable HOME and no password database entry: no home-based file
    /// is read.
    Unknown {
        /// Why, in words.
        why: String,
        /// The variables pointed at `/dev/null` (those that were not set).
        blanked: Vec<&'static str>,
    },
}

/// The variables pointed at `/dev/null` when there is no home (those not
/// set): AWS's two profile files, which aws-config would otherwise look for
/// under a literal `~`, and the Azure CLI's directory, which `az` (run for
/// its login) would look for under `~` the same way.
const HOME_FILE_VARS: [&str; 3] = [
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AZURE_CONFIG_DIR",
];

static SETTLED: OnceLock<Home> = OnceLock::new();

/// An absolute, non-empty path from `value`; None otherwise.
fn absolute(value: Option<OsString>) -> Option<PathBuf> {
    value.map(PathBuf::from).filter(|p| p.is_absolute())
}

/// Settles HOME for this process and its children (see the module docs);
/// idempotent. Call it while the process has one thread: it changes the
/// environment, which another thread may be reading.
pub fn settle() -> &'static Home {
    SETTLED.get_or_init(|| {
        let was = std::env::var_os("HOME");
        if let Some(home) = absolute(was.clone()) {
            return Home::FromEnv(home);
        }
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        match passwd_home(euid) {
            Ok(dir) => {
                // One thread (the caller's promise): nobody reads the
                // environment meanwhile.
                std::env::set_var("HOME", &dir);
                Home::FromPasswd { dir, was }
            }
            Err(why) => {
                std::env::remove_var("HOME");
                let mut blanked = Vec::new();
                for var in HOME_FILE_VARS {
                    if std::env::var_os(var).is_none_or(|v| v.is_empty()) {
                        std::env::set_var(var, "/dev/null");
                        blanked.push(var);
                    }
                }
                Home::Unknown { why, blanked }
            }
        }
    })
}

/// Says (once, at start) what [`settle`] did when it had to do anything.
pub fn announce(home: &Home) {
    match home {
        Home::FromEnv(_) => {}
        Home::FromPasswd { dir, was: None } => tracing::debug!(
            "HOME is not set: using {} from the password database",
            dir.display()
        ),
        Home::FromPasswd { dir, was: Some(was) } => tracing::warn!(
            "HOME={was:?} is not an absolute path (it would name a place in the working directory): using {} from the password database",
            dir.display()
        ),
        Home::Unknown { why, .. } => tracing::warn!(
            "no home directory: {why}; no credential file under a home is read (~/.aws, ~/.azure, ~/.config/gcloud) and there is no default cache directory: set HOME (or AWS_CONFIG_FILE, AZURE_CONFIG_DIR, GOOGLE_APPLICATION_CREDENTIALS, --cache-dir)"
        ),
    }
}

/// The home directory: as settled, or, in a process that did not settle it
/// (a library's tests), an absolute HOME. Never a relative path.
pub fn dir() -> Option<PathBuf> {
    match SETTLED.get() {
        Some(Home::FromEnv(d)) | Some(Home::FromPasswd { dir: d, .. }) => Some(d.clone()),
        Some(Home::Unknown { .. }) => None,
        None => absolute(std::env::var_os("HOME")),
    }
}

/// Whether [`settle`] pointed the variable `var` at `/dev/null` (no home).
pub fn blanked(var: &str) -> bool {
    matches!(SETTLED.get(), Some(Home::Unknown { blanked, .. }) if blanked.contains(&var))
}

/// `rel` under the home directory; None without one.
pub fn file(rel: &str) -> Option<PathBuf> {
    dir().map(|d| d.join(rel))
}

/// The directory an `XDG_*` variable names, if it is absolute (a relative
/// one is invalid by the XDG spec, and would be the working directory).
pub fn xdg(var: &str) -> Option<PathBuf> {
    absolute(std::env::var_os(var))
}

/// The home directory of `uid` in the password database (`getpwuid_r`): an
/// absolute path, or why there is none.
pub fn passwd_home(uid: u32) -> Result<PathBuf, String> {
    let mut len = 4096;
    loop {
        // SAFETY: passwd is plain old data; all-zero is a valid value.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut buf = vec![0 as libc::c_char; len];
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call; getpwuid_r writes
        // only into `pwd`, `buf` (of the length given) and `result`.
        let rc =
            unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut result) };
        if rc == libc::ERANGE && len < 1 << 20 {
            len *= 4;
            continue;
        }
        if rc != 0 {
            let e = std::io::Error::from_raw_os_error(rc);
            return Err(format!(
                "HOME is not set and the password database cannot be read for uid {uid} ({e})"
            ));
        }
        if result.is_null() || pwd.pw_dir.is_null() {
            return Err(format!(
                "HOME is not set and uid {uid} has no entry in the password database"
            ));
        }
        // SAFETY: on success pw_dir points at a NUL-terminated string in `buf`.
        let dir = unsafe { CStr::from_ptr(pwd.pw_dir) }.to_bytes().to_vec();
        let dir = PathBuf::from(OsString::from_vec(dir));
        if !dir.is_absolute() {
            return Err(format!(
                "HOME is not set and uid {uid}'s home in the password database is {:?}, not an absolute path",
                dir.display()
            ));
        }
        return Ok(dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_home_comes_from_the_password_database() {
        let want = std::fs::read_to_string("/etc/passwd").ok().and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("root:"))
                .and_then(|l| l.split(':').nth(5).map(PathBuf::from))
        });
        if let Some(want) = want {
            assert_eq!(passwd_home(0), Ok(want));
        }
        let none = passwd_home(3_999_999_999).unwrap_err();
        assert!(none.contains("no entry in the password database"), "{none}");
    }

    #[test]
    fn only_absolute_paths_count() {
        assert_eq!(absolute(Some("".into())), None);
        assert_eq!(absolute(Some("~".into())), None);
        assert_eq!(absolute(Some("rel/dir".into())), None);
        assert_eq!(absolute(None), None);
        assert_eq!(absolute(Some("/h".into())), Some(PathBuf::from("/h")));
    }
}
