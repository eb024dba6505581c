//! The distributed right-looking LU with partial pivoting of [A | b] (b is eliminated with
//! A, as HPL does), then the distributed back substitution. One panel of NB columns at a time:
//!
//! 1. panel: the process column owning it factors it recursively (HPL's RFACT=Right: NDIV
//!    parts down to NBMIN columns, each pivot picked with a maxloc over the process column,
//!    its row swapped and broadcast; TRSM + GEMM between parts);
//! 2. broadcast: the panel (L21 and the pivots) goes along each process row (with one
//!    process column it is used in place);
//! 3. swaps: every process column applies the pivots to its trailing columns;
//! 4. update: the process row owning the panel's rows solves U12 = L11⁻¹·A12 and sends it
//!    down each process column; everyone updates A22 −= L21·U12.
//!
//! Lookahead (DEPTH ≥ 1) and HPL's broadcast and swap variants are not in yet.

use crate::grid::{owner, Grid};
use crate::input::Broadcast;
use crate::kernels;
use crate::matrix::LocalMatrix;
use anyhow::Result;
use serde::Serialize;
use std::time::Instant;
use tbbench_runners::comm::{f64_bytes, f64_bytes_mut, Comm, Group};

/// Where one rank's time went, in seconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Timings {
    pub panel: f64,
    pub broadcast: f64,
    pub swap: f64,
    pub update: f64,
    pub solve: f64,
}

fn column_group(grid: &Grid, col: usize) -> Vec<usize> {
    (0..grid.p).map(|r| grid.rank_at(r, col)).collect()
}

fn row_group(grid: &Grid, row: usize) -> Vec<usize> {
    (0..grid.q).map(|c| grid.rank_at(row, c)).collect()
}

/// Swaps global rows `j` and `g` over local columns `cols` within this process column:
/// locally when one process row owns both, else by exchanging the two segments.
fn swap_rows(
    m: &mut LocalMatrix,
    comm: &mut Comm,
    j: usize,
    g: usize,
    cols: std::ops::Range<usize>,
) -> Result<()> {
    if j == g || cols.is_empty() {
        return Ok(());
    }
    let (p, nb) = (m.grid.p, m.nb);
    let (oj, og) = (owner(j, nb, p), owner(g, nb, p));
    let lj = m.rows_before(j);
    let lg = m.rows_before(g);
    if oj == og {
        if m.myrow == oj {
            m.swap_local_rows(lj, lg, cols);
        }
        return Ok(());
    }
    let (mine, other_row) = if m.myrow == oj {
        (lj, og)
    } else if m.myrow == og {
        (lg, oj)
    } else {
        return Ok(());
    };
    let out = m.row_segment(mine, cols.clone());
    let mut back = vec![0.0; out.len()];
    let peer = m.grid.rank_at(other_row, m.mycol);
    comm.sendrecv(peer, f64_bytes(&out), peer, f64_bytes_mut(&mut back))?;
    m.set_row_segment(mine, cols, &back);
    Ok(())
}

/// One panel being factored by its process column: HPL's recursive right-looking panel
/// factorization (RFACT = Right), NDIV parts at each level down to NBMIN columns, which are
/// factored column by column. Between parts the rest of the range is brought up to date with
/// a triangular solve and a matrix product, so most of the panel's work runs in the BLAS.
struct Panel<'a> {
    m: &'a mut LocalMatrix,
    comm: &'a mut Comm,
    column: &'a [usize],
    j0: usize,
    c0: usize,
    jb: usize,
    nbmin: usize,
    ndiv: usize,
    ipiv: &'a mut [u64],
}

