//! How requests are offered: closed loop (N workers, each sending its next request as soon as
//! its last one ended) or open loop (arrivals at a rate, constant, Poisson or gamma, whatever
//! is still in flight), either with a ramp-up. An open-loop level stops sending when the
//! server saturates (requests pile up faster than they end) rather than queueing every
//! request it was asked for.

use crate::prompt::Rng;
use crate::request::{self, Record, Target};
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

/// How an open-loop level's requests arrive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrivals {
    /// Evenly spaced, 1/rate apart (GuideLLM's constant rate).
    Constant,
    /// Exponential gaps: a Poisson process.
    Poisson,
    /// Gamma gaps of this shape (vLLM's `--burstiness`): 1 is Poisson, below 1 burstier, above
    /// 1 more even.
    Gamma(f64),
}

impl Arrivals {
    /// `constant`, `poisson` or `gamma:SHAPE`.
    pub fn parse(s: &str) -> Result<Arrivals, String> {
        match s.trim() {
            "constant" => Ok(Arrivals::Constant),
            "poisson" => Ok(Arrivals::Poisson),
            g => match g.strip_prefix("gamma:").or(g.strip_prefix("gamma=")) {
                Some(k) => {
                    let k: f64 = k.trim().parse().map_err(|_| {
                        format!("--arrivals {g}: the gamma shape must be a number, as gamma:0.5")
                    })?;
                    if !(k.is_finite() && (0.01..=100.0).contains(&k)) {
                        return Err(format!(
                            "--arrivals {g}: the gamma shape must be between 0.01 and 100"
                        ));
                    }
                    Ok(Arrivals::Gamma(k))
                }
                None => Err(format!(
                    "--arrivals {g}: not constant, poisson or gamma:SHAPE"
                )),
            },
        }
    }

    pub fn name(&self) -> String {
        match self {
            Arrivals::Constant => "constant".into(),
            Arrivals::Poisson => "poisson".into(),
            Arrivals::Gamma(k) => format!("gamma:{k}"),
        }
    }

    fn gap(&self, rng: &mut Rng, mean: f64) -> f64 {
        match *self {
            Arrivals::Constant => mean,
            Arrivals::Poisson => rng.exponential(mean),
            Arrivals::Gamma(k) => rng.gamma(k, mean),
        }
    }
}

impl Serialize for Arrivals {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

/// When each of `n` requests is due, in seconds from the level's start: gaps of mean
/// 1/`rate`, the first at 0. With a ramp-up of `ramp_s` the rate rises linearly from 0 to
/// `rate` over that time (the steady schedule's time τ maps to √(2·ramp·τ) below ramp/2, to
/// τ + ramp/2 after), so a cold server is not met with a wall of requests.
pub fn schedule(arrivals: Arrivals, rate: f64, n: u64, ramp_s: f64, seed: u64) -> Vec<f64> {
    let mut rng = Rng::new(seed ^ 0x0A77_1BA1);
    let mut at = 0.0;
    (0..n)
        .map(|i| {
            if i > 0 {
                at += arrivals.gap(&mut rng, 1.0 / rate);
            }
            if ramp_s <= 0.0 {
                at
            } else if at < ramp_s / 2.0 {
                (2.0 * ramp_s * at).sqrt()
            } else {
                at + ramp_s / 2.0
            }
        })
        .collect()
}

/// Why an open-loop level stopped sending before its last request.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Stopped {
    pub reason: String,
    /// Seconds from the level's start.
    pub at_s: f64,
    pub in_flight: usize,
    /// Requests of the level never sent.
    pub not_sent: u64,
}

