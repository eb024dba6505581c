//! The trailing update in a 16-bit format on any CPU: the operands rounded to BF16 or FP16
//! (IEEE binary16), to nearest with ties to even, then multiplied by the single-precision
//! kernels (the BLAS's sgemm). A product of two 16-bit values is exact in FP32 (8 or 11
//! significant bits each, 24 in FP32) and sgemm sums in FP32, so this is the 16-bit format's
//! arithmetic with FP32 accumulation, at sgemm's speed: what `--precision fp16` runs, and
//! `--precision bf16` where the CPU has no AVX-512 BF16 (`super::bf16` is the fast path where
//! it has).

use super::kernels32 as k32;

/// A 16-bit format of the update's operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Bf16,
    Fp16,
}

/// FP32 to BF16 bits, to nearest, ties to even (finite values: the factorization has no
/// others).
#[inline]
pub fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// FP32 to IEEE binary16 bits, to nearest, ties to even: subnormals kept, beyond the largest
/// finite (65504) infinity, NaN kept a NaN.
pub fn fp16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    // The exponent in binary16's bias.
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        // Below the smallest normal: the significand (with its leading 1) shifted to units of
        // 2^-24, rounded; a carry into 0x400 is the smallest normal, as it should be.
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let rounded = (m + (1 << (shift - 1)) - 1 + ((m >> shift) & 1)) >> shift;
        return sign | rounded as u16;
    }
    // 23 significand bits to 10, rounded; a carry moves into the exponent (to infinity past
    // the largest finite).
    let rounded = man + 0xfff + ((man >> 13) & 1);
    sign | (((e as u32) << 10) + (rounded >> 13)) as u16
}

/// IEEE binary16 bits to FP32 (exact).
pub fn fp16_value(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = ((h >> 10) & 0x1f) as i32;
    let man = (h & 0x3ff) as f32;
    sign * match exp {
        0 => man * 2f32.powi(-24),
        0x1f if man == 0.0 => f32::INFINITY,
        0x1f => f32::NAN,
        _ => (1.0 + man / 1024.0) * 2f32.powi(exp - 15),
    }
}

impl Format {
    /// `x` rounded to the format, as FP32 (exact: both formats fit in it).
    pub fn round(self, x: f32) -> f32 {
        match self {
            Format::Bf16 => f32::from_bits((bf16_bits(x) as u32) << 16),
            Format::Fp16 => fp16_value(fp16_bits(x)),
        }
    }

    /// Every value of `v` rounded to the format, in place. FP16 goes through x86's F16C
    /// conversions where the CPU has them (the same rounding, eight values an instruction);
    /// on aarch64 both formats go through NEON (FCVTN/FCVTL for FP16, baseline ARMv8; BF16's
    /// integer rounding four lanes at a time), the same bits as [`Format::round`].
    pub fn round_all(self, v: &mut [f32]) {
        // SAFETY: NEON and its FP16 conversions are baseline on aarch64.
        #[cfg(target_arch = "aarch64")]
        unsafe {
            match self {
                Format::Fp16 => neon::fp16_round(v),
                Format::Bf16 => neon::bf16_round(v),
            }
        }
        #[cfg(not(target_arch = "aarch64"))]
        {
            #[cfg(target_arch = "x86_64")]
            if self == Format::Fp16 && std::arch::is_x86_feature_detected!("f16c") {
                // SAFETY: F16C detected.
                unsafe { fp16_round_f16c(v) };
                return;
            }
            for x in v {
                *x = self.round(*x);
            }
        }
    }

    /// What rounds the operands on this CPU, for the result's kernel line.
    pub fn rounder(self) -> &'static str {
        if cfg!(target_arch = "aarch64") {
            return match self {
                Format::Fp16 => "NEON fcvtn",
                Format::Bf16 => "NEON",
            };
        }
        #[cfg(target_arch = "x86_64")]
        if self == Format::Fp16 && std::arch::is_x86_feature_detected!("f16c") {
            return "F16C";
        }
        "scalar code"
    }
}

/// The rounding four lanes at a time on aarch64.
#[cfg(target_arch = "aarch64")]
mod neon {
    use std::arch::aarch64::*;
    use std::arch::asm;

