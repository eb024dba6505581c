//! The cost model behind `tbbench predict`: how long one network takes for the messages a
//! workload sends, from what was measured on it (collective rows at the rank count, or a
//! point-to-point fit from link rows), or from published figures. Pure functions over the
//! figures result files hold; the command (mod.rs) reads the files and the workload.

use std::collections::BTreeMap;
use tbbench_runners::transport::tcp::STRIPE_MIN;

/// Published Apple-to-Apple RDMA over Thunderbolt 5 (perftest -c UC): ib_send_lat at 64 B,
/// one way, and ib_send_bw at 64 KiB.
pub const PUBLISHED_RDMA_TB5_US: f64 = 4.15;
pub const PUBLISHED_RDMA_TB5_GBIT: f64 = 75.0;

/// Linear interpolation through (x, y) points sorted by x; beyond either end, the line
/// through the two nearest points (never below zero, never below the nearest point's y when
/// going up in size). Time is affine in size (latency plus size over bandwidth), so between
/// two measured sizes a straight line is the model itself.
pub fn interpolate(points: &[(f64, f64)], x: f64) -> Option<f64> {
    match points {
        [] => None,
        [(_, y)] => Some(*y),
        _ => {
            let i = points
                .windows(2)
                .position(|w| x <= w[1].0)
                .unwrap_or(points.len() - 2);
            let ((x0, y0), (x1, y1)) = (points[i], points[i + 1]);
            let slope = if x1 > x0 { (y1 - y0) / (x1 - x0) } else { 0.0 };
            let y = y0 + slope.max(0.0) * (x - x0);
            // Below the smallest size measured: no faster than that size.
            Some(
                if x < points[0].0 {
                    y.max(points[0].1.min(y0))
                } else {
                    y
                }
                .max(0.0),
            )
        }
    }
}

/// One-way time of a message between two ranks.
#[derive(Debug, Clone)]
pub struct PointToPoint {
    /// Measured one-way latency (µs) per size, sorted by size: used between its sizes.
    latency: Vec<(f64, f64)>,
    /// The smallest message's one-way time (µs).
    pub alpha_us: f64,
    /// Streaming rate in bytes per µs (the best measured bandwidth).
    pub beta_bytes_per_us: f64,
}

impl PointToPoint {
    /// From a link result's latency rows (size, median one-way µs) and bandwidth rows (size,
    /// average Gbit/s). None without latency rows.
    pub fn fit(latency: &[(f64, f64)], bandwidth: &[(f64, f64)]) -> Option<PointToPoint> {
        let mut lat: Vec<(f64, f64)> = latency
            .iter()
            .copied()
            .filter(|(s, t)| s.is_finite() && t.is_finite() && *t > 0.0)
            .collect();
        lat.sort_by(|a, b| a.0.total_cmp(&b.0));
        let alpha_us = lat.first()?.1;
        // The best streaming rate: windowed bandwidth rows, or the largest latency message's
        // size over its time where no bandwidth row exists.
        let from_bw = bandwidth
            .iter()
            .map(|(_, g)| g * 1e9 / 8.0 / 1e6)
            .filter(|b| b.is_finite() && *b > 0.0)
            .fold(0.0, f64::max);
        // The rate the rows above the smallest imply (the smallest is the latency itself: it
        // implies none).
        let from_lat = lat
            .iter()
            .filter(|(_, t)| *t > alpha_us)
            .map(|(s, t)| s / (t - alpha_us))
            .filter(|b| b.is_finite())
            .fold(0.0, f64::max);
        let beta = if from_bw > 0.0 { from_bw } else { from_lat };
        if beta <= 0.0 {
            return None;
        }
        Some(PointToPoint {
            latency: lat,
            alpha_us,
            beta_bytes_per_us: beta,
        })
    }

    /// The published RDMA over Thunderbolt 5 figures.
    pub fn published_rdma_tb5() -> PointToPoint {
        PointToPoint {
            latency: Vec::new(),
            alpha_us: PUBLISHED_RDMA_TB5_US,
            beta_bytes_per_us: PUBLISHED_RDMA_TB5_GBIT * 1e9 / 8.0 / 1e6,
        }
    }

    /// One-way µs for `bytes`: measured latency between its sizes, else latency plus size
    /// over the streaming rate.
    pub fn time_us(&self, bytes: f64) -> f64 {
        let last = self.latency.last().map_or(0.0, |p| p.0);
        if self.latency.len() >= 2 && bytes <= last {
            if let Some(t) = interpolate(&self.latency, bytes) {
                return t;
            }
        }
        self.alpha_us + bytes / self.beta_bytes_per_us
    }
}

