//! The brief timing of one pair: a ping-pong of small messages (one-way latency = RTT/2, as
//! perftest) and a burst of large messages one way (bandwidth). Enough to tell a link that
//! runs at a tenth of its speed from a healthy one in well under a second; `tbbench link`
//! measures properly.

use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};
use tbbench_runners::comm::Comm;
use tbbench_runners::transport::{RecvOp, SendOp};
use tbbench_schema::{Percentiles, Summary};

/// Ping-pong message size: latency-bound on every link.
pub const PING_BYTES: usize = 8;
/// Untimed ping-pongs first (connections and caches warm).
pub const PING_WARMUP: usize = 20;
/// Timed ping-pongs: the median of 200 is steady, and 200 round trips take milliseconds.
pub const PING_ITERS: usize = 200;
/// Burst message size: bandwidth-bound on every link tbbench is for (past TCP's and verbs'
/// per-message costs), small enough that a slow link still moves several in the time.
pub const BURST_BYTES: usize = 4 << 20;
/// Messages in flight per burst iteration, so the pipe stays full across the ack.
pub const BURST_WINDOW: usize = 2;
/// The burst goes on until this long has passed (after one untimed window for TCP's slow
/// start), so a pair takes about 0.4 s on a link of 1 Gbit/s or more; on a slower one, where
/// a single window takes longer, one timed window.
pub const BURST_SECONDS: f64 = 0.3;

/// What the lower rank of a pair measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Timed {
    pub ranks: [usize; 2],
    /// One-way latency (RTT/2) of `PING_BYTES`-byte ping-pongs, microseconds.
    pub one_way_us: Summary,
    /// Bytes the timed part of the burst moved from the lower rank to the higher.
    pub burst_bytes: u64,
    pub burst_seconds: f64,
    /// 10^9 bit/s over the timed part of the burst.
    pub gbit_per_s: f64,
}

const GO: [u8; 8] = 1u64.to_le_bytes();
const STOP: [u8; 8] = 0u64.to_le_bytes();

/// The lower rank of the pair: keeps the clock.
pub fn initiator(comm: &mut Comm, me: usize, peer: usize) -> Result<Timed> {
    let ping = comm.alloc(PING_BYTES)?;
    let mut pong = comm.alloc(PING_BYTES)?;
    let mut one_way_us = Vec::with_capacity(PING_ITERS);
    for i in 0..PING_WARMUP + PING_ITERS {
        let t0 = Instant::now();
        comm.send(peer, &ping)?;
        comm.recv(peer, &mut pong)?;
        if i >= PING_WARMUP {
            one_way_us.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
        }
    }
    let data = comm.alloc(BURST_BYTES)?;
    let mut ack = [0u8; 1];
    let mut window = |comm: &mut Comm| -> Result<()> {
        // The control word and the window go in one posting: messages between two ranks
        // arrive in posting order, so the peer reads the word first.
        let mut sends = vec![SendOp { peer, buf: &GO[..] }];
        sends.extend((0..BURST_WINDOW).map(|_| SendOp { peer, buf: &data }));
        comm.transport().exchange(&sends, &mut [])?;
        comm.recv(peer, &mut ack)
    };
    window(comm)?;
    let start = Instant::now();
    let mut windows = 0u64;
    loop {
        window(comm)?;
        windows += 1;
        if start.elapsed() >= Duration::from_secs_f64(BURST_SECONDS) {
            break;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    comm.send(peer, &STOP)?;
    let bytes = windows * (BURST_WINDOW * BURST_BYTES) as u64;
    Ok(Timed {
        ranks: [me, peer],
        one_way_us: Summary::of(&one_way_us, Percentiles::P999),
        burst_bytes: bytes,
        burst_seconds: seconds,
        gbit_per_s: bytes as f64 * 8.0 / seconds.max(1e-9) / 1e9,
    })
}

/// The higher rank of the pair: answers the pings, takes the burst.
pub fn responder(comm: &mut Comm, peer: usize) -> Result<()> {
    let mut ping = comm.alloc(PING_BYTES)?;
    for _ in 0..PING_WARMUP + PING_ITERS {
        comm.recv(peer, &mut ping)?;
        comm.send(peer, &ping)?;
    }
    let mut slots = comm.alloc(BURST_BYTES * BURST_WINDOW)?;
    loop {
        let mut word = [0u8; 8];
        comm.recv(peer, &mut word)?;
        if word == STOP {
            return Ok(());
        }
        let mut recvs: Vec<RecvOp> = slots
            .chunks_mut(BURST_BYTES)
            .map(|buf| RecvOp { peer, buf })
            .collect();
        comm.transport().exchange(&[], &mut recvs)?;
        comm.send(peer, &[1])?;
    }
}
