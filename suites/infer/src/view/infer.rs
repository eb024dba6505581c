//! The infer suite's view: token rates of a server per concurrency level (or arrival rate),
//! endpoints and networks side by side. Key figures per level: TTFT p50 and TPOT p50 (lower
//! is better) and aggregate output tokens/s (higher is better).

use serde::Deserialize;
use serde_json::json;
use tbbench_reports::chart::{self, LineChart, Series, XAxis};
use tbbench_reports::html::{self, num, opt_num, Cell};
use tbbench_reports::load::Loaded;
use tbbench_reports::metrics::{median_and_half_iqr, Better, Metric};
use tbbench_reports::views::{newest_per_network, series_names, short_time, SuiteView};
use tbbench_schema::{ResultFile, Summary};

pub struct InferView;

#[derive(Debug, Deserialize)]
struct InferResults {
    #[serde(default)]
    model: String,
    #[serde(default)]
    tokens_approximate: bool,
    levels: Vec<Level>,
    /// `--slo`'s targets, where given.
    #[serde(default)]
    slo: Option<serde_json::Value>,
    /// `--find-max`'s answer: `by`, `value` (None: nothing met the SLO), `probes`.
    #[serde(default)]
    max_within_slo: Option<MaxWithinSlo>,
    /// `--sweep`'s knee: the level, or none with the reason.
    #[serde(default)]
    knee: Option<Knee>,
}

#[derive(Debug, Deserialize)]
struct Knee {
    #[serde(default)]
    level: Option<String>,
    #[serde(default)]
    broke: Option<String>,
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Stopped {
    reason: String,
    at_s: f64,
    not_sent: u64,
}

#[derive(Debug, Deserialize)]
struct MaxWithinSlo {
    by: String,
    value: Option<f64>,
    #[serde(default)]
    probes: Vec<serde_json::Value>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
struct Goodput {
    output_tokens_per_s: f64,
    requests_per_s: f64,
    share_met: f64,
    met: bool,
}

#[derive(Debug, Deserialize)]
struct Level {
    #[serde(default)]
    concurrency: Option<u64>,
    #[serde(default)]
    rate_per_s: Option<f64>,
    /// `--context`: the prompt depth of the level.
    #[serde(default)]
    context: Option<u64>,
    /// `--sweep`: synchronous, throughput or constant.
    #[serde(default)]
    sweep: Option<String>,
    #[serde(default)]
    arrivals: Option<String>,
    #[serde(default)]
    stopped: Option<Stopped>,
    #[serde(default)]
    wall_s: f64,
    #[serde(default)]
    prefill_tokens_per_s: Option<Summary>,
    requests: u64,
    ok: u64,
    failed: u64,
    aggregate_tokens_per_s: f64,
    #[serde(default)]
    token_source: Option<String>,
    #[serde(default)]
    ttft_ms: Option<Summary>,
    #[serde(default)]
    tpot_ms: Option<Summary>,
    #[serde(default)]
    gap_ms: Option<Summary>,
    #[serde(default)]
    e2e_ms: Option<Summary>,
    #[serde(default)]
    decode_tokens_per_s: Option<Summary>,
    #[serde(default)]
    per_request: Vec<PerRequest>,
    #[serde(default)]
    goodput: Option<Goodput>,
}

#[derive(Debug, Deserialize)]
struct PerRequest {
    #[serde(default)]
    ttft_ms: Option<f64>,
    #[serde(default)]
    tpot_ms: Option<f64>,
}

impl Level {
    /// As the run named it (figures.rs's Level::name).
    fn name(&self) -> String {
        match self.context {
            Some(d) => format!("ctx={d} {}", self.load()),
            None => self.load(),
        }
    }
    /// "c=4" or "rate=2/s".
    fn load(&self) -> String {
        match (self.concurrency, self.rate_per_s) {
            (_, Some(r)) => format!("rate={r}/s"),
            (Some(c), None) => format!("c={c}"),
            (None, None) => "?".into(),
        }
    }
    /// Requests per second offered: the arrival rate, or for a closed level the rate its
    /// requests ended at.
    fn offered(&self) -> Option<f64> {
        self.rate_per_s
            .or_else(|| (self.wall_s > 0.0).then(|| self.ok as f64 / self.wall_s))
    }
    /// Half the interquartile range of one per-request figure: its spread for compare.
    fn spread(&self, f: fn(&PerRequest) -> Option<f64>) -> f64 {
        let mut v: Vec<f64> = self.per_request.iter().filter_map(f).collect();
        median_and_half_iqr(&mut v).1
    }
}

/// What each request of a run asked, and how the load was chosen: "chat, prompt 128, output
/// 128", "chat, dataset chats.json turn by turn, output ≤ 512, sweep", "completions, prompt
/// 64-512, output 128, context". Compare joins figures of one workload only, and the report
/// shows the newest run of each.
fn workload(r: &ResultFile) -> String {
    let p = &r.params;
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut parts = vec![p["api"].as_str().unwrap_or("chat").to_string()];
    match p["dataset"].as_str() {
        Some(d) => parts.push(format!(
            "dataset {}{}",
            std::path::Path::new(d)
                .file_name()
                .map_or(d.into(), |f| f.to_string_lossy()),
            if p["multi_turn"] == true {
                " turn by turn"
            } else {
                ""
            }
        )),
        None if p["context"].is_array() => parts.push("context depths".into()),
        None => parts.push(format!("prompt {}", text(&p["prompt_tokens"]))),
    }
    if let Some(n) = p["shared_prefix"].as_u64() {
        parts.push(format!("shared prefix {n}"));
    }
    parts.push(format!("output {}", text(&p["max_tokens"])));
    if p["sweep"].is_u64() {
        parts.push("sweep".into());
    }
    // How requests arrive changes what a rate means (open loop only).
    if p["rate_per_s"].is_number() || p["sweep"].is_u64() {
        if let Some(a) = p["arrivals"].as_str() {
            parts.push(a.into());
        }
    }
    if let Some(r) = p["ramp_up_s"].as_f64().filter(|r| *r > 0.0) {
        parts.push(format!("ramp {r} s"));
    }
    parts.join(", ")
}

fn parse(r: &ResultFile) -> Result<InferResults, String> {
    InferResults::deserialize(&r.results).map_err(|e| format!("infer results unreadable: {e}"))
}

impl SuiteView for InferView {
    fn suite(&self) -> &'static str {
        "infer"
    }

