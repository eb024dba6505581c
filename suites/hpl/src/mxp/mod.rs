//! `tbbench hpl-mxp`: HPL-MxP (hpl-mxp.org) on tbbench's runners, beside hpl. The system is
//! HPL's random matrix made diagonally dominant (`dominant`); it is factored without pivoting
//! in a low precision on hpl's 2D block-cyclic grid (`factor`, with the single-precision
//! kernels of `kernels32` and the BF16 product of `bf16`), then solved to double-precision accuracy by GMRES preconditioned
//! with those factors (`refine`), and judged by HPL's scaled residual. The flop count is
//! HPL's (2/3·N³ + 3/2·N²) and the time is the whole solve's, refinement included (`suite`).

pub mod bf16;
pub mod cli;
pub mod dominant;
pub mod factor;
pub mod kernels32;
pub mod refine;
pub mod suite;
pub mod view;

pub use suite::{MxpConfig, MxpSuite, Precision};
