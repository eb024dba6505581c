//! `cargo bench -p tbbench-infer`: the decode's hot kernel, one weight row of quantized blocks
//! times an 8-bit activation, at SmolLM2-135M's feed-forward shape (1536 rows of 576) and a
//! 70B-class row (8192 wide), on every kernel this CPU has (the decode runs the last listed,
//! `portable` is what a CPU without SIMD kernels gets): one activation per row (a decode
//! step) and four at once (`-x4`, a prompt's tokens). Throughput is weight × token products.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tbbench_infer::decode::qdot::{self, Format, Kernel, Q8Activation, QK};

fn bytes(n: usize, seed: u32) -> Vec<u8> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 24) as u8
        })
        .collect()
}

/// One row's products, summed (so the work cannot be optimized away).
type PerRow<'a> = dyn Fn(usize) -> f64 + 'a;

/// A whole matrix's products into the output rows.
type WholeMatrix<'a> = dyn Fn(&mut [f32]) + 'a;

fn rows(c: &mut Criterion) {
    let kernels: Vec<Kernel> = Kernel::ALL.into_iter().filter(|k| k.available()).collect();
    for format in [Format::Q4_1, Format::Q8_0] {
        let mut g = c.benchmark_group(format!("qdot/{}", format.name()));
        for (nrows, ncols) in [(1536usize, 576usize), (64, 8192)] {
            let nb = ncols / QK;
            let q = bytes(nrows * nb * format.quant_bytes(), 7);
            let d = vec![0.01f32; nrows * nb];
            let m = vec![-0.1f32; nrows * nb];
            // What a matrix holds: minimums for Q4_1 only.
            let m_held = if format == Format::Q4_1 {
                m.clone()
            } else {
                Vec::new()
            };
            let acts: Vec<Q8Activation> = (0..4)
                .map(|t| {
                    let x: Vec<f32> = (0..ncols)
                        .map(|i| (((i + t) * 37 % 23) as f32 - 11.0) / 9.0)
                        .collect();
                    let mut a = Q8Activation::default();
                    a.quantize(&x);
                    a
                })
                .collect();
            let qb = nb * format.quant_bytes();
            let row = |r: usize| {
                (
                    &q[r * qb..(r + 1) * qb],
                    &d[r * nb..(r + 1) * nb],
                    &m[r * nb..(r + 1) * nb],
                )
            };
            // The whole matrix on the chosen kernel, lengths checked and the kernel chosen
            // once: through `qdot::rows` in rows, and in groups of eight (qdot::group) as a
            // decode step reads it where the chosen kernel has the grouped product.
            let (gq, gd, gm) = qdot::group(format, &q, &d, &m_held, nrows);
            let mut out = vec![0f32; nrows];
            g.throughput(Throughput::Elements((nrows * ncols) as u64));
            let whole: [(&str, &WholeMatrix); 2] = [
                ("rows", &|o| qdot::rows(format, &q, &d, &m, &acts[0], o)),
                ("groups", &|o| {
                    qdot::rows_grouped(format, &gq, &gd, &gm, &acts[0], o)
                }),
            ];
            for (layout, product) in whole {
                g.bench_with_input(
                    BenchmarkId::new(
                        format!("{layout}-{}", Kernel::chosen().name()),
                        format!("{nrows}x{ncols}"),
                    ),
                    &(),
                    |bench, _| {
                        bench.iter(|| {
                            product(&mut out);
                            out[0]
                        })
                    },
                );
            }
            for &k in &kernels {
                // One activation per row (a decode step) and four (a prompt's tokens), each
                // counted as weight × token products.
                let four = [&acts[0], &acts[1], &acts[2], &acts[3]];
                let one_row = |r: usize| {
                    let (qs, ds, ms) = row(r);
                    qdot::row_with(k, format, qs, ds, ms, &acts[0])
                };
                let four_rows = |r: usize| {
                    let (qs, ds, ms) = row(r);
                    qdot::row4_with(k, format, qs, ds, ms, four)
                        .iter()
                        .sum::<f64>()
                };
                let cases: [(String, usize, &PerRow); 2] = [
                    (k.name().to_string(), 1, &one_row),
                    (format!("{}-x4", k.name()), 4, &four_rows),
                ];
                for (name, tokens, per_row) in cases {
                    g.throughput(Throughput::Elements((tokens * nrows * ncols) as u64));
                    g.bench_with_input(
                        BenchmarkId::new(name, format!("{nrows}x{ncols}")),
                        &(),
                        |bench, _| bench.iter(|| (0..nrows).map(per_row).sum::<f64>()),
                    );
                }
            }
        }
        g.finish();
    }
}

fn quantize(c: &mut Criterion) {
    let x: Vec<f32> = (0..8192)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) / 9.0)
        .collect();
    let mut a = Q8Activation::default();
    let mut g = c.benchmark_group("qdot/quantize");
    g.throughput(Throughput::Elements(x.len() as u64));
    g.bench_function("8192", |bench| bench.iter(|| a.quantize(&x)));
    g.finish();
}

criterion_group!(benches, rows, quantize);
criterion_main!(benches);
