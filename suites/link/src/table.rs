//! The human tables, columns as perftest and osu print them.

use crate::pattern::Pattern;
use crate::{BandwidthRow, LatencyRow};
use tbbench_runners::units::format_size;

pub fn print_latency(peer: usize, rows: &[LatencyRow]) {
    println!("# one-way latency (RTT/2), rank 0 <-> rank {peer}, microseconds");
    println!(
        "{:>9} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}",
        "bytes",
        "iters",
        "t_min",
        "t_typical",
        "t_avg",
        "t_max",
        "t_stdev",
        "p99",
        "p99.9",
        "#wrong"
    );
    for r in rows {
        let s = &r.one_way_us;
        println!(
            "{:>9} {:>6} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>7}",
            format_size(r.size_bytes),
            r.iters,
            s.min,
            s.median,
            s.mean,
            s.max,
            s.stdev,
            s.p99,
            s.p999.unwrap_or(f64::NAN),
            r.wrong_bytes
        );
    }
    println!();
}

pub fn print_bandwidth(pattern: Pattern, peer: usize, ceiling: Option<f64>, rows: &[BandwidthRow]) {
    let what = if pattern == Pattern::Bibw {
        "bidirectional bandwidth"
    } else {
        "bandwidth"
    };
    match ceiling {
        Some(c) => println!("# {what}, rank 0 -> rank {peer}, ceiling {c:.1} Gbit/s"),
        None => println!(
            "# {what}, rank 0 -> rank {peer} (no ceiling known: --ceiling 80Gbit sets one)"
        ),
    }
    println!(
        "{:>9} {:>6} {:>6} {:>10} {:>10} {:>9} {:>9} {:>10} {:>8} {:>7}",
        "bytes",
        "iters",
        "window",
        "avg Gb/s",
        "peak Gb/s",
        "avg GiB/s",
        "peak GiB/s",
        "Mmsg/s",
        "%ceil",
        "#wrong"
    );
    for r in rows {
        let pct = r
            .percent_of_ceiling
            .map(|p| format!("{:.1}", p.avg))
            .unwrap_or_else(|| "-".into());
        println!(
            "{:>9} {:>6} {:>6} {:>10.2} {:>10.2} {:>9.3} {:>9.3} {:>10.3} {:>8} {:>7}",
            format_size(r.size_bytes),
            r.iters,
            r.window,
            r.gbit_per_s.avg,
            r.gbit_per_s.peak,
            r.gib_per_s.avg,
            r.gib_per_s.peak,
            r.msg_rate_per_s / 1e6,
            pct,
            r.wrong_bytes
        );
    }
    println!();
}
