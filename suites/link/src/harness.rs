//! The loop every pattern shares: for each size, allocate and fill buffers, warm up, time the
//! iterations, check the payload, summarise, print.

use crate::pattern::{Pattern, Role};
use crate::{payload, table, AvgPeak, BandwidthRow, LatencyRow, LeftOut, LinkConfig, LinkResults};
use anyhow::{Context as _, Result};
use std::time::Instant;
use tbbench_runners::suite::Context;
use tbbench_schema::{Check, Percentiles, Summary};

/// The sweep's time (`--max-minutes`), shared out as it goes: each size of each pattern of
/// each pair (a slot) gets what is left over the slots left, so time a fast size did not need
/// goes to the slower ones after it. Every rank keeps one and counts every pair's slots, its
/// own or not, so the pair's leading rank knows the share when its turn comes.
pub struct Budget {
    started: Instant,
    seconds: f64,
    /// Each slot's bytes per iteration, every pair's in the order measured.
    bytes: Vec<f64>,
    /// Whether a slot is still planned (see `plan`).
    kept: Vec<bool>,
    slots_per_pair: usize,
    done: usize,
    /// Where the sizes are tbbench's defaults, sizes whose fewest iterations do not fit are
    /// left out (named); sizes the user listed are all measured.
    may_leave_out: bool,
    /// The fewest seconds per byte measured so far over iterations of a MiB or more: the
    /// link's rate (nothing is planned before one is known).
    seconds_per_byte: Option<f64>,
}

impl Budget {
    /// None where `--iters` fixes the iterations.
    pub fn new(config: &LinkConfig, pairs: usize) -> Option<Budget> {
        let seconds = config.max_seconds.filter(|_| config.iters.is_none())?;
        let per_pair: Vec<f64> = config
            .patterns
            .iter()
            .flat_map(|p| {
                config
                    .sizes
                    .iter()
                    .map(|&size| p.bytes_per_iter(size, p.window(size, config.window)))
            })
            .collect();
        let bytes = per_pair.repeat(pairs.max(1));
        Some(Budget {
            started: Instant::now(),
            seconds,
            slots_per_pair: per_pair.len(),
            kept: vec![true; bytes.len()],
            bytes,
            done: 0,
            may_leave_out: config.sizes == crate::default_sizes(),
            seconds_per_byte: None,
        })
    }

    pub fn minutes(&self) -> f64 {
        self.seconds / 60.0
    }

    pub fn elapsed_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    fn left_s(&self) -> f64 {
        (self.seconds - self.elapsed_s()).max(0.0)
    }

    /// A slot's weight: the bytes one iteration moves, at least 1 MiB's worth for the
    /// latency-bound sizes, so its share follows what it costs.
    fn weight(&self, slot: usize) -> f64 {
        self.bytes[slot].max(1048576.0)
    }

    /// Notes a measured size's fastest iteration. Only an iteration of a MiB or more tells
    /// the link's rate: a small one's time is its latency, which per byte would make every
    /// large size look unaffordable.
    fn measured(&mut self, bytes: f64, seconds: f64) {
        if bytes < 1048576.0 {
            return;
        }
        let spb = seconds / bytes;
        self.seconds_per_byte = Some(self.seconds_per_byte.map_or(spb, |s| s.min(spb)));
    }

    /// Plans the slots left: while their fewest iterations, at the rate measured so far, do
    /// not fit the time left, the one that moves the most bytes (the largest message of
    /// equals) is left
    /// out. Returns whether the next slot stays, and what its fewest iterations would take.
    fn plan(&mut self) -> (bool, f64) {
        let Some(spb) = self.seconds_per_byte.filter(|_| self.may_leave_out) else {
            return (true, 0.0);
        };
        let cost = |b: &Budget, j: usize| b.bytes[j] * spb * FEWEST;
        loop {
            let kept: Vec<usize> = (self.done..self.kept.len())
                .filter(|&j| self.kept[j])
                .collect();
            let need: f64 = kept.iter().map(|&j| cost(self, j)).sum();
            if need <= self.left_s() {
                break;
            }
            // Of equals (every window of 4 MiB or more moves 256 MiB), the largest message.
            let Some(&largest) = kept
                .iter()
                .max_by(|&&a, &&b| self.bytes[a].total_cmp(&self.bytes[b]))
            else {
                break;
            };
            // The smallest sizes are the curve's start and cost little: never all left out.
            if self.bytes[largest] <= 1048576.0 {
                break;
            }
            self.kept[largest] = false;
        }
        (self.kept[self.done], cost(self, self.done))
    }