    fn title(&self) -> &'static str {
        "Infer: token rates of a server"
    }

    fn check(&self, r: &ResultFile) -> Result<(), String> {
        if parse(r)?.levels.is_empty() {
            return Err("infer result has no levels".into());
        }
        Ok(())
    }

    fn metrics(&self, r: &ResultFile) -> Vec<Metric> {
        let Ok(x) = parse(r) else { return vec![] };
        let first = x.levels.first().map(Level::name);
        let last = x.levels.last().map(Level::name);
        let mut out = Vec::new();
        for l in &x.levels {
            let subject = format!("{} · {} · {}", x.model, workload(r), l.name());
            if let Some(t) = l.ttft_ms {
                out.push(Metric::new(
                    r,
                    "TTFT p50",
                    &subject,
                    "ms",
                    Better::Lower,
                    t.median,
                    l.spread(|p| p.ttft_ms),
                    Some(l.name()) == first,
                ));
            }
            if let Some(t) = l.tpot_ms {
                out.push(Metric::new(
                    r,
                    "TPOT p50",
                    &subject,
                    "ms",
                    Better::Lower,
                    t.median,
                    l.spread(|p| p.tpot_ms),
                    Some(l.name()) == first,
                ));
            }
            if l.ok > 0 {
                out.push(Metric::new(
                    r,
                    "tokens/s",
                    &subject,
                    "tokens/s",
                    Better::Higher,
                    l.aggregate_tokens_per_s,
                    0.0,
                    Some(l.name()) == last,
                ));
            }
            if let Some(g) = l.goodput {
                out.push(Metric::new(
                    r,
                    "goodput tokens/s",
                    &subject,
                    "tokens/s",
                    Better::Higher,
                    g.output_tokens_per_s,
                    0.0,
                    Some(l.name()) == last,
                ));
            }
        }
        if let Some(m) = &x.max_within_slo {
            out.push(Metric::new(
                r,
                "highest load within the SLO",
                &format!("{} · {} · {}", x.model, workload(r), m.by),
                if m.by == "concurrency" {
                    "requests"
                } else {
                    "requests/s"
                },
                Better::Higher,
                m.value.unwrap_or(0.0),
                0.0,
                true,
            ));
        }
        out
    }