/// Whether the server is saturated, `now` seconds into an open-loop level whose ramp-up
/// ended at `ramp_s`: requests pile up and their wait for a first token grows. `starts` are
/// when the requests sent so far started and `ttft` their time to first token where it has
/// come (seconds); one still waiting counts with its age, a lower bound. With u the time
/// since the ramp (at least 4 s), all of:
/// - in flight now at least 8, and more than 1.5 times (and 4 more than) at u/2
///   (`in_flight_then`): a server that keeps up holds about rate × latency, not more and more;
/// - the median time to first token of the requests that started in u's third quarter more
///   than twice, and 0.5 s more than, that of the first 8 after the ramp (the server before
///   any backlog): its queue grows with time, however long its answers are.
///
/// A late request not yet answered gives a lower bound, which only makes it look faster.
pub fn saturated(
    now: f64,
    ramp_s: f64,
    starts: &[f64],
    ttft: &[Option<f64>],
    in_flight: usize,
    in_flight_then: usize,
) -> bool {
    let u = now - ramp_s;
    if u < 4.0 || in_flight < 8 || 2 * in_flight <= 3 * in_flight_then + 8 {
        return false;
    }
    let waits = |from: f64, to: f64, most: usize| -> Option<f64> {
        let mut v: Vec<f64> = starts
            .iter()
            .zip(ttft)
            .filter(|(&s, _)| s >= ramp_s + from && s < ramp_s + to)
            .take(most)
            .map(|(&s, t)| t.unwrap_or(now - s))
            .collect();
        if v.len() < 8 {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(v[v.len() / 2])
    };
    match (waits(0.0, u, 8), waits(0.5 * u, 0.75 * u, usize::MAX)) {
        (Some(first), Some(late)) => late > 2.0 * first && late - first > 0.5,
        _ => false,
    }
}

/// How often an open-loop level asks whether the server saturated.
const SATURATION_CHECK_S: f64 = 0.5;

/// `requests` requests by `concurrency` workers; `body(i)` makes request i's body. With a
/// ramp-up, worker k starts k/concurrency of the way through it.
pub fn closed(
    target: &Target,
    concurrency: usize,
    requests: u64,
    first_index: u64,
    ramp_s: f64,
    body: &(dyn Fn(u64) -> Vec<u8> + Sync),
) -> Vec<Record> {
    let next = AtomicU64::new(0);
    let records = Mutex::new(Vec::with_capacity(requests as usize));
    let workers = concurrency.max(1).min(requests.max(1) as usize);
    // Bodies are built before the barrier so no worker is still formatting a prompt when
    // the others start.
    let bodies: Vec<Vec<u8>> = (0..requests).map(|i| body(first_index + i)).collect();
    let barrier = Barrier::new(workers + 1);
    let level_start = Mutex::new(None::<Instant>);
    std::thread::scope(|s| {
        for k in 0..workers {
            let (next, records, bodies, barrier, level_start) =
                (&next, &records, &bodies, &barrier, &level_start);
            s.spawn(move || {
                barrier.wait();
                let t0 = level_start.lock().unwrap().expect("set before the release");
                if ramp_s > 0.0 {
                    std::thread::sleep(Duration::from_secs_f64(ramp_s * k as f64 / workers as f64));
                }
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= requests {
                        break;
                    }
                    let r = request::run(target, &bodies[i as usize], first_index + i, t0);
                    records.lock().unwrap().push(r);
                }
            });
        }
        *level_start.lock().unwrap() = Some(Instant::now());
        barrier.wait();
    });
    records.into_inner().unwrap()
}

/// Makes the body of request `index`: turn `turn` of conversation `c`, after `answers`, the
/// conversation tagged with the index of its first turn's request (so every turn repeats its
/// history byte for byte).
pub type TurnBody<'a> = dyn Fn(u64, u64, usize, usize, &[String]) -> Vec<u8> + Sync + 'a;

/// `--multi-turn`'s closed loop: each worker takes the next conversation and sends its turns
/// in order, each once the answer to the one before has ended, with that history; the level
/// ends after `requests` requests (turns) in all. `turns(c)` is conversation c's length and
/// `body(index, c, turn, answers)` makes the request of `turn` after `answers`.
#[allow(clippy::too_many_arguments)]
pub fn closed_conversations(
    target: &Target,
    concurrency: usize,
    requests: u64,
    first_index: u64,
    ramp_s: f64,
    conversation_of: &(dyn Fn(u64) -> usize + Sync),
    turns: &(dyn Fn(usize) -> usize + Sync),
    body: &TurnBody,
) -> Vec<Record> {
    let next = AtomicU64::new(0);
    // Every level replays the conversations from the same start: one workload per level.
    let next_conversation = AtomicU64::new(0);
    let records = Mutex::new(Vec::with_capacity(requests as usize));
    let workers = concurrency.max(1).min(requests.max(1) as usize);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for k in 0..workers {
            let (next, next_conversation, records) = (&next, &next_conversation, &records);
            s.spawn(move || {
                if ramp_s > 0.0 {
                    std::thread::sleep(Duration::from_secs_f64(ramp_s * k as f64 / workers as f64));
                }
                'conversations: loop {
                    let c = conversation_of(next_conversation.fetch_add(1, Ordering::Relaxed));
                    let mut answers: Vec<String> = Vec::new();
                    let mut tag = 0;
                    for turn in 0..turns(c) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= requests {
                            break 'conversations;
                        }
                        if turn == 0 {
                            tag = first_index + i;
                        }
                        let b = body(first_index + i, tag, c, turn, &answers);
                        let mut r = request::run(target, &b, first_index + i, t0);
                        r.conversation = Some(c as u64);
                        r.turn = Some(turn as u32);
                        let ok = r.ok;
                        answers.push(r.text.clone());
                        records.lock().unwrap().push(r);
                        // A failed turn ends its conversation: the next has no answer to
                        // follow.
                        if !ok {
                            break;
                        }
                    }
                }
            });
        }
    });
    records.into_inner().unwrap()
}