    /// The time the next slot may take, seconds: the time left in proportion to its weight
    /// among the slots still planned.
    fn share(&self) -> f64 {
        let left: f64 = (self.done..self.kept.len())
            .filter(|&j| self.kept[j])
            .map(|j| self.weight(j))
            .sum();
        self.left_s() * self.weight(self.done) / left.max(1e-9)
    }

    fn slot_done(&mut self) {
        self.done += 1;
    }

    /// Another pair's sweep, which this rank sits out.
    pub fn skip_pair(&mut self) {
        self.done += self.slots_per_pair;
    }
}

/// The fewest iterations a measured size costs: a warm-up, [`MIN_ITERS`] timed, the check.
const FEWEST: f64 = (MIN_ITERS + 2) as f64;

/// Warm-up, then iterations to time, where a budget chooses them: one warm-up iteration is
/// timed, the leading rank decides how many more fit a tenth of the slot's share, times those,
/// and decides the timed iterations from their rate (never more than the fixed defaults, at
/// least [`MIN_ITERS`]). The other rank runs what the leading rank decided. Returns the
/// warm-up iterations run and the timed ones to run.
#[allow(clippy::too_many_arguments)]
fn warm_up_to_budget(
    ctx: &mut Context,
    pattern: Pattern,
    role: Role,
    other: usize,
    send: &[u8],
    recv: &mut [u8],
    window: usize,
    share_s: f64,
    most_warmup: usize,
    most_iters: usize,
) -> Result<(usize, usize)> {
    let slot = Instant::now();
    pattern.run_once(&mut ctx.comm, role, other, send, recv, window)?;
    let first = slot.elapsed().as_secs_f64().max(1e-9);
    let more = agree(
        ctx,
        role,
        other,
        ((share_s * 0.1 / first) as usize).min(most_warmup.saturating_sub(1)),
    )?;
    let t = Instant::now();
    for _ in 0..more {
        pattern.run_once(&mut ctx.comm, role, other, send, recv, window)?;
    }
    let per_iter = if more > 0 {
        t.elapsed().as_secs_f64() / more as f64
    } else {
        first
    }
    .max(1e-9);
    let left = share_s - slot.elapsed().as_secs_f64();
    let iters = agree(
        ctx,
        role,
        other,
        ((left / per_iter) as usize).clamp(MIN_ITERS, most_iters.max(MIN_ITERS)),
    )?;
    Ok((1 + more, iters))
}

/// The fewest timed iterations a budget leaves a size: enough for a median of two and a
/// payload check, on a link too slow for more.
const MIN_ITERS: usize = 2;

/// The leading rank's `n`, on both ranks of the pair.
fn agree(ctx: &mut Context, role: Role, other: usize, n: usize) -> Result<usize> {
    let mine = (n as u64).to_le_bytes();
    let mut theirs = [0u8; 8];
    ctx.comm.sendrecv(other, &mine, other, &mut theirs)?;
    Ok(match role {
        Role::Initiator => n,
        Role::Responder => u64::from_le_bytes(theirs) as usize,
    })
}

