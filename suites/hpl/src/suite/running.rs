//! One run (HPL's pdtest): the matrix generated, factorization and solve timed, the
//! residual checked, HPL's lines printed and the figures gathered.

use super::*;

pub(super) fn run_one(v: &Variant, ctx: &mut Context, dgemm: Option<f64>) -> Result<RunResult> {
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
pub(super) fn residual_norms(v: &Variant, ctx: &mut Context, x: &[f64]) -> Result<Norms> {
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
