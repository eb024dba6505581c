//! HPL-MxP's factorization: a right-looking blocked LU without pivoting, in single precision,
//! on the same 2D block-cyclic distribution as hpl's. Step k (NB columns):
//! 1. the rank holding the diagonal block factors it;
//! 2. it goes down its process column and along its process row;
//! 3. the process column solves its panel below it (L21 = A21·U11⁻¹), the process row its
//!    panel to the right (U12 = L11⁻¹·A12);
//! 4. L21 goes along each process row, U12 down each process column;
//! 5. every rank updates its part of the trailing matrix, A22 −= L21·U12 (sgemm, or with
//!    `--precision bf16` or `fp16` the operands in that format and FP32 sums: `super::bf16`'s
//!    AVX-512 BF16 kernel, or `super::rounded` on any CPU).
//!
//! No pivots, so no row swaps and no pivot searches: the matrix is diagonally dominant by
//! construction (`super::dominant`).

use super::kernels32 as k32;
use super::{rounded, Precision};
use crate::grid::owner;
use crate::matrix::Layout;
use anyhow::Result;
use tbbench_runners::comm::{as_bytes_mut, Comm, Group};
use tbbench_runners::transport::Waiting;

/// Where one rank's factorization spent its time, seconds.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct FactorTimes {
    /// Diagonal blocks and the panels' triangular solves.
    pub panel: f64,
    /// The diagonal blocks' and panels' broadcasts.
    pub broadcast: f64,
    /// The trailing updates (sgemm).
    pub update: f64,
}

/// Factors this rank's share `a` (the N×N part of the layout, single precision, leading
/// dimension `l.lda`) in place into L\U. Every rank of the grid calls it.
/// `precision` picks the trailing update's product: FP32 (sgemm), or BF16 or FP16 with FP32
/// accumulation ([`product`]); the diagonal blocks and the panels' solves are FP32 in every
/// case.
pub fn factor(
    comm: &mut Comm,
    l: &Layout,
    a: &mut [f32],
    precision: Precision,
    t: &mut FactorTimes,
) -> Result<()> {
    if l.grid.p == 1 && l.grid.q > 1 {
        return factor_one_row(comm, l, a, precision, t);
    }
    let mut scratch = super::Scratch::default();
    let (n, nb, grid) = (l.n, l.nb, l.grid.clone());
    let rounding = super::rounding(precision, n);
    let lda = l.lda;
    let nqa = l.cols_before(n);
    assert!(a.len() >= lda * nqa);
    let row: Vec<usize> = (0..grid.q).map(|c| grid.rank_at(l.myrow, c)).collect();
    let col: Vec<usize> = (0..grid.p).map(|r| grid.rank_at(r, l.mycol)).collect();
    let mut diag = vec![0f32; nb * nb];
    let mut lpanel: Vec<f32> = Vec::new();
    let mut upanel: Vec<f32> = Vec::new();
    let mut clock = std::time::Instant::now();
    let lap = |c: &mut std::time::Instant| {
        let s = c.elapsed().as_secs_f64();
        *c = std::time::Instant::now();
        s
    };
    for g0 in (0..n).step_by(nb) {
        let kb = nb.min(n - g0);
        let (prow, pcol) = (owner(g0, nb, grid.p), owner(g0, nb, grid.q));
        let (in_row, in_col) = (l.myrow == prow, l.mycol == pcol);
        let (lr0, lc0) = (l.rows_before(g0), l.cols_before(g0));
        let (lr1, lc1) = (l.rows_before(g0 + kb), l.cols_before(g0 + kb));
        let d = &mut diag[..kb * kb];
        // 1. The diagonal block, factored where it lies and copied out.
        if in_row && in_col {
            // SAFETY: the block lies inside this rank's share (rows lr0..lr0+kb of columns
            // lc0..lc0+kb, lda ≥ mp).
            unsafe { k32::getrf_nopiv(kb, a.as_mut_ptr().wrapping_add(lc0 * lda + lr0), lda) };
            for c in 0..kb {
                d[c * kb..(c + 1) * kb]
                    .copy_from_slice(&a[(lc0 + c) * lda + lr0..(lc0 + c) * lda + lr0 + kb]);
            }
        }
        t.panel += lap(&mut clock);
        // 2. To the process column and the process row that solve against it.
        let diag_rank = grid.rank_at(prow, pcol);
        if in_col && grid.p > 1 {
            comm.bcast_in(Group::Members(&col), diag_rank, as_bytes_mut(d))?;
        }
        if in_row && grid.q > 1 {
            comm.bcast_in(Group::Members(&row), diag_rank, as_bytes_mut(d))?;
        }
        t.broadcast += lap(&mut clock);
        // 3. The panels' solves, in place.
        let (m_below, n_right) = (l.mp - lr1, nqa - lc1);
        // SAFETY: the diagonal copy and the share are distinct; each panel lies in the share.
        unsafe {
            if in_col {
                k32::trsm_right_upper(
                    m_below,
                    kb,
                    d.as_ptr(),
                    kb,
                    a.as_mut_ptr().wrapping_add(lc0 * lda + lr1),
                    lda,
                );
            }
            if in_row {
                k32::trsm_left_lower_unit(
                    kb,
                    n_right,
                    d.as_ptr(),
                    kb,
                    a.as_mut_ptr().wrapping_add(lc1 * lda + lr0),
                    lda,
                );
            }
        }
        t.panel += lap(&mut clock);
        // 4. L21 along the process rows, U12 down the process columns (sizes agree within
        // each: a process row shares its local rows, a process column its local columns).
        // Alone in its process row (column), a rank reads L21 (U12) where it lies.
        if grid.q > 1 {
            lpanel.resize(m_below * kb, 0.0);
            if in_col {
                for c in 0..kb {
                    let from = (lc0 + c) * lda + lr1;
                    lpanel[c * m_below..(c + 1) * m_below]
                        .copy_from_slice(&a[from..from + m_below]);
                }
                // A copy: rounded once here for the whole row (the factors in the share stay
                // FP32 for the refinement).
                if let Some(r) = rounding {
                    r.round_a(&mut lpanel);
                }
            }
            if m_below > 0 {
                let root = grid.rank_at(l.myrow, pcol);
                comm.bcast_in(Group::Members(&row), root, as_bytes_mut(&mut lpanel))?;
            }
        }
        if grid.p > 1 {
            upanel.resize(kb * n_right, 0.0);
            if in_row {
                for c in 0..n_right {
                    let from = (lc1 + c) * lda + lr0;
                    upanel[c * kb..(c + 1) * kb].copy_from_slice(&a[from..from + kb]);
                }
            }
            if n_right > 0 {
                let root = grid.rank_at(prow, l.mycol);
                comm.bcast_in(Group::Members(&col), root, as_bytes_mut(&mut upanel))?;
            }
        }
        t.broadcast += lap(&mut clock);
        // 5. The trailing update.
        let base = a.as_mut_ptr();
        let (lp, ldl) = if grid.q > 1 {
            (lpanel.as_ptr(), m_below.max(1))
        } else {
            (base.wrapping_add(lc0 * lda + lr1) as *const f32, lda)
        };
        let (up, ldu) = if grid.p > 1 {
            (upanel.as_ptr(), kb)
        } else {
            (base.wrapping_add(lc1 * lda + lr0) as *const f32, lda)
        };
        // SAFETY: the panels are copies, or parts of the share beside the trailing block
        // (L21 in columns before it, U12 in rows above it), which lies in the share.
        let c = base.wrapping_add(lc1 * lda + lr1);
        unsafe {
            product(
                precision,
                rounding,
                &mut scratch,
                grid.q > 1,
                m_below,
                n_right,
                kb,
                lp,
                ldl,
                up,
                ldu,
                c,
                lda,
            )
        };
        t.update += lap(&mut clock);
    }
    Ok(())
}

