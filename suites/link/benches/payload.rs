//! `cargo bench -p tbbench-link`: the payload pattern, written before timing and checked after
//! it. Neither runs inside the timed loop, but both bound how long a sweep takes.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tbbench_link::payload::{fill, wrong_bytes};

fn payload(c: &mut Criterion) {
    let mut g = c.benchmark_group("payload");
    let mut buf = vec![0u8; 4 << 20];
    g.throughput(Throughput::Bytes(buf.len() as u64));
    g.bench_function("fill_4MiB", |b| b.iter(|| fill(&mut buf, 4 << 20, 1)));
    fill(&mut buf, 4 << 20, 1);
    g.bench_function("check_4MiB", |b| b.iter(|| wrong_bytes(&buf, 4 << 20, 1)));
    g.finish();
}

criterion_group!(benches, payload);
criterion_main!(benches);
