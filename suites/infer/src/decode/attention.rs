//! Attention over the KV cache: queries' scaled dot products with the cached keys, a softmax,
//! the values' weighted sum, with the keys and values kept in f16 (IEEE half precision, as
//! llama.cpp keeps its cache): at a deep context attention reads the whole cache every token,
//! and half the bytes is half the time where memory is what it waits on.
//!
//! The positions go in blocks of [`BLOCK`]: each block gives each query a partial result (the
//! block's largest score, the sum of its weights e^(s − max), their weighted sum of values),
//! and the blocks' partials are folded in position order ([`fold`]) into the attention. One
//! token's blocks can so run on several threads at once and be folded afterwards, or a batch's
//! tokens share each block's keys and values on one thread, and either way every query's
//! arithmetic is the same: the same operations in the same order, so a token's attention is
//! bit for bit the same in a prompt's batch and in a step, whatever the threads, on every rank
//! and host.
//!
//! Three kernels with one arithmetic: x86-64 with AVX-512 (16 lanes), x86-64 with AVX2 and F16C
//! (the same 16 lanes as two halves), every other CPU plain Rust. Each multiplies then adds (no
//! fused multiply-add), and a lane of one is a lane of the others: a score is one lane's sum
//! over the head's values in order (the keys are stored transposed in tiles of [`TILE`]
//! positions for this), a weighted value one lane's sum over the positions in order; the
//! weights' sum is added in 16 lanes then in one tree, and the exp is one polynomial. f16 to f32
//! is exact, and f32 to f16 (on writing to the cache) rounds to nearest even in plain Rust
//! everywhere, as F16C's `vcvtps2ph` does.

/// Positions per key tile: a tile holds value i of its positions' keys side by side, so one
/// query's scores for the tile's positions are the lanes of one vector sum.
pub const TILE: usize = 16;

/// Positions per block (a whole number of tiles), counted from position 0: the softmax's unit.
pub const BLOCK: usize = 128;

/// f32 to IEEE f16 bits, rounding to nearest even (overflow to infinity, NaN stays NaN), as
/// F16C's `vcvtps2ph` with round-to-nearest does.
pub fn to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        // Infinity, or a NaN made quiet with the top of its payload.
        let nan = if man != 0 {
            0x200 | (man >> 13) as u16
        } else {
            0
        };
        return sign | 0x7c00 | nan;
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        // A subnormal f16 (or zero): the significand, implicit bit included, shifted down.
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let (q, rem, half) = (m >> shift, m & ((1 << shift) - 1), 1 << (shift - 1));
        let q = if rem > half || (rem == half && q & 1 == 1) {
            q + 1
        } else {
            q
        };
        return sign | q as u16;
    }
    let h = ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    // A carry out of the significand moves into the exponent: the next binade, or infinity.
    let h = if rem > 0x1000 || (rem == 0x1000 && h & 1 == 1) {
        h + 1
    } else {
        h
    };
    sign | h as u16
}

/// IEEE f16 bits to f32 (exact).
pub fn from_f16(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let e = ((h >> 10) & 0x1f) as u32;
    let m = (h & 0x3ff) as u32;
    match e {
        0 => {
            // Zero or subnormal: m · 2^−24, exact in f32.
            let v = m as f32 * (1.0 / 16_777_216.0);
            f32::from_bits(v.to_bits() | sign)
        }
        0x1f => f32::from_bits(sign | 0x7f80_0000 | (m << 13)),
        _ => f32::from_bits(sign | ((e + 112) << 23) | (m << 13)),
    }
}

/// One KV head's cache in one layer: keys in tiles of [`TILE`] positions ([tile][value][lane]),
/// values by position ([position][value]), both f16.
#[derive(Clone, Debug)]
pub struct KvHead {
    hd: usize,
    len: usize,
    keys: Vec<u16>,
    values: Vec<u16>,
}

impl KvHead {
    pub fn new(hd: usize) -> KvHead {
        KvHead {
            hd,
            len: 0,
            keys: Vec::new(),
            values: Vec::new(),
        }
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends the next position's key and value (head size each).
    pub fn push(&mut self, k: &[f32], v: &[f32]) {
        let hd = self.hd;
        assert!(
            k.len() == hd && v.len() == hd,
            "one key and one value of {hd}"
        );
        let lane = self.len % TILE;
        if lane == 0 {
            self.keys.resize(self.keys.len() + TILE * hd, 0);
        }
        let tile = &mut self.keys[self.len / TILE * TILE * hd..][..TILE * hd];
        for (i, x) in k.iter().enumerate() {
            tile[i * TILE + lane] = to_f16(*x);
        }
        self.values.extend(v.iter().map(|x| to_f16(*x)));
        self.len += 1;
    }

    pub fn clear(&mut self) {
        self.len = 0;
        self.keys.clear();
        self.values.clear();
    }

    /// Position p's key, back in f32 (for tests).
    #[cfg(test)]
    fn key(&self, p: usize, i: usize) -> f32 {
        from_f16(self.keys[p / TILE * TILE * self.hd + i * TILE + p % TILE])
    }

    #[cfg(test)]
    fn value(&self, p: usize, j: usize) -> f32 {
        from_f16(self.values[p * self.hd + j])
    }
}

/// Which code runs the attention: all give the same bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    Portable,
    /// x86-64 AVX2 with F16C: 8 lanes.
    Avx2,
    /// x86-64 AVX-512F: 16 lanes.
    Avx512,
}

