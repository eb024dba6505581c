//! Service-level objectives for a run against a server: targets on TTFT, TPOT and E2E
//! (`--slo ttft=500ms,tpot=50ms,e2e=10s`), a level's goodput against them (the requests, and
//! their output tokens, per second of the level that met every target, as vLLM's `bench
//! serve` and AIPerf count it), whether the level meets the objective (at least
//! `--slo-percentile` percent of its requests met every target), and `--find-max`: the
//! highest concurrency or arrival rate that still does, found in few probes.

use crate::figures::Level;
use crate::request::Record;
use serde::Serialize;

/// The targets, in milliseconds, and the share of requests that must meet them all.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Slo {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tpot_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub e2e_ms: Option<f64>,
    /// Percent of a level's requests that must meet every target (99: MLPerf's p99 TTFT and
    /// TPOT).
    pub percentile: f64,
}

impl Slo {
    /// `ttft=500ms,tpot=50ms,e2e=10s`: any of the three, each at most once, durations as
    /// tbbench reads them (ms, s, m).
    pub fn parse(spec: &str, percentile: f64) -> Result<Slo, String> {
        if !(percentile > 0.0 && percentile <= 100.0) {
            return Err(format!(
                "--slo-percentile must be above 0 and at most 100, not {percentile}"
            ));
        }
        let mut slo = Slo {
            ttft_ms: None,
            tpot_ms: None,
            e2e_ms: None,
            percentile,
        };
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part.split_once('=').ok_or_else(|| {
                format!("--slo: '{part}' is not NAME=DURATION (ttft=500ms, tpot=50ms, e2e=10s)")
            })?;
            let d = tbbench_runners::units::parse_duration(value)
                .map_err(|e| format!("--slo {key}: {e}"))?;
            let ms = d.as_secs_f64() * 1e3;
            if ms <= 0.0 {
                return Err(format!("--slo {key}: a target must be above zero"));
            }
            let slot = match key.trim() {
                "ttft" => &mut slo.ttft_ms,
                "tpot" => &mut slo.tpot_ms,
                "e2e" => &mut slo.e2e_ms,
                other => {
                    return Err(format!(
                        "--slo: '{other}' is not a target tbbench knows (ttft, tpot, e2e)"
                    ))
                }
            };
            if slot.replace(ms).is_some() {
                return Err(format!("--slo: {key} is given twice"));
            }
        }
        if slo.ttft_ms.is_none() && slo.tpot_ms.is_none() && slo.e2e_ms.is_none() {
            return Err("--slo names no target (ttft=500ms, tpot=50ms, e2e=10s)".into());
        }
        Ok(slo)
    }

    /// Whether one request met every target. A failed request met none; a request of one
    /// output token has no TPOT, which then holds no target against it.
    pub fn met(&self, r: &Record) -> bool {
        let within = |target: Option<f64>, value: Option<f64>, needed: bool| match target {
            None => true,
            Some(t) => match value {
                Some(v) => v <= t,
                None => !needed,
            },
        };
        r.ok && within(self.ttft_ms, r.ttft_ms, true)
            && within(self.tpot_ms, r.tpot_ms, r.output_tokens.unwrap_or(0) > 1)
            && within(self.e2e_ms, r.e2e_ms, true)
    }

    /// A level's goodput against these targets.
    pub fn goodput(&self, level: &Level) -> Goodput {
        let good: Vec<&Record> = level.per_request.iter().filter(|r| self.met(r)).collect();
        let share = if level.requests > 0 {
            good.len() as f64 / level.requests as f64
        } else {
            0.0
        };
        let per_s = |x: f64| {
            if level.wall_s > 0.0 {
                x / level.wall_s
            } else {
                0.0
            }
        };
        Goodput {
            requests_per_s: per_s(good.len() as f64),
            output_tokens_per_s: per_s(
                good.iter().filter_map(|r| r.output_tokens).sum::<u64>() as f64
            ),
            share_met: share,
            // Compared in whole requests, so 99% of 16 needs all 16 and not 15.84 of them.
            met: good.len() as f64
                >= (self.percentile / 100.0 * level.requests as f64 - 1e-9).ceil(),
        }
    }

    /// "ttft ≤ 500 ms, tpot ≤ 50 ms for 99% of requests".
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        for (name, v) in [
            ("ttft", self.ttft_ms),
            ("tpot", self.tpot_ms),
            ("e2e", self.e2e_ms),
        ] {
            if let Some(ms) = v {
                parts.push(format!("{name} ≤ {ms} ms"));
            }
        }
        format!("{} for {}% of requests", parts.join(", "), self.percentile)
    }
}

/// A level against the SLO.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Goodput {
    /// Requests that met every target, per second of the level's wall time.
    pub requests_per_s: f64,
    /// Their output tokens per second.
    pub output_tokens_per_s: f64,
    /// The share of the level's requests that met every target (0 to 1).
    pub share_met: f64,
    /// At least the SLO's percentile of requests met every target.
    pub met: bool,
}

