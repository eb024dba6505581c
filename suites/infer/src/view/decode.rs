//! The built-in decode's view (`tbbench infer --gguf`, suite "decode"): token rates of a model
//! split over ranks, per network and split, with whether the tokens matched the 1-rank run.

use serde::Deserialize;
use serde_json::json;
use tbbench_reports::chart::{self, BarChart, LineChart, Series, XAxis};
use tbbench_reports::html::{self, num, verdict, Cell};
use tbbench_reports::load::Loaded;
use tbbench_reports::metrics::{Better, Metric};
use tbbench_reports::views::{series_names, short_time, SuiteView};
use tbbench_schema::{ResultFile, Summary};

pub struct DecodeView;

#[derive(Debug, Deserialize)]
struct Model {
    name: String,
}

#[derive(Debug, Deserialize)]
struct DecodeResults {
    model: Model,
    parallel: String,
    ranks: usize,
    /// Absent in files from before --threads (one thread per rank then).
    #[serde(default)]
    threads_per_rank: Option<usize>,
    prompt_tokens: usize,
    prefill_s: f64,
    generated_tokens: usize,
    decode_tokens_per_s: f64,
    per_token_ms: Summary,
    #[serde(default)]
    comm_share_per_rank: Vec<f64>,
    #[serde(default)]
    matched: Option<bool>,
    #[serde(default)]
    speedup_over_one_rank: Option<f64>,
    #[serde(default)]
    percent_of_bandwidth_ceiling: Option<f64>,
    /// Absent where the hosts' energy was not read.
    #[serde(default)]
    joules_per_token: Option<f64>,
    /// `--context`'s depths (absent without it).
    #[serde(default)]
    by_context: Vec<Depth>,
}

#[derive(Debug, Deserialize)]
struct Depth {
    context: usize,
    #[serde(default)]
    prefill_tokens_per_s: Option<f64>,
    decode_tokens_per_s: f64,
}

fn parse(r: &ResultFile) -> Result<DecodeResults, String> {
    DecodeResults::deserialize(&r.results).map_err(|e| format!("decode results unreadable: {e}"))
}

/// The split as people say it: "tp ×2".
fn split(d: &DecodeResults) -> String {
    format!("{} ×{}", d.parallel, d.ranks)
}

/// What makes two decode runs the same work, so that history and compare join only those: the
/// model, the split, threads per rank, the prompt's length and the tokens asked for (a run of
/// 16 tokens and one of 128 differ in their prompt share of the time, not in the network).
fn subject(r: &ResultFile, d: &DecodeResults) -> String {
    let asked = r
        .params
        .get("max_tokens")
        .and_then(|v| v.as_u64())
        .unwrap_or(d.generated_tokens as u64);
    format!(
        "{} {}, {} thread(s) per rank, prompt {} + {asked} tokens",
        d.model.name,
        split(d),
        d.threads_per_rank.unwrap_or(1),
        d.prompt_tokens
    )
}

