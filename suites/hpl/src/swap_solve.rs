//! A panel's row swaps and U12's triangular solve (U12 = L11⁻¹·A12) over the trailing columns,
//! fused column tile by column tile, for a process column with one process row (where every
//! swap is local).
//!
//! Done apart, as LAPACK's dlaswp then BLAS's dtrsm over all the columns, the two cost more
//! than they need to: the swaps are memory-bound (each pivot row is its own cache line in
//! every column), and a dtrsm with only NB rows runs far below the DGEMM rate (OpenBLAS
//! 0.3.21's Cooperlake dtrsm: 17 Gflops on one core, 34 on two, for NB 192 × 2048 columns).
//!
//! Here the columns go in tiles of `NR`: while one tile is solved, the cache lines the next
//! tile's swaps touch are prefetched a few at a time into L2, so the memory waits overlap the
//! arithmetic (into L1 they did not: a tile's pivot lines, 1,536 of them for NB 192, are
//! 96 KiB, more than L1 holds beside the packed L11 the solve streams, and were evicted
//! before the swaps came to them). The solve itself is a register-blocked kernel (`MR` rows
//! × `NR` columns held in registers while the solved rows above stream through) against a
//! copy of L11 packed in the order the kernel reads it. The tiles are split over the rank's
//! BLAS threads. With no pivots the same code is just the solve (U12 on the panel's process
//! row when there are several).
//!
//! Fused, the swaps and solve took about a third of dlaswp then dtrsm's time (re-measure:
//! `cargo bench -p tbbench-hpl --bench kernels`, its swap_and_solve group). In a run this needs
//! OpenBLAS's idle worker asleep, not spinning on the core our second thread wants: see
//! `kernels::before_threads`.

use crate::kernels;
use std::ops::Range;
use std::time::Instant;

/// Columns per tile: small enough that a tile's rows stay in L1 while it is solved.
const NR: usize = 8;
/// Rows per register block of the solve (one 512-bit vector, or two 256-bit).
const MR: usize = 8;

/// L11's unit lower triangle (k×k), packed per row block: block `i` holds rows `i·MR ..
/// i·MR + MR` of columns `0 .. i·MR + MR`, column after column (rows past k are zeros), so
/// the kernel reads it front to back.
pub struct PackedL {
    k: usize,
    values: Vec<f64>,
    /// Where each row block starts in `values`.
    starts: Vec<usize>,
}

impl PackedL {
    pub fn new(k: usize, l: &[f64], ldl: usize) -> PackedL {
        let blocks = k.div_ceil(MR);
        let mut starts = Vec::with_capacity(blocks);
        let mut values = Vec::with_capacity(MR * (blocks * (blocks + 1) / 2) * MR);
        for b in 0..blocks {
            starts.push(values.len());
            let i0 = b * MR;
            for p in 0..(i0 + MR).min(k) {
                for r in 0..MR {
                    let i = i0 + r;
                    // Only the strict lower triangle enters: the diagonal is 1, above is U11.
                    values.push(if i < k && p < i { l[p * ldl + i] } else { 0.0 });
                }
            }
        }
        PackedL { k, values, starts }
    }
}

