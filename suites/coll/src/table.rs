//! The terminal table, nccl-tests' columns (size, count, type, redop, root, time, algbw,
//! busbw, #wrong) with the algorithm, the p99 and the share of the link's ceiling beside them;
//! the crossover line; the CSV export.

use crate::peers::PeerRun;
use crate::{Best, CollConfig, Row};
use anyhow::Result;
use std::path::Path;
use tbbench_runners::comm::CollOp;
use tbbench_runners::suite::Context;
use tbbench_runners::units::format_size;

pub fn header(
    op: CollOp,
    config: &CollConfig,
    ctx: &Context,
    ceiling: Option<f64>,
    source: Option<&str>,
) {
    let net = &ctx.network;
    let place = if config.in_place {
        "in place"
    } else {
        "out of place"
    };
    // TCP's figures depend on the congestion control and the connections per peer as much as
    // on the cable (BBR paces even loopback), so they are named where they are known.
    let congestion = net
        .tcp_setup()
        .map(|t| format!(", {t}"))
        .unwrap_or_default();
    println!(
        "# {}: {} ranks, {}, {place}, {} over {}{congestion}",
        op.name(),
        ctx.size(),
        config.dtype.name(),
        net.transport,
        net.interface.as_deref().unwrap_or(&net.label)
    );
    match ceiling {
        Some(c) => println!(
            "# busbw against the link's ceiling of {c:.2} GB/s ({})",
            source.unwrap_or("?")
        ),
        None => println!("# no link ceiling known (--ceiling 80Gbit sets one)"),
    }
    println!(
        "{:>10} {:>11} {:>5} {:>5} {:>4} {:>5} {:>10} {:>10} {:>9} {:>9} {:>6} {:>7}",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "algo",
        "time(us)",
        "p99(us)",
        "algbw",
        "busbw",
        "%ceil",
        "#wrong"
    );
    println!(
        "{:>10} {:>11} {:>5} {:>5} {:>4} {:>5} {:>10} {:>10} {:>9} {:>9} {:>6} {:>7}",
        "", "(elements)", "", "", "", "", "median", "", "(GB/s)", "(GB/s)", "", ""
    );
}

pub fn row(r: &Row) {
    let algo = if r.requested == "auto" {
        format!("{}*", r.algo)
    } else {
        r.algo.to_string()
    };
    println!(
        "{:>10} {:>11} {:>5} {:>5} {:>4} {:>5} {:>10.2} {:>10.2} {:>9.3} {:>9.3} {:>6} {:>7}",
        format_size(r.size_bytes),
        r.count,
        r.dtype,
        r.redop.unwrap_or("none"),
        r.root.map_or("-1".to_string(), |x| x.to_string()),
        algo,
        r.time_us.median,
        r.time_us.p99,
        r.algbw_gbps,
        r.busbw_gbps,
        r.percent_of_ceiling
            .map_or("-".to_string(), |p| format!("{p:.1}")),
        r.wrong
    );
}

/// What `auto` measured before following it: "# auto: probed 8B rd, 1MiB mesh".
pub fn probed(probes: &[crate::Probe]) {
    if probes.is_empty() {
        return;
    }
    let picks: Vec<String> = probes
        .iter()
        .map(|p| format!("{} {}", format_size(p.size_bytes), p.winner))
        .collect();
    println!("# auto: probed {}", picks.join(", "));
}

/// The winner per size, as runs of sizes: "8 B..64 KiB rd, 128 KiB..256 MiB ring".
pub fn crossover(best: &[Best]) {
    let mut runs: Vec<(u64, u64, &str)> = Vec::new();
    for b in best {
        match runs.last_mut() {
            Some(last) if last.2 == b.algo => last.1 = b.size_bytes,
            _ => runs.push((b.size_bytes, b.size_bytes, b.algo)),
        }
    }
    let parts: Vec<String> = runs
        .iter()
        .map(|(lo, hi, a)| {
            if lo == hi {
                format!("{} {a}", format_size(*lo))
            } else {
                format!("{}..{} {a}", format_size(*lo), format_size(*hi))
            }
        })
        .collect();
    if !parts.is_empty() {
        println!("# fastest: {}", parts.join(", "));
    }
    println!("# (* auto's choice)");
    println!();
}

