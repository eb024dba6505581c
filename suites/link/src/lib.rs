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
use serde::{Deserialize, Serialize};
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
    /// The pairs to measure (`--pairs`); None: every pair with a cable (every pair on one
    /// network), or ranks 0 and 1 alone where there are two.
    pub pairs: Option<Vec<[usize; 2]>>,
    /// Where `iters` is None: the whole sweep's time, in seconds, that each size's iterations
    /// are chosen to fit, from the rate its warm-up measures (`--max-minutes`).
    pub max_seconds: Option<f64>,
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
            pairs: None,
            max_seconds: Some(DEFAULT_MAX_MINUTES * 60.0),
        }
    }
}

/// The default sweep's time on any link: iperf3 takes 10 s, a person reads a few silent
/// minutes as a hang, and the 14 default sizes at their full iterations take about a minute
/// over loopback but 9 over a 700 Mbit/s link.
pub const DEFAULT_MAX_MINUTES: f64 = 2.0;

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

#[derive(Debug, Clone, Serialize, Deserialize)]
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

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct AvgPeak {
    pub avg: f64,
    pub peak: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
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
    /// More than two ranks: each measured pair's key figures, in the order measured (the
    /// rows above carry every size; `pair` names their pair).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pairs: Vec<PairSummary>,
    /// More than two ranks, bandwidth measured: every rank sending to each rank it has a cable
    /// to (every other rank on one network) at once: what the cluster moves in aggregate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrent: Option<Concurrent>,
    /// The hosts' energy over the whole sweep, or why there is none (reports/README.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub energy: Option<serde_json::Value>,
    /// Where iterations were chosen to fit a time (no `--iters`): that time and what the
    /// sweep took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_budget: Option<TimeBudget>,
    /// Default sizes the time budget had no room for (--iters or --sizes measures them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<LeftOut>,
}

/// A default size the time budget had no room for.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeftOut {
    pub pattern: Pattern,
    pub pair: [usize; 2],
    pub size_bytes: u64,
    /// What its fewest iterations would have taken, at the rate the sizes before it reached.
    pub seconds: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TimeBudget {
    pub max_minutes: f64,
    pub sweep_s: f64,
}

/// One pair's key figures: p50 one-way latency at the smallest size measured and the best
/// average bandwidth (`bw`) over the sizes, for the N×N matrix.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PairSummary {
    pub ranks: [usize; 2],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_p50_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_size_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_gbit_per_s: Option<f64>,
    /// The pair's ceiling: its cable's speed (several cables added), or the run's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ceiling_gbit_per_s: Option<f64>,
}

/// Every cable busy at once, both ways.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Concurrent {
    /// The message over the fastest pair; each other pair's is cut to its share by its
    /// measured rate where `sized_by_rate`.
    pub size_bytes: u64,
    pub sized_by_rate: bool,
    pub iters: usize,
    /// Directed (sender, receiver) pairs that moved data at once: twice the linked pairs.
    pub directions: usize,
    /// All bytes every rank sent over the slowest rank's time, 10^9 bit/s.
    pub aggregate_gbit_per_s: f64,
    /// The same divided by `directions`: what each direction of each cable got.
    pub per_direction_gbit_per_s: f64,
    pub wrong_bytes: u64,
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

/// The pairs a run measures: `--pairs` (each with a cable, where the run is over links), else
/// ranks 0 and 1 alone on two ranks, else every pair with a cable (every pair on one network).
fn pairs_to_measure(config: &LinkConfig, ctx: &Context) -> Result<Vec<[usize; 2]>> {
    let size = ctx.size();
    let unlinked: &[[usize; 2]] = ctx
        .network
        .topology
        .as_ref()
        .map_or(&[], |t| t.unlinked.as_slice());
    let pairs: Vec<[usize; 2]> = match &config.pairs {
        Some(asked) => {
            for &[a, b] in asked {
                if b >= size {
                    bail!("--pairs {a}-{b}: this run has ranks 0 to {}", size - 1);
                }
                if unlinked.contains(&[a, b]) {
                    bail!(
                        "--pairs {a}-{b}: ranks {a} ({}) and {b} ({}) have no cable between them (network.topology.unlinked)",
                        ctx.rank_hosts[a], ctx.rank_hosts[b]
                    );
                }
            }
            asked.clone()
        }
        None if size == 2 && !unlinked.contains(&[0, 1]) => vec![[0, 1]],
        None => (0..size)
            .flat_map(|a| (a + 1..size).map(move |b| [a, b]))
            .filter(|p| !unlinked.contains(p))
            .collect(),
    };
    if pairs.is_empty() {
        bail!("no two ranks of this run have a cable between them: nothing to measure");
    }
    Ok(pairs)
}

