//! The coll suite's report view: bus bandwidth against size per network and algorithm (with
//! the link's ceiling, and published Mac figures as labelled reference lines), small-message
//! time, and the crossover table: which algorithm wins at each size on each network.

use serde::Deserialize;
use serde_json::json;
use tbbench_reports::chart::{self, size_label, LineChart, Series, XAxis};
use tbbench_reports::html::{self, Cell};
use tbbench_reports::load::Loaded;
use tbbench_reports::metrics::{Better, Metric};
use tbbench_reports::views::{network_id, series_names, SuiteView};
use tbbench_schema::{ResultFile, Summary};

/// The report views of the results this crate writes (suite "coll").
pub fn views() -> Vec<Box<dyn SuiteView>> {
    vec![Box::new(CollView)]
}

pub struct CollView;

#[derive(Debug, Deserialize)]
struct CollResults {
    ranks: usize,
    #[serde(default)]
    ceiling_gbps: Option<f64>,
    #[serde(default)]
    ceiling_source: Option<String>,
    rows: Vec<Row>,
    #[serde(default)]
    best: Vec<Best>,
    /// The peers run beside tbbench (`--peer`); older files have none.
    #[serde(default)]
    peers: Vec<PeerRun>,
}

#[derive(Debug, Deserialize)]
struct PeerRun {
    #[serde(rename = "impl")]
    implementation: String,
    label: String,
    ran: bool,
}

#[derive(Debug, Deserialize)]
struct Row {
    /// "tbbench", or the peer's ("mlx", "mpi"); older files: tbbench.
    #[serde(rename = "impl", default = "tbbench")]
    implementation: String,
    op: String,
    algo: String,
    #[serde(default)]
    requested: Option<String>,
    dtype: String,
    size_bytes: u64,
    time_us: Summary,
    busbw_gbps: f64,
    wrong: u64,
}

#[derive(Debug, Deserialize)]
struct Best {
    op: String,
    size_bytes: u64,
    algo: String,
    time_us: f64,
    busbw_gbps: f64,
}

/// Figures published for two M3 Ultra Mac Studios over Thunderbolt 5 (all-reduce of f32 sums;
/// busbw equals algbw on 2 ranks): reference lines on 2-rank all-reduce charts, never
/// mistaken for measurements.
const PUBLISHED_ALL_REDUCE_2_RANKS: [(&str, f64); 2] = [
    (
        "JACCL mesh, 1 TB5 cable, 512 MB (published, not measured)",
        9.31,
    ),
    ("jaccl-ring, 3 TB5 cables (published, not measured)", 15.46),
];

fn tbbench() -> String {
    "tbbench".into()
}

impl CollResults {
    /// What a row's series is called: tbbench's algorithm, or the peer's label ("MLX ring",
    /// "Open MPI v4.1.4").
    fn series_label(&self, r: &Row) -> String {
        if r.implementation == "tbbench" {
            return r.algo.clone();
        }
        self.peers
            .iter()
            .find(|p| p.implementation == r.implementation)
            .map_or_else(|| r.implementation.clone(), |p| p.label.clone())
    }
}

fn parse(r: &ResultFile) -> Result<CollResults, String> {
    CollResults::deserialize(&r.results).map_err(|e| format!("coll results unreadable: {e}"))
}

/// Rows measured with an algorithm named (auto's rows repeat one of them).
fn explicit(r: &Row) -> bool {
    r.requested.as_deref().unwrap_or(&r.algo) != "auto"
}

fn ops_of(parsed: &[CollResults]) -> Vec<String> {
    let mut ops: Vec<String> = Vec::new();
    for p in parsed {
        for r in &p.rows {
            if !ops.contains(&r.op) {
                ops.push(r.op.clone());
            }
        }
    }
    ops
}

