//! The collectives tensor parallelism and nccl-tests measure (all-reduce, reduce-scatter,
//! all-gather, broadcast, reduce, all-to-all), each in the algorithms clusters choose between:
//!
//! - **ring**: neighbours pass pieces round the ring (all-reduce = reduce-scatter then
//!   all-gather; broadcast and reduce as a pipelined chain). Every link carries about the
//!   minimum, with 2(n−1) latency steps: the bandwidth choice (jaccl-ring, NCCL's ring).
//! - **mesh**: every rank exchanges its share with every other at once: two steps whatever
//!   the size, the choice on a fully cabled mesh (JACCL's mesh).
//! - **rd**: recursive doubling for short all-reduces (log2 n whole-vector exchanges), halving
//!   then doubling (Rabenseifner) for long ones; a size that is not a power of two folds its
//!   extra ranks in first. Reduce-scatter (recursive halving) and all-gather (recursive
//!   doubling) need a power-of-two rank count.
//! - **tree**: binomial trees (broadcast, reduce, and all-reduce as reduce then broadcast).
//! - **auto**: per op and size, what a measured probe chose ([`Comm::set_tuning`]) where one
//!   was run, else the textbook thresholds of [`default_algo`].
//!
//! Every algorithm works over any [`Group`] and any count (pieces differ by at most one
//! element when the count does not divide), reuses one scratch buffer from the transport
//! (registered once on verbs), and reduces in an order fixed by rank numbers, so every rank
//! ends with bit-identical results on every run.

use super::element::{as_bytes, as_bytes_mut, as_elements_mut, Element};
use super::{Comm, Group, ReduceOp};
use crate::transport::{Buffer, RecvOp, SendOp, Traffic};
use anyhow::{bail, Result};
use smallvec::SmallVec;
use std::ops::Range;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algo {
    Ring,
    Mesh,
    Rd,
    Tree,
    Auto,
}

impl Algo {
    /// Every algorithm that names one way of running (auto picks among these).
    pub const EXPLICIT: [Algo; 4] = [Algo::Ring, Algo::Mesh, Algo::Rd, Algo::Tree];

    pub fn name(self) -> &'static str {
        match self {
            Algo::Ring => "ring",
            Algo::Mesh => "mesh",
            Algo::Rd => "rd",
            Algo::Tree => "tree",
            Algo::Auto => "auto",
        }
    }

    pub fn parse(s: &str) -> Result<Algo, String> {
        match s.trim() {
            "ring" => Ok(Algo::Ring),
            "mesh" | "direct" => Ok(Algo::Mesh),
            "rd" => Ok(Algo::Rd),
            "tree" => Ok(Algo::Tree),
            "auto" => Ok(Algo::Auto),
            other => Err(format!(
                "unknown algorithm '{other}' (use ring, mesh, rd, tree, auto, all, or a comma list)"
            )),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollOp {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    Reduce,
    AllToAll,
    /// Pairs of neighbours (members 0-1, 2-3, ...) send a message there and back: what a
    /// pipeline's hand-off costs, timed one way. Not one of `--op all`'s collectives.
    PingPong,
}

impl CollOp {
    pub const ALL: [CollOp; 6] = [
        CollOp::AllReduce,
        CollOp::ReduceScatter,
        CollOp::AllGather,
        CollOp::Broadcast,
        CollOp::Reduce,
        CollOp::AllToAll,
    ];

    /// Every op `--op` names: the six collectives, then the ping-pong.
    pub const NAMED: [CollOp; 7] = [
        CollOp::AllReduce,
        CollOp::ReduceScatter,
        CollOp::AllGather,
        CollOp::Broadcast,
        CollOp::Reduce,
        CollOp::AllToAll,
        CollOp::PingPong,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CollOp::AllReduce => "all-reduce",
            CollOp::ReduceScatter => "reduce-scatter",
            CollOp::AllGather => "all-gather",
            CollOp::Broadcast => "broadcast",
            CollOp::Reduce => "reduce",
            CollOp::AllToAll => "all-to-all",
            CollOp::PingPong => "ping-pong",
        }
    }

    pub fn parse(s: &str) -> Result<CollOp, String> {
        let s = s.trim().replace('_', "-");
        CollOp::NAMED
            .into_iter()
            .find(|o| o.name() == s || o.name().replace('-', "") == s)
            .ok_or_else(|| {
                format!(
                    "unknown collective '{s}' (use all-reduce, reduce-scatter, all-gather, broadcast, reduce, all-to-all, ping-pong, all, or a comma list)"
                )
            })
    }

    /// The algorithms this op has.
    pub fn algos(self) -> &'static [Algo] {
        match self {
            CollOp::AllReduce => &[Algo::Ring, Algo::Mesh, Algo::Rd, Algo::Tree],
            CollOp::ReduceScatter | CollOp::AllGather => &[Algo::Ring, Algo::Mesh, Algo::Rd],
            CollOp::Broadcast | CollOp::Reduce => &[Algo::Ring, Algo::Mesh, Algo::Tree],
            CollOp::AllToAll => &[Algo::Ring, Algo::Mesh],
            // Neighbours round the ring, in pairs.
            CollOp::PingPong => &[Algo::Ring],
        }
    }

    /// Whether `algo` runs this op on `n` ranks; Err says why not.
    pub fn supports(self, algo: Algo, n: usize) -> Result<(), String> {
        if algo == Algo::Auto {
            return Ok(());
        }
        if !self.algos().contains(&algo) {
            let names: Vec<&str> = self.algos().iter().map(|a| a.name()).collect();
            return Err(format!(
                "{} has no {} algorithm (it has {})",
                self.name(),
                algo.name(),
                names.join(", ")
            ));
        }
        if algo == Algo::Rd
            && matches!(self, CollOp::ReduceScatter | CollOp::AllGather)
            && !n.is_power_of_two()
        {
            return Err(format!(
                "{} by rd needs a power-of-two rank count, not {n}",
                self.name()
            ));
        }
        Ok(())
    }

    /// The pairs of group members (indices into the group, lower first) that `algo` moves
    /// data between on `n` members, the root at index `root` (broadcast, reduce): what the
    /// cabling must link for it to run on cables alone. Ring: neighbours round the ring
    /// (broadcast and reduce: the chain from the root, no wrap); mesh and every all-to-all:
    /// every pair; rd: the folded extra ranks and the partners of each doubling step; tree:
    /// the binomial tree's edges (all-reduce's rooted at 0).
    pub fn pairs(self, algo: Algo, n: usize, root: usize) -> Vec<[usize; 2]> {
        let mut out: Vec<[usize; 2]> = Vec::new();
        let mut add = |a: usize, b: usize| {
            let p = [a.min(b), a.max(b)];
            if a != b && !out.contains(&p) {
                out.push(p);
            }
        };
        if n < 2 {
            return out;
        }
        let chain = matches!(self, CollOp::Broadcast | CollOp::Reduce);
        if self == CollOp::PingPong {
            for k in 0..n / 2 {
                add(2 * k, 2 * k + 1);
            }
            return out;
        }
        match algo {
            _ if self == CollOp::AllToAll || algo == Algo::Mesh => {
                for a in 0..n {
                    for b in a + 1..n {
                        add(a, b);
                    }
                }
            }
            Algo::Ring if chain => {
                for k in 0..n - 1 {
                    add((root + k) % n, (root + k + 1) % n);
                }
            }
            Algo::Ring => {
                for i in 0..n {
                    add(i, (i + 1) % n);
                }
            }
            Algo::Rd => {
                let p2 = 1usize << (usize::BITS - 1 - n.leading_zeros());
                for r in p2..n {
                    add(r - p2, r);
                }
                let mut mask = 1;
                while mask < p2 {
                    for i in 0..p2 {
                        add(i, i ^ mask);
                    }
                    mask *= 2;
                }
            }
            Algo::Tree => {
                let root = if chain { root } else { 0 };
                let mut mask = 1;
                while mask < n {
                    let mut rel = 0;
                    while rel + mask < n {
                        add((rel + root) % n, (rel + mask + root) % n);
                        rel += 2 * mask;
                    }
                    mask *= 2;
                }
            }
            Algo::Mesh | Algo::Auto => {}
        }
        out
    }

    /// nccl-tests' bus bandwidth factor: busbw = algbw × factor, the bytes each rank's link
    /// must carry relative to the array, so figures compare across rank counts.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            CollOp::AllReduce => 2.0 * (n - 1.0) / n,
            CollOp::ReduceScatter | CollOp::AllGather | CollOp::AllToAll => (n - 1.0) / n,
            CollOp::Broadcast | CollOp::Reduce | CollOp::PingPong => 1.0,
        }
    }
}