/// Ceil(log2 n).
fn rounds(n: usize) -> f64 {
    (usize::BITS - (n.max(1) - 1).leading_zeros()) as f64
}

/// All-reduce of `bytes` over `n` ranks from point-to-point times, per algorithm as
/// runners/src/comm/algo.rs runs it: ring (reduce-scatter and all-gather, 2(n-1) steps of a
/// 1/n share), recursive doubling (log2 n whole exchanges, two more when n is not a power of
/// two), mesh (each rank's n-1 shares through its one link, twice). `algo` None or "auto":
/// the fastest.
pub fn all_reduce_model_us(p: &PointToPoint, n: usize, bytes: f64, algo: Option<&str>) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let nf = n as f64;
    let ring = 2.0 * (nf - 1.0) * p.time_us(bytes / nf);
    let pow2 = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let rd = (pow2.trailing_zeros() as f64 + if pow2 == n { 0.0 } else { 2.0 }) * p.time_us(bytes);
    let mesh = 2.0 * p.time_us(bytes * (nf - 1.0) / nf);
    match algo {
        Some("ring") => ring,
        Some("rd") => rd,
        Some("mesh") => mesh,
        _ => ring.min(rd).min(mesh),
    }
}

/// Broadcast of `bytes` from one rank to `n` by a binomial tree.
pub fn broadcast_model_us(p: &PointToPoint, n: usize, bytes: f64) -> f64 {
    rounds(n) * p.time_us(bytes)
}

/// A measured collective row: op, algorithm, size and median time.
#[derive(Debug, Clone)]
pub struct CollRow {
    pub op: String,
    pub algo: String,
    pub size_bytes: f64,
    pub median_us: f64,
}

/// What one network's result files say about it.
#[derive(Debug, Clone, Default)]
pub struct NetworkFigures {
    pub label: String,
    pub link_kind: String,
    /// `measured` or `published`.
    pub source: &'static str,
    pub p2p: Option<PointToPoint>,
    /// Collective rows per rank count.
    pub coll: BTreeMap<usize, Vec<CollRow>>,
    /// The result files these figures come from.
    pub files: Vec<String>,
    /// The link result `p2p` comes from (one of `files`).
    pub link_file: Option<String>,
    /// The machines the network's runs used, each once (hostname, logical cores): where
    /// predicted ranks would run, so ranks that share one share its cores.
    pub machines: Vec<(String, usize)>,
}

impl NetworkFigures {
    /// The fastest time per size of `op` at `n` ranks (of `algo` when given and measured).
    fn coll_points(&self, n: usize, op: &str, algo: Option<&str>) -> Vec<(f64, f64)> {
        let Some(rows) = self.coll.get(&n) else {
            return Vec::new();
        };
        let of_op: Vec<&CollRow> = rows.iter().filter(|r| r.op == op).collect();
        let chosen: Vec<&CollRow> = match algo {
            Some(a) if a != "auto" && of_op.iter().any(|r| r.algo == a) => {
                of_op.into_iter().filter(|r| r.algo == a).collect()
            }
            _ => of_op,
        };
        let mut best: BTreeMap<u64, f64> = BTreeMap::new();
        for r in chosen {
            let e = best.entry(r.size_bytes as u64).or_insert(f64::INFINITY);
            *e = e.min(r.median_us);
        }
        best.into_iter()
            .filter(|(_, t)| t.is_finite())
            .map(|(s, t)| (s as f64, t))
            .collect()
    }

    /// µs for an all-reduce of `bytes` on `n` ranks, and where the figure comes from.
    pub fn all_reduce_us(&self, n: usize, bytes: f64, algo: Option<&str>) -> Option<(f64, String)> {
        if n <= 1 {
            return Some((0.0, "one rank: no communication".into()));
        }
        let pts = self.coll_points(n, "all-reduce", algo);
        if let Some(t) = interpolate(&pts, bytes) {
            return Some((t, format!("all-reduce rows at {n} ranks")));
        }
        let p = self.p2p.as_ref()?;
        Some((
            all_reduce_model_us(p, n, bytes, algo),
            format!("all-reduce modelled from {}", self.p2p_source()),
        ))
    }

