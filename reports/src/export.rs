//! Key figures in the formats regression-tracking services ingest, so existing dashboards take
//! tbbench results as they are:
//! - github-action-benchmark's custom tools: a JSON array of `{name, unit, value, range, extra}`,
//!   one file for `customBiggerIsBetter` and one for `customSmallerIsBetter` (the action takes
//!   one direction per file).
//! - Bencher Metric Format: `{benchmark: {measure-slug: {value, lower_value, upper_value}}}`.

use crate::compare::Aggregate;
use crate::metrics::Better;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    GithubActionBenchmark,
    Bencher,
}

impl Format {
    pub fn parse(s: &str) -> Result<Format, String> {
        match s {
            "github-action-benchmark" => Ok(Format::GithubActionBenchmark),
            "bencher" => Ok(Format::Bencher),
            other => Err(format!(
                "unknown export format '{other}' (use github-action-benchmark or bencher)"
            )),
        }
    }
}

/// (file name, document) pairs for one format.
pub fn export(format: Format, figures: &BTreeMap<String, Aggregate>) -> Vec<(String, Value)> {
    match format {
        Format::GithubActionBenchmark => {
            let side = |better: Better| -> Value {
                Value::Array(
                    figures
                        .values()
                        .filter(|a| a.metric.better == better)
                        .map(|a| {
                            json!({
                                "name": a.metric.key,
                                "unit": a.metric.unit,
                                "value": a.value,
                                "range": format!("± {}", crate::chart::number_label(a.spread)),
                                "extra": format!("suite: {}\nnetwork: {}\nruns: {}",
                                                 a.metric.suite, a.metric.network, a.runs),
                            })
                        })
                        .collect(),
                )
            };
            vec![
                (
                    "github-action-benchmark-bigger.json".into(),
                    side(Better::Higher),
                ),
                (
                    "github-action-benchmark-smaller.json".into(),
                    side(Better::Lower),
                ),
            ]
        }
        Format::Bencher => {
            let mut doc: Map<String, Value> = Map::new();
            for a in figures.values() {
                let bench = format!(
                    "{} · {} · {}",
                    a.metric.suite, a.metric.network, a.metric.subject
                );
                let slug = if a.metric.measure == a.metric.unit {
                    slug(&a.metric.measure)
                } else {
                    slug(&format!("{} {}", a.metric.measure, a.metric.unit))
                };
                let entry = doc.entry(bench).or_insert_with(|| json!({}));
                entry[slug] = json!({
                    "value": a.value,
                    "lower_value": a.value - a.spread,
                    "upper_value": a.value + a.spread,
                });
            }
            vec![("bencher.json".into(), Value::Object(doc))]
        }
    }
}

/// A Bencher measure slug: lowercase ASCII letters, digits and dashes, at most 64 characters.
pub fn slug(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
    }
    let mut out = out.trim_end_matches('-').to_string();
    out.truncate(64);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_what_bencher_accepts() {
        assert_eq!(slug("latency p50 us"), "latency-p50-us");
        assert_eq!(slug("bw Gbit/s"), "bw-gbit-s");
        assert_eq!(slug("Gflops"), "gflops");
    }
}
