//! `tbbench hpl`'s flags, its config, and its registration with the binary.

use crate::{HplConfig, HplSuite};
use clap::{Args, CommandFactory, FromArgMatches, Parser};
use tbbench_runners::cli::{QuickPlan, QuickRun, Registration, RunArgs};
use tbbench_runners::units;

/// The subcommand: its help line and flags.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "hpl",
    about = "A distributed FP64 LU solve, HPL-style, with HPL's residual check and result line"
)]
pub struct HplCommand {
    #[command(flatten)]
    pub args: HplArgs,
}

#[derive(Args, Debug, Clone)]
pub struct HplArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// Order of the system (default: from memory, see --mem-fraction and --max-minutes).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=crate::input::MAX_N as u64))]
    pub n: Option<u64>,
    /// Block size (default: the fastest of 128, 192, 256 and 384, measured on the run's grid
    /// just before it; the result says which ran and how it was chosen).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub nb: Option<u64>,
    /// Process grid rows (with --q; default: as square as possible, P <= Q).
    #[arg(long, requires = "q", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub p: Option<u64>,
    /// Process grid columns (with --p).
    #[arg(long, requires = "p", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub q: Option<u64>,
    /// netlib HPL's input file: run every combination it lists.
    #[arg(long, conflicts_with_all = ["n", "p", "q", "depth"])]
    pub dat: Option<std::path::PathBuf>,
    /// Lookahead: panels factored ahead of the trailing update, as HPL.dat's DEPTH
    /// (default: 1 with more than one process column or on one rank, else 0).
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=64))]
    pub depth: Option<u64>,
    /// Share of the smallest host's free memory the matrix may use when N is not given.
    #[arg(long, default_value_t = 0.8)]
    pub mem_fraction: f64,
    /// When N is not given: keep the estimated run under this many minutes.
    #[arg(long, default_value_t = 10.0)]
    pub max_minutes: f64,
    /// Threads per rank (default: the host's cores over its ranks).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub threads: Option<u64>,
    /// Skip the single-rank DGEMM measurement that efficiency is quoted against.
    #[arg(long)]
    pub no_dgemm_probe: bool,
}

impl HplArgs {
    /// The suite's config; HPL.dat combinations this build does not run are listed, not
    /// silently replaced.
    pub fn config(&self) -> anyhow::Result<HplConfig> {
        use crate::input::HplDat;
        crate::swap_solve::forced().map_err(anyhow::Error::msg)?;
        crate::packed_product::forced().map_err(anyhow::Error::msg)?;
        crate::packed_product::forced_kernel().map_err(anyhow::Error::msg)?;
        check_mem_fraction(self.mem_fraction)?;
        if !(self.max_minutes > 0.0 && self.max_minutes <= units::MAX_DURATION_S / 60.0) {
            anyhow::bail!(
                "--max-minutes must be above 0 and at most {} (7 days), not {}",
                units::MAX_DURATION_S / 60.0,
                self.max_minutes
            );
        }
        let (runs, notes) = match &self.dat {
            Some(path) => {
                let dat = HplDat::read(path)?;
                (dat.variants(), dat.storage_notes())
            }
            None => (Vec::new(), Vec::new()),
        };
        // The grid and the threads are planned on the ranks, which know the run's real size
        // and hosts; a grid that cannot match `--nodes` is still refused here.
        check_grid(self.p, self.q, self.run.nodes)?;
        Ok(HplConfig {
            runs,
            n: self.n.map(|n| n as usize),
            nb: self.nb.map(|nb| nb as usize),
            grid: self.p.zip(self.q).map(|(p, q)| (p as usize, q as usize)),
            mem_fraction: self.mem_fraction,
            auto_time_budget_s: self.max_minutes * 60.0,
            threads: self.threads.map(|t| t as usize),
            dgemm_probe: !self.no_dgemm_probe,
            dat: self.dat.as_ref().map(|p| p.display().to_string()),
            depth: self.depth.map(|d| d as usize),
            notes,
            map: crate::grid::ProcessMap::RowMajor,
            order: None,
        })
    }
}

/// `--mem-fraction`: above 0, at most 1 (hpl and hpl-mxp).
pub(crate) fn check_mem_fraction(f: f64) -> anyhow::Result<()> {
    if !(f > 0.0 && f <= 1.0) {
        anyhow::bail!("--mem-fraction must be above 0 and at most 1, not {f}");
    }
    Ok(())
}

/// `--p`/`--q` against `--nodes`, before any rank starts (hpl and hpl-mxp); under mpirun and
/// srun the ranks check the grid against the launcher's size instead.
pub(crate) fn check_grid(p: Option<u64>, q: Option<u64>, nodes: usize) -> anyhow::Result<()> {
    let launched = tbbench_runners::driver::size_from_launcher();
    if let (Some(p), Some(q), None) = (p, q, launched) {
        if p.checked_mul(q) != Some(nodes as u64) {
            anyhow::bail!(
                "--p {p} --q {q} is a grid of {} ranks, but --nodes is {nodes}",
                p as u128 * q as u128
            );
        }
    }
    Ok(())
}

/// The hpl suite as the binary lists it.
pub fn registration() -> Registration {
    Registration {
        name: "hpl",
        command: HplCommand::command,
        run: |m, tool| {
            let a = HplArgs::from_arg_matches(m)?;
            tbbench_runners::driver::run::<HplSuite>(&a.config()?, &a.run.options(), tool)
        },
        // N=3000 takes about a second with a BLAS and half a minute on the Rust fallback
        // kernels of a slow machine; the DGEMM probe gives the efficiency column its meaning.
        quick: |plan: &QuickPlan| {
            let n = if plan.nodes > 4 { "4000" } else { "3000" };
            // NB given: the NB probe would take as long as the quick run's own solve.
            Ok(QuickRun {
                result: "hpl",
                args: vec!["--n".into(), n.into(), "--nb".into(), "192".into()],
            })
        },
    }
}