/// An open-loop level's outcome.
pub struct Open {
    pub records: Vec<Record>,
    /// How late each request started against its schedule (ms).
    pub lags_ms: Vec<f64>,
    pub stopped: Option<Stopped>,
}

/// The most requests one open-loop level holds in flight (a thread each): past it the level
/// stops as saturated whatever the other signs say.
pub const MAX_IN_FLIGHT: usize = crate::MAX_CONCURRENCY;

/// `requests` requests arriving at `rate` per second as `arrivals` says, after a ramp-up of
/// `ramp_s`; stops sending once the server saturates ([`saturated`]).
#[allow(clippy::too_many_arguments)]
pub fn open(
    target: &Target,
    arrivals: Arrivals,
    rate: f64,
    requests: u64,
    first_index: u64,
    seed: u64,
    ramp_s: f64,
    body: &(dyn Fn(u64) -> Vec<u8> + Sync),
) -> Open {
    let due = schedule(arrivals, rate, requests, ramp_s, seed);
    let bodies: Vec<Vec<u8>> = (0..requests).map(|i| body(first_index + i)).collect();
    let records = Mutex::new(Vec::with_capacity(requests as usize));
    let lags = Mutex::new(Vec::with_capacity(requests as usize));
    // Each request's first token (ns after t0) as it comes, and how many have ended.
    let first: Vec<AtomicU64> = (0..requests)
        .map(|_| AtomicU64::new(request::NO_TOKEN_YET))
        .collect();
    let ended = AtomicU64::new(0);
    let mut stopped = None;
    let t0 = Instant::now();
    let mut starts: Vec<f64> = Vec::with_capacity(requests as usize);
    // In flight at each check: (seconds, count).
    let mut samples: Vec<(f64, usize)> = Vec::new();
    let mut checked = 0.0;
    std::thread::scope(|s| {
        for (i, &due) in due.iter().enumerate() {
            let due_at = t0 + Duration::from_secs_f64(due);
            let now = Instant::now();
            if due_at > now {
                std::thread::sleep(due_at - now);
            }
            let now_s = t0.elapsed().as_secs_f64();
            let in_flight = starts.len() - ended.load(Ordering::Relaxed) as usize;
            let over = in_flight >= MAX_IN_FLIGHT;
            let pile_up = !over && now_s - checked >= SATURATION_CHECK_S && {
                checked = now_s;
                samples.push((now_s, in_flight));
                let half = ramp_s + (now_s - ramp_s) / 2.0;
                let then = samples
                    .iter()
                    .rev()
                    .find(|(t, _)| *t <= half)
                    .map_or(0, |x| x.1);
                let ttft: Vec<Option<f64>> = first[..starts.len()]
                    .iter()
                    .zip(&starts)
                    .map(|(f, s)| match f.load(Ordering::Relaxed) {
                        request::NO_TOKEN_YET => None,
                        ns => Some(ns as f64 / 1e9 - s),
                    })
                    .collect();
                saturated(now_s, ramp_s, &starts, &ttft, in_flight, then)
            };
            if over || pile_up {
                stopped = Some(Stopped {
                    reason: if over {
                        format!("{MAX_IN_FLIGHT} requests in flight, the most one level holds")
                    } else {
                        "saturated: requests piled up, their time to first token growing".into()
                    },
                    at_s: now_s,
                    in_flight,
                    not_sent: requests - i as u64,
                });
                break;
            }
            starts.push(now_s);
            let (records, lags, bodies, first, ended) = (&records, &lags, &bodies, &first, &ended);
            s.spawn(move || {
                let lag = Instant::now().saturating_duration_since(due_at);
                lags.lock().unwrap().push(lag.as_secs_f64() * 1e3);
                let r =
                    request::run_watched(target, &bodies[i], first_index + i as u64, t0, &first[i]);
                records.lock().unwrap().push(r);
                ended.fetch_add(1, Ordering::Relaxed);
            });
        }
    });
    Open {
        records: records.into_inner().unwrap(),
        lags_ms: lags.into_inner().unwrap(),
        stopped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_parse_and_keep_their_mean_rate() {
        assert_eq!(Arrivals::parse("constant"), Ok(Arrivals::Constant));
        assert_eq!(Arrivals::parse("gamma:0.5"), Ok(Arrivals::Gamma(0.5)));
        for bad in ["uniform", "gamma:", "gamma:0", "gamma:x"] {
            assert!(Arrivals::parse(bad).is_err(), "{bad}");
        }
        for a in [Arrivals::Constant, Arrivals::Poisson, Arrivals::Gamma(0.3)] {
            let s = schedule(a, 4.0, 4001, 0.0, 9);
            let rate = 4000.0 / s[4000];
            assert!((rate - 4.0).abs() < 0.25, "{a:?}: {rate}");
            assert!(s.windows(2).all(|w| w[1] >= w[0]));
        }
        let c = schedule(Arrivals::Constant, 2.0, 3, 0.0, 1);
        assert_eq!(c, vec![0.0, 0.5, 1.0]);
    }

    /// A ramp-up of R seconds: arrivals thin at first, a count of rate·R/2 by R, then the
    /// steady rate, one request for another.
    #[test]
    fn a_ramp_up_rises_linearly_to_the_rate() {
        let s = schedule(Arrivals::Constant, 10.0, 400, 10.0, 1);
        let by = |t: f64| s.iter().filter(|&&x| x <= t).count() as f64;
        assert!((by(10.0) - 50.0).abs() <= 1.0, "{}", by(10.0));
        assert!((by(5.0) - 12.5).abs() <= 1.0, "{}", by(5.0));
        assert!((by(20.0) - by(10.0) - 100.0).abs() <= 1.0);
    }

    /// Simulated levels: arrivals as a schedule gives them, each request's TTFT a function of
    /// when it started; the check asked every 0.5 s as the dispatcher asks it.
    fn first_stop(
        arrivals: Arrivals,
        rate: f64,
        n: u64,
        ramp: f64,
        ttft: impl Fn(usize, f64) -> f64,
        e2e: impl Fn(usize) -> f64,
    ) -> Option<f64> {
        let starts = schedule(arrivals, rate, n, ramp, 11);
        let end = starts[starts.len() - 1];
        let mut now = 0.5;
        while now <= end {
            let sent: Vec<f64> = starts.iter().copied().filter(|&s| s <= now).collect();
            let seen: Vec<Option<f64>> = sent
                .iter()
                .enumerate()
                .map(|(i, &s)| Some(ttft(i, s)).filter(|t| s + t <= now))
                .collect();
            let in_flight_at = |t: f64| {
                starts
                    .iter()
                    .enumerate()
                    .filter(|(i, &s)| s <= t && s + ttft(*i, s) + e2e(*i) > t)
                    .count()
            };
            let then = in_flight_at(ramp + (now - ramp) / 2.0);
            if saturated(now, ramp, &sent, &seen, in_flight_at(now), then) {
                return Some(now);
            }
            now += 0.5;
        }
        None
    }

    /// Servers that keep up are never called saturated, however their arrivals come, however
    /// long or varied their answers, through a ramp-up; one that serves 5 a second while 10
    /// arrive is, within seconds.
    #[test]
    fn saturation_is_time_to_first_token_growing_not_a_busy_server() {
        let keeps_up = |i: usize, _s: f64| 0.2 + 0.1 * ((i * 7919) % 13) as f64 / 13.0;
        // Answers of 0.5 s or 20 s: many in flight, a long tail.
        let bimodal = |i: usize| if i.is_multiple_of(3) { 20.0 } else { 0.5 };
        for arrivals in [Arrivals::Constant, Arrivals::Poisson, Arrivals::Gamma(0.25)] {
            for ramp in [0.0, 20.0] {
                let stop = first_stop(arrivals, 10.0, 600, ramp, keeps_up, bimodal);
                assert_eq!(stop, None, "{arrivals:?} ramp {ramp}");
            }
        }
        // A server of one answer at a time, served in order at `per` seconds each: the i-th
        // request's first token once the ones before it are done.
        let queued = |per: f64| move |i: usize, s: f64| ((i + 1) as f64 * per - s).max(0.0) + 0.05;
        for (per, ramp) in [(0.2, 0.0), (0.3, 0.0), (0.2, 10.0), (0.12, 0.0)] {
            let stop = first_stop(Arrivals::Poisson, 10.0, 600, ramp, queued(per), |_| 0.0);
            assert!(
                matches!(stop, Some(t) if t < ramp + 15.0),
                "serving one per {per} s, ramp {ramp}: {stop:?}"
            );
        }
    }
}
