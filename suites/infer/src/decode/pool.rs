//! The decode's worker threads. A token runs a few hundred matrix-vector products of tens of
//! microseconds each, so handing one out must cost far less than that: workers spin on an
//! atomic for a while after each product before they sleep, and the caller takes chunks
//! itself instead of waiting. (rayon was tried first: its workers fall asleep between products
//! and the futex wake-ups made 2 threads slower than 1 here, with 2.4 s of system time in a
//! 3.6 s run.)
//!
//! A product is `chunks` independent pieces of work. The current job's epoch, its chunk count
//! and the next chunk index share one atomic word, so a worker claims a chunk only of the job
//! whose count it checked against (a count read separately could belong to the next job while
//! the word still shows the last one: a stale worker then claims a chunk that does not exist).
//! The caller returns only once every chunk of its job is done, which is what keeps the
//! borrowed job alive for as long as any worker can call it.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before it sleeps: longer than the gap between two products
/// of one token (attention, norms), far shorter than a network wait.
const SPIN: Duration = Duration::from_micros(200);

type Job = dyn Fn(usize) + Sync;

/// Most chunks one job may have (the count has 16 bits of the claim word).
pub const MAX_CHUNKS: usize = 0xffff;

/// The claim word: epoch (32 bits) | chunk count (16) | next chunk (16).
fn word(epoch: u64, chunks: usize, next: usize) -> u64 {
    (epoch << 32) | ((chunks as u64) << 16) | next as u64
}

fn unword(v: u64) -> (u64, usize, usize) {
    (
        v >> 32,
        ((v >> 16) & 0xffff) as usize,
        (v & 0xffff) as usize,
    )
}

struct Shared {
    claim: AtomicU64,
    /// Address of the caller's `&Job` (a thin pointer to the fat one), published before the
    /// epoch moves; valid while chunks of that epoch are unfinished.
    job: AtomicUsize,
    done: AtomicUsize,
    /// A chunk panicked on a worker (it still counts as done, so the caller does not wait
    /// forever); the caller panics in turn.
    panicked: AtomicBool,
    stop: AtomicBool,
    sleepers: AtomicUsize,
    /// What sleeping workers wait on (the mutex guards nothing but the wait itself).
    sleep: Mutex<()>,
    wake: Condvar,
}

/// `n` threads in all: the caller and n − 1 workers. One job at a time: `run` is not
/// re-entrant and the pool is not `Sync`, so two threads cannot run jobs on it at once.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    not_sync: PhantomData<Cell<()>>,
}

