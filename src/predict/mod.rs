//! `tbbench predict`: what a workload would do on each network the given result files
//! measured (and on published RDMA over Thunderbolt 5), from those files alone. Computation
//! comes from a measured decode or HPL run, communication from the networks' link and coll
//! rows at the sizes the workload sends (model.rs). Reads result files only; runs nothing.

pub mod model;
pub mod view;

use anyhow::{bail, Context, Result};
use model::{Cabling, CollRow, NetworkFigures, PointToPoint};
use serde_json::{json, Value};
use std::path::PathBuf;
use tbbench_infer::decode::model::{Config, Shard, Split};
use tbbench_reports::load::Loaded;
use tbbench_reports::views::network_label;
use tbbench_schema::{Check, Network, ResultFile, RunRecord, Tool};

/// What `tbbench predict` was asked.
pub struct PredictOptions {
    pub inputs: Vec<PathBuf>,
    pub workload: WorkloadSpec,
    pub nodes: Vec<usize>,
    pub algo: Option<String>,
    pub json: Option<PathBuf>,
    pub out: Option<PathBuf>,
}

pub enum WorkloadSpec {
    Shape {
        name: String,
        layers: Option<usize>,
        tensor_parallel: bool,
    },
    Gguf {
        path: PathBuf,
        tensor_parallel: bool,
    },
    Hpl {
        n: usize,
        nb: usize,
    },
}

/// A decode workload as decode result files name it.
struct DecodeWorkload {
    /// `results.model.name` of a decode of this model.
    name: String,
    /// Layers built (a synthetic shape may build fewer than its model has).
    layers: usize,
    cfg: Config,
    tensor_parallel: bool,
    /// Weight bytes one token reads on one rank of `n`, for the weaker compute estimate.
    bytes_per_rank: Box<dyn Fn(usize) -> f64>,
    describe: String,
}

/// One decode result's figures that predictions use.
struct DecodeRun {
    file: String,
    label: String,
    name: String,
    layers: usize,
    parallel: String,
    ranks: usize,
    threads: usize,
    /// Mean ms per generated token.
    step_ms: f64,
    /// Each rank's computation per token (its step less its time in network calls).
    compute_ms: Vec<f64>,
    tokens_per_s: f64,
    /// The fastest rank's measured weight-read bandwidth, bytes/s.
    read_bandwidth: f64,
    /// The cabling it ran on, where it ran over a cluster's cables.
    cabling: Option<Cabling>,
}

struct HplRun {
    file: String,
    label: String,
    ranks: usize,
    /// The cabling it ran on, where it ran over a cluster's cables.
    cabling: Option<Cabling>,
    dgemm_gflops: Option<f64>,
    runs: Vec<(usize, usize, f64, Option<f64>)>,
}

fn f(v: &Value) -> Option<f64> {
    v.as_f64().filter(|x| x.is_finite())
}

fn decode_run(l: &Loaded) -> Option<DecodeRun> {
    let r = &l.result.results;
    let compute: Vec<f64> = r["per_token_compute_ms_per_rank"]
        .as_array()?
        .iter()
        .filter_map(f)
        .collect();
    let step_ms = f(&r["per_token_ms"]["mean"])?;
    Some(DecodeRun {
        file: l.path.display().to_string(),
        label: network_label(&l.result.network),
        name: r["model"]["name"].as_str()?.to_string(),
        layers: r["model"]["layers"].as_u64()? as usize,
        parallel: r["parallel"].as_str().unwrap_or("").to_string(),
        ranks: r["ranks"].as_u64()? as usize,
        threads: r["threads_per_rank"].as_u64().unwrap_or(0) as usize,
        step_ms,
        compute_ms: if compute.is_empty() {
            vec![step_ms]
        } else {
            compute
        },
        tokens_per_s: f(&r["decode_tokens_per_s"])?,
        read_bandwidth: r["read_bandwidth_gb_per_s_per_rank"]
            .as_array()
            .map(|a| a.iter().filter_map(f).fold(0.0, f64::max) * 1e9)
            .unwrap_or(0.0),
        cabling: cabling_of(&l.result.network),
    })
}

/// The cabling a run over a cluster's cables had: a full mesh or a ring, and the most cables
/// any pair has. None for a run over one network or another shape.
fn cabling_of(net: &Network) -> Option<Cabling> {
    let t = net.topology.as_ref()?;
    let mesh = match t.shape.as_str() {
        "full-mesh" => true,
        "ring" => false,
        _ => return None,
    };
    let per_pair = net.links.iter().map(|l| l.cable + 1).max()?;
    Some(Cabling { mesh, per_pair })
}

/// A cluster's cables as a link run over them measured them: one cable's figures (the median
/// pair's by rate; a pair of several cables, its ping-pong's share on each), and what the run
/// was cabled as. Or, for published RDMA over Thunderbolt 5, its figures per cable.
struct Cables {
    label: String,
    source: &'static str,
    file: Option<String>,
    per_cable: PointToPoint,
    cabled_as: Option<Cabling>,
    /// The link run's rank count: "as cabled" is predicted for as many ranks.
    ranks: usize,
    machines: Vec<(String, usize)>,
}

