//! The doctor's view: each network's pairs (latency, bandwidth against nominal, MTU at both
//! ends) and its problems, the newest run of each network.

use serde::Deserialize;
use serde_json::json;
use tbbench_reports::html::{self, num, opt_num, Cell};
use tbbench_reports::load::Loaded;
use tbbench_reports::metrics::{Better, Metric};
use tbbench_reports::views::{newest_per_network, series_names, SuiteView};
use tbbench_schema::ResultFile;

/// The report views of the results this crate writes (suite "doctor").
pub fn views() -> Vec<Box<dyn SuiteView>> {
    vec![Box::new(DoctorView)]
}

pub struct DoctorView;

#[derive(Debug, Deserialize)]
struct Results {
    problems: Vec<Problem>,
    pairs: Vec<Pair>,
    #[serde(default)]
    note: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Problem {
    kind: String,
    hosts: Vec<String>,
    detail: String,
}

#[derive(Debug, Deserialize)]
struct Pair {
    ranks: [usize; 2],
    hosts: [String; 2],
    cross_host: bool,
    mtu: [Option<u32>; 2],
    one_way_us_median: f64,
    gbit_per_s: f64,
    #[serde(default)]
    nominal_gbit_per_s: Option<f64>,
    #[serde(default)]
    percent_of_nominal: Option<f64>,
}

fn parse(r: &ResultFile) -> Result<Results, String> {
    Results::deserialize(&r.results).map_err(|e| format!("doctor results unreadable: {e}"))
}

fn subject(p: &Pair) -> String {
    format!("{}-{}", p.hosts[0], p.hosts[1])
}

impl SuiteView for DoctorView {
    fn suite(&self) -> &'static str {
        "doctor"
    }

    fn title(&self) -> &'static str {
        "Doctor: preflight"
    }

    fn check(&self, r: &ResultFile) -> Result<(), String> {
        parse(r).map(|_| ())
    }

    fn metrics(&self, r: &ResultFile) -> Vec<Metric> {
        let Ok(d) = parse(r) else { return vec![] };
        let mut out = Vec::new();
        for (i, p) in d.pairs.iter().enumerate() {
            out.push(Metric::new(
                r,
                "latency p50",
                &subject(p),
                "us",
                Better::Lower,
                p.one_way_us_median,
                0.0,
                i == 0,
            ));
            out.push(Metric::new(
                r,
                "bw",
                &subject(p),
                "Gbit/s",
                Better::Higher,
                p.gbit_per_s,
                0.0,
                i == 0,
            ));
        }
        out
    }

    fn section(&self, runs: &[&Loaded]) -> (String, serde_json::Value) {
        let shown = newest_per_network(runs);
        let names = series_names(&shown);
        let mut body = String::new();
        let mut data = Vec::new();
        for (name, run) in names.iter().zip(&shown) {
            let Ok(d) = parse(&run.result) else { continue };
            body.push_str(&format!("<h3>{}</h3>\n", html::escape(name)));
            if let Some(n) = &d.note {
                body.push_str(&format!("<p class=\"warn\">{}</p>\n", html::escape(n)));
            }
            let rows = d
                .pairs
                .iter()
                .map(|p| {
                    let mtu = |m: Option<u32>| m.map_or("–".to_string(), |m| m.to_string());
                    vec![
                        Cell::from(format!(
                            "{} ({}-{}){}",
                            subject(p),
                            p.ranks[0],
                            p.ranks[1],
                            if p.cross_host { "" } else { ", one host" }
                        )),
                        num(p.one_way_us_median, 2),
                        num(p.gbit_per_s, 2),
                        opt_num(p.nominal_gbit_per_s, 1),
                        opt_num(p.percent_of_nominal, 0),
                        Cell::from(format!("{}/{}", mtu(p.mtu[0]), mtu(p.mtu[1]))),
                    ]
                })
                .collect();
            body.push_str(&html::table(
                "doctor-pairs",
                &[
                    "pair",
                    "latency µs (p50)",
                    "Gbit/s",
                    "nominal Gbit/s",
                    "% of nominal",
                    "MTU",
                ],
                rows,
            ));
            if d.problems.is_empty() {
                body.push_str("<p>No problems found.</p>\n");
            } else {
                body.push_str("<ul class=\"problems\">\n");
                for p in &d.problems {
                    body.push_str(&format!(
                        "<li>[{}] {}: {}</li>\n",
                        html::escape(&p.kind),
                        html::escape(&p.hosts.join(", ")),
                        html::escape(&p.detail)
                    ));
                }
                body.push_str("</ul>\n");
            }
            data.push(json!({
                "network": name,
                "problems": d.problems.iter().map(|p| json!({"kind": p.kind, "hosts": p.hosts, "detail": p.detail})).collect::<Vec<_>>(),
                "pairs": d.pairs.iter().map(|p| json!({"hosts": p.hosts, "ranks": p.ranks, "one_way_us_median": p.one_way_us_median, "gbit_per_s": p.gbit_per_s, "nominal_gbit_per_s": p.nominal_gbit_per_s, "mtu": p.mtu})).collect::<Vec<_>>(),
            }));
        }
        (body, json!({ "networks": data }))
    }
}