impl SuiteView for CollView {
    fn suite(&self) -> &'static str {
        "coll"
    }

    fn title(&self) -> &'static str {
        "Collectives: bus bandwidth and time per algorithm"
    }

    fn check(&self, r: &ResultFile) -> Result<(), String> {
        let c = parse(r)?;
        if c.rows.is_empty() {
            return Err("coll result has no rows".into());
        }
        Ok(())
    }

    /// Per op, the fastest algorithm's time at the smallest size and bus bandwidth at the
    /// largest: what latency-bound and bandwidth-bound work pays.
    fn metrics(&self, r: &ResultFile) -> Vec<Metric> {
        let Ok(c) = parse(r) else { return vec![] };
        let mut out = Vec::new();
        for (i, op) in ops_of(std::slice::from_ref(&c)).iter().enumerate() {
            let best: Vec<&Best> = c.best.iter().filter(|b| &b.op == op).collect();
            let spread_of = |b: &Best| {
                c.rows
                    .iter()
                    .find(|r| r.op == b.op && r.size_bytes == b.size_bytes && r.algo == b.algo)
                    .map_or(0.0, |r| r.time_us.stdev)
            };
            if let Some(b) = best.iter().min_by_key(|b| b.size_bytes) {
                out.push(Metric::new(
                    r,
                    "time",
                    // The rank count is part of what was measured: compare and history join
                    // only runs of the same count.
                    &format!(
                        "{op} {}, {} ranks",
                        size_label(b.size_bytes as f64),
                        c.ranks
                    ),
                    "us",
                    Better::Lower,
                    b.time_us,
                    spread_of(b),
                    i == 0,
                ));
            }
            if let Some(b) = best.iter().max_by_key(|b| b.size_bytes) {
                let rel = spread_of(b) / b.time_us.max(1e-9);
                out.push(Metric::new(
                    r,
                    "busbw",
                    &format!(
                        "{op} {}, {} ranks",
                        size_label(b.size_bytes as f64),
                        c.ranks
                    ),
                    "GB/s",
                    Better::Higher,
                    b.busbw_gbps,
                    b.busbw_gbps * rel,
                    i == 0,
                ));
            }
            // Each peer's figures at the same two sizes, so compare lines them up too.
            for p in c.peers.iter().filter(|p| p.ran) {
                let theirs: Vec<&Row> = c
                    .rows
                    .iter()
                    .filter(|r| &r.op == op && r.implementation == p.implementation)
                    .collect();
                let (Some(lo), Some(hi)) = (
                    theirs.iter().min_by_key(|r| r.size_bytes),
                    theirs.iter().max_by_key(|r| r.size_bytes),
                ) else {
                    continue;
                };
                let named = |r: &Row| {
                    format!(
                        "{op} {}, {} ranks, {}",
                        size_label(r.size_bytes as f64),
                        c.ranks,
                        p.label
                    )
                };
                out.push(Metric::new(
                    r,
                    "time",
                    &named(lo),
                    "us",
                    Better::Lower,
                    lo.time_us.median,
                    lo.time_us.stdev,
                    false,
                ));
                out.push(Metric::new(
                    r,
                    "busbw",
                    &named(hi),
                    "GB/s",
                    Better::Higher,
                    hi.busbw_gbps,
                    hi.busbw_gbps * hi.time_us.stdev / hi.time_us.median.max(1e-9),
                    false,
                ));
            }
        }
        out
    }

    fn section(&self, runs: &[&Loaded]) -> (String, serde_json::Value) {
        // A collective's figures depend on the rank count as much as on the network: the
        // newest run of each (network, ranks), named with both.
        let mut shown: Vec<&Loaded> = Vec::new();
        for r in runs {
            let id = (network_id(&r.result), r.result.ranks.len());
            match shown
                .iter_mut()
                .find(|o| (network_id(&o.result), o.result.ranks.len()) == id)
            {
                Some(slot) => *slot = r,
                None => shown.push(r),
            }
        }
        let names: Vec<String> = series_names(&shown)
            .into_iter()
            .zip(&shown)
            .map(|(n, r)| format!("{n}, {} ranks", r.result.ranks.len()))
            .collect();
        let parsed: Vec<CollResults> = shown
            .iter()
            .map(|r| parse(&r.result).expect("checked at load"))
            .collect();
        let mut body = String::new();
        if shown.len() > 1 {
            body.push_str(&format!(
                "<p>{} networks and rank counts side by side (the newest run of each). Bus bandwidth (busbw) \
                 is nccl-tests' figure: the array's size over the time, times 2(n−1)/n for \
                 all-reduce, (n−1)/n for reduce-scatter, all-gather and all-to-all, 1 for \
                 broadcast and reduce, so it compares with the link's own rate.</p>\n",
                shown.len()
            ));
        }
        let mut data = Vec::new();
        for op in ops_of(&parsed) {
            body.push_str(&format!("<h3>{}</h3>\n", html::escape(&op)));
            let mut bw_series = Vec::new();
            let mut time_series = Vec::new();
            let mut hlines = Vec::new();
            let mut colour = 0;
            for (name, c) in names.iter().zip(&parsed) {
                // tbbench's algorithms, then each peer: one series each.
                let mut algos: Vec<(&str, &str)> = Vec::new();
                for r in c.rows.iter().filter(|r| r.op == op && explicit(r)) {
                    let key = (r.implementation.as_str(), r.algo.as_str());
                    if !algos.contains(&key) {
                        algos.push(key);
                    }
                }
                for (imp, algo) in algos {
                    let rows: Vec<&Row> = c
                        .rows
                        .iter()
                        .filter(|r| {
                            r.op == op && r.implementation == imp && r.algo == algo && explicit(r)
                        })
                        .collect();
                    let algo = c.series_label(rows[0]);
                    bw_series.push(Series {
                        name: format!("{name} {algo}"),
                        points: rows
                            .iter()
                            .map(|r| (r.size_bytes as f64, r.busbw_gbps))
                            .collect(),
                        colour: Some(colour),
                        ..Default::default()
                    });
                    let small: Vec<&&Row> =
                        rows.iter().filter(|r| r.size_bytes <= 64 << 10).collect();
                    if !small.is_empty() {
                        time_series.push(Series {
                            name: format!("{name} {algo}"),
                            points: small
                                .iter()
                                .map(|r| (r.size_bytes as f64, r.time_us.median))
                                .collect(),
                            band: small
                                .iter()
                                .map(|r| (r.size_bytes as f64, r.time_us.median, r.time_us.p99))
                                .collect(),
                            colour: Some(colour),
                            ..Default::default()
                        });
                    }
                    colour += 1;
                    for r in rows {
                        data.push(json!({
                            "network": name, "op": op, "impl": r.implementation, "algo": r.algo, "dtype": r.dtype,
                            "ranks": c.ranks, "size_bytes": r.size_bytes,
                            "time_us_median": r.time_us.median, "time_us_p99": r.time_us.p99,
                            "busbw_gbps": r.busbw_gbps, "wrong": r.wrong,
                        }));
                    }
                }
                if let Some(ceiling) = c.ceiling_gbps {
                    let source = c.ceiling_source.as_deref().unwrap_or("ceiling");
                    hlines.push((
                        format!("{name}: link ceiling {ceiling:.2} GB/s ({source})"),
                        ceiling,
                    ));
                }
            }
            if op == "all-reduce" && parsed.iter().any(|c| c.ranks == 2) {
                for (label, gbps) in PUBLISHED_ALL_REDUCE_2_RANKS {
                    hlines.push((label.to_string(), gbps));
                }
            }
            if !bw_series.is_empty() {
                body.push_str(&chart::line_chart(&LineChart {
                    title: format!("{op}: bus bandwidth vs size"),
                    x_label: "size (whole array)".into(),
                    y_label: "busbw (GB/s)".into(),
                    x: XAxis::Bytes,
                    log_y: true,
                    series: bw_series,
                    hlines,
                }));
            }
            if !time_series.is_empty() {
                body.push_str(&chart::line_chart(&LineChart {
                    title: format!("{op}: time at small sizes (median, band to p99)"),
                    x_label: "size (whole array)".into(),
                    y_label: "time (µs)".into(),
                    x: XAxis::Bytes,
                    log_y: true,
                    series: time_series,
                    hlines: vec![],
                }));
            }
            body.push_str(&crossover_table(&op, &names, &parsed));
            body.push_str(&peers_table(&op, &names, &parsed));
        }
        (body, json!({ "networks": names, "rows": data }))
    }
}

