//! HPL-MxP's refinement: GMRES in double precision, preconditioned (on the right) by the
//! single-precision factors, restarted every `RESTART` iterations, until HPL's scaled residual
//! ‖Ax−b‖∞ / (ε·(‖A‖∞·‖x‖∞ + ‖b‖∞)·N) is below the threshold, as HPL-MxP's rules ask.
//!
//! Vectors of length N are held whole on every rank (N doubles: 0.8 MB at N = 100 000) and
//! every rank runs the same arithmetic on them, so they stay identical without being sent:
//! A·x is each rank's block product summed over all ranks (one all-reduce of N doubles), and
//! the preconditioner's triangular solves go block by block, the partial sums of a block row
//! reduced over its process row and the solved block broadcast to every rank.

use super::dominant::Dominant;
use super::kernels32 as k32;
use crate::check;
use crate::grid::owner;
use crate::kernels;
use anyhow::Result;
use tbbench_runners::comm::{f64_bytes_mut, Comm, Group, ReduceOp};

/// Krylov vectors kept before a restart.
pub const RESTART: usize = 30;

/// How the refinement went.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Refined {
    pub x: Vec<f64>,
    /// GMRES iterations (each one preconditioner solve and one product with A).
    pub iterations: usize,
    /// Restarts (outer loops after the first).
    pub restarts: usize,
    /// The scaled residual after each GMRES cycle.
    pub history: Vec<f64>,
    /// Seconds the passing residual's computation took: HPL's check, not part of the solve.
    pub check_s: f64,
}

/// The rank's factors and its double-precision share, with the norms the residual needs.
pub struct System<'a> {
    /// L\U in single precision (leading dimension `a.layout.lda`).
    pub factors: &'a [f32],
    pub a: &'a Dominant,
}

impl System<'_> {
    /// y = A·x (every rank's block product, summed).
    fn product(&self, comm: &mut Comm, x: &[f64]) -> Result<Vec<f64>> {
        let l = &self.a.layout;
        let nqa = l.cols_before(l.n);
        let xl: Vec<f64> = (0..nqa).map(|c| x[l.global_col(c)]).collect();
        let mut yl = vec![0.0; l.mp];
        kernels::gemv_add(l.mp, nqa, &self.a.a, l.lda, &xl, &mut yl);
        let mut y = vec![0.0; l.n];
        for (r, v) in yl.iter().enumerate() {
            y[l.global_row(r)] = *v;
        }
        comm.allreduce_f64(&mut y, ReduceOp::Sum)?;
        Ok(y)
    }

    /// z = U⁻¹·L⁻¹·r with the single-precision factors: the blocks' partial sums in single
    /// precision (a preconditioner, as HPL-MxP applies its factors in their own precision),
    /// each diagonal block's solve in double.
    fn precondition(&self, comm: &mut Comm, r: &[f64]) -> Result<Vec<f64>> {
        let y = self.sweep(comm, r, false)?;
        self.sweep(comm, &y, true)
    }

    /// One triangular solve over the grid: forward with the unit lower triangle, or backward
    /// with the upper one. A block row's partial sums (its blocks times the solved blocks, on
    /// the ranks that hold them) are reduced over its process row, the rank holding the
    /// diagonal block solves it, and broadcasts it to every rank.
    fn sweep(&self, comm: &mut Comm, rhs: &[f64], upper: bool) -> Result<Vec<f64>> {
        let l = &self.a.layout;
        let (n, nb, grid, lda, f) = (l.n, l.nb, l.grid.clone(), l.lda, self.factors);
        let row: Vec<usize> = (0..grid.q).map(|c| grid.rank_at(l.myrow, c)).collect();
        let mut x = vec![0.0; n];
        let mut partial = vec![0f32; l.mp];
        let mut xk32 = vec![0f32; nb];
        let blocks: Vec<usize> = (0..n).step_by(nb).collect();
        let order: Box<dyn Iterator<Item = &usize>> = if upper {
            Box::new(blocks.iter().rev())
        } else {
            Box::new(blocks.iter())
        };
        let mut xk = vec![0.0; nb];
        for &g0 in order {
            let kb = nb.min(n - g0);
            let (prow, pcol) = (owner(g0, nb, grid.p), owner(g0, nb, grid.q));
            let (lr0, lc0) = (l.rows_before(g0), l.cols_before(g0));
            let xk = &mut xk[..kb];
            if l.myrow == prow {
                for (v, p) in xk.iter_mut().zip(&partial[lr0..lr0 + kb]) {
                    *v = *p as f64;
                }
                if grid.q > 1 {
                    comm.allreduce_f64_in(Group::Members(&row), xk, ReduceOp::Sum)?;
                }
                if l.mycol == pcol {
                    for (i, v) in xk.iter_mut().enumerate() {
                        *v = rhs[g0 + i] - *v;
                    }
                    let at = |i: usize, j: usize| f[(lc0 + j) * lda + lr0 + i] as f64;
                    if upper {
                        for p in (0..kb).rev() {
                            xk[p] /= at(p, p);
                            let v = xk[p];
                            for (i, xi) in xk[..p].iter_mut().enumerate() {
                                *xi -= at(i, p) * v;
                            }
                        }
                    } else {
                        for p in 0..kb {
                            let v = xk[p];
                            for (i, xi) in xk.iter_mut().enumerate().skip(p + 1) {
                                *xi -= at(i, p) * v;
                            }
                        }
                    }
                }
            }
            comm.bcast(grid.rank_at(prow, pcol), f64_bytes_mut(xk))?;
            x[g0..g0 + kb].copy_from_slice(xk);
            // This block's share of the block rows still to solve (below it going forward,
            // above it going back), on the process column that holds it.
            if l.mycol == pcol {
                let rows = if upper {
                    0..lr0
                } else {
                    l.rows_before(g0 + kb)..l.mp
                };
                let x32 = &mut xk32[..kb];
                for (s, v) in x32.iter_mut().zip(xk.iter()) {
                    *s = *v as f32;
                }
                if !rows.is_empty() {
                    let at = lc0 * lda + rows.start;
                    k32::gemv_add(rows.len(), kb, &f[at..], lda, x32, &mut partial[rows]);
                }
            }
        }
        Ok(x)
    }

    /// HPL's scaled residual of x, and ‖b − A·x‖'s vector.
    fn residual(&self, comm: &mut Comm, x: &[f64]) -> Result<(f64, Vec<f64>)> {
        let ax = self.product(comm, x)?;
        let r: Vec<f64> = self.a.b.iter().zip(&ax).map(|(b, y)| b - y).collect();
        let scaled = self.a.scaled_residual(&r, x);
        Ok((scaled, r))
    }
}

