//! `ringfeed serve`'s flags, and the configuration they make.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};

use crate::cache::CacheSize;
use crate::cli::max_age::{parse_idle_timeout, parse_max_age};
use crate::loader::{DataCachePolicy, JobConfig, ListingPolicy, SampleFormat, ServeConfig};
use crate::reader::{IoChoice, ReaderConfig};
use crate::ring::layout::{Job, MAX_RANKS};
use crate::sampler::{BlockShape, ResumeState, SampleOrder, Tail};
use crate::source::ManifestCache;
use crate::source::SourceSpec;

/// Arguments of `ringfeed serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Dataset: a local directory (or file://DIR), or a remote prefix:
    /// s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, az://CONTAINER/PREFIX,
    /// abfs://CONTAINER@ACCOUNT.dfs.core.windows.net/PREFIX, http(s)://HOST/PATH/
    /// (credentials and endpoints from the cloud's usual environment, as
    /// object_store's from_env reads them; docs/manifest.md). With --seq-len:
    /// a token corpus (a Megatron PREFIX, a directory, a file), and given
    /// again for each corpus of a mixture (docs/tokens.md).
    #[arg(long, required = true)]
    pub source: Vec<String>,
    /// A remote source's objects from a file instead of a listing: one key
    /// (relative to the prefix) per line, optionally a tab and its size in
    /// bytes (else a HEAD asks); `#` lines are comments.
    #[arg(long, value_name = "FILE")]
    pub keys: Option<PathBuf>,
    /// A local source: also read the files that links in it point to
    /// outside it. By default such a link is skipped with one warning: a
    /// link another user planted must not show a file only you may read.
    #[arg(long)]
    pub follow_links_outside: bool,
    /// Loader name; trainers attach with it (RINGFEED_NAME). 1–64 of A-Za-z0-9._-
    #[arg(long)]
    pub name: String,
    /// Samples per rank per step.
    #[arg(long)]
    pub batch_size: u32,
    /// Ranks of the whole job, all machines together: torchrun's WORLD_SIZE
    /// (default: on one machine LOCAL_WORLD_SIZE, else WORLD_SIZE, else 1;
    /// with --nnodes, WORLD_SIZE, else LOCAL_WORLD_SIZE x nnodes).
    #[arg(long)]
    pub world_size: Option<u32>,
    /// Machines the job runs on, one loader on each (torchrun's --nnodes).
    /// Each loader serves world size / nnodes ranks; every machine's loader
    /// needs the same files and the same --world-size, --batch-size, --seed,
    /// --epochs, --resume, --record-bytes and --no-shuffle.
    #[arg(long, default_value_t = 1)]
    pub nnodes: u32,
    /// This machine's place among them, 0 to nnodes-1 (torchrun's
    /// --node-rank with static rendezvous; its GROUP_RANK): its loader serves job ranks node_rank x L to
    /// node_rank x L + L - 1, L = world size / nnodes, to LOCAL_RANK 0..L-1.
    #[arg(long, default_value_t = 0)]
    pub node_rank: u32,
    /// Epochs to serve.
    #[arg(long, default_value_t = 1)]
    pub epochs: u64,
    /// Seed of the shuffle.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Serve samples in manifest order (the same as --shuffle none).
    #[arg(long)]
    pub no_shuffle: bool,
    /// The order of every epoch: exact (a uniform shuffle of all samples),
    /// block (blocks of --shuffle-block consecutive samples shuffled, then
    /// samples within windows of --shuffle-window blocks: fewer, longer
    /// reads of tar shards), none (manifest order). See docs/sampler.md.
    #[arg(long, value_enum, default_value_t = ShuffleFlag::Exact)]
    pub shuffle: ShuffleFlag,
    /// Samples in a block of --shuffle block (consecutive in the manifest).
    #[arg(long, default_value_t = BlockShape::DEFAULT_BLOCK_SAMPLES)]
    pub shuffle_block: u32,
    /// Blocks in a window of --shuffle block: samples are shuffled among the
    /// window's blocks.
    #[arg(long, default_value_t = BlockShape::DEFAULT_WINDOW_BLOCKS)]
    pub shuffle_window: u32,
    /// How an epoch ends when its samples do not fill a whole last step of
    /// world size x batch size: drop (the default, training: that tail is
    /// left out, every batch full) or keep (evaluation: every sample once
    /// an epoch, the last steps' batches short or empty, every rank the same
    /// number of steps). See docs/sampler.md.
    #[arg(long, value_enum, default_value_t = TailFlag::Drop)]
    pub tail: TailFlag,
    /// Files are concatenations of fixed-size records of N bytes.
    #[arg(long)]
    pub record_bytes: Option<u64>,
    /// What a sample is: files (each object whole), records (--record-bytes
    /// N), tar (WebDataset shards: consecutive members sharing a key;
    /// docs/shards.md). Default: records with --record-bytes, tar when every
    /// object is a .tar (or its .tar.idx), else files.
    #[arg(long, value_enum)]
    pub format: Option<FormatFlag>,
    /// Slots per rank: how many batches each rank may have ready ahead
    /// (default: 2 x queue depth / batch size, 4 to 16; past 256 MiB of a
    /// rank's slots, as many as fit in it, but at least 4).
    #[arg(long)]
    pub slots_per_rank: Option<u32>,
    /// Payload bytes per slot (default: the B largest samples).
    #[arg(long)]
    pub slot_bytes: Option<u64>,
    /// Reader: auto (io_uring, else pread with a warning), uring, pread.
    #[arg(long, default_value = "auto")]
    pub io: IoChoice,
    /// Reads in flight (a remote source: object ranges being fetched; raise it
    /// for a store far away).
    #[arg(long, default_value_t = 256)]
    pub queue_depth: u32,
    /// Resume from EPOCH:SAMPLES (samples consumed in that epoch, all ranks of the job together, all machines),
    /// or `auto`: wait for the trainers to say where (their `load_state_dict`; a first batch without one means
    /// from the start), and refuse ranks that disagree. `ringfeed run` passes `auto`.
    #[arg(long, value_parser = parse_resume, allow_hyphen_values = true)]
    pub resume: Option<ResumeFlag>,
    /// Manifest cache: use (a cached listing while the directories are
    /// unchanged, else list and store), refresh (list and store), off.
    #[arg(long, value_enum, default_value_t = CacheUse::Use)]
    pub manifest_cache: CacheUse,
    /// Cache directory (default: RINGFEED_CACHE_DIR, else
    /// $XDG_CACHE_HOME/ringfeed, else ~/.cache/ringfeed); manifests go to its
    /// manifests/ directory.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Disk data cache of a remote source's objects across epochs and runs,
    /// under the cache directory's data/ (on by default for remote sources;
    /// local ones are never cached). See docs/cache.md.
    #[arg(long, value_enum, default_value_t = DataCacheUse::On)]
    pub cache: DataCacheUse,
    /// Most bytes the data cache may use, with k/M/G/T (binary) suffixes,
    /// e.g. 200G. Default: the whole dataset, or what its file system can
    /// spare less a reserve (10% of it, at least 1 GiB), whichever is less.
    #[arg(long, value_name = "BYTES", value_parser = crate::cache::parse_size)]
    pub cache_size: Option<u64>,
    /// A remote prefix's cached listing is used while younger than this
    /// (then listed again in the background; a change stops the run):
    /// e.g. 90s, 30m, 1h, 2d; 0 lists at every start.
    #[arg(long, value_parser = parse_max_age, default_value = "1h")]
    pub manifest_max_age: std::time::Duration,
    /// Serve Prometheus metrics at http://ADDR/metrics: HOST:PORT, e.g.
    /// 127.0.0.1:9464 (port 0 picks a free one, logged at start). See docs/metrics.md.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Stop when no trainer has been attached for this long: none came
    /// since the loader started, or none since the last one left (e.g.
    /// 90s, 10m, 2h; off or 0: wait for ever). The loader then exits with
    /// status 4, and trainers that attach later are told why.
    #[arg(long, value_parser = parse_idle_timeout, default_value = "10m", value_name = "DURATION")]
    pub idle_timeout: std::time::Duration,
    /// The decode stage: --decode image and its flags.
    #[command(flatten)]
    pub images: super::decode_args::DecodeArgs,
    /// One listing per job: --job-manifest, --job-id, --job-manifest-wait.
    #[command(flatten)]
    pub job_manifest: super::job_manifest_args::JobManifestArgs,
    /// Token corpora: --seq-len and its flags.
    #[command(flatten)]
    pub tokens: super::token_args::TokenArgs,
}