impl Panel<'_> {
    /// Factors panel columns [s, s + w).
    fn recursive(&mut self, s: usize, w: usize) -> Result<()> {
        if w <= self.nbmin.max(1) || self.ndiv < 2 {
            return self.columns(s, w);
        }
        let part = w.div_ceil(self.ndiv);
        let mut done = 0;
        while done < w {
            let pw = part.min(w - done);
            self.recursive(s + done, pw)?;
            if done + pw < w {
                self.update(s + done, pw, s + done + pw, w - done - pw)?;
            }
            done += pw;
        }
        Ok(())
    }

    /// The base case: columns [s, s + w) one at a time: pivot search over the process column,
    /// swap across the whole panel, pivot row to the column, scale, rank-1 update of [s, s+w).
    fn columns(&mut self, s: usize, w: usize) -> Result<()> {
        let (nb, p) = (self.m.nb, self.m.grid.p);
        let panel_cols = self.c0..self.c0 + self.jb;
        for jj in s..s + w {
            let j = self.j0 + jj;
            let lc = self.c0 + jj;
            let m = &mut *self.m;
            let lr = m.rows_before(j);
            let (mut best, mut at) = (-1.0f64, u64::MAX);
            for i in lr..m.mp {
                let v = m.at(i, lc).abs();
                if v > best {
                    best = v;
                    at = m.global_row(i) as u64;
                }
            }
            let (_, g) = self
                .comm
                .allreduce_maxloc_in(Group::Members(self.column), best, at)?;
            self.ipiv[jj] = g;
            swap_rows(m, self.comm, j, g as usize, panel_cols.clone())?;
            // The column needs the pivot row over [jj, s + w): its diagonal and U part.
            let oj = owner(j, nb, p);
            let seg = lc..self.c0 + s + w;
            let mut urow = if m.myrow == oj {
                m.row_segment(m.rows_before(j), seg.clone())
            } else {
                vec![0.0; seg.len()]
            };
            self.comm.bcast_in(
                Group::Members(self.column),
                m.grid.rank_at(oj, m.mycol),
                f64_bytes_mut(&mut urow),
            )?;
            let d = urow[0];
            let below = m.rows_before(j + 1);
            let lda = m.lda;
            for i in below..m.mp {
                m.a[lc * lda + i] /= d;
            }
            for (k, &u) in urow.iter().enumerate().skip(1) {
                if u != 0.0 {
                    for i in below..m.mp {
                        let l = m.a[lc * lda + i];
                        m.a[(lc + k) * lda + i] -= l * u;
                    }
                }
            }
        }
        Ok(())
    }

    /// Panel columns [us, us + uw) after columns [fs, fs + fw) were factored: U = L11⁻¹·A12 on
    /// the process row holding the panel's rows, sent down the column, then A22 −= L21·U.
    fn update(&mut self, fs: usize, fw: usize, us: usize, uw: usize) -> Result<()> {
        let m = &mut *self.m;
        let (nb, p, lda) = (m.nb, m.grid.p, m.lda);
        let pr = owner(self.j0, nb, p);
        let top = m.rows_before(self.j0 + fs);
        let mut u = vec![0.0; fw * uw];
        if m.myrow == pr {
            let (l11, a12) = m.a.split_at_mut((self.c0 + us) * lda);
            kernels::trsm_unit_lower(
                fw,
                uw,
                &l11[(self.c0 + fs) * lda + top..],
                lda,
                &mut a12[top..],
                lda,
            );
            for c in 0..uw {
                let src = (self.c0 + us + c) * lda + top;
                u[c * fw..(c + 1) * fw].copy_from_slice(&m.a[src..src + fw]);
            }
        }
        self.comm.bcast_in(
            Group::Members(self.column),
            m.grid.rank_at(pr, m.mycol),
            f64_bytes_mut(&mut u),
        )?;
        let below = m.rows_before(self.j0 + fs + fw);
        if below < m.mp {
            let (l21, a22) = m.a.split_at_mut((self.c0 + us) * lda);
            kernels::gemm_minus(
                m.mp - below,
                uw,
                fw,
                &l21[(self.c0 + fs) * lda + below..],
                lda,
                &u,
                fw,
                &mut a22[below..],
                lda,
            );
        }
        Ok(())
    }
}