/// A row per size and a column per network: the fastest algorithm there, its busbw and time.
fn crossover_table(op: &str, names: &[String], parsed: &[CollResults]) -> String {
    let mut sizes: Vec<u64> = parsed
        .iter()
        .flat_map(|c| c.best.iter().filter(|b| b.op == op).map(|b| b.size_bytes))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.is_empty() {
        return String::new();
    }
    let mut headers: Vec<String> = vec!["size".into()];
    for n in names {
        headers.push(format!("{n} fastest"));
        headers.push(format!("{n} busbw GB/s"));
        headers.push(format!("{n} time µs"));
    }
    let rows = sizes
        .iter()
        .map(|&s| {
            let mut row: Vec<Cell> = vec![Cell::from(size_label(s as f64))];
            for c in parsed {
                let b = c.best.iter().find(|b| b.op == op && b.size_bytes == s);
                row.push(Cell::from(b.map_or("-".to_string(), |b| b.algo.clone())));
                row.push(html::opt_num(b.map(|b| b.busbw_gbps), 3));
                row.push(html::opt_num(b.map(|b| b.time_us), 2));
            }
            row
        })
        .collect();
    let h: Vec<&str> = headers.iter().map(|s| s.as_str()).collect();
    format!(
        "<details open><summary>{}: the fastest algorithm at each size</summary>{}</details>\n",
        html::escape(op),
        html::table("crossover", &h, rows)
    )
}

