//! `tbbench hpl-mxp`'s flags, its config, and its registration with the binary.

use super::{MxpConfig, MxpSuite, Precision};
use clap::{Args, CommandFactory, FromArgMatches, Parser};
use tbbench_runners::cli::{QuickPlan, QuickRun, Registration, RunArgs};

#[derive(Parser, Debug, Clone)]
#[command(
    name = "hpl-mxp",
    about = "HPL-MxP: the LU in low precision without pivoting, refined by GMRES to HPL's residual check"
)]
pub struct MxpCommand {
    #[command(flatten)]
    pub args: MxpArgs,
}

#[derive(Args, Debug, Clone)]
pub struct MxpArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// Order of the system.
    #[arg(long, default_value_t = 8000,
          value_parser = clap::value_parser!(u64).range(1..=crate::input::MAX_N as u64))]
    pub n: u64,
    /// Block size.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub nb: u64,
    /// Process grid rows (with --q; default: as square as possible, P <= Q).
    #[arg(long, requires = "q", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub p: Option<u64>,
    /// Process grid columns (with --p).
    #[arg(long, requires = "p", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub q: Option<u64>,
    /// The factorization's precision: fp32 (the BLAS's sgemm and strsm), bf16 or fp16 (the
    /// trailing update's operands in that format, FP32 accumulation: tbbench's AVX-512 BF16
    /// kernel where the CPU has it, else the rounded operands through sgemm).
    #[arg(long, default_value = "fp32", value_parser = Precision::parse)]
    pub precision: Precision,
    /// Threads per rank (default: the host's cores over its ranks).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub threads: Option<u64>,
    /// GMRES iterations before the solve is called FAILED.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=10000))]
    pub max_iterations: u64,
    /// Share of the smallest host's free memory the matrix may use.
    #[arg(long, default_value_t = 0.8)]
    pub mem_fraction: f64,
}

impl MxpArgs {
    pub fn config(&self) -> anyhow::Result<MxpConfig> {
        crate::cli::check_mem_fraction(self.mem_fraction)?;
        crate::cli::check_grid(self.p, self.q, self.run.nodes)?;
        Ok(MxpConfig {
            n: self.n as usize,
            nb: self.nb as usize,
            grid: self.p.zip(self.q).map(|(p, q)| (p as usize, q as usize)),
            precision: self.precision,
            threads: self.threads.map(|t| t as usize),
            max_iterations: self.max_iterations as usize,
            mem_fraction: self.mem_fraction,
        })
    }
}

/// The hpl-mxp suite as the binary lists it.
pub fn registration() -> Registration {
    Registration {
        name: "hpl-mxp",
        command: MxpCommand::command,
        run: |m, tool| {
            let a = MxpArgs::from_arg_matches(m)?;
            tbbench_runners::driver::run::<MxpSuite>(&a.config()?, &a.run.options(), tool)
        },
        quick: |plan: &QuickPlan| {
            let n = if plan.nodes > 4 { "4000" } else { "3000" };
            Ok(QuickRun {
                result: "hpl-mxp",
                args: vec!["--n".into(), n.into()],
            })
        },
    }
}