/// `auto` without a probe: the textbook thresholds MPI libraries ship with (MPICH's defaults
/// follow the same shape). Recursive doubling (halving-doubling when long) for all-reduce at
/// every size; rd for short reduce-scatter/all-gather on powers of two, else the ring; a tree
/// for short broadcasts and reduces, the pipelined chain for long; all-to-all at once.
pub fn default_algo(op: CollOp, bytes: usize, n: usize) -> Algo {
    const SHORT: usize = 64 << 10;
    match op {
        CollOp::AllReduce => Algo::Rd,
        CollOp::ReduceScatter | CollOp::AllGather => {
            if n.is_power_of_two() && bytes <= SHORT {
                Algo::Rd
            } else {
                Algo::Ring
            }
        }
        CollOp::Broadcast | CollOp::Reduce => {
            if bytes <= 4 * SHORT {
                Algo::Tree
            } else {
                Algo::Ring
            }
        }
        CollOp::AllToAll => Algo::Mesh,
        CollOp::PingPong => Algo::Ring,
    }
}

/// What `auto` follows where a probe ran: per op, the algorithm chosen at each probed size
/// (coll's probe: the fastest, or [`default_algo`]'s choice where within its margin).
#[derive(Debug, Clone, Default)]
pub struct Tuning {
    pub entries: Vec<(CollOp, Vec<(usize, Algo)>)>,
}

impl Tuning {
    /// The winner at the probed size nearest to `bytes` (on a log scale).
    pub fn pick(&self, op: CollOp, bytes: usize) -> Option<Algo> {
        let (_, table) = self.entries.iter().find(|(o, _)| *o == op)?;
        // Nearest on a log scale is the smallest ratio of the larger size to the smaller: the
        // same order as |ln s - ln bytes| without a logarithm per entry, since this runs in
        // every timed call of `auto` (an 8-byte all-reduce over shared memory takes 0.3 µs).
        let b = bytes.max(1) as f64;
        let ratio = |s: usize| {
            let s = s.max(1) as f64;
            if s > b {
                s / b
            } else {
                b / s
            }
        };
        table
            .iter()
            .min_by(|x, y| ratio(x.0).total_cmp(&ratio(y.0)))
            .map(|(_, a)| *a)
    }
}

/// Pieces of `count` elements over `parts`: piece i is [i·count/parts, (i+1)·count/parts), so
/// sizes differ by at most one and every rank computes the same bounds.
fn piece(count: usize, parts: usize, i: usize) -> Range<usize> {
    (i * count / parts)..((i + 1) * count / parts)
}

/// A member's place on a ring ([`Comm::ring_seat`]): the member at each position, its own
/// position, and its neighbours' world ranks.
struct RingSeat {
    order: Option<std::sync::Arc<[usize]>>,
    me: usize,
    right: usize,
    left: usize,
}

impl RingSeat {
    /// The member (its index in the group, its block's place) at ring position `p`.
    fn at(&self, p: usize) -> usize {
        self.order.as_ref().map_or(p, |o| o[p])
    }
}

/// The whole world as `order` lists it (the cables' ring order, from [`Comm::cabled_order`]);
/// any other group as it is.
fn in_order<'a>(order: &'a Option<std::sync::Arc<[usize]>>, group: Group<'a>) -> Group<'a> {
    match (order, group) {
        (Some(o), Group::All) => Group::Members(o),
        (_, g) => g,
    }
}

/// A read-only range and a disjoint writable range of one slice.
fn split<T>(data: &mut [T], read: Range<usize>, write: Range<usize>) -> (&[T], &mut [T]) {
    if read.is_empty() {
        return (&[], &mut data[write]);
    }
    if write.is_empty() {
        return (&data[read], &mut []);
    }
    if read.end <= write.start {
        let (a, b) = data.split_at_mut(write.start);
        (&a[read], &mut b[..write.len()])
    } else {
        assert!(write.end <= read.start, "overlapping ranges");
        let (a, b) = data.split_at_mut(read.start);
        (&b[..read.len()], &mut a[write])
    }
}

/// `data` cut at consecutive boundaries into one writable slice per part.
fn split_parts<T>(
    mut data: &mut [T],
    parts: usize,
    bounds: impl Fn(usize) -> Range<usize>,
) -> Vec<&mut [T]> {
    let mut out = Vec::with_capacity(parts);
    let mut start = 0;
    for i in 0..parts {
        let r = bounds(i);
        debug_assert_eq!(r.start, start);
        let (head, tail) = std::mem::take(&mut data).split_at_mut(r.end - start);
        out.push(head);
        data = tail;
        start = r.end;
    }
    out
}

/// Segments for pipelined chains: long enough to keep a link busy, short enough that the
/// next hop starts early.
const CHAIN_SEGMENT_BYTES: usize = 256 << 10;

/// The segment length in bytes a broadcast chain over `n` members cuts `len` bytes into:
/// 256 KiB, but no more than 2(n − 1) segments, since past that a chain gains no overlap and
/// each segment costs a round of the exchange. A chain of two has no next hop to overlap
/// with, so it sends one message (two 512 KiB segments took twice the time of one 1 MiB
/// message over loopback TCP).
fn chain_segment(len: usize, n: usize) -> usize {
    if n <= 2 {
        return len.max(1);
    }
    CHAIN_SEGMENT_BYTES.max(len.div_ceil(2 * (n - 1)).max(1))
}
/// Direct (mesh) reduces land every rank's piece at the root at once; in segments of this
/// many bytes per rank the root's scratch stays bounded.
const MESH_REDUCE_SEGMENT_BYTES: usize = 4 << 20;
/// Recursive doubling sends the whole vector log2 n times; above this, halving-doubling
/// sends about twice the vector in all (and needs at least 4 ranks to win).
const RD_LONG_BYTES: usize = 64 << 10;

impl Comm {
    /// Sets the measured winners `Algo::Auto` follows.
    pub fn set_tuning(&mut self, tuning: Tuning) {
        self.tuning = tuning;
    }

    /// Tells the collectives which pairs of ranks have no cable (a ring's diagonals, a
    /// partial mesh): an algorithm that would move data between them is refused, and `auto`
    /// chooses among the others.
    pub fn set_unlinked(&mut self, pairs: Vec<[usize; 2]>) {
        self.unlinked = pairs
            .into_iter()
            .map(|[a, b]| [a.min(b), a.max(b)])
            .collect();
    }

    /// Tells the collectives the cables' ring order (every rank once): all-reduce, broadcast
    /// and reduce over every rank then take the ranks in that order, and the ring all-gather
    /// and reduce-scatter go round it (each block still at its rank's place), so a ring runs
    /// round the cables and only between neighbours, whatever the ranks' numbers.
    pub fn set_ring_order(&mut self, order: Vec<usize>) {
        let mut sorted = order.clone();
        sorted.sort_unstable();
        if sorted == (0..self.size()).collect::<Vec<_>>() {
            self.ring_order = Some(order.into());
        }
    }

    /// Says that each rank reaches its neighbours over cables of their own (a run over a
    /// cluster's cables: a ring or a mesh), each full duplex: a ring all-reduce on 3 or more
    /// ranks then sends half the data each way round at once, so it uses both directions of
    /// both cables (on a switch, a one-way ring already fills each port both ways).
    pub fn set_ring_both_ways(&mut self, on: bool) {
        self.ring_both_ways = on;
    }

