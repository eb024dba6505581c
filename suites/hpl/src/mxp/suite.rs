//! The hpl-mxp suite: one solve of HPL-MxP's system on the run's grid, timed from the
//! factorization's start to the refinement's end on the slowest rank, checked with HPL's
//! scaled residual, printed as HPL prints and recorded with the refinement's iterations.

use super::dominant::Dominant;
use super::factor::{self, FactorTimes};
use super::kernels32;
use super::refine::{self, System};
use super::rounded::Format;
use crate::check;
use crate::grid::{numroc, Grid, ProcessMap};
use crate::kernels;
use anyhow::{bail, Result};
use serde::Serialize;
use std::time::Instant;
use tbbench_runners::comm::ReduceOp;
use tbbench_runners::suite::{Context, Suite, SuiteOutput};
use tbbench_schema::Check;

/// The precision the factorization runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// IEEE single: sgemm and strsm of the loaded BLAS.
    Fp32,
    /// The trailing update's operands rounded to BF16, products accumulated in FP32
    /// (AVX-512 BF16's kernel, else the rounded operands through sgemm); the trailing matrix,
    /// the diagonal blocks and the panels stay FP32.
    Bf16,
    /// As Bf16 in IEEE binary16 (11 significant bits, range to 65504), through sgemm.
    Fp16,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
        }
    }
    pub fn parse(s: &str) -> Result<Precision, String> {
        match s {
            "fp32" => Ok(Precision::Fp32),
            "bf16" => Ok(Precision::Bf16),
            "fp16" => Ok(Precision::Fp16),
            _ => Err(format!(
                "'{s}' is not a precision tbbench factors in (fp32, bf16, fp16)"
            )),
        }
    }
    /// The T/V column of the result line.
    fn code(self) -> &'static str {
        match self {
            Precision::Fp32 => "MXP-FP32",
            Precision::Bf16 => "MXP-BF16",
            Precision::Fp16 => "MXP-FP16",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct MxpConfig {
    pub n: usize,
    pub nb: usize,
    /// `--p`/`--q`; None: the squarest grid of the run's size.
    pub grid: Option<(usize, usize)>,
    pub precision: Precision,
    /// `--threads`; None: this host's cores over the ranks on this host.
    pub threads: Option<usize>,
    /// GMRES iterations before the solve is called FAILED.
    pub max_iterations: usize,
    /// Share of a host's available memory the shares may take.
    pub mem_fraction: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct MxpRun {
    pub code: &'static str,
    pub n: usize,
    pub nb: usize,
    pub p: usize,
    pub q: usize,
    pub precision: Precision,
    /// The slowest rank's factorization + refinement, seconds (what Gflops are over).
    pub time_s: f64,
    /// Rank 0's split of that time.
    pub factor_s: f64,
    pub refine_s: f64,
    /// HPL's operation count over the time: 2/3·N³ + 3/2·N², whatever the precision.
    pub gflops: f64,
    pub iterations: usize,
    pub restarts: usize,
    /// The scaled residual after each GMRES cycle.
    pub history: Vec<f64>,
    pub resid: f64,
    pub threshold: f64,
    pub passed: bool,
    pub norms: crate::suite::Norms,
    /// Each rank's factorization split.
    pub per_rank: Vec<FactorTimes>,
}

pub struct MxpSuite;

/// HPL's threshold for the scaled residual.
const THRESHOLD: f64 = 16.0;

impl Suite for MxpSuite {
    const NAME: &'static str = "hpl-mxp";
    type Config = MxpConfig;

    /// Runs on a partial cabling where its grid's rows and columns are cabled, as hpl does
    /// (`crate::suite::on_the_cables`): its row and column broadcasts and all-reduces keep
    /// to the cables (round a ring where a row is cabled only between neighbours).
    fn needs_every_pair(_config: &MxpConfig) -> bool {
        false
    }

    fn run(config: &MxpConfig, ctx: &mut Context) -> Result<Option<SuiteOutput>> {
        let ranks = ctx.size();
        let rank = ctx.rank();
        let grid = match config.grid {
            Some((p, q)) if p * q != ranks => {
                bail!("grid {p}x{q} needs {} ranks, this run has {ranks}", p * q)
            }
            Some((p, q)) => Grid::new(p, q, ProcessMap::RowMajor),
            None => Grid::squarest(ranks, ProcessMap::RowMajor),
        };
        // On a partial cabling (a ring), every process row and column on cables.
        let mut ring_note = None;
        let grid = match ctx
            .network
            .topology
            .as_ref()
            .filter(|t| !t.unlinked.is_empty())
        {
            Some(t) => {
                let ring = ctx.comm.ring_order().map(|r| r.to_vec());
                let asked = config.grid.is_some();
                let (g, on) =
                    crate::suite::on_the_cables(grid, &t.unlinked, ring.as_deref(), asked)?;
                if on == crate::suite::OnCables::Neighbours {
                    ring_note = Some(crate::suite::round_the_ring_note(&g));
                }
                g
            }
            None => grid,
        };
        check_memory(config, &grid, ctx)?;
        let threads = config.threads.unwrap_or_else(|| ctx.threads_per_rank());
        kernels::set_threads(threads);
        let mut warnings = Vec::new();
        if let Some(note) = ring_note {
            if rank == 0 {
                eprintln!("tbbench: note: {note}");
            }
            warnings.push(note);
        }
        crate::suite::record_blas(ctx, &mut warnings)?;
        let through_sgemm = |format: Format| {
            format!(
                "update: {} operands (rounded to nearest even by {}), FP32 sums by the {}",
                match format {
                    Format::Bf16 => "BF16",
                    Format::Fp16 => "FP16",
                },
                format.rounder(),
                kernels32::name()
            )
        };
        let kernel = match config.precision {
            Precision::Fp32 => kernels32::name(),
            Precision::Bf16 if super::bf16::available() => format!(
                "update: {}; panels: {}",
                super::bf16::NAME,
                kernels32::name()
            ),
            Precision::Bf16 => {
                // On Apple silicon sgemm (Accelerate's, on the matrix unit) is the fast path.
                if cfg!(target_arch = "x86_64") {
                    warnings.push(format!(
                        "{}'s CPU has no AVX-512 BF16: the BF16 operands go through sgemm (BF16's arithmetic at FP32's speed)",
                        ctx.rank_hosts[rank]
                    ));
                }
                through_sgemm(Format::Bf16)
            }
            Precision::Fp16 => through_sgemm(Format::Fp16),
        };
        let (n, nb) = (config.n, config.nb);

        let sys = Dominant::generate(&mut ctx.comm, n, nb, grid.clone())?;
        let mut lu = sys.to_single();
        ctx.comm.barrier()?;
        let start = Instant::now();
        let mut ft = FactorTimes::default();
        factor::factor(
            &mut ctx.comm,
            &sys.layout,
            &mut lu,
            config.precision,
            &mut ft,
        )?;
        let factor_s = start.elapsed().as_secs_f64();
        let refined = refine::solve(
            &mut ctx.comm,
            &System {
                factors: &lu,
                a: &sys,
            },
            THRESHOLD,
            config.max_iterations,
        )?;
        // The solve's time, the passing residual's check left out (as HPL times it).
        let mut wall = [start.elapsed().as_secs_f64() - refined.check_s];
        ctx.comm.allreduce_f64(&mut wall, ReduceOp::Max)?;
        let refine_s = wall[0] - factor_s;
        let per_rank = gather_times(ctx, ft)?;
        let resid = *refined.history.last().unwrap_or(&f64::NAN);
        let inf = |v: &[f64]| v.iter().fold(0.0f64, |m, e| m.max(e.abs()));
        let x_inf = inf(&refined.x);
        let norms = crate::suite::Norms {
            a_inf: sys.a_inf,
            x_inf,
            b_inf: sys.b_inf,
            r_inf: resid * sys.denominator(x_inf),
        };
        if rank != 0 {
            return Ok(None);
        }
        let run = MxpRun {
            code: config.precision.code(),
            n,
            nb,
            p: grid.p,
            q: grid.q,
            precision: config.precision,
            time_s: wall[0],
            factor_s,
            refine_s,
            gflops: check::flops(n) / wall[0] / 1e9,
            iterations: refined.iterations,
            restarts: refined.restarts,
            history: refined.history.clone(),
            resid,
            threshold: THRESHOLD,
            passed: check::passed(resid, THRESHOLD),
            norms,
            per_rank,
        };
        println!("{}", check::TABLE_HEADER);
        println!("{}", "-".repeat(check::TABLE_HEADER.len()));
        println!(
            "{}",
            check::result_line(run.code, n, nb, grid.p, grid.q, run.time_s, run.gflops)
        );
        println!(
            "refinement: {} GMRES iteration{} ({} restart{}), factorization {:.2} s, refinement {:.2} s; {kernel}",
            run.iterations,
            if run.iterations == 1 { "" } else { "s" },
            run.restarts,
            if run.restarts == 1 { "" } else { "s" },
            factor_s,
            refine_s
        );
        println!("{}", check::residual_line(resid, THRESHOLD));
        if !run.passed && run.iterations >= config.max_iterations {
            warnings.push(format!(
                "the refinement stopped at --max-iterations {} with the scaled residual at {resid:.3e}",
                config.max_iterations
            ));
        }
        let checks = vec![Check {
            name: format!("residual {} N={n} NB={nb} {}x{}", run.code, grid.p, grid.q),
            passed: run.passed,
            detail: format!(
                "scaled residual {resid:.7} (threshold {THRESHOLD}) after {} GMRES iterations",
                run.iterations
            ),
        }];
        let results = serde_json::json!({
            "precision": config.precision,
            "kernel": kernel,
            "threads_per_rank": threads,
            "restart": refine::RESTART,
            "runs": [run],
        });
        Ok(Some(SuiteOutput {
            results,
            checks,
            warnings,
        }))
    }
}

/// Every rank's factorization split, on rank 0.
fn gather_times(ctx: &mut Context, mine: FactorTimes) -> Result<Vec<FactorTimes>> {
    let got = ctx.comm.gather(
        0,
        &serde_json::to_vec(&[mine.panel, mine.broadcast, mine.update])?,
    )?;
    Ok(got
        .unwrap_or_default()
        .iter()
        .filter_map(|b| serde_json::from_slice::<[f64; 3]>(b).ok())
        .map(|[panel, broadcast, update]| FactorTimes {
            panel,
            broadcast,
            update,
        })
        .collect())
}

/// Bytes rank (row, col) needs: its double-precision share of [A | b] and the single copy.
fn rank_bytes(n: usize, nb: usize, grid: &Grid, row: usize, col: usize) -> u64 {
    let mp = numroc(n, nb, row, grid.p).max(1) as u64;
    let nq = numroc(n + 1, nb, col, grid.q) as u64;
    let nqa = numroc(n, nb, col, grid.q) as u64;
    mp.saturating_mul(nq)
        .saturating_mul(8)
        .saturating_add(mp.saturating_mul(nqa).saturating_mul(4))
}

/// Refuses, before anything is allocated, an N whose shares do not fit.
fn check_memory(config: &MxpConfig, grid: &Grid, ctx: &Context) -> Result<()> {
    let need = |n, row, col| rank_bytes(n, config.nb, grid, row, col);
    crate::suite::refuse_unfitting(
        config.n,
        config.nb,
        grid,
        ctx,
        config.mem_fraction,
        &need,
        "its share in double precision and again in single",
    )
}