/// Factors [A | b] in place; on return this rank's share holds its part of U and of the
/// transformed b. `on_panel(columns done)` runs on every rank after each panel.
pub fn factor(
    m: &mut LocalMatrix,
    comm: &mut Comm,
    nbmin: usize,
    ndiv: usize,
    bcast: Broadcast,
    t: &mut Timings,
    mut on_panel: impl FnMut(usize),
) -> Result<()> {
    let (n, nb, grid) = (m.n, m.nb, m.grid);
    let my_column = column_group(&grid, m.mycol);
    let my_row = row_group(&grid, m.myrow);
    let mut j0 = 0;
    while j0 < n {
        let jb = nb.min(n - j0);
        let pc = owner(j0, nb, grid.q);
        let pr = owner(j0, nb, grid.p);
        let r0 = m.rows_before(j0);
        let c0 = m.cols_before(j0);
        let rows = m.mp - r0;
        let mut ipiv = vec![0u64; jb];

        // 1. Panel factorization, on the process column that owns it.
        let clock = Instant::now();
        if m.mycol == pc {
            let mut panel = Panel {
                m: &mut *m,
                comm: &mut *comm,
                column: &my_column,
                j0,
                c0,
                jb,
                nbmin,
                ndiv,
                ipiv: &mut ipiv,
            };
            panel.recursive(0, jb)?;
        }
        t.panel += clock.elapsed().as_secs_f64();

        // 2. The panel's rows at and below j0, and its pivots, along each process row.
        let clock = Instant::now();
        // With one process column there is no one to send the panel to: it is used in place.
        let in_place = grid.q == 1;
        let mut packed = Vec::new();
        if !in_place {
            packed = vec![0.0; rows * jb + jb];
        }
        if !in_place && m.mycol == pc {
            for k in 0..jb {
                let src = (c0 + k) * m.lda + r0;
                packed[k * rows..(k + 1) * rows].copy_from_slice(&m.a[src..src + rows]);
            }
            for (k, p) in ipiv.iter().enumerate() {
                packed[rows * jb + k] = f64::from_bits(*p);
            }
        }
        if !in_place {
            let root = grid.rank_at(m.myrow, pc);
            // HPL.dat's BCAST 0 is the increasing ring; the other variants are not in yet and
            // use a binomial tree (the run says so).
            if bcast == Broadcast::IncreasingRing {
                comm.bcast_ring_in(Group::Members(&my_row), root, f64_bytes_mut(&mut packed))?;
            } else {
                comm.bcast_in(Group::Members(&my_row), root, f64_bytes_mut(&mut packed))?;
            }
            for (k, p) in ipiv.iter_mut().enumerate() {
                *p = packed[rows * jb + k].to_bits();
            }
        }
        t.broadcast += clock.elapsed().as_secs_f64();

        // 3. The pivots, applied to the trailing columns (b's included).
        let clock = Instant::now();
        let ct = m.cols_before(j0 + jb);
        if grid.p == 1 {
            // Every row is here: apply the panel's pivots one column at a time (as LAPACK's
            // dlaswp does), so each column stays in cache instead of striding across rows.
            let lda = m.lda;
            if ct < m.nq && !kernels::laswp(m.nq - ct, &mut m.a[ct * lda..], lda, j0, &ipiv) {
                for c in ct..m.nq {
                    let col = &mut m.a[c * lda..c * lda + m.mp];
                    for (jj, &g) in ipiv.iter().enumerate() {
                        col.swap(j0 + jj, g as usize);
                    }
                }
            }
        } else {
            for (jj, &g) in ipiv.iter().enumerate() {
                swap_rows(m, comm, j0 + jj, g as usize, ct..m.nq)?;
            }
        }
        t.swap += clock.elapsed().as_secs_f64();

        // 4. U12 on the panel's process row, sent down each column; then A22 −= L21·U12.
        let clock = Instant::now();
        let width = m.nq - ct;
        let mut u12 = vec![0.0; jb * width];
        if m.myrow == pr && width > 0 {
            let lda = m.lda;
            if in_place {
                let (left, right) = m.a.split_at_mut(ct * lda);
                kernels::trsm_unit_lower(
                    jb,
                    width,
                    &left[c0 * lda + r0..],
                    lda,
                    &mut right[r0..],
                    lda,
                );
            } else {
                kernels::trsm_unit_lower(jb, width, &packed, rows, &mut m.a[ct * lda + r0..], lda);
            }
            for c in 0..width {
                let src = (ct + c) * lda + r0;
                u12[c * jb..(c + 1) * jb].copy_from_slice(&m.a[src..src + jb]);
            }
        }
        if width > 0 {
            comm.bcast_in(
                Group::Members(&my_column),
                grid.rank_at(pr, m.mycol),
                f64_bytes_mut(&mut u12),
            )?;
        }
        let below = m.rows_before(j0 + jb);
        let skip = below - r0;
        let lda = m.lda;
        if width > 0 && below < m.mp {
            if in_place {
                let (left, right) = m.a.split_at_mut(ct * lda);
                kernels::gemm_minus(
                    m.mp - below,
                    width,
                    jb,
                    &left[c0 * lda + below..],
                    lda,
                    &u12,
                    jb,
                    &mut right[below..],
                    lda,
                );
            } else {
                kernels::gemm_minus(
                    m.mp - below,
                    width,
                    jb,
                    &packed[skip..],
                    rows,
                    &u12,
                    jb,
                    &mut m.a[ct * lda + below..],
                    lda,
                );
            }
        }
        t.update += clock.elapsed().as_secs_f64();

        j0 += jb;
        on_panel(j0);
    }
    Ok(())
}