/// `--shuffle`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ShuffleFlag {
    /// A uniform permutation of all samples (the default).
    Exact,
    /// Blocks of consecutive samples permuted, samples shuffled within
    /// windows of blocks.
    Block,
    /// Manifest order.
    None,
}

/// `--tail`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TailFlag {
    /// Leave out the samples that do not fill a whole last step.
    Drop,
    /// Serve every sample once an epoch, in short or empty last batches.
    Keep,
}

impl From<TailFlag> for Tail {
    fn from(flag: TailFlag) -> Tail {
        match flag {
            TailFlag::Drop => Tail::Drop,
            TailFlag::Keep => Tail::Keep,
        }
    }
}

/// `--manifest-cache`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CacheUse {
    /// Use a valid cached manifest; list and store otherwise.
    Use,
    /// List, and store the new listing.
    Refresh,
    /// Neither read nor write the cache.
    Off,
}

/// `--format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FormatFlag {
    /// Each object is one sample.
    Files,
    /// Objects are N-byte records (`--record-bytes N`).
    Records,
    /// Objects are WebDataset tar shards.
    Tar,
    /// Flat token files (nanoGPT's train.bin; --seq-len, --token-dtype).
    Tokens,
    /// Megatron-Core's PREFIX.bin + PREFIX.idx (--seq-len).
    Megatron,
    /// datatrove's NAME.ds + NAME.ds.index (--seq-len).
    Datatrove,
    /// LitData optimize() output written with TokensLoader (--seq-len).
    Litdata,
    /// MosaicML MDS shards with a token column (--seq-len).
    Mds,
}

