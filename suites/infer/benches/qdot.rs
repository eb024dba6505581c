//! `cargo bench -p tbbench-infer`: the decode's hot kernel, one weight row of quantized blocks
//! times an 8-bit activation, at SmolLM2-135M's feed-forward shape (1536 rows of 576) and a
//! 70B-class row (8192 wide). "dispatched" is what the decode runs (AVX2 where the CPU
//! has it), "portable" the plain-Rust kernel every other CPU gets. Throughput is weights.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tbbench_infer::decode::qdot::{self, Format, Q8Activation, QK};

fn bytes(n: usize, seed: u32) -> Vec<u8> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 24) as u8
        })
        .collect()
}

fn rows(c: &mut Criterion) {
    for format in [Format::Q4_1, Format::Q8_0] {
        let mut g = c.benchmark_group(format!("qdot/{}", format.name()));
        for (nrows, ncols) in [(1536usize, 576usize), (64, 8192)] {
            let nb = ncols / QK;
            let q = bytes(nrows * nb * format.quant_bytes(), 7);
            let d = vec![0.01f32; nrows * nb];
            let m = vec![-0.1f32; nrows * nb];
            let x: Vec<f32> = (0..ncols)
                .map(|i| ((i * 37 % 23) as f32 - 11.0) / 9.0)
                .collect();
            let mut a = Q8Activation::default();
            a.quantize(&x);
            let qb = nb * format.quant_bytes();
            g.throughput(Throughput::Elements((nrows * ncols) as u64));
            for (name, portable) in [("dispatched", false), ("portable", true)] {
                g.bench_with_input(
                    BenchmarkId::new(name, format!("{nrows}x{ncols}")),
                    &(),
                    |bench, _| {
                        bench.iter(|| {
                            let mut sum = 0f64;
                            for r in 0..nrows {
                                let (qs, ds) = (&q[r * qb..(r + 1) * qb], &d[r * nb..(r + 1) * nb]);
                                let ms = &m[r * nb..(r + 1) * nb];
                                sum += if portable {
                                    qdot::portable::row(format, qs, ds, ms, &a)
                                } else {
                                    qdot::row(format, qs, ds, ms, &a)
                                };
                            }
                            sum
                        })
                    },
                );
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
