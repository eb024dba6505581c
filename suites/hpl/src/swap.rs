//! A factored panel's row interchanges over the trailing columns, as HPL.dat's SWAP chooses
//! (HPL's src/pgesv/HPL_pdlaswp*).
//!
//! The panel's `jb` pivots, applied in order, amount to one permutation that touches at most
//! 2·jb rows: the panel's own rows (all on the current process row, the one owning the
//! panel's first row) and the rows its pivots came from. Each moved row goes from its owner
//! straight to where it ends, so the rows that make U for this panel reach the current process
//! row and the rows they replace go back to the rows the pivots came from, in a few messages
//! per panel instead of one exchange per pivot:
//!
//! - binary exchange (SWAP 0): log2(P) rounds of pairwise exchanges between process rows
//!   whose distance from the current row differs in one bit (rows beyond the largest power of
//!   two first hand theirs to a partner inside it, and get theirs back at the end, as HPL
//!   folds). Each round every moved row goes one bit nearer its destination. HPL's own
//!   binary exchange (HPL_pdlaswp00N) also spreads all of U to every process row during those
//!   rounds; here U goes down the column after its triangular solve, as before.
//! - long (SWAP 1): one gather of U's rows on the current process row and one scatter of the
//!   rows they replace, each posted at once (P − 1 messages in, P − 1 out). HPL's long
//!   variant (spread-and-roll, HPL_pdlaswp01N) moves the same rows in log2(P) + P − 1 steps
//!   and leaves U on every process row; here, again, U is sent down after its solve.
//! - mix (SWAP 2): binary exchange when the columns to swap are at most the threshold, long
//!   above it.
//!
//! With one process row every row is local and the pivots are applied column by column
//! (LAPACK's dlaswp where the BLAS carries it), whatever SWAP says.

use crate::grid::{global_to_local, owner};
use crate::input::Swap;
use crate::kernels;
use crate::matrix::LocalMatrix;
use anyhow::Result;
use std::collections::HashMap;
use std::ops::Range;
use tbbench_runners::comm::{f64_bytes, f64_bytes_mut, Comm, Group};

/// The row that starts in global row `from` ends in global row `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Move {
    pub from: usize,
    pub to: usize,
}

/// The rows that move when pivots `ipiv` (row `j0 + k` swapped with row `ipiv[k]`, k in
/// order) are applied: the panel's rows first in order, then the rows the pivots came from in
/// the order they were first touched. Every rank computes the same list.
pub(crate) fn moves(j0: usize, ipiv: &[u64]) -> Vec<Move> {
    // (position, the original row now there) for every position touched.
    let mut at: Vec<(usize, usize)> = (j0..j0 + ipiv.len()).map(|g| (g, g)).collect();
    let mut index: HashMap<usize, usize> = HashMap::new();
    for (k, &g) in ipiv.iter().enumerate() {
        let (a, g) = (j0 + k, g as usize);
        if a == g {
            continue;
        }
        let ig = if (j0..j0 + ipiv.len()).contains(&g) {
            g - j0
        } else {
            *index.entry(g).or_insert_with(|| {
                at.push((g, g));
                at.len() - 1
            })
        };
        let held = at[k].1;
        at[k].1 = at[ig].1;
        at[ig].1 = held;
    }
    at.into_iter()
        .filter(|(to, from)| to != from)
        .map(|(to, from)| Move { from, to })
        .collect()
}

/// With one process row, where every row is here: the pivots (`ipiv`, for rows from `j0`)
/// applied to the first `width` columns of `a` (leading dimension `lda`, `mp` rows) one
/// column at a time, as LAPACK's dlaswp does, so each column stays in cache instead of
/// striding across rows.
pub(crate) fn local(a: &mut [f64], lda: usize, mp: usize, width: usize, j0: usize, ipiv: &[u64]) {
    if width == 0 || kernels::laswp(width, a, lda, j0, ipiv) {
        return;
    }
    for c in 0..width {
        let col = &mut a[c * lda..c * lda + mp];
        for (jj, &g) in ipiv.iter().enumerate() {
            col.swap(j0 + jj, g as usize);
        }
    }
}

/// Applies the panel's pivots (`ipiv`, for rows from `j0`) to local columns `cols` of every
/// rank in this process column (`column`, indexed by process row), with `swap`'s algorithm.
pub(crate) fn apply_pivots(
    m: &mut LocalMatrix,
    comm: &mut Comm,
    column: &[usize],
    j0: usize,
    ipiv: &[u64],
    cols: Range<usize>,
    swap: Swap,
) -> Result<()> {
    if cols.is_empty() {
        return Ok(());
    }
    if m.grid.p == 1 {
        let (lda, mp) = (m.lda, m.mp);
        local(&mut m.a[cols.start * lda..], lda, mp, cols.len(), j0, ipiv);
        return Ok(());
    }
    let moved = moves(j0, ipiv);
    let long = match swap {
        Swap::BinaryExchange => false,
        Swap::Long => true,
        Swap::Mix { threshold } => cols.len() > threshold,
    };
    let mut rows = Rows::new(m, &moved, cols);
    if long {
        rows.long(comm, column, owner(j0, m.nb, m.grid.p))?;
    } else {
        rows.binary_exchange(comm, column, owner(j0, m.nb, m.grid.p))?;
    }
    rows.write(m);
    Ok(())
}