impl FormatFlag {
    /// The token format this names, if it is one.
    fn token_format(self) -> Option<crate::tokens::TokenFormatKind> {
        use crate::tokens::TokenFormatKind as K;
        match self {
            FormatFlag::Files | FormatFlag::Records | FormatFlag::Tar => None,
            FormatFlag::Tokens => Some(K::Flat),
            FormatFlag::Megatron => Some(K::Megatron),
            FormatFlag::Datatrove => Some(K::Datatrove),
            FormatFlag::Litdata => Some(K::LitData),
            FormatFlag::Mds => Some(K::Mds),
        }
    }
}

/// `--cache`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DataCacheUse {
    /// Cache a remote source's objects on local disk.
    On,
    /// Read every epoch from the source.
    Off,
}

/// `--resume`: a state, or `auto` (the trainers say).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResumeFlag {
    /// Start at this state.
    At(ResumeState),
    /// Wait for the ranks' start requests (`ring::start`).
    Auto,
}

fn parse_resume(s: &str) -> Result<ResumeFlag, String> {
    if s == "auto" {
        return Ok(ResumeFlag::Auto);
    }
    parse_resume_state(s).map(ResumeFlag::At)
}

fn parse_resume_state(s: &str) -> Result<ResumeState, String> {
    let (e, c) = s
        .split_once(':')
        .ok_or_else(|| format!("--resume {s:?}: expected EPOCH:SAMPLES, e.g. 3:81920"))?;
    let epoch = e.parse().map_err(|_| {
        format!(
            "--resume {s:?}: epoch {e:?} is not a whole number from 0 to {}",
            u64::MAX
        )
    })?;
    let samples_consumed = c.parse().map_err(|_| {
        format!(
            "--resume {s:?}: samples {c:?} is not a whole number from 0 to {}",
            u64::MAX
        )
    })?;
    Ok(ResumeState {
        epoch,
        samples_consumed,
    })
}

