//! What `ringfeed run` reads from torchrun's command line: how many ranks
//! each machine starts, on how many machines, and which machine this is.
//!
//! torchrun's options come first, then the training script and its own
//! arguments, which are never read. An option left out falls back, as in
//! torchrun itself, to its `PET_` environment variable
//! (`PET_NPROC_PER_NODE`, `PET_NNODES`, `PET_NODE_RANK`, ...), then to
//! torchrun's default.

use std::ffi::OsString;
use std::path::Path;

/// One of torchrun's options: its spellings, its `PET_` name, and whether
/// it takes a value.
struct Opt {
    /// Every spelling, long ones with both `-` and `_`.
    names: &'static [&'static str],
    /// argparse's `dest`, upper-cased: `PET_{dest}` is its environment name.
    dest: &'static str,
    /// A switch (argparse `nargs=0`) takes no value.
    switch: bool,
}

const fn opt(names: &'static [&'static str], dest: &'static str, switch: bool) -> Opt {
    Opt {
        names,
        dest,
        switch,
    }
}

/// torchrun's options (torch 2.x, `torch/distributed/run.py`), so that the
/// value of one is never taken for the training script.
const OPTIONS: &[Opt] = &[
    opt(&["--nnodes"], "NNODES", false),
    opt(
        &["--nproc-per-node", "--nproc_per_node"],
        "NPROC_PER_NODE",
        false,
    ),
    opt(&["--rdzv-backend", "--rdzv_backend"], "RDZV_BACKEND", false),
    opt(
        &["--rdzv-endpoint", "--rdzv_endpoint"],
        "RDZV_ENDPOINT",
        false,
    ),
    opt(&["--rdzv-id", "--rdzv_id"], "RDZV_ID", false),
    opt(&["--rdzv-conf", "--rdzv_conf"], "RDZV_CONF", false),
    opt(&["--standalone"], "STANDALONE", true),
    opt(&["--max-restarts", "--max_restarts"], "MAX_RESTARTS", false),
    opt(
        &["--monitor-interval", "--monitor_interval"],
        "MONITOR_INTERVAL",
        false,
    ),
    opt(&["--start-method", "--start_method"], "START_METHOD", false),
    opt(
        &["--event-log-handler", "--event_log_handler"],
        "EVENT_LOG_HANDLER",
        false,
    ),
    opt(&["--role"], "ROLE", false),
    opt(&["-m", "--module"], "MODULE", true),
    opt(&["--no-python", "--no_python"], "NO_PYTHON", true),
    opt(&["--run-path", "--run_path"], "RUN_PATH", true),
    opt(&["--log-dir", "--log_dir"], "LOG_DIR", false),
    opt(&["-r", "--redirects"], "REDIRECTS", false),
    opt(&["-t", "--tee"], "TEE", false),
    opt(
        &["--log-line-prefix-template", "--log_line_prefix_template"],
        "LOG_LINE_PREFIX_TEMPLATE",
        false,
    ),
    opt(
        &["--local-ranks-filter", "--local_ranks_filter"],
        "LOCAL_RANKS_FILTER",
        false,
    ),
    opt(
        &["--duplicate-stdout-filters", "--duplicate_stdout_filters"],
        "DUPLICATE_STDOUT_FILTERS",
        false,
    ),
    opt(
        &["--duplicate-stderr-filters", "--duplicate_stderr_filters"],
        "DUPLICATE_STDERR_FILTERS",
        false,
    ),
    opt(&["--node-rank", "--node_rank"], "NODE_RANK", false),
    opt(&["--master-addr", "--master_addr"], "MASTER_ADDR", false),
    opt(&["--master-port", "--master_port"], "MASTER_PORT", false),
    opt(&["--local-addr", "--local_addr"], "LOCAL_ADDR", false),
    opt(&["--logs-specs", "--logs_specs"], "LOGS_SPECS", false),
    opt(&["--numa-binding", "--numa_binding"], "NUMA_BINDING", false),
    opt(
        &["--signals-to-handle", "--signals_to_handle"],
        "SIGNALS_TO_HANDLE",
        false,
    ),
    opt(
        &["--shutdown-timeout", "--shutdown_timeout"],
        "SHUTDOWN_TIMEOUT",
        false,
    ),
    opt(
        &["--virtual-local-rank", "--virtual_local_rank"],
        "VIRTUAL_LOCAL_RANK",
        true,
    ),
    opt(
        &["--print-completion", "--print_completion"],
        "PRINT_COMPLETION",
        false,
    ),
    opt(&["-h", "--help"], "HELP", true),
];