    /// The ranks in the cables' ring order, where the run is over a ring cabling.
    pub fn ring_order(&self) -> Option<&[usize]> {
        self.ring_order.as_deref()
    }

    /// The ranks in the order `op` over the whole world takes them: the cables' ring order
    /// for the ops whose result does not depend on it (all-reduce, broadcast, reduce), else
    /// none (rank order).
    fn cabled_order(&self, op: CollOp) -> Option<std::sync::Arc<[usize]>> {
        match op {
            CollOp::AllReduce | CollOp::Broadcast | CollOp::Reduce | CollOp::PingPong => {
                self.ring_order.clone()
            }
            _ => None,
        }
    }

    /// The cables' ring order for a ring all-gather or reduce-scatter over every rank: it goes
    /// round the ranks in that order, each block still at its rank's place in the array.
    fn ring_blocks_order(
        &self,
        op: CollOp,
        algo: Algo,
        group: Group,
    ) -> Option<std::sync::Arc<[usize]>> {
        match (op, algo, group) {
            (CollOp::AllGather | CollOp::ReduceScatter, Algo::Ring, Group::All) => {
                self.ring_order.clone()
            }
            _ => None,
        }
    }

    /// Where member `me` of `group` (of `n`) sits on a ring all-gather's or reduce-scatter's
    /// ring: round the cables' order over the whole world where there is one, each block
    /// still at its member's place in the array; else round the group's own order.
    fn ring_seat(&self, op: CollOp, group: Group, me: usize, n: usize) -> RingSeat {
        let order = self.ring_blocks_order(op, Algo::Ring, group);
        let at = |p: usize| order.as_ref().map_or(p, |o| o[p]);
        let me_p = order
            .as_ref()
            .and_then(|o| o.iter().position(|&r| r == me))
            .unwrap_or(me);
        let (right, left) = (
            group.rank(at((me_p + 1) % n)),
            group.rank(at((me_p + n - 1) % n)),
        );
        RingSeat {
            order,
            me: me_p,
            right,
            left,
        }
    }

    /// The pairs (ranks) `algo` needs on `group` that have no cable; empty where it runs on
    /// the cables alone (or every pair is linked).
    pub fn uncabled(&self, op: CollOp, algo: Algo, group: Group, root_i: usize) -> Vec<[usize; 2]> {
        if self.unlinked.is_empty() {
            return Vec::new();
        }
        // The ring all-gather and reduce-scatter over every rank go round the cables' order.
        let ordered = self.ring_blocks_order(op, algo, group);
        let group = match &ordered {
            Some(o) => Group::Members(o),
            None => group,
        };
        let n = group.len(self.size());
        op.pairs(algo, n, root_i)
            .into_iter()
            .map(|[a, b]| {
                let (x, y) = (group.rank(a), group.rank(b));
                [x.min(y), x.max(y)]
            })
            .filter(|p| self.unlinked.contains(p))
            .collect()
    }

    /// What `algo` means for this op and size: itself, or auto's choice (on a partial
    /// cabling, the first of ring, tree, rd and mesh that runs on cables alone where the
    /// choice would not).
    pub fn resolve(&self, op: CollOp, algo: Algo, bytes: usize, n: usize) -> Algo {
        match self.cabled_order(op) {
            Some(order) if n == self.size() => {
                // The root is world rank 0, wherever the ring's order puts it.
                let root_i = order.iter().position(|&r| r == 0).unwrap_or(0);
                self.resolve_in(op, algo, bytes, n, Group::Members(&order), root_i)
            }
            _ => self.resolve_in(op, algo, bytes, n, Group::All, 0),
        }
    }

    fn resolve_in(
        &self,
        op: CollOp,
        algo: Algo,
        bytes: usize,
        n: usize,
        group: Group,
        root_i: usize,
    ) -> Algo {
        if algo != Algo::Auto {
            return algo;
        }
        let chosen = self
            .tuning
            .pick(op, bytes)
            .filter(|a| op.supports(*a, n).is_ok())
            .unwrap_or_else(|| default_algo(op, bytes, n));
        if self.uncabled(op, chosen, group, root_i).is_empty() {
            return chosen;
        }
        [Algo::Ring, Algo::Tree, Algo::Rd, Algo::Mesh]
            .into_iter()
            .find(|a| op.supports(*a, n).is_ok() && self.uncabled(op, *a, group, root_i).is_empty())
            .unwrap_or(chosen)
    }

    /// `resolve`, refusing in one line an algorithm the op does not have on `n` ranks, or
    /// one that needs a pair of ranks with no cable between them.
    fn plan(
        &self,
        op: CollOp,
        algo: Algo,
        bytes: usize,
        group: Group,
        root_i: usize,
    ) -> Result<Algo> {
        let n = group.len(self.size());
        let algo = self.resolve_in(op, algo, bytes, n, group, root_i);
        self.check(op, algo, group, root_i)?;
        Ok(algo)
    }

    /// Whether `algo` runs `op` on `group` here: Err, in one line, where the op has no such
    /// algorithm on this many ranks, or where it needs a pair of ranks with no cable.
    pub fn check(&self, op: CollOp, algo: Algo, group: Group, root_i: usize) -> Result<()> {
        // Over every rank, the order the op will take them in (the cables' ring order).
        let order = self.cabled_order(op);
        let (group, root_i) = match (&order, group) {
            (Some(o), Group::All) => (
                Group::Members(o),
                o.iter().position(|r| *r == root_i).unwrap_or(0),
            ),
            (_, g) => (g, root_i),
        };
        let n = group.len(self.size());
        op.supports(algo, n).map_err(anyhow::Error::msg)?;
        let missing = self.uncabled(op, algo, group, root_i);
        if !missing.is_empty() {
            let pairs: Vec<String> = missing.iter().map(|[a, b]| format!("{a}-{b}")).collect();
            let fits: Vec<&str> = op
                .algos()
                .iter()
                .filter(|a| {
                    op.supports(**a, n).is_ok() && self.uncabled(op, **a, group, root_i).is_empty()
                })
                .map(|a| a.name())
                .collect();
            bail!(
                "{} by {} moves data between ranks with no cable between them ({}){}",
                op.name(),
                algo.name(),
                pairs.join(", "),
                if fits.is_empty() {
                    " and no algorithm of it runs on this cabling alone".to_string()
                } else {
                    format!(": --algo {} runs on the cables", fits.join(" or "))
                }
            );
        }
        Ok(())
    }

