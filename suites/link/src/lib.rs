//! `tbbench link`: ping-pong latency and windowed / bidirectional bandwidth between rank 0 and
//! every other rank, across message sizes, with the payload checked and the link's ceiling
//! (flag or the interface's reported speed) as the yardstick.

pub mod cli;
mod harness;
pub mod pattern;
pub mod payload;
mod table;
pub mod view;

use anyhow::{bail, Result};
use serde::Serialize;
use tbbench_runners::suite::{Context, Suite, SuiteOutput};
use tbbench_schema::Summary;

pub use pattern::Pattern;

#[derive(Debug, Clone, Serialize)]
pub struct LinkConfig {
    /// Message sizes in bytes, in the order measured.
    pub sizes: Vec<u64>,
    pub patterns: Vec<Pattern>,
    /// Timed iterations per size; None picks by size (1000 for small ping-pongs).
    pub iters: Option<usize>,
    /// Untimed iterations before timing; None picks a tenth of the iterations (2..100).
    pub warmup: Option<usize>,
    /// Messages in flight per bandwidth iteration (osu_bw uses 64); fewer for large messages.
    pub window: usize,
    /// The link's ceiling in bit/s, when given on the command line.
    pub ceiling_bits_per_s: Option<f64>,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            sizes: default_sizes(),
            patterns: vec![Pattern::Latency, Pattern::Bw, Pattern::Bibw],
            iters: None,
            warmup: None,
            window: 64,
            ceiling_bits_per_s: None,
        }
    }
}

/// Powers of four from 4 B to 256 MiB: the whole curve, from latency-bound to bandwidth-bound,
/// in fourteen sizes.
pub fn default_sizes() -> Vec<u64> {
    (1..=14).map(|i| 1u64 << (2 * i)).collect()
}

/// `all`, one mode, or a comma list (`bw,bibw`).
pub fn parse_mode(s: &str) -> Result<Vec<Pattern>> {
    let mut patterns = Vec::new();
    for word in s.split(',') {
        let add: &[Pattern] = match word.trim() {
            "all" => &[Pattern::Latency, Pattern::Bw, Pattern::Bibw],
            "latency" | "lat" => &[Pattern::Latency],
            "bw" => &[Pattern::Bw],
            "bibw" => &[Pattern::Bibw],
            other => bail!("unknown mode '{other}' (use latency, bw, bibw, all, or a comma list)"),
        };
        for p in add {
            if !patterns.contains(p) {
                patterns.push(*p);
            }
        }
    }
    Ok(patterns)
}

