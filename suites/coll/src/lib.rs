//! `tbbench coll`: collectives (all-reduce, reduce-scatter, all-gather, broadcast, reduce,
//! all-to-all) per algorithm, element type and size, every output element checked, with
//! nccl-tests' figures: time, algorithm bandwidth, bus bandwidth.

pub mod cli;
mod harness;
pub mod input;
pub mod ops;
pub mod peers;
mod table;
pub mod view;

use anyhow::{bail, Result};
use peers::{MlxBackend, Peer, PeerRun};
use serde::{Serialize, Serializer};
use std::path::PathBuf;
use tbbench_runners::comm::{Algo, CollOp, Dtype, ReduceOp};
use tbbench_runners::suite::{Context, Suite, SuiteOutput};
use tbbench_runners::units::format_size;
use tbbench_schema::{Check, Summary};

#[derive(Debug, Clone, Serialize)]
pub struct CollConfig {
    #[serde(serialize_with = "op_names")]
    pub ops: Vec<CollOp>,
    #[serde(serialize_with = "algo_names")]
    pub algos: Vec<Algo>,
    #[serde(serialize_with = "dtype_name")]
    pub dtype: Dtype,
    #[serde(serialize_with = "redop_name")]
    pub redop: ReduceOp,
    /// The root of broadcast and reduce.
    pub root: usize,
    /// Sizes in bytes: the whole array (for reduce-scatter and all-gather, all ranks' blocks).
    pub sizes: Vec<u64>,
    pub iters: usize,
    pub warmup: usize,
    pub in_place: bool,
    /// The link's ceiling in bit/s, when given on the command line.
    pub ceiling_bits_per_s: Option<f64>,
    /// Where the rows also go as CSV.
    pub csv: Option<PathBuf>,
    /// Implementations run after tbbench's own sweep, on the same ranks and network.
    #[serde(serialize_with = "peer_names")]
    pub peers: Vec<Peer>,
    /// MLX's backend for `--peer mlx`; None: the hostfile's, else ring.
    #[serde(serialize_with = "backend_name")]
    pub peer_backend: Option<MlxBackend>,
}

impl Default for CollConfig {
    fn default() -> Self {
        CollConfig {
            ops: vec![CollOp::AllReduce],
            algos: vec![Algo::Auto],
            dtype: Dtype::F32,
            redop: ReduceOp::Sum,
            root: 0,
            sizes: default_sizes(),
            iters: 20,
            warmup: 5,
            in_place: false,
            ceiling_bits_per_s: None,
            csv: None,
            peers: Vec::new(),
            peer_backend: None,
        }
    }
}

/// 8 B to 256 MiB by factors of two, nccl-tests' usual sweep.
pub fn default_sizes() -> Vec<u64> {
    (3..=28).map(|i| 1u64 << i).collect()
}

fn op_names<S: Serializer>(v: &[CollOp], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().map(|o| o.name()))
}
fn algo_names<S: Serializer>(v: &[Algo], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().map(|a| a.name()))
}
fn peer_names<S: Serializer>(v: &[Peer], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().map(|p| p.name()))
}
fn backend_name<S: Serializer>(b: &Option<MlxBackend>, s: S) -> Result<S::Ok, S::Error> {
    match b {
        Some(b) => s.serialize_str(b.name()),
        None => s.serialize_none(),
    }
}
fn dtype_name<S: Serializer>(d: &Dtype, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(d.name())
}
fn redop_name<S: Serializer>(r: &ReduceOp, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(redop_str(*r))
}

pub fn redop_str(r: ReduceOp) -> &'static str {
    match r {
        ReduceOp::Sum => "sum",
        ReduceOp::Max => "max",
        ReduceOp::Min => "min",
    }
}

pub fn parse_redop(s: &str) -> Result<ReduceOp, String> {
    match s.trim() {
        "sum" => Ok(ReduceOp::Sum),
        "max" => Ok(ReduceOp::Max),
        "min" => Ok(ReduceOp::Min),
        other => Err(format!("unknown reduction '{other}' (use sum, max or min)")),
    }
}

/// One measured row: an op by one algorithm at one size.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Whose collective this is: "tbbench", or a peer's ("mlx", "mpi").
    #[serde(rename = "impl")]
    pub implementation: &'static str,
    pub op: &'static str,
    /// The algorithm that ran.
    pub algo: &'static str,
    /// What was asked for: the same, or "auto".
    pub requested: &'static str,
    pub dtype: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redop: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub root: Option<usize>,
    pub in_place: bool,
    /// The array: for reduce-scatter and all-gather all ranks' blocks together.
    pub size_bytes: u64,
    /// Elements, as nccl-tests counts them (per rank for reduce-scatter and all-gather).
    pub count: u64,
    pub iters: usize,
    pub warmup: usize,
    /// Per iteration, the slowest rank's time, microseconds.
    pub time_us: Summary,
    /// size / median time, 10^9 bytes/s.
    pub algbw_gbps: f64,
    /// algbw × nccl-tests' factor for the op and rank count.
    pub busbw_gbps: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub percent_of_ceiling: Option<f64>,
    /// Output elements that differ from the expected value, over all ranks.
    pub wrong: u64,
}

