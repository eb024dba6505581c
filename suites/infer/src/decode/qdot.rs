//! Products of block-quantized weight rows with an activation vector that is itself quantized
//! to 8 bits per block of 32, the way llama.cpp multiplies on CPUs: each block's product is a
//! sum of 32 integer products (exact), scaled once by the two blocks' scales. A step then
//! reads 5 (Q4) or 9 (Q8_0) bits per weight and does one integer multiply-add per weight,
//! instead of widening every weight to f32.
//!
//! The activation follows ggml's q8_0 / q8_1: d = max|x| / 127 (kept as f16, as ggml stores
//! it), q = round(x / d) with the unrounded d; q8_1's d·Σq (what Q4_1's block minimum
//! multiplies) is also rounded to f16. Matching ggml's rounding keeps the decode's greedy
//! tokens close to llama.cpp's on the same file.
//!
//! Each block's term is formed in f64 from exact parts (f32 scales, integer sums) and the
//! blocks are added in f64, so a row split between ranks at block edges (tensor parallelism)
//! sums to the same value as the whole row far below f32's precision.
//!
//! x86-64 with AVX2: 32 byte products per instruction (`maddubs`), four blocks' sums at a
//! time in f64 lanes. aarch64 (Apple silicon): NEON widening products. Elsewhere (x86-64
//! without AVX2) a portable loop. All give bit-identical block terms (multiply, then add: no
//! fused multiply-add); only the order in which the terms are added can differ. The NEON
//! kernel is tested under qemu-aarch64 in CI.

use super::quant;

/// Values per block, in every block format here.
pub const QK: usize = 32;

/// The weight formats these kernels take, as `Weights::Blocks` keeps them: per block a scale
/// (and Q4_1's minimum) widened to f32, and the quants as the file has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// d·(q − 8), q a nibble: 16 bytes per block, the first 16 values in the low nibbles.
    Q4_0,
    /// d·q + m, q a nibble.
    Q4_1,
    /// d·q, q a signed byte: 32 bytes per block.
    Q8_0,
}

impl Format {
    pub fn of(ggml_type: u32) -> Option<Format> {
        match ggml_type {
            quant::Q4_0 => Some(Format::Q4_0),
            quant::Q4_1 => Some(Format::Q4_1),
            quant::Q8_0 => Some(Format::Q8_0),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Format::Q4_0 => "q4_0",
            Format::Q4_1 => "q4_1",
            Format::Q8_0 => "q8_0",
        }
    }

    /// Bytes of quants per block.
    pub fn quant_bytes(self) -> usize {
        match self {
            Format::Q8_0 => 32,
            Format::Q4_0 | Format::Q4_1 => 16,
        }
    }
}

/// An activation vector quantized for the integer products.
#[derive(Debug, Default, Clone)]
pub struct Q8Activation {
    /// Per block: the scale (an f16 value).
    pub d: Vec<f32>,
    /// Per block: Σq (Q4_0's offset of −8 multiplies it).
    pub qsum: Vec<i32>,
    /// Per block: d·Σq rounded to f16 (Q4_1's minimum multiplies it).
    pub dsum: Vec<f64>,
    /// 32 signed values per block.
    pub q: Vec<i8>,
}

impl Q8Activation {
    /// Quantizes `x` (a whole number of blocks), reusing this vector's storage.
    pub fn quantize(&mut self, x: &[f32]) {
        assert!(x.len() % QK == 0, "activations come in whole blocks");
        let nb = x.len() / QK;
        self.d.clear();
        self.qsum.clear();
        self.dsum.clear();
        self.q.resize(x.len(), 0);
        for (xb, qb) in x.chunks_exact(QK).zip(self.q.chunks_exact_mut(QK)) {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            let mut sum = 0i32;
            for (q, v) in qb.iter_mut().zip(xb) {
                // |v·id| <= 127 by construction; ties to even as ggml's AVX quantizer rounds.
                *q = round_small(v * id) as i8;
                sum += *q as i32;
            }
            self.d.push(to_f16(d));
            self.qsum.push(sum);
            self.dsum.push(to_f16(d * sum as f32) as f64);
        }
        debug_assert_eq!(self.d.len(), nb);
    }