/// The trailing update's product in the run's precision.
///
/// # Safety
/// As `kernels32::gemm_minus`.
#[allow(clippy::too_many_arguments)]
unsafe fn product(
    precision: Precision,
    rounding: Option<rounded::Rounding>,
    scratch: &mut super::Scratch,
    a_rounded: bool,
    m: usize,
    n: usize,
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
) {
    match (precision, rounding) {
        (Precision::Fp32, _) => k32::gemm_minus(m, n, k, a, lda, b, ldb, c, ldc),
        (_, Some(r)) => rounded::gemm_minus(
            &mut scratch.rounded,
            r,
            a_rounded,
            m,
            n,
            k,
            a,
            lda,
            b,
            ldb,
            c,
            ldc,
        ),
        (_, None) => {
            let threads = crate::kernels::threads();
            super::bf16::gemm_minus(&mut scratch.bf16, threads, m, n, k, a, lda, b, ldb, c, ldc)
        }
    }
}

/// One process row (P = 1, the grids of 2 and 3 ranks): every rank holds every row, so a
/// step's only message is its panel (diagonal block and L21) along the row, and it is hidden
/// behind the update as HPL's lookahead hides it: the rank holding the next panel updates
/// that panel's columns first, factors it, and it travels (on a helper thread, which sleeps
/// while it waits) while every rank updates the rest of its columns.
fn factor_one_row(
    comm: &mut Comm,
    l: &Layout,
    a: &mut [f32],
    precision: Precision,
    t: &mut FactorTimes,
) -> Result<()> {
    let (n, nb, grid, lda) = (l.n, l.nb, l.grid.clone(), l.lda);
    let nqa = l.cols_before(n);
    assert!(grid.p == 1 && l.mp == n && a.len() >= lda * nqa);
    let row: Vec<usize> = (0..grid.q).map(|c| grid.rank_at(0, c)).collect();
    let mut scratch = super::Scratch::default();
    let rounding = super::rounding(precision, n);
    let mut clock = std::time::Instant::now();
    let lap = |c: &mut std::time::Instant| {
        let s = c.elapsed().as_secs_f64();
        *c = std::time::Instant::now();
        s
    };
    // Panel j's columns factored where they lie (its diagonal block, then L21 below it), and
    // copied out: rows g0..n of its kb columns, leading dimension n − g0.
    let ready = |a: &mut [f32], g0: usize, out: &mut Vec<f32>| {
        let kb = nb.min(n - g0);
        let lc0 = l.cols_before(g0);
        let m = n - g0;
        let base = a.as_mut_ptr();
        // SAFETY: the panel's rows g0..n of columns lc0..lc0+kb lie in the share.
        unsafe {
            let d = base.wrapping_add(lc0 * lda + g0);
            k32::getrf_nopiv(kb, d, lda);
            k32::trsm_right_upper(m - kb, kb, d, lda, d.wrapping_add(kb), lda);
        }
        out.resize(m * kb, 0.0);
        for c in 0..kb {
            let from = (lc0 + c) * lda + g0;
            out[c * m..(c + 1) * m].copy_from_slice(&a[from..from + m]);
            // L21's part of the copy rounded once for the step's updates (L11 above it
            // stays FP32 for U12's solve, as the share's factors do for the refinement).
            if let Some(r) = rounding {
                r.round_a(&mut out[c * m + kb..(c + 1) * m]);
            }
        }
    };
    // Step g0's U12 and update over local columns `cols` (all right of the panel).
    let update = |a: &mut [f32],
                  scratch: &mut super::Scratch,
                  g0: usize,
                  panel: &[f32],
                  cols: std::ops::Range<usize>| {
        if cols.is_empty() {
            return;
        }
        let kb = nb.min(n - g0);
        let m = n - g0;
        let base = a.as_mut_ptr();
        let u = base.wrapping_add(cols.start * lda + g0);
        // SAFETY: the panel is a copy; U12 (rows g0..g0+kb) and A22 (rows below) of the
        // columns lie in the share.
        unsafe {
            k32::trsm_left_lower_unit(kb, cols.len(), panel.as_ptr(), m, u, lda);
            product(
                precision,
                rounding,
                scratch,
                true,
                m - kb,
                cols.len(),
                kb,
                panel.as_ptr().wrapping_add(kb),
                m,
                u,
                lda,
                u.wrapping_add(kb),
                lda,
            );
        }
    };
    let owner_of = |g0: usize| grid.rank_at(0, owner(g0, nb, grid.q));
    let me = comm.rank();
    let (mut cur, mut next): (Vec<f32>, Vec<f32>) = (Vec::new(), Vec::new());
    if owner_of(0) == me {
        ready(a, 0, &mut cur);
    }
    t.panel += lap(&mut clock);
    cur.resize(n * nb.min(n), 0.0);
    comm.bcast_in(Group::Members(&row), owner_of(0), as_bytes_mut(&mut cur))?;
    t.broadcast += lap(&mut clock);
    for g0 in (0..n).step_by(nb) {
        let kb = nb.min(n - g0);
        let lc1 = l.cols_before(g0 + kb);
        let g1 = g0 + kb;
        if g1 >= n {
            update(a, &mut scratch, g0, &cur, lc1..nqa);
            t.update += lap(&mut clock);
            break;
        }
        // The next panel's columns first, where this rank holds them; then that panel.
        let kb1 = nb.min(n - g1);
        let mut rest = lc1..nqa;
        if owner_of(g1) == me {
            update(a, &mut scratch, g0, &cur, lc1..lc1 + kb1);
            t.update += lap(&mut clock);
            ready(a, g1, &mut next);
            t.panel += lap(&mut clock);
            rest = lc1 + kb1..nqa;
        }
        next.resize((n - g1) * kb1, 0.0);
        comm.set_waiting(Waiting::Beside);
        let moved = std::thread::scope(|s| {
            let (comm, next, row) = (&mut *comm, &mut next, &row);
            let helper = s.spawn(move || {
                comm.bcast_in(Group::Members(row), owner_of(g1), as_bytes_mut(next))
            });
            update(a, &mut scratch, g0, &cur, rest);
            t.update += lap(&mut clock);
            helper.join()
        });
        comm.set_waiting(Waiting::Spin);
        match moved {
            Ok(r) => r?,
            Err(panic) => std::panic::resume_unwind(panic),
        }
        t.broadcast += lap(&mut clock);
        std::mem::swap(&mut cur, &mut next);
    }
    Ok(())
}
