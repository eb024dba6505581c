//! `tbbench compare BASE NEW`: every key figure old vs new, and a verdict a CI job can gate on.
//!
//! A change is a regression only when it goes the bad way by more than the threshold AND by
//! more than the runs' own spread (old spread + new spread): a noisy figure that moved within
//! its noise is not a regression, however large the percentage.

use crate::load::Loaded;
use crate::metrics::{Better, Metric};
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    Regressed,
    Improved,
    Unchanged,
    OnlyInBase,
    OnlyInNew,
}

impl Verdict {
    pub fn as_str(&self) -> &'static str {
        match self {
            Verdict::Regressed => "REGRESSED",
            Verdict::Improved => "improved",
            Verdict::Unchanged => "unchanged",
            Verdict::OnlyInBase => "only in base",
            Verdict::OnlyInNew => "only in new",
        }
    }
}

/// One figure of one side, over all of that side's runs.
#[derive(Debug, Clone, Serialize)]
pub struct Aggregate {
    pub metric: Metric,
    /// Median over the runs.
    pub value: f64,
    /// The larger of the typical within-run spread and the spread between runs.
    pub spread: f64,
    pub runs: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub key: String,
    pub suite: String,
    pub network: String,
    pub measure: String,
    pub subject: String,
    pub unit: String,
    pub better: Better,
    pub old: Option<f64>,
    pub old_spread: Option<f64>,
    pub new: Option<f64>,
    pub new_spread: Option<f64>,
    /// (new − old) / old in percent, signed as measured (not by direction).
    pub change_pct: Option<f64>,
    pub verdict: Verdict,
}

#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub threshold_pct: f64,
    pub rows: Vec<Row>,
    /// New runs whose own verification failed (HPL FAILED, payload corrupted): regressions
    /// whatever their speed.
    pub failed_verification: Vec<String>,
}

impl Comparison {
    pub fn regressions(&self) -> usize {
        self.rows
            .iter()
            .filter(|r| r.verdict == Verdict::Regressed)
            .count()
            + self.failed_verification.len()
    }

