//! The single-precision kernels of HPL-MxP's factorization: the loaded BLAS's sgemm and strsm
//! where it has them (OpenBLAS, Accelerate), else Rust loops that run down columns so they
//! vectorize. Column-major; the blocks of one rank's share are addressed by pointer, since a
//! factorization reads one part of the share while it writes another.

use crate::kernels::blas;
use std::ffi::c_int;

/// Below this many multiply-adds a BLAS call costs more than it saves.
const BLAS_MIN_WORK: usize = 32 * 32 * 32;
/// Diagonal blocks at most this wide are factored by the plain loops.
const LEAF: usize = 32;

/// Which single-precision kernels run: the BLAS's name, or "rust".
pub fn name() -> String {
    match blas().filter(|b| b.sgemm.is_some() && b.strsm.is_some()) {
        Some(b) => format!("sgemm/strsm: {} {}", b.name, b.kernel),
        None => "sgemm/strsm: tbbench's Rust loops".to_string(),
    }
}

/// C[m×n] −= A[m×k] · B[k×n].
///
/// # Safety
/// Each pointer must address its block (leading dimensions as given, at least the rows) and
/// C must not overlap A or B.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_minus(
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
    gemm_minus_scaled(1.0, m, n, k, a, lda, b, ldb, c, ldc)
}

/// C[m×n] −= s · A[m×k] · B[k×n].
///
/// # Safety
/// As [`gemm_minus`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_minus_scaled(
    s: f32,
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
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    if let Some(f) = blas()
        .and_then(|l| l.sgemm)
        .filter(|_| m * n * k >= BLAS_MIN_WORK)
    {
        let (mi, ni, ki) = (m as c_int, n as c_int, k as c_int);
        let (la, lb, lc) = (lda as c_int, ldb as c_int, ldc as c_int);
        f(
            c"N".as_ptr(),
            c"N".as_ptr(),
            &mi,
            &ni,
            &ki,
            &-s,
            a,
            &la,
            b,
            &lb,
            &1.0,
            c,
            &lc,
        );
        return;
    }
    for j in 0..n {
        let cj = std::slice::from_raw_parts_mut(c.add(j * ldc), m);
        for p in 0..k {
            let bp = s * *b.add(j * ldb + p);
            if bp != 0.0 {
                let ap = std::slice::from_raw_parts(a.add(p * lda), m);
                for (ci, ai) in cj.iter_mut().zip(ap) {
                    *ci -= ai * bp;
                }
            }
        }
    }
}

/// y += A[m×n]·x in single precision (the BLAS's sgemv where it has one).
pub fn gemv_add(m: usize, n: usize, a: &[f32], lda: usize, x: &[f32], y: &mut [f32]) {
    crate::kernels::gemv_with(blas().and_then(|b| b.sgemv), 1.0f32, m, n, a, lda, x, y)
}

/// B[k×n] ← L⁻¹·B, L the unit lower triangle of A[k×k] (the row panel U12 of a step).
///
/// # Safety
/// As [`gemm_minus`]; A and B must not overlap.
pub unsafe fn trsm_left_lower_unit(
    k: usize,
    n: usize,
    a: *const f32,
    lda: usize,
    b: *mut f32,
    ldb: usize,
) {
    if k == 0 || n == 0 {
        return;
    }
    if let Some(f) = blas()
        .and_then(|l| l.strsm)
        .filter(|_| k * k * n >= BLAS_MIN_WORK)
    {
        let (ki, ni, la, lb) = (k as c_int, n as c_int, lda as c_int, ldb as c_int);
        f(
            c"L".as_ptr(),
            c"L".as_ptr(),
            c"N".as_ptr(),
            c"U".as_ptr(),
            &ki,
            &ni,
            &1.0,
            a,
            &la,
            b,
            &lb,
        );
        return;
    }
    for j in 0..n {
        let bj = std::slice::from_raw_parts_mut(b.add(j * ldb), k);
        for p in 0..k {
            let v = bj[p];
            if v != 0.0 {
                for (i, bi) in bj.iter_mut().enumerate().skip(p + 1) {
                    *bi -= *a.add(p * lda + i) * v;
                }
            }
        }
    }
}

