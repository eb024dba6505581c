//! The sweep's one row: buffers, the checked run, warm-up, timed iterations (each the slowest
//! rank's time), bandwidths; and the probe `auto` follows.

use crate::input::Input;
use crate::ops::{
    AllGather, AllReduce, AllToAll, Broadcast, Call, Collective, PingPong, Reduce, ReduceScatter,
};
use crate::{redop_str, CollConfig, Probe, Row};
use anyhow::{bail, Result};
use std::time::Instant;
use tbbench_runners::comm::element::as_elements_mut;
use tbbench_runners::comm::{default_algo, Algo, CollOp, Comm, Dtype, Element, ReduceOp, Tuning};
use tbbench_runners::suite::Context;
use tbbench_runners::units::format_size;
use tbbench_schema::{Percentiles, Summary};

/// `auto`'s probe stops here: above it every link is in its bandwidth regime and the winner
/// no longer changes with size.
const PROBE_MAX_BYTES: u64 = 16 << 20;
const PROBE_SIZES: usize = 5;
/// A probe times the algorithms in turns, each round starting one algorithm further on, so
/// a slow spell of the host, or what the previous algorithm left in the connections (under
/// bbr, their pacing rates), falls on every algorithm alike rather than on one.
const PROBE_ROUNDS: usize = 3;
/// `auto` keeps the model's algorithm ([`default_algo`]) unless another's probe median beats
/// it by more than this share: nearer than that the probe cannot tell them apart. Under bbr
/// a connection's first transfers run faster than its steady state, more so the more
/// connections an algorithm spreads over, so without a margin a short probe picked the
/// algorithm that slowed down afterwards in some launches. Re-measure: `tbbench coll --nodes 4
/// --op all-gather --algo auto,ring,mesh --sizes 16MiB` launched a few times under bbr.
const PROBE_MARGIN: f64 = 0.05;
/// Untimed calls before an algorithm's first timed round (then one before each later one).
const PROBE_WARMUP: usize = 2;
/// Timed iterations per algorithm per round: many where each is microseconds (a median of a
/// few is at the mercy of one scheduler hiccup), few where each moves megabytes.
fn probe_iters(size: u64) -> usize {
    if size <= 64 << 10 {
        10
    } else {
        2
    }
}

/// Elements per rank as nccl-tests counts them, for an array of `size` bytes.
pub(crate) fn count_for(op: CollOp, size: u64, elt: usize, n: usize) -> usize {
    let elements = (size / elt as u64) as usize;
    match op {
        CollOp::ReduceScatter | CollOp::AllGather => elements / n,
        CollOp::AllToAll => elements / n * n,
        _ => elements,
    }
}

/// What the asked sizes become on `n` ranks, one line each where it is not what was asked:
/// an op at a size below one whole element per rank does not run, and a size that is no whole
/// number of elements (split evenly, where the op splits the array) runs the largest array
/// below it, as nccl-tests does. Said on the terminal and recorded as warnings. Errs, in one
/// line, where no size runs for any op.
pub fn sizes_as_run(config: &CollConfig, n: usize) -> Result<Vec<String>> {
    let elt = config.dtype.size();
    let dtype = config.dtype.name();
    let mut notes = Vec::new();
    let mut any = false;
    for &op in &config.ops {
        for &size in &config.sizes {
            let count = count_for(op, size, elt, n);
            let ran = array_bytes(op, count, elt, n);
            // Exact bytes: a size that is no whole number of elements reads as its neighbour
            // once rounded to KiB.
            let asked = format!("{size} B");
            if count == 0 {
                let least = match op {
                    CollOp::ReduceScatter | CollOp::AllGather | CollOp::AllToAll => elt * n,
                    _ => elt,
                };
                notes.push(format!(
                    "{} at {asked}: left out, below one {dtype} element ({elt} B){} ({least} B at least)",
                    op.name(),
                    if least > elt { " per rank" } else { "" }
                ));
            } else {
                any = true;
                if ran != size {
                    notes.push(format!(
                        "{} at {asked}: runs {ran} B ({} whole {dtype} elements{})",
                        op.name(),
                        ran / elt as u64,
                        if ran / elt as u64 != count as u64 {
                            ", split evenly over the ranks"
                        } else {
                            ""
                        }
                    ));
                }
            }
        }
    }
    if !any {
        anyhow::bail!(
            "no --sizes value holds one whole {dtype} element ({elt} B) for any op on {n} rank(s): nothing would run"
        );
    }
    Ok(notes)
}