/// Applies `piv` (row `r0 + j` swapped with row `piv[j]`, j in order; empty for none) to
/// columns `cols` of `b` (column-major, leading dimension `ldb`), then solves rows `r0 ..
/// r0 + k` of them against `l` (L11, k = l's size), splitting the tiles over `threads`.
pub fn swap_and_solve(
    b: &mut [f64],
    ldb: usize,
    cols: Range<usize>,
    r0: usize,
    piv: &[usize],
    l: &PackedL,
    threads: usize,
) {
    let ncols = cols.len();
    if ncols == 0 {
        return;
    }
    // The rows touched: the panel's k and every pivot row.
    let rows = piv
        .iter()
        .map(|p| p + 1)
        .chain([r0 + l.k])
        .max()
        .unwrap_or(0);
    assert!(
        ldb >= rows && b.len() >= (cols.end - 1) * ldb + rows,
        "swap_and_solve: columns {cols:?} of leading dimension {ldb} do not hold row {}",
        rows - 1
    );
    assert!(piv.is_empty() || piv.len() == l.k);
    let b = &mut b[cols.start * ldb..];
    let tiles = ncols.div_ceil(NR);
    let threads = threads.clamp(1, tiles);
    if threads == 1 {
        run(b, ldb, ncols, r0, piv, l);
        return;
    }
    // Whole tiles per thread, as even as they go; this thread takes the last share.
    std::thread::scope(|s| {
        let (mut rest, mut done) = (b, 0);
        for t in 0..threads {
            let end = if t + 1 == threads {
                ncols
            } else {
                tiles * (t + 1) / threads * NR
            };
            let take = end - done;
            if t + 1 == threads {
                run(std::mem::take(&mut rest), ldb, take, r0, piv, l);
            } else {
                let (piece, tail) = std::mem::take(&mut rest).split_at_mut(take * ldb);
                rest = tail;
                s.spawn(move || run(piece, ldb, take, r0, piv, l));
            }
            done = end;
        }
    });
}

/// One thread's columns, tile after tile.
fn run(b: &mut [f64], ldb: usize, ncols: usize, r0: usize, piv: &[usize], l: &PackedL) {
    let k = l.k;
    let mut pad = Vec::new();
    let mut xs = vec![0.0; k * NR];
    for c0 in (0..ncols).step_by(NR) {
        let w = NR.min(ncols - c0);
        let next = (c0 + NR < ncols).then(|| (c0 + NR, NR.min(ncols - c0 - NR)));
        for c in c0..c0 + w {
            let col = &mut b[c * ldb..];
            for (j, &p) in piv.iter().enumerate() {
                col.swap(r0 + j, p);
            }
        }
        // The next tile's lines, asked for while this one is solved (an address, not a
        // borrow: the solve holds `b` mutably meanwhile).
        let (base, len) = (b.as_ptr(), b.len());
        let fetch = |block: usize| {
            if let Some((n0, nw)) = next {
                prefetch_rows(base, len, ldb, n0, nw, r0, piv, block);
            }
        };
        if w == NR {
            solve_tile(&mut b[c0 * ldb + r0..], ldb, l, &mut xs, fetch);
        } else {
            // A last, narrower tile: solved in a zero-padded copy.
            pad.clear();
            pad.resize(NR * k, 0.0);
            for c in 0..w {
                let src = (c0 + c) * ldb + r0;
                pad[c * k..(c + 1) * k].copy_from_slice(&b[src..src + k]);
            }
            solve_tile(&mut pad, k, l, &mut xs, |_| {});
            for c in 0..w {
                let dst = (c0 + c) * ldb + r0;
                b[dst..dst + k].copy_from_slice(&pad[c * k..(c + 1) * k]);
            }
        }
    }
}

/// Prefetches the lines that row block `block`'s share of the swaps touches in columns
/// `c0 .. c0 + w` of the `len` values at `base`: the pivot rows `piv[block·MR ..][..MR]` and
/// the panel rows they swap with.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn prefetch_rows(
    base: *const f64,
    len: usize,
    ldb: usize,
    c0: usize,
    w: usize,
    r0: usize,
    piv: &[usize],
    block: usize,
) {
    let first = block * MR;
    if first >= piv.len() {
        return;
    }
    let mine = &piv[first..(first + MR).min(piv.len())];
    for c in c0..c0 + w {
        let col = c * ldb;
        prefetch(base, len, col + r0 + first);
        for &p in mine {
            prefetch(base, len, col + p);
        }
    }
}

