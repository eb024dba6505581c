//! The suite: turns a config into runs (one per HPL.dat combination), checks memory before
//! allocating, times factorization + solve as HPL does, checks the residual, prints HPL's
//! lines and hands rank 0's figures to the result file.

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
        // measurement left that solve 2-4% slower (2-core Xeon VM, NB 128). The ranks measure
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

/// The bytes each rank may use: `fraction` of its host's available memory, shared by the
/// ranks on that host.
pub(crate) fn budget_per_rank(ctx: &Context, rank: usize, fraction: f64) -> u64 {
    let host = &ctx.rank_hosts[rank];
    ctx.hosts
        .iter()
        .find(|h| &h.hostname == host)
        .map(|h| (h.memory_available_bytes as f64 * fraction / h.ranks.len().max(1) as f64) as u64)
        .unwrap_or(0)
}

/// Bytes rank (row, col) needs for a run: its share and the factorization's workspace.
fn rank_bytes(n: usize, nb: usize, grid: &Grid, row: usize, col: usize, depth: usize) -> u64 {
    LocalMatrix::bytes(n, nb, grid, row, col)
        + factor::workspace_bytes(n, nb, grid, row, col, depth)
}

/// The largest N whose shares and workspaces fit every rank's budget (a multiple of NB).
fn largest_fitting_n(grid: &Grid, nb: usize, depth: usize, ctx: &Context, fraction: f64) -> usize {
    largest_n_within(grid, nb, ctx, fraction, &|n, row, col| {
        rank_bytes(n, nb, grid, row, col, depth)
    })
}

/// The largest N (a multiple of NB) for which `need(n, row, col)`, the bytes rank (row, col)
/// needs, fits every rank's budget (hpl's and hpl-mxp's shares).
pub(crate) fn largest_n_within(
    grid: &Grid,
    nb: usize,
    ctx: &Context,
    fraction: f64,
    need: &dyn Fn(usize, usize, usize) -> u64,
) -> usize {
    let fits = |n: usize| {
        (0..grid.size()).all(|r| {
            let (row, col) = grid.coords(r);
            need(n, row, col) <= budget_per_rank(ctx, r, fraction)
        })
    };
    let (mut lo, mut hi) = (0usize, 1usize << 22);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo / nb * nb
}

/// Refuses, before anything is allocated, an N whose share does not fit some rank.
fn check_memory(v: &Variant, ctx: &Context, fraction: f64) -> Result<()> {
    let need = |n, row, col| rank_bytes(n, v.nb, &v.grid, row, col, v.algo.depth);
    refuse_unfitting(
        v.n,
        v.nb,
        &v.grid,
        ctx,
        fraction,
        &need,
        "its share and workspace",
    )
}

/// One line naming the first rank whose `need` (bytes at N, by grid row and column) exceeds its
/// budget, with the largest N that fits; `holds` says what the bytes are.
pub(crate) fn refuse_unfitting(
    n: usize,
    nb: usize,
    grid: &Grid,
    ctx: &Context,
    fraction: f64,
    need: &dyn Fn(usize, usize, usize) -> u64,
    holds: &str,
) -> Result<()> {
    for r in 0..grid.size() {
        let (row, col) = grid.coords(r);
        let (need_r, have) = (need(n, row, col), budget_per_rank(ctx, r, fraction));
        if need_r > have {
            let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
            let max_n = largest_n_within(grid, nb, ctx, fraction, need);
            bail!(
                "N={n} does not fit: rank {r} ({}) needs {:.2} GiB for {holds}, {:.2} GiB is available to it ({:.0}% of its host's free memory over its ranks); the largest N that fits is {max_n}",
                ctx.rank_hosts[r],
                gib(need_r),
                gib(have),
                fraction * 100.0
            );
        }
    }
    Ok(())
}

/// The grid of a run without HPL.dat: `--p`/`--q`, or the squarest for `ranks`.
fn plain_grid(config: &HplConfig, ranks: usize) -> Grid {
    match config.grid {
        Some((p, q)) => Grid {
            p,
            q,
            map: config.map,
            order: config.order.clone(),
        },
        None => Grid {
            order: config.order.clone(),
            ..Grid::squarest(ranks, config.map)
        },
    }
}