    pub fn blocks(&self) -> usize {
        self.d.len()
    }
}

/// Round to nearest, ties to even, for |x| < 2^22: adding 1.5·2^23 leaves no fraction bits,
/// so the FPU's own rounding does it. `round_ties_even` calls libm's rintf on baseline x86-64
/// (no SSE4.1), which took 4% of a decode.
#[inline(always)]
fn round_small(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

/// The f16 value nearest to `x` (ties to even), as f32; beyond f16's range, its largest value.
pub fn to_f16(x: f32) -> f32 {
    let a = x.abs();
    if a.is_nan() {
        return x;
    }
    if a >= 65504.0 {
        return 65504f32.copysign(x);
    }
    if a < 6.103_515_6e-5 {
        // f16 subnormals: multiples of 2^-24.
        let q = (a * 16_777_216.0).round_ties_even() / 16_777_216.0;
        return q.copysign(x);
    }
    // Keep 10 of f32's 23 fraction bits, rounding to nearest even.
    let bits = x.to_bits();
    let round = 0x0fff + ((bits >> 13) & 1);
    f32::from_bits((bits + round) & !0x1fff)
}

/// One weight row (its blocks' quants, scales and, for Q4_1, minimums) times `a`, whose
/// blocks line up with the row's.
/// The kernel `row` runs on this CPU, as the result file records it.
pub fn kernel() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if avx2::available() {
            return "avx2 (x86-64 AVX2: maddubs/madd byte products)";
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        return "neon (aarch64 baseline: smull byte products)";
    }
    #[allow(unreachable_code)]
    "portable (plain Rust, vectorized by the compiler)"
}

/// The SIMD kernels read by pointer: these hold every read of a row and its activations in
/// bounds (cheap next to a row).
fn check_lengths(format: Format, q: &[u8], d: &[f32], m: &[f32], acts: &[&Q8Activation]) {
    let nb = d.len();
    for a in acts {
        assert!(
            a.blocks() == nb && a.q.len() == nb * QK && a.qsum.len() == nb && a.dsum.len() == nb,
            "activation of {} blocks for a row of {nb}",
            a.blocks()
        );
    }
    assert_eq!(q.len(), nb * format.quant_bytes(), "quants for {nb} blocks");
    assert!(
        format != Format::Q4_1 || m.len() == nb,
        "{} Q4_1 minimums for {nb} blocks",
        m.len()
    );
}