/// A world size from the environment variable `var`, if it is set.
fn world_size_env(var: &str) -> Result<Option<u32>> {
    let Ok(v) = std::env::var(var) else {
        return Ok(None);
    };
    let w: u32 = v.trim().parse().map_err(|_| anyhow::anyhow!("{var}={v:?} is not a world size (a whole number from 1 to {}); fix it or pass --world-size", crate::sampler::MAX_WORLD_SIZE))?;
    if w == 0 {
        bail!("{var}=0: the world size must be at least 1; fix {var} or pass --world-size");
    }
    Ok(Some(w))
}

/// The job's world size: the flag, else the environment torchrun sets, else
/// one. On one machine LOCAL_WORLD_SIZE comes first; over `nnodes` machines
/// WORLD_SIZE does, then LOCAL_WORLD_SIZE times `nnodes`.
pub fn world_size_from(flag: Option<u32>, nnodes: u32) -> Result<u32> {
    if let Some(w) = flag {
        return Ok(w);
    }
    if nnodes <= 1 {
        for var in ["LOCAL_WORLD_SIZE", "WORLD_SIZE"] {
            if let Some(w) = world_size_env(var)? {
                return Ok(w);
            }
        }
        return Ok(1);
    }
    if let Some(w) = world_size_env("WORLD_SIZE")? {
        return Ok(w);
    }
    if let Some(l) = world_size_env("LOCAL_WORLD_SIZE")? {
        return l.checked_mul(nnodes).ok_or_else(|| {
            anyhow::anyhow!(
                "LOCAL_WORLD_SIZE={l} x --nnodes {nnodes} is too many ranks; pass --world-size"
            )
        });
    }
    bail!("--nnodes {nnodes}: pass --world-size, the ranks of the whole job (e.g. {} for {nnodes} machines of 8 GPUs)", nnodes.saturating_mul(8))
}

/// The ranks this loader serves: how many (its ring's world size), and
/// where they sit in the job. Checks `--nnodes` and `--node-rank`.
pub fn ranks_from(world_size: Option<u32>, nnodes: u32, node_rank: u32) -> Result<(u32, Job)> {
    if nnodes == 0 {
        bail!("--nnodes 0: a job runs on at least 1 machine");
    }
    if node_rank >= nnodes {
        bail!("--node-rank {node_rank} is not below --nnodes {nnodes}: machines are numbered 0 to {} (torchrun's --node-rank)", nnodes - 1);
    }
    let job_world_size = world_size_from(world_size, nnodes)?;
    if job_world_size == 0 {
        return Err(crate::sampler::SamplerError::ZeroWorldSize.into());
    }
    if job_world_size % nnodes != 0 {
        bail!(
            "world size {job_world_size} does not split evenly over --nnodes {nnodes}: torchrun starts the same number of ranks \
             (--nproc-per-node) on every machine, so the world size is a multiple of the machine count"
        );
    }
    if nnodes == 1 {
        if let (Ok(Some(world)), Ok(Some(local))) = (
            world_size_env("WORLD_SIZE"),
            world_size_env("LOCAL_WORLD_SIZE"),
        ) {
            if world > local && world % local == 0 {
                tracing::warn!(
                    "WORLD_SIZE={world} and LOCAL_WORLD_SIZE={local} describe a job on {} machines, but this loader serves a job of {job_world_size} rank(s) on this machine alone: \
                     start each machine's loader with --world-size {world} --nnodes {} --node-rank N, or every machine gets the same samples",
                    world / local,
                    world / local
                );
            }
        }
    }
    let local = job_world_size / nnodes;
    if local > MAX_RANKS {
        if nnodes == 1 {
            bail!("world size {job_world_size}: one loader serves at most {MAX_RANKS} ranks; for a job on several machines pass --nnodes and --node-rank, so that each machine's loader serves its own ranks");
        }
        bail!("world size {job_world_size} over --nnodes {nnodes} is {local} ranks per machine, more than the {MAX_RANKS} one loader serves");
    }
    Ok((
        local,
        Job {
            first_rank: node_rank * local,
            job_world_size,
            plan_digest: 0,
            start: None,
            order: None,
            images: None,
            tokens: None,
            awaits_start: false,
            keys: None,
            class_names: None,
            tail: Tail::Drop,
        },
    ))
}

