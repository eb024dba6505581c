//! The distributed factorization and solve against the single-process reference: ranks are
//! threads here, each with its own shared-memory transport, so every grid shape runs in a
//! unit test. (The end-to-end tests run real processes through `tbbench hpl`.)

use crate::factor::{factor, solve, Timings};
use crate::generator::HPL_SEED;
use crate::grid::{Grid, ProcessMap};
use crate::input::Broadcast;
use crate::matrix::LocalMatrix;
use crate::{check, reference};
use std::time::Duration;
use tbbench_runners::comm::Comm;
use tbbench_runners::transport::shm::{create_segment, ShmTransport};
use tbbench_runners::transport::PeerName;

fn distributed_x(n: usize, nb: usize, grid: Grid, token: u8) -> Vec<Vec<f64>> {
    distributed_x_with(n, nb, grid, token, 4, 2, Broadcast::IncreasingRing)
}

fn distributed_x_with(
    n: usize,
    nb: usize,
    grid: Grid,
    token: u8,
    nbmin: usize,
    ndiv: usize,
    bcast: Broadcast,
) -> Vec<Vec<f64>> {
    let ranks = grid.size();
    let token = [token; 16];
    create_segment(&token, ranks).unwrap();
    let handles: Vec<_> = (0..ranks)
        .map(|rank| {
            std::thread::spawn(move || {
                let names = (0..ranks)
                    .map(|rank| PeerName {
                        rank,
                        host: "test".into(),
                    })
                    .collect();
                let t = ShmTransport::attach(rank, ranks, &token, names, Duration::from_secs(30))
                    .unwrap();
                let mut comm = Comm::new(Box::new(t));
                let mut m = LocalMatrix::generate(n, nb, grid, rank, HPL_SEED);
                let mut times = Timings::default();
                factor(&mut m, &mut comm, nbmin, ndiv, bcast, &mut times, |_| {}).unwrap();
                solve(&m, &mut comm, &mut times).unwrap()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn every_grid_solves_to_the_reference_x_and_passes() {
    let n = 35;
    let want = reference::solve(n, reference::augmented(n, HPL_SEED));
    let mut token = 40;
    for (p, q) in [(1, 1), (1, 2), (2, 1), (2, 2), (1, 4), (4, 1)] {
        for nb in [1, 4, 8, 64] {
            for map in [ProcessMap::RowMajor, ProcessMap::ColumnMajor] {
                token += 1;
                let xs = distributed_x(n, nb, Grid { p, q, map }, token);
                for (rank, x) in xs.iter().enumerate() {
                    let worst = x
                        .iter()
                        .zip(&want)
                        .map(|(a, b)| (a - b).abs() / b.abs().max(1.0))
                        .fold(0.0, f64::max);
                    assert!(
                        worst < 1e-12,
                        "{p}x{q} nb {nb} {map:?} rank {rank}: x off by {worst}"
                    );
                }
                let resid = reference::residual(n, HPL_SEED, &xs[0]);
                assert!(
                    check::passed(resid, 16.0),
                    "{p}x{q} nb {nb}: residual {resid}"
                );
            }
        }
    }
}

#[test]
fn larger_system_on_a_2x2_grid_passes() {
    let n = 300;
    let xs = distributed_x(
        n,
        16,
        Grid {
            p: 2,
            q: 2,
            map: ProcessMap::RowMajor,
        },
        99,
    );
    let resid = reference::residual(n, HPL_SEED, &xs[0]);
    assert!(resid < 1.0, "{resid}");
    assert!(
        xs.iter().all(|x| x == &xs[0]),
        "every rank must hold the same x"
    );
}

#[test]
fn recursive_panels_of_every_shape_give_the_same_x() {
    let n = 61;
    let want = reference::solve(n, reference::augmented(n, HPL_SEED));
    let mut token = 150;
    for (nbmin, ndiv) in [(1, 2), (2, 3), (4, 2), (8, 4), (64, 2)] {
        for (p, q) in [(1, 1), (2, 2), (4, 1)] {
            token += 1;
            let xs = distributed_x_with(
                n,
                16,
                Grid {
                    p,
                    q,
                    map: ProcessMap::RowMajor,
                },
                token,
                nbmin,
                ndiv,
                Broadcast::IncreasingRing,
            );
            let worst = xs[0]
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs() / b.abs().max(1.0))
                .fold(0.0, f64::max);
            assert!(
                worst < 1e-10,
                "NBMIN {nbmin} NDIV {ndiv} on {p}x{q}: x off by {worst}"
            );
        }
    }
}

#[test]
fn ring_and_tree_broadcasts_give_the_same_x() {
    let n = 50;
    let want = reference::solve(n, reference::augmented(n, HPL_SEED));
    let mut token = 200;
    for bcast in [Broadcast::IncreasingRing, Broadcast::Long] {
        for (p, q) in [(1, 4), (2, 2), (1, 3)] {
            token += 1;
            let xs = distributed_x_with(
                n,
                8,
                Grid {
                    p,
                    q,
                    map: ProcessMap::RowMajor,
                },
                token,
                4,
                2,
                bcast,
            );
            let worst = xs[0]
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs() / b.abs().max(1.0))
                .fold(0.0, f64::max);
            assert!(worst < 1e-10, "{bcast:?} on {p}x{q}: x off by {worst}");
        }
    }
}