/// The bytes of the array the figures are per (the whole array for reduce-scatter and
/// all-gather, count × ranks).
pub(crate) fn array_bytes(op: CollOp, count: usize, elt: usize, n: usize) -> u64 {
    let elements = match op {
        CollOp::ReduceScatter | CollOp::AllGather => count * n,
        _ => count,
    };
    (elements * elt) as u64
}

/// Measures one row; None where the size holds no whole element per rank.
pub fn measure(
    op: CollOp,
    algo: Algo,
    size: u64,
    config: &CollConfig,
    ctx: &mut Context,
    ceiling_gbps: Option<f64>,
) -> Result<Option<Row>> {
    let input = Input::new(ctx.size(), config.dtype);
    let run = Run {
        op,
        call: call(config, algo),
        size,
        warmup: config.warmup,
        iters: config.iters,
        check: true,
    };
    let Some(m) = by_dtype(config.dtype, &run, &input, &mut ctx.comm)? else {
        return Ok(None);
    };
    Ok(Some(row(
        config,
        ctx.size(),
        ceiling_gbps,
        Timed {
            implementation: "tbbench",
            op,
            algo: m.ran.name(),
            requested: algo.name(),
            in_place: config.in_place,
            count: m.count,
            times_us: &m.times_us,
            wrong: m.wrong,
        },
    )))
}

/// One row's measurement, whoever ran it (tbbench or a peer).
pub(crate) struct Timed<'a> {
    pub implementation: &'static str,
    pub op: CollOp,
    pub algo: &'static str,
    pub requested: &'static str,
    pub in_place: bool,
    /// Elements as nccl-tests counts them (per rank for reduce-scatter and all-gather).
    pub count: usize,
    /// Per iteration, the slowest rank's time.
    pub times_us: &'a [f64],
    pub wrong: u64,
}

/// A result row with nccl-tests' figures: the time summary, algbw (the array over the median
/// time) and busbw (algbw by the op's factor for `n` ranks), and its share of the ceiling.
pub(crate) fn row(config: &CollConfig, n: usize, ceiling_gbps: Option<f64>, t: Timed) -> Row {
    let size_bytes = array_bytes(t.op, t.count, config.dtype.size(), n);
    // A ping-pong is timed there and back; its figure is one way, as OSU's and link's
    // latency are.
    let one_way: Vec<f64>;
    let times = if t.op == CollOp::PingPong {
        one_way = t.times_us.iter().map(|x| x / 2.0).collect();
        &one_way[..]
    } else {
        t.times_us
    };
    let time_us = Summary::of(times, Percentiles::P999);
    let algbw = if time_us.median > 0.0 {
        size_bytes as f64 / (time_us.median * 1e-6) / 1e9
    } else {
        0.0
    };
    let busbw = algbw * t.op.bus_factor(n);
    let reduces = matches!(
        t.op,
        CollOp::AllReduce | CollOp::ReduceScatter | CollOp::Reduce
    );
    let rooted = matches!(t.op, CollOp::Broadcast | CollOp::Reduce);
    Row {
        implementation: t.implementation,
        op: t.op.name(),
        algo: t.algo,
        requested: t.requested,
        dtype: config.dtype.name(),
        redop: reduces.then(|| redop_str(config.redop)),
        root: rooted.then_some(config.root),
        in_place: t.in_place,
        size_bytes,
        count: t.count as u64,
        iters: config.iters,
        warmup: config.warmup,
        time_us,
        algbw_gbps: algbw,
        busbw_gbps: busbw,
        percent_of_ceiling: ceiling_gbps.filter(|c| *c > 0.0).map(|c| busbw / c * 100.0),
        wrong: t.wrong,
    }
}

/// The sweep's settings for one call by `algo`.
fn call(config: &CollConfig, algo: Algo) -> Call {
    Call {
        algo,
        redop: config.redop,
        root: config.root,
        in_place: config.in_place,
    }
}

/// What one row (or one probe) runs.
struct Run {
    op: CollOp,
    call: Call,
    size: u64,
    warmup: usize,
    iters: usize,
    /// Check every output element (rows); probes only time.
    check: bool,
}

