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
        self.bcast_in(Group::All, root, buf)
    }

    /// Broadcast within `group` from its member `root` (a world rank).
    pub fn bcast_in(&mut self, group: Group, root: usize, buf: &mut [u8]) -> Result<()> {
        let n = group.len(self.size());
        let (me, root_i) = (group.index_of(self.rank())?, group.index_of(root)?);
        let rel = (me + n - root_i) % n;
        let mut mask = 1;
        while mask < n {
            if rel & mask != 0 {
                self.t.recv(group.rank((rel - mask + root_i) % n), buf)?;
                break;
            }
            mask <<= 1;
        }
        mask >>= 1;
        while mask > 0 {
            if rel + mask < n {
                self.t.send(group.rank((rel + mask + root_i) % n), buf)?;
            }
            mask >>= 1;
        }
        Ok(())
    }

    /// Increasing-ring broadcast within `group` (HPL's "1rg"): the root sends to the next
    /// member, which passes it on, around the group. Every link carries the message once,
    /// which suits large messages on links that cannot send two at full speed.
    pub fn bcast_ring_in(&mut self, group: Group, root: usize, buf: &mut [u8]) -> Result<()> {
        let n = group.len(self.size());
        let (me, root_i) = (group.index_of(self.rank())?, group.index_of(root)?);
        let rel = (me + n - root_i) % n;
        if rel > 0 {
            self.t.recv(group.rank((me + n - 1) % n), buf)?;
        }
        if rel + 1 < n {
            self.t.send(group.rank((me + 1) % n), buf)?;
        }
        Ok(())
    }

    /// HPL's "2rg": the root sends to the first member of each half of the others, and each
    /// half passes it along as a ring: half the hops of one ring, the root sending twice.
    pub fn bcast_two_ring_in(&mut self, group: Group, root: usize, buf: &mut [u8]) -> Result<()> {
        let n = group.len(self.size());
        let (me, root_i) = (group.index_of(self.rank())?, group.index_of(root)?);
        let rel = (me + n - root_i) % n;
        let at = |r: usize| group.rank((r + root_i) % n);
        // Others are rel 1..n; the first ring takes 1..=a, the second a+1..n.
        let a = n / 2;
        if rel == 0 {
            if n > 1 {
                self.t.send(at(1), buf)?;
            }
            if a + 1 < n {
                self.t.send(at(a + 1), buf)?;
            }
            return Ok(());
        }
        let (first, last) = if rel <= a { (1, a) } else { (a + 1, n - 1) };
        let from = if rel == first { 0 } else { rel - 1 };
        self.t.recv(at(from), buf)?;
        if rel < last {
            self.t.send(at(rel + 1), buf)?;
        }
        Ok(())
    }

    /// HPL's "Lng" (bandwidth-reducing): the root scatters one piece to each member, then the
    /// pieces go round a ring until everyone has all of them, so no link carries the whole
    /// message more than about once and the root sends it only once. Short messages, where
    /// the pieces would be tiny, go by the binomial tree.
    pub fn bcast_long_in(&mut self, group: Group, root: usize, buf: &mut [u8]) -> Result<()> {
        let n = group.len(self.size());
        if n < 3 || buf.len() < n * 4096 {
            return self.bcast_in(group, root, buf);
        }
        let (me, root_i) = (group.index_of(self.rank())?, group.index_of(root)?);
        let rel = (me + n - root_i) % n;
        let at = |r: usize| group.rank((r % n + root_i) % n);
        let len = buf.len();
        let piece = |k: usize| (k * len / n)..((k + 1) * len / n);
        if rel == 0 {
            for k in 1..n {
                self.t.send(at(k), &buf[piece(k)])?;
            }
        } else {
            self.t.recv(at(0), &mut buf[piece(rel)])?;
        }
        // Step s: send the piece got s steps ago to the next member, take the one before.
        let mut out = Vec::new();
        for s in 0..n - 1 {
            let send_k = (rel + n - s) % n;
            let recv_k = (rel + n - s - 1) % n;
            out.clear();
            out.extend_from_slice(&buf[piece(send_k)]);
            let (to, from) = (at(rel + 1), at(rel + n - 1));
            let r = piece(recv_k);
            self.sendrecv(to, &out, from, &mut buf[r])?;
        }
        Ok(())
    }

    /// HPL's "modified" broadcasts (1rM, 2rM, LnM): the root first sends to the member after
    /// it, which then needs the panel soonest (it factors the next one), and the others get
    /// it by `rest` among themselves, that member acting as the root.
    pub fn bcast_modified_in(
        &mut self,
        group: Group,
        root: usize,
        buf: &mut [u8],
        rest: fn(&mut Comm, Group, usize, &mut [u8]) -> Result<()>,
    ) -> Result<()> {
        let n = group.len(self.size());
        if n < 2 {
            return Ok(());
        }
        let root_i = group.index_of(root)?;
        let next = group.rank((root_i + 1) % n);
        if self.rank() == root {
            return self.t.send(next, buf);
        }
        if self.rank() == next {
            self.t.recv(root, buf)?;
        }
        let others: Vec<usize> = (1..n).map(|k| group.rank((root_i + k) % n)).collect();
        rest(self, Group::Members(&others), next, buf)
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

    /// Gathers at `root` what each member of `group` sends, when every size is known to the
    /// root beforehand (HPL's long swap knows them from the pivots): member i's bytes land in
    /// `parts[i]`, the root posting every receive at once, so the whole gather is one round.
    /// [`Comm::gather`] does not fit there: it serves only the whole world and learns each size
    /// from a first message, one member after another. The root's own part and empty parts
    /// travel nowhere (the root copies its own).
    pub fn gatherv_in(
        &mut self,
        group: Group,
        root: usize,
        mine: &[u8],
        parts: &mut [&mut [u8]],
    ) -> Result<()> {
        let n = group.len(self.size());
        group.index_of(root)?;
        if self.rank() != root {
            if !mine.is_empty() {
                self.t.send(root, mine)?;
            }
            return Ok(());
        }
        anyhow::ensure!(
            parts.len() == n,
            "gather: {} parts for {n} members",
            parts.len()
        );
        let mut recvs: Vec<RecvOp> = parts
            .iter_mut()
            .enumerate()
            .filter(|(i, p)| group.rank(*i) != root && !p.is_empty())
            .map(|(i, p)| RecvOp {
                peer: group.rank(i),
                buf: p,
            })
            .collect();
        self.t.exchange(&[], &mut recvs)
    }

    /// The reverse of [`Comm::gatherv_in`]: the root sends `parts[i]` to member i of `group`,
    /// every send posted at once; each member receives into `mine`, whose size it knows. The
    /// root's own part and empty parts travel nowhere.
    pub fn scatterv_in(
        &mut self,
        group: Group,
        root: usize,
        parts: &[&[u8]],
        mine: &mut [u8],
    ) -> Result<()> {
        let n = group.len(self.size());
        group.index_of(root)?;
        if self.rank() != root {
            if !mine.is_empty() {
                self.t.recv(root, mine)?;
            }
            return Ok(());
        }
        anyhow::ensure!(
            parts.len() == n,
            "scatter: {} parts for {n} members",
            parts.len()
        );
        let sends: Vec<SendOp> = parts
            .iter()
            .enumerate()
            .filter(|(i, p)| group.rank(*i) != root && !p.is_empty())
            .map(|(i, p)| SendOp {
                peer: group.rank(i),
                buf: p,
            })
            .collect();
        self.t.exchange(&sends, &mut [])
    }

    /// All-reduce of f64s over all ranks (recursive doubling, see `reduce_all`).
    pub fn allreduce_f64(&mut self, data: &mut [f64], op: ReduceOp) -> Result<()> {
        self.allreduce_f64_in(Group::All, data, op)
    }

    /// All-reduce of f64s within `group`, elementwise.
    pub fn allreduce_f64_in(&mut self, group: Group, data: &mut [f64], op: ReduceOp) -> Result<()> {
        // Commutative, as reduce_all needs: IEEE addition is; max and min by the total
        // order (f64::max may return either zero of ±0, so two partners could disagree).
        self.reduce_all(group, data, |acc, other| {
            for (a, b) in acc.iter_mut().zip(other) {
                *a = match op {
                    ReduceOp::Sum => *a + *b,
                    ReduceOp::Max => {
                        if b.total_cmp(a).is_gt() {
                            *b
                        } else {
                            *a
                        }
                    }
                    ReduceOp::Min => {
                        if b.total_cmp(a).is_lt() {
                            *b
                        } else {
                            *a
                        }
                    }
                };
            }
        })
    }

    /// The largest value over all ranks and the index that came with it; ties go to the
    /// smallest index (as HPL picks its pivot). Values compare by IEEE's total order, so the
    /// choice is the same whichever partner combines (NaN and ±0 included).
    pub fn allreduce_maxloc(&mut self, value: f64, index: u64) -> Result<(f64, u64)> {
        self.allreduce_maxloc_in(Group::All, value, index)
    }

    /// Maxloc within `group`.
    pub fn allreduce_maxloc_in(
        &mut self,
        group: Group,
        value: f64,
        index: u64,
    ) -> Result<(f64, u64)> {
        let mut pair = [value, f64::from_bits(index)];
        self.reduce_all(group, &mut pair, |acc, other| {
            let (v, i) = (other[0], other[1].to_bits());
            let take = match v.total_cmp(&acc[0]) {
                std::cmp::Ordering::Greater => true,
                std::cmp::Ordering::Equal => i < acc[1].to_bits(),
                std::cmp::Ordering::Less => false,
            };
            if take {
                acc.copy_from_slice(other);
            }
        })?;
        Ok((pair[0], pair[1].to_bits()))
    }

    /// All-reduce by recursive doubling: members beyond the largest power of two first hand
    /// their data to a partner below it; the rest exchange whole vectors with the member whose
    /// index differs in one bit, log2 times, combining as they go; the partners then hand the
    /// result back. Both ends of an exchange combine the same two vectors, so `combine` must
    /// be commutative (sum, a total-order max/min, maxloc with ties to the smaller index) and
    /// every member ends with bit-identical data, the same on every run. Half the latency
    /// steps of a reduce followed by a broadcast (one round trip for 2 ranks instead of two
    /// one-way hops), which is what a decode's per-layer all-reduce of a few KiB pays.
    fn reduce_all(
        &mut self,
        group: Group,
        data: &mut [f64],
        combine: impl Fn(&mut [f64], &[f64]),
    ) -> Result<()> {
        let n = group.len(self.size());
        let me = group.index_of(self.rank())?;
        if n < 2 {
            return Ok(());
        }
        let p2 = 1usize << (usize::BITS - 1 - n.leading_zeros());
        let mut tmp = vec![0f64; data.len()];
        if me >= p2 {
            let partner = group.rank(me - p2);
            self.t.send(partner, f64_bytes(data))?;
            return self.t.recv(partner, f64_bytes_mut(data));
        }
        if me + p2 < n {
            self.t.recv(group.rank(me + p2), f64_bytes_mut(&mut tmp))?;
            combine(data, &tmp);
        }
        let mut mask = 1;
        while mask < p2 {
            let partner = group.rank(me ^ mask);
            self.sendrecv(partner, f64_bytes(data), partner, f64_bytes_mut(&mut tmp))?;
            combine(data, &tmp);
            mask <<= 1;
        }
        if me + p2 < n {
            self.t.send(group.rank(me + p2), f64_bytes(data))?;
        }
        Ok(())
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

/// The ranks a collective runs over: all of them, or a subset such as one row or column of
/// HPL's process grid (listed in the order that fixes the tree).
#[derive(Debug, Clone, Copy)]
pub enum Group<'a> {
    All,
    Members(&'a [usize]),
}

impl Group<'_> {
    fn len(&self, world: usize) -> usize {
        match self {
            Group::All => world,
            Group::Members(m) => m.len(),
        }
    }
    fn rank(&self, index: usize) -> usize {
        match self {
            Group::All => index,
            Group::Members(m) => m[index],
        }
    }
    fn index_of(&self, rank: usize) -> Result<usize> {
        match self {
            Group::All => Ok(rank),
            Group::Members(m) => m
                .iter()
                .position(|r| *r == rank)
                .ok_or_else(|| anyhow::anyhow!("rank {rank} is not in the group {m:?}")),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::shm::{create_segment, ShmTransport};
    use crate::transport::PeerName;
    use std::time::Duration;

    /// `n` ranks as threads, each with its own shm transport, running `body`.
    fn ranks<T: Send + 'static>(n: usize, token: u8, body: fn(&mut Comm) -> T) -> Vec<T> {
        let token = [token; 16];
        create_segment(&token, n).unwrap();
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                std::thread::spawn(move || {
                    let names = (0..n)
                        .map(|rank| PeerName {
                            rank,
                            host: "test".into(),
                        })
                        .collect();
                    let t = ShmTransport::attach(rank, n, &token, names, Duration::from_secs(20))
                        .unwrap();
                    body(&mut Comm::new(Box::new(t)))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn world_collectives_agree_on_every_rank() {
        let out = ranks(4, 21, |c| {
            let r = c.rank() as f64;
            c.barrier().unwrap();
            let mut b = if c.rank() == 2 { [7u8, 8, 9] } else { [0u8; 3] };
            c.bcast(2, &mut b).unwrap();
            let mut v = [r, -r, 0.1 * r];
            c.allreduce_f64(&mut v, ReduceOp::Sum).unwrap();
            let mut m = [r, -r];
            c.allreduce_f64(&mut m, ReduceOp::Max).unwrap();
            // Ranks 1 and 3 tie on |value| 5; the smaller index (10) wins.
            let (value, index) = match c.rank() {
                1 => (5.0, 30),
                3 => (5.0, 10),
                _ => (r, r as u64),
            };
            let loc = c.allreduce_maxloc(value, index).unwrap();
            let all = c.allgather_f64(&[r, r * 10.0]).unwrap();
            (b, v, m, loc, all)
        });
        for (b, v, m, loc, all) in &out {
            assert_eq!(*b, [7, 8, 9]);
            assert_eq!(v[0], 6.0);
            assert_eq!(v[1], -6.0);
            assert_eq!(m, &[3.0, 0.0]);
            assert_eq!(*loc, (5.0, 10));
            assert_eq!(all, &vec![0.0, 0.0, 1.0, 10.0, 2.0, 20.0, 3.0, 30.0]);
        }
        // Fixed trees: every rank holds bit-identical sums.
        assert!(out
            .iter()
            .all(|o| o.1[2].to_bits() == out[0].1[2].to_bits()));
    }

    /// Recursive doubling on every size up to 7 (powers of two and the folded ones): sums
    /// whose order matters in the last bits, max and maxloc, bit-identical on every rank.
    #[test]
    fn all_reduce_agrees_bit_for_bit_on_any_size() {
        fn body(c: &mut Comm) -> ([f64; 3], [f64; 1], (f64, u64)) {
            let r = c.rank() as f64;
            let mut v = [0.1 * (r + 1.0), 1e16 + r, 1.0 / (r + 3.0)];
            c.allreduce_f64(&mut v, ReduceOp::Sum).unwrap();
            let mut m = [-(r - 2.0).abs()];
            c.allreduce_f64(&mut m, ReduceOp::Max).unwrap();
            let loc = c
                .allreduce_maxloc((r % 2.0) * 4.0, 100 - c.rank() as u64)
                .unwrap();
            // Partners must agree even on values plain comparisons cannot order.
            let odd = match c.rank() % 3 {
                0 => f64::NAN,
                1 => -0.0,
                _ => 0.0,
            };
            let odd_loc = c.allreduce_maxloc(odd, c.rank() as u64).unwrap();
            assert!(odd_loc.0.is_nan() && odd_loc.1 == 0, "{odd_loc:?}");
            (v, m, loc)
        }
        for (n, token) in [(2usize, 31u8), (3, 32), (4, 33), (5, 34), (6, 35), (7, 36)] {
            let out = ranks(n, token, body);
            let want: f64 = (0..n).map(|r| 0.1 * (r as f64 + 1.0)).sum();
            for (v, m, loc) in &out {
                assert!((v[0] - want).abs() < 1e-12, "{n} ranks: {} vs {want}", v[0]);
                assert_eq!(v[0].to_bits(), out[0].0[0].to_bits(), "{n} ranks");
                assert_eq!(v[2].to_bits(), out[0].0[2].to_bits(), "{n} ranks");
                assert_eq!(m[0], if n > 2 { 0.0 } else { -1.0 }, "{n} ranks");
                // Odd ranks carry 4.0; the highest odd rank has the smallest index.
                let last_odd = if n % 2 == 0 { n - 1 } else { n - 2 };
                assert_eq!(*loc, (4.0, 100 - last_odd as u64), "{n} ranks");
            }
        }
    }

    #[test]
    fn group_collectives_stay_inside_the_group() {
        let out = ranks(4, 22, |c| {
            let r = c.rank();
            // Two groups at once, as the rows of a 2x2 grid: {0,1} and {2,3}.
            let row: &[usize] = if r < 2 { &[0, 1] } else { &[2, 3] };
            let mut v = [r as f64];
            c.allreduce_f64_in(Group::Members(row), &mut v, ReduceOp::Sum)
                .unwrap();
            let mut b = [r as u8];
            c.bcast_in(Group::Members(row), row[1], &mut b).unwrap();
            let loc = c
                .allreduce_maxloc_in(Group::Members(row), -(r as f64), r as u64)
                .unwrap();
            (v[0], b[0], loc)
        });
        assert_eq!(out[0], (1.0, 1, (-0.0, 0)));
        assert_eq!(out[1], (1.0, 1, (-0.0, 0)));
        assert_eq!(out[2], (5.0, 3, (-2.0, 2)));
        assert_eq!(out[3], (5.0, 3, (-2.0, 2)));
    }

    #[test]
    fn group_gather_and_scatter_of_known_sizes_reach_every_member() {
        let out = ranks(4, 24, |c| {
            let r = c.rank();
            // The column {3, 1, 0} of some grid, rooted at its middle member; rank 2 idles.
            let col: &[usize] = &[3, 1, 0];
            if r == 2 {
                return (Vec::new(), Vec::new());
            }
            let root = 1;
            // Member i sends i + 1 bytes of value 10·rank; member 1 (the root) keeps its own.
            let idx = col.iter().position(|x| *x == r).unwrap();
            let mine = vec![10 * r as u8; idx + 1];
            let mut bufs: Vec<Vec<u8>> = (0..3).map(|i| vec![0u8; i + 1]).collect();
            {
                let mut parts: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
                c.gatherv_in(Group::Members(col), root, &mine, &mut parts)
                    .unwrap();
            }
            // Back out: member i gets 2·i bytes of value i + 100 (member 0: nothing at all).
            let outs: Vec<Vec<u8>> = (0..3).map(|i| vec![i as u8 + 100; 2 * i]).collect();
            let refs: Vec<&[u8]> = outs.iter().map(|b| &b[..]).collect();
            let mut got = vec![0u8; 2 * idx];
            if r != root {
                c.scatterv_in(Group::Members(col), root, &refs, &mut got)
                    .unwrap();
            } else {
                c.scatterv_in(Group::Members(col), root, &refs, &mut [])
                    .unwrap();
            }
            (bufs.concat(), got)
        });
        // The root (rank 1) holds rank 3's byte and rank 0's three bytes; its own stays zero.
        assert_eq!(out[1].0, vec![30, 0, 0, 0, 0, 0]);
        assert_eq!(out[0].1, vec![102; 4]);
        assert_eq!(out[3].1, Vec::<u8>::new());
    }

    #[test]
    fn every_broadcast_variant_delivers_from_every_root() {
        let out = ranks(5, 23, |c| {
            let mut got = Vec::new();
            // Long enough that "Lng" really scatters (5 pieces of more than 4 KiB).
            let len = 5 * 4096 + 7;
            for root in 0..5 {
                for variant in 0..6 {
                    let mut b = vec![0u8; len];
                    if c.rank() == root {
                        for (i, x) in b.iter_mut().enumerate() {
                            *x = (i * 31 + root * 7 + variant) as u8;
                        }
                    }
                    let g = Group::All;
                    match variant {
                        0 => c.bcast_ring_in(g, root, &mut b),
                        1 => c.bcast_two_ring_in(g, root, &mut b),
                        2 => c.bcast_long_in(g, root, &mut b),
                        3 => c.bcast_modified_in(g, root, &mut b, Comm::bcast_ring_in),
                        4 => c.bcast_modified_in(g, root, &mut b, Comm::bcast_two_ring_in),
                        _ => c.bcast_modified_in(g, root, &mut b, Comm::bcast_long_in),
                    }
                    .unwrap();
                    let ok = b
                        .iter()
                        .enumerate()
                        .all(|(i, x)| *x == (i * 31 + root * 7 + variant) as u8);
                    got.push(ok);
                }
            }
            got
        });
        for (r, oks) in out.iter().enumerate() {
            assert!(oks.iter().all(|o| *o), "rank {r}: {oks:?}");
        }
    }
}