/// B[m×k] ← B·U⁻¹, U the upper triangle (diagonal included) of A[k×k] (the column panel L21
/// of a step).
///
/// # Safety
/// As [`trsm_left_lower_unit`].
pub unsafe fn trsm_right_upper(
    m: usize,
    k: usize,
    a: *const f32,
    lda: usize,
    b: *mut f32,
    ldb: usize,
) {
    if m == 0 || k == 0 {
        return;
    }
    if let Some(f) = blas()
        .and_then(|l| l.strsm)
        .filter(|_| m * k * k >= BLAS_MIN_WORK)
    {
        let (mi, ki, la, lb) = (m as c_int, k as c_int, lda as c_int, ldb as c_int);
        f(
            c"R".as_ptr(),
            c"U".as_ptr(),
            c"N".as_ptr(),
            c"N".as_ptr(),
            &mi,
            &ki,
            &1.0,
            a,
            &la,
            b,
            &lb,
        );
        return;
    }
    // Column j of X: (B_j − Σ_{p<j} X_p·U[p,j]) / U[j,j].
    for j in 0..k {
        for p in 0..j {
            let u = *a.add(j * lda + p);
            if u != 0.0 {
                for i in 0..m {
                    *b.add(j * ldb + i) -= *b.add(p * ldb + i) * u;
                }
            }
        }
        let d = *a.add(j * lda + j);
        for i in 0..m {
            *b.add(j * ldb + i) /= d;
        }
    }
}

/// A[n×n] ← L\U in place, without pivoting (HPL-MxP's matrix is diagonally dominant):
/// recursive halves, so most of the work is in [`gemm_minus`].
///
/// # Safety
/// `a` must address n columns of `lda` ≥ n values.
pub unsafe fn getrf_nopiv(n: usize, a: *mut f32, lda: usize) {
    if n <= LEAF {
        for p in 0..n {
            let d = *a.add(p * lda + p);
            for i in p + 1..n {
                *a.add(p * lda + i) /= d;
            }
            for j in p + 1..n {
                let u = *a.add(j * lda + p);
                if u != 0.0 {
                    for i in p + 1..n {
                        *a.add(j * lda + i) -= *a.add(p * lda + i) * u;
                    }
                }
            }
        }
        return;
    }
    let n1 = n / 2;
    let n2 = n - n1;
    let a12 = a.add(n1 * lda);
    let a21 = a.add(n1);
    let a22 = a.add(n1 * lda + n1);
    getrf_nopiv(n1, a, lda);
    trsm_left_lower_unit(n1, n2, a, lda, a12, lda);
    trsm_right_upper(n2, n1, a, lda, a21, lda);
    gemm_minus(n2, n2, n1, a21, lda, a12, lda, a22, lda);
    getrf_nopiv(n2, a22, lda);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small diagonally dominant matrix, factored, multiplies back to itself.
    #[test]
    fn lu_without_pivoting_multiplies_back() {
        for n in [1, 7, 33, 100] {
            let mut a = vec![0f32; n * n];
            let mut x = 12345u64;
            for v in a.iter_mut() {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                *v = 0.5 - (x >> 40) as f32 / (1u64 << 24) as f32;
            }
            for i in 0..n {
                a[i * n + i] = n as f32;
            }
            let orig = a.clone();
            unsafe { getrf_nopiv(n, a.as_mut_ptr(), n) };
            for i in 0..n {
                for j in 0..n {
                    let mut s = 0f64;
                    for p in 0..=i.min(j) {
                        let l = if p == i { 1.0 } else { a[p * n + i] as f64 };
                        s += l * a[j * n + p] as f64;
                    }
                    let want = orig[j * n + i] as f64;
                    assert!(
                        (s - want).abs() < 1e-4 * n as f64,
                        "n {n} ({i},{j}): {s} vs {want}"
                    );
                }
            }
        }
    }
}