pub fn row(format: Format, q: &[u8], d: &[f32], m: &[f32], a: &Q8Activation) -> f64 {
    check_lengths(format, q, d, m, &[a]);
    #[cfg(target_arch = "x86_64")]
    {
        if avx2::available() {
            // SAFETY: the CPU has AVX2 (checked), and the slices' lengths match the
            // block count (asserted above).
            return unsafe { avx2::row(format, q, d, m, a) };
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: NEON is part of every aarch64 target; the lengths are asserted above.
        return unsafe { neon::row(format, q, d, m, a) };
    }
    #[allow(unreachable_code)]
    portable::row(format, q, d, m, a)
}

/// One weight row times four activations (four tokens of a prompt): each result is bit for bit
/// what [`row`] gives for that activation; the AVX2 kernel unpacks each weight block once for
/// the four, so a batch of tokens costs less than its tokens one at a time.
pub fn row4(format: Format, q: &[u8], d: &[f32], m: &[f32], a: [&Q8Activation; 4]) -> [f64; 4] {
    check_lengths(format, q, d, m, &a);
    #[cfg(target_arch = "x86_64")]
    {
        if avx2::available() {
            // SAFETY: AVX2 checked; every length matches the block count (asserted above).
            return unsafe { avx2::row4(format, q, d, m, a) };
        }
    }
    a.map(|x| row(format, q, d, m, x))
}

/// The same products in plain Rust: the reference the SIMD kernels are tested against, and
/// the kernel where no SIMD one exists.
pub mod portable {
    use super::{Format, Q8Activation, QK};

    /// Σ w·a over a block of 16 nibble bytes (values j and j + 16 in byte j's low and high
    /// nibble). Fixed-size arrays and one i32 sum let the compiler vectorize it (NEON, SSE2).
    #[inline(always)]
    fn nibble_sum(q: &[u8; 16], a: &[i8; 32]) -> i32 {
        // Unpacked first: one straight loop of 32 byte products vectorizes, the mixed one
        // did not (measured 2.1 vs 4+ Gweights/s on SSE2).
        let mut w = [0i8; 32];
        for j in 0..16 {
            w[j] = (q[j] & 0x0f) as i8;
            w[j + 16] = (q[j] >> 4) as i8;
        }
        let mut s = 0i32;
        for j in 0..32 {
            s += w[j] as i32 * a[j] as i32;
        }
        s
    }

    #[inline(always)]
    fn byte_sum(q: &[u8; 32], a: &[i8; 32]) -> i32 {
        let mut s = 0i32;
        for j in 0..32 {
            s += q[j] as i8 as i32 * a[j] as i32;
        }
        s
    }

    pub fn row(format: Format, q: &[u8], d: &[f32], m: &[f32], a: &Q8Activation) -> f64 {
        let qb = format.quant_bytes();
        let mut acc = 0f64;
        for (b, ((qs, dw), xa)) in q
            .chunks_exact(qb)
            .zip(d)
            .zip(a.q.chunks_exact(QK))
            .enumerate()
        {
            let xa: &[i8; 32] = xa.try_into().expect("32-value blocks");
            let scale = *dw as f64 * a.d[b] as f64;
            acc += match format {
                Format::Q8_0 => scale * byte_sum(qs.try_into().expect("32-byte blocks"), xa) as f64,
                Format::Q4_0 => {
                    let s = nibble_sum(qs.try_into().expect("16-byte blocks"), xa);
                    scale * (s - 8 * a.qsum[b]) as f64
                }
                Format::Q4_1 => {
                    let s = nibble_sum(qs.try_into().expect("16-byte blocks"), xa);
                    scale * s as f64 + m[b] as f64 * a.dsum[b]
                }
            };
        }
        acc
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Format, Q8Activation, QK};
    use std::arch::x86_64::*;

    pub fn available() -> bool {
        std::is_x86_feature_detected!("avx2")
    }

    /// Four blocks' eight-lane i32 sums folded to one i32 per block: [s0, s1, s2, s3].
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn fold4(s0: __m256i, s1: __m256i, s2: __m256i, s3: __m256i) -> __m128i {
        let a = _mm256_hadd_epi32(s0, s1);
        let b = _mm256_hadd_epi32(s2, s3);
        let c = _mm256_hadd_epi32(a, b);
        _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1))
    }

    /// One block of 16 nibble bytes times 32 activations: eight i32 partial sums.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn nibbles_dot(q: *const u8, a: *const i8) -> __m256i {
        let low = _mm_set1_epi8(0x0f);
        let bytes = _mm_loadu_si128(q as *const __m128i);
        let lo = _mm_and_si128(bytes, low);
        let hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low);
        let w = _mm256_set_m128i(hi, lo);
        let x = _mm256_loadu_si256(a as *const __m256i);
        // Unsigned nibbles times signed bytes, pairs added: at most 2·15·127, no saturation.
        let pairs = _mm256_maddubs_epi16(w, x);
        _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
    }

    /// One block of 32 signed weights times 32 activations: eight i32 partial sums.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn bytes_dot(q: *const u8, a: *const i8) -> __m256i {
        let w = _mm256_loadu_si256(q as *const __m256i);
        let x = _mm256_loadu_si256(a as *const __m256i);
        // maddubs wants one unsigned operand: |w| times x carrying w's sign. |−128| reads as
        // 128 unsigned; 2·128·127 still fits i16 (activations stay within ±127).
        let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
        _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn hsum(v: __m256d) -> f64 {
        let s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
        _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)))
    }

    /// One row in `format`: the block sums four at a time into f64 lanes, then the tail.
    /// Multiply, then add (no fused multiply-add): each block's term is rounded as the
    /// portable and NEON kernels round it. `format` is the same for a whole row, so its
    /// branches inside the loop always go the same way.
    #[target_feature(enable = "avx2")]
    pub unsafe fn row(format: Format, q: &[u8], d: &[f32], m: &[f32], a: &Q8Activation) -> f64 {
        let nb = d.len();
        let qb = format.quant_bytes();
        let (qp, ap) = (q.as_ptr(), a.q.as_ptr());
        let dot = |b: usize| {
            if format == Format::Q8_0 {
                bytes_dot(qp.add(qb * b), ap.add(QK * b))
            } else {
                nibbles_dot(qp.add(qb * b), ap.add(QK * b))
            }
        };
        let mut acc = _mm256_setzero_pd();
        let mut b = 0;
        while b + 4 <= nb {
            let s = fold4(dot(b), dot(b + 1), dot(b + 2), dot(b + 3));
            let dw = _mm256_cvtps_pd(_mm_loadu_ps(d.as_ptr().add(b)));
            let dx = _mm256_cvtps_pd(_mm_loadu_ps(a.d.as_ptr().add(b)));
            let scale = _mm256_mul_pd(dw, dx);
            let term = match format {
                Format::Q8_0 => _mm256_mul_pd(scale, _mm256_cvtepi32_pd(s)),
                Format::Q4_0 => {
                    let qsum = _mm_loadu_si128(a.qsum.as_ptr().add(b) as *const __m128i);
                    let s = _mm_sub_epi32(s, _mm_slli_epi32(qsum, 3));
                    _mm256_mul_pd(scale, _mm256_cvtepi32_pd(s))
                }
                Format::Q4_1 => {
                    let mins = _mm256_cvtps_pd(_mm_loadu_ps(m.as_ptr().add(b)));
                    _mm256_add_pd(
                        _mm256_mul_pd(scale, _mm256_cvtepi32_pd(s)),
                        _mm256_mul_pd(mins, _mm256_loadu_pd(a.dsum.as_ptr().add(b))),
                    )
                }
            };
            acc = _mm256_add_pd(acc, term);
            b += 4;
        }
        let mut total = hsum(acc);
        while b < nb {
            let v = dot(b);
            let s = _mm_cvtsi128_si32(fold4(v, v, v, v));
            let scale = d[b] as f64 * a.d[b] as f64;
            total += match format {
                Format::Q8_0 => scale * s as f64,
                Format::Q4_0 => scale * (s - 8 * a.qsum[b]) as f64,
                Format::Q4_1 => scale * s as f64 + m[b] as f64 * a.dsum[b],
            };
            b += 1;
        }
        total
    }

    /// [`row`] for four activations at once: each weight block is loaded and its nibbles
    /// unpacked once, then multiplied with each activation's block. Per activation the block
    /// terms are formed and summed exactly as in [`row`] (same groups of four, same f64
    /// lanes, same order), so each result equals that activation's [`row`] bit for bit.
    #[target_feature(enable = "avx2")]
    pub unsafe fn row4(
        format: Format,
        q: &[u8],
        d: &[f32],
        m: &[f32],
        a: [&Q8Activation; 4],
    ) -> [f64; 4] {
        let nb = d.len();
        let qb = format.quant_bytes();
        let qp = q.as_ptr();
        let low = _mm_set1_epi8(0x0f);
        let ones = _mm256_set1_epi16(1);
        // The block's weights as maddubs' unsigned operand, and for Q8_0 the sign to give the
        // activation (see bytes_dot).
        let weights = |b: usize| -> (__m256i, __m256i) {
            if format == Format::Q8_0 {
                let w = _mm256_loadu_si256(qp.add(qb * b) as *const __m256i);
                (_mm256_sign_epi8(w, w), w)
            } else {
                let bytes = _mm_loadu_si128(qp.add(qb * b) as *const __m128i);
                let lo = _mm_and_si128(bytes, low);
                let hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low);
                (_mm256_set_m128i(hi, lo), _mm256_setzero_si256())
            }
        };
        let dot = |w: (__m256i, __m256i), x: &Q8Activation, b: usize| {
            let v = _mm256_loadu_si256(x.q.as_ptr().add(QK * b) as *const __m256i);
            let v = if format == Format::Q8_0 {
                _mm256_sign_epi8(v, w.1)
            } else {
                v
            };
            _mm256_madd_epi16(_mm256_maddubs_epi16(w.0, v), ones)
        };
        let mut acc = [_mm256_setzero_pd(); 4];
        let mut b = 0;
        while b + 4 <= nb {
            let w = [weights(b), weights(b + 1), weights(b + 2), weights(b + 3)];
            let dw = _mm256_cvtps_pd(_mm_loadu_ps(d.as_ptr().add(b)));
            let mins =
                (format == Format::Q4_1).then(|| _mm256_cvtps_pd(_mm_loadu_ps(m.as_ptr().add(b))));
            for (k, x) in a.iter().enumerate() {
                let s = fold4(
                    dot(w[0], x, b),
                    dot(w[1], x, b + 1),
                    dot(w[2], x, b + 2),
                    dot(w[3], x, b + 3),
                );
                let dx = _mm256_cvtps_pd(_mm_loadu_ps(x.d.as_ptr().add(b)));
                let scale = _mm256_mul_pd(dw, dx);
                let term = match format {
                    Format::Q8_0 => _mm256_mul_pd(scale, _mm256_cvtepi32_pd(s)),
                    Format::Q4_0 => {
                        let qsum = _mm_loadu_si128(x.qsum.as_ptr().add(b) as *const __m128i);
                        let s = _mm_sub_epi32(s, _mm_slli_epi32(qsum, 3));
                        _mm256_mul_pd(scale, _mm256_cvtepi32_pd(s))
                    }
                    Format::Q4_1 => _mm256_add_pd(
                        _mm256_mul_pd(scale, _mm256_cvtepi32_pd(s)),
                        _mm256_mul_pd(
                            mins.unwrap_or(_mm256_setzero_pd()),
                            _mm256_loadu_pd(x.dsum.as_ptr().add(b)),
                        ),
                    ),
                };
                acc[k] = _mm256_add_pd(acc[k], term);
            }
            b += 4;
        }
        let mut total = [hsum(acc[0]), hsum(acc[1]), hsum(acc[2]), hsum(acc[3])];
        while b < nb {
            let w = weights(b);
            for (k, x) in a.iter().enumerate() {
                let v = dot(w, x, b);
                let s = _mm_cvtsi128_si32(fold4(v, v, v, v));
                let scale = d[b] as f64 * x.d[b] as f64;
                total[k] += match format {
                    Format::Q8_0 => scale * s as f64,
                    Format::Q4_0 => scale * (s - 8 * x.qsum[b]) as f64,
                    Format::Q4_1 => scale * s as f64 + m[b] as f64 * x.dsum[b],
                };
            }
            b += 1;
        }
        total
    }
}