/// Back substitution Ux = y over the distributed U, y being the transformed b (global
/// column n). Every rank ends with all of x.
pub fn solve(m: &LocalMatrix, comm: &mut Comm, t: &mut Timings) -> Result<Vec<f64>> {
    let clock = Instant::now();
    let (n, nb, grid) = (m.n, m.nb, m.grid);
    let pc_b = owner(n, nb, grid.q);
    let lc_b = m.cols_before(n);
    // This rank's piece of y (only the process column holding b has one).
    let mut y: Vec<f64> = if m.mycol == pc_b {
        (0..m.mp).map(|i| m.at(i, lc_b)).collect()
    } else {
        Vec::new()
    };
    let mut x = vec![0.0; n];
    let blocks = n.div_ceil(nb);
    for k in (0..blocks).rev() {
        let kb = k * nb;
        let kw = nb.min(n - kb);
        let (prk, pck) = (owner(kb, nb, grid.p), owner(kb, nb, grid.q));
        let diag = grid.rank_at(prk, pck);
        let lr = m.rows_before(kb);
        let mut xk = vec![0.0; kw];
        if m.myrow == prk {
            // y_k travels from the b column to the diagonal block's owner.
            let holder = grid.rank_at(prk, pc_b);
            if comm.rank() == holder {
                xk.copy_from_slice(&y[lr..lr + kw]);
                if holder != diag {
                    comm.send(diag, f64_bytes(&xk))?;
                }
            } else if comm.rank() == diag {
                comm.recv(holder, f64_bytes_mut(&mut xk))?;
            }
            if comm.rank() == diag {
                let lc = m.cols_before(kb);
                kernels::trsv_upper(kw, &m.a[lc * m.lda + lr..], m.lda, &mut xk);
            }
        }
        comm.bcast(diag, f64_bytes_mut(&mut xk))?;
        x[kb..kb + kw].copy_from_slice(&xk);
        // y_above −= U(above, block k) · x_k: computed where U's block column lives, applied
        // where y lives.
        if lr == 0 {
            continue;
        }
        let mut part = vec![0.0; lr];
        if m.mycol == pck {
            let lc = m.cols_before(kb);
            for (c, xv) in xk.iter().enumerate() {
                let col = &m.a[(lc + c) * m.lda..(lc + c) * m.lda + lr];
                for (p, u) in part.iter_mut().zip(col) {
                    *p += u * xv;
                }
            }
            if pck != pc_b {
                comm.send(grid.rank_at(m.myrow, pc_b), f64_bytes(&part))?;
            }
        }
        if m.mycol == pc_b {
            if pck != pc_b {
                comm.recv(grid.rank_at(m.myrow, pck), f64_bytes_mut(&mut part))?;
            }
            for (yi, p) in y.iter_mut().zip(&part) {
                *yi -= p;
            }
        }
    }
    t.solve += clock.elapsed().as_secs_f64();
    Ok(x)
}
