//! `tbbench link`'s flags, its config, and its registration with the binary.

use crate::{LinkConfig, LinkSuite, Pattern};
use clap::{Args, CommandFactory, FromArgMatches, Parser};
use tbbench_runners::cli::{
    parse_rate, parse_size, parse_size_list, QuickPlan, QuickRun, Registration, RunArgs,
};

/// The subcommand: its help line and flags.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "link",
    about = "Ping-pong latency and bandwidth between ranks across message sizes"
)]
pub struct LinkCommand {
    #[command(flatten)]
    pub args: LinkArgs,
}

#[derive(Args, Debug, Clone)]
pub struct LinkArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// One message size (e.g. 256MiB, 64k, 4096).
    #[arg(long, value_parser = parse_size, conflicts_with = "sizes", allow_hyphen_values = true)]
    pub buffer: Option<u64>,
    /// Sizes: a range of powers of two (1B..256MiB) or a list (64,4k,1MiB). Default 4B..256MiB by 4x.
    #[arg(long, value_parser = parse_sizes, allow_hyphen_values = true)]
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
    /// Without --iters: fit the whole sweep into about this many minutes, choosing each size's
    /// iterations from the rate its warm-up measures [default: 2].
    #[arg(long, conflicts_with = "iters", value_parser = parse_minutes)]
    pub max_minutes: Option<f64>,
    /// Messages in flight per bandwidth iteration (osu_bw's window).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub window: u64,
    /// The link's ceiling for "% of ceiling" (e.g. 80Gbit for Thunderbolt 5); default: the
    /// interface's reported speed, where the OS reports one.
    #[arg(long, value_parser = parse_rate)]
    pub ceiling: Option<f64>,
    /// The pairs to measure, e.g. `0-1,2-3` (default: every pair of ranks with a cable
    /// between them; on one network, every pair).
    #[arg(long, value_parser = parse_pairs)]
    pub pairs: Option<PairList>,
}

/// `--sizes`' value: one flag value that is a list.
#[derive(Debug, Clone)]
pub struct SizeList(pub Vec<u64>);
/// `--mode`'s value.
#[derive(Debug, Clone)]
pub struct Modes(pub Vec<Pattern>);

#[derive(Debug, Clone)]
pub struct PairList(pub Vec<[usize; 2]>);

/// `0-1,2-3`: pairs of ranks, each two different ranks, lower first once read.
fn parse_pairs(s: &str) -> Result<PairList, String> {
    let mut out: Vec<[usize; 2]> = Vec::new();
    for w in s.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        let (a, b) = w
            .split_once('-')
            .ok_or_else(|| format!("'{w}' is not a pair of ranks like 0-1"))?;
        let parse = |x: &str| {
            x.trim()
                .parse::<usize>()
                .map_err(|_| format!("'{w}': '{x}' is not a rank number"))
        };
        let (a, b) = (parse(a)?, parse(b)?);
        if a == b {
            return Err(format!("'{w}' pairs rank {a} with itself"));
        }
        let pair = [a.min(b), a.max(b)];
        if !out.contains(&pair) {
            out.push(pair);
        }
    }
    if out.is_empty() {
        return Err("--pairs names no pair (e.g. --pairs 0-1,2-3)".into());
    }
    Ok(PairList(out))
}

fn parse_minutes(s: &str) -> Result<f64, String> {
    let m: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number of minutes"))?;
    let most = tbbench_runners::units::MAX_DURATION_S / 60.0;
    if !(m > 0.0 && m <= most) {
        return Err(format!(
            "{s} minutes: give more than 0 and at most {most:.0}"
        ));
    }
    Ok(m)
}

fn parse_sizes(s: &str) -> Result<SizeList, String> {
    parse_size_list(s).map(SizeList)
}
fn parse_mode(s: &str) -> Result<Modes, String> {
    crate::parse_mode(s).map(Modes).map_err(|e| e.to_string())
}

impl LinkArgs {
    pub fn config(&self) -> LinkConfig {
        let defaults = LinkConfig::default();
        LinkConfig {
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
            pairs: self.pairs.clone().map(|p| p.0),
            max_seconds: match self.iters {
                Some(_) => None,
                None => Some(self.max_minutes.unwrap_or(crate::DEFAULT_MAX_MINUTES) * 60.0),
            },
        }
    }
}

/// The link suite as the binary lists it.
pub fn registration() -> Registration {
    Registration {
        name: "link",
        command: LinkCommand::command,
        run: |m, tool| {
            let a = LinkArgs::from_arg_matches(m)?;
            tbbench_runners::driver::run::<LinkSuite>(&a.config(), &a.run.options(), tool)
        },
        quick: |_: &QuickPlan| {
            Ok(QuickRun {
                result: "link",
                args: [
                    "--sizes",
                    "1,4,16,64,256,1k,4k,16k,64k,256k,1MiB,4MiB",
                    "--iters",
                    "200",
                    "--window",
                    "16",
                ]
                .map(String::from)
                .to_vec(),
            })
        },
    }
}