/// How a grid's process rows and columns sit on a partial cabling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnCables {
    /// Every pair within each row and column has a cable: everything runs as on a switch.
    EveryPair,
    /// Only neighbours round each process row do (a row of three or more round a ring;
    /// columns keep every pair): panels go round it (HPL's 1ring), the small all-reduces
    /// along it, the solve's messages relayed by the ranks between.
    Neighbours,
}

/// On a partial cabling (a ring's diagonals) HPL's broadcasts, swaps and pivot searches run
/// within process rows and columns (what it does over every rank goes along the cables'
/// tree), so each row and column must be on cables. Tried in turn: the grid's own map, the
/// snake map, both laid in the cables' ring order (a ring listed out of rank order), and,
/// where no grid was asked for, one row round the ring (rings past four: a 2×3 grid on a ring
/// of six puts 1 and 4 in a column). The first whose every row and column pair is cabled
/// wins; else the first whose neighbours are; where none fits, one line names the pairs.
pub(crate) fn on_the_cables(
    grid: Grid,
    unlinked: &[[usize; 2]],
    ring: Option<&[usize]>,
    grid_asked: bool,
) -> Result<(Grid, OnCables)> {
    let missing = |pairs: Vec<[usize; 2]>| -> Vec<[usize; 2]> {
        pairs.into_iter().filter(|p| unlinked.contains(p)).collect()
    };
    let mut tries = vec![
        grid.clone(),
        Grid {
            map: ProcessMap::Snake,
            ..grid.clone()
        },
    ];
    if let Some(ring) = ring {
        for map in [grid.map, ProcessMap::Snake] {
            tries.push(Grid {
                map,
                order: Some(ring.to_vec()),
                ..grid.clone()
            });
        }
        if !grid_asked {
            tries.push(Grid {
                p: 1,
                q: ring.len(),
                map: ProcessMap::RowMajor,
                order: Some(ring.to_vec()),
            });
        }
    }
    if let Some(g) = tries.iter().find(|g| missing(g.group_pairs()).is_empty()) {
        return Ok((g.clone(), OnCables::EveryPair));
    }
    if let Some(g) = tries
        .iter()
        .find(|g| missing(g.ring_row_pairs()).is_empty())
    {
        return Ok((g.clone(), OnCables::Neighbours));
    }
    let first = missing(grid.group_pairs());
    let pairs: Vec<String> = first.iter().map(|[a, b]| format!("{a}-{b}")).collect();
    bail!(
        "hpl's {}x{} grid puts ranks with no cable between them in one process row or column ({}), in every process map tried: cable them, choose another --p/--q (on a ring, 1x{} goes round it), or run over one network",
        grid.p,
        grid.q,
        pairs.join(", "),
        grid.size()
    )
}

/// The note a run whose rows are only cabled between neighbours shows.
fn round_the_ring_note(g: &Grid) -> String {
    format!(
        "hpl: the {}x{} grid's process rows are cabled only between neighbours (a ring): panels go round them (HPL's 1ring, or 1ringM for the modified broadcasts), their small all-reduces along them, the solve's messages relayed; ranks laid in the cables' order",
        g.p, g.q
    )
}

/// The configuration with its grids held to the cabling ([`on_the_cables`]).
fn cabled_config(config: &HplConfig, ctx: &Context) -> Result<HplConfig> {
    let mut c = config.clone();
    let Some(t) = ctx
        .network
        .topology
        .as_ref()
        .filter(|t| !t.unlinked.is_empty())
    else {
        return Ok(c);
    };
    let ring = ctx.comm.ring_order().map(|r| r.to_vec());
    let mut notes = Vec::new();
    for v in &mut c.runs {
        if v.grid.size() == ctx.size() {
            let (g, on) = on_the_cables(v.grid.clone(), &t.unlinked, ring.as_deref(), true)?;
            if on == OnCables::Neighbours {
                notes.push(round_the_ring_note(&g));
                v.algo.bcast = v.algo.bcast.round_the_ring();
            }
            v.grid = g;
        }
    }
    if c.dat.is_none() {
        let asked = c.grid.is_some();
        let (g, on) = on_the_cables(
            plain_grid(&c, ctx.size()),
            &t.unlinked,
            ring.as_deref(),
            asked,
        )?;
        if on == OnCables::Neighbours {
            notes.push(round_the_ring_note(&g));
        }
        c.map = g.map;
        c.grid = Some((g.p, g.q));
        c.order = g.order;
    }
    notes.dedup();
    c.notes.extend(notes);
    Ok(c)
}

