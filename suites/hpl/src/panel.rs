//! The panel factorization, as HPL.dat's PFACT and RFACT choose it (HPL's src/pfact).
//!
//! One panel of `jb` columns is factored by the process column that owns it. RFACT is the
//! recursion: the columns are cut into NDIV parts, down to NBMIN columns or fewer, which PFACT
//! factors one column at a time. Both come in HPL's three orders, which differ only in when a
//! column (or part) receives the updates from the columns factored before it:
//!
//! - Right-looking: as soon as a column (part) is factored, every column right of it in the
//!   range is updated (rank-1 update; for a part, TRSM on its U rows and GEMM below).
//! - Left-looking: nothing right of a column is touched until its turn; it then receives all
//!   its pending updates at once: its U entries are solved with the L factored so far (TRSV;
//!   TRSM for a part) and the rows below updated with one matrix-vector (matrix) product.
//! - Crout: like left-looking for the column below its U rows (their U entries being final
//!   already), and once a column (part) is factored its rows of U are finished right away for
//!   every column right of it in the range (one row-times-matrix product on the process row
//!   that holds the panel's rows, then TRSM for a part).
//!
//! All three pick the same pivots and give the same factors up to rounding. The pivot of each
//! column is found with a maxloc over the process column, its row swapped across the whole
//! panel and sent down the column (with the part of it the variant needs), as HPL does.

use crate::grid::owner;
use crate::input::Factorization;
use crate::kernels;
use crate::matrix::Layout;
use anyhow::Result;
use tbbench_runners::comm::{f64_bytes, f64_bytes_mut, Comm, Group};

/// Swaps global rows `j` and `g` over the panel's columns within this process column:
/// locally when one process row owns both, else by exchanging the two segments.
fn swap_rows(
    lay: &Layout,
    cols: &mut PanelColumns,
    comm: &mut Comm,
    j: usize,
    g: usize,
) -> Result<()> {
    if j == g || cols.width == 0 {
        return Ok(());
    }
    let (p, nb) = (lay.grid.p, lay.nb);
    let (oj, og) = (owner(j, nb, p), owner(g, nb, p));
    let lj = lay.rows_before(j);
    let lg = lay.rows_before(g);
    if oj == og {
        if lay.myrow == oj {
            cols.swap_rows(lj, lg);
        }
        return Ok(());
    }
    let (mine, other_row) = if lay.myrow == oj {
        (lj, og)
    } else if lay.myrow == og {
        (lg, oj)
    } else {
        return Ok(());
    };
    let out = cols.row(mine, 0..cols.width);
    let mut back = vec![0.0; out.len()];
    let peer = lay.grid.rank_at(other_row, lay.mycol);
    comm.sendrecv(peer, f64_bytes(&out), peer, f64_bytes_mut(&mut back))?;
    cols.set_row(mine, &back);
    Ok(())
}

/// A panel's columns of this rank's share (column `k` of the slice is the panel's column
/// `k`): the factorization borrows only what it may change.
pub(crate) struct PanelColumns<'a> {
    pub a: &'a mut [f64],
    pub lda: usize,
    pub width: usize,
}

impl<'a> PanelColumns<'a> {
    /// Columns [c0, c0 + width) of `a` (leading dimension `lda`).
    pub fn of(a: &'a mut [f64], lda: usize, c0: usize, width: usize) -> PanelColumns<'a> {
        PanelColumns {
            a: &mut a[c0 * lda..(c0 + width) * lda],
            lda,
            width,
        }
    }

    fn row(&self, row: usize, cols: std::ops::Range<usize>) -> Vec<f64> {
        cols.map(|c| self.a[c * self.lda + row]).collect()
    }

    fn set_row(&mut self, row: usize, values: &[f64]) {
        for (c, v) in values.iter().enumerate() {
            self.a[c * self.lda + row] = *v;
        }
    }

    fn swap_rows(&mut self, r1: usize, r2: usize) {
        for c in 0..self.width {
            self.a.swap(c * self.lda + r1, c * self.lda + r2);
        }
    }
}

/// One panel being factored by its process column. Column and part indices are relative to
/// the panel: panel column `k` is global column `j0 + k`, column `k` of `cols`, and its
/// diagonal entry is in global row `j0 + k` (all the panel's top `jb` rows live on one
/// process row, the one owning global row `j0`).
pub(crate) struct Panel<'a> {
    pub lay: &'a Layout,
    pub cols: PanelColumns<'a>,
    pub comm: &'a mut Comm,
    pub column: &'a [usize],
    pub j0: usize,
    pub jb: usize,
    pub pfact: Factorization,
    pub rfact: Factorization,
    pub nbmin: usize,
    pub ndiv: usize,
    pub ipiv: &'a mut [u64],
    /// Each step as it runs, where a test asks for the schedule.
    pub trace: Option<&'a mut Vec<Step>>,
    /// Set by a right-looking pivot step that updated the next column: that column's largest
    /// magnitude below the pivot row and its local row, found in the same pass (as HPL's
    /// right-looking PFACT does), so the next step need not read the column again. `None` to
    /// start; anything else that touches the panel clears it.
    pub next_max: Option<NextMax>,
}