impl Kernel {
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Portable => "portable",
            Kernel::Avx2 => "avx2+f16c",
            Kernel::Avx512 => "avx512f",
        }
    }

    pub fn available(self) -> bool {
        match self {
            Kernel::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => {
                std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => Kernel::Avx2.available() && std::is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The widest this CPU has; where `TBBENCH_QDOT` holds the products to a narrower kernel
    /// (to compare with a build for such a CPU), the attention keeps to the same width.
    pub fn chosen() -> Kernel {
        static CHOSEN: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
        *CHOSEN.get_or_init(|| {
            use super::qdot::Kernel as Q;
            let widest = if std::env::var_os(super::qdot::ENV_KERNEL).is_some() {
                match Q::chosen() {
                    Q::Avx512Vnni => Kernel::Avx512,
                    Q::Avx2 | Q::AvxVnni => Kernel::Avx2,
                    _ => Kernel::Portable,
                }
            } else {
                Kernel::Avx512
            };
            [Kernel::Avx512, Kernel::Avx2, Kernel::Portable]
                .into_iter()
                .filter(|k| *k as u8 <= widest as u8)
                .find(|k| k.available())
                .unwrap_or(Kernel::Portable)
        })
    }
}

/// Floats of one query's partial result over one block: the weighted sum of values (head size),
/// the block's largest score, the sum of its weights.
pub const fn part_len(hd: usize) -> usize {
    hd + 2
}

/// Partial results of `valid.len()` queries (rows of `hd` in `qs`) over block `b` of `kv`:
/// query r sees the block's first `valid[r]` positions (1..=BLOCK, within the cache), scores
/// scaled by `scale`; each writes its [`part_len`] floats to its row of `parts`. `scores` is
/// scratch.
#[allow(clippy::too_many_arguments)]
pub fn block(
    kernel: Kernel,
    qs: &[f32],
    hd: usize,
    valid: &[usize],
    kv: &KvHead,
    b: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    parts: &mut [f32],
) {
    let nq = valid.len();
    assert!(nq > 0 && hd > 0 && kv.hd == hd && qs.len() == nq * hd);
    assert_eq!(parts.len(), nq * part_len(hd), "one partial per query");
    let most = *valid.iter().max().unwrap_or(&0);
    assert!(
        valid.iter().all(|n| (1..=BLOCK).contains(n)) && b * BLOCK + most <= kv.len,
        "{most} positions of block {b} in a cache of {}",
        kv.len
    );
    scores.resize(nq * BLOCK, 0.0);
    let keys = &kv.keys[b * BLOCK * hd..][..most.div_ceil(TILE) * TILE * hd];
    let values = &kv.values[b * BLOCK * hd..][..most * hd];
    // The next block's keys, as far as they are written: fetched while this block's values are
    // weighed.
    let next = (b + 1) * BLOCK * hd;
    let next_keys = kv
        .keys
        .get(next..)
        .map_or(&[][..], |k| &k[..k.len().min(BLOCK * hd)]);
    let blk = Block {
        qs,
        hd,
        valid,
        keys,
        values,
        next_keys,
        scale,
    };
    match kernel {
        // SAFETY: the kernel's features are checked (`available`), and every read lies in the
        // slices above (a whole tile of keys per started tile, `valid` rows of values).
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 if kernel.available() => unsafe { avx512::block(&blk, scores, parts) },
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 | Kernel::Avx512 if Kernel::Avx2.available() => unsafe {
            avx2::block(&blk, scores, parts)
        },
        _ => portable::block(&blk, scores, parts),
    }
}

/// One block's inputs, checked.
struct Block<'a> {
    qs: &'a [f32],
    hd: usize,
    valid: &'a [usize],
    /// The tiles of the positions seen.
    keys: &'a [u16],
    /// The rows of the positions seen.
    values: &'a [u16],
    /// The next block's key tiles, for the x86 kernels' prefetch.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    next_keys: &'a [u16],
    scale: f32,
}

/// Folds the next block's partial `part` into `state` (the blocks before it folded the same
/// way; the first block's partial is the first state).
pub fn fold(state: &mut [f32], part: &[f32], hd: usize) {
    let (m0, m1) = (state[hd], part[hd]);
    let m = m0.max(m1);
    let (a, c) = (portable::exp(m0 - m), portable::exp(m1 - m));
    for (s, p) in state[..hd].iter_mut().zip(&part[..hd]) {
        *s = *s * a + *p * c;
    }
    state[hd] = m;
    state[hd + 1] = state[hd + 1] * a + part[hd + 1] * c;
}

/// The attention from a folded state: the weighted sum over the weights' sum.
pub fn finish(state: &[f32], hd: usize, out: &mut [f32]) {
    let norm = 1.0 / state[hd + 1];
    for (o, s) in out.iter_mut().zip(&state[..hd]) {
        *o = s * norm;
    }
}

/// Scratch for [`attend`].
#[derive(Default)]
pub struct Scratch {
    scores: Vec<f32>,
    parts: Vec<f32>,
    state: Vec<f32>,
    valid: Vec<usize>,
}

/// Attention of the queries in `qs` (rows of `hd`): row r over positions 0..ends[r] of `kv`
/// (ends at least 1 and in order), scores scaled by `scale`, into row r of `outs`. Block by
/// block, each block's keys and values read once for all the rows that see it.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    kernel: Kernel,
    qs: &[f32],
    hd: usize,
    ends: &[usize],
    kv: &KvHead,
    scale: f32,
    scratch: &mut Scratch,
    outs: &mut [f32],
) {
    let nq = ends.len();
    assert!(qs.len() == nq * hd && outs.len() == nq * hd);
    assert!(
        ends.first().is_none_or(|e| *e > 0) && ends.is_sorted(),
        "ends {ends:?}"
    );
    let Some(last) = ends.last() else { return };
    let pl = part_len(hd);
    let Scratch {
        scores,
        parts,
        state,
        valid,
    } = scratch;
    state.resize(nq * pl, 0.0);
    parts.resize(nq * pl, 0.0);
    for b in 0..last.div_ceil(BLOCK) {
        let start = b * BLOCK;
        // The rows that see this block: ends in order, so the last ones.
        let first = ends.partition_point(|e| *e <= start);
        valid.clear();
        valid.extend(ends[first..].iter().map(|e| (e - start).min(BLOCK)));
        let qb = &qs[first * hd..];
        if b == 0 {
            block(kernel, qb, hd, valid, kv, b, scale, scores, state);
            continue;
        }
        let pb = &mut parts[first * pl..];
        block(kernel, qb, hd, valid, kv, b, scale, scores, pb);
        for (s, p) in state[first * pl..]
            .chunks_exact_mut(pl)
            .zip(pb.chunks_exact(pl))
        {
            fold(s, p, hd);
        }
    }
    for (s, o) in state.chunks_exact(pl).zip(outs.chunks_exact_mut(hd)) {
        finish(s, hd, o);
    }
}

