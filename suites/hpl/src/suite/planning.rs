//! Planning runs before any clock starts (HPL's pdinfo): the grid on the cabling, the
//! runs HPL.dat or the flags ask for, memory checked before anything is allocated, N from
//! memory and the time budget, NB from a probe.

use super::*;

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
pub(super) fn rank_bytes(
    n: usize,
    nb: usize,
    grid: &Grid,
    row: usize,
    col: usize,
    depth: usize,
) -> u64 {
    LocalMatrix::bytes(n, nb, grid, row, col)
        + factor::workspace_bytes(n, nb, grid, row, col, depth)
}

/// The largest N whose shares and workspaces fit every rank's budget (a multiple of NB).
pub(super) fn largest_fitting_n(
    grid: &Grid,
    nb: usize,
    depth: usize,
    ctx: &Context,
    fraction: f64,
) -> usize {
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
pub(super) fn check_memory(v: &Variant, ctx: &Context, fraction: f64) -> Result<()> {
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
pub(super) fn plain_grid(config: &HplConfig, ranks: usize) -> Grid {
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
pub(crate) fn round_the_ring_note(g: &Grid) -> String {
    format!(
        "hpl: the {}x{} grid's process rows are cabled only between neighbours (a ring): panels go round them (HPL's 1ring, or 1ringM for the modified broadcasts), their small all-reduces along them, the solve's messages relayed; ranks laid in the cables' order",
        g.p, g.q
    )
}

/// The configuration with its grids held to the cabling ([`on_the_cables`]).
pub(super) fn cabled_config(config: &HplConfig, ctx: &Context) -> Result<HplConfig> {
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
pub(super) fn plan(config: &HplConfig, ranks: usize) -> Result<(Vec<Variant>, Vec<String>)> {
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
pub(super) fn auto_run(
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
        // run beside the updates, and ranks that share cores take turns (oversubscribed runs
        // reached a lower share). Re-measure: `tbbench hpl --nodes 2` and `--nodes 4` on a
        // 2-core host, Gflops against the DGEMM probe's line.
        let oversubscribed = ctx
            .hosts
            .iter()
            .any(|h| h.ranks.len() * threads.max(1) > h.cores_logical);
        // The estimate takes a share below the lowest measured, so the run ends inside the
        // budget rather than past it (`hpl --max-minutes 0.5` reports its whole run's time).
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
pub(super) const DEFAULT_NB: usize = 192;
/// About how long each NB probe's solve takes, seconds.
pub(super) const PROBE_SECONDS: f64 = 0.3;
/// The block sizes the probe tries: HPL's usual range for CPU BLAS kernels.
pub(super) const NB_CANDIDATES: [usize; 4] = [128, 192, 256, 384];

/// The NB of a run that was given none: each candidate solves a system of the probe's order
/// on the run's own grid (N = the run's --n up to what takes about [`PROBE_SECONDS`] at the
/// probed DGEMM rate: a second or two in all), and the fastest passing one wins. Returns it
/// and the record of how it was chosen.
pub(super) fn choose_nb(
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
pub(super) fn agreed_product(ctx: &mut Context, nb: usize, shape: Shape) -> Result<Product> {
    let mut sums = packed_product::finding(nb, shape).sums();
    ctx.comm.allreduce_f64(&mut sums, ReduceOp::Sum)?;
    Ok(packed_product::Finding::agreed(sums))
}

/// "about 40 s", "about 12 min": a time estimate in the unit people plan with.
pub(super) fn about(seconds: f64) -> String {
    if seconds < 90.0 {
        format!("about {:.0} s", seconds.max(1.0))
    } else {
        format!("about {:.0} min", seconds / 60.0)
    }
}