/// The fastest algorithm for one op and size.
#[derive(Debug, Clone, Serialize)]
pub struct Best {
    pub op: &'static str,
    pub size_bytes: u64,
    pub algo: &'static str,
    pub time_us: f64,
    pub busbw_gbps: f64,
}

/// One size of `auto`'s probe: every algorithm's median time, the model's choice and the
/// winner `auto` follows (the fastest, or the model's choice where that is within the
/// probe's margin of it).
#[derive(Debug, Clone, Serialize)]
pub struct Probe {
    pub op: &'static str,
    pub size_bytes: u64,
    pub time_us: serde_json::Map<String, serde_json::Value>,
    pub model: &'static str,
    pub winner: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub struct CollResults {
    pub ranks: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ceiling_gbps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ceiling_source: Option<&'static str>,
    /// What `auto` followed, where it ran.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tuning: Vec<Probe>,
    pub rows: Vec<Row>,
    pub best: Vec<Best>,
    /// The peers run after the sweep (`--peer`): each one's version and backend, or why it
    /// did not run. Their rows are among `rows`, each with its `impl`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<PeerRun>,
    /// The hosts' energy over the whole sweep, or why there is none (reports/README.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub energy: Option<serde_json::Value>,
}

pub struct CollSuite;

impl Suite for CollSuite {
    const NAME: &'static str = "coll";
    type Config = CollConfig;

    /// Runs on a partial cabling: each algorithm that would move data between ranks with no
    /// cable is left out (named where it is the only one asked for), and auto keeps to the
    /// others.
    fn needs_every_pair(_config: &CollConfig) -> bool {
        false
    }