/// The runs for `ranks` ranks, and the notes to show: HPL.dat combinations whose grid needs
/// another size are named and skipped; a grid that cannot match is an error. Empty: N is
/// chosen from memory.
fn plan(config: &HplConfig, ranks: usize) -> Result<(Vec<Variant>, Vec<String>)> {
    let mut notes = Vec::new();
    if let Some((p, q)) = config.grid {
        if p * q != ranks {
            bail!(
                "--p {p} --q {q} is a grid of {} ranks, but this run has {ranks}",
                p * q
            );
        }
    }
    if let Some(dat) = &config.dat {
        let (runs, other): (Vec<Variant>, Vec<Variant>) = config
            .runs
            .iter()
            .cloned()
            .partition(|v| v.grid.size() == ranks);
        for v in &other {
            notes.push(format!(
                "{} N={} NB={}: grid {}x{} needs {} ranks, this run has {ranks}",
                v.code(),
                v.n,
                v.nb,
                v.grid.p,
                v.grid.q,
                v.grid.size()
            ));
        }
        if runs.is_empty() {
            bail!(
                "{dat}: no combination can run on {ranks} ranks ({})",
                notes.first().cloned().unwrap_or_default()
            );
        }
        notes.extend(config.notes.iter().cloned());
        return Ok((runs, notes));
    }
    notes.extend(config.notes.iter().cloned());
    Ok(match config.n {
        Some(n) => {
            // NB is set once chosen (the probe runs on the ranks, after this check).
            let mut v = Variant::plain(
                n,
                config.nb.unwrap_or(DEFAULT_NB),
                plain_grid(config, ranks),
            );
            if let Some(d) = config.depth {
                v.algo.depth = d;
            }
            (vec![v], notes)
        }
        None => (Vec::new(), notes),
    })
}

/// N from memory when not given, held to the time budget at the probed DGEMM rate.
fn auto_run(
    config: &HplConfig,
    ctx: &mut Context,
    dgemm: Option<f64>,
    threads: usize,
    nb: usize,
    started: Instant,
) -> Result<Variant> {
    // Every rank must choose the same N: rank 0's clock says what the probes took.
    let mut spent = [started.elapsed().as_secs_f64()];
    ctx.comm
        .bcast(0, tbbench_runners::comm::f64_bytes_mut(&mut spent))?;
    let spent = spent[0];
    let grid = plain_grid(config, ctx.size());
    // The run's lookahead as `Variant::plain` (or --depth) sets it: its panels need room too.
    let depth = config.depth.unwrap_or(Variant::default_depth(&grid));
    let from_memory = largest_fitting_n(&grid, nb, depth, ctx, config.mem_fraction);
    if from_memory == 0 {
        bail!(
            "not even N={nb} fits in {:.0}% of the available memory",
            config.mem_fraction * 100.0
        );
    }
    let mut n = from_memory;
    let memory = format!(
        "{:.0}% of the smallest host's free memory (--mem-fraction)",
        config.mem_fraction * 100.0
    );
    let mut why = format!("N {n} from {memory}; no time estimate without the DGEMM probe");
    if let Some(rate) = dgemm.filter(|r| *r > 0.0) {
        // Ranks that really run at once: no more per host than its cores allow at --threads.
        let parallel: usize = ctx
            .hosts
            .iter()
            .map(|h| h.ranks.len().min((h.cores_logical / threads.max(1)).max(1)))
            .sum();
        // The solve reaches a share of the probed DGEMM rate: panels, swaps and broadcasts
        // run beside the updates, and ranks that share cores take turns. Measured on a 2-core
        // VM, N ~16k: 2 ranks reached 0.99 of 2 x the probe, 4 ranks (oversubscribed) 0.81.
        let oversubscribed = ctx
            .hosts
            .iter()
            .any(|h| h.ranks.len() * threads.max(1) > h.cores_logical);
        // A 2-rank run on a 2-core Xeon reached 0.83 of the probe per rank: the estimate
        // takes the lower share, so the run ends inside the budget rather than past it.
        let efficiency = if oversubscribed { 0.65 } else { 0.8 };
        let aggregate = rate * parallel.max(1) as f64 * 1e9 * efficiency;
        // The solve's share: the budget less what the probes took, less a tenth for
        // generating the matrix and checking the solution (N² work beside the solve's N³).
        let solve_s = ((config.auto_time_budget_s - spent) * 0.9).max(0.0);
        let by_time = ((solve_s * aggregate * 1.5).cbrt() as usize / nb * nb).max(nb);
        let took = |n: usize| about(check::flops(n) / aggregate);
        if by_time < n {
            why = format!(
                "N {by_time} from the time budget (--max-minutes {}, {} of it spent probing): {} at the probed {rate:.1} Gflops/rank; {memory} would allow N {from_memory} ({}). --n sets N",
                config.auto_time_budget_s / 60.0,
                about(spent),
                took(by_time),
                took(from_memory),
            );
            n = by_time;
        } else {
            why = format!(
                "N {n} from {memory}: {} at the probed {rate:.1} Gflops/rank, inside --max-minutes {}",
                took(n),
                config.auto_time_budget_s / 60.0
            );
        }
    }
    if ctx.rank() == 0 {
        println!("tbbench: {why}");
    }
    let mut v = Variant::plain(n, nb, grid.clone());
    v.algo.depth = depth;
    Ok(v)
}