/// tbbench beside the peers (`--peer`), per network: at each size tbbench's fastest
/// algorithm's median time and each peer's, with the peer's time over tbbench's (above 1:
/// tbbench is faster). Empty where no run has a peer.
fn peers_table(op: &str, names: &[String], parsed: &[CollResults]) -> String {
    if !parsed.iter().any(|c| c.peers.iter().any(|p| p.ran)) {
        return String::new();
    }
    let mut headers: Vec<String> = vec!["size".into()];
    let mut columns: Vec<(usize, Option<&PeerRun>)> = Vec::new();
    for (i, (n, c)) in names.iter().zip(parsed).enumerate() {
        headers.push(format!("{n}: tbbench µs"));
        columns.push((i, None));
        for p in c.peers.iter().filter(|p| p.ran) {
            headers.push(format!("{n}: {} µs", p.label));
            headers.push(format!("{n}: {} ÷ tbbench", p.label));
            columns.push((i, Some(p)));
        }
    }
    let mut sizes: Vec<u64> = parsed
        .iter()
        .flat_map(|c| c.best.iter().filter(|b| b.op == op).map(|b| b.size_bytes))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let rows = sizes
        .iter()
        .map(|&s| {
            let mut row: Vec<Cell> = vec![Cell::from(size_label(s as f64))];
            for (i, peer) in &columns {
                let c = &parsed[*i];
                let ours = c
                    .best
                    .iter()
                    .find(|b| b.op == op && b.size_bytes == s)
                    .map(|b| b.time_us);
                match peer {
                    None => row.push(html::opt_num(ours, 2)),
                    Some(p) => {
                        let theirs = c
                            .rows
                            .iter()
                            .find(|r| {
                                r.op == op
                                    && r.implementation == p.implementation
                                    && r.size_bytes == s
                            })
                            .map(|r| r.time_us.median);
                        row.push(html::opt_num(theirs, 2));
                        row.push(html::opt_num(
                            theirs.zip(ours).map(|(t, o)| t / o.max(1e-9)),
                            2,
                        ));
                    }
                }
            }
            row
        })
        .collect();
    let h: Vec<&str> = headers.iter().map(|s| s.as_str()).collect();
    format!(
        "<details open><summary>{}: tbbench beside MLX and MPI (median time; ÷: the peer's time over tbbench's fastest algorithm's)</summary>{}</details>\n",
        html::escape(op),
        html::table("peers", &h, rows)
    )
}
