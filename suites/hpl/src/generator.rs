//! HPL's random matrix, entry for entry as netlib HPL 2.3 makes it (HPL_pdmatgen).
//!
//! The stream is a 31-bit linear congruential generator, X(n+1) = (a·X(n) + c) mod 2^31 with
//! a = 1103515245 and c = 12345 (HPL_MULT1·2^16 + HPL_MULT0, HPL_IADD), started at the seed
//! (100 for A and b in HPL's test driver). Entry (i, j) of the N × (N+1) matrix [A | b] is
//! number 1 + i + j·N of the stream, the matrix filled column after column, and its value is
//! 0.5 − X/2^31, in (−0.5, 0.5]. Any rank can generate any entry by jumping ahead in
//! O(log n), so no rank ever holds more than its own blocks.

const MULT: u64 = 1_103_515_245;
const ADD: u64 = 12_345;
const MASK: u64 = (1 << 31) - 1;
/// The seed netlib HPL's driver uses for [A | b].
pub const HPL_SEED: u64 = 100;

/// The constants (A, C) that jump `n` steps: X(k+n) = A·X(k) + C (mod 2^31).
fn jump(n: u64) -> (u64, u64) {
    let (mut a, mut c) = (1u64, 0u64);
    let (mut step_a, mut step_c) = (MULT, ADD);
    let mut n = n;
    while n > 0 {
        if n & 1 == 1 {
            a = (a * step_a) & MASK;
            c = (c * step_a + step_c) & MASK;
        }
        step_c = (step_c * step_a + step_c) & MASK;
        step_a = (step_a * step_a) & MASK;
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
    /// Positioned so that `next()` returns entry number `k` (0-based, column-major) of the
    /// matrix generated from `seed`.
    pub fn at(seed: u64, k: u64) -> Stream {
        let (a, c) = jump(k + 1);
        Stream {
            x: (a * (seed & MASK) + c) & MASK,
        }
    }

    pub fn next_value(&mut self) -> f64 {
        let v = 0.5 - self.x as f64 / 2147483648.0;
        self.x = (MULT * self.x + ADD) & MASK;
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
                x = (MULT * x + ADD) & MASK;
                0.5 - x as f64 / 2147483648.0
            })
            .collect()
    }

    #[test]
    fn first_entries_follow_the_lcg_from_seed_100() {
        // X1 = (1103515245·100 + 12345) mod 2^31: 110351536845 − 51·2^31 = 829870797.
        let x1 = (1_103_515_245u64 * 100 + 12_345) % (1 << 31);
        assert_eq!(x1, 829_870_797);
        assert_eq!(
            entry(HPL_SEED, 10, 0, 0),
            0.5 - 829_870_797.0 / 2147483648.0
        );
        let seq = naive(HPL_SEED, 300);
        for k in 0..300u64 {
            assert_eq!(
                entry(HPL_SEED, 15, k % 15, k / 15),
                seq[k as usize],
                "entry {k}"
            );
        }
    }

    #[test]
    fn jumps_agree_with_stepping_far_into_the_stream() {
        let mut x = 7u64;
        for _ in 0..100_000 {
            x = (MULT * x + ADD) & MASK;
        }
        let (a, c) = jump(100_000);
        assert_eq!((a * 7 + c) & MASK, x);
    }

    #[test]
    fn values_lie_in_hpl_interval() {
        for k in 0..10_000 {
            let v = entry(HPL_SEED, 100, k % 100, k / 100);
            assert!(v > -0.5 && v <= 0.5, "{v}");
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
