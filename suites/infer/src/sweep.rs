//! `--sweep`: a server's load from one request at a time to saturation, and the knee.
//!
//! As GuideLLM's sweep: first one request at a time (its rate the lowest load worth asking),
//! then every request at once (the saturated rate, the most the server ends per second), then
//! constant rates evenly spaced between the two. With a concurrency list instead, the list is
//! the sweep. The knee is the highest load before TTFT p99 or TPOT p99 jumps: the level
//! before the first whose p99 is more than twice the level below's (and above it by more than
//! a millisecond, below which a doubling is timer noise), or whose requests started failing,
//! or that stopped as saturated.

use crate::figures::Level;
use serde::Serialize;

/// Levels in a sweep unless `--sweep=N` says otherwise (GuideLLM's default too).
pub const DEFAULT_LEVELS: usize = 10;

/// A p99 more than this many times the level below's is a jump.
const JUMP: f64 = 2.0;
/// ...and only where it grew by more than this (ms).
const JUMP_FLOOR_MS: f64 = 1.0;

/// The constant rates between one-at-a-time (`sync` requests/s) and saturation (`saturated`
/// requests/s) of a sweep of `levels` in all: `levels` - 2 of them, evenly spaced, neither end
/// included. None when saturation is no faster than one at a time (a server that serves one
/// request at a time has no load between).
pub fn rates_between(sync: f64, saturated: f64, levels: usize) -> Option<Vec<f64>> {
    if !(sync > 0.0 && saturated > sync * 1.05) {
        return None;
    }
    let steps = levels.saturating_sub(1).max(1) as f64;
    Some(
        (1..levels.saturating_sub(1))
            .map(|i| {
                let r = sync + (saturated - sync) * i as f64 / steps;
                // Three significant figures: a rate a person can type again.
                let scale = 10f64.powi(2 - r.log10().floor() as i32);
                (r * scale).round() / scale
            })
            .collect(),
    )
}

/// `results.knee`: the level, or none with the reason.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Knee {
    /// The level's name ("rate=3.2/s", "c=8"), or None.
    pub level: Option<String>,
    /// Its load: requests per second offered (a closed level's: ended per second), or its
    /// concurrency in a concurrency sweep.
    pub load: Option<f64>,
    /// `rate_per_s` or `concurrency`.
    pub by: &'static str,
    /// What broke at the next level ("TTFT p99 3.1× at rate=4/s").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broke: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The load a level offered, requests per second: its arrival rate, or for a closed level the
/// rate its requests ended at.
pub fn offered_rate(l: &Level) -> f64 {
    l.rate_per_s.unwrap_or(if l.wall_s > 0.0 {
        l.ok as f64 / l.wall_s
    } else {
        0.0
    })
}

/// What broke between `below` and `at`, if anything.
fn broke(below: &Level, at: &Level) -> Option<String> {
    if let Some(s) = &at.stopped {
        return Some(format!("{} stopped: {}", at.name(), s.reason));
    }
    if at.failed > 0 && below.failed == 0 {
        return Some(format!(
            "{} of {} requests failed at {}",
            at.failed,
            at.requests,
            at.name()
        ));
    }
    for (what, a, b) in [
        (
            "TTFT p99",
            below.ttft_ms.as_ref().map(|d| d.p99),
            at.ttft_ms.as_ref().map(|d| d.p99),
        ),
        (
            "TPOT p99",
            below.tpot_ms.as_ref().map(|d| d.p99),
            at.tpot_ms.as_ref().map(|d| d.p99),
        ),
    ] {
        if let (Some(a), Some(b)) = (a, b) {
            if b > JUMP * a && b - a > JUMP_FLOOR_MS {
                return Some(format!("{what} {:.1}× at {}", b / a, at.name()));
            }
        }
    }
    None
}