/// Rank 0's `bytes` on every rank (their length first, then them).
fn from_rank0(ctx: &mut Context, bytes: Vec<u8>) -> Result<Vec<u8>> {
    let mut len = (bytes.len() as u64).to_le_bytes();
    ctx.comm.bcast(0, &mut len)?;
    let mut buf = if ctx.rank() == 0 {
        bytes
    } else {
        vec![0; usize::try_from(u64::from_le_bytes(len))?]
    };
    ctx.comm.bcast(0, &mut buf)?;
    Ok(buf)
}

/// A pair's ceiling over links: the speed its cables report (added up where it has several);
/// None where any cable reports none.
fn pair_ceiling(ctx: &Context, pair: [usize; 2]) -> Option<f64> {
    let cables: Vec<&tbbench_schema::Link> = ctx
        .network
        .links
        .iter()
        .filter(|l| l.ranks == pair)
        .collect();
    if cables.is_empty() {
        return None;
    }
    cables
        .iter()
        .map(|l| {
            let [x, y] = &l.ends;
            match (x.speed_gbit_per_s, y.speed_gbit_per_s) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        })
        .sum()
}

/// The ceiling a pair's rows are held to: `--ceiling` or shm's memcpy as given, else the pair's
/// own cables over links, else the run's interface.
fn ceiling_of(
    ctx: &Context,
    pair: [usize; 2],
    ceiling: Option<f64>,
    source: Option<&str>,
) -> Option<f64> {
    match source {
        Some("flag") | Some("memcpy") => ceiling,
        _ => pair_ceiling(ctx, pair).or(ceiling),
    }
}

/// "links: ring of 4 hosts (m0 m1 m2 m3), 4 cables; measuring 4 pairs; unlinked 0-2, 1-3".
fn topology_line(ctx: &Context, t: &tbbench_schema::Topology, pairs: &[[usize; 2]]) -> String {
    let mut line = format!("links: {}", t.shape);
    if !t.ring.is_empty() {
        line += &format!(" ({})", t.ring.join(" "));
    }
    let cables = ctx
        .network
        .links
        .iter()
        .filter(|l| l.ends[0].link_kind != "loopback")
        .count();
    line += &format!(
        ", {cables} cable(s); measuring {} pair(s) one at a time",
        pairs.len()
    );
    if !t.unlinked.is_empty() {
        let u: Vec<String> = t.unlinked.iter().map(|[a, b]| format!("{a}-{b}")).collect();
        line += &format!("; no cable: {}", u.join(", "));
    }
    line
}

/// Brings the rows of pairs other ranks led to rank 0, which prints their tables in the
/// order measured (its own it printed as they came).
fn gather_rows(
    ctx: &mut Context,
    results: &mut LinkResults,
    pairs: &[[usize; 2]],
    ceiling: Option<f64>,
    source: Option<&str>,
) -> Result<()> {
    let mine = serde_json::to_vec(&(&results.latency, &results.bandwidth, &results.left_out))?;
    let Some(all) = ctx.comm.gather(0, &mine)? else {
        return Ok(());
    };
    for bytes in all.iter().skip(1) {
        let (lat, bw, left): (Vec<LatencyRow>, Vec<BandwidthRow>, Vec<LeftOut>) =
            serde_json::from_slice(bytes)?;
        results.latency.extend(lat);
        results.bandwidth.extend(bw);
        results.left_out.extend(left);
    }
    let order = |p: [usize; 2]| pairs.iter().position(|x| *x == p).unwrap_or(usize::MAX);
    results.latency.sort_by_key(|r| order(r.pair));
    results.bandwidth.sort_by_key(|r| order(r.pair));
    for &pair in pairs.iter().filter(|p| p[0] != 0) {
        let lat: Vec<LatencyRow> = results
            .latency
            .iter()
            .filter(|r| r.pair == pair)
            .cloned()
            .collect();
        if !lat.is_empty() {
            table::print_latency(pair, &lat);
        }
        for mode in [Pattern::Bw, Pattern::Bibw] {
            let bw: Vec<BandwidthRow> = results
                .bandwidth
                .iter()
                .filter(|r| r.pair == pair && r.mode == mode)
                .cloned()
                .collect();
            if !bw.is_empty() {
                let c = ceiling_of(ctx, pair, ceiling, source);
                table::print_bandwidth(mode, pair, c, &bw);
            }
        }
    }
    Ok(())
}

fn summarize(results: &LinkResults, pair: [usize; 2], ctx: &Context) -> PairSummary {
    let lat = results
        .latency
        .iter()
        .filter(|r| r.pair == pair)
        .min_by_key(|r| r.size_bytes);
    let best = results
        .bandwidth
        .iter()
        .filter(|r| r.pair == pair && r.mode == Pattern::Bw)
        .map(|r| r.gbit_per_s.avg)
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
    PairSummary {
        ranks: pair,
        latency_p50_us: lat.map(|r| r.one_way_us.median),
        latency_size_bytes: lat.map(|r| r.size_bytes),
        best_gbit_per_s: best,
        ceiling_gbit_per_s: pair_ceiling(ctx, pair).or(results.ceiling_gbit_per_s),
    }
}