    /// µs for a broadcast of `bytes` to `n` ranks.
    pub fn broadcast_us(&self, n: usize, bytes: f64) -> Option<(f64, String)> {
        if n <= 1 {
            return Some((0.0, "one rank: no communication".into()));
        }
        let pts = self.coll_points(n, "broadcast", None);
        if let Some(t) = interpolate(&pts, bytes) {
            return Some((t, format!("broadcast rows at {n} ranks")));
        }
        let p = self.p2p.as_ref()?;
        Some((
            broadcast_model_us(p, n, bytes),
            format!("broadcast modelled from {}", self.p2p_source()),
        ))
    }

    /// µs for one message of `bytes` between two ranks: the link rows, else a 2-rank
    /// broadcast (one message), else a 2-rank all-reduce (one exchange).
    pub fn send_us(&self, bytes: f64) -> Option<(f64, String)> {
        if let Some(p) = &self.p2p {
            return Some((p.time_us(bytes), self.p2p_source()));
        }
        for op in ["broadcast", "all-reduce"] {
            let pts = self.coll_points(2, op, None);
            if let Some(t) = interpolate(&pts, bytes) {
                return Some((t, format!("2-rank {op} rows as one message")));
            }
        }
        None
    }

    fn p2p_source(&self) -> String {
        match (&self.p2p, self.source) {
            (Some(p), "published") => format!(
                "published one-way {:.2} us and {:.0} Gbit/s",
                p.alpha_us,
                p.beta_bytes_per_us * 8.0 * 1e6 / 1e9
            ),
            (Some(p), _) => format!(
                "link rows ({:.2} us one-way, {:.1} Gbit/s streaming)",
                p.alpha_us,
                p.beta_bytes_per_us * 8.0 * 1e6 / 1e9
            ),
            (None, _) => "no link rows".into(),
        }
    }
}

/// The messages one decoded token sends, as the built-in decode sends them
/// (suites/infer/src/decode/model/shard.rs): tensor parallel, two all-reduces of the hidden vector
/// (f64 on the wire) per layer and one max-location all-reduce (16 bytes) over the output's
/// shares; pipeline parallel, one hand-off of the hidden vector (f64) per stage boundary and
/// the last stage's choice broadcast (8 bytes).
pub fn decode_comm_us(
    net: &NetworkFigures,
    tensor_parallel: bool,
    n: usize,
    layers: usize,
    dim: usize,
    algo: Option<&str>,
) -> Option<(f64, String)> {
    if n <= 1 {
        return Some((0.0, "one rank: no communication".into()));
    }
    let hidden = 8.0 * dim as f64;
    if tensor_parallel {
        let (sum, from) = net.all_reduce_us(n, hidden, algo)?;
        let (maxloc, _) = net.all_reduce_us(n, 16.0, Some("rd"))?;
        Some((2.0 * layers as f64 * sum + maxloc, from))
    } else {
        let (hand, from) = net.send_us(hidden)?;
        let (choice, _) = net
            .broadcast_us(n, 8.0)
            .or_else(|| net.send_us(8.0).map(|(t, f)| (t * rounds(n), f)))?;
        Some(((n - 1) as f64 * hand + choice, from))
    }
}

/// HPL's communication in seconds for an N x N solve with block NB on a P x Q grid, with no
/// overlap of communication and update (so the Gflops it gives are a floor): per panel, the
/// panel's local rows (m/P x NB doubles) broadcast along the Q columns of the process row,
/// and the NB pivot rows of the trailing columns (NB x m/Q doubles) exchanged among the P
/// ranks of a process column.
pub fn hpl_comm_s(net: &NetworkFigures, n: usize, nb: usize, p: usize, q: usize) -> Option<f64> {
    if p * q <= 1 {
        return Some(0.0);
    }
    let mut us = 0.0;
    let mut m = n;
    while m > 0 {
        let panel = (m as f64 / p as f64) * nb.min(m) as f64 * 8.0;
        if q > 1 {
            us += net.broadcast_us(q, panel)?.0;
        }
        if p > 1 {
            let rows = nb.min(m) as f64 * (m as f64 / q as f64) * 8.0;
            us += rounds(p) * net.send_us(rows)?.0;
        }
        m = m.saturating_sub(nb);
    }
    Some(us * 1e-6)
}

/// A cabling predicted for: every pair cabled (a full mesh) or each host to two neighbours
/// (a ring), with this many cables between each cabled pair (a message striped over them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cabling {
    pub mesh: bool,
    pub per_pair: usize,
}