/// Solves A·x = b by GMRES from x = 0 (its first iteration is the factors' own solve, scaled),
/// until the scaled residual is below `threshold` or `max_iterations` have run (the caller
/// reports FAILED then). Each cycle ends where its own estimate of ‖r‖₂ is a tenth of what
/// passes; the true residual is then computed, and where it passes, the time that took is
/// returned apart (`check_s`), as HPL times its solve without its check.
pub fn solve(
    comm: &mut Comm,
    sys: &System,
    threshold: f64,
    max_iterations: usize,
) -> Result<Refined> {
    let n = sys.a.layout.n;
    let mut x = vec![0.0; n];
    let mut r = sys.a.b.clone();
    let mut history = Vec::new();
    let (mut iterations, mut restarts, mut check_s) = (0, 0, 0.0);
    loop {
        let beta = norm2(&r);
        let mut v: Vec<Vec<f64>> = vec![r.iter().map(|e| e / beta).collect()];
        let mut z: Vec<Vec<f64>> = Vec::new();
        // Hessenberg columns, already rotated; the rotations; the rotated right-hand side.
        let mut h: Vec<Vec<f64>> = Vec::new();
        let (mut cs, mut sn): (Vec<f64>, Vec<f64>) = (Vec::new(), Vec::new());
        let mut g = vec![beta];
        let mut target = None;
        for j in 0..RESTART.min(n) {
            let zj = sys.precondition(comm, &v[j])?;
            let mut w = sys.product(comm, &zj)?;
            z.push(zj);
            iterations += 1;
            // Modified Gram-Schmidt.
            let mut hj = vec![0.0; j + 2];
            for (i, vi) in v.iter().enumerate() {
                hj[i] = dot(&w, vi);
                for (wk, vk) in w.iter_mut().zip(vi) {
                    *wk -= hj[i] * vk;
                }
            }
            hj[j + 1] = norm2(&w);
            // The earlier rotations, then this column's own.
            for i in 0..j {
                let t = cs[i] * hj[i] + sn[i] * hj[i + 1];
                hj[i + 1] = -sn[i] * hj[i] + cs[i] * hj[i + 1];
                hj[i] = t;
            }
            let rho = hj[j].hypot(hj[j + 1]);
            let (c, s) = if rho == 0.0 {
                (1.0, 0.0)
            } else {
                (hj[j] / rho, hj[j + 1] / rho)
            };
            let next_norm = hj[j + 1];
            hj[j] = rho;
            hj[j + 1] = 0.0;
            cs.push(c);
            sn.push(s);
            g.push(-s * g[j]);
            g[j] *= c;
            h.push(hj);
            // What passes depends on ‖x‖∞: the one-iteration solution's stands in for it.
            let target = *target.get_or_insert_with(|| {
                let x_inf = x.iter().zip(&z[0]).fold(0.0f64, |m, (xe, ze)| {
                    m.max((xe + ze * g[0] / h[0][0]).abs())
                });
                0.1 * threshold * sys.a.denominator(x_inf)
            });
            let happy = next_norm == 0.0;
            if !happy {
                v.push(w.iter().map(|e| e / next_norm).collect());
            }
            if happy || g[j + 1].abs() <= target || iterations >= max_iterations {
                break;
            }
        }
        // y from the triangle, then x += Z·y.
        let k = h.len();
        let mut y = vec![0.0; k];
        for i in (0..k).rev() {
            let mut s = g[i];
            for (jj, yj) in y.iter().enumerate().skip(i + 1) {
                s -= h[jj][i] * yj;
            }
            y[i] = s / h[i][i];
        }
        for (zj, yj) in z.iter().zip(&y) {
            for (xe, ze) in x.iter_mut().zip(zj) {
                *xe += yj * ze;
            }
        }
        let checked = std::time::Instant::now();
        let (scaled, next) = sys.residual(comm, &x)?;
        history.push(scaled);
        if check::passed(scaled, threshold) {
            check_s = checked.elapsed().as_secs_f64();
            break;
        }
        if iterations >= max_iterations || !scaled.is_finite() {
            break;
        }
        restarts += 1;
        r = next;
    }
    Ok(Refined {
        x,
        iterations,
        restarts,
        history,
        check_s,
    })
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn norm2(a: &[f64]) -> f64 {
    dot(a, a).sqrt()
}