    fn section(&self, runs: &[&Loaded]) -> (String, serde_json::Value) {
        // The newest run of each workload on each network: a sweep and a depth run against
        // one server are two things to see.
        let mut workloads: Vec<String> = runs.iter().map(|r| workload(&r.result)).collect();
        workloads.sort();
        workloads.dedup();
        let shown: Vec<&Loaded> = workloads
            .iter()
            .flat_map(|w| {
                let same: Vec<&Loaded> = runs
                    .iter()
                    .copied()
                    .filter(|r| workload(&r.result) == *w)
                    .collect();
                newest_per_network(&same)
            })
            .collect();
        let parsed: Vec<InferResults> = shown
            .iter()
            .map(|r| parse(&r.result).expect("checked at load"))
            .collect();
        let models: Vec<&str> = parsed.iter().map(|p| p.model.as_str()).collect();
        let loads: Vec<String> = shown.iter().map(|r| workload(&r.result)).collect();
        let names: Vec<String> = series_names(&shown)
            .into_iter()
            .zip(models.iter().zip(&loads))
            .map(|(n, (m, w))| {
                let mut name = n;
                if models.iter().any(|o| o != m) {
                    name = format!("{name} · {m}");
                }
                if loads.iter().any(|o| o != w) {
                    name = format!("{name} · {w}");
                }
                name
            })
            .collect();
        let mut body = String::new();
        if let Some(m) = models.first().filter(|m| models.iter().all(|o| o == *m)) {
            body.push_str(&format!(
                "<p>Model <strong>{}</strong>; the newest run of each endpoint and network.</p>\n",
                html::escape(m)
            ));
        }
        let d = |x: &Option<Summary>, f: fn(&Summary) -> Option<f64>, n| {
            opt_num(x.as_ref().and_then(f), n)
        };
        let mut rows = Vec::new();
        let mut data = Vec::new();
        for ((l, x), name) in shown.iter().zip(&parsed).zip(&names) {
            for lv in &x.levels {
                rows.push(vec![
                    Cell::from(short_time(&l.result.started_at)),
                    Cell::from(name.as_str()),
                    Cell::from(match (&lv.sweep, &lv.arrivals) {
                        (Some(role), _) if role != "constant" => {
                            format!("{} ({role})", lv.name())
                        }
                        (_, Some(a)) if a != "poisson" => format!("{} ({a})", lv.name()),
                        _ => lv.name(),
                    }),
                    Cell::Num(match &lv.stopped {
                        Some(st) => format!(
                            "{}/{} (stopped at {:.1} s, {} not sent)",
                            lv.ok, lv.requests, st.at_s, st.not_sent
                        ),
                        None => format!("{}/{}", lv.ok, lv.requests),
                    }),
                    d(&lv.ttft_ms, |d| Some(d.median), 1),
                    d(&lv.ttft_ms, |d| d.p90, 1),
                    d(&lv.ttft_ms, |d| Some(d.p99), 1),
                    d(&lv.tpot_ms, |d| Some(d.median), 2),
                    d(&lv.tpot_ms, |d| Some(d.p99), 2),
                    d(&lv.gap_ms, |d| Some(d.median), 2),
                    d(&lv.gap_ms, |d| Some(d.p99), 2),
                    d(&lv.e2e_ms, |d| Some(d.median), 0),
                    d(&lv.decode_tokens_per_s, |d| Some(d.median), 1),
                    num(lv.aggregate_tokens_per_s, 1),
                    Cell::from(if x.tokens_approximate {
                        "chunks (approx.)".to_string()
                    } else {
                        lv.token_source.clone().unwrap_or_else(|| "–".into())
                    }),
                    opt_num(lv.goodput.map(|g| g.share_met * 100.0), 0),
                    opt_num(lv.goodput.map(|g| g.output_tokens_per_s), 1),
                    Cell::from(match lv.goodput {
                        Some(g) if g.met => "met",
                        Some(_) => "NOT met",
                        None => "–",
                    }),
                ]);
                data.push(json!({
                    "network": name, "model": x.model, "level": lv.name(),
                    "concurrency": lv.concurrency, "rate_per_s": lv.rate_per_s,
                    "requests": lv.requests, "ok": lv.ok, "failed": lv.failed,
                    "ttft_p50_ms": lv.ttft_ms.map(|d| d.median),
                    "tpot_p50_ms": lv.tpot_ms.map(|d| d.median),
                    "gap_p99_ms": lv.gap_ms.map(|d| d.p99),
                    "e2e_p50_ms": lv.e2e_ms.map(|d| d.median),
                    "decode_tokens_per_s_p50": lv.decode_tokens_per_s.map(|d| d.median),
                    "aggregate_tokens_per_s": lv.aggregate_tokens_per_s,
                    "context": lv.context, "sweep": lv.sweep,
                    "stopped": lv.stopped.as_ref().map(|s| &s.reason),
                    "prefill_tokens_per_s_p50": lv.prefill_tokens_per_s.map(|d| d.median),
                    "goodput": lv.goodput.map(|g| json!({"share_met": g.share_met,
                        "requests_per_s": g.requests_per_s,
                        "output_tokens_per_s": g.output_tokens_per_s, "met": g.met})),
                }));
            }
        }
        body.push_str(&html::table(
            "infer-levels",
            &[
                "started",
                "endpoint",
                "level",
                "ok",
                "TTFT p50 ms",
                "p90",
                "p99",
                "TPOT p50 ms",
                "p99",
                "gap p50 ms",
                "p99",
                "E2E p50 ms",
                "decode tok/s p50",
                "aggregate tok/s",
                "token counts",
                "SLO met %",
                "goodput tok/s",
                "SLO",
            ],
            rows,
        ));
        for ((x, name), _) in parsed.iter().zip(&names).zip(&shown) {
            if let Some(slo) = &x.slo {
                let targets: Vec<String> = ["ttft_ms", "tpot_ms", "e2e_ms"]
                    .iter()
                    .filter_map(|k| {
                        slo[*k].as_f64().map(|v| {
                            format!("{} ≤ {v} ms", k.trim_end_matches("_ms").to_uppercase())
                        })
                    })
                    .collect();
                body.push_str(&format!(
                    "<p>{}: SLO {} for {}% of requests{}</p>\n",
                    html::escape(name),
                    html::escape(&targets.join(", ")),
                    slo["percentile"].as_f64().unwrap_or(0.0),
                    match &x.max_within_slo {
                        Some(m) => match m.value {
                            Some(v) => format!(
                                "; the highest {} within it: <strong>{v}</strong> ({} probes)",
                                if m.by == "concurrency" {
                                    "concurrency"
                                } else {
                                    "arrival rate (requests/s)"
                                },
                                m.probes.len()
                            ),
                            None => format!("; no load met it ({} probes)", m.probes.len()),
                        },
                        None => String::new(),
                    }
                ));
            }
        }
        body.push_str(
            "<p class=\"meta\">TTFT: request sent to the first content or reasoning token. \
             TPOT: (E2E − TTFT)/(tokens − 1). gap: time between two text-bearing chunks. \
             decode tok/s: 1/TPOT per request. aggregate tok/s: all output tokens of a level \
             over its wall time. SLO met %: requests that met every --slo target; goodput \
             tok/s: their output tokens over the level's wall time. The README defines each.</p>\n",
        );

        for (x, name) in parsed.iter().zip(&names) {
            if let Some(k) = &x.knee {
                body.push_str(&format!(
                    "<p>{}: the knee {}</p>\n",
                    html::escape(name),
                    match (&k.level, &k.broke, &k.reason) {
                        (Some(l), Some(b), _) => format!(
                            "is <strong>{}</strong>, the highest load before latency jumps (then {})",
                            html::escape(l),
                            html::escape(b)
                        ),
                        (_, _, Some(r)) => format!("was not found: {}", html::escape(r)),
                        _ => "is not recorded".into(),
                    }
                ));
            }
        }
        body.push_str(&load_charts(&parsed, &names));
        body.push_str(&depth_charts(&parsed, &names));
        (body, json!({ "levels": data }))
    }
}

