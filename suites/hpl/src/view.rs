//! The HPL suite's view: Gflops per run with PASSED/FAILED up front, efficiency against the
//! DGEMM rate, where the time went (communication vs computation), and scaling with ranks.

use serde::Deserialize;
use serde_json::json;
use std::collections::BTreeMap;
use tbbench_reports::chart::{self, BarChart, LineChart, Series, XAxis};
use tbbench_reports::html::{self, num, opt_num, verdict, Cell};
use tbbench_reports::load::Loaded;
use tbbench_reports::metrics::{Better, Metric};
use tbbench_reports::views::{series_names, short_time, SuiteView};
use tbbench_schema::ResultFile;

/// The report views of the results this crate writes (suite "hpl").
pub fn views() -> Vec<Box<dyn SuiteView>> {
    vec![Box::new(HplView)]
}

pub struct HplView;

#[derive(Debug, Deserialize)]
struct HplResults {
    #[serde(default)]
    dgemm_gflops_single_rank: Option<f64>,
    runs: Vec<Run>,
}

/// One solve as hpl and hpl-mxp record it (hpl-mxp's `iterations`; hpl's efficiency,
/// product, energy and split), for both views.
#[derive(Debug, Deserialize)]
pub(crate) struct Run {
    pub(crate) code: String,
    pub(crate) n: u64,
    pub(crate) nb: u64,
    pub(crate) p: u64,
    pub(crate) q: u64,
    pub(crate) time_s: f64,
    pub(crate) gflops: f64,
    pub(crate) resid: f64,
    #[serde(default = "default_threshold")]
    threshold: f64,
    pub(crate) passed: bool,
    #[serde(default)]
    efficiency_vs_dgemm: Option<f64>,
    /// The trailing update's product (absent in results from before it was recorded).
    #[serde(default)]
    product: Option<String>,
    /// Absent where the hosts' energy was not read.
    #[serde(default)]
    gflops_per_watt: Option<f64>,
    #[serde(default)]
    per_rank: Vec<Split>,
    /// hpl-mxp: GMRES iterations.
    #[serde(default)]
    pub(crate) iterations: Option<u64>,
}

fn default_threshold() -> f64 {
    16.0
}

#[derive(Debug, Default, Clone, Deserialize)]
struct Split {
    #[serde(default)]
    panel: f64,
    #[serde(default)]
    broadcast: f64,
    #[serde(default)]
    swap: f64,
    /// Row swaps and U12's solve fused (one process row, tbbench's tiles): local work.
    #[serde(default)]
    swap_solve: f64,
    #[serde(default)]
    update: f64,
    #[serde(default)]
    solve: f64,
}

impl Split {
    fn total(&self) -> f64 {
        self.panel + self.broadcast + self.swap + self.swap_solve + self.update + self.solve
    }
    fn communication(&self) -> f64 {
        self.broadcast + self.swap
    }
}

impl Run {
    pub(crate) fn config(&self) -> String {
        format!(
            "{} N={} NB={} {}x{}",
            self.code, self.n, self.nb, self.p, self.q
        )
    }
    /// The rank that took longest: the one whose time the run's time is.
    fn slowest(&self) -> Split {
        self.per_rank
            .iter()
            .max_by(|a, b| a.total().total_cmp(&b.total()))
            .cloned()
            .unwrap_or_default()
    }
}

/// "0.18 s", "1057 s": a solve's time for a label.
fn short_seconds(s: f64) -> String {
    if s < 10.0 {
        format!("{s:.2} s")
    } else {
        format!("{s:.0} s")
    }
}

/// Each passing solve's Gflops, for compare (hpl and hpl-mxp): a FAILED solve has no
/// meaningful speed, and compare reports the failure itself.
pub(crate) fn gflops_metrics(r: &ResultFile, runs: &[Run]) -> Vec<Metric> {
    runs.iter()
        .filter(|x| x.passed)
        .map(|x| {
            Metric::new(
                r,
                "Gflops",
                &x.config(),
                "Gflops",
                Better::Higher,
                x.gflops,
                0.0,
                true,
            )
        })
        .collect()
}

fn parse(r: &ResultFile) -> Result<HplResults, String> {
    HplResults::deserialize(&r.results).map_err(|e| format!("hpl results unreadable: {e}"))
}

