//! The report's view of `tbbench predict` results: each prediction beside the measured rate
//! of the same workload on the same network and rank count, where the inputs held one.
//! Predictions are not measurements: they give no key figures to compare or track.

use serde_json::{json, Value};
use tbbench_reports::html::{self, num, opt_num, Cell};
use tbbench_reports::load::Loaded;
use tbbench_reports::metrics::Metric;
use tbbench_reports::views::{short_time, SuiteView};
use tbbench_schema::ResultFile;

pub struct PredictView;

fn workload_text(w: &Value) -> String {
    match w["kind"].as_str() {
        Some("hpl") => format!("HPL, N = {}, NB = {}", w["n"], w["nb"]),
        _ => format!(
            "{} decode of {} ({} layers)",
            w["parallel"].as_str().unwrap_or("?"),
            w["model"].as_str().unwrap_or("?"),
            w["layers"]
        ),
    }
}

impl SuiteView for PredictView {
    fn suite(&self) -> &'static str {
        "predict"
    }
    fn title(&self) -> &'static str {
        "Predictions: what another network would buy"
    }
    fn check(&self, r: &ResultFile) -> Result<(), String> {
        let p = r.results["predictions"]
            .as_array()
            .ok_or("results.predictions is not a list")?;
        if p.iter()
            .any(|x| x["label"].as_str().is_none() || x["ranks"].as_u64().is_none())
        {
            return Err("a prediction without label or ranks".into());
        }
        if !r.results["workload"].is_object() {
            return Err("results.workload is missing".into());
        }
        Ok(())
    }
    fn metrics(&self, _: &ResultFile) -> Vec<Metric> {
        Vec::new()
    }
    fn section(&self, runs: &[&Loaded]) -> (String, Value) {
        let mut body = String::from(
            "<p class=\"meta\">Predicted from measured link and coll figures and a measured decode or DGEMM rate; rows marked published use Apple's published RDMA over Thunderbolt 5 figures, not a measurement. Where the inputs held a run of the same workload on the same network and rank count, its rate stands beside the prediction.</p>\n",
        );
        let mut data = Vec::new();
        for l in runs {
            let r = &l.result.results;
            let hpl = r["workload"]["kind"] == "hpl";
            let rows: Vec<Vec<Cell>> = r["predictions"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    let mut label = p["label"].as_str().unwrap_or("").to_string();
                    if p["source"] == "published" && !label.contains("published") {
                        label.push_str(" (published, not measured)");
                    }
                    let (pred, compute, comm, meas) = if hpl {
                        ("gflops", "compute_s", "comm_s", "measured_gflops")
                    } else {
                        (
                            "tokens_per_s",
                            "compute_ms_per_token",
                            "comm_ms_per_token",
                            "measured_tokens_per_s",
                        )
                    };
                    vec![
                        Cell::from(label),
                        num(p["ranks"].as_f64().unwrap_or(f64::NAN), 0),
                        num(p[pred].as_f64().unwrap_or(f64::NAN), 2),
                        num(p[compute].as_f64().unwrap_or(f64::NAN), 3),
                        num(p[comm].as_f64().unwrap_or(f64::NAN), 3),
                        opt_num(p[meas].as_f64(), 2),
                        opt_num(p["measured_over_predicted"].as_f64(), 2),
                    ]
                })
                .collect();
            let headers: &[&str] = if hpl {
                &[
                    "network",
                    "ranks",
                    "predicted Gflops",
                    "compute s",
                    "comm s",
                    "measured Gflops",
                    "measured / predicted",
                ]
            } else {
                &[
                    "network",
                    "ranks",
                    "predicted tokens/s",
                    "compute ms/token",
                    "comm ms/token",
                    "measured tokens/s",
                    "measured / predicted",
                ]
            };
            let what = workload_text(&r["workload"]);
            body.push_str(&format!(
                "<h3>{} <span class=\"meta\">({})</span></h3>\n",
                html::escape(&what),
                html::escape(&short_time(&l.result.started_at))
            ));
            if let Some(c) = r["predictions"][0]["compute_from"]
                .as_str()
                .or(r["workload"]["compute_from"].as_str())
            {
                body.push_str(&format!(
                    "<p class=\"meta\">Computation: {}</p>\n",
                    html::escape(c)
                ));
            }
            body.push_str(&html::table("predict", headers, rows));
            data.push(json!({
                "file": l.path.display().to_string(),
                "workload": r["workload"],
                "predictions": r["predictions"],
            }));
        }
        (body, json!({ "runs": data }))
    }
}