/// tbbench beside the peers that ran, per op and size: tbbench's fastest algorithm's median
/// time and busbw, each peer's, and each peer's time over tbbench's (above 1: tbbench is
/// faster).
pub fn side_by_side(config: &CollConfig, best: &[Best], peers: &[PeerRun], rows: &[Row]) {
    let ran: Vec<&PeerRun> = peers.iter().filter(|p| p.ran).collect();
    if ran.is_empty() {
        return;
    }
    for op in &config.ops {
        let op = op.name();
        let ours: Vec<&Best> = best.iter().filter(|b| b.op == op).collect();
        if ours.is_empty() || !rows.iter().any(|r| r.op == op) {
            continue;
        }
        let names: Vec<String> = ran
            .iter()
            .map(|p| match &p.version {
                Some(v) if p.implementation == "mlx" => format!("{} {v}", p.label),
                Some(v) => format!("{} ({v})", p.label),
                None => p.label.clone(),
            })
            .collect();
        println!(
            "# {op}, {}: tbbench (its fastest algorithm) beside {}; time: median us; x: the peer's time over tbbench's",
            config.dtype.name(),
            names.join(", ")
        );
        let mut head = format!("{:>10} {:>11} {:>5}", "size", "tbbench", "algo");
        for p in &ran {
            head.push_str(&format!(" {:>11} {:>6}", short(&p.label), "x"));
        }
        head.push_str(&format!(" {:>11}", "busbw GB/s"));
        for p in &ran {
            head.push_str(&format!(" {:>11}", short(&p.label)));
        }
        println!("{head}");
        for b in &ours {
            let mut line = format!(
                "{:>10} {:>11.2} {:>5}",
                format_size(b.size_bytes),
                b.time_us,
                b.algo
            );
            let theirs: Vec<Option<&Row>> = ran
                .iter()
                .map(|p| {
                    rows.iter().find(|r| {
                        r.implementation == p.implementation
                            && r.op == op
                            && r.size_bytes == b.size_bytes
                    })
                })
                .collect();
            for r in &theirs {
                match r {
                    Some(r) => line.push_str(&format!(
                        " {:>11.2} {:>6.2}",
                        r.time_us.median,
                        r.time_us.median / b.time_us.max(1e-9)
                    )),
                    None => line.push_str(&format!(" {:>11} {:>6}", "-", "-")),
                }
            }
            line.push_str(&format!(" {:>11.3}", b.busbw_gbps));
            for r in &theirs {
                match r {
                    Some(r) => line.push_str(&format!(" {:>11.3}", r.busbw_gbps)),
                    None => line.push_str(&format!(" {:>11}", "-")),
                }
            }
            println!("{line}");
        }
        println!();
    }
}

/// A peer's label cut to a table column.
fn short(label: &str) -> String {
    label.chars().take(11).collect()
}

pub fn write_csv(path: &Path, rows: &[Row]) -> Result<()> {
    let mut out = String::from(
        "impl,op,algo,requested,dtype,redop,root,in_place,size_bytes,count,iters,time_us_median,time_us_p99,algbw_gbps,busbw_gbps,percent_of_ceiling,wrong\n",
    );
    for r in rows {
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{},{:.3},{:.3},{:.4},{:.4},{},{}\n",
            r.implementation,
            r.op,
            r.algo,
            r.requested,
            r.dtype,
            r.redop.unwrap_or(""),
            r.root.map_or(String::new(), |x| x.to_string()),
            r.in_place,
            r.size_bytes,
            r.count,
            r.iters,
            r.time_us.median,
            r.time_us.p99,
            r.algbw_gbps,
            r.busbw_gbps,
            r.percent_of_ceiling
                .map_or(String::new(), |p| format!("{p:.2}")),
            r.wrong
        ));
    }
    tbbench_schema::write::write_atomic(path, out.as_bytes())
}