/// NB where nothing chose one: the middle of HPL's usual range for CPU BLAS.
const DEFAULT_NB: usize = 192;
/// About how long each NB probe's solve takes, seconds.
const PROBE_SECONDS: f64 = 0.3;
/// The block sizes the probe tries: HPL's usual range for CPU BLAS kernels.
const NB_CANDIDATES: [usize; 4] = [128, 192, 256, 384];

/// The NB of a run that was given none: each candidate solves a system of the probe's order
/// on the run's own grid (N = the run's --n up to what takes about [`PROBE_SECONDS`] at the
/// probed DGEMM rate: a second or two in all), and the fastest passing one wins. Returns it
/// and the record of how it was chosen.
fn choose_nb(
    config: &HplConfig,
    ctx: &mut Context,
    dgemm: Option<f64>,
) -> Result<(usize, serde_json::Value)> {
    let grid = plain_grid(config, ctx.size());
    // Each probe about PROBE_SECONDS at the probed DGEMM rate over the ranks (a fast host
    // probes a larger N, nearer the run's), between 2048 and 12288; 4096 without the rate,
    // 1024 on the Rust kernels.
    let cap = match (kernels::blas().is_some(), dgemm.filter(|r| *r > 0.0)) {
        (false, _) => 1024,
        (true, None) => 4096,
        (true, Some(rate)) => {
            let flops = PROBE_SECONDS * rate * 1e9 * ctx.size() as f64 * 0.8;
            ((1.5 * flops).cbrt() as usize / 256 * 256).clamp(2048, 12288)
        }
    };
    let depth = config.depth.unwrap_or(Variant::default_depth(&grid));
    // Within the run's memory share too (the run itself is held to it).
    let fits = largest_fitting_n(&grid, DEFAULT_NB, depth, ctx, config.mem_fraction);
    let n = config.n.unwrap_or(cap).min(cap).min(fits.max(DEFAULT_NB));
    // Every rank owns at least two blocks of the widest dimension, or the probe measures
    // idle ranks.
    let mut candidates: Vec<usize> = NB_CANDIDATES
        .iter()
        .copied()
        .filter(|nb| nb * 2 * grid.p.max(grid.q) <= n)
        .collect();
    if candidates.is_empty() {
        candidates.push((n / (2 * grid.p.max(grid.q))).clamp(1, DEFAULT_NB));
    }
    if ctx.rank() == 0 && ctx.progress {
        eprintln!(
            "tbbench: choosing NB: N={n} on {}x{} with NB {} (--nb skips this)",
            grid.p,
            grid.q,
            candidates
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let progress = std::mem::replace(&mut ctx.progress, false);
    let mut probed = Vec::new();
    // The first solve of a process also pays for the BLAS threads starting and the first
    // touch of its memory: one untimed solve first, so no candidate pays for it.
    let warm = std::iter::once((true, candidates[0]));
    for (warm_up, nb) in warm.chain(candidates.iter().map(|&nb| (false, nb))) {
        let mut v = Variant::plain(n, nb, grid.clone());
        if let Some(d) = config.depth {
            v.algo.depth = d;
        }
        if check_memory(&v, ctx, config.mem_fraction).is_err() {
            // A wider block's workspace may not fit where a narrower one does.
            continue;
        }
        let r = run_one(&v, ctx, None);
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                ctx.progress = progress;
                return Err(e.context(format!("choosing NB: the N={n} NB={nb} probe failed")));
            }
        };
        if !warm_up {
            probed.push((nb, r.gflops, r.passed));
        }
    }
    ctx.progress = progress;
    // Rank 0 decides (every rank has the same figures; one voice keeps them in step).
    let mut pick = [probed
        .iter()
        .filter(|p| p.2)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map_or(DEFAULT_NB, |p| p.0) as f64];
    ctx.comm
        .bcast(0, tbbench_runners::comm::f64_bytes_mut(&mut pick))?;
    let nb = pick[0] as usize;
    if ctx.rank() == 0 {
        println!(
            "tbbench: NB {nb}, the fastest at N={n} on {}x{}: {} (--nb sets NB)",
            grid.p,
            grid.q,
            probed
                .iter()
                .map(|(nb, g, ok)| format!("{nb} {g:.1}{}", if *ok { "" } else { " FAILED" }))
                .collect::<Vec<_>>()
                .join(", ")
                + " Gflops"
        );
    }
    let record = serde_json::json!({
        "nb": nb,
        "how": "probe",
        "probe_n": n,
        "grid": [grid.p, grid.q],
        "probed": probed
            .iter()
            .map(|(nb, g, ok)| serde_json::json!({"nb": nb, "gflops": g, "passed": ok}))
            .collect::<Vec<_>>(),
    });
    Ok((nb, record))
}

