//! HPL-MxP's system: HPL's random [A | b] (the same generator and seed, entries in
//! [−0.5, 0.5)), each diagonal entry then replaced by its row's sum of absolute values, so A is
//! diagonally dominant by rows and its LU needs no pivoting in any precision. b stays HPL's.

use crate::check;
use crate::generator::HPL_SEED;
use crate::grid::{owner, Grid};
use crate::matrix::{Layout, LocalMatrix};
use anyhow::Result;
use tbbench_runners::comm::{Comm, Group, ReduceOp};

/// One rank's double-precision share of A, b whole, and the norms HPL's residual needs.
pub struct Dominant {
    pub layout: Layout,
    /// The share, column-major (leading dimension `layout.lda`); its columns past A's are b's.
    pub a: Vec<f64>,
    /// b, whole, on every rank.
    pub b: Vec<f64>,
    /// ‖A‖∞ and ‖b‖∞.
    pub a_inf: f64,
    pub b_inf: f64,
}

impl Dominant {
    /// This rank's share (every rank calls it: the row sums are reduced over process rows).
    pub fn generate(comm: &mut Comm, n: usize, nb: usize, grid: Grid) -> Result<Dominant> {
        let rank = comm.rank();
        let LocalMatrix { layout: l, mut a } =
            LocalMatrix::generate(n, nb, grid.clone(), rank, HPL_SEED);
        let nqa = l.cols_before(n);
        // Row sums of |A| over this rank's columns, then over its process row.
        let mut sums = vec![0.0; l.mp];
        for c in 0..nqa {
            for (s, v) in sums.iter_mut().zip(&a[c * l.lda..c * l.lda + l.mp]) {
                *s += v.abs();
            }
        }
        let row: Vec<usize> = (0..grid.q).map(|c| grid.rank_at(l.myrow, c)).collect();
        comm.allreduce_f64_in(Group::Members(&row), &mut sums, ReduceOp::Sum)?;
        // The diagonal: a row's sum already counts its own |a_ii|, so the new diagonal
        // outweighs the rest of the row by |a_ii|'s replacement at least.
        let mut a_inf_local = 0.0f64;
        for (r, &s) in sums.iter().enumerate() {
            let g = l.global_row(r);
            if owner(g, nb, grid.q) == l.mycol {
                let c = l.cols_before(g);
                let old = a[c * l.lda + r];
                a[c * l.lda + r] = s;
                a_inf_local = a_inf_local.max(2.0 * s - old.abs());
            }
        }
        // b whole on every rank, from the process column that holds it.
        let mut b = vec![0.0; n];
        if owner(n, nb, grid.q) == l.mycol {
            let c = l.cols_before(n);
            for r in 0..l.mp {
                b[l.global_row(r)] = a[c * l.lda + r];
            }
        }
        comm.allreduce_f64(&mut b, ReduceOp::Sum)?;
        let mut norms = [a_inf_local];
        comm.allreduce_f64(&mut norms, ReduceOp::Max)?;
        let b_inf = b.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        Ok(Dominant {
            layout: l,
            a,
            b,
            a_inf: norms[0],
            b_inf,
        })
    }

    /// The share's A in single precision (columns of A only, the same leading dimension).
    pub fn to_single(&self) -> Vec<f32> {
        let l = &self.layout;
        let len = l.lda * l.cols_before(l.n);
        self.a[..len].iter().map(|&v| v as f32).collect()
    }

    /// ε·(‖A‖∞·‖x‖∞ + ‖b‖∞)·N: what HPL divides ‖Ax−b‖∞ by.
    pub fn denominator(&self, x_inf: f64) -> f64 {
        check::EPS * (self.a_inf * x_inf + self.b_inf) * self.layout.n as f64
    }

    /// HPL's scaled residual of x, from its residual vector r = b − A·x.
    pub fn scaled_residual(&self, r: &[f64], x: &[f64]) -> f64 {
        let inf = |v: &[f64]| v.iter().fold(0.0f64, |m, e| m.max(e.abs()));
        inf(r) / self.denominator(inf(x))
    }
}
