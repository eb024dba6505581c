//! Collectives, built once on top of any [`Transport`] for every suite: the generic ones over
//! any element type and algorithm (all-reduce, reduce-scatter, all-gather, broadcast, reduce,
//! all-to-all: [`algo`]), and the ones HPL and the decode need besides (barrier, HPL's
//! broadcast variants, gather and scatter of known sizes, maxloc, sendrecv).
//!
//! Trees and rings are fixed by rank numbers, so a reduction adds in the same order on every
//! run and every rank gets bit-identical results (the decode's consistency check depends on
//! that).

pub mod algo;
mod cables;
pub mod element;
#[cfg(test)]
mod tests;

pub use algo::{default_algo, Algo, CollOp, Tuning};
pub use element::{as_bytes, as_bytes_mut, Dtype, Element};

use crate::transport::{Buffer, RecvOp, SendOp, Transport, Waiting};
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
    /// Reused by the generic collectives (see [`Comm::release_scratch`]).
    scratch: Option<Buffer>,
    /// What `Algo::Auto` follows where a probe was run.
    tuning: Tuning,
    /// Pairs of ranks with no cable between them (a partial cabling over links).
    unlinked: Vec<[usize; 2]>,
    /// On a ring cabling, the ranks in the cables' order round the ring (which need not be
    /// the ranks' own: the hostfile may list the hosts another way round).
    ring_order: Option<std::sync::Arc<[usize]>>,
    /// Each rank's neighbours are on cables of their own, each full duplex: a ring all-reduce
    /// then runs both ways round at once, half the data each way.
    ring_both_ways: bool,
}

