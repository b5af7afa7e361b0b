//! Lines for a person, written so that a closed stream never stops a
//! command: `println!`/`eprintln!` panic on EPIPE, and a loader whose
//! stderr is piped into `head` or `grep -m1` must keep serving its trainers.

use std::fmt;
use std::io::{self, Write};

/// Writes one line to stderr; a failure (a closed pipe) is ignored. A
/// source URL's secrets never show ([`crate::remote::scrub`]).
pub fn err(args: fmt::Arguments<'_>) {
    let line = args.to_string();
    let _ = writeln!(io::stderr().lock(), "{}", crate::remote::scrub(&line));
}

/// Writes one line to stdout; a failure (a closed pipe) is ignored. A
/// URL's secrets never show ([`crate::remote::scrub`]).
pub fn out(args: fmt::Arguments<'_>) {
    let line = args.to_string();
    let _ = writeln!(io::stdout().lock(), "{}", crate::remote::scrub(&line));
}

/// `eprintln!` that ignores a closed stderr.
macro_rules! say_err {
    ($($t:tt)*) => { $crate::say::err(format_args!($($t)*)) };
}
pub(crate) use say_err;

/// `println!` that ignores a closed stdout.
macro_rules! say_out {
    ($($t:tt)*) => { $crate::say::out(format_args!($($t)*)) };
}
pub(crate) use say_out;

/// The log's stderr: what cannot be written is dropped, never a panic; a
/// source URL's secrets never show ([`crate::remote::scrub`]).
pub struct QuietStderr;

impl Write for QuietStderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match std::str::from_utf8(buf) {
            Ok(text) => {
                let _ = io::stderr().write_all(crate::remote::scrub(text).as_bytes());
            }
            Err(_) => {
                let _ = io::stderr().write_all(buf);
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = io::stderr().flush();
        Ok(())
    }
}
