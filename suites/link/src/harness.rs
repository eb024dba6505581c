//! The loop every pattern shares: for each size, allocate and fill buffers, warm up, time the
//! iterations, check the payload, summarise, print.

use crate::pattern::{Pattern, Role};
use crate::{payload, table, AvgPeak, BandwidthRow, LatencyRow, LinkConfig, LinkResults};
use anyhow::{Context as _, Result};
use std::time::Instant;
use tbbench_runners::suite::Context;
use tbbench_schema::{Check, Percentiles, Summary};

/// Measures one pair, `pair[0]` leading (its rows go into `results`; rank 0 prints its own
/// tables as they come, and the others' once they reach it).
pub fn measure_pair(
    config: &LinkConfig,
    ctx: &mut Context,
    pair: [usize; 2],
    ceiling: Option<f64>,
    memcpy_ceiling: bool,
    results: &mut LinkResults,
) -> Result<()> {
    let me = ctx.rank();
    let [lead, follow] = pair;
    let other = if me == lead { follow } else { lead };
    let role = if me == lead {
        Role::Initiator
    } else {
        Role::Responder
    };
    for &pattern in &config.patterns {
        let bar = (ctx.progress && me == 0).then(|| {
            let b = indicatif::ProgressBar::new(config.sizes.len() as u64);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{prefix} [{bar:30}] {pos}/{len} sizes {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            b.set_prefix(format!("{} {lead}<->{follow}", pattern.name()));
            b
        });
        let first_lat = results.latency.len();
        let first_bw = results.bandwidth.len();
        for &size in &config.sizes {
            if let Some(b) = &bar {
                b.set_message(tbbench_runners::units::format_size(size));
            }
            let window = pattern.window(size, config.window);
            let iters = config
                .iters
                .unwrap_or_else(|| pattern.default_iters(size, window));
            let warmup = config.warmup.unwrap_or((iters / 10).clamp(2, 100));
            let len = usize::try_from(size).context("message size does not fit in memory")?;
            let mut send = ctx.comm.alloc(len)?;
            payload::fill(&mut send, size, me);
            let mut recv = ctx.comm.alloc(len * pattern.recv_slots(size, window))?;
            // shm's ceiling is memcpy at this very size: cache-resident sizes copy faster.
            let row_ceiling = match (memcpy_ceiling, pattern, role) {
                (true, Pattern::Bw | Pattern::Bibw, Role::Initiator) => {
                    Some(memcpy_gbit_per_s(size))
                }
                _ => ceiling,
            };
            for _ in 0..warmup {
                pattern.run_once(&mut ctx.comm, role, other, &send, &mut recv, window)?;
            }
            let mut times_ns = Vec::with_capacity(iters);
            for _ in 0..iters {
                let t0 = Instant::now();
                pattern.run_once(&mut ctx.comm, role, other, &send, &mut recv, window)?;
                times_ns.push(t0.elapsed().as_nanos() as u64);
            }
            // One more, untimed, iteration into poisoned slots: then every slot must hold the
            // peer's pattern, which proves this iteration's messages all arrived, whole. Bw
            // has data flowing only to the responder, so it alone checks; it tells rank 0.
            recv.fill(0xA5);
            pattern.run_once(&mut ctx.comm, role, other, &send, &mut recv, window)?;
            let receives_data = pattern != Pattern::Bw || role == Role::Responder;
            let mine_wrong = if receives_data {
                recv.chunks(len)
                    .map(|slot| payload::wrong_bytes(slot, size, other))
                    .sum::<u64>()
            } else {
                0
            };
            let mut theirs = [0u8; 8];
            ctx.comm
                .sendrecv(other, &mine_wrong.to_le_bytes(), other, &mut theirs)?;
            let wrong = mine_wrong + u64::from_le_bytes(theirs);
            drop(recv);
            if role == Role::Initiator {
                match pattern {
                    Pattern::Latency => results
                        .latency
                        .push(latency_row(pair, size, iters, warmup, &times_ns, wrong)),
                    _ => results.bandwidth.push(bandwidth_row(
                        pattern,
                        pair,
                        size,
                        window,
                        iters,
                        warmup,
                        &times_ns,
                        row_ceiling,
                        wrong,
                    )),
                }
            }
            if let Some(b) = &bar {
                b.inc(1);
            }
        }
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        if role == Role::Initiator && me == 0 {
            match pattern {
                Pattern::Latency => table::print_latency(pair, &results.latency[first_lat..]),
                _ => table::print_bandwidth(pattern, pair, ceiling, &results.bandwidth[first_bw..]),
            }
        }
    }
    Ok(())
}

fn latency_row(
    pair: [usize; 2],
    size: u64,
    iters: usize,
    warmup: usize,
    rtt_ns: &[u64],
    wrong: u64,
) -> LatencyRow {
    let samples_ns: Vec<u64> = rtt_ns.iter().map(|t| (t / 2).max(1)).collect();
    let us: Vec<f64> = samples_ns.iter().map(|&ns| ns as f64 / 1e3).collect();
    let one_way_us = Summary::of(&us, Percentiles::P999);
    LatencyRow {
        pair,
        size_bytes: size,
        iters,
        warmup,
        one_way_us,
        samples_ns,
        wrong_bytes: wrong,
    }
}

#[allow(clippy::too_many_arguments)]
fn bandwidth_row(
    pattern: Pattern,
    pair: [usize; 2],
    size: u64,
    window: usize,
    iters: usize,
    warmup: usize,
    times_ns: &[u64],
    ceiling: Option<f64>,
    wrong: u64,
) -> BandwidthRow {
    let bytes = pattern.bytes_per_iter(size, window);
    let total_s: f64 = times_ns.iter().map(|t| *t as f64 / 1e9).sum();
    let per_iter_gbit: Vec<f64> = times_ns
        .iter()
        .map(|t| bytes * 8.0 / (*t as f64).max(1.0))
        .collect();
    let avg_gbit = bytes * times_ns.len() as f64 * 8.0 / 1e9 / total_s.max(1e-12);
    let peak_gbit = per_iter_gbit.iter().cloned().fold(0.0, f64::max);
    let to_gib = |gbit: f64| gbit * 1e9 / 8.0 / (1u64 << 30) as f64;
    let msgs =
        window as f64 * times_ns.len() as f64 * if pattern == Pattern::Bibw { 2.0 } else { 1.0 };
    BandwidthRow {
        pair,
        mode: pattern,
        size_bytes: size,
        window,
        iters,
        warmup,
        gbit_per_s: AvgPeak {
            avg: avg_gbit,
            peak: peak_gbit,
        },
        gib_per_s: AvgPeak {
            avg: to_gib(avg_gbit),
            peak: to_gib(peak_gbit),
        },
        msg_rate_per_s: msgs / total_s.max(1e-12),
        // The ceiling is per direction; bidirectional traffic on a full-duplex link (every
        // link this tool measures) can reach twice it.
        percent_of_ceiling: ceiling.map(|c| {
            let c = c * if pattern == Pattern::Bibw { 2.0 } else { 1.0 };
            AvgPeak {
                avg: 100.0 * avg_gbit / c,
                peak: 100.0 * peak_gbit / c,
            }
        }),
        ceiling_gbit_per_s: ceiling,
        iteration_gbit_per_s: Summary::of(&per_iter_gbit, Percentiles::P999),
        wrong_bytes: wrong,
    }
}

pub fn payload_check(r: &LinkResults) -> Check {
    let messages = r.latency.len() + r.bandwidth.len();
    let wrong: u64 = r
        .latency
        .iter()
        .map(|x| x.wrong_bytes)
        .chain(r.bandwidth.iter().map(|x| x.wrong_bytes))
        .sum();
    let bad: Vec<String> = r
        .latency
        .iter()
        .filter(|x| x.wrong_bytes > 0)
        .map(|x| format!("latency {} B", x.size_bytes))
        .chain(
            r.bandwidth
                .iter()
                .filter(|x| x.wrong_bytes > 0)
                .map(|x| format!("{} {} B", x.mode.name(), x.size_bytes)),
        )
        .collect();
    Check {
        name: "payload".into(),
        passed: wrong == 0,
        detail: if wrong == 0 {
            format!("the last message of each of {messages} measurements arrived intact")
        } else {
            format!("{wrong} wrong bytes in: {}", bad.join(", "))
        },
    }
}

/// Says so in the result when a figure's own spread makes it shaky.
pub fn noise_warnings(r: &LinkResults) -> Vec<String> {
    let mut w = Vec::new();
    for x in &r.bandwidth {
        let s = &x.iteration_gbit_per_s;
        if s.n >= 3 && s.mean > 0.0 && s.stdev / s.mean > 0.10 {
            w.push(format!("noisy: {} at {} B between ranks {} and {} varied {:.0}% (stdev/mean) across iterations", x.mode.name(), x.size_bytes, x.pair[0], x.pair[1], 100.0 * s.stdev / s.mean));
        }
    }
    for x in &r.latency {
        let s = &x.one_way_us;
        if s.n >= 100 && s.median > 0.0 && s.p99 > 10.0 * s.median {
            w.push(format!(
                "noisy: latency at {} B between ranks {} and {} has p99 {:.1}x its median",
                x.size_bytes,
                x.pair[0],
                x.pair[1],
                s.p99 / s.median
            ));
        }
    }
    w
}

/// Every rank sends to, and receives from, each rank it has a cable to (every other rank on
/// one network) at once, `iters` times: the aggregate the cluster moves. The largest message
/// of the sweep (at most 16 MiB; a rank holds one per neighbour each way) goes over the
/// fastest pair; each other pair's message is cut to its share by the rate its own sweep
/// measured (`rates`: each pair's best `bw`), so every cable stays busy until the end rather
/// than waiting on the slowest each round.
pub fn concurrent(
    config: &LinkConfig,
    ctx: &mut Context,
    rates: &[([usize; 2], f64)],
) -> Result<crate::Concurrent> {
    use tbbench_runners::transport::{RecvOp, SendOp};
    let size = config
        .sizes
        .iter()
        .copied()
        .max()
        .unwrap_or(1 << 20)
        .min(16 << 20);
    let me = ctx.rank();
    let unlinked = ctx
        .network
        .topology
        .as_ref()
        .map(|t| t.unlinked.clone())
        .unwrap_or_default();
    // Over links, the cables: a pair of ranks on one host (loopback) is no cable, where the
    // run has cables at all.
    let cabled = ctx
        .network
        .links
        .iter()
        .any(|l| l.ends[0].link_kind != "loopback");
    let on_loopback = |p: usize| {
        ctx.network
            .links
            .iter()
            .any(|l| l.ranks == [me.min(p), me.max(p)] && l.ends[0].link_kind == "loopback")
    };
    let peers: Vec<usize> = (0..ctx.size())
        .filter(|&p| p != me && !unlinked.contains(&[me.min(p), me.max(p)]))
        .filter(|&p| !(cabled && on_loopback(p)))
        .collect();
    // Both ends of a pair size its messages alike: from the same rates, the same way.
    let fastest = rates.iter().map(|r| r.1).fold(0.0f64, f64::max);
    let size_for = |p: usize| -> u64 {
        let pair = [me.min(p), me.max(p)];
        match rates.iter().find(|r| r.0 == pair) {
            Some(&(_, r)) if fastest > 0.0 && r > 0.0 => {
                ((size as f64 * r / fastest) as u64 / 8 * 8).clamp(8, size)
            }
            _ => size,
        }
    };
    let sizes: Vec<u64> = peers.iter().map(|&p| size_for(p)).collect();
    let iters = config
        .iters
        .unwrap_or_else(|| Pattern::Bw.default_iters(size, 1))
        .clamp(1, 50);
    let mut send = Vec::with_capacity(peers.len());
    let mut recv = Vec::with_capacity(peers.len());
    for &s in &sizes {
        let len = usize::try_from(s).context("message size does not fit in memory")?;
        let mut b = ctx.comm.alloc(len)?;
        payload::fill(&mut b, s, me);
        send.push(b);
        recv.push(ctx.comm.alloc(len)?);
    }
    let once = |ctx: &mut Context, recv: &mut [tbbench_runners::transport::Buffer]| {
        let sends: Vec<SendOp> = peers
            .iter()
            .zip(&send)
            .map(|(&peer, buf)| SendOp { peer, buf })
            .collect();
        let mut recvs: Vec<RecvOp> = peers
            .iter()
            .zip(recv.iter_mut())
            .map(|(&peer, b)| RecvOp { peer, buf: b })
            .collect();
        ctx.comm.transport().exchange(&sends, &mut recvs)
    };
    for _ in 0..2 {
        once(ctx, &mut recv)?;
    }
    ctx.comm.barrier()?;
    let t0 = Instant::now();
    for _ in 0..iters {
        once(ctx, &mut recv)?;
    }
    let secs = t0.elapsed().as_secs_f64();
    let wrong: u64 = peers
        .iter()
        .zip(&recv)
        .zip(&sizes)
        .map(|((&p, b), &s)| payload::wrong_bytes(b, s, p))
        .sum();
    let sent: u64 = sizes.iter().sum::<u64>() * iters as u64;
    // Bytes every rank sent, the slowest rank's time, the wrong bytes anywhere.
    let mut sums = [sent as f64, wrong as f64, peers.len() as f64];
    ctx.comm
        .allreduce_f64(&mut sums, tbbench_runners::comm::ReduceOp::Sum)?;
    let mut slowest = [secs];
    ctx.comm
        .allreduce_f64(&mut slowest, tbbench_runners::comm::ReduceOp::Max)?;
    let aggregate = sums[0] * 8.0 / slowest[0].max(1e-12) / 1e9;
    let directions = sums[2] as usize;
    Ok(crate::Concurrent {
        size_bytes: size,
        sized_by_rate: rates.len() > 1,
        iters,
        directions,
        aggregate_gbit_per_s: aggregate,
        per_direction_gbit_per_s: aggregate / directions.max(1) as f64,
        wrong_bytes: sums[1] as u64,
    })
}

/// One core's memcpy rate for `size` bytes (at least 1 MiB), in Gbit/s: the median of five
/// copies between buffers that were written first, so no page fault is timed.
pub fn memcpy_gbit_per_s(size: u64) -> f64 {
    let len = size.max(1 << 20) as usize;
    let src = vec![7u8; len];
    let mut dst = vec![1u8; len];
    dst.copy_from_slice(&src);
    let mut rates: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&dst);
            len as f64 * 8.0 / t.elapsed().as_secs_f64() / 1e9
        })
        .collect();
    rates.sort_by(|a, b| a.total_cmp(b));
    rates[2]
}
