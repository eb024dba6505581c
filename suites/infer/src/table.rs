//! The human table: one row per level, printed as each level ends.

use crate::figures::Level;
use tbbench_schema::Summary;

pub fn header() -> String {
    format!(
        "{:<16} {:>5} {:>5} | {:>8} {:>8} {:>8} | {:>7} {:>7} | {:>7} {:>7} | {:>8} | {:>8} | {:>9} | tokens",
        "level", "ok", "fail", "TTFT p50", "p90", "p99 ms", "TPOT p50", "p90 ms", "gap p50", "p99 ms",
        "E2E p50", "tok/s p50", "aggr tok/s"
    )
}

fn f(d: &Option<Summary>, pick: fn(&Summary) -> Option<f64>, decimals: usize) -> String {
    d.as_ref()
        .and_then(pick)
        .map(|v| format!("{v:.decimals$}"))
        .unwrap_or_else(|| "-".into())
}

pub fn row(l: &Level) -> String {
    format!(
        "{:<16} {:>5} {:>5} | {:>8} {:>8} {:>8} | {:>8} {:>7} | {:>7} {:>7} | {:>8} | {:>9} | {:>10.1} | {}",
        l.name(),
        l.ok,
        l.failed,
        f(&l.ttft_ms, |d| Some(d.median), 1),
        f(&l.ttft_ms, |d| d.p90, 1),
        f(&l.ttft_ms, |d| Some(d.p99), 1),
        f(&l.tpot_ms, |d| Some(d.median), 2),
        f(&l.tpot_ms, |d| d.p90, 2),
        f(&l.gap_ms, |d| Some(d.median), 2),
        f(&l.gap_ms, |d| Some(d.p99), 2),
        f(&l.e2e_ms, |d| Some(d.median), 0),
        f(&l.decode_tokens_per_s, |d| Some(d.median), 1),
        l.aggregate_tokens_per_s,
        match (l.token_source, l.tokens_approximate) {
            (_, true) => "chunks (approximate)".to_string(),
            (Some(s), false) => serde_json::to_value(s)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            (None, _) => "-".into(),
        }
    )
}

/// The line under a level's row where `--slo` is given: how many met every target, the
/// goodput, and whether the level meets the SLO.
pub fn goodput_line(g: &crate::slo::Goodput) -> String {
    format!(
        "{:<16} SLO {}: {:.0}% of requests met every target; goodput {:.2} requests/s, {:.1} output tokens/s",
        "",
        if g.met { "met" } else { "NOT met" },
        g.share_met * 100.0,
        g.requests_per_s,
        g.output_tokens_per_s
    )
}
