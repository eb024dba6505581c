use super::*;
use crate::session::PeerName;
use crate::transport::shm::{create_segment, ShmTransport};
use std::time::Duration;

/// `n` ranks as threads, each with its own shm transport, running `body`.
fn ranks<T: Send + 'static>(n: usize, token: u8, body: fn(&mut Comm) -> T) -> Vec<T> {
    let token = [token; 16];
    create_segment(&token, n).unwrap();
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            std::thread::spawn(move || {
                let names = (0..n)
                    .map(|rank| PeerName {
                        rank,
                        host: "test".into(),
                    })
                    .collect();
                let t =
                    ShmTransport::attach(rank, n, &token, names, Duration::from_secs(20)).unwrap();
                body(&mut Comm::new(Box::new(t)))
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn world_collectives_agree_on_every_rank() {
    let out = ranks(4, 21, |c| {
        let r = c.rank() as f64;
        c.barrier().unwrap();
        let mut b = if c.rank() == 2 { [7u8, 8, 9] } else { [0u8; 3] };
        c.bcast(2, &mut b).unwrap();
        let mut v = [r, -r, 0.1 * r];
        c.allreduce_f64(&mut v, ReduceOp::Sum).unwrap();
        let mut m = [r, -r];
        c.allreduce_f64(&mut m, ReduceOp::Max).unwrap();
        // Ranks 1 and 3 tie on |value| 5; the smaller index (10) wins.
        let (value, index) = match c.rank() {
            1 => (5.0, 30),
            3 => (5.0, 10),
            _ => (r, r as u64),
        };
        let loc = c.allreduce_maxloc(value, index).unwrap();
        let all = c.allgather_f64(&[r, r * 10.0]).unwrap();
        (b, v, m, loc, all)
    });
    for (b, v, m, loc, all) in &out {
        assert_eq!(*b, [7, 8, 9]);
        assert_eq!(v[0], 6.0);
        assert_eq!(v[1], -6.0);
        assert_eq!(m, &[3.0, 0.0]);
        assert_eq!(*loc, (5.0, 10));
        assert_eq!(all, &vec![0.0, 0.0, 1.0, 10.0, 2.0, 20.0, 3.0, 30.0]);
    }
    // Fixed trees: every rank holds bit-identical sums.
    assert!(out
        .iter()
        .all(|o| o.1[2].to_bits() == out[0].1[2].to_bits()));
}

/// Recursive doubling on every size up to 7 (powers of two and the folded ones): sums
/// whose order matters in the last bits, max and maxloc, bit-identical on every rank.
#[test]
fn all_reduce_agrees_bit_for_bit_on_any_size() {
    fn body(c: &mut Comm) -> ([f64; 3], [f64; 1], (f64, u64)) {
        let r = c.rank() as f64;
        let mut v = [0.1 * (r + 1.0), 1e16 + r, 1.0 / (r + 3.0)];
        c.allreduce_f64(&mut v, ReduceOp::Sum).unwrap();
        let mut m = [-(r - 2.0).abs()];
        c.allreduce_f64(&mut m, ReduceOp::Max).unwrap();
        let loc = c
            .allreduce_maxloc((r % 2.0) * 4.0, 100 - c.rank() as u64)
            .unwrap();
        // Partners must agree even on values plain comparisons cannot order.
        let odd = match c.rank() % 3 {
            0 => f64::NAN,
            1 => -0.0,
            _ => 0.0,
        };
        let odd_loc = c.allreduce_maxloc(odd, c.rank() as u64).unwrap();
        assert!(odd_loc.0.is_nan() && odd_loc.1 == 0, "{odd_loc:?}");
        (v, m, loc)
    }
    for (n, token) in [(2usize, 31u8), (3, 32), (4, 33), (5, 34), (6, 35), (7, 36)] {
        let out = ranks(n, token, body);
        let want: f64 = (0..n).map(|r| 0.1 * (r as f64 + 1.0)).sum();
        for (v, m, loc) in &out {
            assert!((v[0] - want).abs() < 1e-12, "{n} ranks: {} vs {want}", v[0]);
            assert_eq!(v[0].to_bits(), out[0].0[0].to_bits(), "{n} ranks");
            assert_eq!(v[2].to_bits(), out[0].0[2].to_bits(), "{n} ranks");
            assert_eq!(m[0], if n > 2 { 0.0 } else { -1.0 }, "{n} ranks");
            // Odd ranks carry 4.0; the highest odd rank has the smallest index.
            let last_odd = if n % 2 == 0 { n - 1 } else { n - 2 };
            assert_eq!(*loc, (4.0, 100 - last_odd as u64), "{n} ranks");
        }
    }
}

#[test]
fn group_collectives_stay_inside_the_group() {
    let out = ranks(4, 22, |c| {
        let r = c.rank();
        // Two groups at once, as the rows of a 2x2 grid: {0,1} and {2,3}.
        let row: &[usize] = if r < 2 { &[0, 1] } else { &[2, 3] };
        let mut v = [r as f64];
        c.allreduce_f64_in(Group::Members(row), &mut v, ReduceOp::Sum)
            .unwrap();
        let mut b = [r as u8];
        c.bcast_in(Group::Members(row), row[1], &mut b).unwrap();
        let loc = c
            .allreduce_maxloc_in(Group::Members(row), -(r as f64), r as u64)
            .unwrap();
        (v[0], b[0], loc)
    });
    assert_eq!(out[0], (1.0, 1, (-0.0, 0)));
    assert_eq!(out[1], (1.0, 1, (-0.0, 0)));
    assert_eq!(out[2], (5.0, 3, (-2.0, 2)));
    assert_eq!(out[3], (5.0, 3, (-2.0, 2)));
}

#[test]
fn group_gather_and_scatter_of_known_sizes_reach_every_member() {
    let out = ranks(4, 24, |c| {
        let r = c.rank();
        // The column {3, 1, 0} of some grid, rooted at its middle member; rank 2 idles.
        let col: &[usize] = &[3, 1, 0];
        if r == 2 {
            return (Vec::new(), Vec::new());
        }
        let root = 1;
        // Member i sends i + 1 bytes of value 10·rank; member 1 (the root) keeps its own.
        let idx = col.iter().position(|x| *x == r).unwrap();
        let mine = vec![10 * r as u8; idx + 1];
        let mut bufs: Vec<Vec<u8>> = (0..3).map(|i| vec![0u8; i + 1]).collect();
        {
            let mut parts: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
            c.gatherv_in(Group::Members(col), root, &mine, &mut parts)
                .unwrap();
        }
        // Back out: member i gets 2·i bytes of value i + 100 (member 0: nothing at all).
        let outs: Vec<Vec<u8>> = (0..3).map(|i| vec![i as u8 + 100; 2 * i]).collect();
        let refs: Vec<&[u8]> = outs.iter().map(|b| &b[..]).collect();
        let mut got = vec![0u8; 2 * idx];
        if r != root {
            c.scatterv_in(Group::Members(col), root, &refs, &mut got)
                .unwrap();
        } else {
            c.scatterv_in(Group::Members(col), root, &refs, &mut [])
                .unwrap();
        }
        (bufs.concat(), got)
    });
    // The root (rank 1) holds rank 3's byte and rank 0's three bytes; its own stays zero.
    assert_eq!(out[1].0, vec![30, 0, 0, 0, 0, 0]);
    assert_eq!(out[0].1, vec![102; 4]);
    assert_eq!(out[3].1, Vec::<u8>::new());
}

#[test]
fn every_broadcast_variant_delivers_from_every_root() {
    let out = ranks(5, 23, |c| {
        let mut got = Vec::new();
        // Long enough that "Lng" really scatters (5 pieces of more than 4 KiB).
        let len = 5 * 4096 + 7;
        for root in 0..5 {
            for variant in 0..6 {
                let mut b = vec![0u8; len];
                if c.rank() == root {
                    for (i, x) in b.iter_mut().enumerate() {
                        *x = (i * 31 + root * 7 + variant) as u8;
                    }
                }
                let g = Group::All;
                match variant {
                    0 => c.bcast_ring_in(g, root, &mut b),
                    1 => c.bcast_two_ring_in(g, root, &mut b),
                    2 => c.bcast_long_in(g, root, &mut b),
                    3 => c.bcast_modified_in(g, root, &mut b, Comm::bcast_ring_in),
                    4 => c.bcast_modified_in(g, root, &mut b, Comm::bcast_two_ring_in),
                    _ => c.bcast_modified_in(g, root, &mut b, Comm::bcast_long_in),
                }
                .unwrap();
                let ok = b
                    .iter()
                    .enumerate()
                    .all(|(i, x)| *x == (i * 31 + root * 7 + variant) as u8);
                got.push(ok);
            }
        }
        got
    });
    for (r, oks) in out.iter().enumerate() {
        assert!(oks.iter().all(|o| *o), "rank {r}: {oks:?}");
    }
}

/// A small integer from rank and index: sums of a few of them are exact in every dtype, so
/// results compare exactly whatever order an algorithm adds in.
fn input(rank: usize, i: usize) -> f64 {
    ((rank * 7 + i * 13) % 5) as f64 - 2.0
}

/// Every op by every algorithm it has, on 1 to 5 ranks (so non-powers of two and counts that
/// do not divide), checked element by element on every rank.
fn every_op_and_algorithm<T: Element>(c: &mut Comm) -> Vec<String> {
    let (me, n) = (c.rank(), c.size());
    let mut wrong = Vec::new();
    let mut check = |what: String, got: &[T], want: &dyn Fn(usize) -> f64| {
        if let Some(i) = (0..got.len()).find(|&i| got[i].to_f64() != want(i)) {
            wrong.push(format!(
                "{what} on {n} ranks, rank {me}: element {i} is {} not {}",
                got[i].to_f64(),
                want(i)
            ));
        }
    };
    let sum = |i: usize| (0..n).map(|r| input(r, i)).sum::<f64>();
    for &count in &[1usize, 7, 1000, 70_001] {
        for algo in CollOp::AllReduce.algos().iter().chain([&Algo::Auto]) {
            for op in [ReduceOp::Sum, ReduceOp::Max] {
                let mut d: Vec<T> = (0..count).map(|i| T::from_f64(input(me, i))).collect();
                let ran = c.all_reduce(&mut d, op, *algo).unwrap();
                let want = |i: usize| match op {
                    ReduceOp::Sum => sum(i),
                    _ => (0..n).map(|r| input(r, i)).fold(f64::MIN, f64::max),
                };
                check(
                    format!(
                        "all-reduce {op:?} {} ({}) count {count}",
                        algo.name(),
                        ran.name()
                    ),
                    &d,
                    &want,
                );
                // Out of place: the output starts as garbage, the input must stay as it was.
                let own: Vec<T> = (0..count).map(|i| T::from_f64(input(me, i))).collect();
                let mut d: Vec<T> = vec![T::from_f64(99.0); count];
                c.all_reduce_from(Group::All, &own, &mut d, op, *algo)
                    .unwrap();
                let what = format!(
                    "all-reduce out of place {op:?} {} count {count}",
                    algo.name()
                );
                check(what.clone(), &d, &want);
                check(format!("{what}: input"), &own, &|i| input(me, i));
            }
        }
        let block = count.div_ceil(n);
        for algo in [Algo::Ring, Algo::Mesh, Algo::Rd, Algo::Auto] {
            if CollOp::ReduceScatter.supports(algo, n).is_err() {
                continue;
            }
            let mut d: Vec<T> = (0..block * n).map(|i| T::from_f64(input(me, i))).collect();
            c.reduce_scatter_in(Group::All, &mut d, ReduceOp::Sum, algo)
                .unwrap();
            check(
                format!("reduce-scatter {} count {count}", algo.name()),
                &d[me * block..(me + 1) * block],
                &|i| sum(me * block + i),
            );
            let own: Vec<T> = (0..block * n).map(|i| T::from_f64(input(me, i))).collect();
            let mut d: Vec<T> = vec![T::from_f64(99.0); block * n];
            c.reduce_scatter_from(Group::All, &own, &mut d, ReduceOp::Sum, algo)
                .unwrap();
            let what = format!("reduce-scatter out of place {} count {count}", algo.name());
            check(what.clone(), &d[me * block..(me + 1) * block], &|i| {
                sum(me * block + i)
            });
            check(format!("{what}: input"), &own, &|i| input(me, i));
            let mut d: Vec<T> = vec![T::default(); block * n];
            for i in 0..block {
                d[me * block + i] = T::from_f64(input(me, i));
            }
            c.all_gather_in(Group::All, &mut d, algo).unwrap();
            check(
                format!("all-gather {} count {count}", algo.name()),
                &d,
                &|i| input(i / block, i % block),
            );
            let own: Vec<T> = (0..block).map(|i| T::from_f64(input(me, i))).collect();
            let mut d: Vec<T> = vec![T::default(); block * n];
            c.all_gather_from(Group::All, &own, &mut d, algo).unwrap();
            check(
                format!("all-gather out of place {} count {count}", algo.name()),
                &d,
                &|i| input(i / block, i % block),
            );
        }
        for root in [0, n - 1] {
            for algo in [Algo::Ring, Algo::Mesh, Algo::Tree, Algo::Auto] {
                let mut d: Vec<T> = (0..count)
                    .map(|i| T::from_f64(if me == root { input(root, i) } else { 0.0 }))
                    .collect();
                c.broadcast_in(Group::All, root, &mut d, algo).unwrap();
                check(
                    format!("broadcast {} root {root} count {count}", algo.name()),
                    &d,
                    &|i| input(root, i),
                );
                let mut d: Vec<T> = (0..count).map(|i| T::from_f64(input(me, i))).collect();
                c.reduce_in(Group::All, root, &mut d, ReduceOp::Sum, algo)
                    .unwrap();
                if me == root {
                    check(
                        format!("reduce {} root {root} count {count}", algo.name()),
                        &d,
                        &sum,
                    );
                }
                let own: Vec<T> = (0..count).map(|i| T::from_f64(input(me, i))).collect();
                let mut d: Vec<T> = vec![T::from_f64(99.0); count];
                c.reduce_from(Group::All, root, &own, &mut d, ReduceOp::Sum, algo)
                    .unwrap();
                let what = format!(
                    "reduce out of place {} root {root} count {count}",
                    algo.name()
                );
                if me == root {
                    check(what.clone(), &d, &sum);
                }
                check(format!("{what}: input"), &own, &|i| input(me, i));
            }
        }
        for algo in [Algo::Ring, Algo::Mesh] {
            let send: Vec<T> = (0..block * n).map(|i| T::from_f64(input(me, i))).collect();
            let mut recv = vec![T::default(); block * n];
            c.all_to_all_in(Group::All, &send, &mut recv, algo).unwrap();
            check(
                format!("all-to-all {} count {count}", algo.name()),
                &recv,
                &|i| input(i / block, me * block + i % block),
            );
        }
    }
    wrong
}

#[test]
fn every_collective_and_algorithm_is_exact_on_one_to_five_ranks() {
    for (n, token) in [(1usize, 41u8), (2, 42), (3, 43), (4, 44), (5, 45)] {
        let f32s = ranks(n, token, every_op_and_algorithm::<f32>);
        let wrong: Vec<&String> = f32s.iter().flatten().collect();
        assert!(wrong.is_empty(), "f32: {wrong:#?}");
    }
    for (n, token) in [(3usize, 46u8), (4, 47)] {
        for wrong in [
            ranks(n, token, every_op_and_algorithm::<f64>),
            ranks(n, token + 10, every_op_and_algorithm::<half::f16>),
            ranks(n, token + 20, every_op_and_algorithm::<half::bf16>),
        ] {
            let wrong: Vec<&String> = wrong.iter().flatten().collect();
            assert!(wrong.is_empty(), "{wrong:#?}");
        }
    }
}

/// Sums whose order matters in the last bits still come out bit-identical on every rank, by
/// every all-reduce algorithm (the decode compares ranks' logits bit for bit).
#[test]
fn every_all_reduce_algorithm_gives_every_rank_the_same_bits() {
    for (n, token) in [(3usize, 71u8), (4, 72), (5, 73)] {
        let out = ranks(n, token, |c| {
            let r = c.rank() as f32;
            Algo::EXPLICIT
                .iter()
                .map(|a| {
                    let mut v: Vec<f32> = (0..100_000)
                        .map(|i| 0.1 * (r + 1.0) + 1e-3 * i as f32 / (r + 3.0))
                        .collect();
                    c.all_reduce(&mut v, ReduceOp::Sum, *a).unwrap();
                    v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
                })
                .collect::<Vec<_>>()
        });
        for o in &out {
            assert!(o == &out[0], "{n} ranks: ranks disagree");
        }
    }
}

#[test]
fn auto_follows_the_probed_size_nearest_on_a_log_scale() {
    let tuning = Tuning {
        entries: vec![(
            CollOp::AllReduce,
            vec![
                (8, Algo::Tree),
                (1024, Algo::Rd),
                (65536, Algo::Mesh),
                (1 << 20, Algo::Ring),
            ],
        )],
    };
    let pick = |bytes| tuning.pick(CollOp::AllReduce, bytes);
    assert_eq!(pick(0), Some(Algo::Tree));
    assert_eq!(pick(8), Some(Algo::Tree));
    // 90 is 11.25x above 8 and 11.4x below 1024; 91 is 11.375x and 11.25x.
    assert_eq!(pick(90), Some(Algo::Tree));
    assert_eq!(pick(91), Some(Algo::Rd));
    // 8192 is 8x from both neighbours: the smaller size wins a tie.
    assert_eq!(pick(8192), Some(Algo::Rd));
    assert_eq!(pick(8193), Some(Algo::Mesh));
    assert_eq!(pick(usize::MAX), Some(Algo::Ring));
    assert_eq!(tuning.pick(CollOp::Broadcast, 8), None);
}

/// A transport that notes every pair of ranks it moves bytes between.
struct Recorder {
    inner: Box<dyn crate::transport::Transport>,
    seen: std::sync::Arc<std::sync::Mutex<Vec<[usize; 2]>>>,
}

impl crate::transport::Transport for Recorder {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn alloc(&mut self, len: usize) -> Result<crate::transport::Buffer> {
        self.inner.alloc(len)
    }
    fn exchange(
        &mut self,
        sends: &[crate::transport::SendOp],
        recvs: &mut [crate::transport::RecvOp],
    ) -> Result<()> {
        let me = self.inner.rank();
        let peers = sends
            .iter()
            .filter(|s| !s.buf.is_empty())
            .map(|s| s.peer)
            .chain(recvs.iter().filter(|r| !r.buf.is_empty()).map(|r| r.peer));
        let mut seen = self.seen.lock().unwrap();
        for p in peers {
            let pair = [me.min(p), me.max(p)];
            if !seen.contains(&pair) {
                seen.push(pair);
            }
        }
        drop(seen);
        self.inner.exchange(sends, recvs)
    }
    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }
    fn set_timeout(&mut self, timeout: Duration) -> Result<()> {
        self.inner.set_timeout(timeout)
    }
    fn set_waiting(&mut self, waiting: crate::transport::Waiting) {
        self.inner.set_waiting(waiting)
    }
    fn set_traffic(&mut self, traffic: crate::transport::Traffic) {
        self.inner.set_traffic(traffic)
    }
    fn reduce_segment(&self) -> Option<usize> {
        self.inner.reduce_segment()
    }
}

/// `CollOp::pairs` is what a cabling must link for an algorithm to keep to its cables, so it
/// must hold every pair the algorithm really moves bytes between: checked by recording them,
/// for every op and algorithm on 2 to 8 ranks, short and long (halving-doubling) sizes,
/// broadcast and reduce from a root other than 0.
#[test]
fn every_algorithm_moves_data_only_between_the_pairs_it_declares() {
    use crate::comm::algo::CollOp;
    let ops = CollOp::NAMED;
    let mut case = 0u8;
    for n in [2usize, 3, 4, 5, 6, 8] {
        for op in ops {
            for &algo in op.algos() {
                if op.supports(algo, n).is_err() {
                    continue;
                }
                for count in [8usize * n, 24_000] {
                    case = case.wrapping_add(1);
                    let token = [
                        0xA7,
                        case,
                        n as u8,
                        count as u8,
                        9,
                        9,
                        9,
                        9,
                        9,
                        9,
                        9,
                        9,
                        9,
                        9,
                        9,
                        9,
                    ];
                    create_segment(&token, n).unwrap();
                    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
                    let root = 1 % n;
                    let handles: Vec<_> = (0..n)
                        .map(|rank| {
                            let seen = seen.clone();
                            std::thread::spawn(move || {
                                let names = (0..n)
                                    .map(|rank| PeerName {
                                        rank,
                                        host: "test".into(),
                                    })
                                    .collect();
                                let t = ShmTransport::attach(
                                    rank,
                                    n,
                                    &token,
                                    names,
                                    Duration::from_secs(20),
                                )
                                .unwrap();
                                let mut c = Comm::new(Box::new(Recorder {
                                    inner: Box::new(t),
                                    seen,
                                }));
                                let mut data = vec![rank as f64; count];
                                let g = Group::All;
                                match op {
                                    CollOp::AllReduce => c
                                        .all_reduce_in(g, &mut data, ReduceOp::Sum, algo)
                                        .map(|_| ()),
                                    CollOp::ReduceScatter => c
                                        .reduce_scatter_in(g, &mut data, ReduceOp::Sum, algo)
                                        .map(|_| ()),
                                    CollOp::AllGather => {
                                        c.all_gather_in(g, &mut data, algo).map(|_| ())
                                    }
                                    CollOp::Broadcast => {
                                        c.broadcast_in(g, root, &mut data, algo).map(|_| ())
                                    }
                                    CollOp::Reduce => c
                                        .reduce_in(g, root, &mut data, ReduceOp::Sum, algo)
                                        .map(|_| ()),
                                    CollOp::AllToAll => {
                                        let send = data.clone();
                                        c.all_to_all_in(g, &send, &mut data, algo).map(|_| ())
                                    }
                                    CollOp::PingPong => {
                                        c.ping_pong_in(g, None, &mut data, algo).map(|_| ())
                                    }
                                }
                                .unwrap();
                            })
                        })
                        .collect();
                    for h in handles {
                        h.join().unwrap();
                    }
                    crate::transport::shm::unlink_segment(&token);
                    let declared = op.pairs(algo, n, root);
                    let seen = seen.lock().unwrap().clone();
                    for p in &seen {
                        assert!(
                            declared.contains(p),
                            "{} by {} on {n} ranks ({count} elements) moved data between {p:?}, not among {declared:?}",
                            op.name(),
                            algo.name()
                        );
                    }
                }
            }
        }
    }
}

/// A 4-ring cabled 0-2-1-3-0 (the hostfile lists the hosts another way round than the cables
/// run): with the cables' ring order, all-reduce, broadcast, reduce, all-gather and
/// reduce-scatter by ring and by auto run round the cables and only between neighbours, every
/// result exact (all-gather's and reduce-scatter's blocks at their ranks' places); the small collectives
/// (barrier, gather, an all-reduce of a few values) go along the cables too.
#[test]
fn collectives_follow_a_ring_cabled_out_of_rank_order() {
    use crate::comm::algo::CollOp;
    let n = 4;
    let unlinked = vec![[0, 1], [2, 3]];
    let order = vec![0, 2, 1, 3];
    for (case, (op, algo)) in [
        (CollOp::AllReduce, Algo::Ring),
        (CollOp::AllReduce, Algo::Auto),
        (CollOp::Broadcast, Algo::Ring),
        (CollOp::Reduce, Algo::Ring),
        (CollOp::Reduce, Algo::Auto),
        (CollOp::AllGather, Algo::Ring),
        (CollOp::AllGather, Algo::Auto),
        (CollOp::ReduceScatter, Algo::Ring),
        (CollOp::ReduceScatter, Algo::Auto),
    ]
    .into_iter()
    .enumerate()
    {
        let token = [0xB3, case as u8, 4, 2, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7];
        create_segment(&token, n).unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let (seen, unlinked, order) = (seen.clone(), unlinked.clone(), order.clone());
                std::thread::spawn(move || {
                    let names = (0..n)
                        .map(|rank| PeerName {
                            rank,
                            host: "test".into(),
                        })
                        .collect();
                    let t = ShmTransport::attach(rank, n, &token, names, Duration::from_secs(20))
                        .unwrap();
                    let mut c = Comm::new(Box::new(Recorder {
                        inner: Box::new(t),
                        seen,
                    }));
                    c.set_unlinked(unlinked);
                    c.set_ring_order(order);
                    c.check(op, algo, Group::All, 1).unwrap();
                    let count = 6000;
                    let mut data: Vec<f64> =
                        (0..count).map(|i| (rank * count + i) as f64).collect();
                    let sum = |i: usize| (0..n).map(|r| (r * count + i) as f64).sum::<f64>();
                    match op {
                        CollOp::AllReduce => {
                            let ran = c.all_reduce(&mut data, ReduceOp::Sum, algo).unwrap();
                            assert_eq!(ran, Algo::Ring, "auto takes the ring on its cables");
                            assert!((0..count).all(|i| data[i] == sum(i)));
                        }
                        CollOp::Broadcast => {
                            c.broadcast_in(Group::All, 1, &mut data, algo).unwrap();
                            assert!((0..count).all(|i| data[i] == (count + i) as f64));
                        }
                        CollOp::AllGather => {
                            // Each rank's block of 1500, at its own place in rank order.
                            let block = count / n;
                            let mine: Vec<f64> = (0..block)
                                .map(|i| (rank * block + i) as f64 + 0.5)
                                .collect();
                            let ran = c
                                .all_gather_from(Group::All, &mine, &mut data, algo)
                                .unwrap();
                            assert_eq!(ran, Algo::Ring, "auto takes the ring on its cables");
                            assert!((0..count).all(|i| data[i] == i as f64 + 0.5));
                        }
                        CollOp::ReduceScatter => {
                            let block = count / n;
                            let input = data.clone();
                            let ran = c
                                .reduce_scatter_from(
                                    Group::All,
                                    &input,
                                    &mut data,
                                    ReduceOp::Sum,
                                    algo,
                                )
                                .unwrap();
                            assert_eq!(ran, Algo::Ring, "auto takes the ring on its cables");
                            let own = rank * block..(rank + 1) * block;
                            assert!(own.clone().all(|i| data[i] == sum(i)), "rank {rank}");
                        }
                        _ => {
                            c.reduce_in(Group::All, 1, &mut data, ReduceOp::Sum, algo)
                                .unwrap();
                            if rank == 1 {
                                assert!((0..count).all(|i| data[i] == sum(i)));
                            }
                        }
                    }
                    c.barrier().unwrap();
                    let all = c.gather(0, &[rank as u8; 3]).unwrap();
                    if rank == 0 {
                        let all = all.unwrap();
                        assert!((0..n).all(|r| all[r] == vec![r as u8; 3]));
                    }
                    let mut few = [rank as f64, 1.0];
                    c.allreduce_f64(&mut few, ReduceOp::Sum).unwrap();
                    assert_eq!(few, [6.0, 4.0]);
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        crate::transport::shm::unlink_segment(&token);
        let seen = seen.lock().unwrap().clone();
        for p in &seen {
            assert!(
                !unlinked.contains(p),
                "{} by {} moved data between {p:?}, which has no cable",
                op.name(),
                algo.name()
            );
        }
    }
}

/// A group listed round a 6-ring cabled 0-2-4-1-3-5-0 (HPL's process row on a ring, in the
/// cables' order): its broadcast, all-reduce of a few values and maxloc go between
/// neighbours only, exact and the same bits on every rank, and a message between two members
/// with no cable is relayed along the ring, the shorter way.
#[test]
fn a_group_round_a_ring_keeps_to_its_cables() {
    let n = 6;
    let order = vec![0usize, 2, 4, 1, 3, 5];
    let mut unlinked = Vec::new();
    for a in 0..n {
        for b in a + 1..n {
            let (ia, ib) = (
                order.iter().position(|&r| r == a).unwrap(),
                order.iter().position(|&r| r == b).unwrap(),
            );
            if (ia + 1) % n != ib && (ib + 1) % n != ia {
                unlinked.push([a, b]);
            }
        }
    }
    let token = [0xB5, 6, 4, 2, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9];
    create_segment(&token, n).unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let (seen, unlinked, order) = (seen.clone(), unlinked.clone(), order.clone());
            std::thread::spawn(move || {
                let names = (0..n)
                    .map(|rank| PeerName {
                        rank,
                        host: "test".into(),
                    })
                    .collect();
                let t =
                    ShmTransport::attach(rank, n, &token, names, Duration::from_secs(20)).unwrap();
                let mut c = Comm::new(Box::new(Recorder {
                    inner: Box::new(t),
                    seen,
                }));
                c.set_unlinked(unlinked);
                let g = Group::Members(&order);
                let mut buf = if rank == 1 { [7u8; 5000] } else { [0u8; 5000] };
                c.bcast_in(g, 1, &mut buf).unwrap();
                assert_eq!(buf, [7u8; 5000]);
                let mut few = [rank as f64 * 0.1, 1.0];
                c.allreduce_f64_in(g, &mut few, ReduceOp::Sum).unwrap();
                let want = (0..n).map(|r| r as f64 * 0.1).fold(0.0, |a, b| a + b);
                assert!((few[0] - want).abs() < 1e-12 && few[1] == 6.0, "{few:?}");
                let bits = c.allgather_f64(&few[..1]).unwrap();
                assert!(bits.iter().all(|b| b.to_bits() == few[0].to_bits()));
                let (v, at) = c
                    .allreduce_maxloc_in(g, (rank % 3) as f64, rank as u64)
                    .unwrap();
                assert_eq!((v, at), (2.0, 2));
                // 2 and 3 sit two apart in the ring's order (2, 4, 1, 3): relayed by 4 and 1;
                // 0 and 5 are neighbours (the ring closes).
                for (from, to) in [(2, 3), (0, 5), (4, 0)] {
                    let mut m = if rank == from {
                        [from as u8; 300]
                    } else {
                        [0u8; 300]
                    };
                    c.relay_in(g, from, to, &mut m).unwrap();
                    if rank == to {
                        assert_eq!(m, [from as u8; 300]);
                    }
                }
                c.barrier().unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    crate::transport::shm::unlink_segment(&token);
    for p in seen.lock().unwrap().iter() {
        assert!(
            !unlinked.contains(p),
            "data moved between {p:?}, which has no cable"
        );
    }
}

/// The ring all-reduce both ways round (cabled neighbours): exact on 3 to 6 ranks for counts
/// that split unevenly, in place and out of place, every rank with the same bits, and only
/// neighbours on the ring exchange anything.
#[test]
fn the_ring_both_ways_sums_exactly_between_neighbours_only() {
    for n in [3usize, 4, 5, 6] {
        for (k, count) in [2 * n, 1001, 40_000].into_iter().enumerate() {
            for out_of_place in [false, true] {
                let token = [
                    0xB4,
                    n as u8,
                    k as u8,
                    out_of_place as u8,
                    5,
                    5,
                    5,
                    5,
                    5,
                    5,
                    5,
                    5,
                    5,
                    5,
                    5,
                    5,
                ];
                create_segment(&token, n).unwrap();
                let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
                let results: Vec<Vec<f64>> = (0..n)
                    .map(|rank| {
                        let seen = seen.clone();
                        std::thread::spawn(move || {
                            let names = (0..n)
                                .map(|rank| PeerName {
                                    rank,
                                    host: "test".into(),
                                })
                                .collect();
                            let t = ShmTransport::attach(
                                rank,
                                n,
                                &token,
                                names,
                                Duration::from_secs(20),
                            )
                            .unwrap();
                            let mut c = Comm::new(Box::new(Recorder {
                                inner: Box::new(t),
                                seen,
                            }));
                            c.set_ring_both_ways(true);
                            // Values whose sums are exact in any order.
                            let mine: Vec<f64> =
                                (0..count).map(|i| ((rank + 1) * (i % 97)) as f64).collect();
                            let mut data = vec![0.0; count];
                            if out_of_place {
                                c.all_reduce_from(
                                    Group::All,
                                    &mine,
                                    &mut data,
                                    ReduceOp::Sum,
                                    Algo::Ring,
                                )
                                .unwrap();
                            } else {
                                data.copy_from_slice(&mine);
                                c.all_reduce(&mut data, ReduceOp::Sum, Algo::Ring).unwrap();
                            }
                            data
                        })
                    })
                    .collect::<Vec<_>>()
                    .into_iter()
                    .map(|h| h.join().unwrap())
                    .collect();
                crate::transport::shm::unlink_segment(&token);
                let total = (n * (n + 1) / 2) as f64;
                for (rank, data) in results.iter().enumerate() {
                    for (i, v) in data.iter().enumerate() {
                        assert_eq!(
                            *v,
                            total * (i % 97) as f64,
                            "n {n} count {count} rank {rank} [{i}]"
                        );
                    }
                    assert_eq!(data, &results[0]);
                }
                let neighbours: Vec<[usize; 2]> = (0..n)
                    .map(|i| [i.min((i + 1) % n), i.max((i + 1) % n)])
                    .collect();
                for p in seen.lock().unwrap().iter() {
                    assert!(
                        neighbours.contains(p),
                        "n {n}: {p:?} exchanged, not neighbours"
                    );
                }
            }
        }
    }
}