// The exp: Cephes' expf (x = n·ln 2 + r, a degree-6 polynomial in r, 2^n from the exponent
// bits), for the shifted scores x <= 0; below −87.3 (and for −∞) it gives e^−87.3, f32's
// smallest normal, which no softmax sum notices.
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 in two parts, the first with few bits so that n·C1 is exact.
const C1: f32 = 0.693_359_4;
const C2: f32 = -2.121_944_4e-4;
/// Adding and subtracting 1.5·2^23 rounds to an integer (ties to even) for |t| < 2^22.
const ROUND: f32 = 12_582_912.0;
const FLOOR: f32 = -87.336_54;
const P: [f32; 6] = [
    1.987_569_2e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_65,
    0.5,
];

pub mod portable {
    use super::*;

    pub fn exp(x: f32) -> f32 {
        let x = x.max(FLOOR);
        let n = (x * LOG2E + ROUND) - ROUND;
        let r = x - n * C1 - n * C2;
        let mut p = P[0];
        for c in &P[1..] {
            p = p * r + c;
        }
        let e = p * (r * r) + r + 1.0;
        e * f32::from_bits(((n as i32 + 127) as u32) << 23)
    }

    /// The 16 lanes' sum as the SIMD kernels add them: halves, quarters, eighths, then the
    /// pair.
    pub(super) fn sum16(l: &[f32; TILE]) -> f32 {
        let a: [f32; 8] = std::array::from_fn(|i| l[i] + l[i + 8]);
        let h: [f32; 4] = std::array::from_fn(|i| a[i] + a[i + 4]);
        (h[0] + h[2]) + (h[1] + h[3])
    }