/// The moved rows this rank holds while they travel, each `width` values of `cols`, with the
/// process row each starts on and ends on.
struct Rows<'a> {
    moved: &'a [Move],
    src: Vec<usize>,
    dst: Vec<usize>,
    held: Vec<Option<Vec<f64>>>,
    cols: Range<usize>,
    myrow: usize,
    p: usize,
    nb: usize,
}

impl<'a> Rows<'a> {
    /// Reads every moved row this rank owns before any is overwritten (the moves may form
    /// cycles within one rank).
    fn new(m: &LocalMatrix, moved: &'a [Move], cols: Range<usize>) -> Rows<'a> {
        let (p, nb) = (m.grid.p, m.nb);
        let src: Vec<usize> = moved.iter().map(|mv| owner(mv.from, nb, p)).collect();
        let dst: Vec<usize> = moved.iter().map(|mv| owner(mv.to, nb, p)).collect();
        let held = moved
            .iter()
            .zip(&src)
            .map(|(mv, &s)| {
                (s == m.myrow).then(|| m.row_segment(global_to_local(mv.from, nb, p), cols.clone()))
            })
            .collect();
        Rows {
            moved,
            src,
            dst,
            held,
            cols,
            myrow: m.myrow,
            p,
            nb,
        }
    }

    /// Writes the rows that end here.
    fn write(self, m: &mut LocalMatrix) {
        for (i, mv) in self.moved.iter().enumerate() {
            if self.dst[i] == self.myrow {
                let row = self.held[i]
                    .as_ref()
                    .expect("a row that ends here has arrived");
                m.set_row_segment(
                    global_to_local(mv.to, self.nb, self.p),
                    self.cols.clone(),
                    row,
                );
            }
        }
    }

    /// The rows `which` selects (by move index), packed in move order.
    fn pack(&self, which: impl Fn(usize) -> bool) -> Vec<f64> {
        let mut out = Vec::new();
        for i in (0..self.moved.len()).filter(|i| which(*i)) {
            out.extend_from_slice(self.held[i].as_ref().expect("a row to send is held"));
        }
        out
    }

    /// Stores what `pack` packed on the other side with the same selection.
    fn unpack(&mut self, which: impl Fn(usize) -> bool, data: &[f64]) {
        let w = self.cols.len();
        let mut chunks = data.chunks(w);
        for i in 0..self.moved.len() {
            if which(i) {
                self.held[i] = chunks.next().map(|c| c.to_vec());
            }
        }
    }

    fn count(&self, which: impl Fn(usize) -> bool) -> usize {
        (0..self.moved.len()).filter(|i| which(*i)).count() * self.cols.len()
    }

    /// SWAP 1: one gather on the current process row `pr`, one scatter from it. Every moved
    /// row starts or ends on `pr` (a row that leaves another process row goes into the panel;
    /// a row that arrives there comes out of it).
    fn long(&mut self, comm: &mut Comm, column: &[usize], pr: usize) -> Result<()> {
        let (p, me) = (self.p, self.myrow);
        let root = column[pr];
        let g = Group::Members(column);
        let (src_v, dst_v) = (self.src.clone(), self.dst.clone());
        let (src, dst) = (&src_v, &dst_v);
        // In: the rows row r sends to pr.
        let into = |r: usize| move |i: usize| src[i] == r && dst[i] == pr && r != pr;
        let mine = if me == pr {
            Vec::new()
        } else {
            self.pack(into(me))
        };
        let mut parts: Vec<Vec<f64>> = (0..p)
            .map(|r| {
                if me == pr {
                    vec![0.0; self.count(into(r))]
                } else {
                    Vec::new()
                }
            })
            .collect();
        {
            let mut views: Vec<&mut [u8]> = parts.iter_mut().map(|v| f64_bytes_mut(v)).collect();
            comm.gatherv_in(g, root, f64_bytes(&mine), &mut views)?;
        }
        if me == pr {
            for (r, part) in parts.iter().enumerate() {
                self.unpack(into(r), part);
            }
        }
        // Out: the rows pr sends to row r.
        let out = |r: usize| move |i: usize| src[i] == pr && dst[i] == r && r != pr;
        let parts: Vec<Vec<f64>> = (0..p)
            .map(|r| {
                if me == pr {
                    self.pack(out(r))
                } else {
                    Vec::new()
                }
            })
            .collect();
        let mut got = vec![0.0; if me == pr { 0 } else { self.count(out(me)) }];
        let views: Vec<&[u8]> = parts.iter().map(|v| f64_bytes(v)).collect();
        comm.scatterv_in(g, root, &views, f64_bytes_mut(&mut got))?;
        if me != pr {
            self.unpack(out(me), &got);
        }
        Ok(())
    }

    /// SWAP 0: rounds of pairwise exchanges over a hypercube of process rows, numbered by
    /// their distance from `pr`.
    fn binary_exchange(&mut self, comm: &mut Comm, column: &[usize], pr: usize) -> Result<()> {
        let p = self.p;
        let dist = |row: usize| (row + p - pr) % p;
        let row_at = |d: usize| (d + pr) % p;
        let ip2 = 1usize << (usize::BITS - 1 - p.leading_zeros());
        let fold = |d: usize| if d >= ip2 { d - ip2 } else { d };
        let me = dist(self.myrow);
        let n = self.moved.len();
        // Only rows changing process row travel.
        let travels: Vec<bool> = (0..n).map(|i| self.src[i] != self.dst[i]).collect();
        let s: Vec<usize> = self.src.iter().map(|&r| dist(r)).collect();
        let d: Vec<usize> = self.dst.iter().map(|&r| dist(r)).collect();
        // Fold: rows beyond the power of two hand theirs to their partner inside it.
        if me >= ip2 {
            let out = self.pack(|i| travels[i] && s[i] == me);
            if !out.is_empty() {
                comm.send(column[row_at(me - ip2)], f64_bytes(&out))?;
            }
        } else if me + ip2 < p {
            let from = me + ip2;
            let which = |i: usize| travels[i] && s[i] == from;
            let mut got = vec![0.0; self.count(which)];
            if !got.is_empty() {
                comm.recv(column[row_at(from)], f64_bytes_mut(&mut got))?;
            }
            self.unpack(which, &got);
        }
        // Round k: rows whose destination differs from their holder in bit k cross over.
        if me < ip2 {
            let mut bit = 1;
            while bit < ip2 {
                let low = bit - 1;
                let place = |i: usize, mask: usize| (fold(d[i]) & mask) | (fold(s[i]) & !mask);
                let partner = me ^ bit;
                let send =
                    |i: usize| travels[i] && place(i, low) == me && place(i, low | bit) == partner;
                let recv =
                    |i: usize| travels[i] && place(i, low) == partner && place(i, low | bit) == me;
                let out = self.pack(send);
                let mut got = vec![0.0; self.count(recv)];
                let peer = column[row_at(partner)];
                match (out.is_empty(), got.is_empty()) {
                    (true, true) => {}
                    (false, true) => comm.send(peer, f64_bytes(&out))?,
                    (true, false) => comm.recv(peer, f64_bytes_mut(&mut got))?,
                    (false, false) => {
                        comm.sendrecv(peer, f64_bytes(&out), peer, f64_bytes_mut(&mut got))?
                    }
                }
                for i in 0..n {
                    if send(i) {
                        self.held[i] = None;
                    }
                }
                self.unpack(recv, &got);
                bit <<= 1;
            }
        }
        // Unfold: rows for process rows beyond the power of two go on from their partner.
        if me >= ip2 {
            let which = |i: usize| travels[i] && d[i] == me;
            let mut got = vec![0.0; self.count(which)];
            if !got.is_empty() {
                comm.recv(column[row_at(me - ip2)], f64_bytes_mut(&mut got))?;
            }
            self.unpack(which, &got);
        } else if me + ip2 < p {
            let to = me + ip2;
            let out = self.pack(|i| travels[i] && d[i] == to);
            if !out.is_empty() {
                comm.send(column[row_at(to)], f64_bytes(&out))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The permutation the moves describe, against applying the pivots one by one.
    fn check(j0: usize, ipiv: &[u64], n: usize) {
        let mut want: Vec<usize> = (0..n).collect();
        for (k, &g) in ipiv.iter().enumerate() {
            want.swap(j0 + k, g as usize);
        }
        let mut got: Vec<usize> = (0..n).collect();
        for mv in moves(j0, ipiv) {
            got[mv.to] = mv.from;
        }
        assert_eq!(got, want, "j0 {j0} ipiv {ipiv:?}");
    }

    #[test]
    fn moves_are_the_permutation_the_pivots_make() {
        check(0, &[0, 1, 2], 6);
        check(2, &[5, 3, 9, 5], 12);
        // A row chosen twice, a pivot inside the panel, and a chain through both.
        check(4, &[10, 10, 5, 7], 12);
        check(0, &[3, 3, 3, 3], 8);
        let mv = moves(4, &[10, 10, 5, 7]);
        assert!(mv.len() <= 2 * 4);
        // Every row arriving outside the panel is one of the panel's own rows.
        assert!(mv
            .iter()
            .filter(|m| m.to >= 8)
            .all(|m| (4..8).contains(&m.from)));
    }
}