    pub fn comparable(&self) -> usize {
        self.rows
            .iter()
            .filter(|r| r.old.is_some() && r.new.is_some())
            .count()
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn stdev(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return 0.0;
    }
    let m = v.iter().sum::<f64>() / v.len() as f64;
    (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
}

/// Key figures of several runs of one side, by key.
pub fn aggregate(metrics: Vec<Vec<Metric>>) -> BTreeMap<String, Aggregate> {
    let mut by_key: BTreeMap<String, Vec<Metric>> = BTreeMap::new();
    for run in metrics {
        for m in run {
            by_key.entry(m.key.clone()).or_default().push(m);
        }
    }
    by_key
        .into_iter()
        .map(|(k, ms)| {
            let mut values: Vec<f64> = ms.iter().map(|m| m.value).collect();
            let between = stdev(&values);
            let mut spreads: Vec<f64> = ms.iter().map(|m| m.spread).collect();
            let agg = Aggregate {
                metric: ms[0].clone(),
                value: median(&mut values),
                spread: median(&mut spreads).max(between),
                runs: ms.len(),
            };
            (k, agg)
        })
        .collect()
}

/// The rule, in one place: worse by more than the threshold and by more than the spreads.
pub fn judge(
    better: Better,
    old: f64,
    old_spread: f64,
    new: f64,
    new_spread: f64,
    threshold_pct: f64,
) -> Verdict {
    let delta = new - old;
    let rel = if old != 0.0 {
        delta.abs() / old.abs() * 100.0
    } else if delta != 0.0 {
        f64::INFINITY
    } else {
        0.0
    };
    let significant = rel > threshold_pct && delta.abs() > old_spread + new_spread;
    let worse = match better {
        Better::Higher => delta < 0.0,
        Better::Lower => delta > 0.0,
    };
    match (significant, worse) {
        (false, _) => Verdict::Unchanged,
        (true, true) => Verdict::Regressed,
        (true, false) => Verdict::Improved,
    }
}

pub fn compare(
    base: &[Loaded],
    new: &[Loaded],
    metrics_of: &dyn Fn(&Loaded) -> Vec<Metric>,
    threshold_pct: f64,
) -> Comparison {
    let b = aggregate(base.iter().map(metrics_of).collect());
    let n = aggregate(new.iter().map(metrics_of).collect());
    let mut keys: Vec<&String> = b.keys().chain(n.keys()).collect();
    keys.sort();
    keys.dedup();
    let rows = keys
        .into_iter()
        .map(|k| {
            let (o, w) = (b.get(k), n.get(k));
            let m = &o.or(w).expect("key from one side").metric;
            let verdict = match (o, w) {
                (Some(o), Some(w)) => judge(
                    m.better,
                    o.value,
                    o.spread,
                    w.value,
                    w.spread,
                    threshold_pct,
                ),
                (Some(_), None) => Verdict::OnlyInBase,
                _ => Verdict::OnlyInNew,
            };
            Row {
                key: k.clone(),
                suite: m.suite.clone(),
                network: m.network.clone(),
                measure: m.measure.clone(),
                subject: m.subject.clone(),
                unit: m.unit.clone(),
                better: m.better,
                old: o.map(|a| a.value),
                old_spread: o.map(|a| a.spread),
                new: w.map(|a| a.value),
                new_spread: w.map(|a| a.spread),
                change_pct: match (o, w) {
                    (Some(o), Some(w)) if o.value != 0.0 => {
                        Some((w.value - o.value) / o.value.abs() * 100.0)
                    }
                    _ => None,
                },
                verdict,
            }
        })
        .collect();
    let failed_verification = new
        .iter()
        .filter(|l| !l.result.verification.passed)
        .map(|l| {
            let failed = l.result.verification.failed();
            format!(
                "{}: verification failed ({})",
                l.path.display(),
                if failed.is_empty() {
                    "no checks ran".to_string()
                } else {
                    failed.join(", ")
                }
            )
        })
        .collect();
    Comparison {
        threshold_pct,
        rows,
        failed_verification,
    }
}

fn fmt(v: Option<f64>) -> String {
    match v {
        Some(v) => crate::chart::number_label(v),
        None => "–".into(),
    }
}

/// The table on stdout: one line per figure, regressions first so a CI log shows them at once.
/// The widest cell of the terminal table.
const MAX_CELL_CHARS: usize = 80;

/// `c`, cut to `max` characters with an ellipsis where it was longer.
fn cut_cell(c: String, max: usize) -> String {
    match c.char_indices().nth(max.saturating_sub(1)) {
        Some((i, _)) if c.chars().count() > max => format!("{}…", &c[..i]),
        _ => c,
    }
}

pub fn text_table(c: &Comparison) -> String {
    let mut rows: Vec<&Row> = c.rows.iter().collect();
    rows.sort_by_key(|r| {
        (
            r.verdict != Verdict::Regressed,
            r.verdict != Verdict::Improved,
        )
    });
    let cells: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            [
                format!("{} · {} · {} {}", r.suite, r.network, r.measure, r.subject),
                r.unit.clone(),
                match r.better {
                    Better::Higher => "higher".into(),
                    Better::Lower => "lower".into(),
                },
                format!("{} ±{}", fmt(r.old), fmt(r.old_spread)),
                format!("{} ±{}", fmt(r.new), fmt(r.new_spread)),
                r.change_pct
                    .map(|p| format!("{p:+.1}%"))
                    .unwrap_or_else(|| "–".into()),
                r.verdict.as_str().to_string(),
            ]
        })
        .collect();
    // A cell wider than a terminal line (a long label in a figure's name) is cut here, so
    // one cell does not pad every line; the JSON keeps it whole.
    let cells: Vec<Vec<String>> = cells
        .into_iter()
        .map(|row| {
            row.into_iter()
                .map(|c| cut_cell(c, MAX_CELL_CHARS))
                .collect()
        })
        .collect();
    let headers = [
        "figure", "unit", "better", "old", "new", "change", "verdict",
    ];
    let mut width: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &cells {
        for (w, c) in width.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cols: Vec<&str>| -> String {
        let mut s = String::new();
        for (i, c) in cols.iter().enumerate() {
            let pad = width[i].saturating_sub(c.chars().count());
            if i == 0 || i == 1 || i == 2 || i == 6 {
                s.push_str(c);
                s.push_str(&" ".repeat(pad));
            } else {
                s.push_str(&" ".repeat(pad));
                s.push_str(c);
            }
            s.push_str("  ");
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(headers.to_vec());
    for row in &cells {
        out.push_str(&line(row.iter().map(|s| s.as_str()).collect()));
    }
    for f in &c.failed_verification {
        out.push_str(&format!("REGRESSED  {f}\n"));
    }
    out.push_str(&format!(
        "{} regression(s) among {} compared figures (threshold {}%, and beyond the runs' spread)\n",
        c.regressions(),
        c.comparable(),
        c.threshold_pct
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regression_needs_both_the_threshold_and_the_spread() {
        use Better::*;
        // 20% slower, spreads small: regression.
        assert_eq!(
            judge(Higher, 100.0, 1.0, 80.0, 1.0, 5.0),
            Verdict::Regressed
        );
        // 20% slower but within the spreads: not.
        assert_eq!(
            judge(Higher, 100.0, 15.0, 80.0, 10.0, 5.0),
            Verdict::Unchanged
        );
        // Beyond the spread but under the threshold: not.
        assert_eq!(
            judge(Higher, 100.0, 0.0, 97.0, 0.0, 5.0),
            Verdict::Unchanged
        );
        // Latency up is worse, down is better.
        assert_eq!(judge(Lower, 10.0, 0.1, 12.0, 0.1, 5.0), Verdict::Regressed);
        assert_eq!(judge(Lower, 10.0, 0.1, 8.0, 0.1, 5.0), Verdict::Improved);
        // A figure that was 0 and moved is beyond any threshold.
        assert_eq!(judge(Lower, 0.0, 0.0, 1.0, 0.0, 5.0), Verdict::Regressed);
    }

    #[test]
    fn aggregate_takes_the_median_and_the_wider_spread() {
        let r = crate::ResultFile {
            schema_version: 1,
            suite: "link".into(),
            tool: crate::Tool {
                name: "t".into(),
                version: "0".into(),
                git_commit: "x".into(),
            },
            started_at: String::new(),
            finished_at: String::new(),
            params: serde_json::Value::Null,
            hosts: vec![],
            ranks: vec![],
            network: crate::Network {
                label: "lo".into(),
                ..Default::default()
            },
            results: serde_json::Value::Null,
            verification: Default::default(),
            warnings: vec![],
        };
        let m = |v, s| Metric::new(&r, "bw", "1 MiB", "Gbit/s", Better::Higher, v, s, true);
        let agg = aggregate(vec![
            vec![m(10.0, 0.1)],
            vec![m(12.0, 0.1)],
            vec![m(11.0, 0.2)],
        ]);
        let a = &agg["link · lo · bw · 1 MiB"];
        assert_eq!((a.value, a.runs), (11.0, 3));
        assert!(
            (a.spread - 1.0).abs() < 1e-9,
            "between-run stdev wins: {}",
            a.spread
        );
    }
}
