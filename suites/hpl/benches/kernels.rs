//! `cargo bench -p tbbench-hpl`: the local kernels HPL's time goes to — the trailing update
//! (GEMM, and one rank's chunks through the BLAS and through the packed product), the
//! triangular solve, the fused row swaps and solve, and generating a rank's share of the
//! matrix. The kernel in use (BLAS or the Rust loops; `TBBENCH_BLAS=rust` forces the latter)
//! names each group.

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use tbbench_hpl::generator::{column, HPL_SEED};
use tbbench_hpl::kernels;
use tbbench_hpl::packed_product::{self, Columns, Kernel, PackedL21};
use tbbench_hpl::swap_solve::{self, PackedL};

fn matrix(rows: usize, cols: usize) -> Vec<f64> {
    (0..rows * cols)
        .map(|i| ((i * 37) % 101) as f64 / 101.0 - 0.5)
        .collect()
}

fn gemm(c: &mut Criterion) {
    let lib = kernels::blas()
        .map(|b| b.name.clone())
        .unwrap_or_else(|| "rust".into());
    let mut g = c.benchmark_group(format!("gemm_minus/{lib}"));
    // The update's shape: a tall block of L21 times a panel-high strip of U12, k = NB.
    for (m, n, k) in [(1024, 1024, 192), (2048, 512, 192), (512, 512, 64)] {
        let (a, b) = (matrix(m, k), matrix(k, n));
        let mut cm = matrix(m, n);
        g.throughput(Throughput::Elements((2 * m * n * k) as u64));
        g.bench_with_input(
            BenchmarkId::from_parameter(format!("{m}x{n}x{k}")),
            &(),
            |bench, _| bench.iter(|| kernels::gemm_minus(m, n, k, &a, m, &b, k, &mut cm, m)),
        );
    }
    g.finish();
}

/// The trailing update's product, L21 4800 × NB 128 against columns whose U12 sits right
/// above the rows they update, one thread, the BLAS's dgemm (which packs L21 on every call)
/// against the packed product, in the two shapes a run calls it:
/// - `update_chunk`: one of one rank's chunks, 512 columns, as each of the chunks' threads
///   runs it, L21 packed once outside the timing (as once per panel in a run);
/// - `update_whole`: a rank's whole update of one panel in one call, 4096 columns (160 MB),
///   as on several ranks (or at DEPTH 0), L21's packing inside the timing.
fn update(c: &mut Criterion) {
    let lib = kernels::blas()
        .map(|b| b.name.clone())
        .unwrap_or_else(|| "rust".into());
    kernels::set_threads(1);
    for (name, n) in [("update_chunk", 512), ("update_whole", 4096)] {
        let (m, k) = (4800, 128);
        let ld = k + m;
        let l = matrix(m, k);
        let mut bc = matrix(ld, n);
        let mut g = c.benchmark_group(format!("{name}/{lib}"));
        if n > 512 {
            g.sample_size(10);
        }
        g.throughput(Throughput::Elements((2 * m * n * k) as u64));
        let shape = format!("{m}x{n}x{k}");
        g.bench_function(BenchmarkId::new("dgemm", &shape), |bench| {
            bench.iter(|| kernels::gemm_minus_below(m, n, k, &l, m, &mut bc, ld))
        });
        if !packed_product::available() {
            eprintln!("{name}: no AVX-512F and no AVX2 here, so no packed product to time");
        }
        // Every kernel this CPU runs (on an AVX-512 host, the AVX2 one too: run with
        // OPENBLAS_CORETYPE=Haswell, its dgemm is the like-for-like peer).
        for kernel in Kernel::ALL.into_iter().filter(|k| k.available()) {
            let mut packed = PackedL21::for_kernel(kernel);
            let none = Columns::Below { bc: &mut [], ld };
            packed_product::pack_and_update(&mut packed, m, k, &l, m, none, 0, 1);
            let id = BenchmarkId::new(format!("packed-{}", kernel.name()), &shape);
            g.bench_function(id, |bench| {
                bench.iter(|| {
                    let cols = Columns::Below { bc: &mut bc, ld };
                    if n > 512 {
                        packed_product::pack_and_update(&mut packed, m, k, &l, m, cols, n, 1)
                    } else {
                        packed_product::gemm_minus(&packed, cols, n, 1)
                    }
                })
            });
        }
        g.finish();
    }
}