/// Apple silicon (and any aarch64): baseline NEON, widening byte products (`smull`) summed
/// pairwise into i32 lanes, then the block terms in f64 in row order, as the portable kernel.
#[cfg(target_arch = "aarch64")]
mod neon {
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

    pub unsafe fn row(format: Format, q: &[u8], d: &[f32], m: &[f32], a: &Q8Activation) -> f64 {
        let qb = format.quant_bytes();
        let (qp, ap) = (q.as_ptr(), a.q.as_ptr());
        let low = vdupq_n_u8(0x0f);
        let mut acc = 0f64;
        for b in 0..d.len() {
            let qs = qp.add(b * qb);
            let xa = ap.add(b * QK);
            let s = match format {
                Format::Q8_0 => sum32(
                    vld1q_s8(qs as *const i8),
                    vld1q_s8(qs.add(16) as *const i8),
                    xa,
                ),
                Format::Q4_0 | Format::Q4_1 => {
                    let bytes = vld1q_u8(qs);
                    let lo = vreinterpretq_s8_u8(vandq_u8(bytes, low));
                    let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(bytes));
                    sum32(lo, hi, xa)
                }
            };
            let scale = d[b] as f64 * a.d[b] as f64;
            acc += match format {
                Format::Q8_0 => scale * s as f64,
                Format::Q4_0 => scale * (s - 8 * a.qsum[b]) as f64,
                Format::Q4_1 => scale * s as f64 + m[b] as f64 * a.dsum[b],
            };
        }
        acc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(n: usize, seed: u32) -> Vec<u8> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn f16_rounding_matches_the_format() {
        assert_eq!(to_f16(1.0), 1.0);
        // f16 steps are 1/1024 at 1: a quarter step rounds down, three quarters up, and
        // halves go to the even neighbour.
        assert_eq!(to_f16(1.0 + 1.0 / 4096.0), 1.0);
        assert_eq!(to_f16(1.0 + 3.0 / 4096.0), 1.0 + 1.0 / 1024.0);
        assert_eq!(to_f16(1.0 + 2.0 / 4096.0), 1.0);
        assert_eq!(to_f16(1.0 + 6.0 / 4096.0), 1.0 + 2.0 / 1024.0);
        assert_eq!(to_f16(-0.1), quant::f16_to_f32(0xae66));
        assert_eq!(to_f16(1e-7), quant::f16_to_f32(0x0002)); // a subnormal
        assert_eq!(to_f16(1e9), 65504.0);
        for h in [0x0001u16, 0x03ff, 0x0400, 0x3555, 0x7bff, 0xfbff, 0x8401] {
            let v = quant::f16_to_f32(h);
            assert_eq!(to_f16(v), v, "f16 values are kept: {h:#06x}");
        }
    }