#[derive(Debug, Clone, Serialize)]
pub struct LatencyRow {
    pub pair: [usize; 2],
    pub size_bytes: u64,
    pub iters: usize,
    pub warmup: usize,
    /// One-way latency (RTT/2) in microseconds, over every iteration.
    pub one_way_us: Summary,
    /// Every iteration's one-way time in nanoseconds, in the order measured.
    pub samples_ns: Vec<u64>,
    pub wrong_bytes: u64,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct AvgPeak {
    pub avg: f64,
    pub peak: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct BandwidthRow {
    pub pair: [usize; 2],
    pub mode: Pattern,
    pub size_bytes: u64,
    pub window: usize,
    pub iters: usize,
    pub warmup: usize,
    /// avg = all bytes / all time; peak = the best iteration. 10^9 bit/s.
    pub gbit_per_s: AvgPeak,
    /// 2^30 bytes/s.
    pub gib_per_s: AvgPeak,
    pub msg_rate_per_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub percent_of_ceiling: Option<AvgPeak>,
    /// The one-direction ceiling the percentages compare with (bibw against twice it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ceiling_gbit_per_s: Option<f64>,
    /// Spread of the per-iteration rates, Gbit/s.
    pub iteration_gbit_per_s: Summary,
    pub wrong_bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct LinkResults {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ceiling_gbit_per_s: Option<f64>,
    /// "flag" (--ceiling), "interface" (the speed the OS reports) or "memcpy" (shm: one core's
    /// memcpy of the largest message size, measured on rank 0 before the run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ceiling_source: Option<&'static str>,
    pub latency: Vec<LatencyRow>,
    pub bandwidth: Vec<BandwidthRow>,
    /// The hosts' energy over the whole sweep, or why there is none (reports/README.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub energy: Option<serde_json::Value>,
}

pub struct LinkSuite;

/// Bytes one rank holds at once for a message size: the send buffer and the receive slots
/// (and, on rank 0 of shm, the two buffers of the memcpy ceiling, measured first).
fn bytes_for_size(config: &LinkConfig, size: u64) -> u64 {
    let slots = config
        .patterns
        .iter()
        .map(|p| p.recv_slots(size, p.window(size, config.window)) as u64)
        .max()
        .unwrap_or(1);
    size.saturating_mul(slots.saturating_add(1))
}

/// Refuses, before any buffer is allocated, sizes this host's free memory cannot hold for
/// its ranks, naming the largest size that fits.
fn check_memory(config: &LinkConfig, ctx: &Context) -> Result<()> {
    let me = &ctx.rank_hosts[ctx.rank()];
    let Some(host) = ctx.hosts.iter().find(|h| &h.hostname == me) else {
        return Ok(());
    };
    if host.memory_available_bytes == 0 {
        return Ok(());
    }
    // Ranks measure one pair at a time, but every rank on the host may be in some pair.
    let ranks_here = host.ranks.len().clamp(1, 2) as u64;
    let budget = host.memory_available_bytes / 10 * 8 / ranks_here;
    let Some(&largest) = config.sizes.iter().max() else {
        return Ok(());
    };
    if bytes_for_size(config, largest) > budget {
        let fits = (0..63)
            .map(|i| 1u64 << i)
            .take_while(|&s| bytes_for_size(config, s) <= budget)
            .last()
            .unwrap_or(0);
        bail!(
            "a {} message needs {} per rank, but {} has {} available for {} rank(s) here; the largest power of two that fits is {}",
            tbbench_runners::units::format_size(largest),
            tbbench_runners::units::format_size(bytes_for_size(config, largest)),
            host.hostname,
            tbbench_runners::units::format_size(host.memory_available_bytes),
            ranks_here,
            tbbench_runners::units::format_size(fits)
        );
    }
    Ok(())
}

impl Suite for LinkSuite {
    const NAME: &'static str = "link";
    type Config = LinkConfig;
    /// One connection, as iperf3 measures by default: the one-way stream of `--mode bw` gains
    /// nothing from a second connection's pacing timers. Over loopback under bbr on the 2-core
    /// VM, two runs: one connection 60-62 Gbit/s at 1 MiB and 53-56 at 16 MiB, two 41-42 and
    /// 31-32; `--mode bibw` goes the other way (39-42 against 65-68 at 1 MiB), where
    /// `--streams 2` is the like for like of iperf3's `--bidir` (a connection each way).
    const STREAMS_WHEN_PACED: usize = 1;

    fn run(config: &LinkConfig, ctx: &mut Context) -> Result<Option<SuiteOutput>> {
        if ctx.size() < 2 {
            bail!("the link suite needs at least 2 ranks (--nodes 2)");
        }
        check_memory(config, ctx)?;
        let (ceiling, source) = match (config.ceiling_bits_per_s, ctx.network.nominal_gbit_per_s) {
            (Some(bits), _) => (Some(bits / 1e9), Some("flag")),
            (None, Some(g)) => (Some(g), Some("interface")),
            // Shared memory has no wire: its ceiling is what one core copies, measured here.
            (None, None) if ctx.network.transport == "shm" && ctx.rank() == 0 => {
                let largest = config.sizes.iter().copied().max().unwrap_or(1 << 20);
                (Some(harness::memcpy_gbit_per_s(largest)), Some("memcpy"))
            }
            (None, None) => (None, None),
        };
        let mut results = LinkResults {
            ceiling_gbit_per_s: ceiling,
            ceiling_source: source,
            latency: Vec::new(),
            bandwidth: Vec::new(),
            energy: None,
        };
        if let (0, Some(tcp)) = (ctx.rank(), ctx.network.tcp_setup()) {
            // TCP's rates follow these (BBR paces even loopback): said before any table.
            println!("# {}, {tcp}", ctx.network.label);
        }
        let energy = tbbench_runners::energy::Span::begin(ctx);
        for peer in 1..ctx.size() {
            if ctx.rank() == 0 || ctx.rank() == peer {
                harness::measure_pair(
                    config,
                    ctx,
                    peer,
                    ceiling,
                    source == Some("memcpy"),
                    &mut results,
                )?;
            }
            // The ranks outside this pair wait here for its whole sweep.
            ctx.comm.barrier_patient()?;
        }
        results.energy = energy.end(ctx)?;
        if ctx.rank() != 0 {
            return Ok(None);
        }
        let checks = vec![harness::payload_check(&results)];
        let warnings = harness::noise_warnings(&results);
        Ok(Some(SuiteOutput {
            results: serde_json::to_value(&results)?,
            checks,
            warnings,
        }))
    }
}
