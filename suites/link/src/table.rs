//! The human tables, columns as perftest and osu print them.

use crate::pattern::Pattern;
use crate::{BandwidthRow, LatencyRow};
use tbbench_runners::units::format_size;

pub fn print_latency(pair: [usize; 2], rows: &[LatencyRow]) {
    let [a, b] = pair;
    println!("# one-way latency (RTT/2), rank {a} <-> rank {b}, microseconds");
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

pub fn print_bandwidth(
    pattern: Pattern,
    pair: [usize; 2],
    ceiling: Option<f64>,
    rows: &[BandwidthRow],
) {
    let [a, b] = pair;
    let what = if pattern == Pattern::Bibw {
        "bidirectional bandwidth"
    } else {
        "bandwidth"
    };
    match ceiling {
        Some(c) => println!("# {what}, rank {a} -> rank {b}, ceiling {c:.1} Gbit/s"),
        None => {
            println!("# {what}, rank {a} -> rank {b} (no ceiling known: --ceiling 80Gbit sets one)")
        }
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

/// The N×N matrix of a run over more than two ranks: p50 one-way latency (µs, at the smallest
/// size) above the diagonal's mirror, best bandwidth (Gbit/s) below it; `-` where a pair has
/// no cable or was not measured. Then what every cable moved at once.
pub fn print_matrix(
    size: usize,
    pairs: &[crate::PairSummary],
    concurrent: Option<&crate::Concurrent>,
) {
    let find = |a: usize, b: usize| pairs.iter().find(|p| p.ranks == [a.min(b), a.max(b)]);
    let lat_size = pairs.iter().find_map(|p| p.latency_size_bytes);
    for (title, value) in [
        (
            format!(
                "# p50 one-way latency{}, microseconds",
                lat_size
                    .map(|s| format!(" at {}", format_size(s)))
                    .unwrap_or_default()
            ),
            (|p: &crate::PairSummary| p.latency_p50_us.map(|v| format!("{v:.2}")))
                as fn(&crate::PairSummary) -> Option<String>,
        ),
        (
            "# best bandwidth (bw, average), Gbit/s".to_string(),
            |p: &crate::PairSummary| p.best_gbit_per_s.map(|v| format!("{v:.2}")),
        ),
    ] {
        if pairs.iter().all(|p| value(p).is_none()) {
            continue;
        }
        // Each line printed whole: rank 0's heartbeat to the launcher shares its stdout.
        println!("{title}");
        let head: String = (0..size).map(|b| format!(" {b:>9}")).collect();
        println!("{:>6}{head}", "rank");
        for a in 0..size {
            let cells: String = (0..size)
                .map(|b| {
                    let cell = match (a == b, find(a, b).and_then(value)) {
                        (true, _) => ".".to_string(),
                        (false, Some(v)) => v,
                        (false, None) => "-".to_string(),
                    };
                    format!(" {cell:>9}")
                })
                .collect();
            println!("{a:>6}{cells}");
        }
        println!();
    }
    if let Some(c) = concurrent {
        println!(
            "# every cable at once, both ways, {} messages: {:.2} Gbit/s in all over {} directions ({:.2} each), #wrong {}",
            format_size(c.size_bytes),
            c.aggregate_gbit_per_s,
            c.directions,
            c.per_direction_gbit_per_s,
            c.wrong_bytes
        );
        println!();
    }
}