    #[test]
    fn small_rounding_is_ties_to_even() {
        for x in [
            -127.0f32, -2.5, -1.5, -0.5, 0.0, 0.49, 0.5, 1.5, 2.5, 3.7, 126.5, 127.0,
        ] {
            assert_eq!(round_small(x), x.round_ties_even(), "{x}");
        }
    }

    #[test]
    fn activations_quantize_as_ggml_does() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 - 20.0) * 0.37).collect();
        let mut a = Q8Activation::default();
        a.quantize(&x);
        assert_eq!(a.blocks(), 2);
        // The largest magnitude maps to ±127 and the rest round to nearest.
        let amax = x[..32].iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(a.q[0], (x[0] * 127.0 / amax).round() as i8);
        assert_eq!(a.q[0], -127);
        assert_eq!(a.q[31], (x[31] * 127.0 / amax).round() as i8);
        assert_eq!(a.d[0], to_f16(amax / 127.0));
        assert_eq!(a.qsum[1], a.q[32..].iter().map(|q| *q as i32).sum::<i32>());
        // A zero block has a zero scale and zero quants, not NaN.
        a.quantize(&[0.0; 32]);
        assert_eq!((a.d[0], a.qsum[0], a.q[5]), (0.0, 0, 0));
    }

    /// Every kernel against the exact sum Σ_b d_w·d_x·Σ_j w_j·a_j (+ m·dsum), block by block
    /// from dequantized integers, for row lengths that exercise the 4-block loop and its tail.
    #[test]
    fn four_activations_at_once_equal_four_rows_bit_for_bit() {
        for format in [Format::Q4_0, Format::Q4_1, Format::Q8_0] {
            for nb in [1usize, 3, 4, 5, 18, 48] {
                let qb = format.quant_bytes();
                let mut q = noise(nb * qb, 7 * nb as u32 + qb as u32);
                if format == Format::Q8_0 {
                    q[0] = 0x80;
                }
                let d: Vec<f32> = (0..nb).map(|b| 0.02 + b as f32 * 1e-3).collect();
                let m: Vec<f32> = (0..nb).map(|b| -0.25 + b as f32 * 1e-2).collect();
                let acts: Vec<Q8Activation> = (0..4)
                    .map(|t| {
                        let x: Vec<f32> = (0..nb * QK)
                            .map(|i| (((i + 13 * t) * 31 % 29) as f32 - 14.0) / (2.0 + t as f32))
                            .collect();
                        let mut a = Q8Activation::default();
                        a.quantize(&x);
                        a
                    })
                    .collect();
                let four = row4(format, &q, &d, &m, [&acts[0], &acts[1], &acts[2], &acts[3]]);
                for (t, a) in acts.iter().enumerate() {
                    let one = row(format, &q, &d, &m, a);
                    assert_eq!(
                        four[t].to_bits(),
                        one.to_bits(),
                        "{format:?} {nb} blocks, activation {t}"
                    );
                }
            }
        }
    }

    #[test]
    fn kernels_equal_the_exact_block_sums() {
        for format in [Format::Q4_0, Format::Q4_1, Format::Q8_0] {
            for nb in [1usize, 3, 4, 5, 8, 18, 48] {
                let qb = format.quant_bytes();
                let mut q = noise(nb * qb, nb as u32 + qb as u32);
                if format == Format::Q8_0 {
                    q[0] = 0x80; // −128, the one value whose magnitude needs care
                }
                let d: Vec<f32> = (0..nb).map(|b| 0.01 + b as f32 * 1e-3).collect();
                let m: Vec<f32> = (0..nb).map(|b| -0.5 + b as f32 * 1e-2).collect();
                let x: Vec<f32> = (0..nb * QK)
                    .map(|i| ((i * 37 % 23) as f32 - 11.0) / 3.0)
                    .collect();
                let mut a = Q8Activation::default();
                a.quantize(&x);
                let mut exact = 0f64;
                for b in 0..nb {
                    let mut s = 0i64;
                    for j in 0..QK {
                        let w = match format {
                            Format::Q8_0 => q[b * 32 + j] as i8 as i64,
                            _ => {
                                let byte = q[b * 16 + j % 16];
                                let n = if j < 16 { byte & 15 } else { byte >> 4 } as i64;
                                if format == Format::Q4_0 {
                                    n - 8
                                } else {
                                    n
                                }
                            }
                        };
                        s += w * a.q[b * QK + j] as i64;
                    }
                    exact += d[b] as f64 * a.d[b] as f64 * s as f64;
                    if format == Format::Q4_1 {
                        exact += m[b] as f64 * a.dsum[b];
                    }
                }
                let got = row(format, &q, &d, &m, &a);
                let plain = portable::row(format, &q, &d, &m, &a);
                if nb < 4 {
                    // No 4-block lanes: the terms are added in row order by every kernel.
                    assert_eq!(got.to_bits(), plain.to_bits(), "{format:?} {nb} blocks");
                }
                for (what, v) in [("dispatched", got), ("portable", plain)] {
                    assert!(
                        (v - exact).abs() <= 1e-12 * exact.abs().max(1.0),
                        "{format:?} {nb} blocks, {what}: {v} vs {exact}"
                    );
                }
            }
        }
    }
}
