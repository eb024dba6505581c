//! `cargo bench -p tbbench-hpl`: the local kernels HPL's time goes to — the trailing update
//! (GEMM), the triangular solve, and generating a rank's share of the matrix. The kernel in
//! use (BLAS or the Rust loops; `TBBENCH_BLAS=rust` forces the latter) names each group.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tbbench_hpl::generator::{column, HPL_SEED};
use tbbench_hpl::kernels;

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

criterion_group!(benches, gemm, trsm, generate);
criterion_main!(benches);
