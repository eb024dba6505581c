//! The hpl-mxp view: each solve (Gflops, the refinement's iterations, HPL's check) and HPL-MxP
//! beside HPL per network, rank count and N, with the speed-up, from the hpl runs of the same
//! report.

use crate::view::Run;
use serde::Deserialize;
use serde_json::json;
use std::collections::BTreeMap;
use tbbench_reports::chart::{self, BarChart};
use tbbench_reports::html::{self, num, opt_num, verdict, Cell};
use tbbench_reports::load::Loaded;
use tbbench_reports::metrics::Metric;
use tbbench_reports::views::{network_label, series_names, short_time, SuiteView};
use tbbench_schema::ResultFile;

pub fn views() -> Vec<Box<dyn SuiteView>> {
    vec![Box::new(MxpView)]
}

pub struct MxpView;

#[derive(Debug, Deserialize)]
struct MxpResults {
    runs: Vec<Run>,
    #[serde(default)]
    kernel: Option<String>,
}

fn parse(r: &ResultFile) -> Result<MxpResults, String> {
    MxpResults::deserialize(&r.results).map_err(|e| format!("{} results unreadable: {e}", r.suite))
}

impl SuiteView for MxpView {
    fn suite(&self) -> &'static str {
        "hpl-mxp"
    }

    fn title(&self) -> &'static str {
        "HPL-MxP: low-precision LU refined to FP64 accuracy, beside HPL"
    }

    fn companions(&self) -> &'static [&'static str] {
        &["hpl"]
    }

    fn check(&self, r: &ResultFile) -> Result<(), String> {
        if parse(r)?.runs.is_empty() {
            return Err("hpl-mxp result has no runs".into());
        }
        Ok(())
    }

    fn metrics(&self, r: &ResultFile) -> Vec<Metric> {
        let Ok(h) = parse(r) else { return vec![] };
        crate::view::gflops_metrics(r, &h.runs)
    }

    fn setup(&self, r: &ResultFile) -> Vec<(String, String)> {
        let Ok(h) = parse(r) else { return vec![] };
        h.kernel
            .map(|k| vec![("the factorization's kernels".to_string(), k)])
            .unwrap_or_default()
    }

    fn section(&self, runs: &[&Loaded]) -> (String, serde_json::Value) {
        let mine: Vec<&Loaded> = runs
            .iter()
            .copied()
            .filter(|l| l.result.suite == self.suite())
            .collect();
        let hpl: Vec<&Loaded> = runs
            .iter()
            .copied()
            .filter(|l| l.result.suite == "hpl")
            .collect();
        let names = series_names(&mine);
        let mut body = String::new();
        let mut rows = Vec::new();
        let mut data_runs = Vec::new();
        for (l, name) in mine.iter().zip(&names) {
            let Ok(h) = parse(&l.result) else { continue };
            for x in &h.runs {
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
                    opt_num(x.iterations.map(|i| i as f64), 0),
                    Cell::from(format!("{:.4e}", x.resid)),
                    verdict(x.passed),
                ]);
                data_runs.push(json!({
                    "started_at": l.result.started_at, "network": name,
                    "ranks": l.result.ranks.len(), "n": x.n, "nb": x.nb, "p": x.p, "q": x.q,
                    "code": x.code, "time_s": x.time_s, "gflops": x.gflops,
                    "iterations": x.iterations, "resid": x.resid, "passed": x.passed,
                }));
            }
        }
        body.push_str(&html::table(
            "hpl-mxp-runs",
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
                "GMRES iterations",
                "resid",
                "check",
            ],
            rows,
        ));
        body.push_str(
            "<p class=\"meta\">Gflops: HPL's operation count (2/3·N³ + 3/2·N²) over the whole \
             solve, the low-precision factorization and the refinement to HPL's residual \
             check together. A FAILED solve's Gflops do not count.</p>\n",
        );

        // Beside HPL: the newest passing solve of each, per network, rank count and N.
        type Key = (String, usize, u64);
        let newest = |set: &[&Loaded]| -> BTreeMap<Key, (f64, u64)> {
            let mut m = BTreeMap::new();
            for l in set {
                let Ok(h) = parse(&l.result) else { continue };
                for x in h.runs.iter().filter(|x| x.passed) {
                    let k = (network_label(&l.result.network), l.result.ranks.len(), x.n);
                    m.insert(k, (x.gflops, x.nb));
                }
            }
            m
        };
        let (mxp, base) = (newest(&mine), newest(&hpl));
        let mut beside = Vec::new();
        let mut rows = Vec::new();
        for (k, (g, nb)) in &mxp {
            let Some((hg, hnb)) = base.get(k) else {
                continue;
            };
            let speedup = g / hg;
            rows.push(vec![
                Cell::from(k.0.as_str()),
                Cell::Num(k.1.to_string()),
                Cell::Num(k.2.to_string()),
                num(*hg, 2),
                Cell::Num(hnb.to_string()),
                num(*g, 2),
                Cell::Num(nb.to_string()),
                Cell::from(format!("{speedup:.2}×")),
            ]);
            beside.push(
                json!({"network": k.0, "ranks": k.1, "n": k.2, "hpl_gflops": hg,
                "hpl_nb": hnb, "mxp_gflops": g, "mxp_nb": nb, "speedup": speedup}),
            );
        }
        if rows.is_empty() {
            body.push_str(
                "<p class=\"meta\">No hpl run of the same network, rank count and N in this \
                 report to set beside (run <code>tbbench hpl --n N</code> with the same ranks).</p>\n",
            );
        } else {
            body.push_str("<h3>Beside HPL</h3>\n");
            body.push_str(&html::table(
                "hpl-mxp-beside",
                &[
                    "network",
                    "ranks",
                    "N",
                    "HPL Gflops",
                    "HPL NB",
                    "MxP Gflops",
                    "MxP NB",
                    "speed-up",
                ],
                rows,
            ));
            body.push_str(&chart::bar_chart(&BarChart {
                title: "HPL and HPL-MxP Gflops, per network, ranks and N".into(),
                y_label: "Gflops".into(),
                categories: beside
                    .iter()
                    .map(|b| {
                        format!(
                            "{} · {} ranks · N={}",
                            b["network"].as_str().unwrap_or(""),
                            b["ranks"],
                            b["n"]
                        )
                    })
                    .collect(),
                series: vec![
                    (
                        "HPL (FP64)".into(),
                        beside.iter().map(|b| b["hpl_gflops"].as_f64()).collect(),
                    ),
                    (
                        "HPL-MxP".into(),
                        beside.iter().map(|b| b["mxp_gflops"].as_f64()).collect(),
                    ),
                ],
                stacked: false,
            }));
        }
        (body, json!({"runs": data_runs, "beside_hpl": beside}))
    }
}