/// The trailing update's product at block size `nb`, called as `shape` says, the same on
/// every rank (a collective): each rank's finding (`packed_product::finding`, timed as the
/// ranks run, all at once) added up, so the result names what ran, a rank without the kernel
/// runs what the others do, and one rank's noise does not decide alone.
fn agreed_product(ctx: &mut Context, nb: usize, shape: Shape) -> Result<Product> {
    let mut sums = packed_product::finding(nb, shape).sums();
    ctx.comm.allreduce_f64(&mut sums, ReduceOp::Sum)?;
    Ok(packed_product::Finding::agreed(sums))
}

/// "about 40 s", "about 12 min": a time estimate in the unit people plan with.
fn about(seconds: f64) -> String {
    if seconds < 90.0 {
        format!("about {:.0} s", seconds.max(1.0))
    } else {
        format!("about {:.0} min", seconds / 60.0)
    }
}

fn run_one(v: &Variant, ctx: &mut Context, dgemm: Option<f64>) -> Result<RunResult> {
    let rank = ctx.rank();
    let mut m = LocalMatrix::generate(v.n, v.nb, v.grid.clone(), rank, HPL_SEED);
    // The bar fills with the work done, not the columns: the first tenth of the columns holds
    // about a quarter of the flops and the last tenth a thousandth, so a bar by columns (and
    // its ETA) would race ahead at the end and crawl at the start.
    const STEPS: u64 = 1000;
    let total = check::flops(v.n);
    let bar = (ctx.progress && rank == 0).then(|| {
        let b = indicatif::ProgressBar::new(STEPS);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{prefix} [{bar:30}] {percent}% of the flops, {msg}, about {eta} left",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b.set_prefix(format!("HPL N={}", v.n));
        b.set_message(format!("column 0/{}", v.n));
        b
    });
    // Chosen (and, unless told, measured) before the clock starts.
    let shape = factor::product_shape(&v.grid, v.algo.depth, kernels::threads());
    let product = agreed_product(ctx, v.nb, shape)?;
    let mut times = Timings::default();
    ctx.comm.barrier()?;
    let energy = tbbench_runners::energy::Span::begin(ctx);
    let start = Instant::now();
    factor::factor(
        &mut m,
        &mut ctx.comm,
        &v.algo,
        product,
        &mut times,
        |done| {
            if let Some(b) = &bar {
                // Work done so far: all of HPL's flops minus those of the trailing system left.
                let flops = total - check::flops(v.n - done);
                b.set_position((flops / total * STEPS as f64) as u64);
                b.set_message(format!(
                    "column {done}/{}, {:.1} Gflops",
                    v.n,
                    flops / start.elapsed().as_secs_f64() / 1e9
                ));
            }
        },
    )?;
    let x = factor::solve(&m, &mut ctx.comm, &mut times)?;
    let mut wall = [start.elapsed().as_secs_f64()];
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    ctx.comm.allreduce_f64(&mut wall, ReduceOp::Max)?;
    // The meters stop after the slowest rank's solve: its energy is the solve's.
    let energy = energy.end(ctx)?;
    drop(m);
    let norms = residual_norms(v, ctx, &x)?;
    let resid = check::scaled_residual(norms.r_inf, norms.a_inf, norms.x_inf, norms.b_inf, v.n);
    let gflops = check::flops(v.n) / wall[0] / 1e9;
    let split = [
        times.panel,
        times.broadcast,
        times.swap,
        times.swap_solve,
        times.update,
        times.solve,
    ];
    let all = ctx.comm.allgather_f64(&split)?;
    let per_rank = all
        .chunks(split.len())
        .map(|c| Timings {
            panel: c[0],
            broadcast: c[1],
            swap: c[2],
            swap_solve: c[3],
            update: c[4],
            solve: c[5],
        })
        .collect();
    Ok(RunResult {
        code: v.code(),
        n: v.n,
        nb: v.nb,
        p: v.grid.p,
        q: v.grid.q,
        pmap: v.grid.map,
        order: v.grid.order.clone(),
        depth: v.algo.depth,
        bcast: v.algo.bcast,
        pfact: v.algo.pfact,
        rfact: v.algo.rfact,
        nbmin: v.algo.nbmin,
        ndiv: v.algo.ndiv,
        swap: v.algo.swap,
        time_s: wall[0],
        gflops,
        resid,
        threshold: v.threshold,
        passed: check::passed(resid, v.threshold),
        norms,
        product: product.name(),
        efficiency_vs_dgemm: dgemm
            .filter(|r| *r > 0.0)
            .map(|r| gflops / (r * ctx.size() as f64)),
        per_rank,
        gflops_per_watt: energy
            .as_ref()
            .and_then(|e| e["avg_watts"].as_f64())
            .filter(|w| *w > 0.0)
            .map(|w| gflops / w),
        energy,
    })
}