/// The python module that is torchrun.
const TORCHRUN_MODULE: &str = "torch.distributed.run";

/// The job as torchrun will start it, from this machine's point of view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// Ranks on each machine (`--nproc-per-node`).
    pub nproc_per_node: u32,
    /// Machines (`--nnodes`; 1 with `--standalone`).
    pub nnodes: u32,
    /// This machine's place, 0 to nnodes - 1 (`--node-rank`).
    pub node_rank: u32,
    /// Restarts of the whole group of ranks torchrun may make (`--max-restarts`).
    pub max_restarts: u32,
    /// torchrun's `--rdzv-id`, when one was given: part of the loader's name.
    pub rdzv_id: Option<String>,
}

impl Launch {
    /// Ranks of the whole job, every machine together.
    pub fn world_size(&self) -> u32 {
        self.nproc_per_node.saturating_mul(self.nnodes)
    }
}

/// Why torchrun's command line cannot say how to start the loader.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LaunchError {
    /// Nothing after `--`.
    #[error("no command after --: write ringfeed run [serve flags] -- torchrun [torchrun flags] train.py [args]")]
    NoCommand,
    /// The command is not torchrun.
    #[error("{program:?} after -- is not torchrun: ringfeed run reads the ranks from torchrun's flags; write -- torchrun ... or -- python -m torch.distributed.run ...")]
    NotTorchrun {
        /// The program given.
        program: String,
    },
    /// An option ringfeed run does not know, so it cannot tell whether the
    /// next word is its value or the training script.
    #[error("torchrun option {option} is unknown to ringfeed run, which cannot tell if the next word is its value: write {option}=VALUE, or set it in torchrun's environment (PET_...)")]
    UnknownOption {
        /// The option as written.
        option: String,
    },
    /// An option that is the start of several.
    #[error(
        "torchrun option {option} is ambiguous (it could be {candidates}): write it out in full"
    )]
    Ambiguous {
        /// The option as written.
        option: String,
        /// The options it could be.
        candidates: String,
    },
    /// An option that needs a value, last on the line.
    #[error("torchrun option {option} needs a value, and the command ends there: add it, then the training script")]
    MissingValue {
        /// The option as written.
        option: String,
    },
    /// A switch given a value.
    #[error("torchrun option {option} takes no value: write {option} alone")]
    SwitchWithValue {
        /// The option as written.
        option: String,
    },
    /// No training script.
    #[error("the torchrun command has no training script: add it after torchrun's flags (e.g. torchrun --nproc-per-node 8 train.py)")]
    NoScript,
    /// torchrun's help: it starts no job.
    #[error("torchrun --help starts no job: run `torchrun --help` by itself")]
    Help,
    /// A value that is not what the option takes.
    #[error("torchrun {option} {value:?} (from {from}): {want}")]
    BadValue {
        /// The option's long name.
        option: &'static str,
        /// Its value.
        value: String,
        /// The command line, or the `PET_` variable it came from.
        from: String,
        /// What it should be.
        want: String,
    },
    /// `--nnodes MIN:MAX` with MIN < MAX: torchrun may change the world size.
    #[error("torchrun --nnodes {value} lets the number of machines change during the job, but each loader serves a fixed share of a fixed world size: give one number (--nnodes {max})")]
    Elastic {
        /// The `--nnodes` value.
        value: String,
        /// Its upper bound.
        max: u32,
    },
    /// Several machines with a rendezvous that numbers them itself.
    #[error("torchrun --rdzv-backend {backend} with --nnodes {nnodes} numbers the machines itself, after the loader must start: use static rendezvous (--master-addr HOST --master-port PORT --node-rank N)")]
    DynamicNodeRank {
        /// The rendezvous backend.
        backend: String,
        /// The number of machines.
        nnodes: u32,
    },
    /// `--nproc-per-node auto|gpu|xpu`: counted by torch, on devices
    /// ringfeed does not query.
    #[error("torchrun --nproc-per-node {value}: ringfeed run sizes the loader before torch counts the devices; give the number of processes per machine (e.g. --nproc-per-node 8)")]
    CountedByTorch {
        /// The value.
        value: String,
    },
}

