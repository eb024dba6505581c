//! HPL's random matrix, entry for entry as netlib HPL makes it (HPL_pdmatgen).
//!
//! The stream is a 64-bit linear congruential generator, X(n+1) = a·X(n) + 1 (mod 2^64) with
//! a = 6364136223846793005 (HPL_MULT1·2^32 + HPL_MULT0), started at the seed (100 for A and
//! b in HPL's test driver). Entry (i, j) of the N × (N+1) matrix [A | b] is number 1 + i + j·N
//! of the stream, the matrix filled column after column, and its value is 0.5 − X/2^64.
//! Checked against the norms Debian's hpcc (netlib HPL inside) prints for the same N. Any rank
//! can generate any entry by jumping ahead in O(log n), so no rank ever holds more than its
//! own blocks.

const MULT: u64 = 6_364_136_223_846_793_005;
const ADD: u64 = 1;
/// The seed netlib HPL's driver uses for [A | b].
pub const HPL_SEED: u64 = 100;

/// The constants (A, C) that jump `n` steps: X(k+n) = A·X(k) + C (mod 2^64).
fn jump(n: u64) -> (u64, u64) {
    let (mut a, mut c) = (1u64, 0u64);
    let (mut step_a, mut step_c) = (MULT, ADD);
    let mut n = n;
    while n > 0 {
        if n & 1 == 1 {
            a = a.wrapping_mul(step_a);
            c = c.wrapping_mul(step_a).wrapping_add(step_c);
        }
        step_c = step_c.wrapping_mul(step_a).wrapping_add(step_c);
        step_a = step_a.wrapping_mul(step_a);
        n >>= 1;
    }
    (a, c)
}

/// A position in HPL's stream that can step forward one number at a time.
#[derive(Debug, Clone, Copy)]
pub struct Stream {
    x: u64,
}

impl Stream {
    /// Positioned so that `next_value()` returns entry number `k` (0-based, column-major) of the
    /// matrix generated from `seed`.
    pub fn at(seed: u64, k: u64) -> Stream {
        let (a, c) = jump(k + 1);
        Stream {
            x: a.wrapping_mul(seed).wrapping_add(c),
        }
    }

    pub fn next_value(&mut self) -> f64 {
        let v = 0.5 - self.x as f64 / 18_446_744_073_709_551_616.0;
        self.x = self.x.wrapping_mul(MULT).wrapping_add(ADD);
        v
    }
}

/// Entry (i, j) of the matrix with `n` rows generated from `seed`.
pub fn entry(seed: u64, n: u64, i: u64, j: u64) -> f64 {
    Stream::at(seed, i + j * n).next_value()
}

/// Fills `out[r]` with entries `rows[r]` of column `j` (rows ascending, as a rank's local
/// rows of one column are), jumping only where the rows are not consecutive.
pub fn column(seed: u64, n: u64, j: u64, rows: &[u64], out: &mut [f64]) {
    let mut stream = Stream::at(seed, j * n);
    let mut next_row = 0;
    for (slot, &i) in out.iter_mut().zip(rows) {
        if i != next_row {
            stream = Stream::at(seed, i + j * n);
        }
        *slot = stream.next_value();
        next_row = i + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stream stepped one number at a time, the way HPL_rand walks it.
    fn naive(seed: u64, count: usize) -> Vec<f64> {
        let mut x = seed;
        (0..count)
            .map(|_| {
                x = x.wrapping_mul(MULT).wrapping_add(ADD);
                0.5 - x as f64 / 18_446_744_073_709_551_616.0
            })
            .collect()
    }

    #[test]
    fn entries_follow_the_stream_column_by_column() {
        let seq = naive(HPL_SEED, 300);
        for k in 0..300u64 {
            assert_eq!(
                entry(HPL_SEED, 15, k % 15, k / 15),
                seq[k as usize],
                "entry {k}"
            );
        }
        // X1 = 6364136223846793005·100 + 1 mod 2^64.
        let x1 = 6_364_136_223_846_793_005u64
            .wrapping_mul(100)
            .wrapping_add(1);
        assert_eq!(
            entry(HPL_SEED, 10, 0, 0),
            0.5 - x1 as f64 / 18_446_744_073_709_551_616.0
        );
    }

    #[test]
    fn norms_match_what_netlib_hpl_printed_for_n_100() {
        // Debian's hpcc 1.5 (HPLinpack 2.0), N=100, printed HPL_AnormI=28.5708,
        // HPL_Anorm1=27.7837, HPL_BnormI=0.49397 (6 significant digits).
        let n = 100u64;
        let a = |i, j| entry(HPL_SEED, n, i, j);
        let norm_inf = (0..n)
            .map(|i| (0..n).map(|j| a(i, j).abs()).sum::<f64>())
            .fold(0.0, f64::max);
        let norm_1 = (0..n)
            .map(|j| (0..n).map(|i| a(i, j).abs()).sum::<f64>())
            .fold(0.0, f64::max);
        let b_inf = (0..n).map(|i| a(i, n).abs()).fold(0.0, f64::max);
        assert!((norm_inf - 28.5708).abs() < 1e-4, "{norm_inf}");
        assert!((norm_1 - 27.7837).abs() < 1e-4, "{norm_1}");
        assert!((b_inf - 0.49397).abs() < 1e-5, "{b_inf}");
    }

    #[test]
    fn jumps_agree_with_stepping_far_into_the_stream() {
        let mut x = 7u64;
        for _ in 0..100_000 {
            x = x.wrapping_mul(MULT).wrapping_add(ADD);
        }
        let (a, c) = jump(100_000);
        assert_eq!(a.wrapping_mul(7).wrapping_add(c), x);
    }

    #[test]
    fn values_lie_in_hpl_interval() {
        for k in 0..10_000 {
            let v = entry(HPL_SEED, 100, k % 100, k / 100);
            assert!((-0.5..=0.5).contains(&v), "{v}");
        }
    }

    #[test]
    fn scattered_rows_of_a_column_match_single_entries() {
        let rows = [0u64, 1, 2, 7, 8, 20, 21, 22, 23, 40];
        let mut out = vec![0.0; rows.len()];
        column(HPL_SEED, 50, 13, &rows, &mut out);
        for (r, &i) in rows.iter().enumerate() {
            assert_eq!(out[r], entry(HPL_SEED, 50, i, 13));
        }
    }
}