impl Cabling {
    pub fn name(&self) -> String {
        let shape = if self.mesh { "full mesh" } else { "ring" };
        match (self.per_pair, self.mesh) {
            (1, _) => shape.to_string(),
            (k, true) => format!("{shape}, {k} cables per pair"),
            (k, false) => format!("{shape}, {k} cables per neighbour"),
        }
    }

    /// One message between two cabled ranks: from [`STRIPE_MIN`] up its share on each of the
    /// pair's cables at once, below on one cable (tbbench's TCP stripes no smaller message;
    /// a pair's other cables carry other messages meanwhile).
    fn over(&self, p: &PointToPoint, bytes: f64) -> f64 {
        if bytes >= STRIPE_MIN as f64 {
            p.time_us(bytes / self.per_pair.max(1) as f64)
        } else {
            p.time_us(bytes)
        }
    }
}

/// An all-reduce of `bytes` on `n` ranks over cables whose each is `p`, by what tbbench's auto
/// may run on the cabling: on a ring only the ring, both ways round it at once (half the array
/// each way, 2(n−1) steps of bytes/2n); on a full mesh also mesh (every peer's share on its own
/// cable at once: 2 steps of bytes/n) and recursive doubling (log2 n exchanges of the whole
/// array, powers of two). Two ranks: one exchange of the whole array each way.
pub fn all_reduce_cabled_us(p: &PointToPoint, c: Cabling, n: usize, bytes: f64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let nf = n as f64;
    if n == 2 {
        return c.over(p, bytes).min(2.0 * c.over(p, bytes / 2.0));
    }
    let ring = 2.0 * (nf - 1.0) * c.over(p, bytes / (2.0 * nf));
    if !c.mesh {
        return ring;
    }
    let mesh = 2.0 * c.over(p, bytes / nf);
    let rd = if n.is_power_of_two() {
        n.trailing_zeros() as f64 * c.over(p, bytes)
    } else {
        f64::INFINITY
    };
    ring.min(mesh).min(rd)
}

/// A broadcast of `bytes` to `n` ranks: a binomial tree on a full mesh (⌈log2 n⌉ rounds), down
/// both ways round a ring (⌊n/2⌋ hops).
pub fn broadcast_cabled_us(p: &PointToPoint, c: Cabling, n: usize, bytes: f64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let steps = if c.mesh { rounds(n) } else { (n / 2) as f64 };
    steps * c.over(p, bytes)
}

/// Communication per decoded token on a cabling (as [`decode_comm_us`]): tensor parallel, two
/// all-reduces of the hidden state per layer and the sampled token's all-reduce; pipeline, the
/// hidden state handed from stage to stage (neighbours on either cabling) and the choice
/// broadcast.
pub fn decode_comm_cabled_us(
    p: &PointToPoint,
    c: Cabling,
    tensor_parallel: bool,
    n: usize,
    layers: usize,
    dim: usize,
) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let hidden = 8.0 * dim as f64;
    if tensor_parallel {
        2.0 * layers as f64 * all_reduce_cabled_us(p, c, n, hidden)
            + all_reduce_cabled_us(p, c, n, 16.0)
    } else {
        (n - 1) as f64 * c.over(p, hidden) + broadcast_cabled_us(p, c, n, 8.0)
    }
}

