//! `ringfeed pack --source SRC --dest DEST [--shard-size 256MiB]`.

use anyhow::Result;
use clap::Args;

use crate::pack::{pack, PackConfig, PackLabels};

/// Arguments of `ringfeed pack`.
#[derive(Args, Debug, Clone)]
pub struct PackArgs {
    /// The files to pack: a local directory or a remote prefix (as `serve
    /// --source` takes them).
    #[arg(long)]
    pub source: String,
    /// Where the shards go: a local directory (created) or a remote prefix.
    /// An interrupted pack into the same DEST goes on where it stopped.
    #[arg(long)]
    pub dest: String,
    /// Shard size: a shard ends before the first sample that would take it
    /// past this (e.g. 256MiB, 1GiB, 500MB; a sample is never split).
    #[arg(long, value_parser = parse_size, default_value = "256MiB")]
    pub shard_size: u64,
    /// A local source: also pack the files that links in it point to
    /// outside it. By default such a link is skipped with one warning: a
    /// link another user planted must not put a file only you may read
    /// into a shard.
    #[arg(long)]
    pub follow_links_outside: bool,
    /// Labels of an ImageFolder tree (root/CLASS/.../image): auto (when
    /// every file is under a class directory and every sample has an image),
    /// dirs, or none. Each sample then gets a .cls member (its class index,
    /// classes in byte order of their names) and every shard's index the
    /// class names, so that `serve --decode image` on the shards gives the
    /// tree's labels and class names.
    #[arg(long, value_enum, default_value_t = LabelsArg::Auto)]
    pub labels: LabelsArg,
}

/// `ringfeed pack --labels`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LabelsArg {
    /// Labels when the tree is an ImageFolder tree.
    Auto,
    /// The first directory of every file.
    Dirs,
    /// No label members.
    None,
}

/// A size such as `4096`, `64KiB`, `256MiB`, `1GiB`, `500MB`, `2G`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let number: u64 = number.parse().map_err(|_| {
        format!("{s:?} is not a size; write bytes or a number with KiB, MiB, GiB (or KB, MB, GB)")
    })?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "{s:?}: unknown unit {other:?}; use KiB, MiB, GiB, TiB (or KB, MB, GB, TB)"
            ))
        }
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("{s:?} is more bytes than 2^64"))
}

/// Runs `ringfeed pack`.
pub fn run(args: &PackArgs) -> Result<()> {
    let report = pack(&PackConfig {
        source: args.source.clone(),
        dest: args.dest.clone(),
        shard_size: args.shard_size,
        progress: true,
        follow_links_outside: args.follow_links_outside,
        labels: match args.labels {
            LabelsArg::Auto => PackLabels::Auto,
            LabelsArg::Dirs => PackLabels::Dirs,
            LabelsArg::None => PackLabels::None,
        },
    })?;
    crate::cli::say::say_err!(
        "ringfeed pack: {} shards in {} ({} written now, {} kept from an earlier run), {} files, {} bytes",
        report.shards,
        args.dest,
        report.written,
        report.kept,
        report.files,
        report.shard_bytes
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_and_decimal_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("500MB"), Ok(500_000_000));
        assert!(parse_size("12 parsecs")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_size("MiB").unwrap_err().contains("not a size"));
        assert!(parse_size("99999999999TiB").unwrap_err().contains("2^64"));
    }
}