/// The newest link run over a cluster's cables (`--over tcp:links`, verbs:links) among the
/// inputs, as [`Cables`]; then published RDMA over Thunderbolt 5 per cable, where one is.
fn cables(loaded: &[&Loaded]) -> Vec<Cables> {
    let Some(l) = loaded
        .iter()
        .rev()
        .find(|l| l.result.suite == "link" && !l.result.network.links.is_empty())
    else {
        return Vec::new();
    };
    let r = &l.result.results;
    let number = |v: &Value| f(v).unwrap_or(f64::NAN);
    let mut pairs: Vec<Value> = Vec::new();
    for row in r["latency"].as_array().into_iter().flatten() {
        if !pairs.contains(&row["pair"]) {
            pairs.push(row["pair"].clone());
        }
    }
    let mut fits: Vec<PointToPoint> = Vec::new();
    for pair in &pairs {
        let rows = |key: &str| -> Vec<&Value> {
            r[key]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|x| &x["pair"] == pair && x["wrong_bytes"].as_u64().unwrap_or(0) == 0)
                .collect()
        };
        let latency: Vec<(f64, f64)> = rows("latency")
            .iter()
            .map(|x| (number(&x["size_bytes"]), number(&x["one_way_us"]["median"])))
            .filter(|&(s, v)| bad_row(s, v, "us").is_none())
            .collect();
        let bandwidth: Vec<(f64, f64)> = rows("bandwidth")
            .iter()
            .filter(|x| x["mode"] == "bw")
            .map(|x| (number(&x["size_bytes"]), number(&x["gbit_per_s"]["avg"])))
            .filter(|&(s, v)| bad_row(s, v, "Gbit/s").is_none())
            .collect();
        let cables = pair.as_array().map_or(1, |ab| {
            l.result
                .network
                .links
                .iter()
                .filter(|link| {
                    ab.len() == 2
                        && link.ranks[0] as u64 == ab[0].as_u64().unwrap_or(u64::MAX)
                        && link.ranks[1] as u64 == ab[1].as_u64().unwrap_or(u64::MAX)
                })
                .count()
                .max(1)
        });
        // A pair of several cables: its ping-pong stripes each message from STRIPE_MIN up over
        // them, so one cable moved a k-th of such a size in the time measured (and all of a
        // smaller one). Its streaming rows are left out: the link suite's windowed stream
        // keeps to one connection, one cable.
        let fit = if cables > 1 {
            let k = cables as f64;
            let stripe = tbbench_runners::transport::tcp::STRIPE_MIN as f64;
            let per_cable: Vec<(f64, f64)> = latency
                .iter()
                .map(|&(s, t)| if s >= stripe { (s / k, t) } else { (s, t) })
                .collect();
            PointToPoint::fit(&per_cable, &[])
        } else {
            PointToPoint::fit(&latency, &bandwidth)
        };
        fits.extend(fit);
    }
    if fits.is_empty() {
        return Vec::new();
    }
    fits.sort_by(|a, b| a.beta_bytes_per_us.total_cmp(&b.beta_bytes_per_us));
    let per_cable = fits.swap_remove(fits.len() / 2);
    let machines = machines_of(&l.result);
    vec![
        Cables {
            label: network_label(&l.result.network),
            source: "measured",
            file: Some(l.path.display().to_string()),
            per_cable,
            cabled_as: cabling_of(&l.result.network),
            ranks: l.result.ranks.len(),
            machines,
        },
        Cables {
            label: "RDMA over Thunderbolt 5 (published, not measured)".into(),
            source: "published",
            file: None,
            per_cable: PointToPoint::published_rdma_tb5(),
            cabled_as: None,
            ranks: 0,
            machines: Vec::new(),
        },
    ]
}

/// The cablings each rank count is predicted on: the one measured (where it has as many hosts),
/// a full mesh, and (from 4 ranks, where a ring is not a mesh) a ring with one and with two
/// cables per neighbour; for fewer ranks a full mesh with two cables per pair.
fn cablings_for(c: &Cables, n: usize) -> Vec<(String, Cabling)> {
    let mut out: Vec<(String, Cabling)> = Vec::new();
    if let Some(as_cabled) = c.cabled_as.filter(|_| c.ranks == n) {
        out.push((format!("as cabled ({})", as_cabled.name()), as_cabled));
    }
    let mut add = |mesh: bool, per_pair: usize| {
        let cab = Cabling { mesh, per_pair };
        if !out.iter().any(|(_, x)| *x == cab) {
            out.push((cab.name(), cab));
        }
    };
    add(true, 1);
    if n >= 4 {
        add(false, 1);
        add(false, 2);
    } else {
        add(true, 2);
    }
    out
}