/// Measures one pair, `pair[0]` leading (its rows go into `results`; rank 0 prints its own
/// tables as they come, and the others' once they reach it).
pub fn measure_pair(
    config: &LinkConfig,
    ctx: &mut Context,
    pair: [usize; 2],
    ceiling: Option<f64>,
    memcpy_ceiling: bool,
    results: &mut LinkResults,
    mut budget: Option<&mut Budget>,
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
            let most_iters = config
                .iters
                .unwrap_or_else(|| pattern.default_iters(size, window));
            let most_warmup = config.warmup.unwrap_or((most_iters / 10).clamp(2, 100));
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
            let bytes = pattern.bytes_per_iter(size, window);
            let (warmup, iters) = match budget.as_deref_mut() {
                Some(b) => {
                    // Where the sizes left do not fit at the rate measured, the largest are
                    // left out: a slow link's curve is flat long before 256 MiB, and a silent
                    // ten minutes reads as a hang. The leading rank decides.
                    let (keep, cost) = b.plan();
                    let share = b.share();
                    b.slot_done();
                    if agree(ctx, role, other, !keep as usize)? == 1 {
                        if role == Role::Initiator {
                            results.left_out.push(LeftOut {
                                pattern,
                                pair,
                                size_bytes: size,
                                seconds: cost,
                            });
                        }
                        if let Some(b) = &bar {
                            b.inc(1);
                        }
                        continue;
                    }
                    warm_up_to_budget(
                        ctx,
                        pattern,
                        role,
                        other,
                        &send,
                        &mut recv,
                        window,
                        share,
                        most_warmup,
                        most_iters,
                    )?
                }
                None => {
                    for _ in 0..most_warmup {
                        pattern.run_once(&mut ctx.comm, role, other, &send, &mut recv, window)?;
                    }
                    (most_warmup, most_iters)
                }
            };
            let mut times_ns: Vec<u64> = Vec::with_capacity(iters);
            // The bar says how far into a size the sweep is, a few times a second: a size
            // that takes a minute on a slow link is not a hang.
            let mut shown = Instant::now();
            for i in 0..iters {
                let t0 = Instant::now();
                pattern.run_once(&mut ctx.comm, role, other, &send, &mut recv, window)?;
                times_ns.push(t0.elapsed().as_nanos() as u64);
                if let Some(b) = bar.as_ref().filter(|_| shown.elapsed().as_millis() >= 250) {
                    b.set_message(format!(
                        "{} {}/{iters}",
                        tbbench_runners::units::format_size(size),
                        i + 1
                    ));
                    shown = Instant::now();
                }
            }
            if let (Some(b), Some(&t)) = (budget.as_deref_mut(), times_ns.iter().min()) {
                b.measured(bytes, t as f64 * 1e-9);
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

#[cfg(test)]
mod budget_tests {
    use super::*;

    /// On a 700 Mbit/s link the default sweep's fewest iterations take more than 2 minutes:
    /// the plan leaves out the slots that move the most bytes (256 MiB bidirectional first),
    /// keeps every small size, and what it keeps fits. Nothing is planned before a MiB-sized
    /// iteration has told the rate, and sizes a user listed are never left out.
    #[test]
    fn a_slow_link_leaves_out_the_largest_default_sizes_until_the_rest_fit() {
        let config = LinkConfig::default();
        let mut b = Budget::new(&config, 1).unwrap();
        b.measured(64.0, 1.0);
        assert_eq!(b.plan(), (true, 0.0), "a small iteration's time is no rate");
        let rate = 700e6 / 8.0;
        b.measured(2.0 * 1048576.0, 2.0 * 1048576.0 / rate);
        let (keep, _) = b.plan();
        assert!(keep);
        let spb = 1.0 / rate;
        let kept_cost: f64 = (0..b.kept.len())
            .filter(|&j| b.kept[j])
            .map(|j| b.bytes[j] * spb * FEWEST)
            .sum();
        assert!(kept_cost <= 120.0, "{kept_cost} s kept");
        let dropped: Vec<f64> = (0..b.kept.len())
            .filter(|&j| !b.kept[j])
            .map(|j| b.bytes[j])
            .collect();
        assert!(!dropped.is_empty());
        let largest_kept = (0..b.kept.len())
            .filter(|&j| b.kept[j])
            .map(|j| b.bytes[j])
            .fold(0.0, f64::max);
        assert!(dropped.iter().all(|&d| d >= largest_kept), "{dropped:?}");
        assert!(
            b.kept[..14].iter().take(9).all(|k| *k),
            "small latency sizes stay"
        );
        // Of windows that move the same bytes, the largest message goes first.
        assert!(!b.kept[41] && b.kept[37], "{:?}", &b.kept[28..]);
        // Listed sizes: every one measured, however slow.
        let listed = LinkConfig {
            sizes: vec![4, 256 << 20],
            ..LinkConfig::default()
        };
        let mut b = Budget::new(&listed, 1).unwrap();
        b.measured(2.0 * 1048576.0, 1.0);
        assert_eq!(b.plan(), (true, 0.0));
        assert!(b.kept.iter().all(|k| *k));
    }
}