impl Pool {
    pub fn new(n: usize) -> std::io::Result<Pool> {
        let shared = Arc::new(Shared {
            claim: AtomicU64::new(0),
            job: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
        });
        // Built first, so a failed spawn drops it and stops the workers already started.
        let mut pool = Pool {
            shared,
            workers: Vec::new(),
            not_sync: PhantomData,
        };
        for i in 1..n.max(1) {
            let s = pool.shared.clone();
            pool.workers.push(
                std::thread::Builder::new()
                    .name(format!("tbbench-decode-{i}"))
                    .spawn(move || worker(&s))?,
            );
        }
        Ok(pool)
    }

    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `job(i)` for every i in 0..chunks (at most MAX_CHUNKS), on the caller and the
    /// workers; returns when all are done.
    pub fn run(&self, chunks: usize, job: &(dyn Fn(usize) + Sync)) {
        assert!(chunks <= MAX_CHUNKS, "{chunks} chunks in one job");
        if chunks == 0 {
            return;
        }
        let s = &*self.shared;
        // Workers reach the job through this local, which outlives every chunk: this call
        // does not return before all of them are done.
        let job_ref: &(dyn Fn(usize) + Sync + '_) = job;
        s.job.store(
            &job_ref as *const &(dyn Fn(usize) + Sync + '_) as *const () as usize,
            SeqCst,
        );
        s.done.store(0, SeqCst);
        // 32 bits of epoch wrap after 4 billion products; workers only compare for change.
        let epoch = (unword(s.claim.load(SeqCst)).0 + 1) & 0xffff_ffff;
        s.claim.store(word(epoch, chunks, 0), SeqCst);
        if s.sleepers.load(SeqCst) > 0 {
            let _g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        // A panic in the caller's own chunk must not unwind past this frame while workers
        // may still reach the job through it: it is caught, the job finished, then resumed.
        let mut caught = None;
        while let Some(i) = claim(s, epoch) {
            if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(i))) {
                caught.get_or_insert(p);
            }
            s.done.fetch_add(1, SeqCst);
        }
        while s.done.load(SeqCst) < chunks {
            std::hint::spin_loop();
        }
        let worker_panicked = s.panicked.swap(false, SeqCst);
        if let Some(p) = caught {
            std::panic::resume_unwind(p);
        }
        if worker_panicked {
            panic!("a decode worker thread panicked (its message is above)");
        }
    }
}

/// The next chunk of job `epoch`, if it has one left.
fn claim(s: &Shared, epoch: u64) -> Option<usize> {
    let mut v = s.claim.load(SeqCst);
    loop {
        let (e, chunks, next) = unword(v);
        if e != epoch || next >= chunks {
            return None;
        }
        match s.claim.compare_exchange_weak(v, v + 1, SeqCst, SeqCst) {
            Ok(_) => return Some(next),
            Err(now) => v = now,
        }
    }
}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    loop {
        // Wait for a new epoch: spin first, then sleep.
        let started = Instant::now();
        let epoch = loop {
            if s.stop.load(SeqCst) {
                return;
            }
            let e = unword(s.claim.load(SeqCst)).0;
            if e != seen {
                break e;
            }
            if started.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            let mut g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, SeqCst);
            while unword(s.claim.load(SeqCst)).0 == seen && !s.stop.load(SeqCst) {
                g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            s.sleepers.fetch_sub(1, SeqCst);
        };
        seen = epoch;
        while let Some(i) = claim(s, epoch) {
            // The claim succeeded for this epoch, so its job is published and stays alive
            // until this chunk is counted done.
            let job = s.job.load(SeqCst) as *const &Job;
            // SAFETY: the address `run` stored for this epoch, alive while this chunk is
            // unfinished.
            let ran =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { (*job)(i) }));
            if ran.is_err() {
                s.panicked.store(true, SeqCst);
            }
            s.done.fetch_add(1, SeqCst);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        {
            let _g = self.shared.sleep.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_runs_once_per_job_across_many_jobs() {
        for n in [1, 2, 3, 5] {
            let pool = Pool::new(n).unwrap();
            assert_eq!(pool.threads(), n);
            for round in 0..20000usize {
                let chunks = 1 + round % 17;
                let hits: Vec<AtomicUsize> = (0..chunks).map(|_| AtomicUsize::new(0)).collect();
                pool.run(chunks, &|i| {
                    hits[i].fetch_add(1, SeqCst);
                });
                assert!(
                    hits.iter().all(|h| h.load(SeqCst) == 1),
                    "{n} threads, round {round}"
                );
                if round % 5000 == 0 {
                    // Let the workers fall asleep, so waking them is exercised too.
                    std::thread::sleep(SPIN * 5);
                }
            }
        }
    }

    /// A chunk that panics on a worker ends the product with a panic on the caller, not a
    /// caller waiting forever for it; the pool still works afterwards.
    #[test]
    fn a_panicking_chunk_is_reported_not_waited_for() {
        let pool = Pool::new(2).unwrap();
        let caller = std::thread::current().id();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(64, &|_| {
                if std::thread::current().id() != caller {
                    panic!("worker chunk fails on purpose");
                }
                // The caller is slow, so the worker surely claims some of the 64 chunks.
                std::thread::sleep(Duration::from_millis(20));
            })
        }));
        assert!(r.is_err(), "the worker's panic reached the caller");
        let hits = AtomicUsize::new(0);
        pool.run(8, &|_| {
            hits.fetch_add(1, SeqCst);
        });
        assert_eq!(hits.load(SeqCst), 8);
    }

    /// A panic in a chunk the caller runs waits for the workers' chunks before it unwinds:
    /// none is still running when `run` is left, and the next job sees none of them.
    #[test]
    fn a_panicking_caller_chunk_waits_for_the_workers() {
        let pool = Pool::new(3).unwrap();
        let caller = std::thread::current().id();
        let finished = AtomicUsize::new(0);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(6, &|_| {
                if std::thread::current().id() == caller {
                    panic!("caller chunk fails on purpose");
                }
                std::thread::sleep(Duration::from_millis(30));
                finished.fetch_add(1, SeqCst);
            })
        }));
        assert!(r.is_err());
        let after_unwind = finished.load(SeqCst);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            finished.load(SeqCst),
            after_unwind,
            "a worker chunk outlived run"
        );
        let hits: Vec<AtomicUsize> = (0..5).map(|_| AtomicUsize::new(0)).collect();
        pool.run(5, &|i| {
            std::thread::sleep(Duration::from_millis(5));
            hits[i].fetch_add(1, SeqCst);
        });
        assert!(hits.iter().all(|h| h.load(SeqCst) == 1));
    }
}
