//! How requests are offered: closed loop (N workers released together by one barrier, each
//! sending its next request as soon as its last one ended) or open loop (Poisson arrivals at
//! a rate, whatever is still in flight).

use crate::prompt::Rng;
use crate::request::{self, Record, Target};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

/// `requests` requests by `concurrency` workers; `body(i)` makes request i's body.
pub fn closed(
    target: &Target,
    concurrency: usize,
    requests: u64,
    first_index: u64,
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
        for _ in 0..workers {
            s.spawn(|| {
                barrier.wait();
                let t0 = level_start.lock().unwrap().expect("set before the release");
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

/// `requests` requests arriving as a Poisson process of `rate` per second. Returns the
/// records and how late each started against its schedule (ms).
pub fn open(
    target: &Target,
    rate: f64,
    requests: u64,
    first_index: u64,
    seed: u64,
    body: &(dyn Fn(u64) -> Vec<u8> + Sync),
) -> (Vec<Record>, Vec<f64>) {
    let mut rng = Rng::new(seed ^ 0x0A77_1BA1);
    let mut at = 0.0;
    let schedule: Vec<f64> = (0..requests)
        .map(|i| {
            // The first request starts the clock; the gaps after it are exponential.
            if i > 0 {
                at += rng.exponential(1.0 / rate);
            }
            at
        })
        .collect();
    let bodies: Vec<Vec<u8>> = (0..requests).map(|i| body(first_index + i)).collect();
    let records = Mutex::new(Vec::with_capacity(requests as usize));
    let lags = Mutex::new(Vec::with_capacity(requests as usize));
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for (i, &due) in schedule.iter().enumerate() {
            let due_at = t0 + Duration::from_secs_f64(due);
            let now = Instant::now();
            if due_at > now {
                std::thread::sleep(due_at - now);
            }
            let (records, lags, bodies) = (&records, &lags, &bodies);
            s.spawn(move || {
                let lag = Instant::now().saturating_duration_since(due_at);
                lags.lock().unwrap().push(lag.as_secs_f64() * 1e3);
                let r = request::run(target, &bodies[i], first_index + i as u64, t0);
                records.lock().unwrap().push(r);
            });
        }
    });
    (records.into_inner().unwrap(), lags.into_inner().unwrap())
}
