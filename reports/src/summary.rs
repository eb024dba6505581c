//! Summaries of repeated measurements: n, min, median, mean, max, stdev, p99, p99.9.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub n: u64,
    pub min: f64,
    pub median: f64,
    pub mean: f64,
    pub max: f64,
    /// Sample standard deviation (n − 1).
    pub stdev: f64,
    pub p99: f64,
    pub p999: f64,
}

impl Summary {
    /// Exact summary of a handful of values (repetitions); percentiles by nearest rank.
    pub fn of(values: &[f64]) -> Summary {
        if values.is_empty() {
            return Summary::default();
        }
        let mut v: Vec<f64> = values.to_vec();
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
            p99: rank(0.99),
            p999: rank(0.999),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_known_values() {
        let s = Summary::of(&[4.0, 1.0, 3.0, 2.0]);
        assert_eq!(
            (s.n, s.min, s.median, s.max, s.mean),
            (4, 1.0, 2.5, 4.0, 2.5)
        );
        assert!((s.stdev - 1.2909944).abs() < 1e-6);
        assert_eq!(s.p99, 4.0);
        let many: Vec<f64> = (1..=1000).map(|x| x as f64).collect();
        let s = Summary::of(&many);
        assert_eq!((s.p99, s.p999), (990.0, 999.0));
        assert_eq!(Summary::of(&[]).n, 0);
    }
}
