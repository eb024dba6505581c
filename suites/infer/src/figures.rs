//! From request records to a level's figures: distributions (min, median, p90, p99, mean,
//! max, stdev), failures by kind, and the aggregate rate.

use crate::request::{Record, TokenSource};
use serde::Serialize;
use std::collections::BTreeMap;
use tbbench_schema::{Percentiles, Summary};

/// One figure over the requests of a level, in the unit its field name says; None when no
/// request measured it.
fn dist(values: &[f64]) -> Option<Summary> {
    Summary::of_any(values, Percentiles::P90)
}

/// One measurement: a concurrency level (closed loop) or an arrival rate (open loop).
#[derive(Debug, Clone, Serialize)]
pub struct Level {
    /// "closed" (N workers, each sending its next request when the last one ended) or "open"
    /// (arrivals at `rate_per_s` as `arrivals` says, whatever is still running).
    pub mode: &'static str,
    /// In a `--sweep`: "synchronous" (one at a time), "throughput" (every request at once) or
    /// "constant" (a rate between).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sweep: Option<&'static str>,
    /// `--context`: the prompt length asked for, tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_per_s: Option<f64>,
    /// Open loop: constant, poisson or gamma:SHAPE.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arrivals: Option<crate::load::Arrivals>,
    /// Open loop: why the level stopped sending before its last request (the server
    /// saturated); its unsent requests are in `not_sent`, not in `requests`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<crate::load::Stopped>,
    pub requests: u64,
    pub ok: u64,
    pub failed: u64,
    /// Failed requests by kind: connect, timeout, http-NNN, broken-stream, stream-error,
    /// bad-response, empty-stream.
    pub failures: BTreeMap<String, u64>,
    /// From the first request's start to the last one's end.
    pub wall_s: f64,
    /// Output tokens of the completed requests.
    pub output_tokens: u64,
    /// output_tokens / wall_s.
    pub aggregate_tokens_per_s: f64,
    /// The weakest source any completed request's count came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_source: Option<TokenSource>,
    /// True when some count is a chunk count (a chunk may hold several tokens).
    pub tokens_approximate: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<Summary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_content_ms: Option<Summary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_reasoning_ms: Option<Summary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tpot_ms: Option<Summary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gap_ms: Option<Summary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub e2e_ms: Option<Summary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode_tokens_per_s: Option<Summary>,
    /// The server reported no prompt counts: `prompt_tokens` (and the prefill rate) are the
    /// lengths the prompts were tuned to from the warm-up's counts.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub prompt_tokens_estimated: bool,
    /// Prompt tokens over TTFT, per request: the prefill rate as the client sees it (queueing
    /// included).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill_tokens_per_s: Option<Summary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connect_ms: Option<Summary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<Summary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_tokens_per_request: Option<Summary>,
    /// Open loop: the most requests in flight at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<usize>,
    /// Open loop: how late requests started against their Poisson schedule.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dispatch_lag_ms: Option<Summary>,
    /// Against `--slo`, where given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goodput: Option<crate::slo::Goodput>,
    pub per_request: Vec<Record>,
}