/// The next column's local maxloc, as `Panel::next_max` keeps it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NextMax {
    /// Panel column.
    column: usize,
    value: f64,
    /// Local row, or `None` where no row qualified.
    row: Option<usize>,
}

/// One step of a panel's schedule (panel-relative columns), for the tests to pin each
/// variant's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// `pivot(jj, upto)`.
    Pivot(usize, usize),
    /// `apply(fs, fw, us, uw, solve)`.
    Apply(usize, usize, usize, usize, bool),
    /// `finish_u_rows(s, o, pw, end)`.
    Finish(usize, usize, usize, usize),
}

impl Panel<'_> {
    pub fn factor(&mut self) -> Result<()> {
        self.recursive(0, self.jb)
    }

    fn log(&mut self, step: Step) {
        if let Some(t) = self.trace.as_mut() {
            t.push(step);
        }
    }

    /// RFACT over columns [s, s + w), which are up to date with every column left of `s`.
    fn recursive(&mut self, s: usize, w: usize) -> Result<()> {
        if w <= self.nbmin.max(1) || self.ndiv < 2 {
            return self.base(s, w);
        }
        let part = w.div_ceil(self.ndiv);
        let end = s + w;
        let mut o = s;
        while o < end {
            let pw = part.min(end - o);
            let rest = end - o - pw;
            match self.rfact {
                Factorization::Right => {
                    self.recursive(o, pw)?;
                    if rest > 0 {
                        self.apply(o, pw, o + pw, rest, true)?;
                    }
                }
                Factorization::Left => {
                    if o > s {
                        self.apply(s, o - s, o, pw, true)?;
                    }
                    self.recursive(o, pw)?;
                }
                Factorization::Crout => {
                    if o > s {
                        self.apply(s, o - s, o, pw, false)?;
                    }
                    self.recursive(o, pw)?;
                    if rest > 0 {
                        self.finish_u_rows(s, o, pw, end);
                    }
                }
            }
            o += pw;
        }
        Ok(())
    }

    /// PFACT over columns [s, s + w) (up to date with every column left of `s`), one column
    /// at a time.
    fn base(&mut self, s: usize, w: usize) -> Result<()> {
        let end = s + w;
        for jj in s..end {
            match self.pfact {
                Factorization::Right => self.pivot(jj, end)?,
                Factorization::Left => {
                    if jj > s {
                        self.apply(s, jj - s, jj, 1, true)?;
                    }
                    self.pivot(jj, jj + 1)?;
                }
                Factorization::Crout => {
                    if jj > s {
                        self.apply(s, jj - s, jj, 1, false)?;
                    }
                    self.pivot(jj, jj + 1)?;
                    if jj + 1 < end {
                        self.finish_u_rows(s, jj, 1, end);
                    }
                }
            }
        }
        Ok(())
    }

    /// Column `jj`'s pivot: maxloc over the process column, the row swapped across the whole
    /// panel, the pivot row over [jj, upto) sent down the column, the column below scaled by
    /// the pivot's reciprocal (not at all for a zero pivot) and, over (jj, upto), the rank-1
    /// update (right-looking passes the end of its range; left-looking and Crout only need
    /// the pivot itself, `upto = jj + 1`).
    fn pivot(&mut self, jj: usize, upto: usize) -> Result<()> {
        self.log(Step::Pivot(jj, upto));
        let lay = self.lay;
        let (nb, p, lda) = (lay.nb, lay.grid.p, lay.lda);
        let j = self.j0 + jj;
        let lr = lay.rows_before(j);
        let (best, row) = match self.next_max.take() {
            Some(m) if m.column == jj => (m.value, m.row),
            _ => {
                let (v, r) = abs_max_loc(&self.cols.a[jj * lda + lr..jj * lda + lay.mp]);
                (v, r.map(|r| lr + r))
            }
        };
        let at = row.map_or(u64::MAX, |r| lay.global_row(r) as u64);
        let (_, g) = self
            .comm
            .allreduce_maxloc_in(Group::Members(self.column), best, at)?;
        // No row qualified anywhere (the column is NaN below the diagonal on every rank): keep
        // row j, and let the NaN reach the residual check, which fails it.
        let g = if g == u64::MAX { j as u64 } else { g };
        self.ipiv[jj] = g;
        swap_rows(lay, &mut self.cols, self.comm, j, g as usize)?;
        let oj = owner(j, nb, p);
        let seg = jj..upto;
        let mut urow = if lay.myrow == oj {
            self.cols.row(lay.rows_before(j), seg.clone())
        } else {
            vec![0.0; seg.len()]
        };
        self.comm.bcast_in(
            Group::Members(self.column),
            lay.grid.rank_at(oj, lay.mycol),
            f64_bytes_mut(&mut urow),
        )?;
        let below = lay.rows_before(j + 1);
        let next = scale_and_update(&mut self.cols.a[jj * lda..], lda, below..lay.mp, &urow);
        self.next_max = next.map(|(value, row)| NextMax {
            column: jj + 1,
            value,
            row,
        });
        Ok(())
    }

    /// Brings columns [us, us + uw) up to date with the factored columns [fs, fs + fw): their
    /// rows [fs, fs + fw) become U (solved with L's unit triangle there when `solve`; Crout
    /// has finished them already), which goes down the process column, and every row below
    /// takes −= L·U. For one column (uw = 1) these are HPL's TRSV and GEMV.
    fn apply(&mut self, fs: usize, fw: usize, us: usize, uw: usize, solve: bool) -> Result<()> {
        self.log(Step::Apply(fs, fw, us, uw, solve));
        self.next_max = None;
        let lay = self.lay;
        let (nb, p, lda) = (lay.nb, lay.grid.p, lay.lda);
        let pr = owner(self.j0, nb, p);
        let top = lay.rows_before(self.j0 + fs);
        let mut u = vec![0.0; fw * uw];
        let a = &mut *self.cols.a;
        if lay.myrow == pr {
            let (l11, a12) = a.split_at_mut(us * lda);
            if solve {
                kernels::trsm_unit_lower(fw, uw, &l11[fs * lda + top..], lda, &mut a12[top..], lda);
            }
            for c in 0..uw {
                let src = (us + c) * lda + top;
                u[c * fw..(c + 1) * fw].copy_from_slice(&a[src..src + fw]);
            }
        }
        self.comm.bcast_in(
            Group::Members(self.column),
            lay.grid.rank_at(pr, lay.mycol),
            f64_bytes_mut(&mut u),
        )?;
        let below = lay.rows_before(self.j0 + fs + fw);
        if below < lay.mp {
            let (l21, a22) = a.split_at_mut(us * lda);
            kernels::gemm_minus(
                lay.mp - below,
                uw,
                fw,
                &l21[fs * lda + below..],
                lda,
                &u,
                fw,
                &mut a22[below..],
                lda,
            );
        }
        Ok(())
    }

    /// Crout's row step, on the process row holding the panel's rows (no messages): rows
    /// [o, o + pw) of columns [o + pw, end) take −= L(those rows, [s, o))·U([s, o), those
    /// columns), then are solved with the unit triangle of the just-factored part: they are
    /// U's final rows.
    fn finish_u_rows(&mut self, s: usize, o: usize, pw: usize, end: usize) {
        self.log(Step::Finish(s, o, pw, end));
        self.next_max = None;
        let lay = self.lay;
        if lay.myrow != owner(self.j0, lay.nb, lay.grid.p) {
            return;
        }
        let lda = lay.lda;
        let top = lay.rows_before(self.j0);
        let (r, right, width) = (top + o, o + pw, end - o - pw);
        let a = &mut *self.cols.a;
        if o > s {
            // U's rows [s, o) share these columns with the rows being updated: copy them out.
            let k = o - s;
            let mut u = vec![0.0; k * width];
            for c in 0..width {
                let src = (right + c) * lda + top + s;
                u[c * k..(c + 1) * k].copy_from_slice(&a[src..src + k]);
            }
            let (left, rest) = a.split_at_mut(right * lda);
            kernels::gemm_minus(
                pw,
                width,
                k,
                &left[s * lda + r..],
                lda,
                &u,
                k,
                &mut rest[r..],
                lda,
            );
        }
        let (left, rest) = a.split_at_mut(right * lda);
        kernels::trsm_unit_lower(pw, width, &left[o * lda + r..], lda, &mut rest[r..], lda);
    }
}