/// torchrun's own arguments, from a command line that runs torchrun
/// (`torchrun ARGS`, `/path/torchrun ARGS`, `python -m torch.distributed.run ARGS`).
fn torchrun_args(command: &[OsString]) -> Result<&[OsString], LaunchError> {
    let (program, rest) = command.split_first().ok_or(LaunchError::NoCommand)?;
    let base = Path::new(program)
        .file_name()
        .map(|b| b.to_string_lossy().into_owned())
        .unwrap_or_default();
    if base == "torchrun" {
        return Ok(rest);
    }
    let is_python = base
        .strip_prefix("python")
        .is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'));
    if is_python {
        // python's own switches may come before -m (python -u -m ...).
        for (i, arg) in rest.iter().enumerate() {
            let arg = arg.to_string_lossy();
            if arg == "-m" {
                if rest.get(i + 1).is_some_and(|m| m == TORCHRUN_MODULE) {
                    return Ok(&rest[i + 2..]);
                }
                break;
            }
            if arg.strip_prefix("-m") == Some(TORCHRUN_MODULE) {
                return Ok(&rest[i + 1..]);
            }
            if !arg.starts_with('-') || arg == "-c" {
                break;
            }
        }
    }
    Err(LaunchError::NotTorchrun {
        program: program.to_string_lossy().into_owned(),
    })
}