/// The load `--find-max` probes next, or None when the search is over. `probes` are the
/// loads tried so far with whether each met the SLO, in order; `integer` for concurrency
/// (the answer a whole number), else a rate (within 10%). Doubles from the first load while
/// it holds (halves while it does not), then bisects between the highest that held and the
/// lowest that did not; `limit` bounds the doubling.
pub fn next_probe(probes: &[(f64, bool)], integer: bool, limit: f64) -> Option<f64> {
    let (&(first, _), _) = probes.split_first()?;
    let best = probes
        .iter()
        .filter(|p| p.1)
        .map(|p| p.0)
        .fold(f64::NAN, f64::max);
    let worst = probes
        .iter()
        .filter(|p| !p.1)
        .map(|p| p.0)
        .fold(f64::NAN, f64::min);
    let next = match (best.is_nan(), worst.is_nan()) {
        // Nothing failed yet: double, up to the limit.
        (false, true) => (best < limit).then(|| (best * 2.0).min(limit))?,
        // Nothing held yet: halve, down to the smallest load.
        (true, false) => {
            let lowest = if integer { 1.0 } else { first / 64.0 };
            (worst > lowest).then(|| {
                if integer {
                    (worst / 2.0).floor().max(1.0)
                } else {
                    worst / 2.0
                }
            })?
        }
        (false, false) => {
            if integer {
                if worst - best <= 1.0 {
                    return None;
                }
                ((best + worst) / 2.0).floor()
            } else {
                if worst / best <= 1.1 {
                    return None;
                }
                (best * worst).sqrt()
            }
        }
        (true, true) => unreachable!("every probe either held or not"),
    };
    (!probes.iter().any(|p| p.0 == next)).then_some(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_and_bad_ones_are_named() {
        let s = Slo::parse("ttft=500ms, tpot=50ms,e2e=10s", 99.0).unwrap();
        assert_eq!(
            (s.ttft_ms, s.tpot_ms, s.e2e_ms),
            (Some(500.0), Some(50.0), Some(10000.0))
        );
        for (bad, want) in [
            ("", "names no target"),
            ("ttft", "NAME=DURATION"),
            ("ttfb=1s", "ttfb"),
            ("ttft=1s,ttft=2s", "twice"),
            ("tpot=fast", "tpot"),
            ("e2e=0s", "above zero"),
        ] {
            let e = Slo::parse(bad, 99.0).unwrap_err();
            assert!(e.contains(want), "{bad}: {e}");
        }
        assert!(Slo::parse("ttft=1s", 0.0)
            .unwrap_err()
            .contains("--slo-percentile"));
    }

    fn record(ok: bool, ttft: f64, tpot: Option<f64>, tokens: u64) -> Record {
        Record {
            ok,
            ttft_ms: Some(ttft),
            tpot_ms: tpot,
            e2e_ms: Some(ttft + 100.0),
            output_tokens: Some(tokens),
            end_s: 1.0,
            ..Default::default()
        }
    }

    #[test]
    fn goodput_counts_requests_that_met_every_target() {
        let slo = Slo::parse("ttft=100ms,tpot=10ms", 75.0).unwrap();
        assert!(slo.met(&record(true, 90.0, Some(9.0), 20)));
        assert!(!slo.met(&record(true, 110.0, Some(9.0), 20)));
        assert!(!slo.met(&record(true, 90.0, Some(11.0), 20)));
        assert!(
            !slo.met(&record(false, 1.0, Some(1.0), 20)),
            "a failure meets nothing"
        );
        assert!(
            slo.met(&record(true, 90.0, None, 1)),
            "one token has no TPOT to miss"
        );
        assert!(
            !slo.met(&record(true, 90.0, None, 5)),
            "TPOT unmeasured on a long answer"
        );
        let records = vec![
            record(true, 90.0, Some(9.0), 20),
            record(true, 90.0, Some(9.0), 20),
            record(true, 90.0, Some(9.0), 20),
            record(true, 200.0, Some(9.0), 20),
        ];
        let level = Level::new(Some(4), None, records, vec![]);
        let g = slo.goodput(&level);
        assert_eq!(g.share_met, 0.75);
        assert!(g.met, "3 of 4 is the 75% asked for");
        assert!((g.requests_per_s - 3.0 / level.wall_s).abs() < 1e-9);
        assert!((g.output_tokens_per_s - 60.0 / level.wall_s).abs() < 1e-9);
        let strict = Slo::parse("ttft=100ms", 99.0).unwrap();
        assert!(!strict.goodput(&level).met);
    }

    /// The search on a server whose limit is known: concurrency 5 holds, 6 does not.
    #[test]
    fn the_search_finds_the_edge_in_few_probes() {
        let holds = |c: f64| c <= 5.0;
        let mut probes = vec![(1.0, holds(1.0))];
        while let Some(next) = next_probe(&probes, true, 256.0) {
            probes.push((next, holds(next)));
        }
        let best = probes
            .iter()
            .filter(|p| p.1)
            .map(|p| p.0)
            .fold(0.0, f64::max);
        assert_eq!(best, 5.0, "{probes:?}");
        assert!(probes.len() <= 7, "{probes:?}");
        // Rates: from 10/s, the edge at 3.3/s, within 10%.
        let holds = |r: f64| r <= 3.3;
        let mut probes = vec![(10.0, holds(10.0))];
        while let Some(next) = next_probe(&probes, false, 1e5) {
            probes.push((next, holds(next)));
        }
        let best = probes
            .iter()
            .filter(|p| p.1)
            .map(|p| p.0)
            .fold(0.0, f64::max);
        assert!(best <= 3.3 && best > 3.0, "{probes:?}");
        assert!(probes.len() <= 8, "{probes:?}");
        // Nothing holds, even at concurrency 1: the search ends.
        assert_eq!(next_probe(&[(1.0, false)], true, 256.0), None);
        // Everything holds up to the limit: the search ends there.
        assert_eq!(next_probe(&[(256.0, true)], true, 256.0), None);
    }
}