/// The dataset behind `--source` (and `--keys`).
pub fn source_spec(source: &str, keys: Option<&std::path::Path>) -> Result<SourceSpec> {
    SourceSpec::parse(source, keys).map_err(anyhow::Error::msg)
}

impl ServeArgs {
    /// The job these flags describe, every flag checked here, once, so that
    /// a mistake is reported before a long listing, in the flag's own name.
    /// Nothing after this line reads a flag.
    pub fn into_config(&self) -> Result<JobConfig> {
        let serve = self.serve_config()?;
        if self.epochs == 0 {
            bail!("--epochs 0 serves nothing; pass at least 1");
        }
        if !(1..=crate::reader::QUEUE_DEPTH_MAX).contains(&self.queue_depth) {
            bail!(
                "--queue-depth {}: must be from 1 to {}",
                self.queue_depth,
                crate::reader::QUEUE_DEPTH_MAX
            );
        }
        let token_format = self.format.and_then(FormatFlag::token_format);
        if serve.tokens.is_some() {
            if let Some(n) = self.record_bytes {
                bail!("--record-bytes {n} with --seq-len: a token run cuts its own windows; leave --record-bytes out");
            }
            if serve.decode.is_some() {
                bail!("--decode image with --seq-len: token windows are not images; leave one of them out");
            }
            if let Some(f) = self.format.filter(|_| token_format.is_none()) {
                bail!("--format {} with --seq-len: pass a token format (tokens, megatron, datatrove, litdata, mds) or leave --format out", f.to_possible_value().map_or("?".into(), |v| v.get_name().to_owned()));
            }
        }
        let format = match (self.format.filter(|_| token_format.is_none()), self.record_bytes) {
            (Some(FormatFlag::Records), None) => {
                bail!("--format records needs --record-bytes N, the size of one record")
            }
            (Some(format @ (FormatFlag::Tar | FormatFlag::Files)), Some(n)) => bail!(
                "--record-bytes {n} with --format {}: records are their own format; leave one of them out",
                if format == FormatFlag::Tar { "tar" } else { "files" }
            ),
            (Some(FormatFlag::Records), Some(_)) | (None, Some(_)) => SampleFormat::Records,
            (Some(FormatFlag::Tar), None) => SampleFormat::Tar,
            (Some(FormatFlag::Files), None) => SampleFormat::Files,
            // A token format: its run is `ServeConfig::tokens`.
            (None, None) | (Some(_), _) => SampleFormat::Auto,
        };
        if serve.decode.is_some() && format == SampleFormat::Records {
            bail!("--decode image decodes an image per object or tar sample; it cannot be used with --record-bytes (records are not images)");
        }
        serve.check_ring_flags()?;
        crate::ring::segment::validate_name(&self.name)?;
        crate::sampler::check_shape(self.batch_size, serve.job.job_world_size)?;
        // Before a listing that can take minutes; the ring's creation
        // checks again.
        crate::ring::Producer::check_name_free(&self.name)?;
        let publishing = self
            .job_manifest
            .publishing(&super::job_manifest_args::JobShape {
                source: &serve.source,
                nnodes: self.nnodes,
                node_rank: self.node_rank,
                max_age: self.manifest_max_age,
                refresh: self.manifest_cache == CacheUse::Refresh,
            })?;
        Ok(JobConfig {
            serve,
            format,
            listing: ListingPolicy {
                cache: self.manifest_cache(),
                refresh: self.manifest_cache == CacheUse::Refresh,
                follow_links_outside: self.follow_links_outside,
                publishing,
            },
            data_cache: match self.cache {
                DataCacheUse::Off => DataCachePolicy::Off,
                DataCacheUse::On => DataCachePolicy::On {
                    root: crate::cache::data_root(self.cache_dir.as_deref()),
                    size: self.cache_size.map_or(CacheSize::Auto, CacheSize::Bytes),
                    size_given: self.cache_size.is_some(),
                },
            },
            metrics: self.metrics.clone(),
            idle_timeout: (!self.idle_timeout.is_zero()).then_some(self.idle_timeout),
        })
    }

