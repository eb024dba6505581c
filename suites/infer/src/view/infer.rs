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
    fn name(&self) -> String {
        match (self.concurrency, self.rate_per_s) {
            (_, Some(r)) => format!("rate={r}/s"),
            (Some(c), None) => format!("c={c}"),
            (None, None) => "?".into(),
        }
    }
    /// Half the interquartile range of one per-request figure: its spread for compare.
    fn spread(&self, f: fn(&PerRequest) -> Option<f64>) -> f64 {
        let mut v: Vec<f64> = self.per_request.iter().filter_map(f).collect();
        median_and_half_iqr(&mut v).1
    }
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
            let subject = format!("{} {}", x.model, l.name());
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
                &format!("{} {}", x.model, m.by),
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
        let shown = newest_per_network(runs);
        let parsed: Vec<InferResults> = shown
            .iter()
            .map(|r| parse(&r.result).expect("checked at load"))
            .collect();
        let models: Vec<&str> = parsed.iter().map(|p| p.model.as_str()).collect();
        let names: Vec<String> = series_names(&shown)
            .into_iter()
            .zip(&models)
            .map(|(n, m)| {
                if models.iter().any(|o| o != m) {
                    format!("{n} · {m}")
                } else {
                    n
                }
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
                    Cell::from(lv.name()),
                    Cell::Num(format!("{}/{}", lv.ok, lv.requests)),
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

        // Closed-loop levels as curves against concurrency.
        let curve = |f: fn(&Level) -> Option<f64>| -> Vec<Series> {
            names
                .iter()
                .zip(&parsed)
                .enumerate()
                .filter_map(|(i, (name, x))| {
                    let points: Vec<(f64, f64)> = x
                        .levels
                        .iter()
                        .filter(|l| l.rate_per_s.is_none())
                        .filter_map(|l| Some((l.concurrency? as f64, f(l)?)))
                        .collect();
                    (!points.is_empty()).then(|| Series {
                        name: name.clone(),
                        points,
                        colour: Some(i),
                        ..Default::default()
                    })
                })
                .collect()
        };
        let rate = curve(|l| (l.ok > 0).then_some(l.aggregate_tokens_per_s));
        if !rate.is_empty() {
            body.push_str(&chart::line_chart(&LineChart {
                title: "Aggregate output tokens/s vs concurrency".into(),
                x_label: "concurrent requests".into(),
                y_label: "tokens/s".into(),
                x: XAxis::Count,
                log_y: false,
                series: rate,
                hlines: vec![],
            }));
        }
        let ttft = curve(|l| l.ttft_ms.map(|d| d.median));
        if !ttft.is_empty() {
            body.push_str(&chart::line_chart(&LineChart {
                title: "TTFT p50 vs concurrency".into(),
                x_label: "concurrent requests".into(),
                y_label: "TTFT p50 (ms)".into(),
                x: XAxis::Count,
                log_y: false,
                series: ttft,
                hlines: vec![],
            }));
        }
        (body, json!({ "levels": data }))
    }
}
