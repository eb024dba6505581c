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
//! With lookahead (HPL's DEPTH 1) the process column owning the next panel applies step 4 to
//! that panel's columns first, factors and broadcasts it, and only then updates the rest of
//! its trailing matrix; the other columns receive the next panel while they update, so no
//! column idles while one factors. DEPTH ≥ 2 and HPL's broadcast and swap variants are not
//! in yet.

use crate::grid::{owner, Grid};
use crate::input::Broadcast;
use crate::kernels;
use crate::matrix::LocalMatrix;
use anyhow::{bail, Result};
use serde::Serialize;
use std::ops::Range;
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

/// One factored panel as a rank of its process row holds it: L (its rows at and below `j0`,
/// column-major with leading dimension `rows`) followed by the pivots, packed for the row
/// broadcast; with one process column nothing is packed and L is read in place.
struct Factored {
    j0: usize,
    jb: usize,
    /// This rank's local column and row where the panel starts.
    c0: usize,
    r0: usize,
    rows: usize,
    packed: Vec<f64>,
    ipiv: Vec<u64>,
}

impl Factored {
    fn new(m: &LocalMatrix, j0: usize) -> Factored {
        let jb = m.nb.min(m.n - j0);
        let r0 = m.rows_before(j0);
        let rows = m.mp - r0;
        let packed = if m.grid.q == 1 {
            Vec::new()
        } else {
            vec![0.0; rows * jb + jb]
        };
        Factored {
            j0,
            jb,
            c0: m.cols_before(j0),
            r0,
            rows,
            packed,
            ipiv: vec![0; jb],
        }
    }

    fn in_place(&self) -> bool {
        self.packed.is_empty()
    }
}

/// Factors the panel at `f.j0` on the process column that owns it, and packs it for the row
/// broadcast.
fn factor_panel(
    m: &mut LocalMatrix,
    comm: &mut Comm,
    column: &[usize],
    f: &mut Factored,
    nbmin: usize,
    ndiv: usize,
) -> Result<()> {
    Panel {
        m: &mut *m,
        comm,
        column,
        j0: f.j0,
        c0: f.c0,
        jb: f.jb,
        nbmin,
        ndiv,
        ipiv: &mut f.ipiv,
    }
    .recursive(0, f.jb)?;
    if !f.in_place() {
        let (rows, jb) = (f.rows, f.jb);
        for k in 0..jb {
            let src = (f.c0 + k) * m.lda + f.r0;
            f.packed[k * rows..(k + 1) * rows].copy_from_slice(&m.a[src..src + rows]);
        }
        for (k, p) in f.ipiv.iter().enumerate() {
            f.packed[rows * jb + k] = f64::from_bits(*p);
        }
    }
    Ok(())
}

/// Sends the panel (L and pivots) from `root` along this rank's process row.
fn broadcast_panel(
    comm: &mut Comm,
    row: &[usize],
    root: usize,
    bcast: Broadcast,
    f: &mut Factored,
) -> Result<()> {
    if f.in_place() {
        return Ok(());
    }
    // HPL.dat's six BCAST variants, each as HPL defines its message pattern.
    let (g, buf) = (Group::Members(row), f64_bytes_mut(&mut f.packed));
    match bcast {
        Broadcast::IncreasingRing => comm.bcast_ring_in(g, root, buf)?,
        Broadcast::IncreasingRingModified => {
            comm.bcast_modified_in(g, root, buf, Comm::bcast_ring_in)?
        }
        Broadcast::IncreasingTwoRing => comm.bcast_two_ring_in(g, root, buf)?,
        Broadcast::IncreasingTwoRingModified => {
            comm.bcast_modified_in(g, root, buf, Comm::bcast_two_ring_in)?
        }
        Broadcast::Long => comm.bcast_long_in(g, root, buf)?,
        Broadcast::LongModified => comm.bcast_modified_in(g, root, buf, Comm::bcast_long_in)?,
    }
    let (rows, jb) = (f.rows, f.jb);
    for (k, p) in f.ipiv.iter_mut().enumerate() {
        *p = f.packed[rows * jb + k].to_bits();
    }
    Ok(())
}