/// The column below a pivot (rows `rows` of column 0 of `a`, leading dimension `lda`) scaled
/// by the pivot `urow[0]`'s reciprocal, as HPL does (left alone if the pivot is zero), then
/// the rank-1 update of columns 1.. with the pivot row's other values. A block of rows at a
/// time, so each block of the columns is read once and the multipliers stay in L1; column
/// 1's block is searched while it is there. Returns column 1's largest magnitude over `rows`
/// and its row (as `abs_max_loc`) where there is a column 1.
fn scale_and_update(
    a: &mut [f64],
    lda: usize,
    rows: std::ops::Range<usize>,
    urow: &[f64],
) -> Option<(f64, Option<usize>)> {
    const BLOCK: usize = 512;
    let d = urow[0];
    let (first, rest) = a.split_at_mut(lda);
    let mut next = (urow.len() > 1).then_some((-1.0f64, None));
    let mut i0 = rows.start;
    while i0 < rows.end {
        let i1 = (i0 + BLOCK).min(rows.end);
        let l = &mut first[i0..i1];
        if d != 0.0 {
            let scale = 1.0 / d;
            l.iter_mut().for_each(|v| *v *= scale);
        }
        for (k, &u) in urow.iter().enumerate().skip(1) {
            let c = &mut rest[(k - 1) * lda + i0..(k - 1) * lda + i1];
            if u != 0.0 {
                c.iter_mut().zip(l.iter()).for_each(|(c, l)| *c -= l * u);
            }
            if let (1, Some((best, at))) = (k, next.as_mut()) {
                let (v, r) = abs_max_loc(c);
                // Strictly larger only: the first of equal magnitudes wins, as in one scan.
                if let Some(r) = r.filter(|_| v > *best) {
                    *best = v;
                    *at = Some(i0 + r);
                }
            }
        }
        i0 = i1;
    }
    next
}