struct Measured {
    ran: Algo,
    count: usize,
    /// Per iteration, the slowest rank's time.
    times_us: Vec<f64>,
    /// Wrong elements over all ranks.
    wrong: u64,
}

fn by_dtype(dtype: Dtype, run: &Run, input: &Input, comm: &mut Comm) -> Result<Option<Measured>> {
    match dtype {
        Dtype::F32 => by_op::<f32>(run, input, comm),
        Dtype::F64 => by_op::<f64>(run, input, comm),
        Dtype::F16 => by_op::<half::f16>(run, input, comm),
        Dtype::Bf16 => by_op::<half::bf16>(run, input, comm),
    }
}

fn by_op<T: Element>(run: &Run, input: &Input, comm: &mut Comm) -> Result<Option<Measured>> {
    match run.op {
        CollOp::AllReduce => timed::<T, AllReduce>(run, input, comm),
        CollOp::ReduceScatter => timed::<T, ReduceScatter>(run, input, comm),
        CollOp::AllGather => timed::<T, AllGather>(run, input, comm),
        CollOp::Broadcast => timed::<T, Broadcast>(run, input, comm),
        CollOp::Reduce => timed::<T, Reduce>(run, input, comm),
        CollOp::AllToAll => timed::<T, AllToAll>(run, input, comm),
        CollOp::PingPong => timed::<T, PingPong>(run, input, comm),
    }
}