/// HPL's communication (as [`hpl_comm_s`]) on a cabling: the panel broadcast along each
/// process row and the row swaps down each column, every pair cabled. On a ring hpl maps its
/// grid so that rows and columns are neighbours, which holds for rows and columns of at most
/// two: a larger grid on a ring is None.
pub fn hpl_comm_cabled_s(
    p: &PointToPoint,
    c: Cabling,
    n: usize,
    nb: usize,
    rows: usize,
    cols: usize,
) -> Option<f64> {
    if rows * cols <= 1 {
        return Some(0.0);
    }
    if !c.mesh && (rows > 2 || cols > 2) {
        return None;
    }
    let mut us = 0.0;
    let mut m = n;
    while m > 0 {
        let panel = (m as f64 / rows as f64) * nb.min(m) as f64 * 8.0;
        if cols > 1 {
            us += broadcast_cabled_us(p, c, cols, panel);
        }
        if rows > 1 {
            let swapped = nb.min(m) as f64 * (m as f64 / cols as f64) * 8.0;
            us += rounds(rows) * c.over(p, swapped);
        }
        m = m.saturating_sub(nb);
    }
    Some(us * 1e-6)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn interpolation_is_linear_inside_and_extends_outside() {
        let pts = [(8.0, 10.0), (1024.0, 20.0), (4096.0, 50.0)];
        assert!(close(interpolate(&pts, 8.0).unwrap(), 10.0));
        assert!(close(interpolate(&pts, 2560.0).unwrap(), 35.0));
        // Beyond the largest size: the last segment's line.
        assert!(close(interpolate(&pts, 7168.0).unwrap(), 80.0));
        // Below the smallest: no faster than it.
        assert!(close(interpolate(&pts, 1.0).unwrap(), 10.0));
        assert_eq!(interpolate(&[], 5.0), None);
        assert_eq!(interpolate(&[(4.0, 3.0)], 500.0), Some(3.0));
    }

    #[test]
    fn point_to_point_uses_latency_rows_then_the_streaming_rate() {
        // 5 us at 8 B, 9 us at 64 KiB; 10 Gbit/s streaming = 1250 bytes per us.
        let p = PointToPoint::fit(&[(8.0, 5.0), (65536.0, 9.0)], &[(65536.0, 10.0)]).unwrap();
        assert!(close(p.alpha_us, 5.0));
        assert!(close(p.beta_bytes_per_us, 1250.0));
        assert!(close(p.time_us(8.0), 5.0));
        assert!(close(p.time_us(32772.0), 7.0));
        assert!(close(p.time_us(1_250_000.0), 1005.0));
        let r = PointToPoint::published_rdma_tb5();
        assert!(close(r.time_us(0.0), 4.15));
        // 75 Gbit/s: 9375 bytes per us.
        assert!(close(r.time_us(9375.0), 5.15));
        assert!(PointToPoint::fit(&[], &[(8.0, 1.0)]).is_none());
    }

    #[test]
    fn all_reduce_models_follow_the_algorithms_steps() {
        let p = PointToPoint::fit(&[(1.0, 10.0)], &[(1e6, 8.0)]).unwrap(); // 1000 B/us
                                                                           // 2 ranks, 1 MB: ring 2 x (10 + 500); rd one exchange 10 + 1000; mesh 2 x (10 + 500).
        assert!(close(all_reduce_model_us(&p, 2, 1e6, Some("ring")), 1020.0));
        assert!(close(all_reduce_model_us(&p, 2, 1e6, Some("rd")), 1010.0));
        assert!(close(all_reduce_model_us(&p, 2, 1e6, None), 1010.0));
        // 3 ranks: rd folds (one round plus two hand-offs).
        assert!(close(
            all_reduce_model_us(&p, 3, 1e3, Some("rd")),
            3.0 * 11.0
        ));
        assert!(close(
            all_reduce_model_us(&p, 4, 1e3, Some("rd")),
            2.0 * 11.0
        ));
        assert_eq!(all_reduce_model_us(&p, 1, 1e6, None), 0.0);
        assert!(close(broadcast_model_us(&p, 5, 0.0), 30.0));
    }

    #[test]
    fn measured_collective_rows_win_over_the_model_and_take_the_fastest_algorithm() {
        let row = |algo: &str, size: f64, t: f64| CollRow {
            op: "all-reduce".into(),
            algo: algo.into(),
            size_bytes: size,
            median_us: t,
        };
        let mut net = NetworkFigures {
            label: "tcp".into(),
            source: "measured",
            p2p: PointToPoint::fit(&[(1.0, 100.0)], &[(1e6, 1.0)]),
            ..Default::default()
        };
        net.coll.insert(
            2,
            vec![
                row("ring", 8.0, 30.0),
                row("rd", 8.0, 20.0),
                row("ring", 8192.0, 40.0),
                row("rd", 8192.0, 60.0),
            ],
        );
        let (t, from) = net.all_reduce_us(2, 8.0, None).unwrap();
        assert!(close(t, 20.0) && from.contains("rows"), "{t} {from}");
        assert!(close(net.all_reduce_us(2, 8192.0, None).unwrap().0, 40.0));
        assert!(close(
            net.all_reduce_us(2, 8192.0, Some("rd")).unwrap().0,
            60.0
        ));
        // 4 ranks were not measured: the link model.
        let (t4, from4) = net.all_reduce_us(4, 8.0, None).unwrap();
        assert!(t4 > 100.0 && from4.contains("modelled"), "{t4} {from4}");
    }

    #[test]
    fn decode_sends_two_all_reduces_per_layer_or_one_hand_off_per_stage() {
        let net = NetworkFigures {
            source: "measured",
            p2p: PointToPoint::fit(&[(1.0, 10.0)], &[(1e6, 8.0)]),
            ..Default::default()
        };
        // tp, 2 ranks, 4 layers, dim 1000: 8 x (10 + 8000/1000) + (10 + 0.016).
        let (tp, _) = decode_comm_us(&net, true, 2, 4, 1000, None).unwrap();
        assert!(close(tp, 8.0 * 18.0 + 10.016), "{tp}");
        // pp, 3 ranks: 2 hand-offs of 8000 B and a 2-round broadcast of 8 B.
        let (pp, _) = decode_comm_us(&net, false, 3, 4, 1000, None).unwrap();
        assert!(close(pp, 2.0 * 18.0 + 2.0 * 10.008), "{pp}");
        assert_eq!(decode_comm_us(&net, true, 1, 4, 1000, None).unwrap().0, 0.0);
    }

    #[test]
    fn hpl_grid_and_communication() {
        // The grid and flop count predict uses are the hpl suite's own.
        let squarest = |n| {
            let g = tbbench_hpl::grid::Grid::squarest(n, tbbench_hpl::grid::ProcessMap::RowMajor);
            (g.p, g.q)
        };
        assert_eq!(squarest(1), (1, 1));
        assert_eq!(squarest(2), (1, 2));
        assert_eq!(squarest(4), (2, 2));
        assert_eq!(squarest(6), (2, 3));
        assert_eq!(squarest(7), (1, 7));
        let net = NetworkFigures {
            source: "measured",
            p2p: PointToPoint::fit(&[(1.0, 0.0001)], &[(1e6, 8.0)]),
            ..Default::default()
        };
        // 1 x 2, N = 2 NB: panels of 2NB x NB and NB x NB doubles, one round each.
        let s = hpl_comm_s(&net, 200, 100, 1, 2).unwrap();
        let want = (200.0 * 100.0 * 8.0 + 100.0 * 100.0 * 8.0) / 1000.0 * 1e-6;
        assert!((s - want).abs() < 1e-8, "{s} {want}");
        assert_eq!(hpl_comm_s(&net, 200, 100, 1, 1), Some(0.0));
        assert!(close(
            tbbench_hpl::check::flops(10),
            2.0 / 3.0 * 1000.0 + 150.0
        ));
    }

    #[test]
    fn cabled_all_reduce_keeps_to_what_each_cabling_can_run() {
        let p = PointToPoint::fit(&[(1.0, 10.0)], &[(1e6, 8.0)]).unwrap(); // 10 us, 1000 B/us
        let ring = Cabling {
            mesh: false,
            per_pair: 1,
        };
        let mesh = Cabling {
            mesh: true,
            per_pair: 1,
        };
        let ring2 = Cabling {
            mesh: false,
            per_pair: 2,
        };
        // 4 ranks, 8 MB: ring both ways 6 steps of 1 MB; mesh 2 steps of 2 MB; rd 2 of 8 MB.
        assert!(close(all_reduce_cabled_us(&p, ring, 4, 8e6), 6.0 * 1010.0));
        assert!(close(all_reduce_cabled_us(&p, mesh, 4, 8e6), 2.0 * 2010.0));
        // Two cables: each step's share halves on each cable, the latency does not.
        assert!(close(all_reduce_cabled_us(&p, ring2, 4, 8e6), 6.0 * 510.0));
        // Small: the ring's 6 latencies against rd's 2.
        assert!(close(all_reduce_cabled_us(&p, ring, 4, 16.0), 6.0 * 10.002));
        assert!(close(all_reduce_cabled_us(&p, mesh, 4, 16.0), 2.0 * 10.004));
        assert_eq!(all_reduce_cabled_us(&p, mesh, 1, 1e6), 0.0);
        assert!(close(all_reduce_cabled_us(&p, ring, 2, 1e6), 1010.0));
        assert!(close(broadcast_cabled_us(&p, ring, 4, 1e3), 2.0 * 11.0));
        assert!(close(broadcast_cabled_us(&p, mesh, 8, 1e3), 3.0 * 11.0));
        assert_eq!(hpl_comm_cabled_s(&p, ring, 1000, 100, 2, 3), None);
        assert!(hpl_comm_cabled_s(&p, mesh, 1000, 100, 2, 3).unwrap() > 0.0);
        assert_eq!(ring2.name(), "ring, 2 cables per neighbour");
        // Below STRIPE_MIN a message keeps to one cable: a second cable buys a decode's
        // all-reduce of a few KiB nothing.
        assert!(close(
            all_reduce_cabled_us(&p, ring2, 4, 24576.0),
            all_reduce_cabled_us(&p, ring, 4, 24576.0)
        ));
    }
}