    /// The manifest cache these arguments ask for; None when off or when no
    /// cache directory is known.
    fn manifest_cache(&self) -> Option<ManifestCache> {
        if self.manifest_cache == CacheUse::Off {
            return None;
        }
        let dir = ManifestCache::dir_under(self.cache_dir.as_deref());
        if dir.is_none() {
            tracing::info!("no manifest cache: neither RINGFEED_CACHE_DIR, XDG_CACHE_HOME nor HOME is set (pass --cache-dir)");
        }
        dir.map(|dir| ManifestCache {
            remote_max_age: self.manifest_max_age,
            ..ManifestCache::at(dir)
        })
    }

    /// The order `--shuffle`, `--shuffle-block`, `--shuffle-window` and
    /// `--no-shuffle` ask for; refuses flags that contradict each other.
    fn sample_order(&self) -> Result<SampleOrder> {
        let block_flags_given = self.shuffle_block != BlockShape::DEFAULT_BLOCK_SAMPLES
            || self.shuffle_window != BlockShape::DEFAULT_WINDOW_BLOCKS;
        if self.no_shuffle && self.shuffle == ShuffleFlag::Block {
            bail!("--no-shuffle and --shuffle block contradict each other; pass one of them (--no-shuffle is --shuffle none)");
        }
        if block_flags_given && (self.no_shuffle || self.shuffle != ShuffleFlag::Block) {
            bail!(
                "--shuffle-block {} and --shuffle-window {} shape only the block order; add --shuffle block, or drop them",
                self.shuffle_block,
                self.shuffle_window
            );
        }
        Ok(match (self.no_shuffle, self.shuffle) {
            (true, _) | (false, ShuffleFlag::None) => SampleOrder::None,
            (false, ShuffleFlag::Exact) => SampleOrder::Exact,
            (false, ShuffleFlag::Block) => {
                SampleOrder::Block(BlockShape::new(self.shuffle_block, self.shuffle_window)?)
            }
        })
    }

    /// The run's shape these arguments describe.
    fn serve_config(&self) -> Result<ServeConfig> {
        let (world_size, job) = ranks_from(self.world_size, self.nnodes, self.node_rank)?;
        let (start, awaits_start) = match self.resume {
            None => (ResumeState::default(), false),
            Some(ResumeFlag::At(state)) => (state, false),
            Some(ResumeFlag::Auto) => (ResumeState::default(), true),
        };
        let job = Job {
            awaits_start,
            ..job
        };
        let tokens = self.tokens.config(
            &self.source,
            self.keys.as_deref(),
            self.format.and_then(FormatFlag::token_format),
            self.cache_dir.as_deref(),
        )?;
        Ok(ServeConfig {
            tokens,
            source: source_spec(&self.source[0], self.keys.as_deref())?,
            name: self.name.clone(),
            batch_size: self.batch_size,
            world_size,
            job,
            epochs: self.epochs,
            seed: self.seed,
            order: self.sample_order()?,
            record_bytes: self.record_bytes,
            slots_per_rank: self.slots_per_rank,
            slot_bytes: self.slot_bytes,
            io: self.io,
            reader: ReaderConfig {
                queue_depth: self.queue_depth,
                ..ReaderConfig::default()
            },
            start,
            tail: self.tail.into(),
            progress: true,
            decode: self.images.config()?,
        })
    }
}
