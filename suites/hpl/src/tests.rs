//! The distributed factorization and solve against the single-process reference: ranks are
//! threads here, each with its own shared-memory transport, so every grid shape runs in a
//! unit test. (The end-to-end tests run real processes through `tbbench hpl`.)

use crate::factor::schedule::{self, Event};
use crate::factor::{factor, solve, Timings};
use crate::generator::HPL_SEED;
use crate::grid::owner;
use crate::grid::{Grid, ProcessMap};
use crate::input::Algorithm;
use crate::input::{Broadcast, Factorization, Swap};
use crate::matrix::LocalMatrix;
use crate::packed_product::{self, Product};
use crate::swap_solve::{self, Solver};
use crate::{check, reference};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tbbench_runners::comm::Comm;
use tbbench_runners::session::PeerName;
use tbbench_runners::transport::shm::{create_segment, ShmTransport};
use tbbench_runners::transport::{RecvOp, SendOp, Transport, Waiting};

/// A segment token no other test, in this process or another one running at the same time,
/// uses: segments are created exclusively, and the tests run in parallel.
fn fresh_token() -> [u8; 16] {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let mut token = [0xa5; 16];
    token[..4].copy_from_slice(&std::process::id().to_le_bytes());
    token[4..8].copy_from_slice(&NEXT.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    token
}

type Opts = Algorithm;

const DEFAULT: Opts = Algorithm {
    pfact: Factorization::Right,
    nbmin: 4,
    ndiv: 2,
    rfact: Factorization::Right,
    bcast: Broadcast::IncreasingRing,
    depth: 0,
    swap: Swap::Mix { threshold: 64 },
};

fn grid(p: usize, q: usize) -> Grid {
    Grid::new(p, q, ProcessMap::RowMajor)
}

/// Every rank's x.
fn distributed_x(n: usize, nb: usize, grid: Grid, o: Opts) -> Vec<Vec<f64>> {
    run_ranks(n, nb, grid, o)
        .into_iter()
        .map(|(x, _)| x)
        .collect()
}

/// Every rank's x and what its factorization did, in order.
fn run_ranks(n: usize, nb: usize, grid: Grid, o: Opts) -> Vec<(Vec<f64>, Vec<Event>)> {
    run_ranks_solving_u12_by(n, nb, grid, o, None)
}

/// As `run_ranks`, with every rank's U12 solver forced (None: the process's own choice).
fn run_ranks_solving_u12_by(
    n: usize,
    nb: usize,
    grid: Grid,
    o: Opts,
    u12: Option<Solver>,
) -> Vec<(Vec<f64>, Vec<Event>)> {
    run_ranks_with(n, nb, grid, o, u12, None, Product::Blas)
}

/// As `run_ranks_solving_u12_by`, every rank with `threads` threads for its steps (None: the
/// process's count, 1 in the tests) and the trailing update's `product` (the packed one only
/// where the CPU has its kernel: elsewhere the BLAS's).
fn run_ranks_with(
    n: usize,
    nb: usize,
    grid: Grid,
    o: Opts,
    u12: Option<Solver>,
    threads: Option<usize>,
    product: Product,
) -> Vec<(Vec<f64>, Vec<Event>)> {
    let product = if packed_product::available() {
        product
    } else {
        Product::Blas
    };
    let ranks = grid.size();
    let token = fresh_token();
    create_segment(&token, ranks).unwrap();
    let handles: Vec<_> = (0..ranks)
        .map(|rank| {
            let grid = grid.clone();
            std::thread::spawn(move || {
                let names = (0..ranks)
                    .map(|rank| PeerName {
                        rank,
                        host: "test".into(),
                    })
                    .collect();
                let t = ShmTransport::attach(rank, ranks, &token, names, Duration::from_secs(30))
                    .unwrap();
                // A grid laid in a ring's order runs on that ring's cables: only neighbours
                // in the order are linked, and a message between others fails, as over
                // verbs, where they have no queue pairs.
                let unlinked: Vec<[usize; 2]> = match &grid.order {
                    Some(order) => {
                        let at = |r: usize| order.iter().position(|&x| x == r).unwrap();
                        (0..ranks)
                            .flat_map(|a| (a + 1..ranks).map(move |b| [a, b]))
                            .filter(|&[a, b]| {
                                let d = at(a).abs_diff(at(b));
                                d != 1 && d != ranks - 1
                            })
                            .collect()
                    }
                    None => Vec::new(),
                };
                let mut comm = if unlinked.is_empty() {
                    Comm::new(Box::new(t))
                } else {
                    Comm::new(Box::new(CablesOnly {
                        inner: Box::new(t),
                        unlinked: unlinked.clone(),
                    }))
                };
                comm.set_unlinked(unlinked);
                swap_solve::TEST_CHOICE.with(|f| f.set(u12));
                crate::factor::TEST_THREADS.with(|f| f.set(threads));
                let mut m = LocalMatrix::generate(n, nb, grid, rank, HPL_SEED);
                let mut times = Timings::default();
                schedule::take();
                factor(&mut m, &mut comm, &o, product, &mut times, |_| {}).unwrap();
                let (packs, events): (Vec<Event>, Vec<Event>) = schedule::take()
                    .into_iter()
                    .partition(|e| matches!(e, Event::Packed(_)));
                // The packed product packs each panel's L21 once, on its first update, and
                // reuses it for the rest of that panel's columns.
                if product == Product::Packed {
                    assert!(
                        !packs.is_empty(),
                        "rank {rank}: the packed product never ran"
                    );
                    let mut panels: Vec<usize> = packs
                        .iter()
                        .map(|e| match e {
                            Event::Packed(j0) => *j0,
                            _ => unreachable!("only packings were kept"),
                        })
                        .collect();
                    panels.sort_unstable();
                    panels.dedup();
                    assert_eq!(
                        panels.len(),
                        packs.len(),
                        "rank {rank}: a panel packed twice: {packs:?}"
                    );
                }
                (solve(&m, &mut comm, &mut times).unwrap(), events)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// A transport that refuses a message between ranks with no cable (the ring's diagonals).
struct CablesOnly {
    inner: Box<dyn Transport>,
    unlinked: Vec<[usize; 2]>,
}

impl Transport for CablesOnly {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn exchange(&mut self, sends: &[SendOp], recvs: &mut [RecvOp]) -> anyhow::Result<()> {
        let me = self.inner.rank();
        for p in sends
            .iter()
            .map(|s| s.peer)
            .chain(recvs.iter().map(|r| r.peer))
        {
            if self.unlinked.contains(&[me.min(p), me.max(p)]) {
                anyhow::bail!("rank {me} moved data with rank {p}, which has no cable to it");
            }
        }
        self.inner.exchange(sends, recvs)
    }
    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }
    fn set_timeout(&mut self, timeout: Duration) -> anyhow::Result<()> {
        self.inner.set_timeout(timeout)
    }
    fn set_waiting(&mut self, waiting: Waiting) {
        self.inner.set_waiting(waiting)
    }
}

/// The largest relative difference from `want` over every rank's x (held to
/// `reference::x_tolerance`, which follows from the system's conditioning: kernels that
/// round differently, as FMA and wider vectors do, stay within it).
fn worst_error(xs: &[Vec<f64>], want: &[f64]) -> f64 {
    xs.iter()
        .flat_map(|x| x.iter().zip(want))
        .map(|(a, b)| (a - b).abs() / b.abs().max(1.0))
        .fold(0.0, f64::max)
}

#[test]
fn every_grid_solves_to_the_reference_x_and_passes_at_every_lookahead_depth() {
    // N = 35 is no multiple of NB 4 or 8, and below NB 64 (a single, partial panel).
    let n = 35;
    let want = reference::solve(n, reference::augmented(n, HPL_SEED));
    for (p, q) in [
        (1, 1),
        (1, 2),
        (2, 1),
        (2, 2),
        (1, 3),
        (3, 1),
        (1, 4),
        (4, 1),
    ] {
        for nb in [1, 4, 8, 64] {
            for map in [
                ProcessMap::RowMajor,
                ProcessMap::ColumnMajor,
                ProcessMap::Snake,
            ] {
                for depth in [0, 1, 2, 3] {
                    let o = Opts { depth, ..DEFAULT };
                    let xs = distributed_x(n, nb, Grid::new(p, q, map), o);
                    let worst = worst_error(&xs, &want);
                    assert!(
                        worst < reference::x_tolerance(n, HPL_SEED),
                        "{p}x{q} nb {nb} {map:?} depth {depth}: x off by {worst}"
                    );
                    let resid = reference::residual(n, HPL_SEED, &xs[0]);
                    assert!(
                        check::passed(resid, 16.0),
                        "{p}x{q} nb {nb} depth {depth}: residual {resid}"
                    );
                }
            }
        }
    }
}

/// Grids laid round a ring of cables listed out of rank order, the ring's diagonals
/// unlinked: a 2×2 snake (every row and column a cable) and one row of six cabled only between
/// neighbours (panels round the ring whichever broadcast was asked for, the small all-reduces
/// along it, the solve's messages relayed) reach the reference x and pass, with lookahead.
#[test]
fn grids_round_a_ring_out_of_rank_order_solve_on_its_cables() {
    let n = 70;
    let want = reference::solve(n, reference::augmented(n, HPL_SEED));
    let grids = [
        (2, 2, ProcessMap::Snake, vec![0, 2, 1, 3]),
        (1, 6, ProcessMap::RowMajor, vec![0, 2, 4, 1, 3, 5]),
    ];
    for (p, q, map, order) in grids {
        for bcast in [
            Broadcast::IncreasingRing,
            Broadcast::IncreasingRingModified,
            Broadcast::IncreasingTwoRing,
            Broadcast::IncreasingTwoRingModified,
            Broadcast::Long,
            Broadcast::LongModified,
        ] {
            for depth in [0, 1, 2] {
                let o = Opts {
                    depth,
                    bcast,
                    ..DEFAULT
                };
                let g = Grid {
                    order: Some(order.clone()),
                    ..Grid::new(p, q, map)
                };
                let xs = distributed_x(n, 8, g, o);
                let worst = worst_error(&xs, &want);
                assert!(
                    worst < reference::x_tolerance(n, HPL_SEED),
                    "{p}x{q} {order:?} {bcast:?} depth {depth}: x off by {worst}"
                );
            }
        }
    }
}

/// The U12 solve both ways — the tiles (with one process row, fused with the swaps) and the
/// BLAS's dtrsm after dlaswp — on grids with one and several process rows, panels a multiple
/// of the tiles' 8 rows and not, partial last panels, and lookahead on and off.
#[test]
fn both_u12_solvers_reach_the_reference_x_on_every_grid() {
    let n = 150;
    let want = reference::solve(n, reference::augmented(n, HPL_SEED));
    for (p, q) in [(1, 1), (1, 2), (2, 1), (2, 2), (3, 1)] {
        for nb in [13, 32] {
            for depth in [0, 1] {
                for u12 in [Solver::Tiles, Solver::Blas] {
                    let o = Opts { depth, ..DEFAULT };
                    let xs: Vec<Vec<f64>> =
                        run_ranks_solving_u12_by(n, nb, grid(p, q), o, Some(u12))
                            .into_iter()
                            .map(|(x, _)| x)
                            .collect();
                    let worst = worst_error(&xs, &want);
                    assert!(
                        worst < reference::x_tolerance(n, HPL_SEED),
                        "{p}x{q} nb {nb} depth {depth} {u12:?}: x off by {worst}"
                    );
                }
            }
        }
    }
}

/// One rank with several threads and DEPTH 1 factors each panel beside the update of the
/// rest of the trailing matrix, which its threads share out in chunks: with both U12
/// solvers and both products (the packed one where the CPU has its kernel), panels a
/// multiple of the tiles' 8 rows and not, a narrow last panel, a single panel, and trailing
/// matrices of one chunk and of several (n 500: chunks of 64 to 117 columns), it reaches the
/// reference x and one thread's x, in DEPTH 1's order.
#[test]
fn one_rank_factors_each_panel_beside_the_update_on_several_threads() {
    for (n, nb) in [(35, 64), (150, 13), (300, 16), (500, 16)] {
        let want = reference::solve(n, reference::augmented(n, HPL_SEED));
        let panels: Vec<usize> = (0..n.div_ceil(nb)).map(|k| k * nb).collect();
        let mut order = vec![Event::Factor(0)];
        for (j, &pj) in panels.iter().enumerate() {
            if let Some(&next) = panels.get(j + 1) {
                order.push(Event::FactorBeside(next));
            }
            order.push(Event::Update(pj));
        }
        let o = Opts {
            depth: 1,
            ..DEFAULT
        };
        for u12 in [Solver::Tiles, Solver::Blas] {
            let one = run_ranks_with(n, nb, grid(1, 1), o, Some(u12), None, Product::Blas);
            for (threads, product) in [
                (2, Product::Packed),
                (2, Product::Blas),
                (3, Product::Packed),
            ] {
                let (x, events) =
                    run_ranks_with(n, nb, grid(1, 1), o, Some(u12), Some(threads), product)
                        .remove(0);
                let case = format!("n {n} nb {nb} {u12:?} {product:?} {threads} threads");
                assert_eq!(events, order, "{case}");
                let worst = worst_error(std::slice::from_ref(&x), &want);
                assert!(
                    worst < reference::x_tolerance(n, HPL_SEED),
                    "{case}: x off the reference by {worst}"
                );
                let apart = worst_error(std::slice::from_ref(&x), &one[0].0);
                assert!(
                    apart < reference::x_tolerance(n, HPL_SEED),
                    "{case}: x off one thread's by {apart}"
                );
            }
        }
    }
}

/// The packed product (where the CPU has its kernel) on every grid shape and lookahead
/// depth, one thread per rank and two: U12 in place (one process row) and held apart,
/// L21 in the share and in a copy, packed once and reused across a panel's updates; it
/// reaches the reference x and the BLAS's x, in the same order of steps.
#[test]
fn the_packed_product_reaches_the_blas_x_on_every_grid_and_depth() {
    if !packed_product::available() {
        eprintln!("no AVX-512F and no AVX2 on this CPU: the packed product is not offered here");
        return;
    }
    for (n, nb) in [(300, 16), (150, 13)] {
        let want = reference::solve(n, reference::augmented(n, HPL_SEED));
        for (p, q) in [(1, 1), (1, 2), (2, 1), (2, 2), (1, 3), (2, 3)] {
            for depth in [0, 1, 2, 3] {
                for threads in [1, 2] {
                    let o = Opts { depth, ..DEFAULT };
                    let g = grid(p, q);
                    let run = |product| {
                        run_ranks_with(n, nb, g.clone(), o, None, Some(threads), product)
                            .into_iter()
                            .unzip::<_, _, Vec<_>, Vec<_>>()
                    };
                    let (blas, blas_order) = run(Product::Blas);
                    let (packed, packed_order) = run(Product::Packed);
                    let case = format!("n {n} nb {nb} {p}x{q} depth {depth} {threads} threads");
                    assert_eq!(packed_order, blas_order, "{case}");
                    let worst = worst_error(&packed, &want);
                    assert!(
                        worst < reference::x_tolerance(n, HPL_SEED),
                        "{case}: x off the reference by {worst}"
                    );
                    let apart = worst_error(&packed, &blas[0]);
                    assert!(
                        apart < reference::x_tolerance(n, HPL_SEED),
                        "{case}: x off the BLAS's by {apart}"
                    );
                }
            }
        }
    }
}

#[test]
fn every_lookahead_depth_gives_the_same_x_as_none_on_larger_systems() {
    // Several panels per process column, a last panel narrower than NB (300 = 18·16 + 12),
    // and grids where the next panel's owner changes every step (Q > 1) or never does.
    let n = 300;
    let want = reference::solve(n, reference::augmented(n, HPL_SEED));
    for (p, q) in [(1, 1), (1, 2), (2, 1), (2, 2), (1, 3), (2, 3)] {
        let without = distributed_x(n, 16, grid(p, q), DEFAULT);
        // Deeper than the number of panels a process column holds, too (19 panels in all).
        for depth in [1, 2, 3, 5, 25] {
            let with = distributed_x(n, 16, grid(p, q), Opts { depth, ..DEFAULT });
            for xs in [&without, &with] {
                assert!(
                    xs.iter().all(|x| x == &xs[0]),
                    "{p}x{q} depth {depth}: every rank must hold the same x"
                );
                let resid = reference::residual(n, HPL_SEED, &xs[0]);
                assert!(resid < 1.0, "{p}x{q} depth {depth}: residual {resid}");
            }
            let worst = worst_error(&with, &want).max(worst_error(&without, &want));
            assert!(
                worst < reference::x_tolerance(n, HPL_SEED),
                "{p}x{q} depth {depth}: x off the reference by {worst}"
            );
            let apart = worst_error(&with, &without[0]);
            assert!(
                apart < reference::x_tolerance(n, HPL_SEED),
                "{p}x{q}: depth 0 and {depth} differ by {apart}"
            );
        }
    }
}

#[test]
fn lookahead_keeps_exactly_depth_panels_factored_ahead_of_the_update() {
    // 100 = 12·8 + 4: 13 panels. DEPTH d: panels 0 .. d−1 are factored first, then before
    // panel j updates the rest, panel j+d is factored (DEPTH 0: after it). Each rank sees the
    // factorizations of the panels its process column owns and every update. A DEPTH run as
    // a shallower one gives the same x, so only the order shows it.
    let (n, nb): (usize, usize) = (100, 8);
    let panels: Vec<usize> = (0..n.div_ceil(nb)).map(|k| k * nb).collect();
    for (p, q) in [(1, 1), (1, 3), (2, 2)] {
        let g = grid(p, q);
        for depth in [0, 1, 2, 3, 4, 20] {
            let mut want = Vec::new();
            if depth == 0 {
                for (j, &pj) in panels.iter().enumerate() {
                    if j == 0 {
                        want.push(Event::Factor(pj));
                    }
                    want.push(Event::Update(pj));
                    if let Some(&next) = panels.get(j + 1) {
                        want.push(Event::Factor(next));
                    }
                }
            } else {
                want.extend(panels.iter().take(depth).map(|&pj| Event::Factor(pj)));
                for (j, &pj) in panels.iter().enumerate() {
                    if let Some(&next) = panels.get(j + depth) {
                        want.push(Event::Factor(next));
                    }
                    want.push(Event::Update(pj));
                }
            }
            let o = Opts { depth, ..DEFAULT };
            for (rank, (_, events)) in run_ranks(n, nb, g.clone(), o).into_iter().enumerate() {
                let mycol = g.coords(rank).1;
                let mine: Vec<Event> = want
                    .iter()
                    .copied()
                    .filter(|e| match e {
                        Event::Factor(j0) | Event::FactorBeside(j0) => owner(*j0, nb, q) == mycol,
                        Event::Update(_) => true,
                        Event::Packed(_) => false,
                    })
                    .collect();
                assert_eq!(events, mine, "{p}x{q} depth {depth} rank {rank}");
            }
        }
    }
}

#[test]
fn recursive_panels_of_every_shape_give_the_same_x() {
    let n = 61;
    let want = reference::solve(n, reference::augmented(n, HPL_SEED));
    for (nbmin, ndiv) in [(1, 2), (2, 3), (4, 2), (8, 4), (64, 2)] {
        for (p, q) in [(1, 1), (2, 2), (4, 1), (1, 2)] {
            for depth in [0, 1] {
                let o = Opts {
                    nbmin,
                    ndiv,
                    depth,
                    ..DEFAULT
                };
                let xs = distributed_x(n, 16, grid(p, q), o);
                let worst = worst_error(&xs[..1], &want);
                assert!(
                    worst < reference::x_tolerance(n, HPL_SEED),
                    "NBMIN {nbmin} NDIV {ndiv} on {p}x{q} depth {depth}: x off by {worst}"
                );
            }
        }
    }
}

#[test]
fn every_broadcast_variant_gives_the_same_x() {
    // Panels of 300 x 64 doubles: large enough that "Lng" scatters rather than falling back
    // to the tree.
    let n = 300;
    let want = reference::solve(n, reference::augmented(n, HPL_SEED));
    for bcast in [
        Broadcast::IncreasingRing,
        Broadcast::IncreasingRingModified,
        Broadcast::IncreasingTwoRing,
        Broadcast::IncreasingTwoRingModified,
        Broadcast::Long,
        Broadcast::LongModified,
    ] {
        for (p, q) in [(1, 4), (2, 2), (1, 3)] {
            for depth in [0, 1, 2] {
                let o = Opts {
                    bcast,
                    depth,
                    ..DEFAULT
                };
                let xs = distributed_x(n, 64, grid(p, q), o);
                let worst = worst_error(&xs[..1], &want);
                assert!(
                    worst < reference::x_tolerance(n, HPL_SEED),
                    "{bcast:?} on {p}x{q} depth {depth}: x off by {worst}"
                );
            }
        }
    }
}

const ORDERS: [Factorization; 3] = [
    Factorization::Left,
    Factorization::Crout,
    Factorization::Right,
];

const SWAPS: [Swap; 3] = [
    Swap::BinaryExchange,
    Swap::Long,
    Swap::Mix { threshold: 12 },
];

#[test]
fn every_pfact_and_rfact_solves_on_every_grid_at_depth_0_and_1() {
    // The grids, NBs and maps of the test above, for each of the nine PFACT x RFACT pairs;
    // NBMIN 2 so that NB 8 and 64 recurse (64 → 32 → 16 → 8 → 4 → 2) and NB 4 does once.
    let n = 35;
    let want = reference::solve(n, reference::augmented(n, HPL_SEED));
    for pfact in ORDERS {
        for rfact in ORDERS {
            for (p, q) in [
                (1, 1),
                (1, 2),
                (2, 1),
                (2, 2),
                (1, 3),
                (3, 1),
                (1, 4),
                (4, 1),
            ] {
                for nb in [1, 4, 8, 64] {
                    for map in [
                        ProcessMap::RowMajor,
                        ProcessMap::ColumnMajor,
                        ProcessMap::Snake,
                    ] {
                        for depth in [0, 1] {
                            let o = Opts {
                                pfact,
                                rfact,
                                nbmin: 2,
                                depth,
                                ..DEFAULT
                            };
                            let xs = distributed_x(n, nb, Grid::new(p, q, map), o);
                            let worst = worst_error(&xs, &want);
                            assert!(
                                worst < reference::x_tolerance(n, HPL_SEED),
                                "PFACT {pfact:?} RFACT {rfact:?} {p}x{q} nb {nb} {map:?} depth {depth}: x off by {worst}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn every_pfact_rfact_and_swap_combination_matches_the_reference_across_process_rows() {
    // Many panels of 8 rows over 2 to 4 process rows, so most pivot rows live on another
    // rank than the panel's; Mix's threshold of 12 columns sends the early panels (wide
    // trailing matrices) by the long swap and the late ones by binary exchange. 3 process
    // rows is no power of two (the binary exchange folds).
    let n = 150;
    let want = reference::solve(n, reference::augmented(n, HPL_SEED));
    for swap in SWAPS {
        for pfact in ORDERS {
            for rfact in ORDERS {
                for (p, q) in [(2, 1), (2, 2), (3, 1), (4, 1), (3, 2)] {
                    for depth in [0, 1, 2] {
                        let o = Opts {
                            pfact,
                            rfact,
                            nbmin: 2,
                            ndiv: 2,
                            depth,
                            swap,
                            ..DEFAULT
                        };
                        let xs = distributed_x(n, 8, grid(p, q), o);
                        assert!(xs.iter().all(|x| x == &xs[0]));
                        let worst = worst_error(&xs[..1], &want);
                        assert!(
                            worst < reference::x_tolerance(n, HPL_SEED),
                            "{swap:?} PFACT {pfact:?} RFACT {rfact:?} {p}x{q} depth {depth}: x off by {worst}"
                        );
                        let resid = reference::residual(n, HPL_SEED, &xs[0]);
                        assert!(resid < 1.0, "{swap:?} {p}x{q}: residual {resid}");
                    }
                }
            }
        }
    }
}

#[test]
fn every_swap_variant_moves_the_rows_the_pivots_say() {
    // Pivots drawn at random (repeats, pivots inside the panel, rows on every process row)
    // for panels at several depths, applied to all local columns on grids of 2 to 5 process
    // rows; every rank checks its own entries against the pivots applied one by one to the
    // whole matrix.
    let (n, nb) = (61, 4);
    for swap in SWAPS {
        for (p, q) in [(2, 1), (3, 1), (4, 1), (5, 1), (2, 2), (3, 2)] {
            let g = grid(p, q);
            let token = fresh_token();
            create_segment(&token, g.size()).unwrap();
            let handles: Vec<_> = (0..g.size())
                .map(|rank| {
                    let g = g.clone();
                    std::thread::spawn(move || {
                        let names = (0..g.size())
                            .map(|rank| PeerName {
                                rank,
                                host: "test".into(),
                            })
                            .collect();
                        let t = ShmTransport::attach(
                            rank,
                            g.size(),
                            &token,
                            names,
                            Duration::from_secs(30),
                        )
                        .unwrap();
                        let mut comm = Comm::new(Box::new(t));
                        let mut m = LocalMatrix::generate(n, nb, g.clone(), rank, HPL_SEED);
                        let mut want = reference::augmented(n, HPL_SEED);
                        let column: Vec<usize> = (0..p).map(|r| g.rank_at(r, m.mycol)).collect();
                        let mut x = 12345u64;
                        for j0 in [0, 8, 20, 56] {
                            let jb = nb.min(n - j0);
                            let ipiv: Vec<u64> = (0..jb)
                                .map(|k| {
                                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                                    (j0 + k + (x >> 33) as usize % (n - j0 - k)) as u64
                                })
                                .collect();
                            let nq = m.nq;
                            crate::swap::apply_pivots(
                                &mut m,
                                &mut comm,
                                &column,
                                j0,
                                &ipiv,
                                0..nq,
                                swap,
                            )
                            .unwrap();
                            for (k, &r) in ipiv.iter().enumerate() {
                                for c in 0..=n {
                                    want.swap(c * n + j0 + k, c * n + r as usize);
                                }
                            }
                            for lc in 0..m.nq {
                                for i in 0..m.mp {
                                    let (gi, gc) = (m.global_row(i), m.global_col(lc));
                                    assert_eq!(
                                        m.at(i, lc),
                                        want[gc * n + gi],
                                        "{swap:?} {p}x{q} panel {j0}: row {gi} column {gc}"
                                    );
                                }
                            }
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
        }
    }
}

/// On a ring of four (no diagonals) a 2×2 grid takes the snake map, whose rows and columns are
/// all cabled, in the cables' order where the hostfile lists the hosts another way round; a
/// 1×4 grid goes round the ring between neighbours (a line with no ring names the pairs); a full mesh keeps
/// the map asked for. On a ring of six no 2×3 grid keeps its columns on cables: left to
/// itself hpl goes round the ring in one row, cabled between neighbours.
#[test]
fn a_grid_on_a_ring_keeps_its_rows_and_columns_on_cables() {
    use crate::suite::{on_the_cables, OnCables};
    let ring4 = [[0, 2], [1, 3]];
    let (g, on) = on_the_cables(grid(2, 2), &ring4, Some(&[0, 1, 2, 3]), false).unwrap();
    assert_eq!(
        (g.map, g.order.clone(), on),
        (ProcessMap::Snake, None, OnCables::EveryPair)
    );
    assert!(g.group_pairs().iter().all(|p| !ring4.contains(p)));
    // A 1×4 grid asked for goes round the ring, cabled between neighbours; without the
    // ring's order nothing fits, and the line names the diagonals.
    let (g, on) = on_the_cables(grid(1, 4), &ring4, Some(&[0, 1, 2, 3]), true).unwrap();
    assert_eq!((g.p, g.q, on), (1, 4, OnCables::Neighbours));
    let e = on_the_cables(grid(1, 4), &[[0, 2], [1, 3], [0, 3]], None, true)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("1x4 grid") && e.contains("(0-2, 0-3, 1-3)"),
        "{e}"
    );
    let (g, _) = on_the_cables(grid(2, 2), &[], None, false).unwrap();
    assert_eq!(g.map, ProcessMap::RowMajor);
    // Cabled 0-2-1-3-0: the diagonals are 0-1 and 2-3.
    let crossed = [[0, 1], [2, 3]];
    let (g, on) = on_the_cables(grid(2, 2), &crossed, Some(&[0, 2, 1, 3]), true).unwrap();
    assert_eq!(on, OnCables::EveryPair);
    assert_eq!(g.order.as_deref(), Some(&[0, 2, 1, 3][..]));
    assert!(
        g.group_pairs().iter().all(|p| !crossed.contains(p)),
        "{g:?}"
    );
    for r in 0..4 {
        let (row, col) = g.coords(r);
        assert_eq!(g.rank_at(row, col), r);
    }
    // A ring of six cabled 0-1-2-3-4-5-0.
    let ring6: Vec<[usize; 2]> = (0..6)
        .flat_map(|a| (a + 1..6).map(move |b| [a, b]))
        .filter(|[a, b]| b - a != 1 && b - a != 5)
        .collect();
    let order: Vec<usize> = (0..6).collect();
    let (g, on) = on_the_cables(grid(2, 3), &ring6, Some(&order), false).unwrap();
    assert_eq!((g.p, g.q, on), (1, 6, OnCables::Neighbours));
    assert!(g.ring_row_pairs().iter().all(|p| !ring6.contains(p)));
    let e = on_the_cables(grid(2, 3), &ring6, Some(&order), true)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("2x3 grid") && e.contains("1x6 goes round it"),
        "{e}"
    );
    // A column round the ring is not run: its pivot rows and swaps go between any two.
    assert!(on_the_cables(grid(6, 1), &ring6, Some(&order), true).is_err());
}