/// The charts of latency and rate against load (levels of a context depth are drawn against
/// depth instead): TTFT and TPOT p50 with a band to p99, the SLO's targets as lines and each
/// run's knee circled; aggregate tokens/s; and the Pareto view, tokens/s per user against
/// aggregate tokens/s. Load is requests/s offered where any run has a rate (a closed level
/// at the rate its requests ended), else concurrency.
fn load_charts(parsed: &[InferResults], names: &[String]) -> String {
    let by_rate = parsed
        .iter()
        .any(|x| x.levels.iter().any(|l| l.rate_per_s.is_some()));
    let x_of = |l: &Level| -> Option<f64> {
        if by_rate {
            l.offered()
        } else {
            l.concurrency.map(|c| c as f64)
        }
    };
    // Each run's levels by load, depth levels left out.
    let runs: Vec<Vec<&Level>> = parsed
        .iter()
        .map(|x| {
            let mut v: Vec<&Level> = x
                .levels
                .iter()
                .filter(|l| l.context.is_none() && l.ok > 0 && x_of(l).is_some())
                .collect();
            v.sort_by(|a, b| x_of(a).unwrap().total_cmp(&x_of(b).unwrap()));
            v
        })
        .collect();
    if runs.iter().all(|v| v.is_empty()) {
        return String::new();
    }
    let (x_label, x_axis) = if by_rate {
        ("requests/s offered", XAxis::Linear)
    } else {
        ("concurrent requests", XAxis::Count)
    };
    let latency = |what: &str, pick: fn(&Level) -> Option<Summary>, slo_key: &str| {
        let series: Vec<Series> = runs
            .iter()
            .zip(parsed)
            .zip(names)
            .enumerate()
            .filter_map(|(i, ((levels, x), name))| {
                let with: Vec<(&Level, Summary)> =
                    levels.iter().filter_map(|l| Some((*l, pick(l)?))).collect();
                let point = |l: &Level, d: &Summary| (x_of(l).unwrap(), d.median);
                let knee = x.knee.as_ref().and_then(|k| k.level.as_deref());
                (!with.is_empty()).then(|| Series {
                    name: name.clone(),
                    points: with.iter().map(|(l, d)| point(l, d)).collect(),
                    band: with
                        .iter()
                        .map(|(l, d)| (x_of(l).unwrap(), d.median, d.p99))
                        .collect(),
                    marks: with
                        .iter()
                        .filter(|(l, _)| knee == Some(l.name().as_str()))
                        .map(|(l, d)| point(l, d))
                        .collect(),
                    colour: Some(i),
                })
            })
            .collect();
        if series.is_empty() {
            return String::new();
        }
        // The SLO's target where every run held to one was held to the same.
        let targets: Vec<f64> = parsed
            .iter()
            .filter_map(|x| x.slo.as_ref().and_then(|s| s[slo_key].as_f64()))
            .collect();
        let hlines = match targets.first() {
            Some(&t) if targets.iter().all(|&o| o == t) => {
                vec![(format!("SLO {what} {t} ms"), t)]
            }
            _ => vec![],
        };
        chart::line_chart(&LineChart {
            title: format!("{what} p50 (band to p99) against load; the knee circled"),
            x_label: x_label.into(),
            y_label: format!("{what} (ms)"),
            x: x_axis.clone(),
            log_y: false,
            series,
            hlines,
        })
    };
    let mut out = latency("TTFT", |l| l.ttft_ms, "ttft_ms");
    out.push_str(&latency("TPOT", |l| l.tpot_ms, "tpot_ms"));
    let rate: Vec<Series> = runs
        .iter()
        .zip(names)
        .enumerate()
        .filter(|(_, (v, _))| !v.is_empty())
        .map(|(i, (levels, name))| Series {
            name: name.clone(),
            points: levels
                .iter()
                .map(|l| (x_of(l).unwrap(), l.aggregate_tokens_per_s))
                .collect(),
            colour: Some(i),
            ..Default::default()
        })
        .collect();
    out.push_str(&chart::line_chart(&LineChart {
        title: "Aggregate output tokens/s against load".into(),
        x_label: x_label.into(),
        y_label: "tokens/s".into(),
        x: x_axis,
        log_y: false,
        series: rate,
        hlines: vec![],
    }));
    // Pareto: what one user gets against what the server delivers, level by level.
    let pareto: Vec<Series> = runs
        .iter()
        .zip(names)
        .enumerate()
        .filter_map(|(i, (levels, name))| {
            let points: Vec<(f64, f64)> = levels
                .iter()
                .filter_map(|l| Some((l.aggregate_tokens_per_s, l.decode_tokens_per_s?.median)))
                .collect();
            (points.len() >= 2).then(|| Series {
                name: name.clone(),
                points,
                colour: Some(i),
                ..Default::default()
            })
        })
        .collect();
    if !pareto.is_empty() {
        out.push_str(&chart::line_chart(&LineChart {
            title: "Tokens/s per user against aggregate tokens/s, one point per level".into(),
            x_label: "aggregate output tokens/s".into(),
            y_label: "decode tokens/s per request (p50)".into(),
            x: XAxis::Linear,
            log_y: false,
            series: pareto,
            hlines: vec![],
        }));
    }
    out
}