fn hpl_run(l: &Loaded) -> HplRun {
    let r = &l.result.results;
    HplRun {
        file: l.path.display().to_string(),
        label: network_label(&l.result.network),
        ranks: l.result.ranks.len(),
        cabling: cabling_of(&l.result.network),
        dgemm_gflops: f(&r["dgemm_gflops_single_rank"]).filter(|g| *g > 0.0),
        runs: r["runs"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|x| x["passed"].as_bool() == Some(true))
                    .filter_map(|x| {
                        Some((
                            x["n"].as_u64()? as usize,
                            x["nb"].as_u64()? as usize,
                            f(&x["gflops"])?,
                            f(&x["efficiency_vs_dgemm"]),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// The largest message size a row may carry (1 TiB), and the longest time (1000 s): a row
/// beyond either, or with a size, time or rate of zero or less, is no measurement.
const MAX_ROW_BYTES: f64 = (1u64 << 40) as f64;
const MAX_ROW_US: f64 = 1e9;

/// Why a row cannot be a measurement, if it cannot.
fn bad_row(size: f64, value: f64, what: &str) -> Option<String> {
    if !(1.0..=MAX_ROW_BYTES).contains(&size) {
        return Some(format!("a row of {size} bytes"));
    }
    let most = if what == "Gbit/s" { 1e6 } else { MAX_ROW_US };
    if !(value > 0.0 && value <= most) {
        return Some(format!("a row of {value} {what} at {size} bytes"));
    }
    None
}

/// Every network the link and coll results measured, newest figures winning, in the order
/// networks first appear; then the published RDMA over Thunderbolt 5 figures. `left_out`
/// gets a line for every file not used whole (a row that is no measurement) and every older
/// file a newer one of the same network replaced, so no input is dropped unsaid.
fn networks(loaded: &[&Loaded], left_out: &mut Vec<String>) -> Vec<NetworkFigures> {
    let mut out: Vec<NetworkFigures> = Vec::new();
    for l in loaded {
        let suite = l.result.suite.as_str();
        if suite != "link" && suite != "coll" {
            continue;
        }
        let label = network_label(&l.result.network);
        let at = match out.iter().position(|n| n.label == label) {
            Some(i) => i,
            None => {
                out.push(NetworkFigures {
                    label: label.clone(),
                    link_kind: l.result.network.link_kind.clone(),
                    source: "measured",
                    ..Default::default()
                });
                out.len() - 1
            }
        };
        let net = &mut out[at];
        let r = &l.result.results;
        let mut used = false;
        if suite == "link" {
            // One pair's rows (the first the file lists): a point-to-point link.
            let pair = &r["latency"][0]["pair"];
            let of_pair = |rows: &Value| -> Vec<Value> {
                rows.as_array()
                    .map(|a| a.iter().filter(|x| &x["pair"] == pair).cloned().collect())
                    .unwrap_or_default()
            };
            let number = |v: &Value| f(v).unwrap_or(f64::NAN);
            let latency: Vec<(f64, f64)> = of_pair(&r["latency"])
                .iter()
                .filter(|x| x["wrong_bytes"].as_u64().unwrap_or(0) == 0)
                .map(|x| (number(&x["size_bytes"]), number(&x["one_way_us"]["median"])))
                .collect();
            let bandwidth: Vec<(f64, f64)> = of_pair(&r["bandwidth"])
                .iter()
                .filter(|x| x["mode"] == "bw" && x["wrong_bytes"].as_u64().unwrap_or(0) == 0)
                .map(|x| (number(&x["size_bytes"]), number(&x["gbit_per_s"]["avg"])))
                .collect();
            let bad = latency
                .iter()
                .find_map(|&(s, v)| bad_row(s, v, "us"))
                .or_else(|| bandwidth.iter().find_map(|&(s, v)| bad_row(s, v, "Gbit/s")));
            if let Some(why) = bad {
                left_out.push(format!(
                    "{}: {why}, which is no measurement",
                    l.path.display()
                ));
                continue;
            }
            if let Some(p) = PointToPoint::fit(&latency, &bandwidth) {
                let this = l.path.display().to_string();
                if let Some(old) = net.link_file.replace(this.clone()) {
                    left_out.push(format!(
                        "{old}: {this} measured the same network later and replaces it"
                    ));
                    net.files.retain(|f| *f != old);
                }
                net.p2p = Some(p);
                used = true;
            }
        } else if let Some(ranks) = r["ranks"].as_u64() {
            let rows: Vec<CollRow> = r["rows"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter(|x| x["wrong"].as_u64().unwrap_or(1) == 0)
                        .filter_map(|x| {
                            Some(CollRow {
                                op: x["op"].as_str()?.to_string(),
                                algo: x["algo"].as_str()?.to_string(),
                                size_bytes: f(&x["size_bytes"]).unwrap_or(f64::NAN),
                                median_us: f(&x["time_us"]["median"]).unwrap_or(f64::NAN),
                            })
                        })
                        .collect()
                })
                .unwrap_or_default();
            if let Some(why) = rows
                .iter()
                .find_map(|x| bad_row(x.size_bytes, x.median_us, "us"))
            {
                left_out.push(format!(
                    "{}: {why}, which is no measurement",
                    l.path.display()
                ));
                continue;
            }
            if !rows.is_empty() {
                // Rows of one op from a newer run replace the older run's rows of that op.
                let slot = net.coll.entry(ranks as usize).or_default();
                let ops: Vec<String> = rows.iter().map(|x| x.op.clone()).collect();
                slot.retain(|x| !ops.contains(&x.op));
                slot.extend(rows);
                used = true;
            }
        }
        if used {
            net.files.push(l.path.display().to_string());
            net.machines = machines_of(&l.result);
        }
    }
    out.retain(|n| n.p2p.is_some() || !n.coll.is_empty());
    out.push(NetworkFigures {
        label: "RDMA over Thunderbolt 5 (published, not measured)".into(),
        link_kind: "rdma".into(),
        source: "published",
        p2p: Some(PointToPoint::published_rdma_tb5()),
        ..Default::default()
    });
    out
}

/// The machines a run used, each once: its host records by hostname (the network lab's
/// namespaces are hosts of their own to the run and one machine here), with their cores.
fn machines_of(r: &ResultFile) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for h in &r.hosts {
        if !out.iter().any(|(name, _)| *name == h.hostname) {
            out.push((h.hostname.clone(), h.cores_logical));
        }
    }
    out
}

/// Where `n` ranks on `net`'s machines would get fewer cores each than the 1-rank basis had
/// threads: its computation scaled by the threads it had over the cores each rank would get,
/// and the line that says so. None where the ranks are not short of cores (or the machines
/// are unknown).
fn share_cores(
    label: &str,
    on: &[(String, usize)],
    n: usize,
    basis_threads: usize,
) -> Option<(f64, String)> {
    let machines = on.len();
    let cores: usize = on.iter().map(|(_, c)| *c).min()?;
    if cores == 0 || basis_threads == 0 {
        return None;
    }
    // Ranks dealt evenly over the machines; a rank's share of its machine's cores may be a
    // fraction of one (4 ranks on 2 cores: half each).
    let per_machine = n.div_ceil(machines);
    let each = cores as f64 / per_machine as f64;
    (each < basis_threads as f64).then(|| {
        let factor = basis_threads as f64 / each;
        (
            factor,
            format!(
                "{n} ranks on the {machines} machine(s) of {label} ({cores} cores) get {each:.2} core(s) each, against the {basis_threads} threads of the 1-rank decode: its computation scaled by {factor:.2}",
            ),
        )
    })
}

/// The computation per token on `n` ranks on `label`'s machines, from `compute_ms`'s basis
/// (ms, where from, the 1-rank basis's threads where it is one): a 1-rank basis divided among
/// ranks that would share a machine's cores is scaled by [`share_cores`], and the line why
/// joins `warnings` once.
fn computation_on(
    (basis_ms, basis_from, basis_threads): (f64, &str, Option<usize>),
    label: &str,
    machines: &[(String, usize)],
    n: usize,
    warnings: &mut Vec<String>,
) -> (f64, String) {
    match basis_threads.and_then(|t| share_cores(label, machines, n, t)) {
        Some((factor, why)) => {
            let from = format!("{basis_from}; {why}");
            if !warnings.contains(&why) {
                warnings.push(why);
            }
            (basis_ms * factor, from)
        }
        None => (basis_ms, basis_from.to_string()),
    }
}

fn decode_workload(spec: &WorkloadSpec) -> Result<Option<DecodeWorkload>> {
    Ok(Some(match spec {
        WorkloadSpec::Shape {
            name,
            layers,
            tensor_parallel,
        } => {
            let (full, approx) = Config::shape(name)?;
            let all = full.layers;
            let built = layers.unwrap_or(all);
            if built == 0 || built > all {
                bail!("--layers {built}: {name} has 1 to {all} layers");
            }
            let mut cfg = full;
            cfg.layers = built;
            let c = cfg.clone();
            let tp = *tensor_parallel;
            DecodeWorkload {
                name: format!("{name} (synthetic)"),
                layers: built,
                describe: format!("{name} ({built} of {all} layers; {approx})"),
                bytes_per_rank: Box::new(move |n| {
                    let split = if tp {
                        Split::Tensor { rank: 0, size: n }
                    } else {
                        // Stages run one after another: one token reads every stage's weights.
                        Split::Tensor { rank: 0, size: 1 }
                    };
                    Shard::synthetic_bytes(&c, split) as f64
                }),
                cfg,
                tensor_parallel: tp,
            }
        }
        WorkloadSpec::Gguf {
            path,
            tensor_parallel,
        } => {
            // The header only: the shape, not the weights (a model may be tens of GB).
            let g = tbbench_infer::decode::gguf::Gguf::open_metadata(path)?;
            let cfg = Config::from_gguf(&g).with_context(|| path.display().to_string())?;
            let bytes = std::fs::metadata(path)?.len() as f64;
            let tp = *tensor_parallel;
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            DecodeWorkload {
                describe: format!("{name} ({} layers, width {})", cfg.layers, cfg.dim),
                name,
                layers: cfg.layers,
                bytes_per_rank: Box::new(move |n| if tp { bytes / n as f64 } else { bytes }),
                cfg,
                tensor_parallel: tp,
            }
        }
        WorkloadSpec::Hpl { .. } => return Ok(None),
    }))
}

/// Per-token computation for `n` ranks, and where it comes from: a decode of this model on
/// `n` ranks (any network: computation does not depend on it), else its 1-rank decode
/// divided as the split divides the work, else weight bytes over a measured read bandwidth
/// (the weaker estimate).
fn compute_ms(
    w: &DecodeWorkload,
    runs: &[DecodeRun],
    n: usize,
) -> Result<(f64, String, Option<usize>)> {
    let split = if w.tensor_parallel { "tp" } else { "pp" };
    let same = |r: &&DecodeRun| r.name == w.name && r.layers == w.layers;
    if let Some(r) = runs
        .iter()
        .rfind(|r| same(r) && r.ranks == n && (n == 1 || r.parallel == split))
    {
        // Tensor-parallel ranks compute at once (the slowest sets the step); pipeline stages
        // one after another (their times add up).
        let (ms, how) = if w.tensor_parallel {
            (
                r.compute_ms.iter().copied().fold(0.0, f64::max),
                "its slowest rank's",
            )
        } else {
            (r.compute_ms.iter().sum(), "its stages' summed")
        };
        return Ok((
            ms,
            format!(
                "measured: a {n}-rank decode of this model over {}, {how} computation ({} threads per rank, {})",
                r.label, r.threads, r.file
            ),
            None,
        ));
    }
    if let Some(r) = runs.iter().rfind(|r| same(r) && r.ranks == 1) {
        let (ms, how) = if w.tensor_parallel {
            (r.step_ms / n as f64, format!("divided by {n} ranks"))
        } else {
            (r.step_ms, "stages run one after another".to_string())
        };
        return Ok((
            ms,
            format!(
                "measured: the 1-rank decode of this model ({} threads, {}), {how}",
                r.threads, r.file
            ),
            (n > 1).then_some(r.threads),
        ));
    }
    if let Some(r) = runs
        .iter()
        .filter(|r| r.read_bandwidth > 0.0)
        .max_by(|a, b| a.read_bandwidth.total_cmp(&b.read_bandwidth))
    {
        let bytes = (w.bytes_per_rank)(n);
        return Ok((
            bytes / r.read_bandwidth * 1e3,
            format!(
                "weaker estimate: {:.0} MB of weights per rank over the {:.1} GB/s read bandwidth {} measured (leaves out attention, norms and caches)",
                bytes / 1e6,
                r.read_bandwidth / 1e9,
                r.file
            ),
            None,
        ));
    }
    bail!(
        "no decode result to take the computation from: give a result of `tbbench infer --gguf/--shape` for this model (1 rank is enough), or of any decode for its read bandwidth"
    )
}

/// The measured rate of the same decode on the same network and rank count, if given.
fn measured_decode(w: &DecodeWorkload, runs: &[DecodeRun], label: &str, n: usize) -> Option<f64> {
    let split = if w.tensor_parallel { "tp" } else { "pp" };
    runs.iter()
        .rfind(|r| {
            r.name == w.name
                && r.layers == w.layers
                && r.ranks == n
                && r.label == label
                && (n == 1 || r.parallel == split)
        })
        .map(|r| r.tokens_per_s)
}

fn decode_predictions(
    w: &DecodeWorkload,
    runs: &[DecodeRun],
    nets: &[NetworkFigures],
    nodes: &[usize],
    algo: Option<&str>,
    warnings: &mut Vec<String>,
) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for &n in nodes {
        if w.tensor_parallel && !w.cfg.tensor_parallel_sizes().contains(&n) {
            bail!(
                "--nodes {n}: tensor parallelism splits heads and feed-forward columns evenly; this model splits over {:?} ranks",
                w.cfg.tensor_parallel_sizes()
            );
        }
        if !w.tensor_parallel && n > w.layers {
            bail!(
                "--nodes {n}: pipeline stages need a layer each; the model has {}",
                w.layers
            );
        }
        let (basis_ms, basis_from, basis_threads) = compute_ms(w, runs, n)?;
        for net in nets {
            if let Some(why) = cannot_hold(net, n) {
                warnings.push(why);
                continue;
            }
            let (compute, compute_from) = computation_on(
                (basis_ms, &basis_from, basis_threads),
                &net.label,
                &net.machines,
                n,
                warnings,
            );
            let Some((comm_us, comm_from)) =
                model::decode_comm_us(net, w.tensor_parallel, n, w.layers, w.cfg.dim, algo)
            else {
                warnings.push(format!(
                    "{}: no link rows and no coll rows at {n} ranks: no prediction for {n} ranks",
                    net.label
                ));
                continue;
            };
            let comm = comm_us / 1e3;
            let tps = 1e3 / (compute + comm).max(1e-9);
            let measured = measured_decode(w, runs, &net.label, n);
            out.push(json!({
                "label": net.label,
                "link_kind": net.link_kind,
                "ranks": n,
                "tokens_per_s": tps,
                "compute_ms_per_token": compute,
                "comm_ms_per_token": comm,
                "source": net.source,
                "compute_from": compute_from,
                "comm_from": comm_from,
                "from_files": net.files,
                "measured_tokens_per_s": measured,
                "measured_over_predicted": measured.map(|m| m / tps),
            }));
        }
    }
    Ok(out)
}

/// The decode on each cabling (`cablings_for`) of each measured set of cables and of
/// published RDMA over Thunderbolt 5: what more cables, a mesh or a ring would buy. Where a
/// decode ran on the same cabling, its rate beside.
fn decode_by_cabling(
    w: &DecodeWorkload,
    runs: &[DecodeRun],
    cables: &[Cables],
    nodes: &[usize],
    warnings: &mut Vec<String>,
) -> Result<Vec<Value>> {
    let split = if w.tensor_parallel { "tp" } else { "pp" };
    let mut out = Vec::new();
    for &n in nodes.iter().filter(|&&n| n > 1) {
        let (basis_ms, basis_from, basis_threads) = compute_ms(w, runs, n)?;
        for c in cables {
            let (compute, compute_from) = computation_on(
                (basis_ms, &basis_from, basis_threads),
                &c.label,
                &c.machines,
                n,
                warnings,
            );
            for (name, cab) in cablings_for(c, n) {
                let comm = model::decode_comm_cabled_us(
                    &c.per_cable,
                    cab,
                    w.tensor_parallel,
                    n,
                    w.layers,
                    w.cfg.dim,
                ) / 1e3;
                let tps = 1e3 / (compute + comm).max(1e-9);
                let measured = (c.source == "measured")
                    .then(|| {
                        runs.iter().rfind(|r| {
                            r.name == w.name
                                && r.layers == w.layers
                                && r.ranks == n
                                && r.parallel == split
                                && r.cabling == Some(cab)
                        })
                    })
                    .flatten()
                    .map(|r| r.tokens_per_s);
                out.push(json!({
                    "cables": c.label,
                    "source": c.source,
                    "cables_from": c.file,
                    "cabling": name,
                    "mesh": cab.mesh,
                    "cables_per_pair": cab.per_pair,
                    "ranks": n,
                    "tokens_per_s": tps,
                    "compute_ms_per_token": compute,
                    "comm_ms_per_token": comm,
                    "compute_from": compute_from,
                    "measured_tokens_per_s": measured,
                    "measured_over_predicted": measured.map(|m| m / tps),
                }));
            }
        }
    }
    Ok(out)
}

/// The per-rank DGEMM rate (Gflops), how much of it one rank's solve reaches, and the line
/// saying where both come from.
fn hpl_basis(hpl: &[HplRun]) -> Result<(f64, f64, String)> {
    // The per-rank DGEMM rate, and how much of it one rank's solve reaches.
    let rate = hpl
        .iter()
        .rev()
        .find_map(|h| h.dgemm_gflops.map(|g| (g, h.file.clone())))
        .context(
            "no hpl result with a DGEMM rate (dgemm_gflops_single_rank): give one from `tbbench hpl`",
        )?;
    let eff = hpl.iter().rev().filter(|h| h.ranks == 1).find_map(|h| {
        h.runs
            .iter()
            .rev()
            .find_map(|r| r.3.map(|e| (e, h.file.clone())))
    });
    let (eff_value, eff_from) = match &eff {
        Some((e, file)) => (
            *e,
            format!(
                "{:.0}% of DGEMM, as the 1-rank solve in {file} reached",
                e * 100.0
            ),
        ),
        None => (
            0.9,
            "90% of DGEMM assumed (no 1-rank hpl result)".to_string(),
        ),
    };
    let basis = format!(
        "{:.1} Gflops DGEMM per rank ({}), {eff_from}",
        rate.0, rate.1
    );
    Ok((rate.0, eff_value, basis))
}

/// The Gflops of the newest passed solve of order `n_size`, block `nb`, among the hpl runs
/// `of` picks.
fn measured_hpl(
    hpl: &[HplRun],
    n_size: usize,
    nb: usize,
    of: impl Fn(&HplRun) -> bool,
) -> Option<f64> {
    hpl.iter().rev().filter(|h| of(h)).find_map(|h| {
        h.runs
            .iter()
            .rev()
            .find(|r| r.0 == n_size && r.1 == nb)
            .map(|r| r.2)
    })
}

/// HPL on each cabling of each set of cables (as [`decode_by_cabling`]), the grid `tbbench hpl`
/// picks; where an hpl solve of the same N and NB ran on the same cabling, its rate beside.
fn hpl_by_cabling(
    n_size: usize,
    nb: usize,
    hpl: &[HplRun],
    cables: &[Cables],
    nodes: &[usize],
    warnings: &mut Vec<String>,
) -> Result<Vec<Value>> {
    let (rate, eff, _) = hpl_basis(hpl)?;
    let flops = tbbench_hpl::check::flops(n_size);
    let mut out = Vec::new();
    for &ranks in nodes.iter().filter(|&&n| n > 1) {
        let grid =
            tbbench_hpl::grid::Grid::squarest(ranks, tbbench_hpl::grid::ProcessMap::RowMajor);
        let compute_s = flops / (ranks as f64 * rate * eff * 1e9);
        for c in cables {
            for (name, cab) in cablings_for(c, ranks) {
                let Some(comm_s) =
                    model::hpl_comm_cabled_s(&c.per_cable, cab, n_size, nb, grid.p, grid.q)
                else {
                    let why = format!(
                        "hpl on a ring of {ranks}: its {}x{} grid has rows or columns of more than two, which a ring does not cable: no prediction",
                        grid.p, grid.q
                    );
                    if !warnings.contains(&why) {
                        warnings.push(why);
                    }
                    continue;
                };
                let gflops = flops / (compute_s + comm_s) / 1e9;
                let measured = (c.source == "measured")
                    .then(|| {
                        measured_hpl(hpl, n_size, nb, |h| {
                            h.ranks == ranks && h.cabling == Some(cab)
                        })
                    })
                    .flatten();
                out.push(json!({
                    "cables": c.label,
                    "source": c.source,
                    "cables_from": c.file,
                    "cabling": name,
                    "mesh": cab.mesh,
                    "cables_per_pair": cab.per_pair,
                    "ranks": ranks,
                    "p": grid.p,
                    "q": grid.q,
                    "gflops": gflops,
                    "compute_s": compute_s,
                    "comm_s": comm_s,
                    "measured_gflops": measured,
                    "measured_over_predicted": measured.map(|m| m / gflops),
                }));
            }
        }
    }
    Ok(out)
}

fn hpl_predictions(
    n_size: usize,
    nb: usize,
    hpl: &[HplRun],
    nets: &[NetworkFigures],
    nodes: &[usize],
    warnings: &mut Vec<String>,
) -> Result<(Vec<Value>, String)> {
    let (rate, eff_value, basis) = hpl_basis(hpl)?;
    let flops = tbbench_hpl::check::flops(n_size);
    let mut out = Vec::new();
    for &ranks in nodes {
        // The grid `tbbench hpl` picks for this many ranks.
        let grid =
            tbbench_hpl::grid::Grid::squarest(ranks, tbbench_hpl::grid::ProcessMap::RowMajor);
        let (p, q) = (grid.p, grid.q);
        let compute_s = flops / (ranks as f64 * rate * eff_value * 1e9);
        for net in nets {
            if let Some(why) = cannot_hold(net, ranks) {
                warnings.push(why);
                continue;
            }
            let Some(comm_s) = model::hpl_comm_s(net, n_size, nb, p, q) else {
                warnings.push(format!("{}: no figures for {ranks} ranks", net.label));
                continue;
            };
            let gflops = flops / (compute_s + comm_s) / 1e9;
            let measured = measured_hpl(hpl, n_size, nb, |h| {
                h.ranks == ranks && h.label == net.label
            });
            out.push(json!({
                "label": net.label,
                "link_kind": net.link_kind,
                "ranks": ranks,
                "p": p,
                "q": q,
                "gflops": gflops,
                "compute_s": compute_s,
                "comm_s": comm_s,
                "source": net.source,
                "from_files": net.files,
                "measured_gflops": measured,
                "measured_over_predicted": measured.map(|m| m / gflops),
            }));
        }
    }
    Ok((out, basis))
}

fn print_table(workload: &str, predictions: &[Value], hpl: bool) {
    println!("# predicted {workload}");
    let width = predictions
        .iter()
        .filter_map(|p| p["label"].as_str().map(str::len))
        .max()
        .unwrap_or(7)
        .max(7);
    let header = if hpl {
        format!(
            "{:<width$} {:>5} {:>5} {:>10} {:>10} {:>9} {:>10} {:>9}",
            "network", "ranks", "PxQ", "Gflops", "compute s", "comm s", "measured", "meas/pred"
        )
    } else {
        format!(
            "{:<width$} {:>5} {:>9} {:>10} {:>9} {:>10} {:>9}",
            "network", "ranks", "tokens/s", "compute ms", "comm ms", "measured", "meas/pred"
        )
    };
    let opt = |v: &Value, d: usize| v.as_f64().map_or("-".to_string(), |x| format!("{x:.d$}"));
    let num = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    let mut ranks_shown = None;
    for p in predictions {
        let label = p["label"].as_str().unwrap_or("");
        let ranks = p["ranks"].as_u64().unwrap_or(0);
        if ranks_shown != Some(ranks) {
            // Each rank count's computation may come from another run: said before its rows.
            if let Some(c) = p["compute_from"].as_str() {
                println!(
                    "# {ranks} rank(s): {:.3} ms computation per token ({c})",
                    num(&p["compute_ms_per_token"])
                );
            }
            if ranks_shown.is_none() || !hpl {
                println!("{header}");
            }
            ranks_shown = Some(ranks);
        }
        if hpl {
            println!(
                "{label:<width$} {ranks:>5} {:>5} {:>10.2} {:>10.3} {:>9.3} {:>10} {:>9}",
                format!("{}x{}", p["p"], p["q"]),
                num(&p["gflops"]),
                num(&p["compute_s"]),
                num(&p["comm_s"]),
                opt(&p["measured_gflops"], 2),
                opt(&p["measured_over_predicted"], 2),
            );
        } else {
            println!(
                "{label:<width$} {ranks:>5} {:>9.2} {:>10.3} {:>9.3} {:>10} {:>9}",
                num(&p["tokens_per_s"]),
                num(&p["compute_ms_per_token"]),
                num(&p["comm_ms_per_token"]),
                opt(&p["measured_tokens_per_s"], 2),
                opt(&p["measured_over_predicted"], 2),
            );
        }
    }
}

/// The predictions by cabling, after the networks' table: per set of cables (the measured
/// ones, then published RDMA over Thunderbolt 5) and rank count, each cabling's figure, and
/// the measured one where a run had that cabling.
fn print_cabling(measured: &Cables, rows: &[Value], hpl: bool) {
    if rows.is_empty() {
        return;
    }
    let p = &measured.per_cable;
    println!();
    println!(
        "# by cabling: one cable as {} measured it ({:.2} us one-way, {:.2} Gbit/s; {}), and published RDMA over Thunderbolt 5",
        measured.label,
        p.alpha_us,
        p.beta_bytes_per_us * 8.0 * 1e6 / 1e9,
        measured.file.as_deref().unwrap_or("")
    );
    let figure = if hpl { "Gflops" } else { "tokens/s" };
    let width = rows
        .iter()
        .filter_map(|r| r["cabling"].as_str().map(str::len))
        .max()
        .unwrap_or(8)
        .max(8);
    let cable_width = rows
        .iter()
        .filter_map(|r| r["cables"].as_str().map(str::len))
        .max()
        .unwrap_or(6);
    println!(
        "{:<cable_width$} {:<width$} {:>5} {:>9} {:>10} {:>9}",
        "cables", "cabling", "ranks", figure, "measured", "meas/pred"
    );
    let opt = |v: &Value| v.as_f64().map_or("-".to_string(), |x| format!("{x:.2}"));
    for r in rows {
        let value = if hpl {
            &r["gflops"]
        } else {
            &r["tokens_per_s"]
        };
        let measured = if hpl {
            &r["measured_gflops"]
        } else {
            &r["measured_tokens_per_s"]
        };
        println!(
            "{:<cable_width$} {:<width$} {:>5} {:>9} {:>10} {:>9}",
            r["cables"].as_str().unwrap_or(""),
            r["cabling"].as_str().unwrap_or(""),
            r["ranks"],
            opt(value),
            opt(measured),
            opt(&r["measured_over_predicted"]),
        );
    }
}

/// Why `net` cannot carry a run of `ranks` at all (so no figure is predicted for it): shared
/// memory joins the ranks of one host, in one segment of at most `shm::MAX_RANKS`.
fn cannot_hold(net: &NetworkFigures, ranks: usize) -> Option<String> {
    let most = tbbench_runners::transport::shm::MAX_RANKS;
    (net.link_kind == "shm" && ranks > most).then(|| {
        format!(
            "{}: shared memory joins at most {most} ranks on one host: no prediction for {ranks} ranks",
            net.label
        )
    })
}

pub fn run(o: &PredictOptions, tool: &Tool) -> Result<i32> {
    if let Some(j) = &o.json {
        tbbench_schema::write::check_writable(j)?;
        if let Some(out) = &o.out {
            tbbench_schema::write::refuse_same_output(("--json", j), ("--out", out))?;
        }
    }
    match &o.out {
        Some(out) => tbbench_schema::write::check_writable(out)?,
        None => tbbench_schema::write::check_folder_writable(std::path::Path::new("results"))?,
    }
    if o.nodes.is_empty() || o.nodes.contains(&0) {
        bail!("--nodes: give one or more rank counts, each at least 1");
    }
    if let Some(n) = o
        .nodes
        .iter()
        .find(|&&n| n > tbbench_runners::launch::MAX_RANKS)
    {
        bail!(
            "--nodes {n}: tbbench runs at most {} ranks, so it predicts no more",
            tbbench_runners::launch::MAX_RANKS
        );
    }
    if let WorkloadSpec::Hpl { n, .. } = &o.workload {
        if let Some(too_many) = o.nodes.iter().find(|&&r| r as u64 > *n as u64) {
            bail!("--nodes {too_many} for hpl --n {n}: every rank needs at least one row of the matrix");
        }
    }
    let started = time::OffsetDateTime::now_utc();
    let known = tbbench_reports::views::known_suites();
    let (mut loaded, problems) = tbbench_reports::load::load_paths(&o.inputs, &known);
    for p in &problems {
        eprintln!("tbbench: predict: left out {p}");
    }
    // Oldest first, so newer figures of one network replace older ones.
    loaded.sort_by(|a, b| a.result.started_at.cmp(&b.result.started_at));
    let refs: Vec<&Loaded> = loaded.iter().collect();
    let mut left_out = Vec::new();
    let nets = networks(&refs, &mut left_out);
    for line in &left_out {
        eprintln!("tbbench: predict: left out {line}");
    }
    let measured_nets = nets.iter().filter(|n| n.source == "measured").count();
    if measured_nets == 0 {
        bail!(
            "no link or coll results among {} usable file(s): give the networks' `tbbench link` and `tbbench coll` results",
            loaded.len()
        );
    }
    let mut warnings = Vec::new();
    let algo = o.algo.as_deref().filter(|a| *a != "auto");
    // What the cables a link run measured would do cabled otherwise.
    let cabled = cables(&refs);
    let by_cabling;
    let (predictions, workload_json, describe, hpl) = match &o.workload {
        WorkloadSpec::Hpl { n, nb } => {
            let runs: Vec<HplRun> = refs
                .iter()
                .filter(|l| l.result.suite == "hpl")
                .map(|l| hpl_run(l))
                .collect();
            let (p, basis) = hpl_predictions(*n, *nb, &runs, &nets, &o.nodes, &mut warnings)?;
            by_cabling = hpl_by_cabling(*n, *nb, &runs, &cabled, &o.nodes, &mut warnings)?;
            (
                p,
                json!({"kind": "hpl", "n": n, "nb": nb, "compute_from": basis,
                       "assumes": "no overlap of communication with the update (a floor on Gflops)"}),
                format!("hpl N={n} NB={nb}: compute from {basis}"),
                true,
            )
        }
        spec => {
            let w = decode_workload(spec)?.expect("a decode workload");
            let runs: Vec<DecodeRun> = refs
                .iter()
                .filter(|l| l.result.suite == "decode")
                .filter_map(|l| decode_run(l))
                .collect();
            let p = decode_predictions(&w, &runs, &nets, &o.nodes, algo, &mut warnings)?;
            by_cabling = decode_by_cabling(&w, &runs, &cabled, &o.nodes, &mut warnings)?;
            let split = if w.tensor_parallel { "tp" } else { "pp" };
            (
                p,
                json!({"kind": "decode", "model": w.name, "layers": w.layers, "dim": w.cfg.dim,
                       "parallel": split, "algo": o.algo.as_deref().unwrap_or("auto")}),
                format!("{split} decode of {}", w.describe),
                false,
            )
        }
    };
    print_table(&describe, &predictions, hpl);
    if let Some(c) = cabled.first() {
        print_cabling(c, &by_cabling, hpl);
    }
    for w in &warnings {
        eprintln!("tbbench: warning: {w}");
    }
    let results = json!({
        "workload": workload_json,
        "predictions": predictions,
        "by_cabling": by_cabling,
        "published": {
            "label": "RDMA over Thunderbolt 5 (published, not measured)",
            "one_way_us": model::PUBLISHED_RDMA_TB5_US,
            "gbit_per_s": model::PUBLISHED_RDMA_TB5_GBIT,
            "source": "perftest -c UC, Apple to Apple: ib_send_lat 64 B, ib_send_bw 64 KiB",
        },
    });
    let mut host = tbbench_runners::sysinfo::this_host();
    host.ranks = vec![0];
    let params = json!({
        "inputs": o.inputs,
        "nodes": o.nodes,
        "algo": o.algo.as_deref().unwrap_or("auto"),
        "workload": results["workload"],
    });
    let result = ResultFile::finished(
        tool,
        started,
        RunRecord {
            suite: "predict".into(),
            params,
            ranks: vec![host.hostname.clone()],
            hosts: vec![host],
            network: Network {
                transport: "none".into(),
                link_kind: "none".into(),
                label: "prediction (no network used)".into(),
                ..Default::default()
            },
            results,
            checks: vec![Check {
                name: "predicted".into(),
                passed: true,
                detail: format!(
                    "{} prediction(s) from {} file(s)",
                    predictions.len(),
                    loaded.len()
                ),
            }],
            warnings,
        },
    );
    let path =
        tbbench_schema::write::write_result_out(o.out.as_deref(), "predict", started, &result)?;
    println!("result: {}", path.display());
    if let Some(j) = &o.json {
        let doc = json!({
            tbbench_reports::load::NOT_A_RESULT_MARKER: "predict",
            "workload": result.results["workload"],
            "predictions": result.results["predictions"],
            "by_cabling": result.results["by_cabling"],
        });
        let mut b = serde_json::to_vec_pretty(&doc)?;
        b.push(b'\n');
        tbbench_schema::write::write_atomic(j, &b)?;
    }
    Ok(0)
}
