//! The three measurements, each only what differs between them (as nccl-tests splits its
//! tests): how many messages one iteration moves and how. The harness owns the sweep,
//! warm-up, timing, the payload check and the tables.

use anyhow::Result;
use tbbench_runners::comm::Comm;
use tbbench_runners::transport::{RecvOp, SendOp};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Ping-pong: one message there, one back; one-way latency = RTT/2.
    Latency,
    /// A window of messages one way, then a short ack (osu_bw).
    Bw,
    /// Windows both ways at once, then an ack (osu_bibw).
    Bibw,
}

/// The roles of the pair: rank 0 starts each iteration and keeps the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Initiator,
    Responder,
}

impl Pattern {
    pub fn name(&self) -> &'static str {
        match self {
            Pattern::Latency => "latency",
            Pattern::Bw => "bw",
            Pattern::Bibw => "bibw",
        }
    }

    /// Messages in flight per iteration. Large messages get a smaller window so one
    /// iteration moves at most 256 MiB and a sweep stays quick.
    pub fn window(&self, size: u64, asked: usize) -> usize {
        match self {
            Pattern::Latency => 1,
            _ => ((256u64 << 20) / size).clamp(1, asked.max(1) as u64) as usize,
        }
    }

    /// Iterations when `--iters` is not given: perftest's 1000 for small ping-pongs, fewer as
    /// messages grow so each size takes about the same time.
    pub fn default_iters(&self, size: u64, window: usize) -> usize {
        match self {
            Pattern::Latency => ((1u64 << 28) / size).clamp(10, 1000) as usize,
            _ => ((1u64 << 31) / (size * window as u64)).clamp(5, 100) as usize,
        }
    }

    /// Payload bytes one iteration moves across the link (both directions for bibw).
    pub fn bytes_per_iter(&self, size: u64, window: usize) -> f64 {
        match self {
            Pattern::Latency => 2.0 * size as f64,
            Pattern::Bw => (size * window as u64) as f64,
            Pattern::Bibw => 2.0 * (size * window as u64) as f64,
        }
    }

    /// Receive buffers for one iteration. As osu_bw and iperf3 do, the receiver does not
    /// give every message of a window its own memory: a window of 64 MiB-messages would
    /// otherwise measure the cache as much as the link. Messages land in up to 1 MiB of slots,
    /// reused batch after batch.
    pub fn recv_slots(&self, size: u64, window: usize) -> usize {
        match self {
            Pattern::Latency => 1,
            _ => ((1u64 << 20) / size).clamp(1, window as u64) as usize,
        }
    }

    /// One iteration: `window` messages of `send.len()` bytes; `recv` is `recv_slots` slots.
    pub fn run_once(
        &self,
        comm: &mut Comm,
        role: Role,
        peer: usize,
        send: &[u8],
        recv: &mut [u8],
        window: usize,
    ) -> Result<()> {
        let size = send.len();
        let mut ack = [0u8; 4];
        match (self, role) {
            (Pattern::Latency, Role::Initiator) => {
                comm.send(peer, send)?;
                comm.recv(peer, &mut recv[..size])
            }
            (Pattern::Latency, Role::Responder) => {
                comm.recv(peer, &mut recv[..size])?;
                comm.send(peer, send)
            }
            (Pattern::Bw, Role::Initiator) => {
                let sends: Vec<SendOp> = (0..window).map(|_| SendOp { peer, buf: send }).collect();
                comm.transport().exchange(&sends, &mut [])?;
                comm.recv(peer, &mut ack)
            }
            (Pattern::Bw, Role::Responder) => {
                let slots = recv.len() / size;
                let mut left = window;
                while left > 0 {
                    let n = left.min(slots);
                    let mut recvs: Vec<RecvOp> = recv
                        .chunks_mut(size)
                        .take(n)
                        .map(|buf| RecvOp { peer, buf })
                        .collect();
                    comm.transport().exchange(&[], &mut recvs)?;
                    left -= n;
                }
                comm.send(peer, &ack)
            }
            (Pattern::Bibw, role) => {
                // Both sides walk the window in the same batches, so neither waits on a
                // receive the other has not posted.
                let slots = recv.len() / size;
                let mut left = window;
                while left > 0 {
                    let n = left.min(slots);
                    let sends: Vec<SendOp> = (0..n).map(|_| SendOp { peer, buf: send }).collect();
                    let mut recvs: Vec<RecvOp> = recv
                        .chunks_mut(size)
                        .take(n)
                        .map(|buf| RecvOp { peer, buf })
                        .collect();
                    comm.transport().exchange(&sends, &mut recvs)?;
                    left -= n;
                }
                // The ack makes the clock stop only once both directions have landed.
                match role {
                    Role::Initiator => comm.recv(peer, &mut ack),
                    Role::Responder => comm.send(peer, &ack),
                }
            }
        }
    }
}