/// ‖Ax−b‖∞, ‖A‖∞, ‖x‖∞, ‖b‖∞ with A and b generated afresh, each rank over its own blocks.
fn residual_norms(v: &Variant, ctx: &mut Context, x: &[f64]) -> Result<Norms> {
    let rank = ctx.rank();
    let m = LocalMatrix::generate(v.n, v.nb, v.grid.clone(), rank, HPL_SEED);
    let lc_b = m.cols_before(v.n);
    // Row sums of A·x and of |A| over this rank's columns, then over the process row.
    let mut sums = vec![0.0; 2 * m.mp];
    for lc in 0..lc_b {
        let xj = x[m.global_col(lc)];
        for i in 0..m.mp {
            let a = m.at(i, lc);
            sums[i] += a * xj;
            sums[m.mp + i] += a.abs();
        }
    }
    let row: Vec<usize> = (0..v.grid.q).map(|c| v.grid.rank_at(m.myrow, c)).collect();
    ctx.comm
        .allreduce_f64_in(Group::Members(&row), &mut sums, ReduceOp::Sum)?;
    let mut local = [0.0f64; 3];
    for i in 0..m.mp {
        let b = generator::entry(HPL_SEED, v.n as u64, m.global_row(i) as u64, v.n as u64);
        local[0] = local[0].max((sums[i] - b).abs());
        local[1] = local[1].max(sums[m.mp + i]);
        local[2] = local[2].max(b.abs());
    }
    ctx.comm.allreduce_f64(&mut local, ReduceOp::Max)?;
    Ok(Norms {
        r_inf: local[0],
        a_inf: local[1],
        x_inf: x.iter().fold(0.0f64, |a, b| a.max(b.abs())),
        b_inf: local[2],
    })
}