/// The largest magnitude in `x` and where it first occurs (`(-1, None)` if `x` is empty or
/// all NaN): idamax's choice, except that a NaN never wins (reference idamax keeps a NaN
/// found first). Two passes that the compiler turns into vector code (one pass tracking
/// indices does not vectorize): the maximum, kept in eight lanes, then the first chunk
/// holding it.
fn abs_max_loc(x: &[f64]) -> (f64, Option<usize>) {
    const LANES: usize = 8;
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    let mut lanes = [-1.0f64; LANES];
    for chunk in chunks.clone() {
        for (b, v) in lanes.iter_mut().zip(chunk) {
            // Not f64::max: a NaN must never win, as it never compares larger in idamax.
            let v = v.abs();
            *b = if v > *b { v } else { *b };
        }
    }
    let best = tail
        .iter()
        .map(|v| v.abs())
        .chain(lanes)
        .fold(-1.0f64, |b, v| if v > b { v } else { b });
    if best < 0.0 {
        return (best, None);
    }
    for (c, chunk) in chunks.enumerate() {
        if chunk.iter().fold(false, |hit, v| hit | (v.abs() == best)) {
            let at = chunk.iter().position(|v| v.abs() == best);
            return (best, at.map(|i| c * LANES + i));
        }
    }
    let base = x.len() - tail.len();
    (
        best,
        tail.iter().position(|v| v.abs() == best).map(|i| base + i),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generator::HPL_SEED;
    use crate::grid::{Grid, ProcessMap};
    use crate::matrix::LocalMatrix;
    use std::time::Duration;
    use tbbench_runners::session::PeerName;
    use tbbench_runners::transport::shm::{create_segment, ShmTransport};
    use Factorization::{Crout, Left, Right};
    use Step::{Apply, Finish, Pivot};

    /// Factors the first `jb` columns of HPL's matrix of order `n` on one process; returns
    /// the schedule, the pivots and the factored columns.
    fn run(
        n: usize,
        jb: usize,
        pfact: Factorization,
        rfact: Factorization,
        nbmin: usize,
        ndiv: usize,
    ) -> (Vec<Step>, Vec<u64>, Vec<f64>) {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let mut token = [0x5c; 16];
        token[..4].copy_from_slice(&std::process::id().to_le_bytes());
        let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        token[4..8].copy_from_slice(&k.to_le_bytes());
        create_segment(&token, 1).unwrap();
        let names = vec![PeerName {
            rank: 0,
            host: "test".into(),
        }];
        let t = ShmTransport::attach(0, 1, &token, names, Duration::from_secs(5)).unwrap();
        let mut comm = Comm::new(Box::new(t));
        let grid = Grid::new(1, 1, ProcessMap::RowMajor);
        let mut m = LocalMatrix::generate(n, jb, grid, 0, HPL_SEED);
        let (mut trace, mut ipiv) = (Vec::new(), vec![0u64; jb]);
        let lda = m.lda;
        Panel {
            lay: &m.layout,
            cols: PanelColumns::of(&mut m.a, lda, 0, jb),
            comm: &mut comm,
            column: &[0],
            j0: 0,
            jb,
            pfact,
            rfact,
            nbmin,
            ndiv,
            ipiv: &mut ipiv,
            trace: Some(&mut trace),
            next_max: None,
        }
        .factor()
        .unwrap();
        (trace, ipiv, m.a[..n * jb].to_vec())
    }

    /// Column-by-column LU with partial pivoting of the same n x jb panel.
    fn plain_lu(n: usize, jb: usize) -> (Vec<u64>, Vec<f64>) {
        let mut a = crate::reference::augmented(n, HPL_SEED)[..n * jb].to_vec();
        let mut ipiv = Vec::new();
        for k in 0..jb {
            let p = (k..n)
                .max_by(|&x, &y| a[k * n + x].abs().total_cmp(&a[k * n + y].abs()))
                .unwrap();
            ipiv.push(p as u64);
            for c in 0..jb {
                a.swap(c * n + k, c * n + p);
            }
            for i in k + 1..n {
                // By the reciprocal, as the panel (and HPL) scale: a division can round a
                // near-tie the other way and pick another pivot.
                a[k * n + i] *= 1.0 / a[k * n + k];
            }
            for c in k + 1..jb {
                for i in k + 1..n {
                    a[c * n + i] -= a[k * n + i] * a[c * n + k];
                }
            }
        }
        (ipiv, a)
    }

    #[test]
    fn each_order_follows_its_own_schedule() {
        // Six columns in three parts of two (NDIV 3, NBMIN 2).
        let right = vec![
            Pivot(0, 2),
            Pivot(1, 2),
            Apply(0, 2, 2, 4, true),
            Pivot(2, 4),
            Pivot(3, 4),
            Apply(2, 2, 4, 2, true),
            Pivot(4, 6),
            Pivot(5, 6),
        ];
        let left = vec![
            Pivot(0, 1),
            Apply(0, 1, 1, 1, true),
            Pivot(1, 2),
            Apply(0, 2, 2, 2, true),
            Pivot(2, 3),
            Apply(2, 1, 3, 1, true),
            Pivot(3, 4),
            Apply(0, 4, 4, 2, true),
            Pivot(4, 5),
            Apply(4, 1, 5, 1, true),
            Pivot(5, 6),
        ];
        let crout = vec![
            Pivot(0, 1),
            Finish(0, 0, 1, 2),
            Apply(0, 1, 1, 1, false),
            Pivot(1, 2),
            Finish(0, 0, 2, 6),
            Apply(0, 2, 2, 2, false),
            Pivot(2, 3),
            Finish(2, 2, 1, 4),
            Apply(2, 1, 3, 1, false),
            Pivot(3, 4),
            Finish(0, 2, 2, 6),
            Apply(0, 4, 4, 2, false),
            Pivot(4, 5),
            Finish(4, 4, 1, 6),
            Apply(4, 1, 5, 1, false),
            Pivot(5, 6),
        ];
        assert_eq!(run(40, 6, Right, Right, 2, 3).0, right);
        assert_eq!(run(40, 6, Left, Left, 2, 3).0, left);
        assert_eq!(run(40, 6, Crout, Crout, 2, 3).0, crout);
        // Mixed: a left-looking recursion over right-looking base cases.
        let mixed = run(40, 6, Right, Left, 2, 3).0;
        assert_eq!(
            &mixed[..3],
            &[Pivot(0, 2), Pivot(1, 2), Apply(0, 2, 2, 2, true)]
        );
    }

    #[test]
    fn all_nine_pairs_pick_the_same_pivots_and_factors() {
        let (n, jb) = (50, 13);
        let (want_piv, want) = plain_lu(n, jb);
        let mut schedules = Vec::new();
        for pfact in [Left, Crout, Right] {
            for rfact in [Left, Crout, Right] {
                for (nbmin, ndiv) in [(2, 2), (3, 3), (1, 4)] {
                    let (trace, ipiv, a) = run(n, jb, pfact, rfact, nbmin, ndiv);
                    assert_eq!(ipiv, want_piv, "{pfact:?} {rfact:?} {nbmin} {ndiv}");
                    let worst = a
                        .iter()
                        .zip(&want)
                        .map(|(x, y)| (x - y).abs())
                        .fold(0.0, f64::max);
                    assert!(worst < 1e-12, "{pfact:?} {rfact:?} {nbmin} {ndiv}: {worst}");
                    if (nbmin, ndiv) == (3, 3) {
                        schedules.push(trace);
                    }
                }
            }
        }
        // Nine different schedules: no pair runs as another.
        for i in 0..schedules.len() {
            for j in i + 1..schedules.len() {
                assert_ne!(schedules[i], schedules[j], "pairs {i} and {j}");
            }
        }
    }

    /// idamax as BLAS defines it, one value at a time.
    fn idamax(x: &[f64]) -> (f64, Option<usize>) {
        let (mut best, mut at) = (-1.0f64, None);
        for (i, v) in x.iter().enumerate() {
            if v.abs() > best {
                best = v.abs();
                at = Some(i);
            }
        }
        (best, at)
    }

    #[test]
    fn the_vector_maxloc_finds_the_first_largest_magnitude_as_idamax() {
        let mut seed = 7u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // Few distinct values, so ties (and ties between lanes) are common.
            ((seed >> 59) as f64 - 16.0) / 4.0
        };
        for len in 0..70 {
            for _ in 0..20 {
                let x: Vec<f64> = (0..len).map(|_| next()).collect();
                assert_eq!(abs_max_loc(&x), idamax(&x), "{x:?}");
            }
        }
        // NaN never wins; all NaN is no pivot; -0.0 and 0.0 count as magnitude 0.
        let x = [1.0, f64::NAN, -3.0, 3.0, f64::NAN, 0.5, 2.0, -1.0, 0.0, 3.0];
        assert_eq!(abs_max_loc(&x), (3.0, Some(2)));
        assert_eq!(abs_max_loc(&[f64::NAN; 11]), (-1.0, None));
        assert_eq!(abs_max_loc(&[-0.0, 0.0]), (0.0, Some(0)));
        let mut big = vec![1.0; 1000];
        big[999] = -2.0;
        big[700] = 2.0;
        assert_eq!(abs_max_loc(&big), (2.0, Some(700)));
    }

    #[test]
    fn scaling_and_the_rank_1_update_match_plain_loops_and_find_the_next_pivot() {
        let (lda, w) = (1203, 4);
        let start: Vec<f64> = (0..lda * w)
            .map(|i| ((i * 7919) % 1009) as f64 / 97.0 - 5.0)
            .collect();
        for rows in [5..1203, 0..0, 600..601, 3..515] {
            for urow in [vec![2.5, -1.0, 0.0, 3.0], vec![-0.5], vec![0.0, 1.0]] {
                let mut a = start.clone();
                let next = scale_and_update(&mut a, lda, rows.clone(), &urow);
                let mut want = start.clone();
                for i in rows.clone() {
                    if urow[0] != 0.0 {
                        want[i] *= 1.0 / urow[0];
                    }
                    for (k, u) in urow.iter().enumerate().skip(1) {
                        want[k * lda + i] -= want[i] * u;
                    }
                }
                assert_eq!(a, want, "rows {rows:?}, pivot row {urow:?}");
                let column1 = &want[lda + rows.start..lda + rows.end];
                let found = idamax(column1);
                let expect = (urow.len() > 1).then(|| (found.0, found.1.map(|r| r + rows.start)));
                assert_eq!(next, expect, "rows {rows:?}, pivot row {urow:?}");
            }
        }
    }
}