    /// One exchange, leaving out empty messages (both ends compute the same sizes, so both
    /// leave out the same ones).
    fn post<'a>(
        &mut self,
        sends: impl IntoIterator<Item = (usize, &'a [u8])>,
        recvs: impl IntoIterator<Item = (usize, &'a mut [u8])>,
    ) -> Result<()> {
        // On the stack up to 8 messages each way (every step of ring, rd and tree, and mesh
        // on up to 9 ranks), so the latency path allocates nothing.
        let s: SmallVec<[SendOp<'a>; 8]> = sends
            .into_iter()
            .filter(|(_, b)| !b.is_empty())
            .map(|(peer, buf)| SendOp { peer, buf })
            .collect();
        let mut r: SmallVec<[RecvOp<'a>; 8]> = recvs
            .into_iter()
            .filter(|(_, b)| !b.is_empty())
            .map(|(peer, buf)| RecvOp { peer, buf })
            .collect();
        if s.is_empty() && r.is_empty() {
            return Ok(());
        }
        self.t.exchange(&s, &mut r)
    }

    /// One reduction step: sends `data[send.1]` to rank `send.0` while receiving the same
    /// op's partial result for `data[recv.1]` from rank `recv.0` into `tmp`, and adds it in.
    /// Where the transport asks for it ([`crate::transport::Transport::reduce_segment`]) each
    /// message goes in segments, received and added one at a time. A message's segments
    /// depend on its length alone, so both ends cut it alike whatever else they move.
    ///
    /// Out of place ([`Own`]), this rank's share of the received range is still only in the
    /// input: the partner's partial result lands straight in `data` and the input is added
    /// to it, and where the sent range is not in `data` yet either, it goes from the input.
    #[allow(clippy::too_many_arguments)]
    fn send_and_combine<T: Element>(
        &mut self,
        own: Option<Own<T>>,
        data: &mut [T],
        send: (usize, Range<usize>),
        recv: (usize, Range<usize>),
        tmp: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let seg = self
            .t
            .reduce_segment()
            .map_or(usize::MAX, |b| (b / std::mem::size_of::<T>()).max(1));
        let (to, send) = send;
        let (from, recv) = recv;
        let (ms, mr) = (send.len().div_ceil(seg), recv.len().div_ceil(seg));
        for j in 0..ms.max(mr).max(1) {
            let part = |r: &Range<usize>, m: usize| {
                if j < m {
                    let p = piece(r.len(), m, j);
                    r.start + p.start..r.start + p.end
                } else {
                    r.start..r.start
                }
            };
            let (sj, rj) = (part(&send, ms), part(&recv, mr));
            match own {
                None => {
                    let t = &mut tmp[..rj.len()];
                    self.post([(to, as_bytes(&data[sj]))], [(from, as_bytes_mut(t))])?;
                    T::combine(&mut data[rj], t, op);
                }
                Some(Own { input, send_input }) => {
                    if send_input {
                        let inn = &mut data[rj.clone()];
                        self.post([(to, as_bytes(&input[sj]))], [(from, as_bytes_mut(inn))])?;
                    } else {
                        let (out, inn) = split(data, sj, rj.clone());
                        self.post([(to, as_bytes(out))], [(from, as_bytes_mut(inn))])?;
                    }
                    // The ops commute (see Element::combine): partner's + own is bit for bit
                    // own + partner's, what the in-place op computes.
                    T::combine(&mut data[rj.clone()], &input[rj], op);
                }
            }
        }
        Ok(())
    }

    /// The scratch buffer, at least `count` elements of T: kept between calls so the timed
    /// path does not allocate (and verbs does not register) again.
    pub(super) fn take_scratch<T: Element>(&mut self, count: usize) -> Result<Buffer> {
        let bytes = count * std::mem::size_of::<T>();
        match self.scratch.take() {
            Some(b) if b.len() >= bytes => Ok(b),
            old => {
                drop(old);
                self.t.alloc(bytes.max(4096))
            }
        }
    }

    /// Frees the scratch buffer (a suite done with large collectives gives its memory back).
    pub fn release_scratch(&mut self) {
        self.scratch = None;
    }

    // ---- all-reduce -------------------------------------------------------------------

    /// Elementwise all-reduce of `data` over `group`; returns the algorithm that ran.
    pub fn all_reduce_in<T: Element>(
        &mut self,
        group: Group,
        data: &mut [T],
        op: ReduceOp,
        algo: Algo,
    ) -> Result<Algo> {
        self.all_reduce_with(group, None, data, op, algo)
    }

    /// All-reduce out of place: `data` ends holding `input` reduced over `group`, whatever it
    /// held before. No copy of the input comes first (OpenMPI's ring starts with one): the
    /// first step sends straight from `input`, and each partial result received lands in
    /// `data` with this rank's input added to it (see [`Comm::all_gather_from`] for why the
    /// sends come from the input).
    pub fn all_reduce_from<T: Element>(
        &mut self,
        group: Group,
        input: &[T],
        data: &mut [T],
        op: ReduceOp,
        algo: Algo,
    ) -> Result<Algo> {
        same_length("all-reduce", input, data)?;
        self.all_reduce_with(group, Some(input), data, op, algo)
    }

    /// `input`, where given, holds this rank's values and `data` is not filled yet (see
    /// [`Comm::all_reduce_from`]).
    fn all_reduce_with<T: Element>(
        &mut self,
        group: Group,
        input: Option<&[T]>,
        data: &mut [T],
        op: ReduceOp,
        algo: Algo,
    ) -> Result<Algo> {
        let order = self.cabled_order(CollOp::AllReduce);
        let group = in_order(&order, group);
        let n = group.len(self.size());
        if n < 2 || data.is_empty() {
            if let Some(input) = input {
                data.copy_from_slice(input);
            }
            return Ok(self.resolve(CollOp::AllReduce, algo, std::mem::size_of_val(data), n));
        }
        let algo = self.plan(
            CollOp::AllReduce,
            algo,
            std::mem::size_of_val(data),
            group,
            0,
        )?;
        if n < 2 || data.is_empty() {
            if let Some(input) = input {
                data.copy_from_slice(input);
            }
            return Ok(algo);
        }
        match algo {
            Algo::Ring if self.ring_both_ways && n >= 3 && data.len() >= 2 * n => {
                self.all_reduce_ring_both_ways(group, input, data, op)?
            }
            Algo::Ring => self.all_reduce_ring(group, input, data, op)?,
            Algo::Mesh => self.all_reduce_mesh(group, input, data, op)?,
            Algo::Rd => {
                if n >= 4 && std::mem::size_of_val(data) > RD_LONG_BYTES && data.len() >= n {
                    self.all_reduce_halving_doubling(group, input, data, op)?
                } else {
                    self.reduce_all(group, input, data, |a, b| T::combine(a, b, op))?
                }
            }
            Algo::Tree => {
                self.reduce_tree(group, 0, input, data, op)?;
                self.bcast_binomial_in(group, group.rank(0), as_bytes_mut(data))?;
            }
            Algo::Auto => unreachable!("resolved above"),
        }
        Ok(algo)
    }

    /// All-reduce over every rank.
    pub fn all_reduce<T: Element>(
        &mut self,
        data: &mut [T],
        op: ReduceOp,
        algo: Algo,
    ) -> Result<Algo> {
        self.all_reduce_in(Group::All, data, op, algo)
    }

    fn all_reduce_ring<T: Element>(
        &mut self,
        group: Group,
        input: Option<&[T]>,
        data: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let (n, me) = (group.len(self.size()), group.index_of(self.rank())?);
        let count = data.len();
        let (right, left) = (group.rank((me + 1) % n), group.rank((me + n - 1) % n));
        let largest = count.div_ceil(n);
        let mut scratch = self.take_scratch::<T>(largest)?;
        let tmp: &mut [T] = as_elements_mut(&mut scratch[..largest * std::mem::size_of::<T>()]);
        // Reduce-scatter: after step s, piece (me − s − 1) holds s + 2 ranks' sums; at the end
        // this rank holds piece me + 1 whole.
        for s in 0..n - 1 {
            let (send, recv) = (
                piece(count, n, (me + n - s) % n),
                piece(count, n, (me + 2 * n - s - 1) % n),
            );
            // Out of place, every piece received is combined with this rank's input; only the
            // first piece sent is not in `data` yet.
            let own = input.map(|input| Own {
                input,
                send_input: s == 0,
            });
            self.send_and_combine(own, data, (right, send), (left, recv), tmp, op)?;
        }
        // All-gather: pass the whole pieces on round the ring.
        for s in 0..n - 1 {
            let (send, recv) = (
                piece(count, n, (me + 1 + n - s) % n),
                piece(count, n, (me + n - s) % n),
            );
            let (out, inn) = split(data, send, recv);
            self.post([(right, as_bytes(out))], [(left, as_bytes_mut(inn))])?;
        }
        self.scratch = Some(scratch);
        Ok(())
    }

    /// The ring all-reduce both ways round at once: the first half of `data` goes to the
    /// right as [`Comm::all_reduce_ring`] sends it, the second half to the left as a ring in
    /// the opposite order would, each step one exchange of both halves' pieces. Every rank
    /// ends with the same bits (each piece is summed once, on one rank, and passed on).
    fn all_reduce_ring_both_ways<T: Element>(
        &mut self,
        group: Group,
        input: Option<&[T]>,
        data: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        if let Some(input) = input {
            data.copy_from_slice(input);
        }
        let (n, me) = (group.len(self.size()), group.index_of(self.rank())?);
        let (right, left) = (group.rank((me + 1) % n), group.rank((me + n - 1) % n));
        // The second half's ring runs the other way: this rank is at (n − me) mod n in it.
        let back = (n - me) % n;
        let half = data.len() / 2;
        let (a, b) = data.split_at_mut(half);
        let (ca, cb) = (a.len(), b.len());
        let largest = ca.div_ceil(n).max(cb.div_ceil(n));
        let mut scratch = self.take_scratch::<T>(2 * largest)?;
        let tmp: &mut [T] = as_elements_mut(&mut scratch[..2 * largest * std::mem::size_of::<T>()]);
        let (ta, tb) = tmp.split_at_mut(largest);
        for s in 0..n - 1 {
            let (sa, ra) = (
                piece(ca, n, (me + n - s) % n),
                piece(ca, n, (me + 2 * n - s - 1) % n),
            );
            let (sb, rb) = (
                piece(cb, n, (back + n - s) % n),
                piece(cb, n, (back + 2 * n - s - 1) % n),
            );
            let (ta, tb) = (&mut ta[..ra.len()], &mut tb[..rb.len()]);
            self.post(
                [(right, as_bytes(&a[sa])), (left, as_bytes(&b[sb]))],
                [(left, as_bytes_mut(ta)), (right, as_bytes_mut(tb))],
            )?;
            T::combine(&mut a[ra], ta, op);
            T::combine(&mut b[rb], tb, op);
        }
        for s in 0..n - 1 {
            let (sa, ra) = (
                piece(ca, n, (me + 1 + n - s) % n),
                piece(ca, n, (me + n - s) % n),
            );
            let (sb, rb) = (
                piece(cb, n, (back + 1 + n - s) % n),
                piece(cb, n, (back + n - s) % n),
            );
            let (outa, inna) = split(a, sa, ra);
            let (outb, innb) = split(b, sb, rb);
            self.post(
                [(right, as_bytes(outa)), (left, as_bytes(outb))],
                [(left, as_bytes_mut(inna)), (right, as_bytes_mut(innb))],
            )?;
        }
        self.scratch = Some(scratch);
        Ok(())
    }

    fn all_reduce_mesh<T: Element>(
        &mut self,
        group: Group,
        input: Option<&[T]>,
        data: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let (n, count) = (group.len(self.size()), data.len());
        self.reduce_scatter_direct(group, input, data, op, |i| piece(count, n, i))?;
        // Everyone sends its reduced piece to everyone at once.
        self.all_gather_direct(group, None, data, |i| piece(count, n, i))
    }

    /// Every member sends its own piece of `data` (`bounds(me)`) to every other at once and
    /// receives theirs into their pieces: the second half of a mesh all-reduce, and the mesh
    /// all-gather.
    ///
    /// `input`, where given, is the member's own piece: sent from there and copied into its
    /// place afterwards (see [`Comm::all_gather_from`]).
    fn all_gather_direct<T: Element>(
        &mut self,
        group: Group,
        input: Option<&[T]>,
        data: &mut [T],
        bounds: impl Fn(usize) -> Range<usize>,
    ) -> Result<()> {
        let (n, me) = (group.len(self.size()), group.index_of(self.rank())?);
        let mut parts = split_parts(data, n, &bounds);
        let (before, rest) = parts.split_at_mut(me);
        let (own, after) = rest.split_first_mut().expect("own piece");
        let own: &[T] = input.unwrap_or(own);
        let sends = (0..n)
            .filter(|&i| i != me)
            .map(|i| (group.rank(i), as_bytes(own)));
        let recvs = before
            .iter_mut()
            .enumerate()
            .map(|(i, p)| (group.rank(i), as_bytes_mut(p)))
            .chain(
                after
                    .iter_mut()
                    .enumerate()
                    .map(|(i, p)| (group.rank(me + 1 + i), as_bytes_mut(p))),
            );
        self.post(sends, recvs)?;
        if let Some(input) = input {
            data[bounds(me)].copy_from_slice(input);
        }
        Ok(())
    }

    /// Every member sends piece i of `data` (of `input`, where given) to member i, all at
    /// once, and sums the pieces it gets into its own (in member order, so the sum is the
    /// same on every run).
    fn reduce_scatter_direct<T: Element>(
        &mut self,
        group: Group,
        input: Option<&[T]>,
        data: &mut [T],
        op: ReduceOp,
        bounds: impl Fn(usize) -> Range<usize>,
    ) -> Result<()> {
        let (n, me) = (group.len(self.size()), group.index_of(self.rank())?);
        let mine = bounds(me);
        let m = mine.len();
        let mut scratch = self.take_scratch::<T>(m * (n - 1))?;
        let tmp: &mut [T] = as_elements_mut(&mut scratch[..m * (n - 1) * std::mem::size_of::<T>()]);
        let others = || (0..n).filter(|&i| i != me);
        // Out of place, the first piece received lands in this rank's own piece and the
        // input's share is added to it (see send_and_combine); in place, all go to `tmp`.
        let own = input.filter(|_| m > 0).map(|input| &input[mine.clone()]);
        {
            let (src, own_piece): (&[T], Option<&mut [T]>) = match input {
                Some(input) => (input, own.map(|_| &mut data[mine.clone()])),
                None => (data, None),
            };
            let sends = others().map(|i| (group.rank(i), as_bytes(&src[bounds(i)])));
            let mut from = others();
            let first = own_piece.and_then(|p| from.next().map(|i| (group.rank(i), p)));
            let rest = tmp
                .chunks_mut(m.max(1))
                .zip(from)
                .map(|(slot, i)| (group.rank(i), slot));
            let recvs = first.into_iter().chain(rest);
            self.post(sends, recvs.map(|(r, b)| (r, as_bytes_mut(b))))?;
        }
        add_received(&mut data[mine], own, tmp, n - 1, op);
        self.scratch = Some(scratch);
        Ok(())
    }

    /// Rabenseifner: recursive halving leaves each of the largest power-of-two members with
    /// one piece summed over all, recursive doubling gathers the pieces back. Members past the
    /// power of two fold into a partner first and get the result from it at the end.
    fn all_reduce_halving_doubling<T: Element>(
        &mut self,
        group: Group,
        input: Option<&[T]>,
        data: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let (n, me) = (group.len(self.size()), group.index_of(self.rank())?);
        let p2 = 1usize << (usize::BITS - 1 - n.leading_zeros());
        let count = data.len();
        if me >= p2 {
            let partner = group.rank(me - p2);
            self.t.send(partner, as_bytes(input.unwrap_or(data)))?;
            return self.t.recv(partner, as_bytes_mut(data));
        }
        let mut scratch = self.take_scratch::<T>(count)?;
        let tmp: &mut [T] = as_elements_mut(&mut scratch[..std::mem::size_of_val(data)]);
        // Out of place, the folded partner's share lands in `data` and the input is added to
        // it (see send_and_combine); from there on `data` holds this rank's values.
        let mut input = input;
        if me + p2 < n {
            let (from, own) = (group.rank(me + p2), input.take());
            self.combine_from(None, from, own, data, tmp, |a, b| T::combine(a, b, op))?;
        }
        let blocks =
            |r: Range<usize>| piece(count, p2, r.start).start..piece(count, p2, r.end - 1).end;
        self.halve(group, me, p2, input, data, tmp, op, &blocks)?;
        self.double(group, me, p2, None, data, &blocks)?;
        if me + p2 < n {
            self.t.send(group.rank(me + p2), as_bytes(data))?;
        }
        self.scratch = Some(scratch);
        Ok(())
    }

    /// Recursive halving among members 0..p2 (p2 a power of two): each step keeps half of the
    /// blocks still held, sends the other half to the partner across one bit and adds the
    /// partner's copy of the kept half. Member i ends holding block i summed over all.
    /// `input`, where given, holds this rank's values and `data` nothing yet: the first step
    /// sends from it and adds it to what it receives (see send_and_combine).
    #[allow(clippy::too_many_arguments)]
    fn halve<T: Element>(
        &mut self,
        group: Group,
        me: usize,
        p2: usize,
        input: Option<&[T]>,
        data: &mut [T],
        tmp: &mut [T],
        op: ReduceOp,
        blocks: &dyn Fn(Range<usize>) -> Range<usize>,
    ) -> Result<()> {
        let (mut lo, mut hi) = (0, p2);
        let mut mask = p2 / 2;
        while mask >= 1 {
            let partner = group.rank(me ^ mask);
            let mid = (lo + hi) / 2;
            let (keep, give) = if me & mask == 0 {
                (lo..mid, mid..hi)
            } else {
                (mid..hi, lo..mid)
            };
            let (k, g) = (blocks(keep.clone()), blocks(give));
            let own = input.filter(|_| mask == p2 / 2).map(|input| Own {
                input,
                send_input: true,
            });
            self.send_and_combine(own, data, (partner, g), (partner, k), tmp, op)?;
            (lo, hi) = (keep.start, keep.end);
            mask /= 2;
        }
        Ok(())
    }

    /// Recursive doubling among members 0..p2, each starting with block `me`: each step
    /// swaps everything held with the partner across one bit, so the held range doubles.
    /// `input`, where given, is block `me`: the first step sends it from there, then it is
    /// copied into its place (see [`Comm::all_gather_from`]).
    fn double<T: Element>(
        &mut self,
        group: Group,
        me: usize,
        p2: usize,
        input: Option<&[T]>,
        data: &mut [T],
        blocks: &dyn Fn(Range<usize>) -> Range<usize>,
    ) -> Result<()> {
        let (mut lo, mut hi) = (me, me + 1);
        let mut mask = 1;
        while mask < p2 {
            let partner = group.rank(me ^ mask);
            let (plo, phi) = if me & mask == 0 {
                (hi, hi + mask)
            } else {
                (lo - mask, lo)
            };
            let (out, inn) = split(data, blocks(lo..hi), blocks(plo..phi));
            let first = if mask == 1 { input } else { None };
            self.post(
                [(partner, as_bytes(first.unwrap_or(out)))],
                [(partner, as_bytes_mut(inn))],
            )?;
            if let Some(input) = first {
                data[blocks(me..me + 1)].copy_from_slice(input);
            }
            (lo, hi) = (lo.min(plo), hi.max(phi));
            mask *= 2;
        }
        Ok(())
    }

    // ---- reduce-scatter and all-gather -------------------------------------------------

    /// Reduce-scatter: `data` holds n blocks of `data.len() / n` elements; block `me` ends
    /// summed over every member (the other blocks are left as scratch). nccl-tests' in-place
    /// layout, where the output is the rank's own block of the input.
    pub fn reduce_scatter_in<T: Element>(
        &mut self,
        group: Group,
        data: &mut [T],
        op: ReduceOp,
        algo: Algo,
    ) -> Result<Algo> {
        self.reduce_scatter_with(group, None, data, op, algo)
    }

    /// Reduce-scatter out of place: `input` holds n blocks, and block `me` of `data` ends
    /// holding block `me` reduced over `group` (the other blocks are left as scratch). Like
    /// [`Comm::all_reduce_from`], with no copy of the input first.
    pub fn reduce_scatter_from<T: Element>(
        &mut self,
        group: Group,
        input: &[T],
        data: &mut [T],
        op: ReduceOp,
        algo: Algo,
    ) -> Result<Algo> {
        same_length("reduce-scatter", input, data)?;
        self.reduce_scatter_with(group, Some(input), data, op, algo)
    }

    fn reduce_scatter_with<T: Element>(
        &mut self,
        group: Group,
        input: Option<&[T]>,
        data: &mut [T],
        op: ReduceOp,
        algo: Algo,
    ) -> Result<Algo> {
        let n = group.len(self.size());
        let algo = self.plan(
            CollOp::ReduceScatter,
            algo,
            std::mem::size_of_val(data),
            group,
            0,
        )?;
        check_blocks(data.len(), n)?;
        let (me, block) = (group.index_of(self.rank())?, data.len() / n);
        let bounds = |i: usize| i * block..(i + 1) * block;
        if n < 2 || block == 0 {
            if let Some(input) = input {
                data[bounds(me)].copy_from_slice(&input[bounds(me)]);
            }
            return Ok(algo);
        }
        match algo {
            Algo::Ring => {
                let seat = self.ring_seat(CollOp::ReduceScatter, group, me, n);
                let (at, me_p, right, left) = (|p| seat.at(p), seat.me, seat.right, seat.left);
                let mut scratch = self.take_scratch::<T>(block)?;
                let tmp: &mut [T] =
                    as_elements_mut(&mut scratch[..block * std::mem::size_of::<T>()]);
                // Shifted by one from the all-reduce ring, so this rank ends on its own block.
                for s in 0..n - 1 {
                    let (send, recv) = (
                        bounds(at((me_p + 2 * n - s - 1) % n)),
                        bounds(at((me_p + 2 * n - s - 2) % n)),
                    );
                    let own = input.map(|input| Own {
                        input,
                        send_input: s == 0,
                    });
                    self.send_and_combine(own, data, (right, send), (left, recv), tmp, op)?;
                }
                self.scratch = Some(scratch);
            }
            Algo::Mesh => self.reduce_scatter_direct(group, input, data, op, bounds)?,
            Algo::Rd => {
                let mut scratch = self.take_scratch::<T>(data.len() / 2)?;
                let tmp: &mut [T] =
                    as_elements_mut(&mut scratch[..data.len() / 2 * std::mem::size_of::<T>()]);
                let blocks = |r: Range<usize>| r.start * block..r.end * block;
                self.halve(group, me, n, input, data, tmp, op, &blocks)?;
                self.scratch = Some(scratch);
            }
            other => bail!("reduce-scatter has no {} algorithm", other.name()),
        }
        Ok(algo)
    }

    /// All-gather in place: `data` holds n blocks; this member's block `me` is its input, and
    /// every block ends holding its member's input.
    pub fn all_gather_in<T: Element>(
        &mut self,
        group: Group,
        data: &mut [T],
        algo: Algo,
    ) -> Result<Algo> {
        self.all_gather_with(group, None, data, algo)
    }

    /// All-gather out of place: `input` is this member's block, `data` receives all n blocks
    /// (block i from member i). The first step sends straight from `input`, which no core
    /// has just written, and `input` is copied into its block after it: over shared memory a
    /// peer copies a line out of another core's freshly written cache far more slowly than a
    /// clean one, about twice as slowly at 1 MiB (re-measure: `tbbench coll -t shm --op
    /// all-gather --sizes 1MiB` against a build that copies the block in first).
    pub fn all_gather_from<T: Element>(
        &mut self,
        group: Group,
        input: &[T],
        data: &mut [T],
        algo: Algo,
    ) -> Result<Algo> {
        let n = group.len(self.size());
        if input.len() * n != data.len() {
            bail!(
                "all-gather of {} elements per member needs {} output elements, not {}",
                input.len(),
                input.len() * n,
                data.len()
            );
        }
        self.all_gather_with(group, Some(input), data, algo)
    }

    fn all_gather_with<T: Element>(
        &mut self,
        group: Group,
        input: Option<&[T]>,
        data: &mut [T],
        algo: Algo,
    ) -> Result<Algo> {
        let n = group.len(self.size());
        let algo = self.plan(
            CollOp::AllGather,
            algo,
            std::mem::size_of_val(data),
            group,
            0,
        )?;
        check_blocks(data.len(), n)?;
        let (me, block) = (group.index_of(self.rank())?, data.len() / n);
        let bounds = |i: usize| i * block..(i + 1) * block;
        if n < 2 || block == 0 {
            if let Some(input) = input {
                data[bounds(me)].copy_from_slice(input);
            }
            return Ok(algo);
        }
        match algo {
            Algo::Ring => {
                let seat = self.ring_seat(CollOp::AllGather, group, me, n);
                let (at, me_p, right, left) = (|p| seat.at(p), seat.me, seat.right, seat.left);
                for s in 0..n - 1 {
                    let (send, recv) = (
                        bounds(at((me_p + n - s) % n)),
                        bounds(at((me_p + 2 * n - s - 1) % n)),
                    );
                    let (out, inn) = split(data, send, recv);
                    let first = if s == 0 { input } else { None };
                    self.post(
                        [(right, as_bytes(first.unwrap_or(out)))],
                        [(left, as_bytes_mut(inn))],
                    )?;
                    if let Some(input) = first {
                        data[bounds(me)].copy_from_slice(input);
                    }
                }
            }
            Algo::Mesh => self.all_gather_direct(group, input, data, bounds)?,
            Algo::Rd => {
                let blocks = |r: Range<usize>| r.start * block..r.end * block;
                self.double(group, me, n, input, data, &blocks)?;
            }
            other => bail!("all-gather has no {} algorithm", other.name()),
        }
        Ok(algo)
    }

    // ---- broadcast and reduce ----------------------------------------------------------

    /// Runs a rooted collective (broadcast, reduce) with the transport told its messages go
    /// one way ([`Traffic::OneWay`]), and both ways again after, error or not.
    fn one_way<R>(&mut self, f: impl FnOnce(&mut Self) -> Result<R>) -> Result<R> {
        self.t.set_traffic(Traffic::OneWay);
        let result = f(self);
        self.t.set_traffic(Traffic::Both);
        result
    }

    /// Broadcast of `data` from `root` (a world rank in `group`).
    pub fn broadcast_in<T: Element>(
        &mut self,
        group: Group,
        root: usize,
        data: &mut [T],
        algo: Algo,
    ) -> Result<Algo> {
        self.one_way(|c| c.broadcast_with(group, root, data, algo))
    }

    fn broadcast_with<T: Element>(
        &mut self,
        group: Group,
        root: usize,
        data: &mut [T],
        algo: Algo,
    ) -> Result<Algo> {
        let order = self.cabled_order(CollOp::Broadcast);
        let group = in_order(&order, group);
        let n = group.len(self.size());
        let root_at = group.index_of(root)?;
        let algo = self.plan(
            CollOp::Broadcast,
            algo,
            std::mem::size_of_val(data),
            group,
            root_at,
        )?;
        let (me, root_i) = (group.index_of(self.rank())?, group.index_of(root)?);
        if n < 2 || data.is_empty() {
            return Ok(algo);
        }
        let buf = as_bytes_mut(data);
        match algo {
            Algo::Tree => self.bcast_binomial_in(group, root, buf)?,
            Algo::Mesh => {
                if me == root_i {
                    let sends = (0..n)
                        .filter(|&i| i != me)
                        .map(|i| (group.rank(i), &buf[..]));
                    self.post(sends, [])?;
                } else {
                    self.t.recv(root, buf)?;
                }
            }
            Algo::Ring => {
                // A chain root → root+1 → …, in segments: while a member passes segment k on,
                // it already receives segment k + 1.
                let rel = (me + n - root_i) % n;
                let at = |r: usize| group.rank((r + root_i) % n);
                let len = buf.len();
                let seg_len = chain_segment(len, n);
                let segs = len.div_ceil(seg_len);
                let seg = |k: usize| (k * seg_len)..((k + 1) * seg_len).min(len);
                for k in 0..=segs {
                    let send = if rel + 1 < n && k >= 1 {
                        seg(k - 1)
                    } else {
                        0..0
                    };
                    let recv = if rel > 0 && k < segs { seg(k) } else { 0..0 };
                    let (out, inn) = split(buf, send, recv);
                    self.post([(at(rel + 1), out)], [(at(rel + n - 1), inn)])?;
                }
            }
            other => bail!("broadcast has no {} algorithm", other.name()),
        }
        Ok(algo)
    }

    /// Reduce to `root`: its `data` ends holding the result; the others' `data` is left as
    /// scratch (partial sums).
    pub fn reduce_in<T: Element>(
        &mut self,
        group: Group,
        root: usize,
        data: &mut [T],
        op: ReduceOp,
        algo: Algo,
    ) -> Result<Algo> {
        self.one_way(|c| c.reduce_with(group, root, None, data, op, algo))
    }

    /// Reduce out of place: the root's `data` ends holding `input` reduced over `group` (the
    /// others' is left as scratch). Like [`Comm::all_reduce_from`], with no copy of the input
    /// first.
    pub fn reduce_from<T: Element>(
        &mut self,
        group: Group,
        root: usize,
        input: &[T],
        data: &mut [T],
        op: ReduceOp,
        algo: Algo,
    ) -> Result<Algo> {
        same_length("reduce", input, data)?;
        self.one_way(|c| c.reduce_with(group, root, Some(input), data, op, algo))
    }

    fn reduce_with<T: Element>(
        &mut self,
        group: Group,
        root: usize,
        input: Option<&[T]>,
        data: &mut [T],
        op: ReduceOp,
        algo: Algo,
    ) -> Result<Algo> {
        let order = self.cabled_order(CollOp::Reduce);
        let group = in_order(&order, group);
        let n = group.len(self.size());
        let root_at = group.index_of(root)?;
        let algo = self.plan(
            CollOp::Reduce,
            algo,
            std::mem::size_of_val(data),
            group,
            root_at,
        )?;
        let (me, root_i) = (group.index_of(self.rank())?, group.index_of(root)?);
        if n < 2 || data.is_empty() {
            if let Some(input) = input {
                data.copy_from_slice(input);
            }
            return Ok(algo);
        }
        let count = data.len();
        let rel = (me + n - root_i) % n;
        let at = |r: usize| group.rank((r % n + root_i) % n);
        match algo {
            Algo::Tree => self.reduce_tree(group, root_i, input, data, op)?,
            Algo::Mesh => {
                // Everyone sends to the root at once, in segments that bound its scratch.
                let seg = (MESH_REDUCE_SEGMENT_BYTES / std::mem::size_of::<T>()).max(1);
                let mut scratch = if rel == 0 {
                    Some(self.take_scratch::<T>(seg.min(count) * (n - 1))?)
                } else {
                    None
                };
                for start in (0..count).step_by(seg) {
                    let r = start..(start + seg).min(count);
                    if let Some(s) = scratch.as_mut() {
                        let m = r.len();
                        let tmp: &mut [T] =
                            as_elements_mut(&mut s[..m * (n - 1) * std::mem::size_of::<T>()]);
                        // Out of place, the first member's segment lands in `data` and the
                        // input is added to it (see send_and_combine).
                        let own = input.map(|input| &input[r.clone()]);
                        let mut from = 1..n;
                        let first = own
                            .and_then(|_| from.next())
                            .map(|i| (at(i), &mut data[r.clone()]));
                        let rest = tmp.chunks_mut(m).zip(from).map(|(t, i)| (at(i), t));
                        let recvs = first.into_iter().chain(rest);
                        self.post([], recvs.map(|(f, b)| (f, as_bytes_mut(b))))?;
                        add_received(&mut data[r], own, tmp, n - 1, op);
                    } else {
                        self.post([(root, as_bytes(&input.unwrap_or(data)[r]))], [])?;
                    }
                }
                if let Some(s) = scratch {
                    self.scratch = Some(s);
                }
            }
            Algo::Ring => {
                // A chain from root−1 down to the root, each member adding its own in, in
                // segments: while it sends segment k − 1 on it receives segment k.
                // Fixed 256 KiB segments even on 2 members: each is added in while it is still
                // in cache (one 1 MiB segment measured 1.5x slower on 2 ranks).
                let seg_len = (CHAIN_SEGMENT_BYTES / std::mem::size_of::<T>()).max(1);
                let segs = count.div_ceil(seg_len);
                let seg = |k: usize| (k * seg_len)..((k + 1) * seg_len).min(count);
                // Upstream is rel + 1 (the chain's far end is rel n − 1), downstream rel − 1.
                let mut scratch = self.take_scratch::<T>(seg_len.min(count))?;
                let tmp: &mut [T] =
                    as_elements_mut(&mut scratch[..seg_len.min(count) * std::mem::size_of::<T>()]);
                // Out of place, the chain's far end sends its input, and every other member
                // receives into `data` and adds its input (see send_and_combine).
                let far_end = rel + 1 == n;
                for k in 0..=segs {
                    let send = if rel > 0 && k >= 1 { seg(k - 1) } else { 0..0 };
                    let recv = if rel + 1 < n && k < segs {
                        seg(k)
                    } else {
                        0..0
                    };
                    let (down, up) = (at(rel + n - 1), at(rel + 1));
                    match input {
                        Some(input) if far_end => {
                            self.post([(down, as_bytes(&input[send]))], [])?
                        }
                        Some(input) => {
                            let (out, inn) = split(data, send, recv.clone());
                            self.post([(down, as_bytes(out))], [(up, as_bytes_mut(inn))])?;
                            T::combine(&mut data[recv.clone()], &input[recv], op);
                        }
                        None => {
                            let t = &mut tmp[..recv.len()];
                            self.post([(down, as_bytes(&data[send]))], [(up, as_bytes_mut(t))])?;
                            if !recv.is_empty() {
                                T::combine(&mut data[recv], t, op);
                            }
                        }
                    }
                }
                self.scratch = Some(scratch);
            }
            other => bail!("reduce has no {} algorithm", other.name()),
        }
        Ok(algo)
    }

    /// Binomial-tree reduce to member `root_i`: the mirror of the binomial broadcast.
    /// `input`, where given, holds this rank's values and `data` nothing yet: a leaf sends
    /// it, and the first child's partial result lands in `data` and has it added (see
    /// send_and_combine).
    fn reduce_tree<T: Element>(
        &mut self,
        group: Group,
        root_i: usize,
        input: Option<&[T]>,
        data: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let (n, me) = (group.len(self.size()), group.index_of(self.rank())?);
        let rel = (me + n - root_i) % n;
        let at = |r: usize| group.rank((r + root_i) % n);
        let mut scratch = self.take_scratch::<T>(data.len())?;
        let tmp: &mut [T] = as_elements_mut(&mut scratch[..std::mem::size_of_val(data)]);
        let mut input = input;
        let mut mask = 1;
        while mask < n {
            if rel & mask != 0 {
                self.t
                    .send(at(rel - mask), as_bytes(input.unwrap_or(data)))?;
                break;
            }
            if rel + mask < n {
                let (from, own) = (at(rel + mask), input.take());
                self.combine_from(None, from, own, data, tmp, |a, b| T::combine(a, b, op))?;
            }
            mask <<= 1;
        }
        self.scratch = Some(scratch);
        Ok(())
    }

    // ---- all-to-all --------------------------------------------------------------------

    /// All-to-all: block j of `send` goes to member j, and block j of `recv` comes from it.
    pub fn all_to_all_in<T: Element>(
        &mut self,
        group: Group,
        send: &[T],
        recv: &mut [T],
        algo: Algo,
    ) -> Result<Algo> {
        let n = group.len(self.size());
        let algo = self.plan(
            CollOp::AllToAll,
            algo,
            std::mem::size_of_val(send),
            group,
            0,
        )?;
        check_blocks(send.len(), n)?;
        anyhow::ensure!(
            send.len() == recv.len(),
            "all-to-all: {} elements to send, {} to receive",
            send.len(),
            recv.len()
        );
        let (me, block) = (group.index_of(self.rank())?, send.len() / n);
        let bounds = |i: usize| i * block..(i + 1) * block;
        recv[bounds(me)].copy_from_slice(&send[bounds(me)]);
        if n < 2 || block == 0 {
            return Ok(algo);
        }
        match algo {
            Algo::Mesh => {
                let sends = (0..n)
                    .filter(|&i| i != me)
                    .map(|i| (group.rank(i), as_bytes(&send[bounds(i)])));
                let recvs = split_parts(recv, n, bounds)
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| *i != me)
                    .map(|(i, p)| (group.rank(i), as_bytes_mut(p)));
                self.post(sends, recvs)?;
            }
            Algo::Ring => {
                // Pairwise exchange: at step s, send to the member s ahead, receive from the
                // member s behind, so every rank sends and receives one block per step.
                for s in 1..n {
                    let (to, from) = ((me + s) % n, (me + n - s) % n);
                    self.post(
                        [(group.rank(to), as_bytes(&send[bounds(to)]))],
                        [(group.rank(from), as_bytes_mut(&mut recv[bounds(from)]))],
                    )?;
                }
            }
            other => bail!("all-to-all has no {} algorithm", other.name()),
        }
        Ok(algo)
    }

    // ---- ping-pong ---------------------------------------------------------------------

    /// Ping-pong: members 2k and 2k+1 (over every rank, in the cables' ring order where there
    /// is one, so each pair is on a cable) move a message there and back: 2k sends `input`
    /// (`data` where None) and receives the echo into `data`; 2k+1 receives into `data` and
    /// sends it back. A last member of an odd count keeps its input.
    pub fn ping_pong_in<T: Element>(
        &mut self,
        group: Group,
        input: Option<&[T]>,
        data: &mut [T],
        algo: Algo,
    ) -> Result<Algo> {
        let order = match group {
            Group::All => self.cabled_order(CollOp::PingPong),
            _ => None,
        };
        let group = match &order {
            Some(o) => Group::Members(o),
            None => group,
        };
        let n = group.len(self.size());
        let algo = self.plan(
            CollOp::PingPong,
            algo,
            std::mem::size_of_val(data),
            group,
            0,
        )?;
        let me = group.index_of(self.rank())?;
        if me + 1 == n && n % 2 == 1 {
            if let Some(input) = input {
                data.copy_from_slice(input);
            }
            return Ok(algo);
        }
        let partner = group.rank(me ^ 1);
        if me % 2 == 0 {
            self.t.send(partner, as_bytes(input.unwrap_or(data)))?;
            self.t.recv(partner, as_bytes_mut(data))?;
        } else {
            self.t.recv(partner, as_bytes_mut(data))?;
            self.t.send(partner, as_bytes(data))?;
        }
        Ok(algo)
    }
}

/// Adds into `piece` what a gather of `count` partial results left: where `own` is given
/// (an out-of-place op's share of the piece), the first landed in `piece` itself and `own`
/// is added to it, and the rest lie in `tmp`, one piece-length slot each, added in order.
fn add_received<T: Element>(
    piece: &mut [T],
    own: Option<&[T]>,
    tmp: &[T],
    count: usize,
    op: ReduceOp,
) {
    if piece.is_empty() {
        return;
    }
    if let Some(own) = own {
        T::combine(piece, own, op);
    }
    let in_tmp = count - own.is_some() as usize;
    for slot in tmp.chunks(piece.len()).take(in_tmp) {
        T::combine(piece, slot, op);
    }
}

fn same_length<T>(op: &str, input: &[T], data: &[T]) -> Result<()> {
    if input.len() != data.len() {
        bail!(
            "{op} out of place needs input and output of one length, not {} and {}",
            input.len(),
            data.len()
        );
    }
    Ok(())
}

/// An out-of-place reduction step's view of this rank's input (see `send_and_combine`):
/// `data` does not hold the input's share of the range received, and, with `send_input`, of
/// the range sent either.
#[derive(Clone, Copy)]
struct Own<'a, T> {
    input: &'a [T],
    send_input: bool,
}

/// Reduce-scatter, all-gather and all-to-all move n equal blocks.
fn check_blocks(len: usize, n: usize) -> Result<()> {
    if !len.is_multiple_of(n) {
        bail!("{len} elements do not split into {n} equal blocks");
    }
    Ok(())
}
