//! The suite: turns a config into runs (one per HPL.dat combination), checks memory before
//! allocating, times factorization + solve as HPL does, checks the residual, prints HPL's
//! lines and hands rank 0's figures to the result file. `suite/planning.rs` plans the runs
//! before any clock starts (HPL's pdinfo); `suite/running.rs` runs one (HPL's pdtest).

use crate::check;
use crate::factor::{self, Timings};
use crate::generator::{self, HPL_SEED};
use crate::grid::{Grid, ProcessMap};
use crate::input::{Broadcast, Factorization, Swap, Variant};
use crate::kernels;
use crate::matrix::{self, LocalMatrix};
use crate::packed_product::{self, Product, Shape};
use crate::swap_solve;
use anyhow::{bail, Result};
use serde::Serialize;
use std::time::Instant;
use tbbench_runners::comm::{Group, ReduceOp};
use tbbench_runners::suite::{Context, Suite, SuiteOutput};
use tbbench_schema::{Blas, Check};

mod planning;
mod running;
use planning::*;
pub(crate) use planning::{on_the_cables, refuse_unfitting, round_the_ring_note, OnCables};
use running::*;

/// What the user asked for. The runs themselves are planned on the ranks, from the run's real
/// size and hosts (under mpirun the size is MPI's, whatever `--nodes` says).
#[derive(Debug, Clone, Serialize)]
pub struct HplConfig {
    /// Every combination HPL.dat lists; those whose grid does not match the run's size are
    /// skipped at run time, and named.
    pub runs: Vec<Variant>,
    /// `--n`: one run of this order (None, and no HPL.dat: N chosen from memory).
    pub n: Option<usize>,
    /// NB and grid of a run without HPL.dat (NB None: measured, see [`choose_nb`]; grid
    /// None: the squarest for the run's size).
    pub nb: Option<usize>,
    pub grid: Option<(usize, usize)>,
    /// Fraction of the smallest host's available memory (per rank) the matrix may use.
    pub mem_fraction: f64,
    /// Longest estimated run when N is chosen automatically, in seconds.
    pub auto_time_budget_s: f64,
    /// `--threads`; None: this host's cores over the ranks on this host.
    pub threads: Option<usize>,
    pub dgemm_probe: bool,
    pub dat: Option<String>,
    /// --depth for the run whose N is chosen at run time (None: `Variant::plain`'s).
    pub depth: Option<usize>,
    /// What HPL.dat asks for that runs differently: shown as notes and kept in the result's
    /// warnings.
    pub notes: Vec<String>,
    /// The process map of a run without HPL.dat: row-major, or on a partial cabling the one
    /// that keeps every process row and column on cables ([`on_the_cables`]).
    pub map: ProcessMap,
    /// The ranks in the order the map lays them, where a ring's cables set it.
    pub order: Option<Vec<usize>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub code: String,
    pub n: usize,
    pub nb: usize,
    pub p: usize,
    pub q: usize,
    pub pmap: ProcessMap,
    /// The ranks in the order the map lays them, where a ring's cables set it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order: Option<Vec<usize>>,
    pub depth: usize,
    pub bcast: Broadcast,
    pub pfact: Factorization,
    pub rfact: Factorization,
    pub nbmin: usize,
    pub ndiv: usize,
    pub swap: Swap,
    /// The slowest rank's factorization + solve, seconds.
    pub time_s: f64,
    pub gflops: f64,
    pub resid: f64,
    pub threshold: f64,
    pub passed: bool,
    pub norms: Norms,
    /// The trailing update's product (`packed_product`'s or the BLAS's dgemm), the same on
    /// every rank.
    pub product: &'static str,
    /// Gflops over (ranks × the single-rank DGEMM rate), where the probe ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub efficiency_vs_dgemm: Option<f64>,
    /// Each rank's time split; communication is broadcast + swap (+ part of panel and solve).
    pub per_rank: Vec<Timings>,
    /// The hosts' energy over the solve (`joules`, `avg_watts`, ...), or why there is none
    /// (`unavailable`); see tbbench_runners::energy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub energy: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gflops_per_watt: Option<f64>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Norms {
    pub a_inf: f64,
    pub x_inf: f64,
    pub b_inf: f64,
    pub r_inf: f64,
}

pub struct HplSuite;

impl Suite for HplSuite {
    const NAME: &'static str = "hpl";
    type Config = HplConfig;

    /// Runs on a partial cabling where its grid's rows and columns are cabled
    /// ([`on_the_cables`]).
    fn needs_every_pair(_config: &HplConfig) -> bool {
        false
    }