#[inline(always)]
fn prefetch(base: *const f64, len: usize, i: usize) {
    #[cfg(target_arch = "x86_64")]
    if i < len {
        // SAFETY: a prefetch only hints the cache, and the address is inside the slice.
        unsafe {
            // Into L2, not L1: see the module's note.
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
            _mm_prefetch::<_MM_HINT_T1>(base.add(i).cast());
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (base, len, i);
}

/// Solves one tile of NR columns (rows 0..k of `t`, leading dimension `ld`) in place, calling
/// `fetch(block)` before each row block so the next tile's lines arrive meanwhile. Dispatches
/// to a copy compiled for the widest vectors and fused multiply-add this CPU has.
fn solve_tile(t: &mut [f64], ld: usize, l: &PackedL, xs: &mut [f64], fetch: impl Fn(usize)) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has the features the copy is compiled for.
            return unsafe { solve_tile_avx512(t, ld, l, xs, &fetch) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: as above.
            return unsafe { solve_tile_avx2(t, ld, l, xs, &fetch) };
        }
        solve_tile_with::<false>(t, ld, l, xs, &fetch)
    }
    // aarch64 always has fused multiply-add (and NEON).
    #[cfg(target_arch = "aarch64")]
    solve_tile_with::<true>(t, ld, l, xs, &fetch);
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    solve_tile_with::<false>(t, ld, l, xs, &fetch);
}

// One copy of the kernel per instruction set (target_feature applies to a whole function and
// what is inlined into it), so the two wrappers are alike on purpose.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn solve_tile_avx512(
    t: &mut [f64],
    ld: usize,
    l: &PackedL,
    xs: &mut [f64],
    fetch: &dyn Fn(usize),
) {
    solve_tile_with::<true>(t, ld, l, xs, fetch)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn solve_tile_avx2(
    t: &mut [f64],
    ld: usize,
    l: &PackedL,
    xs: &mut [f64],
    fetch: &dyn Fn(usize),
) {
    solve_tile_with::<true>(t, ld, l, xs, fetch)
}

/// The kernel: for each row block, its MR×NR values are loaded into registers, the solved rows
/// above are subtracted (acc −= L[block, 0..i0] · X[0..i0, tile]: MR·NR multiply-adds per
/// solved row, one vector of L and NR values of X read), the block's own triangle is solved,
/// and the block is stored, in the tile and, row-major, in `xs` (k·NR values), where the
/// blocks below read it contiguously. `FMA` uses fused multiply-adds (only where the CPU has
/// them: a software fma would be slower than the two operations).
#[inline(always)]
fn solve_tile_with<const FMA: bool>(
    t: &mut [f64],
    ld: usize,
    l: &PackedL,
    xs: &mut [f64],
    fetch: &dyn Fn(usize),
) {
    let k = l.k;
    for (block, &start) in l.starts.iter().enumerate() {
        fetch(block);
        let i0 = block * MR;
        let mr = MR.min(k - i0);
        let mut acc = [[0.0f64; MR]; NR];
        for (c, a) in acc.iter_mut().enumerate() {
            let col = &t[c * ld + i0..];
            if mr == MR {
                *a = col[..MR].try_into().expect("MR values");
            } else {
                a[..mr].copy_from_slice(&col[..mr]);
            }
        }
        let lb = &l.values[start..start + (i0 + mr) * MR];
        acc = subtract_solved::<FMA>(acc, &lb[..i0 * MR], &xs[..i0 * NR]);
        acc = solve_triangle::<FMA>(acc, &lb[i0 * MR..]);
        for (c, a) in acc.iter().enumerate() {
            let col = &mut t[c * ld + i0..];
            if mr == MR {
                col[..MR].copy_from_slice(a);
            } else {
                col[..mr].copy_from_slice(&a[..mr]);
            }
        }
        for r in 0..mr {
            for (c, a) in acc.iter().enumerate() {
                xs[(i0 + r) * NR + c] = a[r];
            }
        }
    }
}

/// The block's own unit lower triangle, by forward substitution: row q, once final, is taken
/// from the rows below it in every column. `l` holds the triangle's MR columns of MR values,
/// zero on and above the diagonal, so each step is one whole-vector multiply-add per column
/// (rows on and above q take −0·x and, being finite, stay as they are) and `acc` stays in
/// registers.
#[inline(always)]
fn solve_triangle<const FMA: bool>(mut acc: [[f64; MR]; NR], l: &[f64]) -> [[f64; MR]; NR] {
    for (q, lq) in l.chunks_exact(MR).take(MR).enumerate() {
        let lq: &[f64; MR] = lq.try_into().expect("MR values");
        for a in acc.iter_mut() {
            let x = a[q];
            for r in 0..MR {
                a[r] = if FMA {
                    (-lq[r]).mul_add(x, a[r])
                } else {
                    a[r] - lq[r] * x
                };
            }
        }
    }
    acc
}

/// acc −= L·X for the solved rows above a block: `l` MR values a row, `xs` NR. Apart from
/// the rest of the kernel, so `acc` is only ever indexed by constants and stays in registers.
#[inline(always)]
fn subtract_solved<const FMA: bool>(
    mut acc: [[f64; MR]; NR],
    l: &[f64],
    xs: &[f64],
) -> [[f64; MR]; NR] {
    for (lp, xp) in l.chunks_exact(MR).zip(xs.chunks_exact(NR)) {
        let lp: &[f64; MR] = lp.try_into().expect("MR values");
        let xp: &[f64; NR] = xp.try_into().expect("NR values");
        for c in 0..NR {
            for r in 0..MR {
                acc[c][r] = if FMA {
                    (-lp[r]).mul_add(xp[c], acc[c][r])
                } else {
                    acc[c][r] - lp[r] * xp[c]
                };
            }
        }
    }
    acc
}

/// How U12's triangular solves run in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Solver {
    /// This module's tiles (and, with one process row, the swaps fused into them).
    Tiles,
    /// The BLAS's dtrsm (and the swaps apart, by dlaswp).
    Blas,
}