/// `--context` levels: prefill tokens/s and TPOT against the prompt's depth.
fn depth_charts(parsed: &[InferResults], names: &[String]) -> String {
    // A line per run and load (a depth run of several concurrencies draws one each).
    let series = |pick: fn(&Level) -> Option<f64>| -> Vec<Series> {
        let mut out = Vec::new();
        for (i, (x, name)) in parsed.iter().zip(names).enumerate() {
            let mut loads: Vec<String> = x
                .levels
                .iter()
                .filter(|l| l.context.is_some())
                .map(Level::load)
                .collect();
            loads.sort();
            loads.dedup();
            for load in &loads {
                let points: Vec<(f64, f64)> = x
                    .levels
                    .iter()
                    .filter(|l| l.load() == *load)
                    .filter_map(|l| Some((l.context? as f64, pick(l)?)))
                    .collect();
                if !points.is_empty() {
                    out.push(Series {
                        name: if loads.len() > 1 {
                            format!("{name} · {load}")
                        } else {
                            name.clone()
                        },
                        points,
                        colour: Some(out.len().max(i)),
                        ..Default::default()
                    });
                }
            }
        }
        out
    };
    let prefill = series(|l| l.prefill_tokens_per_s.map(|d| d.median));
    if prefill.is_empty() {
        return String::new();
    }
    let mut out = chart::line_chart(&LineChart {
        title: "Prefill tokens/s (prompt tokens over TTFT) against the prompt's depth".into(),
        x_label: "prompt tokens".into(),
        y_label: "prefill tokens/s (p50)".into(),
        x: XAxis::Linear,
        log_y: false,
        series: prefill,
        hlines: vec![],
    });
    out.push_str(&chart::line_chart(&LineChart {
        title: "TPOT against the prompt's depth".into(),
        x_label: "prompt tokens".into(),
        y_label: "TPOT p50 (ms)".into(),
        x: XAxis::Linear,
        log_y: false,
        series: series(|l| l.tpot_ms.map(|d| d.median)),
        hlines: vec![],
    }));
    out
}