/// Applies the panel's pivots to local columns `cols` (b's included).
fn apply_pivots(
    m: &mut LocalMatrix,
    comm: &mut Comm,
    f: &Factored,
    cols: Range<usize>,
) -> Result<()> {
    if cols.is_empty() {
        return Ok(());
    }
    if m.grid.p == 1 {
        // Every row is here: apply the panel's pivots one column at a time (as LAPACK's
        // dlaswp does), so each column stays in cache instead of striding across rows.
        let lda = m.lda;
        let (c0, width) = (cols.start, cols.len());
        if !kernels::laswp(width, &mut m.a[c0 * lda..], lda, f.j0, &f.ipiv) {
            for c in cols {
                let col = &mut m.a[c * lda..c * lda + m.mp];
                for (jj, &g) in f.ipiv.iter().enumerate() {
                    col.swap(f.j0 + jj, g as usize);
                }
            }
        }
    } else {
        for (jj, &g) in f.ipiv.iter().enumerate() {
            swap_rows(m, comm, f.j0 + jj, g as usize, cols.clone())?;
        }
    }
    Ok(())
}

/// U12 = L11⁻¹·A12 over local columns `cols`, solved on the panel's process row and sent down
/// this process column (every member of the column calls it with the same `cols`).
fn solve_u12(
    m: &mut LocalMatrix,
    comm: &mut Comm,
    column: &[usize],
    f: &Factored,
    cols: Range<usize>,
) -> Result<Vec<f64>> {
    let (jb, r0, width, lda) = (f.jb, f.r0, cols.len(), m.lda);
    let mut u12 = vec![0.0; jb * width];
    if width == 0 {
        return Ok(u12);
    }
    let pr = owner(f.j0, m.nb, m.grid.p);
    if m.myrow == pr {
        let (left, right) = m.a.split_at_mut(cols.start * lda);
        let (l11, ld) = if f.in_place() {
            (&left[f.c0 * lda + r0..], lda)
        } else {
            (&f.packed[..], f.rows)
        };
        kernels::trsm_unit_lower(jb, width, l11, ld, &mut right[r0..], lda);
        for c in 0..width {
            let src = (cols.start + c) * lda + r0;
            u12[c * jb..(c + 1) * jb].copy_from_slice(&m.a[src..src + jb]);
        }
    }
    comm.bcast_in(
        Group::Members(column),
        m.grid.rank_at(pr, m.mycol),
        f64_bytes_mut(&mut u12),
    )?;
    Ok(u12)
}

/// A22 −= L21·U12 over local columns `cols`.
fn update_trailing(m: &mut LocalMatrix, f: &Factored, cols: Range<usize>, u12: &[f64]) {
    let below = m.rows_before(f.j0 + f.jb);
    let (lda, width) = (m.lda, cols.len());
    if width == 0 || below >= m.mp {
        return;
    }
    let (left, right) = m.a.split_at_mut(cols.start * lda);
    let (l21, ld) = if f.in_place() {
        (&left[f.c0 * lda + below..], lda)
    } else {
        (&f.packed[below - f.r0..], f.rows)
    };
    kernels::gemm_minus(
        m.mp - below,
        width,
        f.jb,
        l21,
        ld,
        u12,
        f.jb,
        &mut right[below..],
        lda,
    );
}