    fn run(config: &HplConfig, ctx: &mut Context) -> Result<Option<SuiteOutput>> {
        // --max-minutes bounds the whole run: what the probes take comes off the solve's share.
        let started = Instant::now();
        let config = &cabled_config(config, ctx)?;
        let ranks = ctx.size();
        let rank = ctx.rank();
        let threads = config.threads.unwrap_or_else(|| ctx.threads_per_rank());
        let (planned, mut warnings) = plan(config, ranks)?;
        kernels::set_threads(threads);
        // Chosen (and, unless told, measured) before any clock starts.
        let u12_solve = swap_solve::solver();
        record_blas(ctx, &mut warnings)?;
        // The update's product, per NB and shape the runs' solves may use, chosen (and, unless
        // told, measured) before the DGEMM probe: measured right before a solve, the
        // measurement left that solve a few percent slower. The ranks measure
        // at once (from the barrier), as they run. The fallback NB of a system too small for
        // the candidates is measured at its solve. Every rank walks the same list (with
        // several ranks every shape is `Whole`, whatever a host's threads), so the
        // collectives pair up.
        ctx.comm.barrier()?;
        let mut packed_used = false;
        for (nb, shape) in product_uses(config, &planned, ranks, threads) {
            packed_used |= agreed_product(ctx, nb, shape)? == Product::Packed;
        }
        let dgemm = if config.dgemm_probe {
            let mut rate = [if rank == 0 {
                dgemm_rate(packed_used)
            } else {
                0.0
            }];
            ctx.comm
                .bcast(0, tbbench_runners::comm::f64_bytes_mut(&mut rate))?;
            Some(rate[0])
        } else {
            None
        };
        if threads > 1 && kernels::blas().is_none() && !packed_used {
            warnings.push(format!(
                "{threads} threads per rank, but without a BLAS the kernels run on one thread per rank"
            ));
        }
        // NB: HPL.dat's, --nb, or the fastest measured on this grid now.
        let (nb, nb_choice) = match (config.nb, &config.dat) {
            (_, Some(dat)) => (0, serde_json::json!({"how": "HPL.dat", "dat": dat})),
            (Some(nb), None) => (nb, serde_json::json!({"nb": nb, "how": "--nb"})),
            (None, None) => choose_nb(config, ctx, dgemm)?,
        };
        let planned_is_auto = planned.is_empty();
        let runs = if planned.is_empty() {
            vec![auto_run(config, ctx, dgemm, threads, nb, started)?]
        } else if config.dat.is_none() {
            planned
                .into_iter()
                .map(|mut v| {
                    v.nb = nb;
                    v
                })
                .collect()
        } else {
            planned
        };
        let mut results = Vec::new();
        if rank == 0 {
            for w in &warnings {
                eprintln!("tbbench: note: {w}");
            }
            println!("{}", check::TABLE_HEADER);
            println!("{}", "-".repeat(check::TABLE_HEADER.len()));
        }
        for v in &runs {
            if v.grid.size() != ranks {
                bail!(
                    "grid {}x{} needs {} ranks, this run has {ranks} (--nodes {})",
                    v.grid.p,
                    v.grid.q,
                    v.grid.size(),
                    v.grid.size()
                );
            }
            check_memory(v, ctx, config.mem_fraction)?;
            let r = run_one(v, ctx, dgemm)?;
            if rank == 0 {
                println!(
                    "{}",
                    check::result_line(&r.code, r.n, r.nb, r.p, r.q, r.time_s, r.gflops)
                );
                println!("{}", check::residual_line(r.resid, r.threshold));
                if let (Some(e), Some(gpw)) = (&r.energy, r.gflops_per_watt) {
                    println!(
                        "energy: {:.0} J over {:.2} s, {:.1} W (package counters): {gpw:.2} Gflops/W",
                        e["joules"].as_f64().unwrap_or(0.0),
                        e["seconds"].as_f64().unwrap_or(0.0),
                        e["avg_watts"].as_f64().unwrap_or(0.0)
                    );
                }
                println!();
            }
            results.push(r);
        }
        if rank != 0 {
            return Ok(None);
        }
        let whole_s = started.elapsed().as_secs_f64();
        let budget = planned_is_auto.then(|| {
            let limit = config.auto_time_budget_s;
            if whole_s > limit * 1.1 {
                warnings.push(format!(
                    "the run took {}, past --max-minutes {} (N was chosen for the probed rate: the solve ran at {:.2} of it); a smaller --max-minutes or --n holds it",
                    about(whole_s),
                    limit / 60.0,
                    results
                        .first()
                        .zip(dgemm)
                        .map_or(0.0, |(r, rate)| r.gflops / (rate * ranks as f64)),
                ));
            }
            serde_json::json!({"max_minutes": limit / 60.0, "whole_run_s": whole_s})
        });
        let checks = results
            .iter()
            .map(|r| Check {
                name: format!("residual {} N={} NB={} {}x{}", r.code, r.n, r.nb, r.p, r.q),
                passed: r.passed,
                detail: format!("scaled residual {:.7} (threshold {})", r.resid, r.threshold),
            })
            .collect();
        let out = serde_json::json!({
            "dgemm_gflops_single_rank": dgemm,
            "nb_choice": nb_choice,
            // Rank 0's; each rank measures its own.
            "u12_solve": u12_solve.name(),
            // Rank 0's; by default each rank's host cores over the ranks on that host.
            "threads_per_rank": threads,
            // Where N was chosen for the time budget: the budget and what the whole run took.
            "time_budget": budget,
            "runs": results,
        });
        Ok(Some(SuiteOutput {
            results: out,
            checks,
            warnings,
        }))
    }
}