impl Comm {
    pub fn new(t: Box<dyn Transport>) -> Self {
        Comm {
            t,
            scratch: None,
            tuning: Tuning::default(),
            unlinked: Vec::new(),
            ring_order: None,
            ring_both_ways: false,
        }
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
    /// How the waits spend the core from now on ([`Waiting`]): `Beside` while messages travel
    /// on a helper thread beside this rank's computation, `Spin` again after.
    pub fn set_waiting(&mut self, waiting: Waiting) {
        self.t.set_waiting(waiting)
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

    /// Receives rank `from`'s partial result of the whole of `data` and combines it in,
    /// sending `data` to rank `to` meanwhile where given. `own`, where given, is an
    /// out-of-place op's input, not in `data` yet: it is what goes to `to`, the partial result
    /// lands straight in `data` and `own` is combined into it, so the input is never copied
    /// first (`combine` commutes, so the result is the same bits).
    pub(crate) fn combine_from<T: Element>(
        &mut self,
        to: Option<usize>,
        from: usize,
        own: Option<&[T]>,
        data: &mut [T],
        tmp: &mut [T],
        combine: impl Fn(&mut [T], &[T]),
    ) -> Result<()> {
        let t = &mut tmp[..data.len()];
        let (out, into): (&[T], &mut [T]) = match own {
            Some(own) => (own, &mut *data),
            None => (&*data, &mut *t),
        };
        let send = to.map(|peer| SendOp {
            peer,
            buf: as_bytes(out),
        });
        let buf = as_bytes_mut(into);
        self.t
            .exchange(send.as_slice(), &mut [RecvOp { peer: from, buf }])?;
        combine(data, own.unwrap_or(t));
        Ok(())
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

    /// Dissemination barrier: ⌈log2 N⌉ rounds of one-byte messages (on a partial cabling,
    /// up the cables' tree and back: [`cables`]).
    pub fn barrier(&mut self) -> Result<()> {
        if self.on_cable_tree() {
            return self.tree_barrier();
        }
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

    /// Binomial-tree broadcast of `buf` from `root` (on a partial cabling, down the cables'
    /// tree: [`cables`]).
    pub fn bcast(&mut self, root: usize, buf: &mut [u8]) -> Result<()> {
        self.bcast_in(Group::All, root, buf)
    }

    /// Broadcast within `group` from its member `root` (a world rank): the binomial tree, or
    /// for the whole world on a partial cabling the cables' tree.
    /// A group listed round a ring of cables whose binomial tree would cross an uncabled
    /// pair goes round the ring instead ([`Comm::bcast_ring_in`]).
    pub fn bcast_in(&mut self, group: Group, root: usize, buf: &mut [u8]) -> Result<()> {
        if matches!(group, Group::All) && self.on_cable_tree() {
            return self.tree_bcast(root, buf);
        }
        let n = group.len(self.size());
        let root_i = group.index_of(root)?;
        if !self.group_on_cables(group, || CollOp::Broadcast.pairs(Algo::Tree, n, root_i)) {
            return self.bcast_ring_in(group, root, buf);
        }
        self.bcast_binomial_in(group, root, buf)
    }

    /// Whether every pair (group indices) is cabled, or the run has every pair linked. The
    /// pairs are listed only on a partial cabling: the small collectives ask on every call.
    pub fn group_on_cables(&self, group: Group, pairs: impl FnOnce() -> Vec<[usize; 2]>) -> bool {
        self.unlinked.is_empty()
            || pairs().into_iter().all(|[a, b]| {
                let (x, y) = (group.rank(a), group.rank(b));
                !self.unlinked.contains(&[x.min(y), x.max(y)])
            })
    }

    /// Moves `buf` from group member `from` to member `to`: directly where the two are cabled
    /// (or every pair is), else hop by hop between neighbours round the group, the shorter
    /// way (a group listed in a ring's cable order). Every member calls it with a buffer of
    /// the message's length: `from`'s is sent, `to`'s receives, those between pass it on.
    pub fn relay_in(&mut self, group: Group, from: usize, to: usize, buf: &mut [u8]) -> Result<()> {
        let me = self.rank();
        if from == to {
            return Ok(());
        }
        if self.unlinked.is_empty() || !self.unlinked.contains(&[from.min(to), from.max(to)]) {
            if me == from {
                self.t.send(to, buf)?;
            } else if me == to {
                self.t.recv(from, buf)?;
            }
            return Ok(());
        }
        let n = group.len(self.size());
        let (fi, ti) = (group.index_of(from)?, group.index_of(to)?);
        let Ok(mi) = group.index_of(me) else {
            return Ok(());
        };
        let (ahead, back) = ((ti + n - fi) % n, (fi + n - ti) % n);
        let (hops, step) = if ahead <= back {
            (ahead, 1)
        } else {
            (back, n - 1)
        };
        let Some(k) = (0..=hops).find(|k| (fi + k * step) % n == mi) else {
            return Ok(());
        };
        if k > 0 {
            self.t.recv(group.rank((fi + (k - 1) * step) % n), buf)?;
        }
        if k < hops {
            self.t.send(group.rank((fi + (k + 1) * step) % n), buf)?;
        }
        Ok(())
    }

    /// The binomial-tree broadcast within `group` from its member `root`, whatever the
    /// cabling: what `Algo::Tree` declares and the collectives run.
    pub(crate) fn bcast_binomial_in(
        &mut self,
        group: Group,
        root: usize,
        buf: &mut [u8],
    ) -> Result<()> {
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
            return self.bcast_binomial_in(group, root, buf);
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
        if self.on_cable_tree() {
            return self.tree_gather(root, mine);
        }
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
        self.small_reduce_all(group, data, |acc, other| {
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
        self.small_reduce_all(group, &mut pair, |acc, other| {
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

    /// The all-reduce of a few values the suites use to agree (times, counts, HPL's pivots):
    /// recursive doubling, or on a partial cabling along the cables' tree (the whole world)
    /// or along the group's chain (a group whose recursive-doubling partners have no cable).
    fn small_reduce_all<T: Element>(
        &mut self,
        group: Group,
        data: &mut [T],
        combine: impl Fn(&mut [T], &[T]),
    ) -> Result<()> {
        if matches!(group, Group::All) && self.on_cable_tree() {
            return self.tree_reduce_all(data, combine);
        }
        let n = group.len(self.size());
        if !self.group_on_cables(group, || CollOp::AllReduce.pairs(Algo::Rd, n, 0)) {
            return self.chain_reduce_all(group, data, combine);
        }
        self.reduce_all(group, None, data, combine)
    }

    /// All-reduce along the group's chain of neighbours (a group listed round a ring of
    /// cables, where recursive doubling's partners have none): each member combines what
    /// the one before it passed with its own and passes it on; the last member's result goes
    /// back down the chain, so every member ends with the same bits.
    fn chain_reduce_all<T: Element>(
        &mut self,
        group: Group,
        data: &mut [T],
        combine: impl Fn(&mut [T], &[T]),
    ) -> Result<()> {
        let n = group.len(self.size());
        let me = group.index_of(self.rank())?;
        if n < 2 {
            return Ok(());
        }
        if me > 0 {
            let mut scratch = self.take_scratch::<T>(data.len())?;
            let tmp: &mut [T] =
                element::as_elements_mut(&mut scratch[..std::mem::size_of_val(data)]);
            self.t.recv(group.rank(me - 1), as_bytes_mut(tmp))?;
            combine(data, tmp);
            self.scratch = Some(scratch);
        }
        if me + 1 < n {
            self.t.send(group.rank(me + 1), as_bytes(data))?;
            self.t.recv(group.rank(me + 1), as_bytes_mut(data))?;
        }
        if me > 0 {
            self.t.send(group.rank(me - 1), as_bytes(data))?;
        }
        Ok(())
    }

    /// All-reduce by recursive doubling: members beyond the largest power of two first hand
    /// their data to a partner below it; the rest exchange whole vectors with the member whose
    /// index differs in one bit, log2 times, combining as they go; the partners then hand the
    /// result back. Both ends of an exchange combine the same two vectors, so `combine` must
    /// be commutative (sum, a total-order max/min, maxloc with ties to the smaller index) and
    /// every member ends with bit-identical data, the same on every run. Half the latency
    /// steps of a reduce followed by a broadcast (one round trip for 2 ranks instead of two
    /// one-way hops), which is what a decode's per-layer all-reduce of a few KiB pays.
    ///
    /// `input`, where given, holds this rank's vector and `data` nothing yet (an out-of-place
    /// all-reduce): the first partial result received lands straight in `data` and the input
    /// is combined into it, so the input is never copied first.
    pub(crate) fn reduce_all<T: Element>(
        &mut self,
        group: Group,
        input: Option<&[T]>,
        data: &mut [T],
        combine: impl Fn(&mut [T], &[T]),
    ) -> Result<()> {
        let n = group.len(self.size());
        let me = group.index_of(self.rank())?;
        if n < 2 {
            if let Some(input) = input {
                data.copy_from_slice(input);
            }
            return Ok(());
        }
        let p2 = 1usize << (usize::BITS - 1 - n.leading_zeros());
        if me >= p2 {
            let partner = group.rank(me - p2);
            self.t.send(partner, as_bytes(input.unwrap_or(data)))?;
            return self.t.recv(partner, as_bytes_mut(data));
        }
        let mut scratch = self.take_scratch::<T>(data.len())?;
        let tmp: &mut [T] = element::as_elements_mut(&mut scratch[..std::mem::size_of_val(data)]);
        let mut input = input;
        if me + p2 < n {
            self.combine_from(None, group.rank(me + p2), input.take(), data, tmp, &combine)?;
        }
        let mut mask = 1;
        while mask < p2 {
            let partner = group.rank(me ^ mask);
            self.combine_from(Some(partner), partner, input.take(), data, tmp, &combine)?;
            mask <<= 1;
        }
        if me + p2 < n {
            self.t.send(group.rank(me + p2), as_bytes(data))?;
        }
        self.scratch = Some(scratch);
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
