//! Key figures of a run, the common currency of `compare`, history charts and the exports.
//! Each suite's view ([`crate::views::SuiteView`]) says which figures its result holds and
//! which way is better; everything downstream works on [`Metric`]s only, so a new suite brings
//! its own list.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    Higher,
    Lower,
}

#[derive(Debug, Clone, Serialize)]
pub struct Metric {
    /// Stable across runs of the same configuration: what compare and history match on,
    /// "suite · network · measure · subject", e.g. "link · tcp/lo (loopback) · latency p50 · 8 B".
    pub key: String,
    pub suite: String,
    /// The result's network label.
    pub network: String,
    /// What is measured: "latency p50", "bw", "bibw", "Gflops".
    pub measure: String,
    /// What it is measured on: a message size, an HPL configuration.
    pub subject: String,
    pub unit: String,
    pub better: Better,
    pub value: f64,
    /// How far the figure moves between repetitions inside one run (same unit as value):
    /// half the interquartile range of the samples, or their standard deviation. 0 when the
    /// run measured it once.
    pub spread: f64,
    /// A headline figure: gets a trend chart and leads the tables.
    pub headline: bool,
}

impl Metric {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        r: &crate::ResultFile,
        measure: &str,
        subject: &str,
        unit: &str,
        better: Better,
        value: f64,
        spread: f64,
        headline: bool,
    ) -> Metric {
        Metric {
            key: format!(
                "{} · {} · {measure} · {subject}",
                r.suite,
                crate::views::network_label(&r.network)
            ),
            suite: r.suite.clone(),
            network: crate::views::network_label(&r.network),
            measure: measure.into(),
            subject: subject.into(),
            unit: unit.into(),
            better,
            value,
            spread,
            headline,
        }
    }

    /// "latency p50 8 B": the measurement without suite and network.
    pub fn name(&self) -> String {
        format!("{} {}", self.measure, self.subject)
    }

    /// The change from `old` to this value in percent, positive when it got better.
    pub fn improvement_pct(&self, old: f64) -> f64 {
        if old == 0.0 {
            return 0.0;
        }
        let change = (self.value - old) / old.abs() * 100.0;
        match self.better {
            Better::Higher => change,
            Better::Lower => -change,
        }
    }
}

/// Sample statistics used for spreads: (median, half the interquartile range).
pub fn median_and_half_iqr(samples: &mut [f64]) -> (f64, f64) {
    if samples.is_empty() {
        return (0.0, 0.0);
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| {
        let pos = p * (samples.len() - 1) as f64;
        let lo = pos.floor() as usize;
        let hi = pos.ceil() as usize;
        samples[lo] + (samples[hi] - samples[lo]) * (pos - lo as f64)
    };
    (q(0.5), (q(0.75) - q(0.25)) / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn improvement_follows_the_direction() {
        let m = |better, value| Metric {
            key: "k".into(),
            suite: "s".into(),
            network: "n".into(),
            measure: "m".into(),
            subject: "x".into(),
            unit: "u".into(),
            better,
            value,
            spread: 0.0,
            headline: false,
        };
        assert_eq!(m(Better::Higher, 110.0).improvement_pct(100.0), 10.0);
        assert_eq!(m(Better::Lower, 110.0).improvement_pct(100.0), -10.0);
        assert_eq!(m(Better::Lower, 90.0).improvement_pct(100.0), 10.0);
    }

    #[test]
    fn quartiles_interpolate() {
        let mut v: Vec<f64> = (1..=9).rev().map(|x| x as f64).collect();
        assert_eq!(median_and_half_iqr(&mut v), (5.0, 2.0));
        assert_eq!(median_and_half_iqr(&mut []), (0.0, 0.0));
    }
}
