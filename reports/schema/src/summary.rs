//! The spread of a measured figure, the same record for every suite: link latencies and
//! per-iteration rates, the decode's per-token times, the token rates of a server's requests.
//! Every reader (tables, the report, compare) reads this one type.

use serde::{Deserialize, Serialize};

/// n, min, median, mean, max, stdev and p99 of a set of values, in the unit the field that
/// holds it names, plus p90 or p99.9 (see [`Percentiles`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub n: u64,
    pub min: f64,
    pub median: f64,
    pub mean: f64,
    pub max: f64,
    /// Sample standard deviation (n − 1).
    pub stdev: f64,
    /// Where the values are few (the requests of an infer level).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p90: Option<f64>,
    pub p99: f64,
    /// Where the values are many (every iteration of a link latency, every decoded token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p999: Option<f64>,
}

/// The percentile a summary carries beside the median and p99. A few dozen requests say
/// nothing about one in a thousand, but their p90 is worth reading; thousands of iterations
/// make p99.9 meaningful. Each suite's files have always carried one of the two, and readers
/// rely on which.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Percentiles {
    P90,
    P999,
}

impl Summary {
    /// Exact summary of `values` (non-finite ones left out): the median halfway between the
    /// middle two when n is even, percentiles by nearest rank. All values are held anyway, so
    /// nothing is approximated; an empty set gives n = 0 and zeros.
    pub fn of(values: &[f64], extra: Percentiles) -> Summary {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Summary::default();
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let mean = v.iter().sum::<f64>() / n as f64;
        let var = if n > 1 {
            v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64
        } else {
            0.0
        };
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        let rank = |q: f64| v[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
        Summary {
            n: n as u64,
            min: v[0],
            median,
            mean,
            max: v[n - 1],
            stdev: var.sqrt(),
            p90: (extra == Percentiles::P90).then(|| rank(0.90)),
            p99: rank(0.99),
            p999: (extra == Percentiles::P999).then(|| rank(0.999)),
        }
    }

    /// [`Summary::of`], or None when no value is finite: for figures a file leaves out when
    /// nothing measured them.
    pub fn of_any(values: &[f64], extra: Percentiles) -> Option<Summary> {
        Some(Summary::of(values, extra)).filter(|s| s.n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_known_values() {
        let s = Summary::of(&[4.0, 1.0, 3.0, 2.0], Percentiles::P999);
        assert_eq!(
            (s.n, s.min, s.median, s.max, s.mean),
            (4, 1.0, 2.5, 4.0, 2.5)
        );
        assert!((s.stdev - 1.2909944).abs() < 1e-6);
        assert_eq!((s.p99, s.p999, s.p90), (4.0, Some(4.0), None));
        let many: Vec<f64> = (1..=1000).map(|x| x as f64).collect();
        let s = Summary::of(&many, Percentiles::P999);
        assert_eq!((s.p99, s.p999), (990.0, Some(999.0)));
        let s = Summary::of(&many[..100], Percentiles::P90);
        assert_eq!((s.p90, s.p99, s.p999), (Some(90.0), 99.0, None));
        assert_eq!((s.median, s.mean), (50.5, 50.5));
        assert_eq!(Summary::of(&[], Percentiles::P999).n, 0);
        assert!(Summary::of_any(&[f64::NAN], Percentiles::P90).is_none());
        let one = Summary::of_any(&[0.25, f64::INFINITY], Percentiles::P90).unwrap();
        assert_eq!((one.n, one.median, one.stdev), (1, 0.25, 0.0));
    }

    /// The keys each suite's files carry, in the order they are written: link and decode
    /// with p999, infer with p90, never both.
    #[test]
    fn json_keys_follow_the_percentiles() {
        let keys = |s: Summary| -> Vec<String> {
            match serde_json::to_value(s).unwrap() {
                serde_json::Value::Object(m) => m.keys().cloned().collect(),
                _ => unreachable!(),
            }
        };
        let k = keys(Summary::of(&[1.0, 2.0], Percentiles::P999));
        assert_eq!(
            k,
            ["n", "min", "median", "mean", "max", "stdev", "p99", "p999"]
        );
        let k = keys(Summary::of(&[1.0, 2.0], Percentiles::P90));
        assert_eq!(
            k,
            ["n", "min", "median", "mean", "max", "stdev", "p90", "p99"]
        );
    }

    /// Both shapes in existing files read: link's and decode's with p999, infer's with p90 (its
    /// keys in another order).
    #[test]
    fn reads_both_shapes() {
        let link: Summary = serde_json::from_str(
            r#"{"n":3,"min":1,"median":2,"mean":2,"max":3,"stdev":1,"p99":3,"p999":3}"#,
        )
        .unwrap();
        assert_eq!((link.p90, link.p999), (None, Some(3.0)));
        let infer: Summary = serde_json::from_str(
            r#"{"n":3,"min":1,"median":2,"p90":3,"p99":3,"mean":2,"max":3,"stdev":1}"#,
        )
        .unwrap();
        assert_eq!((infer.p90, infer.p999), (Some(3.0), None));
    }
}
