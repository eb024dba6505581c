//! Every rank's input as a known function of rank and index, so every output element can be
//! checked exactly.
//!
//! Values are small integers (−2..2), and for the 16-bit types only every k-th rank
//! contributes at a given index, so no partial sum an algorithm forms leaves the range where
//! the type holds every integer: sums are then exact in any order, and a result compares
//! equal or is wrong. The pattern repeats every 5·k elements, so the expected reductions come
//! from a table of that length.

use tbbench_runners::comm::{Dtype, ReduceOp};

pub struct Input {
    /// Only ranks with (rank + index) divisible by k contribute at an index.
    k: usize,
    period: usize,
    /// Sum, max and min over all ranks for each index in one period.
    sum: Vec<f64>,
    max: Vec<f64>,
    min: Vec<f64>,
}

impl Input {
    pub fn new(ranks: usize, dtype: Dtype) -> Input {
        // At most 2 per contributing rank, with room for one more.
        let k = (2 * (ranks + 1))
            .div_ceil(dtype.exact_integers() as usize)
            .max(1);
        let period = 5 * k;
        let mut input = Input {
            k,
            period,
            sum: Vec::with_capacity(period),
            max: Vec::with_capacity(period),
            min: Vec::with_capacity(period),
        };
        for i in 0..period {
            let values: Vec<f64> = (0..ranks).map(|r| input.value(r, i)).collect();
            input.sum.push(values.iter().sum());
            input
                .max
                .push(values.iter().copied().fold(f64::MIN, f64::max));
            input
                .min
                .push(values.iter().copied().fold(f64::MAX, f64::min));
        }
        input
    }

    /// Rank `rank`'s input at index `i`.
    pub fn value(&self, rank: usize, i: usize) -> f64 {
        if !(rank + i).is_multiple_of(self.k) {
            return 0.0;
        }
        ((rank % 5 * 7 + i % 5 * 13) % 5) as f64 - 2.0
    }

    /// The reduction over every rank at index `i`.
    pub fn reduced(&self, op: ReduceOp, i: usize) -> f64 {
        let t = match op {
            ReduceOp::Sum => &self.sum,
            ReduceOp::Max => &self.max,
            ReduceOp::Min => &self.min,
        };
        t[i % self.period]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The largest partial sum any order could form stays exact in the type.
    #[test]
    fn sums_stay_exact_in_every_dtype_up_to_1024_ranks() {
        for dtype in Dtype::ALL {
            for ranks in [1, 2, 5, 128, 129, 300, 1024] {
                let input = Input::new(ranks, dtype);
                for i in 0..input.period {
                    let worst: f64 = (0..ranks).map(|r| input.value(r, i).abs()).sum();
                    assert!(
                        worst <= dtype.exact_integers(),
                        "{dtype:?} {ranks} ranks: {worst}"
                    );
                }
            }
        }
        // Inputs differ between ranks and neighbouring indices, so a misplaced block shows.
        let input = Input::new(4, Dtype::F32);
        assert_ne!(input.value(0, 0), input.value(1, 0));
        assert_ne!(input.value(0, 0), input.value(0, 1));
    }
}