impl SuiteView for HplView {
    fn suite(&self) -> &'static str {
        "hpl"
    }

    fn title(&self) -> &'static str {
        "HPL: distributed FP64 LU solve"
    }

    fn check(&self, r: &ResultFile) -> Result<(), String> {
        let h = parse(r)?;
        if h.runs.is_empty() {
            return Err("hpl result has no runs".into());
        }
        Ok(())
    }

    fn metrics(&self, r: &ResultFile) -> Vec<Metric> {
        let Ok(h) = parse(r) else { return vec![] };
        gflops_metrics(r, &h.runs)
    }

    /// The update's product each run ran, per NB (it is chosen per NB): timed against the BLAS
    /// at start, so two runs of one build may differ in it, and their Gflops with it.
    fn setup(&self, r: &ResultFile) -> Vec<(String, String)> {
        let Ok(h) = parse(r) else { return vec![] };
        h.runs
            .into_iter()
            .filter_map(|x| {
                let what = format!("the trailing update's product at NB {}", x.nb);
                x.product.map(|p| (what, p))
            })
            .collect()
    }

    fn section(&self, runs: &[&Loaded]) -> (String, serde_json::Value) {
        let parsed: Vec<HplResults> = runs
            .iter()
            .map(|r| parse(&r.result).expect("checked at load"))
            .collect();
        let names = series_names(runs);
        let mut body = String::new();

        let total: usize = parsed.iter().map(|h| h.runs.len()).sum();
        let failed: usize = parsed
            .iter()
            .map(|h| h.runs.iter().filter(|x| !x.passed).count())
            .sum();
        body.push_str(&format!(
            "<p class=\"verdicts\">{} {} of {total} solves passed HPL's residual check{}</p>\n",
            if failed == 0 {
                "<span class=\"pass\">PASSED</span>"
            } else {
                "<span class=\"fail\">FAILED</span>"
            },
            total - failed,
            if failed > 0 {
                format!("; <strong>{failed} FAILED</strong>: their Gflops do not count")
            } else {
                String::new()
            }
        ));

        // Every solve.
        let mut rows = Vec::new();
        let mut data_runs = Vec::new();
        for ((l, h), name) in runs.iter().zip(&parsed).zip(&names) {
            for x in &h.runs {
                let s = x.slowest();
                let comm = if s.total() > 0.0 {
                    Some(s.communication() / s.total() * 100.0)
                } else {
                    None
                };
                rows.push(vec![
                    Cell::from(short_time(&l.result.started_at)),
                    Cell::from(name.as_str()),
                    Cell::Num(l.result.ranks.len().to_string()),
                    Cell::Num(x.n.to_string()),
                    Cell::Num(x.nb.to_string()),
                    Cell::from(format!("{}×{}", x.p, x.q)),
                    Cell::from(x.code.as_str()),
                    num(x.time_s, 2),
                    num(x.gflops, 2),
                    opt_num(x.efficiency_vs_dgemm.map(|e| e * 100.0), 1),
                    opt_num(x.gflops_per_watt, 2),
                    opt_num(comm, 1),
                    Cell::from(format!("{:.4e}", x.resid)),
                    verdict(x.passed),
                ]);
                data_runs.push(json!({
                    "started_at": l.result.started_at, "network": name, "ranks": l.result.ranks.len(),
                    "n": x.n, "nb": x.nb, "p": x.p, "q": x.q, "code": x.code, "time_s": x.time_s,
                    "gflops": x.gflops, "efficiency_vs_dgemm": x.efficiency_vs_dgemm,
                    "product": x.product,
                    "gflops_per_watt": x.gflops_per_watt,
                    "dgemm_gflops_single_rank": h.dgemm_gflops_single_rank,
                    "resid": x.resid, "threshold": x.threshold, "passed": x.passed,
                    "slowest_rank_s": {"panel": s.panel, "broadcast": s.broadcast, "swap": s.swap,
                                        "swap_solve": s.swap_solve, "update": s.update, "solve": s.solve},
                    "communication_percent": comm,
                }));
            }
        }
        body.push_str(&html::table(
            "hpl-runs",
            &[
                "started",
                "network",
                "ranks",
                "N",
                "NB",
                "P×Q",
                "variant",
                "time s",
                "Gflops",
                "% of DGEMM",
                "Gflops/W",
                "% comm",
                "resid",
                "check",
            ],
            rows,
        ));
        body.push_str(
            "<p class=\"meta\">% of DGEMM: Gflops over (ranks × the single-rank DGEMM rate \
             measured at start). Gflops/W: over the hosts' package energy during the solve, where \
             their counters were read. % comm: broadcast + row swaps as a share of the slowest \
             rank's time.</p>\n",
        );

        // Newest passing solve per (network, configuration): the side-by-side figures.
        let mut newest: BTreeMap<(String, String), (usize, &Run)> = BTreeMap::new();
        let mut order: Vec<(String, String)> = Vec::new();
        for (i, h) in parsed.iter().enumerate() {
            for x in h.runs.iter().filter(|x| x.passed) {
                let k = (names[i].clone(), x.config());
                if !newest.contains_key(&k) {
                    order.push(k.clone());
                }
                newest.insert(k, (i, x));
            }
        }
        let mut configs: Vec<String> = order.iter().map(|k| k.1.clone()).collect();
        configs.dedup();
        configs.sort();
        configs.dedup();
        let mut nets: Vec<String> = order.iter().map(|k| k.0.clone()).collect();
        nets.dedup();
        let mut seen = Vec::new();
        nets.retain(|n| {
            let fresh = !seen.contains(n);
            seen.push(n.clone());
            fresh
        });
        if !configs.is_empty() {
            let series = nets
                .iter()
                .map(|n| {
                    let vals = configs
                        .iter()
                        .map(|c| newest.get(&(n.clone(), c.clone())).map(|(_, x)| x.gflops))
                        .collect();
                    (n.clone(), vals)
                })
                .collect();
            body.push_str(&chart::bar_chart(&BarChart {
                title: "Gflops per configuration, networks side by side".into(),
                y_label: "Gflops".into(),
                categories: configs.clone(),
                series,
                stacked: false,
            }));

            // Where the time went, slowest rank of each shown solve, as shares of its time:
            // solves of 0.2 s and of 1000 s side by side, each bar whole (its seconds are in
            // its label).
            let shown: Vec<&(String, String)> = order.iter().collect();
            let splits: Vec<Split> = shown.iter().map(|k| newest[*k].1.slowest()).collect();
            let cats: Vec<String> = shown
                .iter()
                .zip(&splits)
                .map(|(k, sp)| {
                    let name = if nets.len() > 1 {
                        format!("{} · {}", k.1, k.0)
                    } else {
                        k.1.clone()
                    };
                    format!("{name} ({})", short_seconds(sp.total()))
                })
                .collect();
            let part = |f: fn(&Split) -> f64| {
                splits
                    .iter()
                    .map(|s| (s.total() > 0.0).then(|| 100.0 * f(s) / s.total()))
                    .collect()
            };
            body.push_str(&chart::bar_chart(&BarChart {
                title:
                    "Time split of the slowest rank: communication vs computation (% of its time)"
                        .into(),
                y_label: "% of the slowest rank's time".into(),
                categories: cats,
                series: vec![
                    ("update (DTRSM+DGEMM)".into(), part(|s| s.update)),
                    (
                        "row swaps + DTRSM, fused (local)".into(),
                        part(|s| s.swap_solve),
                    ),
                    ("panel factorization".into(), part(|s| s.panel)),
                    ("solve".into(), part(|s| s.solve)),
                    ("broadcast (comm)".into(), part(|s| s.broadcast)),
                    ("row swaps (comm)".into(), part(|s| s.swap)),
                ],
                stacked: true,
            }));
        }

        // Scaling with the number of ranks, per network and matrix size N, where several
        // counts exist: a line across different N would mix problem sizes with rank counts.
        let mut by_net: BTreeMap<(String, u64), BTreeMap<u64, f64>> = BTreeMap::new();
        for ((l, h), _) in runs.iter().zip(&parsed).zip(&names) {
            let net = tbbench_reports::views::network_label(&l.result.network);
            for x in h.runs.iter().filter(|x| x.passed) {
                let e = by_net.entry((net.clone(), x.n)).or_default();
                let best = e.entry(x.p * x.q).or_insert(0.0);
                *best = best.max(x.gflops);
            }
        }
        let scaling: Vec<Series> = by_net
            .iter()
            .filter(|(_, pts)| pts.len() > 1)
            .flat_map(|((net, n), pts)| {
                let (r0, g0) = pts.iter().next().map(|(r, g)| (*r as f64, *g)).unwrap();
                let measured = Series {
                    name: format!("{net}, N={n} (best Gflops)"),
                    points: pts.iter().map(|(r, g)| (*r as f64, *g)).collect(),
                    ..Default::default()
                };
                let linear = Series {
                    name: format!("{net}, N={n}: linear from {r0} rank(s)"),
                    points: pts
                        .keys()
                        .map(|&r| (r as f64, g0 * r as f64 / r0))
                        .collect(),
                    ..Default::default()
                };
                [measured, linear]
            })
            .collect();
        if !scaling.is_empty() {
            body.push_str("<h3>Scaling with ranks</h3>\n");
            body.push_str(&chart::line_chart(&LineChart {
                title: "Gflops vs number of ranks (P×Q), per matrix size N".into(),
                x_label: "ranks".into(),
                y_label: "Gflops".into(),
                x: XAxis::Count,
                log_y: false,
                series: scaling,
                hlines: vec![],
            }));
        }
        (
            body,
            json!({ "runs": data_runs, "failed": failed, "total": total }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fused_swaps_and_solve_count_as_time_not_communication() {
        let s: Split = serde_json::from_value(json!({
            "panel": 1.0, "broadcast": 0.5, "swap": 0.25, "swap_solve": 2.0,
            "update": 4.0, "solve": 0.25
        }))
        .unwrap();
        assert_eq!(s.total(), 8.0);
        assert_eq!(s.communication(), 0.75);
        // Result files from before the fused phase read it as zero.
        let old: Split = serde_json::from_value(json!({"panel": 1.0, "swap": 0.5})).unwrap();
        assert_eq!((old.swap_solve, old.total()), (0.0, 1.5));
    }
}