impl Solver {
    pub fn name(self) -> &'static str {
        match self {
            Solver::Tiles => "tbbench tiles (swaps fused)",
            Solver::Blas => "BLAS dtrsm",
        }
    }
}

/// The solver for this process: the faster of the two on a panel-sized solve (NB 192, 1024
/// columns, the rank's threads), measured once, since which wins depends on the BLAS (a
/// vendor's dtrsm may beat these tiles; OpenBLAS 0.3.21's runs at about half their rate).
/// `TBBENCH_U12_SOLVE=tiles|blas` chooses without measuring. Without a BLAS: the tiles.
pub fn solver() -> Solver {
    #[cfg(test)]
    if let Some(forced) = TEST_CHOICE.with(|f| f.get()) {
        return forced;
    }
    static CHOSEN: std::sync::OnceLock<Solver> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| match forced() {
        _ if kernels::blas().is_none() => Solver::Tiles,
        Ok(Some(chosen)) => chosen,
        // A bad value is refused before the ranks start (`forced`); here it only times both.
        Ok(None) | Err(_) => measure(),
    })
}

/// What TBBENCH_U12_SOLVE asks for: nothing when unset, an error naming the value when it is
/// neither "tiles" nor "blas".
pub fn forced() -> Result<Option<Solver>, String> {
    match std::env::var("TBBENCH_U12_SOLVE") {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Ok(v) if v == "tiles" => Ok(Some(Solver::Tiles)),
        Ok(v) if v == "blas" => Ok(Some(Solver::Blas)),
        Ok(v) => Err(format!(
            "TBBENCH_U12_SOLVE={v}: expected tiles or blas (or unset, to time both)"
        )),
        Err(std::env::VarError::NotUnicode(v)) => Err(format!(
            "TBBENCH_U12_SOLVE={v:?}: expected tiles or blas (or unset, to time both)"
        )),
    }
}

#[cfg(test)]
thread_local! {
    /// A test's choice for the ranks it runs as threads (both ways in one process).
    pub(crate) static TEST_CHOICE: std::cell::Cell<Option<Solver>> = const { std::cell::Cell::new(None) };
}