impl SuiteView for DecodeView {
    fn suite(&self) -> &'static str {
        "decode"
    }

    fn title(&self) -> &'static str {
        "Built-in decode: a model split over the ranks"
    }

    fn check(&self, r: &ResultFile) -> Result<(), String> {
        parse(r).map(|_| ())
    }

    fn metrics(&self, r: &ResultFile) -> Vec<Metric> {
        let Ok(d) = parse(r) else { return vec![] };
        if d.matched == Some(false) {
            return vec![];
        }
        let s = subject(r, &d);
        vec![
            Metric::new(
                r,
                "decode tokens/s",
                &s,
                "tokens/s",
                Better::Higher,
                d.decode_tokens_per_s,
                // Per-token spread, turned into a rate spread.
                d.decode_tokens_per_s * (d.per_token_ms.stdev / d.per_token_ms.mean.max(1e-12)),
                true,
            ),
            Metric::new(
                r,
                "time per token p50",
                &s,
                "ms",
                Better::Lower,
                d.per_token_ms.median,
                d.per_token_ms.stdev,
                false,
            ),
        ]
    }

    fn section(&self, runs: &[&Loaded]) -> (String, serde_json::Value) {
        let names = series_names(runs);
        let parsed: Vec<DecodeResults> = runs
            .iter()
            .map(|r| parse(&r.result).expect("checked at load"))
            .collect();
        let mut rows = Vec::new();
        let mut data = Vec::new();
        for ((l, d), net) in runs.iter().zip(&parsed).zip(&names) {
            rows.push(vec![
                Cell::from(short_time(&l.result.started_at)),
                Cell::from(net.as_str()),
                Cell::from(d.model.name.as_str()),
                Cell::from(split(d)),
                Cell::Num(d.threads_per_rank.unwrap_or(1).to_string()),
                Cell::Num(d.prompt_tokens.to_string()),
                num(d.prompt_tokens as f64 / d.prefill_s.max(1e-12), 1),
                Cell::Num(d.generated_tokens.to_string()),
                num(d.decode_tokens_per_s, 2),
                Cell::Num(format!(
                    "{:.2} / {:.2}",
                    d.per_token_ms.median, d.per_token_ms.p99
                )),
                num(
                    d.comm_share_per_rank.first().copied().unwrap_or(0.0) * 100.0,
                    0,
                ),
                html::opt_num(d.speedup_over_one_rank, 2),
                html::opt_num(d.percent_of_bandwidth_ceiling, 0),
                html::opt_num(d.joules_per_token, 2),
                match d.matched {
                    Some(m) => verdict(m),
                    None => Cell::from("not compared"),
                },
            ]);
            data.push(json!({
                "network": net, "model": d.model.name, "parallel": d.parallel, "ranks": d.ranks,
                "threads_per_rank": d.threads_per_rank.unwrap_or(1),
                "decode_tokens_per_s": d.decode_tokens_per_s, "per_token_ms_p50": d.per_token_ms.median,
                "matched": d.matched,
            }));
        }
        let mut body = html::table(
            "decode-runs",
            &[
                "started",
                "network",
                "model",
                "split",
                "threads per rank",
                "prompt tokens",
                "prefill tok/s",
                "tokens made",
                "decode tok/s",
                "ms per token, p50 / p99",
                "% rank 0 waiting",
                "× 1 rank",
                "% of read ceiling",
                "J per token",
                "same tokens as 1 rank",
            ],
            rows,
        );
        body.push_str(
            "<p class=\"meta\">% rank 0 waiting: time in the network calls (all-reduce, stage \
             hand-over, the token's broadcast), including waiting for other ranks' compute. \
             × 1 rank: the decode rate over that of the whole model on one rank using every core of rank 0's host. Read \
             ceiling: the token rate if every rank only had to read its weights once per token \
             at its measured read bandwidth. J per token: the hosts' package energy over the prompt \
             and the generated tokens, where their counters were read. Models named \"(synthetic)\" have random \
             weights at a real model's layer shapes.</p>\n",
        );
        // Decode rate per model and split, networks as series (newest run of each): a model's
        // bar never stands for another model's.
        let category = |d: &DecodeResults| format!("{} {}", d.model.name, split(d));
        let mut cats: Vec<String> = parsed.iter().map(category).collect();
        cats.sort();
        cats.dedup();
        let mut uniq: Vec<String> = Vec::new();
        for n in &names {
            if !uniq.contains(n) {
                uniq.push(n.clone());
            }
        }
        let series = uniq
            .iter()
            .map(|n| {
                let vals = cats
                    .iter()
                    .map(|c| {
                        names
                            .iter()
                            .zip(&parsed)
                            .rev()
                            .find(|(nn, d)| *nn == n && &category(d) == c)
                            .map(|(_, d)| d.decode_tokens_per_s)
                    })
                    .collect();
                (n.clone(), vals)
            })
            .collect();
        body.push_str(&chart::bar_chart(&BarChart {
            title: "Decode tokens/s per model and split, networks side by side".into(),
            y_label: "tokens/s".into(),
            categories: cats,
            series,
            stacked: false,
        }));
        // Decode (and the fill's prefill) against the context's depth, per run that has them.
        let deep: Vec<(String, &DecodeResults)> = names
            .iter()
            .zip(&parsed)
            .filter(|(_, d)| !d.by_context.is_empty())
            .map(|(n, d)| (format!("{n} · {} {}", d.model.name, split(d)), d))
            .collect();
        let mut depth_data = Vec::new();
        if !deep.is_empty() {
            let mut rows = Vec::new();
            for (name, d) in &deep {
                for x in &d.by_context {
                    rows.push(vec![
                        Cell::from(name.as_str()),
                        Cell::Num(x.context.to_string()),
                        html::opt_num(x.prefill_tokens_per_s, 1),
                        num(x.decode_tokens_per_s, 2),
                    ]);
                    depth_data.push(json!({"run": name, "context": x.context,
                        "prefill_tokens_per_s": x.prefill_tokens_per_s,
                        "decode_tokens_per_s": x.decode_tokens_per_s}));
                }
            }
            body.push_str("<h3>At context depth</h3>\n");
            body.push_str(&html::table(
                "decode-context",
                &[
                    "run",
                    "context tokens",
                    "prefill tok/s (the fill)",
                    "decode tok/s",
                ],
                rows,
            ));
            body.push_str(&chart::line_chart(&LineChart {
                title: "Decode tokens/s against the context's depth".into(),
                x_label: "tokens in the KV cache".into(),
                y_label: "decode tokens/s".into(),
                x: XAxis::Linear,
                log_y: false,
                series: deep
                    .iter()
                    .map(|(name, d)| Series {
                        name: name.clone(),
                        points: d
                            .by_context
                            .iter()
                            .map(|x| (x.context as f64, x.decode_tokens_per_s))
                            .collect(),
                        ..Default::default()
                    })
                    .collect(),
                hlines: vec![],
            }));
        }
        (body, json!({ "runs": data, "by_context": depth_data }))
    }
}