/// The knee of `levels`, given in order of rising load.
pub fn knee(levels: &[&Level], by: &'static str) -> Knee {
    let load = |l: &Level| match by {
        "concurrency" => l.concurrency.map(|c| c as f64),
        _ => Some(offered_rate(l)),
    };
    let none = |reason: String| Knee {
        level: None,
        load: None,
        by,
        broke: None,
        reason: Some(reason),
    };
    if levels.len() < 2 {
        return none("a knee needs at least two levels".into());
    }
    for (i, pair) in levels.windows(2).enumerate() {
        if let Some(what) = broke(pair[0], pair[1]) {
            if i == 0 && pair[0].failed > 0 {
                return none(format!(
                    "requests failed already at the lowest load, {}",
                    pair[0].name()
                ));
            }
            return Knee {
                level: Some(pair[0].name()),
                load: load(pair[0]),
                by,
                broke: Some(what),
                reason: None,
            };
        }
    }
    none(format!(
        "no jump in TTFT or TPOT p99 up to the highest load tried, {}",
        levels[levels.len() - 1].name()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Record;

    fn level(rate: f64, ttft: f64, tpot: f64) -> Level {
        let records = (0..10)
            .map(|i| {
                let mut r = Record {
                    index: i,
                    ok: true,
                    start_s: i as f64 / rate,
                    end_s: i as f64 / rate + 1.0,
                    ttft_ms: Some(ttft),
                    e2e_ms: Some(ttft + 9.0 * tpot),
                    ..Default::default()
                };
                r.set_tokens(10, crate::request::TokenSource::Usage);
                r
            })
            .collect();
        Level::new(None, Some(rate), records, vec![])
    }

    #[test]
    fn rates_between_are_evenly_spaced_and_rounded() {
        assert_eq!(
            rates_between(1.0, 10.0, 5),
            Some(vec![3.25, 5.5, 7.75]),
            "5 levels: sync, 3 rates, saturated"
        );
        assert_eq!(rates_between(2.0, 2.02, 10), None);
        assert_eq!(rates_between(1.0, 4.0, 2), Some(vec![]));
        assert_eq!(rates_between(1.0, 2.0, 4), Some(vec![1.33, 1.67]));
    }

    #[test]
    fn the_knee_is_the_level_before_the_first_jump() {
        let ls = [
            level(1.0, 20.0, 5.0),
            level(2.0, 22.0, 5.5),
            level(3.0, 30.0, 6.0),
            level(4.0, 90.0, 7.0),
            level(5.0, 400.0, 9.0),
        ];
        let refs: Vec<&Level> = ls.iter().collect();
        let k = knee(&refs, "rate_per_s");
        assert_eq!(k.level.as_deref(), Some("rate=3/s"));
        assert_eq!(k.load, Some(3.0));
        assert!(k.broke.unwrap().starts_with("TTFT p99 3.0× at rate=4/s"));
        // TPOT jumping breaks it too; a doubling under a millisecond does not.
        let ls = [
            level(1.0, 20.0, 0.2),
            level(2.0, 21.0, 0.5),
            level(3.0, 22.0, 6.0),
        ];
        let refs: Vec<&Level> = ls.iter().collect();
        let k = knee(&refs, "rate_per_s");
        assert_eq!(k.level.as_deref(), Some("rate=2/s"), "{k:?}");
        // No jump: no knee, and why.
        let ls = [level(1.0, 20.0, 5.0), level(2.0, 25.0, 6.0)];
        let refs: Vec<&Level> = ls.iter().collect();
        let k = knee(&refs, "rate_per_s");
        assert_eq!(k.level, None);
        assert!(k.reason.unwrap().contains("no jump"));
        // A level that stopped as saturated is past the knee.
        let mut ls = [level(1.0, 20.0, 5.0), level(2.0, 21.0, 5.0)];
        ls[1].stopped = Some(crate::load::Stopped {
            reason: "saturated".into(),
            at_s: 3.0,
            in_flight: 9,
            not_sent: 4,
        });
        let refs: Vec<&Level> = ls.iter().collect();
        assert_eq!(knee(&refs, "rate_per_s").level.as_deref(), Some("rate=1/s"));
    }
}