fn trsm(c: &mut Criterion) {
    let lib = kernels::blas()
        .map(|b| b.name.clone())
        .unwrap_or_else(|| "rust".into());
    let mut g = c.benchmark_group(format!("trsm_unit_lower/{lib}"));
    for (k, n) in [(192, 2048), (64, 1024)] {
        let a = matrix(k, k);
        let mut b = matrix(k, n);
        g.throughput(Throughput::Elements((k * k * n) as u64));
        g.bench_with_input(
            BenchmarkId::from_parameter(format!("{k}x{n}")),
            &(),
            |bench, _| bench.iter(|| kernels::trsm_unit_lower(k, n, &a, k, &mut b, k)),
        );
    }
    g.finish();
}

fn generate(c: &mut Criterion) {
    let mut g = c.benchmark_group("generator");
    let rows: Vec<u64> = (0..8192).collect();
    let mut out = vec![0.0; rows.len()];
    g.throughput(Throughput::Elements(rows.len() as u64));
    g.bench_function("column_8192", |bench| {
        bench.iter(|| column(HPL_SEED, 100_000, 77, &rows, &mut out))
    });
    g.finish();
}

/// A panel's row swaps and U12 solve over the trailing columns of a 1×1 run: tbbench's fused
/// tiles against LAPACK's dlaswp then BLAS's dtrsm (where the library has dlaswp), on the
/// rank's threads (`TBBENCH_BENCH_THREADS`, default 2); and the tiles with no pivots (the
/// solve alone), the floor the fused pass approaches as its swaps hide behind the solve.
fn swap_and_solve(c: &mut Criterion) {
    let Some(lib) = kernels::blas() else {
        return;
    };
    let threads = std::env::var("TBBENCH_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    kernels::set_threads(threads);
    let (k, n, ld) = (192, 2048, 8000);
    // L's entries small, so that solving the same columns again and again (each iteration
    // works on the last one's result) grows them by a few parts in 10^4 at a time and they stay
    // normal numbers for the whole run; the timings do not depend on the values.
    let l: Vec<f64> = matrix(k, k).iter().map(|v| v * 1e-6).collect();
    let packed = PackedL::new(k, &l, k);
    let mut b = matrix(ld, n);
    // Pivots as a random matrix's: each into the rows at or below its own, anywhere.
    let mut x = 12345u64;
    let piv: Vec<usize> = (0..k)
        .map(|j| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            j + (x >> 33) as usize % (ld - j)
        })
        .collect();
    let piv64: Vec<u64> = piv.iter().map(|&p| p as u64).collect();
    let mut g = c.benchmark_group(format!("swap_and_solve/{}/{threads}t", lib.name));
    g.throughput(Throughput::Elements((k * k * n) as u64));
    let shape = format!("{ld}x{n}x{k}");
    g.bench_function(BenchmarkId::new("fused_tiles", &shape), |bench| {
        bench.iter(|| swap_solve::swap_and_solve(&mut b, ld, 0..n, 0, &piv, &packed, threads))
    });
    g.bench_function(BenchmarkId::new("tiles_no_pivots", &shape), |bench| {
        bench.iter(|| swap_solve::swap_and_solve(&mut b, ld, 0..n, 0, &[], &packed, threads))
    });
    g.bench_function(BenchmarkId::new("dlaswp_dtrsm", &shape), |bench| {
        bench.iter(|| {
            kernels::laswp(n, &mut b, ld, 0, &piv64);
            kernels::trsm_unit_lower(k, n, &l, k, &mut b, ld);
        })
    });
    g.finish();
}

// update last: it leaves the BLAS on one thread.
criterion_group!(benches, gemm, trsm, generate, swap_and_solve, update);

fn main() {
    // As the binary does: OpenBLAS's idle workers told to sleep soon (see the function).
    kernels::before_threads(true);
    benches();
    Criterion::default().configure_from_args().final_summary();
}