fn measure() -> Solver {
    let (k, n) = (192, 1024);
    let l: Vec<f64> = (0..k * k)
        .map(|i| ((i * 37) % 101) as f64 / 404.0)
        .collect();
    let packed = PackedL::new(k, &l, k);
    let start: Vec<f64> = (0..k * n).map(|i| ((i * 53) % 97) as f64 / 97.0).collect();
    let mut b = start.clone();
    let threads = kernels::threads();
    let (mut tiles, mut blas) = (f64::MAX, f64::MAX);
    for _ in 0..3 {
        b.copy_from_slice(&start);
        let t = Instant::now();
        swap_and_solve(&mut b, k, 0..n, 0, &[], &packed, threads);
        tiles = tiles.min(t.elapsed().as_secs_f64());
        b.copy_from_slice(&start);
        let t = Instant::now();
        kernels::trsm_unit_lower(k, n, &l, k, &mut b, k);
        blas = blas.min(t.elapsed().as_secs_f64());
    }
    if tiles < blas {
        Solver::Tiles
    } else {
        Solver::Blas
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(len: usize, seed: usize) -> Vec<f64> {
        (0..len)
            .map(|i| (((i + seed) * 37) % 101) as f64 / 101.0 - 0.5)
            .collect()
    }

    /// The straightforward version: every column's swaps in order, then forward substitution.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        b: &mut [f64],
        ldb: usize,
        cols: Range<usize>,
        r0: usize,
        piv: &[usize],
        l: &[f64],
        ldl: usize,
        k: usize,
    ) {
        for c in cols {
            let col = &mut b[c * ldb..];
            for (j, &p) in piv.iter().enumerate() {
                col.swap(r0 + j, p);
            }
            for p in 0..k {
                let x = col[r0 + p];
                for i in p + 1..k {
                    col[r0 + i] -= l[p * ldl + i] * x;
                }
            }
        }
    }

    /// Every shape the factorization hands it: k a multiple of MR or not (NB 192, 100, 5, 1),
    /// column counts with and without a partial last tile, pivots into the panel's own rows,
    /// repeated and far below, no pivots at all, one to three threads; against the reference
    /// to rounding, with the columns outside `cols` untouched.
    #[test]
    fn fused_tiles_match_swaps_then_substitution() {
        for &(k, ncols, with_piv) in &[
            (192, 37, true),
            (100, 16, true),
            (5, 9, true),
            (1, 3, true),
            (64, 8, false),
            (13, 1, true),
        ] {
            let (r0, extra) = (7, 40);
            let ldb = r0 + k + extra;
            let total_cols = ncols + 3;
            let l = values(k * k, 3);
            let packed = PackedL::new(k, &l, k);
            let piv: Vec<usize> = if with_piv {
                (0..k)
                    .map(|j| match j % 4 {
                        0 => r0 + j,                   // no move
                        1 => r0 + k + (j * 7) % extra, // a row below
                        2 => r0 + (j + 3).min(k - 1),  // another panel row
                        _ => r0 + k + extra - 1,       // the same far row again
                    })
                    .collect()
            } else {
                Vec::new()
            };
            for threads in 1..=3 {
                let start = values(ldb * total_cols, 11);
                let mut want = start.clone();
                reference(&mut want, ldb, 2..2 + ncols, r0, &piv, &l, k, k);
                let mut got = start.clone();
                swap_and_solve(&mut got, ldb, 2..2 + ncols, r0, &piv, &packed, threads);
                // Relative to the largest value: a random unit triangle of 192 rows grows the
                // solution by orders of magnitude, and the two sum in different orders.
                let scale = want.iter().fold(1.0, |m: f64, v| m.max(v.abs()));
                let worst = want
                    .iter()
                    .zip(&got)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f64::max);
                assert!(
                    worst <= 1e-12 * scale,
                    "k={k} ncols={ncols} threads={threads}: {worst} of {scale}"
                );
                assert_eq!(got[..2 * ldb], start[..2 * ldb]);
                assert_eq!(got[(2 + ncols) * ldb..], start[(2 + ncols) * ldb..]);
            }
        }
    }

    #[test]
    #[should_panic(expected = "do not hold row")]
    fn a_pivot_past_the_columns_is_refused() {
        let l = PackedL::new(2, &[1.0, 0.5, 0.0, 1.0], 2);
        let mut b = vec![0.0; 10];
        swap_and_solve(&mut b, 5, 0..2, 0, &[9, 1], &l, 1);
    }
}