impl Suite for LinkSuite {
    const NAME: &'static str = "link";
    type Config = LinkConfig;
    /// One connection, as iperf3 measures by default: the one-way stream of `--mode bw` gains
    /// nothing from a second connection's pacing timers (one connection measured faster over
    /// loopback under bbr); `--mode bibw` goes the other way, where `--streams 2` is the like
    /// for like of iperf3's `--bidir` (a connection each way). Re-measure: `tbbench link
    /// --mode bw,bibw --sizes 1MiB,16MiB` with `--streams 1` and `2`, under bbr.
    const STREAMS_WHEN_PACED: usize = 1;

    /// Measures the pairs it finds linked: a ring's diagonals are named, not needed.
    fn needs_every_pair(_config: &LinkConfig) -> bool {
        false
    }

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
            pairs: Vec::new(),
            concurrent: None,
            energy: None,
            time_budget: None,
            left_out: Vec::new(),
        };
        let pairs = pairs_to_measure(config, ctx)?;
        let mut budget = harness::Budget::new(config, pairs.len());
        if let (0, Some(b)) = (ctx.rank(), &budget) {
            println!(
                "# iterations per size chosen to fit --max-minutes {} from the rate each size's warm-up measures (--iters fixes them)",
                b.minutes()
            );
        }
        if let (0, Some(tcp)) = (ctx.rank(), ctx.network.tcp_setup()) {
            // TCP's rates follow these (BBR paces even loopback): said before any table.
            println!("# {}, {tcp}", ctx.network.label);
        }
        if let (0, Some(t)) = (ctx.rank(), &ctx.network.topology) {
            println!("# {}", topology_line(ctx, t, &pairs));
        }
        let energy = tbbench_runners::energy::Span::begin(ctx);
        for &pair in &pairs {
            if ctx.rank() == pair[0] || ctx.rank() == pair[1] {
                let ceiling = ceiling_of(ctx, pair, ceiling, source);
                harness::measure_pair(
                    config,
                    ctx,
                    pair,
                    ceiling,
                    source == Some("memcpy"),
                    &mut results,
                    budget.as_mut(),
                )?;
            } else if let Some(b) = budget.as_mut() {
                b.skip_pair();
            }
            // The ranks outside this pair wait here for its whole sweep.
            ctx.comm.barrier_patient()?;
        }
        if ctx.size() > 2 {
            gather_rows(ctx, &mut results, &pairs, ceiling, source)?;
            if ctx.rank() == 0 {
                results.pairs = pairs
                    .iter()
                    .map(|&pair| summarize(&results, pair, ctx))
                    .collect();
            }
            if config.patterns.contains(&Pattern::Bw) {
                // Each pair's measured rate, from rank 0 to all: the shares of every cable at
                // once.
                let mine: Vec<([usize; 2], f64)> = results
                    .pairs
                    .iter()
                    .filter_map(|p| Some((p.ranks, p.best_gbit_per_s?)))
                    .collect();
                let rates: Vec<([usize; 2], f64)> =
                    serde_json::from_slice(&from_rank0(ctx, serde_json::to_vec(&mine)?)?)?;
                results.concurrent = Some(harness::concurrent(config, ctx, &rates)?);
            }
            if ctx.rank() == 0 {
                table::print_matrix(ctx.size(), &results.pairs, results.concurrent.as_ref());
            }
        }
        results.energy = energy.end(ctx)?;
        if ctx.rank() != 0 {
            return Ok(None);
        }
        let checks = vec![harness::payload_check(&results)];
        let mut warnings = harness::noise_warnings(&results);
        if let Some(b) = &budget {
            let (limit, took) = (b.minutes() * 60.0, b.elapsed_s());
            // A size's smallest sweep (a warm-up and two iterations) can outlast its share on
            // a slow link: the sweep then says so, and what would fit.
            if took > limit * 1.25 {
                warnings.push(format!(
                    "the sweep took {took:.0} s, past --max-minutes {} even at the fewest iterations per size: fewer or smaller --sizes fit it",
                    b.minutes()
                ));
            }
            for l in &results.left_out {
                warnings.push(format!(
                    "{} at {} between ranks {} and {} left out: its fewest iterations would take about {:.0} s at the rate the sizes before it reached, more than --max-minutes {} leaves it (--max-minutes, --sizes or --iters measures it)",
                    l.pattern.name(),
                    tbbench_runners::units::format_size(l.size_bytes),
                    l.pair[0],
                    l.pair[1],
                    l.seconds,
                    b.minutes()
                ));
            }
            results.time_budget = Some(TimeBudget {
                max_minutes: b.minutes(),
                sweep_s: took,
            });
        }
        Ok(Some(SuiteOutput {
            results: serde_json::to_value(&results)?,
            checks,
            warnings,
        }))
    }
}
