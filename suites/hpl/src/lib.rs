//! `tbbench hpl`: the HPL computation — a 2D block-cyclic, right-looking LU with partial
//! pivoting — on tbbench's runners, checked and reported the way netlib HPL does it.
//!
//! Laid out as netlib HPL is (STYLE.md): `input` reads HPL.dat, `generator` makes HPL's
//! matrix, `grid` holds the block-cyclic index maths, `check` is HPL's residual test. The
//! factorization, broadcasts and update come next (see issue 3's note).

pub mod check;
pub mod factor;
pub mod generator;
pub mod grid;
pub mod input;
pub mod kernels;
pub mod matrix;
pub mod reference;
#[cfg(test)]
mod tests;
