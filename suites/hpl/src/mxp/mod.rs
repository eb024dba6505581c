//! `tbbench hpl-mxp`: HPL-MxP (hpl-mxp.org) on tbbench's runners, beside hpl. The system is
//! HPL's random matrix made diagonally dominant (`dominant`); it is factored without pivoting
//! in a low precision on hpl's 2D block-cyclic grid (`factor`, with the single-precision
//! kernels of `kernels32`, the AVX-512 BF16 product of `bf16` and the 16-bit products of any
//! CPU in `rounded`), then solved to double-precision accuracy by GMRES preconditioned
//! with those factors (`refine`), and judged by HPL's scaled residual. The flop count is
//! HPL's (2/3·N³ + 3/2·N²) and the time is the whole solve's, refinement included (`suite`).

pub mod bf16;
pub mod cli;
pub mod dominant;
pub mod factor;
pub mod kernels32;
pub mod refine;
pub mod rounded;
pub mod suite;
pub mod view;

pub use suite::{MxpConfig, MxpSuite, Precision};

/// How the update's operands are rounded before sgemm, where `precision` runs its update so
/// (FP16; BF16 on a CPU without AVX-512 BF16) for a system of order `n`: the panels are then
/// rounded once a step, not once an update.
pub fn rounding(precision: Precision, n: usize) -> Option<rounded::Rounding> {
    match precision {
        Precision::Fp16 => Some(rounded::Rounding::fp16_for(n)),
        Precision::Bf16 if !bf16::available() => Some(rounded::Rounding {
            format: rounded::Format::Bf16,
            scale: 1.0,
        }),
        _ => None,
    }
}

/// The trailing update's packed or rounded operands, kept between steps so each reuses their
/// memory.
#[derive(Default)]
pub struct Scratch {
    pub bf16: bf16::Scratch,
    pub rounded: rounded::Scratch,
}