/// The NBs of this run's solves and how each calls the update's product
/// (`factor::product_shape`): HPL.dat's variants, or `--nb` (else the NB candidates) on the
/// run's grid.
fn product_uses(
    config: &HplConfig,
    planned: &[Variant],
    ranks: usize,
    threads: usize,
) -> Vec<(usize, Shape)> {
    let mut uses: Vec<(usize, Shape)> = if config.dat.is_some() {
        planned
            .iter()
            .map(|v| {
                let shape = factor::product_shape(&v.grid, v.algo.depth, threads);
                (v.nb, shape)
            })
            .collect()
    } else {
        let grid = plain_grid(config, ranks);
        let depth = config.depth.unwrap_or(Variant::default_depth(&grid));
        let shape = factor::product_shape(&grid, depth, threads);
        match config.nb {
            Some(nb) => vec![(nb, shape)],
            None => NB_CANDIDATES.iter().map(|&nb| (nb, shape)).collect(),
        }
    };
    uses.sort_unstable_by_key(|&(nb, shape)| (nb, shape == Shape::Whole));
    uses.dedup();
    uses
}

/// Single-rank DGEMM rate of this build's kernel, Gflops (the ceiling efficiency is quoted
/// against); with `packed_too`, where the run's update uses `packed_product`, the faster of
/// the BLAS and that, so the ceiling is the fastest product the run can use.
fn dgemm_rate(packed_too: bool) -> f64 {
    // Large enough for a BLAS to reach its rate; the Rust loops are timed on less.
    let n = if kernels::blas().is_some() { 1536 } else { 384 };
    // In the same huge-page-backed memory as the share, so the ceiling is the kernel's best.
    let mut a = matrix::zeroed(n * n);
    for (i, v) in a.iter_mut().enumerate() {
        *v = (i % 7) as f64 * 0.1;
    }
    let mut b = matrix::zeroed(n * n);
    b.copy_from_slice(&a);
    let mut c = matrix::zeroed(n * n);
    kernels::gemm_minus(n, n, n, &a, n, &b, n, &mut c, n);
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        kernels::gemm_minus(n, n, n, &a, n, &b, n, &mut c, n);
        best = best.min(t.elapsed().as_secs_f64());
    }
    let blas = 2.0 * (n * n * n) as f64 / best / 1e9;
    let packed = packed_too
        .then(|| packed_product::probe_gflops(n))
        .flatten();
    blas.max(packed.unwrap_or(0.0))
}

/// Every rank says which BLAS it loaded (hosts may differ); rank 0 records it per host, with
/// what its note says (a kernel OpenBLAS chose older than the CPU, corrected by tbbench or
/// stood in for by the packed product: a host's own CPU tells) among the warnings.
pub(crate) fn record_blas(ctx: &mut Context, warnings: &mut Vec<String>) -> Result<()> {
    let mine = kernels::record();
    if let Some(all) = ctx.comm.gather(0, &serde_json::to_vec(&mine)?)? {
        for (r, bytes) in all.iter().enumerate() {
            let b: Blas = serde_json::from_slice(bytes)?;
            let host = ctx.rank_hosts[r].clone();
            if let Some(w) = b.note.as_ref().map(|w| format!("{host}: {w}")) {
                if !warnings.contains(&w) {
                    warnings.push(w);
                }
            }
            if let Some(h) = ctx.hosts.iter_mut().find(|h| h.hostname == host) {
                h.blas = Some(b);
            }
        }
    }
    Ok(())
}