/// The option `word` names: an exact spelling, else (as argparse allows) the
/// one long option it is the start of.
fn lookup(word: &str) -> Result<&'static Opt, LaunchError> {
    if let Some(o) = OPTIONS.iter().find(|o| o.names.contains(&word)) {
        return Ok(o);
    }
    let mut found: Vec<&'static Opt> = Vec::new();
    if word.starts_with("--") {
        for o in OPTIONS {
            let matches = o.names.iter().any(|n| n.starts_with(word));
            if matches && !found.iter().any(|f| f.dest == o.dest) {
                found.push(o);
            }
        }
    }
    match found.as_slice() {
        [one] => Ok(one),
        [] => Err(LaunchError::UnknownOption {
            option: word.to_owned(),
        }),
        many => Err(LaunchError::Ambiguous {
            option: word.to_owned(),
            candidates: many
                .iter()
                .filter_map(|o| o.names.iter().find(|n| n.starts_with("--")))
                .copied()
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// The options given on the command line, by `dest`, up to the training
/// script (last value wins, as in argparse).
fn given(args: &[OsString]) -> Result<Vec<(&'static str, String)>, LaunchError> {
    let mut out: Vec<(&'static str, String)> = Vec::new();
    let mut i = 0;
    loop {
        let Some(arg) = args.get(i) else {
            return Err(LaunchError::NoScript);
        };
        // An option is ASCII; anything else is the script.
        let Some(word) = arg.to_str() else {
            return Ok(out);
        };
        if word == "--" {
            return if args.len() > i + 1 {
                Ok(out)
            } else {
                Err(LaunchError::NoScript)
            };
        }
        if !word.starts_with('-') || word == "-" {
            return Ok(out);
        }
        // --opt=VALUE, and a short option's value attached (-r3).
        let (name, inline) = match word.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_owned())),
            _ if !word.starts_with("--") && word.len() > 2 => {
                (&word[..2], Some(word[2..].to_owned()))
            }
            _ => (word, None),
        };
        let o = match lookup(name) {
            Err(LaunchError::UnknownOption { .. })
                if inline.is_some() && name.starts_with("--") =>
            {
                // An option ringfeed run does not know, with its value
                // attached: nothing to tell apart from the script.
                i += 1;
                continue;
            }
            found => found?,
        };
        if o.dest == "HELP" {
            return Err(LaunchError::Help);
        }
        let value = if o.switch {
            if inline.is_some() {
                return Err(LaunchError::SwitchWithValue {
                    option: name.to_owned(),
                });
            }
            "1".to_owned()
        } else if let Some(v) = inline {
            v
        } else {
            i += 1;
            args.get(i)
                .map(|v| v.to_string_lossy().into_owned())
                .ok_or_else(|| LaunchError::MissingValue {
                    option: name.to_owned(),
                })?
        };
        out.retain(|(d, _)| *d != o.dest);
        out.push((o.dest, value));
        i += 1;
    }
}

/// Reads the job's shape from a command line running torchrun; `env` looks
/// up an environment variable (torchrun's `PET_` fallbacks).
pub fn parse(
    command: &[OsString],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Launch, LaunchError> {
    let given = given(torchrun_args(command)?)?;
    // The command line, else PET_{dest}, else torchrun's default.
    let value = |dest: &'static str, default: &str| -> (String, String) {
        if let Some((_, v)) = given.iter().find(|(d, _)| *d == dest) {
            return (v.clone(), "the command line".to_owned());
        }
        let var = format!("PET_{dest}");
        match env(&var) {
            Some(v) if !v.is_empty() => (v, var),
            _ => (default.to_owned(), "torchrun's default".to_owned()),
        }
    };
    let number = |option: &'static str,
                  dest: &'static str,
                  default: &str,
                  min: u32|
     -> Result<u32, LaunchError> {
        let (v, from) = value(dest, default);
        v.trim()
            .parse::<u32>()
            .ok()
            .filter(|n| *n >= min)
            .ok_or(LaunchError::BadValue {
                option,
                value: v,
                from,
                want: format!("expected a whole number from {min}"),
            })
    };
    let (standalone, from) = value("STANDALONE", "0");
    let standalone = match standalone.trim().parse::<i64>() {
        Ok(n) => n != 0,
        Err(_) => {
            return Err(LaunchError::BadValue {
                option: "--standalone",
                value: standalone,
                from,
                want: "expected 0 or 1".to_owned(),
            })
        }
    };
    let nproc_per_node = nproc(value("NPROC_PER_NODE", "1"))?;
    let max_restarts = number("--max-restarts", "MAX_RESTARTS", "0", 0)?;
    let (rdzv_id, _) = value("RDZV_ID", "none");
    let rdzv_id = (rdzv_id != "none" && !rdzv_id.is_empty()).then_some(rdzv_id);
    if standalone {
        // torchrun --standalone is one machine, whatever --nnodes says.
        return Ok(Launch {
            nproc_per_node,
            nnodes: 1,
            node_rank: 0,
            max_restarts,
            rdzv_id,
        });
    }
    let nnodes = nnodes(value("NNODES", "1:1"))?;
    let node_rank = number("--node-rank", "NODE_RANK", "0", 0)?;
    let (backend, _) = value("RDZV_BACKEND", "static");
    if nnodes > 1 && backend != "static" {
        return Err(LaunchError::DynamicNodeRank { backend, nnodes });
    }
    if node_rank >= nnodes {
        return Err(LaunchError::BadValue {
            option: "--node-rank",
            value: node_rank.to_string(),
            from: "torchrun's flags".to_owned(),
            want: format!(
                "machines are numbered 0 to {} (--nnodes {nnodes})",
                nnodes - 1
            ),
        });
    }
    Ok(Launch {
        nproc_per_node,
        nnodes: if nnodes > 1 { nnodes } else { 1 },
        node_rank: if nnodes > 1 { node_rank } else { 0 },
        max_restarts,
        rdzv_id,
    })
}

/// `--nproc-per-node`: a number, or `cpu` (torch's `os.cpu_count()`).
fn nproc((v, from): (String, String)) -> Result<u32, LaunchError> {
    match v.trim() {
        "auto" | "gpu" | "xpu" => Err(LaunchError::CountedByTorch { value: v }),
        "cpu" => {
            // SAFETY: sysconf reads a system setting and has no preconditions.
            let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
            Ok(u32::try_from(n).unwrap_or(1).max(1))
        }
        n => n
            .parse::<u32>()
            .ok()
            .filter(|n| *n >= 1)
            .ok_or(LaunchError::BadValue {
                option: "--nproc-per-node",
                value: v.clone(),
                from,
                want: "expected a whole number from 1 (or cpu)".to_owned(),
            }),
    }
}

/// `--nnodes N` or `MIN:MAX`; a range is refused unless MIN = MAX.
fn nnodes((v, from): (String, String)) -> Result<u32, LaunchError> {
    let bad = || LaunchError::BadValue {
        option: "--nnodes",
        value: v.clone(),
        from: from.clone(),
        want: "expected a whole number from 1, or MIN:MAX".to_owned(),
    };
    let one = |s: &str| s.trim().parse::<u32>().ok().filter(|n| *n >= 1);
    match v.split_once(':') {
        None => one(&v).ok_or_else(bad),
        Some((lo, hi)) => {
            let (lo, hi) = (one(lo).ok_or_else(bad)?, one(hi).ok_or_else(bad)?);
            if lo != hi {
                return Err(LaunchError::Elastic {
                    value: v.clone(),
                    max: hi,
                });
            }
            Ok(lo)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<OsString> {
        line.split_whitespace().map(OsString::from).collect()
    }

    fn parse_with(line: &str, env: &[(&str, &str)]) -> Result<Launch, LaunchError> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        parse(&words(line), &|var| {
            env.iter().find(|(k, _)| k == var).map(|(_, v)| v.clone())
        })
    }

    fn shape(line: &str) -> (u32, u32, u32, u32) {
        let l = parse_with(line, &[]).unwrap_or_else(|e| panic!("{line}: {e}"));
        (l.nproc_per_node, l.nnodes, l.node_rank, l.max_restarts)
    }

    #[test]
    fn every_spelling_of_torchruns_flags_gives_the_same_shape() {
        for line in [
            "torchrun --nproc-per-node 8 --nnodes 2 --node-rank 1 --master-addr h train.py",
            "torchrun --nproc_per_node=8 --nnodes=2 --node_rank=1 --master_addr=h train.py",
            "/opt/venv/bin/torchrun --nnodes 2:2 --node-rank=1 --nproc-per-node=8 train.py --lr 1",
            "python -m torch.distributed.run --nproc_per_node 8 --nnodes 2 --node_rank 1 train.py",
            "python3.11 -u -m torch.distributed.run --nproc-per-node 8 --nnodes 2 --node-rank 1 train.py",
            "torchrun --nproc 8 --nnodes 2 --node-r 1 train.py",
        ] {
            assert_eq!(shape(line), (8, 2, 1, 0), "{line}");
        }
    }

    #[test]
    fn the_training_scripts_own_arguments_are_never_read() {
        assert_eq!(
            shape(
                "torchrun --nproc-per-node 2 train.py --nnodes 5 --node-rank 3 --nproc-per-node 9"
            ),
            (2, 1, 0, 0)
        );
        // A value that looks like a script is the option's value.
        assert_eq!(
            shape("torchrun --log-dir train.py --nproc-per-node 3 x.py"),
            (3, 1, 0, 0)
        );
        assert_eq!(
            shape("torchrun -r 3 -t3 --nproc-per-node 3 -- x.py"),
            (3, 1, 0, 0)
        );
        assert_eq!(
            shape("torchrun --unknown=1 --nproc-per-node 3 x.py"),
            (3, 1, 0, 0)
        );
    }

    #[test]
    fn standalone_is_one_machine_and_max_restarts_is_read() {
        assert_eq!(
            shape("torchrun --standalone --nnodes 4 --nproc-per-node 2 --max-restarts 3 t.py"),
            (2, 1, 0, 3)
        );
        assert_eq!(shape("torchrun --max_restarts=1 t.py"), (1, 1, 0, 1));
    }

    #[test]
    fn a_flag_left_out_comes_from_torchruns_environment() {
        let l = parse_with(
            "torchrun --master-addr h train.py",
            &[
                ("PET_NPROC_PER_NODE", "4"),
                ("PET_NNODES", "3"),
                ("PET_NODE_RANK", "2"),
                ("PET_MAX_RESTARTS", "2"),
            ],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (
                l.nproc_per_node,
                l.nnodes,
                l.node_rank,
                l.max_restarts,
                l.world_size()
            ),
            (4, 3, 2, 2, 12)
        );
        // The command line wins over the environment.
        let l = parse_with(
            "torchrun --nproc-per-node 2 t.py",
            &[("PET_NPROC_PER_NODE", "4")],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(l.nproc_per_node, 2);
        let l = parse_with(
            "torchrun --nnodes 2 --nproc-per-node 2 t.py",
            &[("PET_STANDALONE", "1")],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(l.nnodes, 1);
    }

    #[test]
    fn the_rdzv_id_is_kept_for_the_loaders_name() {
        let l = parse_with("torchrun --rdzv-id job7 --rdzv-backend static t.py", &[])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(l.rdzv_id.as_deref(), Some("job7"));
        let l = parse_with("torchrun t.py", &[]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(l.rdzv_id, None);
    }

    #[test]
    fn command_lines_that_cannot_size_the_loader_are_refused_with_the_fix() {
        let refused = |line: &str| {
            parse_with(line, &[])
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(refused("srun python train.py").contains("is not torchrun"));
        assert!(refused("python -m torch.distributed.launch t.py").contains("is not torchrun"));
        assert!(refused("python train.py").contains("is not torchrun"));
        assert!(refused("torchrun --nproc-per-node auto t.py")
            .contains("give the number of processes per machine"));
        assert!(refused("torchrun --nproc-per-node gpu t.py").contains("(e.g. --nproc-per-node 8)"));
        assert!(
            refused("torchrun --nproc-per-node 0 t.py").contains("expected a whole number from 1")
        );
        assert!(refused("torchrun --nnodes 1:4 t.py").contains("give one number (--nnodes 4)"));
        assert!(refused("torchrun --nnodes 2 --rdzv-backend c10d t.py")
            .contains("use static rendezvous"));
        assert!(refused("torchrun --nnodes 2 --node-rank 2 t.py")
            .contains("machines are numbered 0 to 1"));
        assert!(refused("torchrun --nproc-per-node 2").contains("has no training script"));
        assert!(refused("torchrun --nproc-per-node").contains("needs a value"));
        assert!(refused("torchrun --frobnicate t.py").contains("write --frobnicate=VALUE"));
        assert!(refused("torchrun --rdzv t.py").contains("ambiguous"));
        assert!(refused("torchrun --standalone=1 t.py").contains("takes no value"));
        assert!(refused("torchrun --help").contains("starts no job"));
        assert_eq!(parse_with("", &[]), Err(LaunchError::NoCommand));
        let pet = parse_with("torchrun t.py", &[("PET_NNODES", "two")])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(pet.contains("two") && pet.contains("PET_NNODES"), "{pet}");
    }
}
