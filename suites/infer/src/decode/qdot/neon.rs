use super::{Format, Q8Activation, QK};
use std::arch::aarch64::*;

/// Σ w·a over 32 weights (two 16-byte halves) and 32 activations. Each i16 product is at
/// most 128·127 and is widened before any sum, so nothing saturates.
#[inline(always)]
unsafe fn sum32(w0: int8x16_t, w1: int8x16_t, a: *const i8) -> i32 {
    let (a0, a1) = (vld1q_s8(a), vld1q_s8(a.add(16)));
    let mut acc = vdupq_n_s32(0);
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(w0), vget_low_s8(a0)));
    acc = vpadalq_s16(acc, vmull_high_s8(w0, a0));
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(w1), vget_low_s8(a1)));
    acc = vpadalq_s16(acc, vmull_high_s8(w1, a1));
    vaddvq_s32(acc)
}

/// `$name(acc, a, b)`: `acc` plus the byte products the instruction `$ins` forms from
/// `a` and `b`, on a CPU with `$features` (written out: Rust's intrinsics for these are
/// not stable).
macro_rules! byte_products {
    ($(#[$doc:meta])* $name:ident, $features:literal, $ins:literal) => {
        $(#[$doc])*
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn $name(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
            let mut acc = acc;
            std::arch::asm!(
                concat!($ins, " {acc:v}.4s, {a:v}.16b, {b:v}.16b"),
                acc = inout(vreg) acc,
                a = in(vreg) a,
                b = in(vreg) b,
                options(pure, nomem, nostack, preserves_flags)
            );
            acc
        }
    };
}

byte_products!(
    /// In each i32 lane, the four byte products of that lane's bytes of `a` and `b`.
    sdot, "neon,dotprod", "sdot"
);
byte_products!(
    /// The 2x2 i32 products of `a`'s two rows of 8 bytes with `b`'s two rows of 8 bytes:
    /// lanes [a0·b0, a0·b1, a1·b0, a1·b1].
    smmla, "neon,i8mm", "smmla"
);

/// `sum32` by two `sdot`s (each sum of four products at most 4·128·127: exact in i32).
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn sum32_dot(w0: int8x16_t, w1: int8x16_t, a: *const i8) -> i32 {
    let acc = sdot(vdupq_n_s32(0), w0, vld1q_s8(a));
    vaddvq_s32(sdot(acc, w1, vld1q_s8(a.add(16))))
}

/// The low (`HIGH` false) or high 8 bytes of `x` and of `y`, side by side.
#[inline(always)]
unsafe fn pair_halves<const HIGH: bool>(x: int8x16_t, y: int8x16_t) -> int8x16_t {
    let (x, y) = (vreinterpretq_s64_s8(x), vreinterpretq_s64_s8(y));
    vreinterpretq_s8_s64(if HIGH {
        vzip2q_s64(x, y)
    } else {
        vzip1q_s64(x, y)
    })
}

/// A block's 32 weights as two registers of signed bytes (values 0-15 and 16-31).
#[inline(always)]
unsafe fn unpack(format: Format, qs: *const u8) -> (int8x16_t, int8x16_t) {
    match format {
        Format::Q8_0 => (vld1q_s8(qs as *const i8), vld1q_s8(qs.add(16) as *const i8)),
        Format::Q4_0 | Format::Q4_1 => {
            let bytes = vld1q_u8(qs);
            (
                vreinterpretq_s8_u8(vandq_u8(bytes, vdupq_n_u8(0x0f))),
                vreinterpretq_s8_u8(vshrq_n_u8::<4>(bytes)),
            )
        }
    }
}

/// Block b's term for a row (scale `d`, minimum `m`) and an activation, from the block's
/// integer sum `s`: the same operations as `row_by`'s.
#[inline(always)]
fn term(format: Format, s: i32, d: f32, m: f32, a: &Q8Activation, b: usize) -> f64 {
    let scale = d as f64 * a.d[b];
    match format {
        Format::Q8_0 => scale * s as f64,
        Format::Q4_0 => scale * (s - 8 * a.qsum[b]) as f64,
        Format::Q4_1 => scale * s as f64 + m as f64 * a.dsum[b],
    }
}

/// `rows` rows (one after another) times each of `acts`, into `out[r * acts.len() + t]`:
/// two rows by two tokens per block with four `smmla`s, the block terms added in row
/// order per row and token, so each value is `row_dot`'s bit for bit; a last odd row or
/// token by `row_dot`.
///
/// # Safety
/// The CPU has FEAT_I8MM and FEAT_DotProd; the lengths are checked.
#[target_feature(enable = "neon,dotprod,i8mm")]
pub unsafe fn rows_many_i8mm(
    format: Format,
    q: &[u8],
    d: &[f32],
    m: &[f32],
    rows: usize,
    acts: &[Q8Activation],
    out: &mut [f32],
) {
    let n = acts.len();
    let nb = d.len() / rows.max(1);
    let qb = format.quant_bytes();
    let min = |r: usize, b: usize| {
        if format == Format::Q4_1 {
            m[r * nb + b]
        } else {
            0.0
        }
    };
    let mut r = 0;
    while r < rows {
        let pair = r + 1 < rows;
        let mut t = 0;
        while pair && t + 1 < n {
            let (a0, a1) = (&acts[t], &acts[t + 1]);
            let mut acc = [0f64; 4];
            for b in 0..nb {
                let (w0a, w0b) = unpack(format, q.as_ptr().add((r * nb + b) * qb));
                let (w1a, w1b) = unpack(format, q.as_ptr().add(((r + 1) * nb + b) * qb));
                let (x0, x1) = (a0.q.as_ptr().add(b * QK), a1.q.as_ptr().add(b * QK));
                let (x0a, x0b) = (vld1q_s8(x0), vld1q_s8(x0.add(16)));
                let (x1a, x1b) = (vld1q_s8(x1), vld1q_s8(x1.add(16)));
                let mut s = vdupq_n_s32(0);
                s = smmla(
                    s,
                    pair_halves::<false>(w0a, w1a),
                    pair_halves::<false>(x0a, x1a),
                );
                s = smmla(
                    s,
                    pair_halves::<true>(w0a, w1a),
                    pair_halves::<true>(x0a, x1a),
                );
                s = smmla(
                    s,
                    pair_halves::<false>(w0b, w1b),
                    pair_halves::<false>(x0b, x1b),
                );
                s = smmla(
                    s,
                    pair_halves::<true>(w0b, w1b),
                    pair_halves::<true>(x0b, x1b),
                );
                let mut sums = [0i32; 4];
                vst1q_s32(sums.as_mut_ptr(), s);
                for (i, (acc, sum)) in acc.iter_mut().zip(sums).enumerate() {
                    let (row, a) = (r + i / 2, [a0, a1][i % 2]);
                    *acc += term(format, sum, d[row * nb + b], min(row, b), a, b);
                }
            }
            for (i, v) in acc.iter().enumerate() {
                out[(r + i / 2) * n + t + i % 2] = *v as f32;
            }
            t += 2;
        }
        // The rows (one, or two past the last pair of tokens) left to `row_dot`.
        for rr in r..(r + 1 + usize::from(pair)).min(rows) {
            let (rq, rd, rm) = super::rows_of(format, q, d, m, nb, rr..rr + 1);
            for (tt, a) in acts.iter().enumerate().skip(t) {
                out[rr * n + tt] = row_dot(format, rq, rd, rm, a) as f32;
            }
        }
        r += 2;
    }
}

/// One row on the baseline kernel.
pub unsafe fn row(format: Format, q: &[u8], d: &[f32], m: &[f32], a: &Q8Activation) -> f64 {
    row_by(format, q, d, m, a, |w0, w1, x| sum32(w0, w1, x))
}

/// One row with `sdot`.
///
/// # Safety
/// The CPU has FEAT_DotProd; the lengths are checked.
#[target_feature(enable = "neon,dotprod")]
pub unsafe fn row_dot(format: Format, q: &[u8], d: &[f32], m: &[f32], a: &Q8Activation) -> f64 {
    row_by(format, q, d, m, a, |w0, w1, x| sum32_dot(w0, w1, x))
}

/// The row's block terms in row order, each block's integer sum from `sum`.
#[inline(always)]
unsafe fn row_by(
    format: Format,
    q: &[u8],
    d: &[f32],
    m: &[f32],
    a: &Q8Activation,
    sum: impl Fn(int8x16_t, int8x16_t, *const i8) -> i32,
) -> f64 {
    let qb = format.quant_bytes();
    let (qp, ap) = (q.as_ptr(), a.q.as_ptr());
    let low = vdupq_n_u8(0x0f);
    let mut acc = 0f64;
    for b in 0..d.len() {
        let qs = qp.add(b * qb);
        let xa = ap.add(b * QK);
        let s = match format {
            Format::Q8_0 => sum(
                vld1q_s8(qs as *const i8),
                vld1q_s8(qs.add(16) as *const i8),
                xa,
            ),
            Format::Q4_0 | Format::Q4_1 => {
                let bytes = vld1q_u8(qs);
                let lo = vreinterpretq_s8_u8(vandq_u8(bytes, low));
                let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(bytes));
                sum(lo, hi, xa)
            }
        };
        let scale = d[b] as f64 * a.d[b];
        acc += match format {
            Format::Q8_0 => scale * s as f64,
            Format::Q4_0 => scale * (s - 8 * a.qsum[b]) as f64,
            Format::Q4_1 => scale * s as f64 + m[b] as f64 * a.dsum[b],
        };
    }
    acc
}