/// Factors [A | b] in place; on return this rank's share holds its part of U and of the
/// transformed b. `depth` is HPL's lookahead (0 or 1). `on_panel(columns done)` runs on every
/// rank after each panel.
#[allow(clippy::too_many_arguments)]
pub fn factor(
    m: &mut LocalMatrix,
    comm: &mut Comm,
    nbmin: usize,
    ndiv: usize,
    bcast: Broadcast,
    depth: usize,
    t: &mut Timings,
    mut on_panel: impl FnMut(usize),
) -> Result<()> {
    if depth > 1 {
        bail!("lookahead DEPTH {depth} is not implemented (DEPTH 0 and 1 are)");
    }
    let (n, nb, grid) = (m.n, m.nb, m.grid);
    if n == 0 {
        return Ok(());
    }
    let my_column = column_group(&grid, m.mycol);
    let my_row = row_group(&grid, m.myrow);
    let myrow = m.myrow;
    let root_in_row = move |j0: usize| grid.rank_at(myrow, owner(j0, nb, grid.q));
    // Seconds since the last lap, so every stretch of time lands in exactly one bucket.
    fn lap(clock: &mut Instant) -> f64 {
        let now = Instant::now();
        let s = (now - *clock).as_secs_f64();
        *clock = now;
        s
    }
    let mut clock = Instant::now();

    // The first panel has nothing to hide behind.
    let mut cur = Factored::new(m, 0);
    if m.mycol == owner(0, nb, grid.q) {
        factor_panel(m, comm, &my_column, &mut cur, nbmin, ndiv)?;
    }
    t.panel += lap(&mut clock);
    broadcast_panel(comm, &my_row, root_in_row(0), bcast, &mut cur)?;
    t.broadcast += lap(&mut clock);

    loop {
        let next_j0 = cur.j0 + cur.jb;
        let ct = m.cols_before(next_j0);
        let nq = m.nq;
        apply_pivots(m, comm, &cur, ct..nq)?;
        t.swap += lap(&mut clock);
        if next_j0 >= n {
            let u12 = solve_u12(m, comm, &my_column, &cur, ct..nq)?;
            update_trailing(m, &cur, ct..nq, &u12);
            t.update += lap(&mut clock);
            on_panel(n);
            return Ok(());
        }
        let mut next = Factored::new(m, next_j0);
        let owns_next = m.mycol == owner(next_j0, nb, grid.q);
        if depth == 0 {
            let u12 = solve_u12(m, comm, &my_column, &cur, ct..nq)?;
            update_trailing(m, &cur, ct..nq, &u12);
            t.update += lap(&mut clock);
            if owns_next {
                factor_panel(m, comm, &my_column, &mut next, nbmin, ndiv)?;
            }
            t.panel += lap(&mut clock);
            broadcast_panel(comm, &my_row, root_in_row(next_j0), bcast, &mut next)?;
            t.broadcast += lap(&mut clock);
        } else {
            // Lookahead. The process column owning the next panel brings only that panel's
            // columns up to date, factors it, and then updates the rest of its trailing
            // matrix; the other columns update all of theirs. The transports' sends and
            // receives block until both ends meet, so the panel travels on a second thread
            // meanwhile, alongside the update's matrix product (the one step that needs no
            // messages): its owner sends as soon as it is factored, the others receive it
            // while they update, and nobody waits for another's whole update.
            let u12 = solve_u12(m, comm, &my_column, &cur, ct..nq)?;
            let mut rest = ct;
            if owns_next {
                rest = m.cols_before(next_j0 + next.jb);
                update_trailing(m, &cur, ct..rest, &u12[..(rest - ct) * cur.jb]);
                t.update += lap(&mut clock);
                factor_panel(m, comm, &my_column, &mut next, nbmin, ndiv)?;
                t.panel += lap(&mut clock);
            }
            let u12_rest = &u12[(rest - ct) * cur.jb..];
            if next.in_place() {
                update_trailing(m, &cur, rest..nq, u12_rest);
                t.update += lap(&mut clock);
            } else {
                let root = root_in_row(next_j0);
                let moved = std::thread::scope(|s| {
                    let helper = s.spawn(|| broadcast_panel(comm, &my_row, root, bcast, &mut next));
                    update_trailing(m, &cur, rest..nq, u12_rest);
                    t.update += lap(&mut clock);
                    helper.join()
                });
                match moved {
                    Ok(r) => r?,
                    Err(panic) => std::panic::resume_unwind(panic),
                }
                t.broadcast += lap(&mut clock);
            }
        }
        on_panel(next_j0);
        cur = next;
    }
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
