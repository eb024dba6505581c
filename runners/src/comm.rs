//! Collectives the suites need, built once on top of any [`Transport`]: barrier, broadcast,
//! gather, all-reduce (sum, max, min, maxloc) and sendrecv.
//!
//! Trees are fixed by rank numbers, so a reduction adds in the same order on every run and
//! every rank gets bit-identical results (the decode's consistency check depends on that).

use crate::transport::{Buffer, RecvOp, SendOp, Transport};
use anyhow::Result;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
}

/// A rank's handle on the others: the transport plus the collectives.
pub struct Comm {
    t: Box<dyn Transport>,
}

impl Comm {
    pub fn new(t: Box<dyn Transport>) -> Self {
        Comm { t }
    }
    pub fn rank(&self) -> usize {
        self.t.rank()
    }
    pub fn size(&self) -> usize {
        self.t.size()
    }
    pub fn transport(&mut self) -> &mut dyn Transport {
        &mut *self.t
    }
    pub fn alloc(&mut self, len: usize) -> Result<Buffer> {
        self.t.alloc(len)
    }
    pub fn send(&mut self, peer: usize, buf: &[u8]) -> Result<()> {
        self.t.send(peer, buf)
    }
    pub fn recv(&mut self, peer: usize, buf: &mut [u8]) -> Result<()> {
        self.t.recv(peer, buf)
    }

    /// Sends to one rank while receiving from another, without deadlock.
    pub fn sendrecv(&mut self, to: usize, send: &[u8], from: usize, recv: &mut [u8]) -> Result<()> {
        self.t.exchange(
            &[SendOp {
                peer: to,
                buf: send,
            }],
            &mut [RecvOp {
                peer: from,
                buf: recv,
            }],
        )
    }

    /// Dissemination barrier: ⌈log2 N⌉ rounds of one-byte messages.
    pub fn barrier(&mut self) -> Result<()> {
        let (r, n) = (self.rank(), self.size());
        let mut step = 1;
        while step < n {
            let mut token = [0u8; 1];
            self.sendrecv((r + step) % n, &[1], (r + n - step) % n, &mut token)?;
            step *= 2;
        }
        Ok(())
    }

    /// A barrier for ranks that may wait a long time for others (a rank idle while another
    /// pair measures): no data timeout, since the control channel's heartbeats already end
    /// the run within seconds if any rank dies or freezes.
    pub fn barrier_patient(&mut self) -> Result<()> {
        let normal = self.t.timeout();
        self.t
            .set_timeout(std::time::Duration::from_secs(7 * 24 * 3600))?;
        let r = self.barrier();
        self.t.set_timeout(normal)?;
        r
    }

    /// Binomial-tree broadcast of `buf` from `root`.
    pub fn bcast(&mut self, root: usize, buf: &mut [u8]) -> Result<()> {
        let n = self.size();
        let me = (self.rank() + n - root) % n;
        let mut mask = 1;
        while mask < n {
            if me & mask != 0 {
                let from = (me - mask + root) % n;
                self.t.recv(from, buf)?;
                break;
            }
            mask <<= 1;
        }
        mask >>= 1;
        while mask > 0 {
            if me + mask < n {
                self.t.send((me + mask + root) % n, buf)?;
            }
            mask >>= 1;
        }
        Ok(())
    }

    /// Gathers each rank's bytes (of any length) at `root`, in rank order.
    pub fn gather(&mut self, root: usize, mine: &[u8]) -> Result<Option<Vec<Vec<u8>>>> {
        if self.rank() != root {
            self.t.send(root, &(mine.len() as u64).to_le_bytes())?;
            self.t.send(root, mine)?;
            return Ok(None);
        }
        let mut all = Vec::with_capacity(self.size());
        for peer in 0..self.size() {
            if peer == root {
                all.push(mine.to_vec());
                continue;
            }
            let mut len = [0u8; 8];
            self.t.recv(peer, &mut len)?;
            let mut data = vec![0u8; u64::from_le_bytes(len) as usize];
            self.t.recv(peer, &mut data)?;
            all.push(data);
        }
        Ok(Some(all))
    }

    /// All-reduce of f64s: binomial reduce to rank 0, then broadcast.
    pub fn allreduce_f64(&mut self, data: &mut [f64], op: ReduceOp) -> Result<()> {
        let (r, n) = (self.rank(), self.size());
        let mut tmp = vec![0f64; data.len()];
        let mut mask = 1;
        while mask < n {
            if r & mask != 0 {
                self.t.send(r - mask, f64_bytes(data))?;
                break;
            }
            if r + mask < n {
                self.t.recv(r + mask, f64_bytes_mut(&mut tmp))?;
                for (a, b) in data.iter_mut().zip(&tmp) {
                    *a = match op {
                        ReduceOp::Sum => *a + *b,
                        ReduceOp::Max => a.max(*b),
                        ReduceOp::Min => a.min(*b),
                    };
                }
            }
            mask <<= 1;
        }
        self.bcast(0, f64_bytes_mut(data))
    }

    /// The largest value over all ranks and the index that came with it; ties go to the
    /// smallest index (as HPL picks its pivot).
    pub fn allreduce_maxloc(&mut self, value: f64, index: u64) -> Result<(f64, u64)> {
        let mine = [value, f64::from_bits(index)];
        let all = self.allgather_f64(&mine)?;
        let mut best = (value, index);
        for pair in all.chunks(2) {
            let (v, i) = (pair[0], pair[1].to_bits());
            if v > best.0 || (v == best.0 && i < best.1) {
                best = (v, i);
            }
        }
        Ok(best)
    }

    /// Every rank's `mine` (all the same length), concatenated in rank order, on every rank.
    pub fn allgather_f64(&mut self, mine: &[f64]) -> Result<Vec<f64>> {
        let n = self.size();
        let mut all = vec![0f64; mine.len() * n];
        if let Some(parts) = self.gather(0, f64_bytes(mine))? {
            for (r, p) in parts.iter().enumerate() {
                f64_bytes_mut(&mut all[r * mine.len()..(r + 1) * mine.len()]).copy_from_slice(p);
            }
        }
        self.bcast(0, f64_bytes_mut(&mut all))?;
        Ok(all)
    }
}

pub fn f64_bytes(v: &[f64]) -> &[u8] {
    // SAFETY: f64 has no padding and any byte pattern is a valid u8.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

pub fn f64_bytes_mut(v: &mut [f64]) -> &mut [u8] {
    // SAFETY: every byte pattern is a valid f64; the slice is exclusively borrowed.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v)) }
}