    pub(super) fn block(blk: &Block, scores: &mut [f32], parts: &mut [f32]) {
        let hd = blk.hd;
        let pl = part_len(hd);
        for (r, &n) in blk.valid.iter().enumerate() {
            let q = &blk.qs[r * hd..(r + 1) * hd];
            let s = &mut scores[r * BLOCK..r * BLOCK + n];
            for (p, s) in s.iter_mut().enumerate() {
                let tile = &blk.keys[p / TILE * TILE * hd..];
                let mut acc = 0f32;
                for (i, qi) in q.iter().enumerate() {
                    acc += qi * from_f16(tile[i * TILE + p % TILE]);
                }
                *s = acc * blk.scale;
            }
            let max = s.iter().fold(f32::NEG_INFINITY, |m, x| m.max(*x));
            let mut lanes = [0f32; TILE];
            for (p, x) in s.iter_mut().enumerate() {
                *x = exp(*x - max);
                lanes[p % TILE] += *x;
            }
            let part = &mut parts[r * pl..(r + 1) * pl];
            part[..hd].fill(0.0);
            for (p, w) in s.iter().enumerate() {
                let v = &blk.values[p * hd..(p + 1) * hd];
                for (a, x) in part[..hd].iter_mut().zip(v) {
                    *a += w * from_f16(*x);
                }
            }
            part[hd] = max;
            part[hd + 1] = sum16(&lanes);
        }
    }
}