    fn run(config: &CollConfig, ctx: &mut Context) -> Result<Option<SuiteOutput>> {
        let n = ctx.size();
        if config.root >= n {
            bail!(
                "--root {} is not a rank of this run (ranks 0..{})",
                config.root,
                n - 1
            );
        }
        // An algorithm the op lacks, or one that needs a pair of ranks with no cable (a
        // ring's diagonals): named when it is the only one asked for, else left out.
        for op in &config.ops {
            for algo in &config.algos {
                if let Err(e) = harness::runs_here(*op, *algo, config, ctx) {
                    if config.algos.len() == 1 {
                        bail!("{e}");
                    }
                }
            }
        }
        harness::check_memory(config, ctx)?;
        let size_notes = harness::sizes_as_run(config, n)?;
        if ctx.rank() == 0 {
            for note in &size_notes {
                eprintln!("tbbench: note: {note}");
            }
        }
        // Each rank runs one thread, so binding costs nothing and makes small sizes repeatable.
        let pinned = ctx.pin_when_oversubscribed();
        if let (0, Some(p)) = (ctx.rank(), &pinned) {
            eprintln!("tbbench: warning: {p}");
        }
        // Bus bandwidth against the link: GB/s from the interface's Gbit/s (or the flag).
        let (ceiling, source) = match (config.ceiling_bits_per_s, ctx.network.nominal_gbit_per_s) {
            (Some(bits), _) => (Some(bits / 8e9), Some("flag")),
            (None, Some(g)) => (Some(g / 8.0), Some("interface")),
            (None, None) => (None, None),
        };
        let mut results = CollResults {
            ranks: n,
            ceiling_gbps: ceiling,
            ceiling_source: source,
            tuning: Vec::new(),
            rows: Vec::new(),
            best: Vec::new(),
            peers: Vec::new(),
            energy: None,
        };
        let sweep_start = std::time::Instant::now();
        let energy = tbbench_runners::energy::Span::begin(ctx);
        let mut tuner =
            (config.algos.contains(&Algo::Auto) && n > 1).then(|| harness::Tuner::new(config));
        for &op in &config.ops {
            if ctx.rank() == 0 {
                table::header(op, config, ctx, ceiling, source);
            }
            let mut shown = Vec::new();
            let mut probed = Vec::new();
            for &size in &config.sizes {
                if let Some(t) = tuner.as_mut() {
                    probed.extend(t.before_row(op, size, config, ctx)?);
                }
                for &algo in &config.algos {
                    if harness::runs_here(op, algo, config, ctx).is_err() {
                        continue;
                    }
                    let Some(row) = harness::measure(op, algo, size, config, ctx, ceiling)? else {
                        continue;
                    };
                    // Sizes that round to the same array (blocks of whole elements) once.
                    if shown.contains(&(row.size_bytes, algo)) {
                        continue;
                    }
                    shown.push((row.size_bytes, algo));
                    if ctx.rank() == 0 {
                        table::row(&row);
                        results.rows.push(row);
                    }
                }
            }
            if ctx.rank() == 0 {
                table::probed(&probed);
                let best = best_per_size(&results.rows, op);
                table::crossover(&best);
                results.best.extend(best);
            }
        }
        results.tuning = tuner.map(harness::Tuner::into_probes).unwrap_or_default();
        results.energy = energy.end(ctx)?;
        ctx.comm.release_scratch();
        if !config.peers.is_empty() {
            let (runs, rows) = peers::run_all(config, ctx, sweep_start.elapsed(), ceiling)?;
            if ctx.rank() == 0 {
                table::side_by_side(config, &results.best, &runs, &rows);
                results.rows.extend(rows);
                results.peers = runs;
            }
        }
        if ctx.rank() != 0 {
            return Ok(None);
        }
        // A CSV that cannot be written (a full disk) must not lose the run: the result file
        // is still written, and says the export failed in a check of its own (exit 1).
        let csv_failed = config.csv.as_ref().and_then(|path| {
            table::write_csv(path, &results.rows).err().map(|e| {
                let line = format!("--csv {}: {e:#}", path.display());
                eprintln!("tbbench: error: {line}");
                line
            })
        });
        // tbbench's own rows are its verification; each peer's rows are checked as strictly,
        // in a check of their own.
        let mut checks = vec![rows_check(
            "collective results",
            results
                .rows
                .iter()
                .filter(|r| r.implementation == "tbbench"),
        )];
        for p in results.peers.iter().filter(|p| p.ran) {
            checks.push(rows_check(
                &format!("{} results", p.label),
                results
                    .rows
                    .iter()
                    .filter(|r| r.implementation == p.implementation),
            ));
        }
        if let Some(why) = csv_failed {
            checks.push(Check {
                name: "csv export".into(),
                passed: false,
                detail: why,
            });
        }
        // The driver puts the run's own warnings (oversubscription) before these.
        Ok(Some(SuiteOutput {
            results: serde_json::to_value(&results)?,
            checks,
            warnings: pinned
                .into_iter()
                .chain(size_notes)
                .chain(results_peer_warnings(&results.peers))
                .collect(),
        }))
    }
}

/// Whether every element of these rows matched, as one check: the first few rows that did not
/// named.
fn rows_check<'a>(name: &str, rows: impl Iterator<Item = &'a Row>) -> Check {
    let rows: Vec<&Row> = rows.collect();
    let wrong: u64 = rows.iter().map(|r| r.wrong).sum();
    let detail = if wrong == 0 {
        format!(
            "every element of {} rows matched its expected value",
            rows.len()
        )
    } else {
        let bad: Vec<String> = rows
            .iter()
            .filter(|r| r.wrong > 0)
            .take(5)
            .map(|r| {
                format!(
                    "{} {} {} ({} wrong)",
                    r.op,
                    r.algo,
                    format_size(r.size_bytes),
                    r.wrong
                )
            })
            .collect();
        format!("{wrong} wrong elements: {}", bad.join("; "))
    };
    Check {
        name: name.into(),
        passed: wrong == 0,
        detail,
    }
}

/// A peer that did not run (or stopped part way) is a warning in the result file: tbbench's
/// own rows stand.
fn results_peer_warnings(peers: &[PeerRun]) -> Vec<String> {
    peers
        .iter()
        .filter_map(|p| {
            p.why
                .as_ref()
                .map(|w| format!("--peer {}: {w}", p.implementation))
        })
        .collect()
}

/// The fastest algorithm at each size of one op (by median time).
fn best_per_size(rows: &[Row], op: CollOp) -> Vec<Best> {
    let mut best: Vec<Best> = Vec::new();
    for r in rows
        .iter()
        .filter(|r| r.op == op.name() && r.implementation == "tbbench")
    {
        let entry = Best {
            op: r.op,
            size_bytes: r.size_bytes,
            algo: r.algo,
            time_us: r.time_us.median,
            busbw_gbps: r.busbw_gbps,
        };
        match best.iter_mut().find(|b| b.size_bytes == r.size_bytes) {
            Some(b) if entry.time_us < b.time_us => *b = entry,
            Some(_) => {}
            None => best.push(entry),
        }
    }
    best
}