    /// FP16: FCVTN to binary16 by the FPCR's rounding (to nearest even unless a program
    /// changed it) and FCVTL back, exact; the tail by the scalar path.
    pub unsafe fn fp16_round(v: &mut [f32]) {
        let mut chunks = v.chunks_exact_mut(4);
        for c in &mut chunks {
            let x = vld1q_f32(c.as_ptr());
            let y: float32x4_t;
            asm!(
                "fcvtn {h:v}.4h, {x:v}.4s",
                "fcvtl {y:v}.4s, {h:v}.4h",
                x = in(vreg) x,
                h = out(vreg) _,
                y = lateout(vreg) y,
                options(pure, nomem, nostack)
            );
            vst1q_f32(c.as_mut_ptr(), y);
        }
        for x in chunks.into_remainder() {
            *x = super::Format::Fp16.round(*x);
        }
    }

    /// BF16: the scalar rounding's integer steps (add 0x7fff and the kept part's lowest bit,
    /// clear the low half) on four lanes: the same bits for every input.
    pub unsafe fn bf16_round(v: &mut [f32]) {
        let mut chunks = v.chunks_exact_mut(4);
        let (bias, one, high) = (
            vdupq_n_u32(0x7fff),
            vdupq_n_u32(1),
            vdupq_n_u32(0xffff_0000),
        );
        for c in &mut chunks {
            let b = vld1q_u32(c.as_ptr() as *const u32);
            let odd = vandq_u32(vshrq_n_u32::<16>(b), one);
            let r = vandq_u32(vaddq_u32(b, vaddq_u32(bias, odd)), high);
            vst1q_u32(c.as_mut_ptr() as *mut u32, r);
        }
        for x in chunks.into_remainder() {
            *x = super::Format::Bf16.round(*x);
        }
    }
}

/// FP16 rounding eight at a time (vcvtps2ph to nearest even, vcvtph2ps back), the tail by the
/// scalar path.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn fp16_round_f16c(v: &mut [f32]) {
    use std::arch::x86_64::*;
    let mut chunks = v.chunks_exact_mut(8);
    for c in &mut chunks {
        let x = _mm256_loadu_ps(c.as_ptr());
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
        _mm256_storeu_ps(c.as_mut_ptr(), _mm256_cvtph_ps(h));
    }
    for x in chunks.into_remainder() {
        *x = Format::Fp16.round(*x);
    }
}

/// How the update's operands are rounded: A (L21) times `scale` then rounded, B (U12)
/// rounded, and the product taken times 1/`scale`. A power of two, so exact: it lifts L21,
/// whose entries are about 2/N for HPL-MxP's matrix (its diagonal about N/4), above FP16's
/// smallest normal (6.1e-5) for any N, where without it they would lose bits from N ≈ 32k on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rounding {
    pub format: Format,
    pub scale: f32,
}

impl Rounding {
    /// FP16 for a system of order n: A scaled by the power of two at or below N/4 (so its
    /// entries stay within about 0.5 and far below FP16's largest, 65504).
    pub fn fp16_for(n: usize) -> Rounding {
        let e = ((n.max(4) / 4) as f64).log2().floor().min(60.0) as i32;
        Rounding {
            format: Format::Fp16,
            scale: 2f32.powi(e),
        }
    }

    /// A's values as the update reads them: times the scale, rounded.
    pub fn round_a(self, v: &mut [f32]) {
        if self.scale != 1.0 {
            for x in v.iter_mut() {
                *x *= self.scale;
            }
        }
        self.format.round_all(v);
    }
}

/// The rounded copies of the operands, kept between steps so each reuses their memory.
#[derive(Default)]
pub struct Scratch {
    a: Vec<f32>,
    b: Vec<f32>,
}

