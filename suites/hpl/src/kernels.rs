//! The local dense kernels the factorization calls, in one place so a BLAS can take them
//! over (issue 3: OpenBLAS/Accelerate, with these as the fallback where none is installed).
//! Column-major throughout; inner loops run down columns so they vectorize.

/// C[m×n] −= A[m×k] · B[k×n].
#[allow(clippy::too_many_arguments)]
pub fn gemm_minus(
    m: usize,
    n: usize,
    k: usize,
    a: &[f64],
    lda: usize,
    b: &[f64],
    ldb: usize,
    c: &mut [f64],
    ldc: usize,
) {
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    for j in 0..n {
        let cj = &mut c[j * ldc..j * ldc + m];
        for p in 0..k {
            let bpj = b[j * ldb + p];
            if bpj != 0.0 {
                let ap = &a[p * lda..p * lda + m];
                for (ci, ai) in cj.iter_mut().zip(ap) {
                    *ci -= ai * bpj;
                }
            }
        }
    }
}

/// B[k×n] ← L⁻¹·B with L the unit lower triangle of a[k×k] (forward substitution).
pub fn trsm_unit_lower(k: usize, n: usize, a: &[f64], lda: usize, b: &mut [f64], ldb: usize) {
    for j in 0..n {
        let bj = &mut b[j * ldb..j * ldb + k];
        for p in 0..k {
            let v = bj[p];
            if v != 0.0 {
                for i in p + 1..k {
                    bj[i] -= a[p * lda + i] * v;
                }
            }
        }
    }
}

/// x ← U⁻¹·x with U the upper triangle (diagonal included) of a[k×k].
pub fn trsv_upper(k: usize, a: &[f64], lda: usize, x: &mut [f64]) {
    for p in (0..k).rev() {
        x[p] /= a[p * lda + p];
        let v = x[p];
        for i in 0..p {
            x[i] -= a[p * lda + i] * v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_matches_a_hand_product() {
        // A = [1 2; 3 4] (column-major [1,3,2,4]), B = [5; 6], C = [10; 20].
        let mut c = [10.0, 20.0];
        gemm_minus(2, 1, 2, &[1.0, 3.0, 2.0, 4.0], 2, &[5.0, 6.0], 2, &mut c, 2);
        assert_eq!(c, [10.0 - 17.0, 20.0 - 39.0]);
    }

    #[test]
    fn triangular_solves_invert_their_products() {
        // L = [1 0; 2 1], U = [2 1; 0 4].
        let l = [1.0, 2.0, 0.0, 1.0];
        let mut b = [3.0, 10.0]; // L·[3, 4]
        trsm_unit_lower(2, 1, &l, 2, &mut b, 2);
        assert_eq!(b, [3.0, 4.0]);
        let u = [2.0, 0.0, 1.0, 4.0];
        let mut x = [10.0, 8.0]; // U·[4, 2]
        trsv_upper(2, &u, 2, &mut x);
        assert_eq!(x, [4.0, 2.0]);
    }
}
