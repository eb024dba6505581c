//! `tbbench hpl`: the HPL computation — a 2D block-cyclic, right-looking LU with partial
//! pivoting — on tbbench's runners, checked and reported the way netlib HPL does it.
//!
//! Laid out as netlib HPL is (STYLE.md): `input` reads HPL.dat, `generator` makes HPL's
//! matrix, `grid` holds the block-cyclic index maths, `matrix` a rank's share, `factor` the
//! driver (broadcasts, update and back substitution), `panel` the panel factorization (PFACT,
//! RFACT), `swap` the row interchanges (SWAP), `swap_solve` the swaps and U12's solve fused
//! for one process row, `packed_product` one rank's update product, `kernels` the local
//! dense kernels, `check` HPL's residual test, `suite` the runs and their results, `view` how
//! the report shows them. `mxp` is HPL-MxP, the mixed-precision solve, on the same grid.

pub mod check;
pub mod cli;
pub mod factor;
pub mod generator;
pub mod grid;
pub mod input;
pub mod kernels;
pub mod matrix;
pub mod mxp;
pub mod packed_product;
mod panel;
pub mod reference;
pub mod suite;
mod swap;
pub mod swap_solve;
#[cfg(test)]
mod tests;
pub mod view;

pub use suite::{HplConfig, HplSuite};