/// C[m×n] −= round(A[m×k]·s)·round(B[k×n])/s, accumulated in FP32 (s: the rounding's
/// scale). `a_rounded`: A holds those values already ([`Rounding::round_a`] once for all
/// of a step's updates), so it is read where it lies.
///
/// # Safety
/// As `kernels32::gemm_minus`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_minus(
    scratch: &mut Scratch,
    rounding: Rounding,
    a_rounded: bool,
    m: usize,
    n: usize,
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
) {
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    let copy = |from: *const f32, ld: usize, rows: usize, cols: usize, to: &mut Vec<f32>| {
        to.clear();
        for j in 0..cols {
            // SAFETY: the caller's shape: column j's rows lie at from + j·ld.
            to.extend_from_slice(unsafe { std::slice::from_raw_parts(from.add(j * ld), rows) });
        }
    };
    copy(b, ldb, k, n, &mut scratch.b);
    rounding.format.round_all(&mut scratch.b);
    let alpha = 1.0 / rounding.scale;
    if a_rounded {
        k32::gemm_minus_scaled(alpha, m, n, k, a, lda, scratch.b.as_ptr(), k, c, ldc);
    } else {
        copy(a, lda, m, k, &mut scratch.a);
        rounding.round_a(&mut scratch.a);
        let a = scratch.a.as_ptr();
        k32::gemm_minus_scaled(alpha, m, n, k, a, m, scratch.b.as_ptr(), k, c, ldc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp16_rounding_is_ieee_to_nearest_even() {
        assert_eq!(fp16_bits(1.0), 0x3c00);
        assert_eq!(fp16_bits(-2.0), 0xc000);
        assert_eq!(fp16_bits(65504.0), 0x7bff);
        assert_eq!(
            fp16_bits(65520.0),
            0x7c00,
            "halfway past the largest: infinity"
        );
        assert_eq!(fp16_bits(1e-8), 0, "below half the smallest subnormal");
        assert_eq!(fp16_bits(2f32.powi(-24)), 0x0001, "the smallest subnormal");
        assert_eq!(fp16_bits(2f32.powi(-14)), 0x0400, "the smallest normal");
        // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties to the even one, 1.
        assert_eq!(fp16_bits(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(fp16_bits(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
        assert!(fp16_value(fp16_bits(f32::NAN)).is_nan());
        // Every binary16 value survives the round trip.
        for h in 0..=0xffffu16 {
            let v = fp16_value(h);
            if v.is_nan() {
                continue;
            }
            assert_eq!(fp16_bits(v), h, "{h:#x} {v}");
        }
    }

    /// L21 of a large system (entries about 2/N, N = 1M): scaled, its FP16 copy keeps the
    /// format's 11 bits; unscaled, it would sit among the subnormals with few bits left.
    #[test]
    fn the_scale_keeps_small_panels_normal() {
        let r = Rounding::fp16_for(1 << 20);
        assert_eq!(r.scale, 2f32.powi(18));
        let (m, n, k) = (8, 3, 4);
        let a: Vec<f32> = (0..m * k)
            .map(|i| 2e-6 * (1.0 + i as f32 * 0.037))
            .collect();
        let b: Vec<f32> = (0..k * n).map(|i| 0.5 - i as f32 * 0.031).collect();
        let mut c = vec![0f32; m * n];
        let mut s = Scratch::default();
        // SAFETY: the blocks are the shapes given.
        unsafe {
            gemm_minus(
                &mut s,
                r,
                false,
                m,
                n,
                k,
                a.as_ptr(),
                m,
                b.as_ptr(),
                k,
                c.as_mut_ptr(),
                m,
            )
        };
        for j in 0..n {
            for i in 0..m {
                let want: f64 = -(0..k)
                    .map(|p| a[p * m + i] as f64 * Format::Fp16.round(b[j * k + p]) as f64)
                    .sum::<f64>();
                let got = c[j * m + i] as f64;
                // FP16's own rounding of A: 2^-11 relative, no worse.
                assert!((got - want).abs() <= 1e-3 * want.abs(), "{got} vs {want}");
            }
        }
        // Unscaled, the same entries are subnormals: errors well past FP16's 2^-11.
        let worst = a
            .iter()
            .map(|&x| (Format::Fp16.round(x) as f64 / x as f64 - 1.0).abs())
            .fold(0.0, f64::max);
        assert!(worst > 2e-3, "subnormal: few bits ({worst})");
    }

    /// Rounding a slice (F16C where the CPU has it) is rounding each value.
    #[test]
    fn rounding_a_slice_is_rounding_each_value() {
        let v: Vec<f32> = (0..1003)
            .map(|i| (i as f32 - 500.0) * 0.0137 + 1e-6)
            .collect();
        for format in [Format::Bf16, Format::Fp16] {
            let mut w = v.clone();
            format.round_all(&mut w);
            for (x, y) in v.iter().zip(&w) {
                assert_eq!(format.round(*x).to_bits(), y.to_bits(), "{x}");
            }
        }
    }

    /// Against x86's own conversion (F16C), on values across the range, subnormals included.
    /// round_all (F16C, NEON or scalar, whichever this CPU takes) gives round's bits for
    /// every FP32 exponent, both signs, ties and their neighbours, subnormals and overflow,
    /// in slices whose lengths leave a scalar tail.
    #[test]
    fn the_vector_rounding_is_the_scalar_rounding() {
        let mut xs: Vec<f32> = Vec::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for e in 0..255u32 {
            for low in [
                0u32, 1, 0x0fff, 0x1000, 0x1001, 0x7fff, 0x8000, 0x8001, 0x1_8000, 0x7f_ffff,
            ] {
                for sign in [0u32, 1 << 31] {
                    xs.push(f32::from_bits(sign | e << 23 | low));
                }
            }
            for _ in 0..16 {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                xs.push(f32::from_bits(
                    (seed >> 32) as u32 & !(0xff << 23) | e << 23,
                ));
            }
        }
        for format in [Format::Fp16, Format::Bf16] {
            for len in [xs.len(), xs.len() - 3] {
                let mut v = xs[..len].to_vec();
                format.round_all(&mut v);
                for (x, y) in xs.iter().zip(&v) {
                    assert_eq!(
                        y.to_bits(),
                        format.round(*x).to_bits(),
                        "{format:?} {x:e} ({:#010x}) by {}",
                        x.to_bits(),
                        format.rounder()
                    );
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn fp16_rounding_matches_the_cpus() {
        if !std::arch::is_x86_feature_detected!("f16c") {
            return;
        }
        #[target_feature(enable = "f16c")]
        unsafe fn hw(x: f32) -> u16 {
            use std::arch::x86_64::*;
            _mm_extract_epi16::<0>(_mm_cvtps_ph::<0>(_mm_set1_ps(x))) as u16
        }
        let mut bits: u32 = 0x3300_0000;
        while bits < 0x4780_0000 {
            for x in [f32::from_bits(bits), -f32::from_bits(bits + 1)] {
                // SAFETY: f16c detected above.
                assert_eq!(fp16_bits(x), unsafe { hw(x) }, "{x:e}");
            }
            bits += 0x1_3579;
        }
    }

    #[test]
    fn the_product_is_the_rounded_operands_product() {
        let (m, n, k) = (37, 29, 45);
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7) % 13) as f32 * 0.1013 - 0.6)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 5) % 11) as f32 * 0.1307 - 0.5)
            .collect();
        for format in [Format::Bf16, Format::Fp16] {
            let mut c: Vec<f32> = (0..m * n).map(|i| i as f32 * 0.01).collect();
            let c0 = c.clone();
            let mut s = Scratch::default();
            // SAFETY: the blocks are the shapes given.
            unsafe {
                gemm_minus(
                    &mut s,
                    Rounding { format, scale: 1.0 },
                    false,
                    m,
                    n,
                    k,
                    a.as_ptr(),
                    m,
                    b.as_ptr(),
                    k,
                    c.as_mut_ptr(),
                    m,
                )
            };
            for j in 0..n {
                for i in 0..m {
                    let want = c0[j * m + i] as f64
                        - (0..k)
                            .map(|p| {
                                format.round(a[p * m + i]) as f64
                                    * format.round(b[j * k + p]) as f64
                            })
                            .sum::<f64>();
                    let got = c[j * m + i] as f64;
                    assert!(
                        (got - want).abs() < 1e-5 * (1.0 + want.abs()),
                        "{format:?} ({i},{j}): {got} vs {want}"
                    );
                }
            }
        }
    }
}