impl Level {
    pub fn new(
        concurrency: Option<usize>,
        rate_per_s: Option<f64>,
        mut records: Vec<Record>,
        lags_ms: Vec<f64>,
    ) -> Level {
        records.sort_by_key(|r| r.index);
        let ok: Vec<&Record> = records.iter().filter(|r| r.ok).collect();
        let mut failures = BTreeMap::new();
        for r in records.iter().filter(|r| !r.ok) {
            let k = r
                .fail_kind
                .map(|k| k.to_string())
                .unwrap_or_else(|| "unknown".into());
            *failures.entry(k).or_insert(0) += 1;
        }
        let begin = records
            .iter()
            .map(|r| r.start_s)
            .fold(f64::INFINITY, f64::min);
        let end = records.iter().map(|r| r.end_s).fold(0.0, f64::max);
        let wall_s = if begin.is_finite() { end - begin } else { 0.0 };
        let output_tokens: u64 = ok.iter().filter_map(|r| r.output_tokens).sum();
        let pick = |f: fn(&Record) -> Option<f64>| {
            dist(&ok.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
        };
        let gaps: Vec<f64> = ok
            .iter()
            .flat_map(|r| r.gaps_us.iter().map(|&g| g as f64 / 1e3))
            .collect();
        let token_source = ok.iter().filter_map(|r| r.token_source).max();
        let max_in_flight = rate_per_s.map(|_| {
            let mut edges: Vec<(f64, i32)> = records
                .iter()
                .flat_map(|r| [(r.start_s, 1), (r.end_s, -1)])
                .collect();
            edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let mut now = 0;
            let mut most = 0;
            for (_, d) in edges {
                now += d;
                most = most.max(now);
            }
            most as usize
        });
        Level {
            mode: if rate_per_s.is_some() {
                "open"
            } else {
                "closed"
            },
            sweep: None,
            context: None,
            prompt_tokens_estimated: false,
            concurrency,
            rate_per_s,
            arrivals: None,
            stopped: None,
            requests: records.len() as u64,
            ok: ok.len() as u64,
            failed: (records.len() - ok.len()) as u64,
            failures,
            wall_s,
            output_tokens,
            aggregate_tokens_per_s: if wall_s > 0.0 {
                output_tokens as f64 / wall_s
            } else {
                0.0
            },
            token_source,
            tokens_approximate: token_source == Some(TokenSource::Chunks),
            ttft_ms: pick(|r| r.ttft_ms),
            ttft_content_ms: pick(|r| r.ttft_content_ms),
            ttft_reasoning_ms: pick(|r| r.ttft_reasoning_ms),
            tpot_ms: pick(|r| r.tpot_ms),
            gap_ms: dist(&gaps),
            e2e_ms: pick(|r| r.e2e_ms),
            decode_tokens_per_s: pick(|r| r.decode_tokens_per_s),
            prefill_tokens_per_s: pick(|r| {
                let (p, t) = (r.prompt_tokens?, r.ttft_ms?);
                (t > 0.0).then(|| p as f64 / (t / 1e3))
            }),
            connect_ms: pick(|r| r.connect_ms),
            prompt_tokens: pick(|r| r.prompt_tokens.map(|p| p as f64)),
            output_tokens_per_request: pick(|r| r.output_tokens.map(|p| p as f64)),
            max_in_flight,
            dispatch_lag_ms: if rate_per_s.is_some() {
                dist(&lags_ms)
            } else {
                None
            },
            goodput: None,
            per_request: records,
        }
    }

    /// "c=4", "rate=2/s" or "ctx=8192 c=1": how tables and the report name the level.
    pub fn name(&self) -> String {
        let load = match (self.concurrency, self.rate_per_s) {
            (_, Some(r)) => format!("rate={r}/s"),
            (Some(c), None) => format!("c={c}"),
            (None, None) => "?".into(),
        };
        match self.context {
            Some(d) => format!("ctx={d} {load}"),
            None => load,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::FailKind;

    #[test]
    fn distributions_carry_p90_and_leave_out_what_nothing_measured() {
        let v: Vec<f64> = (1..=100).map(|x| x as f64).collect();
        let d = dist(&v).unwrap();
        assert_eq!((d.n, d.min, d.max), (100, 1.0, 100.0));
        assert_eq!((d.p90, d.p99, d.p999), (Some(90.0), 99.0, None));
        assert!(dist(&[]).is_none());
        assert!(dist(&[f64::NAN]).is_none());
    }

    #[test]
    fn a_level_counts_tokens_over_wall_time_and_failures_by_kind() {
        let ok = |i, start, end, tokens| Record {
            index: i,
            ok: true,
            start_s: start,
            end_s: end,
            output_tokens: Some(tokens),
            token_source: Some(TokenSource::Usage),
            ttft_ms: Some(10.0),
            ..Default::default()
        };
        let mut failed = Record {
            index: 2,
            start_s: 0.5,
            end_s: 3.0,
            ..Default::default()
        };
        failed.fail_kind = Some(FailKind::Http(500));
        let l = Level::new(
            Some(2),
            None,
            vec![ok(0, 0.0, 1.0, 50), ok(1, 0.0, 2.0, 50), failed],
            vec![],
        );
        assert_eq!((l.ok, l.failed), (2, 1));
        assert_eq!(l.failures.get("http-500"), Some(&1));
        assert_eq!(l.wall_s, 3.0, "a failed request's time is wall time too");
        assert!((l.aggregate_tokens_per_s - 100.0 / 3.0).abs() < 1e-9);
        assert!(!l.tokens_approximate);
        assert_eq!(l.name(), "c=2");
    }
}