/// The kernels' shared shape, for a vector type of `LANES` lanes (one or two registers per
/// tile of 16 positions): the scores a tile at a time for up to four rows at once, then per row
/// the max, the weights and their sum, then the weighted values in strips of W registers for
/// up to four rows at once. Each macro use defines `block` in its module.
#[cfg(target_arch = "x86_64")]
macro_rules! simd_block {
    ($features:literal) => {
        /// Scores of rows `r0..r0 + R` for every started tile, `T` tiles at a time (more sums
        /// in flight), the rest one at a time.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn scores<const R: usize>(blk: &Block, r0: usize, tiles: usize, sp: *mut f32) {
            // The block's values are fetched while its keys are multiplied, a line a step.
            let vlines = if r0 == 0 {
                (blk.values.len() * 2).div_ceil(64)
            } else {
                0
            };
            let mut line = 0;
            let mut t = 0;
            while t + TILES <= tiles {
                tiles_scores::<R, { TILES * PER_TILE }>(blk, r0, t, sp, vlines, &mut line);
                t += TILES;
            }
            while t < tiles {
                tiles_scores::<R, PER_TILE>(blk, r0, t, sp, vlines, &mut line);
                t += 1;
            }
        }

        /// Scores of rows `r0..r0 + R` for the U / PER_TILE tiles from tile `t`.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn tiles_scores<const R: usize, const U: usize>(
            blk: &Block,
            r0: usize,
            t: usize,
            sp: *mut f32,
            vlines: usize,
            line: &mut usize,
        ) {
            let hd = blk.hd;
            let kt = blk.keys.as_ptr().add(t * TILE * hd);
            let qp = blk.qs.as_ptr().add(r0 * hd);
            let vp = blk.values.as_ptr() as *const u8;
            // Register u of a step: its tile's row, and its lanes in the row.
            let mut at = [0usize; U];
            for (u, a) in at.iter_mut().enumerate() {
                *a = register_offset(u, hd);
            }
            let mut acc = [[zero(); U]; R];
            for i in 0..hd {
                if *line < vlines {
                    prefetch(vp.add(64 * *line));
                    *line += 1;
                }
                let mut k = [zero(); U];
                for (ku, a) in k.iter_mut().zip(&at) {
                    *ku = load_f16(kt.add(a + i * TILE));
                }
                for (r, a) in acc.iter_mut().enumerate() {
                    let q = splat(*qp.add(r * hd + i));
                    for u in 0..U {
                        a[u] = add(a[u], mul(q, k[u]));
                    }
                }
            }
            let scale = splat(blk.scale);
            for (r, a) in acc.iter().enumerate() {
                for (u, au) in a.iter().enumerate() {
                    store(
                        sp.add((r0 + r) * BLOCK + t * TILE + u * LANES),
                        mul(*au, scale),
                    );
                }
            }
        }

        /// Row r's weights over its `n` positions in place, and their largest score and sum.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn weights(s: *mut f32, n: usize) -> (f32, f32) {
            let tiles = n.div_ceil(TILE);
            let mut vmax = splat(f32::NEG_INFINITY);
            for t in 0..tiles {
                for h in 0..PER_TILE {
                    let at = t * TILE + h * LANES;
                    let x = load(s.add(at));
                    vmax = max(
                        vmax,
                        if at + LANES <= n {
                            x
                        } else {
                            keep(x, at, n, f32::NEG_INFINITY)
                        },
                    );
                }
            }
            let m = hmax(vmax);
            let vm = splat(m);
            let mut lanes = [zero(); PER_TILE];
            for t in 0..tiles {
                for (h, l) in lanes.iter_mut().enumerate() {
                    let at = t * TILE + h * LANES;
                    let e = exp(sub(load(s.add(at)), vm));
                    let e = if at + LANES <= n {
                        e
                    } else {
                        keep(e, at, n, 0.0)
                    };
                    store(s.add(at), e);
                    *l = add(*l, e);
                }
            }
            (m, sum_tile(lanes))
        }

        /// Weighted values of rows `r0..r0 + R` (weights in `sp`, row r over its first
        /// `valid[r]` positions) for values `j..j + W · LANES`, into their partials.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn values<const R: usize, const W: usize>(
            blk: &Block,
            r0: usize,
            j: usize,
            sp: *const f32,
            pp: *mut f32,
        ) {
            let hd = blk.hd;
            let vp = blk.values.as_ptr();
            let n = &blk.valid[r0..r0 + R];
            let (least, most) = (
                n.iter().min().copied().unwrap_or(0),
                n.iter().max().copied().unwrap_or(0),
            );
            let mut acc = [[zero(); W]; R];
            // The next block's keys are fetched while these values are weighed, two lines a
            // position.
            let (kp, klines) = (
                blk.next_keys.as_ptr() as *const u8,
                // Whole lines only: every address prefetched lies in the slice.
                if r0 == 0 && j == 0 {
                    blk.next_keys.len() * 2 / 64
                } else {
                    0
                },
            );
            // Every row's positions, then the longer rows' own.
            for p in 0..least {
                if 2 * p + 1 < klines {
                    prefetch(kp.add(128 * p));
                    prefetch(kp.add(128 * p + 64));
                }
                let mut v = [zero(); W];
                for (w, vw) in v.iter_mut().enumerate() {
                    *vw = load_f16(vp.add(p * hd + j + w * LANES));
                }
                for (r, a) in acc.iter_mut().enumerate() {
                    let x = splat(*sp.add((r0 + r) * BLOCK + p));
                    for w in 0..W {
                        a[w] = add(a[w], mul(x, v[w]));
                    }
                }
            }
            for p in least..most {
                let mut v = [zero(); W];
                for (w, vw) in v.iter_mut().enumerate() {
                    *vw = load_f16(vp.add(p * hd + j + w * LANES));
                }
                for (r, a) in acc.iter_mut().enumerate() {
                    if p < n[r] {
                        let x = splat(*sp.add((r0 + r) * BLOCK + p));
                        for w in 0..W {
                            a[w] = add(a[w], mul(x, v[w]));
                        }
                    }
                }
            }
            let pl = part_len(hd);
            for (r, a) in acc.iter().enumerate() {
                for w in 0..W {
                    store(pp.add((r0 + r) * pl + j + w * LANES), a[w]);
                }
            }
        }

        /// Rows `r0..r0 + R`: scores, weights, weighted values.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn rows<const R: usize>(blk: &Block, r0: usize, sp: *mut f32, pp: *mut f32) {
            let hd = blk.hd;
            let pl = part_len(hd);
            let most = (0..R).map(|r| blk.valid[r0 + r]).max().unwrap_or(0);
            scores::<R>(blk, r0, most.div_ceil(TILE), sp);
            for r in r0..r0 + R {
                let (m, l) = weights(sp.add(r * BLOCK), blk.valid[r]);
                *pp.add(r * pl + hd) = m;
                *pp.add(r * pl + hd + 1) = l;
            }
            let mut j = 0;
            while j + WIDE * LANES <= hd {
                values::<R, WIDE>(blk, r0, j, sp, pp);
                j += WIDE * LANES;
            }
            while j + LANES <= hd {
                values::<R, 1>(blk, r0, j, sp, pp);
                j += LANES;
            }
            // The last values one lane at a time, in the same order.
            for jj in j..hd {
                for r in r0..r0 + R {
                    let mut acc = 0f32;
                    for p in 0..blk.valid[r] {
                        acc += *sp.add(r * BLOCK + p)
                            * from_f16(*blk.values.get_unchecked(p * hd + jj));
                    }
                    *pp.add(r * pl + jj) = acc;
                }
            }
        }

        #[target_feature(enable = $features)]
        pub(super) unsafe fn block(blk: &Block, scores: &mut [f32], parts: &mut [f32]) {
            let (sp, pp) = (scores.as_mut_ptr(), parts.as_mut_ptr());
            let nq = blk.valid.len();
            let mut r0 = 0;
            while r0 < nq {
                match nq - r0 {
                    1 => rows::<1>(blk, r0, sp, pp),
                    2 => rows::<2>(blk, r0, sp, pp),
                    3 => rows::<3>(blk, r0, sp, pp),
                    _ => rows::<4>(blk, r0, sp, pp),
                }
                r0 += 4;
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    type V = __m256;
    const LANES: usize = 8;
    const PER_TILE: usize = TILE / LANES;
    /// Tiles of scores at once: 4 rows by 2 registers a tile stay in the 16 registers.
    const TILES: usize = 1;
    /// Registers per strip of values: 4 rows by 2 stay in the 16 registers.
    const WIDE: usize = 2;

    #[inline(always)]
    unsafe fn zero() -> V {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> V {
        _mm256_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn add(a: V, b: V) -> V {
        _mm256_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: V, b: V) -> V {
        _mm256_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn mul(a: V, b: V) -> V {
        _mm256_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn max(a: V, b: V) -> V {
        _mm256_max_ps(a, b)
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> V {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: V) {
        _mm256_storeu_ps(p, v)
    }
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load_f16(p: *const u16) -> V {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
    /// `x`'s lanes for positions at.. below n, `fill` in the others.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn keep(x: V, at: usize, n: usize, fill: f32) -> V {
        let left = n.saturating_sub(at).min(LANES) as i32;
        let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let on = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(left), idx));
        _mm256_blendv_ps(_mm256_set1_ps(fill), x, on)
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn hmax(v: V) -> f32 {
        let h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let q = _mm_max_ps(h, _mm_movehl_ps(h, h));
        _mm_cvtss_f32(_mm_max_ss(q, _mm_movehdup_ps(q)))
    }
    /// The 16 lanes (two registers) summed as [`portable::sum16`] does.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn sum_tile(l: [V; PER_TILE]) -> f32 {
        sum8(_mm256_add_ps(l[0], l[1]))
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn sum8(v: __m256) -> f32 {
        let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        // (h0 + h2, h1 + h3), then their sum.
        let q = _mm_add_ps(h, _mm_movehl_ps(h, h));
        _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)))
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn exp(x: __m256) -> __m256 {
        let x = _mm256_max_ps(x, _mm256_set1_ps(FLOOR));
        let round = _mm256_set1_ps(ROUND);
        let n = _mm256_sub_ps(
            _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)), round),
            round,
        );
        let r = _mm256_sub_ps(
            _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(C1))),
            _mm256_mul_ps(n, _mm256_set1_ps(C2)),
        );
        let mut p = _mm256_set1_ps(P[0]);
        for c in &P[1..] {
            p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(*c));
        }
        let e = _mm256_add_ps(
            _mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r),
            _mm256_set1_ps(1.0),
        );
        // n is a whole number in [−126, 0]: exact as an integer, 2^n a normal f32.
        let bits = _mm256_slli_epi32(
            _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
            23,
        );
        _mm256_mul_ps(e, _mm256_castsi256_ps(bits))
    }

    #[inline(always)]
    unsafe fn prefetch(p: *const u8) {
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
    }

    /// Where register u of a step of tiles starts (two registers a tile).
    #[inline(always)]
    fn register_offset(u: usize, hd: usize) -> usize {
        u / 2 * TILE * hd + u % 2 * LANES
    }

    simd_block!("avx2,f16c");
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::*;
    use std::arch::x86_64::*;

    type V = __m512;
    const LANES: usize = 16;
    const PER_TILE: usize = TILE / LANES;
    /// Tiles of scores at once: 4 rows by 2 tiles, eight sums in flight.
    const TILES: usize = 2;
    /// Registers per strip of values: 4 rows by 4 (a head of 64 in one strip).
    const WIDE: usize = 4;

    #[inline(always)]
    unsafe fn zero() -> V {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> V {
        _mm512_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn add(a: V, b: V) -> V {
        _mm512_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: V, b: V) -> V {
        _mm512_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn mul(a: V, b: V) -> V {
        _mm512_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn max(a: V, b: V) -> V {
        _mm512_max_ps(a, b)
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> V {
        _mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: V) {
        _mm512_storeu_ps(p, v)
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load_f16(p: *const u16) -> V {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }
    /// `x`'s lanes for positions at.. below n, `fill` in the others.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn keep(x: V, at: usize, n: usize, fill: f32) -> V {
        let left = n.saturating_sub(at).min(LANES) as u32;
        let on: __mmask16 = ((1u32 << left) - 1) as u16;
        _mm512_mask_blend_ps(on, _mm512_set1_ps(fill), x)
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn hmax(v: V) -> f32 {
        _mm512_reduce_max_ps(v)
    }
    /// The 16 lanes summed as [`portable::sum16`] does.
    #[inline]
    #[target_feature(enable = "avx512f,avx2")]
    unsafe fn sum_tile(l: [V; PER_TILE]) -> f32 {
        let v = l[0];
        let lo = _mm512_castps512_ps256(v);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
        super::avx2::sum8(_mm256_add_ps(lo, hi))
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn exp(x: V) -> V {
        let x = _mm512_max_ps(x, _mm512_set1_ps(FLOOR));
        let round = _mm512_set1_ps(ROUND);
        let n = _mm512_sub_ps(
            _mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(LOG2E)), round),
            round,
        );
        let r = _mm512_sub_ps(
            _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(C1))),
            _mm512_mul_ps(n, _mm512_set1_ps(C2)),
        );
        let mut p = _mm512_set1_ps(P[0]);
        for c in &P[1..] {
            p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(*c));
        }
        let e = _mm512_add_ps(
            _mm512_add_ps(_mm512_mul_ps(p, _mm512_mul_ps(r, r)), r),
            _mm512_set1_ps(1.0),
        );
        let bits = _mm512_slli_epi32::<23>(_mm512_add_epi32(
            _mm512_cvtps_epi32(n),
            _mm512_set1_epi32(127),
        ));
        _mm512_mul_ps(e, _mm512_castsi512_ps(bits))
    }

    #[inline(always)]
    unsafe fn prefetch(p: *const u8) {
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
    }

    /// Where register u of a step of tiles starts (one register a tile).
    #[inline(always)]
    fn register_offset(u: usize, hd: usize) -> usize {
        u * TILE * hd
    }

    simd_block!("avx512f,avx2,f16c");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulp_down_to_the_smallest_normal() {
        let mut worst = 0f64;
        let mut x = 0f32;
        while x > -87.0 {
            let (got, want) = (portable::exp(x) as f64, (x as f64).exp());
            worst = worst.max(((got - want) / want).abs());
            x -= 0.001_37;
        }
        assert!(worst < 2.5e-7, "largest relative error {worst:e}");
        assert_eq!(portable::exp(0.0), 1.0);
        assert!(portable::exp(f32::NEG_INFINITY) < 1.2e-38);
        assert!(portable::exp(-1e30) >= 0.0);
    }

    /// Every f16 back to f32 and again to the same bits; f32s between two f16s round to the
    /// nearer, ties to the even one; beyond the largest to infinity, below the smallest
    /// subnormal's half to zero.
    #[test]
    fn f16_conversions_round_to_nearest_even() {
        for h in 0..=u16::MAX {
            let x = from_f16(h);
            if x.is_nan() {
                assert!(to_f16(x) & 0x7c00 == 0x7c00 && to_f16(x) & 0x3ff != 0);
                continue;
            }
            assert_eq!(to_f16(x), h, "{h:#06x} {x:e}");
            // Halfway to the next f16 up in magnitude: ties to even.
            let next = from_f16(h + 1);
            if h & 0x7fff < 0x7bff && (h & 0x7fff) != 0x7bff {
                let mid = ((x as f64 + next as f64) / 2.0) as f32;
                let even = if h & 1 == 0 { h } else { h + 1 };
                assert_eq!(to_f16(mid), even, "tie above {h:#06x}");
                let above = f32::from_bits(mid.to_bits() + 1);
                let below = f32::from_bits(mid.to_bits() - 1);
                assert_eq!(to_f16(above.copysign(x)), h + 1, "above {h:#06x}");
                assert_eq!(to_f16(below.copysign(x)), h, "below {h:#06x}");
            }
        }
        assert_eq!(to_f16(65_520.0), 0x7c00);
        assert_eq!(to_f16(65_519.99), 0x7bff);
        assert_eq!(to_f16(-1e30), 0xfc00);
        assert_eq!(to_f16(2f32.powi(-25)), 0);
        assert_eq!(to_f16(f32::from_bits(2f32.powi(-25).to_bits() + 1)), 1);
        assert_eq!(to_f16(-0.0), 0x8000);
        assert_eq!(to_f16(1e-45), 0);
    }

    /// The portable conversion is F16C's, over a sweep of f32 bit patterns.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn f16_conversion_is_f16cs() {
        if !std::is_x86_feature_detected!("f16c") {
            return;
        }
        use std::arch::x86_64::*;
        let mut bits = 0u32;
        loop {
            let x = f32::from_bits(bits);
            // SAFETY: F16C checked above.
            let want = unsafe {
                _mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set1_ps(x)))
                    as u16
            };
            assert_eq!(to_f16(x), want, "{bits:#010x}");
            let back = unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(want as i16))) };
            assert_eq!(from_f16(want).to_bits(), back.to_bits(), "{want:#06x}");
            match bits.checked_add(4099) {
                Some(b) => bits = b,
                None => break,
            }
        }
    }

    fn fill(seed: usize, i: usize) -> f32 {
        (((i * 7919 + seed * 104_729) % 2003) as f32 / 2003.0 - 0.5) * 3.0
    }

    fn cache(hd: usize, positions: usize) -> KvHead {
        let mut kv = KvHead::new(hd);
        for p in 0..positions {
            let k: Vec<f32> = (0..hd).map(|i| fill(1, p * hd + i)).collect();
            let v: Vec<f32> = (0..hd).map(|i| fill(2, p * hd + i)).collect();
            kv.push(&k, &v);
        }
        kv
    }

    fn kernels() -> Vec<Kernel> {
        [Kernel::Portable, Kernel::Avx2, Kernel::Avx512]
            .into_iter()
            .filter(|k| k.available())
            .collect()
    }

    /// Every kernel this CPU has, bit for bit the portable one and within 1e-5 of a softmax
    /// in f64 over the cached (f16) keys and values, at head sizes with and without a tail,
    /// positions around the tiles and blocks, and rows that see different positions.
    #[test]
    fn kernels_agree_bit_for_bit_and_with_f64() {
        for hd in [64usize, 40, 17, 3] {
            for positions in [1usize, 7, 16, 17, 128, 129, 300] {
                let kv = cache(hd, positions);
                // Up to 9 rows (more than one group of four), the later ones seeing more.
                let nq = 1 + positions % 9;
                let qs: Vec<f32> = (0..nq * hd).map(|i| fill(3, i)).collect();
                let ends: Vec<usize> = (0..nq)
                    .map(|r| positions - (nq - 1 - r).min(positions - 1) / 2)
                    .collect();
                let scale = 1.0 / (hd as f32).sqrt();
                let mut want_bits = None;
                for k in kernels() {
                    let mut out = vec![0f32; nq * hd];
                    attend(
                        k,
                        &qs,
                        hd,
                        &ends,
                        &kv,
                        scale,
                        &mut Scratch::default(),
                        &mut out,
                    );
                    let bits: Vec<u32> = out.iter().map(|x| x.to_bits()).collect();
                    match &want_bits {
                        None => want_bits = Some(bits),
                        Some(w) => assert_eq!(&bits, w, "{k:?} hd {hd} n {positions}"),
                    }
                    for (r, end) in ends.iter().enumerate() {
                        let q = &qs[r * hd..(r + 1) * hd];
                        let sc: Vec<f64> = (0..*end)
                            .map(|p| {
                                (0..hd)
                                    .map(|i| q[i] as f64 * kv.key(p, i) as f64)
                                    .sum::<f64>()
                                    * scale as f64
                            })
                            .collect();
                        let max = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let e: Vec<f64> = sc.iter().map(|s| (s - max).exp()).collect();
                        let total: f64 = e.iter().sum();
                        for j in 0..hd {
                            let want: f64 = (0..*end)
                                .map(|p| e[p] / total * kv.value(p, j) as f64)
                                .sum();
                            let got = out[r * hd + j] as f64;
                            assert!(
                                (got - want).abs() <= 1e-5,
                                "{k:?} hd {hd} n {positions} row {r} [{j}]: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// A row alone, or among others, or its blocks computed one by one (as threads do) and
    /// folded afterwards: the same bits.
    #[test]
    fn rows_together_alone_and_block_by_block_agree() {
        let hd = 64;
        let kv = cache(hd, 300);
        let scale = 0.125;
        let ends: Vec<usize> = (290..=300).collect();
        let qs: Vec<f32> = (0..ends.len() * hd).map(|i| fill(4, i)).collect();
        for k in kernels() {
            let mut together = vec![0f32; ends.len() * hd];
            attend(
                k,
                &qs,
                hd,
                &ends,
                &kv,
                scale,
                &mut Scratch::default(),
                &mut together,
            );
            for (r, end) in ends.iter().enumerate() {
                let q = &qs[r * hd..(r + 1) * hd];
                let mut alone = vec![0f32; hd];
                attend(
                    k,
                    q,
                    hd,
                    &[*end],
                    &kv,
                    scale,
                    &mut Scratch::default(),
                    &mut alone,
                );
                let pl = part_len(hd);
                let mut state = vec![0f32; pl];
                let mut scores = Vec::new();
                for b in 0..end.div_ceil(BLOCK) {
                    let mut part = vec![0f32; pl];
                    let valid = [(end - b * BLOCK).min(BLOCK)];
                    block(k, q, hd, &valid, &kv, b, scale, &mut scores, &mut part);
                    if b == 0 {
                        state = part;
                    } else {
                        fold(&mut state, &part, hd);
                    }
                }
                let mut split = vec![0f32; hd];
                finish(&state, hd, &mut split);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&together[r * hd..(r + 1) * hd]),
                    bits(&alone),
                    "{k:?} {r}"
                );
                assert_eq!(bits(&split), bits(&alone), "{k:?} {r}");
            }
        }
    }
}
