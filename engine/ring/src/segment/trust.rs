//! Whose segments (and outcome files) a process believes.
//!
//! Loader names are shared by every user of the machine: anyone can start a
//! loader named `job1` first, over data of their choosing. A trainer
//! therefore trusts a segment only if its owner is a user it trusts: itself
//! (its effective uid), root (a root-owned segment can only have been made by
//! root, who could do anything to this trainer anyway), or a uid named in
//! [`TRUST_UID_ENV`] (a loader run by another account on purpose: a service
//! user, or a trainer run as root beside a user's loader). A loader's outcome
//! file is judged by the same rule: it speaks for the loader of the name, so
//! it is believed only from the users whose loader would be.

use std::ffi::CStr;

/// Environment variable naming the other uids whose loaders a trainer
/// trusts: comma-separated numbers, e.g. `RINGFEED_TRUST_UID=1000,1001`.
pub const TRUST_UID_ENV: &str = "RINGFEED_TRUST_UID";

/// The uids named in [`TRUST_UID_ENV`]; entries that are not numbers are
/// ignored (they trust no one).
pub fn trusted_extra_uids() -> Vec<u32> {
    std::env::var(TRUST_UID_ENV)
        .map(|v| {
            v.split(',')
                .filter_map(|u| u.trim().parse::<u32>().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// True when a segment (or an outcome) owned by `uid` is believed: this
/// process's effective uid, root, or a uid of [`TRUST_UID_ENV`].
pub fn owner_trusted(uid: u32) -> bool {
    crate::safe_file::trusted_owner(uid) || trusted_extra_uids().contains(&uid)
}

/// The owner of the file open as `fd`.
pub fn owner_of(fd: &std::os::fd::OwnedFd) -> std::io::Result<u32> {
    Ok(super::fstat(fd)?.st_uid)
}

/// `uid 1000 (alice)`, or `uid 1000` when the name is unknown: for messages.
pub fn describe_uid(uid: u32) -> String {
    match user_name(uid) {
        Some(name) => format!("uid {uid} ({name})"),
        None => format!("uid {uid}"),
    }
}

/// The login name of `uid`, if the password database has one.
pub fn user_name(uid: u32) -> Option<String> {
    // SAFETY: passwd is plain old data; all-zero is a valid value.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 4096];
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; getpwuid_r writes only
    // into `pwd`, `buf` (of the length given) and `result`.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut result) };
    if rc != 0 || result.is_null() || pwd.pw_name.is_null() {
        return None;
    }
    // SAFETY: on success pw_name points at a NUL-terminated string in `buf`.
    let name = unsafe { CStr::from_ptr(pwd.pw_name) };
    Some(name.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_user_and_root_are_trusted_and_root_has_a_name() {
        assert!(owner_trusted(crate::safe_file::euid()));
        assert!(owner_trusted(0));
        assert_eq!(describe_uid(0), "uid 0 (root)");
        assert_eq!(describe_uid(4_000_000_000), "uid 4000000000");
    }
}