/// Buffers from the transport (registered once on verbs, outside the timed loop), the
/// checked run, warm-up, then barrier + call per timed iteration.
///
/// Out of place, the input stays intact, so the last timed iteration's output is checked.
/// In place, each call overwrites its input, so a first run on fresh input is checked and
/// the timed iterations run on what it left.
fn timed<T: Element, C: Collective>(
    run: &Run,
    input: &Input,
    comm: &mut Comm,
) -> Result<Option<Measured>> {
    let (n, me) = (comm.size(), comm.rank());
    let elt = std::mem::size_of::<T>();
    let count = count_for(C::OP, run.size, elt, n);
    if count == 0 {
        return Ok(None);
    }
    let (send_len, recv_len) = C::lengths(count, n);
    let mut send_buf = comm.alloc(send_len * elt)?;
    let mut recv_buf = comm.alloc(recv_len * elt)?;
    let send: &mut [T] = as_elements_mut(&mut send_buf[..]);
    let recv: &mut [T] = as_elements_mut(&mut recv_buf[..]);
    let call = &run.call;
    C::fill(input, me, count, call, send, recv);
    let mut wrong = 0u64;
    let mut ran = call.algo;
    if run.check && call.in_place {
        ran = C::run(comm, count, call, send, recv)?;
        wrong = count_wrong::<T, C>(input, me, n, count, call, recv);
    }
    for _ in 0..run.warmup {
        ran = C::run(comm, count, call, send, recv)?;
    }
    let mut times_us = Vec::with_capacity(run.iters);
    for _ in 0..run.iters {
        comm.barrier()?;
        let t = Instant::now();
        ran = C::run(comm, count, call, send, recv)?;
        times_us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    if run.check && !call.in_place {
        wrong = count_wrong::<T, C>(input, me, n, count, call, recv);
    }
    // Each iteration is as slow as its slowest rank; wrong elements add up over ranks. Auto:
    // recursive doubling where the cabling allows it, else what keeps to the cables.
    comm.all_reduce(&mut times_us, ReduceOp::Max, Algo::Auto)?;
    let mut w = [wrong as f64];
    comm.all_reduce(&mut w, ReduceOp::Sum, Algo::Auto)?;
    Ok(Some(Measured {
        ran,
        count,
        times_us,
        wrong: w[0] as u64,
    }))
}

fn count_wrong<T: Element, C: Collective>(
    input: &Input,
    rank: usize,
    n: usize,
    count: usize,
    call: &Call,
    recv: &[T],
) -> u64 {
    C::checked(rank, n, count, call)
        .filter(|&i| recv[i].to_f64() != C::expected(input, rank, n, count, call, i))
        .count() as u64
}

/// `auto`'s probe: each algorithm of an op at a few sizes across the sweep (up to 16 MiB), in
/// [`PROBE_ROUNDS`] rounds of short timed loops; the fastest by median wins its size unless
/// the model's choice is within [`PROBE_MARGIN`] of it. Every rank ends with the same table
/// (times are the slowest rank's, the same everywhere).
///
/// It probes as the sweep goes, each size just before the first row that may follow it, so
/// the rows up to a probed size never come after a larger probe (nccl-tests and osu sweep in
/// ascending order too); only rows nearer the next probe size than the last follow that one.
/// Under bbr a connection paces at what its recent bulk transfers reached, so a 1 MiB row
/// right after a 16 MiB probe ran at about half its own speed (under cubic the same either
/// way). Re-measure: `tbbench coll --nodes 4 --op all-gather --sizes 1MiB` alone and after
/// `--sizes 16MiB,1MiB`, under bbr.
pub struct Tuner {
    /// Each op's progress, in the order of `tuning.entries`.
    ops: Vec<OpProbe>,
    points: Vec<u64>,
    tuning: Tuning,
    probes: Vec<Probe>,
}

/// One op's way along the probe sizes.
struct OpProbe {
    /// The probe sizes still in play: one where no algorithm can run (no whole element per
    /// rank) is dropped, so its rows follow the nearest size that has a winner.
    sizes: Vec<u64>,
    /// How many of `sizes` are probed (a prefix).
    probed: usize,
}

impl Tuner {
    pub fn new(config: &CollConfig) -> Self {
        Tuner {
            ops: Vec::new(),
            points: probe_sizes(&config.sizes),
            tuning: Tuning::default(),
            probes: Vec::new(),
        }
    }

    /// Probes `op` at every probe size `auto` may pick from for a row of `size` bytes (the
    /// probed size nearest on a log scale, [`Tuning::pick`]): those up to `size`, and the next
    /// one above where it is nearer than the one below. Returns the probes it ran.
    pub fn before_row(
        &mut self,
        op: CollOp,
        size: u64,
        config: &CollConfig,
        ctx: &mut Context,
    ) -> Result<Vec<Probe>> {
        let i = match self.tuning.entries.iter().position(|(o, _)| *o == op) {
            Some(i) => i,
            None => {
                self.tuning.entries.push((op, Vec::new()));
                self.ops.push(OpProbe {
                    sizes: self.points.clone(),
                    probed: 0,
                });
                self.tuning.entries.len() - 1
            }
        };
        let mut fresh = Vec::new();
        loop {
            let o = &mut self.ops[i];
            if o.probed >= points_needed(&o.sizes, size) {
                break;
            }
            let point = o.sizes[o.probed];
            match probe(op, point, config, ctx)? {
                Some((algo, p)) => {
                    o.probed += 1;
                    self.tuning.entries[i].1.push((point as usize, algo));
                    fresh.push(p);
                }
                None => {
                    o.sizes.remove(o.probed);
                }
            }
        }
        if !fresh.is_empty() {
            ctx.comm.set_tuning(self.tuning.clone());
            self.probes.extend_from_slice(&fresh);
        }
        Ok(fresh)
    }

    /// Every probe run, in the order they ran.
    pub fn into_probes(self) -> Vec<Probe> {
        self.probes
    }
}

/// How many of the (ascending) probe `points` a row of `size` bytes needs probed: those up to
/// it, and the next above it where that one is the nearer on a log scale (or none is below).
fn points_needed(points: &[u64], size: u64) -> usize {
    let below = points.iter().take_while(|&&p| p <= size).count();
    match (below.checked_sub(1).map(|i| points[i]), points.get(below)) {
        (_, None) => below,
        (None, Some(_)) => below + 1,
        (Some(lo), Some(&hi)) => {
            let b = size.max(1) as f64;
            if hi as f64 / b < b / lo.max(1) as f64 {
                below + 1
            } else {
                below
            }
        }
    }
}

/// One probe: every algorithm of `op` that runs on this many ranks, at `size` bytes, in
/// [`PROBE_ROUNDS`] rounds; each algorithm's median over all its rounds' iterations.
fn probe(
    op: CollOp,
    size: u64,
    config: &CollConfig,
    ctx: &mut Context,
) -> Result<Option<(Algo, Probe)>> {
    let n = ctx.size();
    let input = Input::new(n, config.dtype);
    let algos: Vec<Algo> = op
        .algos()
        .iter()
        .copied()
        .filter(|&a| runs_here(op, a, config, ctx).is_ok())
        .collect();
    // Per algorithm, its times so far; None once it cannot run at this size.
    let mut samples: Vec<Option<Vec<f64>>> = vec![Some(Vec::new()); algos.len()];
    for round in 0..PROBE_ROUNDS {
        for k in 0..algos.len() {
            let a = (round + k) % algos.len();
            let Some(times) = samples[a].as_mut() else {
                continue;
            };
            let run = Run {
                op,
                call: call(config, algos[a]),
                size,
                warmup: if round == 0 { PROBE_WARMUP } else { 1 },
                iters: probe_iters(size),
                check: false,
            };
            match by_dtype(config.dtype, &run, &input, &mut ctx.comm)? {
                Some(m) => times.extend_from_slice(&m.times_us),
                None => samples[a] = None,
            }
        }
    }
    let medians: Vec<(Algo, f64)> = algos
        .iter()
        .zip(&samples)
        .filter_map(|(a, t)| Some((*a, Summary::of(t.as_ref()?, Percentiles::P999).median)))
        .collect();
    // What auto runs unprobed: its choice for the array the calls moved (whole elements per
    // rank), as `Comm` sizes it.
    let elt = config.dtype.size();
    let model = default_algo(
        op,
        array_bytes(op, count_for(op, size, elt, n), elt, n) as usize,
        n,
    );
    Ok(follow(&medians, model).map(|winner| {
        let p = Probe {
            op: op.name(),
            size_bytes: size,
            time_us: medians
                .iter()
                .map(|(a, t)| (a.name().to_string(), (*t).into()))
                .collect(),
            model: model.name(),
            winner: winner.name(),
        };
        (winner, p)
    }))
}

/// The algorithm `auto` follows from a probe's medians: the fastest, unless the model's
/// choice is within [`PROBE_MARGIN`] of it.
fn follow(medians: &[(Algo, f64)], model: Algo) -> Option<Algo> {
    let &(fastest, best) = medians.iter().min_by(|x, y| x.1.total_cmp(&y.1))?;
    match medians.iter().find(|(a, _)| *a == model) {
        Some(&(_, t)) if t <= best * (1.0 + PROBE_MARGIN) => Some(model),
        _ => Some(fastest),
    }
}

/// Up to five sizes spread evenly (by position) over the sweep's sizes up to the probe's cap.
fn probe_sizes(sizes: &[u64]) -> Vec<u64> {
    let mut s: Vec<u64> = sizes
        .iter()
        .copied()
        .filter(|&x| x <= PROBE_MAX_BYTES)
        .collect();
    s.sort_unstable();
    s.dedup();
    if s.is_empty() {
        // Every size is above the cap: probe at the cap.
        return vec![PROBE_MAX_BYTES];
    }
    if s.len() <= PROBE_SIZES {
        return s;
    }
    (0..PROBE_SIZES)
        .map(|k| s[k * (s.len() - 1) / (PROBE_SIZES - 1)])
        .collect()
}

/// Refuses, before any buffer is allocated, sizes this host's free memory cannot hold for its
/// ranks (send and receive buffers and the scratch, about three arrays each), naming the
/// largest that fits.
pub fn check_memory(config: &CollConfig, ctx: &Context) -> Result<()> {
    let Some(host) = ctx.my_host() else {
        return Ok(());
    };
    if host.memory_available_bytes == 0 {
        return Ok(());
    }
    let Some(&largest) = config.sizes.iter().max() else {
        return Ok(());
    };
    let ranks_here = ctx.ranks_on_my_host() as u64;
    let budget = host.memory_available_bytes / 10 * 8 / ranks_here;
    let need = |s: u64| s.saturating_mul(3);
    if need(largest) > budget {
        let fits = (0..63)
            .map(|i| 1u64 << i)
            .take_while(|&s| need(s) <= budget)
            .last()
            .unwrap_or(0);
        bail!(
            "a {} collective needs about {} per rank, but {} has {} available for {} rank(s); the largest power of two that fits is {}",
            format_size(largest),
            format_size(need(largest)),
            host.hostname,
            format_size(host.memory_available_bytes),
            ranks_here,
            format_size(fits)
        );
    }
    Ok(())
}

/// Whether `algo` runs `op` on this run's ranks: the op has it on this many ranks, and on a
/// partial cabling every pair it moves data between has a cable. Err says why not, in one
/// line.
pub fn runs_here(op: CollOp, algo: Algo, config: &CollConfig, ctx: &Context) -> anyhow::Result<()> {
    if algo == Algo::Auto {
        return Ok(());
    }
    ctx.comm
        .check(op, algo, tbbench_runners::comm::Group::All, config.root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_follows_the_model_unless_another_is_clearly_faster() {
        let (ring, mesh, rd) = (Algo::Ring, Algo::Mesh, Algo::Rd);
        // Within the margin: the model's choice stays.
        assert_eq!(
            follow(&[(ring, 104.0), (mesh, 100.0), (rd, 120.0)], ring),
            Some(ring)
        );
        // Beyond it: the fastest.
        assert_eq!(
            follow(&[(ring, 106.0), (mesh, 100.0), (rd, 120.0)], ring),
            Some(mesh)
        );
        assert_eq!(follow(&[(ring, 90.0), (mesh, 100.0)], mesh), Some(ring));
        // The model's choice is the fastest.
        assert_eq!(follow(&[(ring, 100.0), (mesh, 90.0)], mesh), Some(mesh));
        // The model's choice did not run at this size: the fastest.
        assert_eq!(follow(&[(ring, 101.0), (mesh, 100.0)], rd), Some(mesh));
        assert_eq!(follow(&[], ring), None);
    }

    #[test]
    fn probe_sizes_spread_over_the_sweep_and_stop_at_the_cap() {
        let sweep = crate::default_sizes();
        let p = probe_sizes(&sweep);
        assert_eq!(p.len(), 5);
        assert_eq!(p[0], 8);
        assert_eq!(*p.last().unwrap(), 16 << 20);
        assert_eq!(probe_sizes(&[1 << 30]), vec![16 << 20]);
        assert_eq!(probe_sizes(&[64, 8]), vec![8, 64]);
    }

    /// A row needs the probe sizes `Tuning::pick` may choose for it, and no larger one.
    #[test]
    fn a_row_needs_the_probes_up_to_its_size_and_the_next_only_when_nearer() {
        let points = [8, 1 << 10, 1 << 20, 16 << 20];
        assert_eq!(points_needed(&points, 8), 1);
        assert_eq!(points_needed(&points, 4), 1, "none below: the first");
        assert_eq!(points_needed(&points, 1 << 20), 3);
        // 2 MiB is nearer 1 MiB (x2) than 16 MiB (x8); 8 MiB nearer 16 MiB.
        assert_eq!(points_needed(&points, 2 << 20), 3);
        assert_eq!(points_needed(&points, 8 << 20), 4);
        // 4 MiB is as near to both: pick takes the smaller, so no larger probe.
        assert_eq!(points_needed(&points, 4 << 20), 3);
        assert_eq!(points_needed(&points, 1 << 30), 4);
        // The probe `pick` would follow with every point probed is among those needed.
        for size in [
            1u64,
            8,
            100,
            1 << 10,
            5000,
            1 << 19,
            3 << 20,
            7 << 20,
            1 << 28,
        ] {
            let mut all = Tuning::default();
            let table = points.iter().enumerate();
            let as_algo = |k: usize| [Algo::Ring, Algo::Mesh, Algo::Rd, Algo::Tree][k];
            all.entries.push((
                CollOp::AllReduce,
                table.map(|(k, &p)| (p as usize, as_algo(k))).collect(),
            ));
            let picked = all.pick(CollOp::AllReduce, size as usize).unwrap();
            let k = (0..4).find(|&k| as_algo(k) == picked).unwrap();
            assert!(k < points_needed(&points, size), "{size}");
        }
    }

    #[test]
    fn counts_follow_nccl_tests() {
        // 4 ranks, f32: reduce-scatter of a 1000-byte array is 62 elements per rank.
        assert_eq!(count_for(CollOp::ReduceScatter, 1000, 4, 4), 62);
        assert_eq!(array_bytes(CollOp::ReduceScatter, 62, 4, 4), 992);
        assert_eq!(count_for(CollOp::AllReduce, 1000, 4, 4), 250);
        assert_eq!(count_for(CollOp::AllToAll, 1000, 4, 3), 249);
        assert_eq!(count_for(CollOp::AllGather, 8, 4, 4), 0);
    }
}
