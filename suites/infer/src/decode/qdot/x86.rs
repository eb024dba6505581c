use super::{Q8Activation, QK};
use std::arch::x86_64::*;

/// Format codes for the kernels' const parameter (an enum cannot be one).
pub const Q8_0: u8 = 0;
pub const Q4_0: u8 = 1;
pub const Q4_1: u8 = 2;

/// Four blocks' eight-lane i32 sums folded to one i32 per block: [s0, s1, s2, s3]. Blends
/// (any vector port) pair the lanes up and one in-lane shuffle per level lines them up,
/// four shuffle-port instructions in all where three `hadd`s take seven: Intel cores run
/// shuffles on one port, and this fold runs once per four blocks of every row.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn fold4(s0: __m256i, s1: __m256i, s2: __m256i, s3: __m256i) -> __m128i {
    // Even lanes: s_a's adjacent pairs summed; odd lanes: s_b's.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn pairs(a: __m256i, b: __m256i) -> __m256i {
        let x = _mm256_blend_epi32::<0xAA>(a, b);
        let y = _mm256_shuffle_epi32::<0xB1>(_mm256_blend_epi32::<0xAA>(b, a));
        _mm256_add_epi32(x, y)
    }
    let t01 = pairs(s0, s1);
    let t23 = pairs(s2, s3);
    // Each 128-bit half: [s0, s1, s2, s3] over that half's lanes.
    let x = _mm256_blend_epi32::<0xCC>(t01, t23);
    let y = _mm256_shuffle_epi32::<0x4E>(_mm256_blend_epi32::<0xCC>(t23, t01));
    let h = _mm256_add_epi32(x, y);
    _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1))
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn hsum(v: __m256d) -> f64 {
    let s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)))
}

/// One block's weights as the byte product's unsigned operand, and for Q8_0 the signs to
/// give the activations: the product wants one unsigned side, so Q8_0 multiplies |w| by x
/// carrying w's sign (|−128| reads as 128 unsigned; 2·128·127 fits an i16, and
/// activations stay within ±127). Nibbles are unsigned already.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn weights<const F: u8>(q: *const u8) -> (__m256i, __m256i) {
    if F == Q8_0 {
        let w = _mm256_loadu_si256(q as *const __m256i);
        (_mm256_sign_epi8(w, w), w)
    } else {
        // The 16 bytes in both halves (a load, no shuffle), the upper half's 32-bit lanes
        // shifted down a nibble, then masked: low nibbles in the lower half, high in the
        // upper (the bits a lane's shift carries in from the next byte are masked off).
        let bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128(q as *const __m128i));
        let both = _mm256_srlv_epi32(bytes, _mm256_set_epi32(4, 4, 4, 4, 0, 0, 0, 0));
        (
            _mm256_and_si256(both, _mm256_set1_epi8(0x0f)),
            _mm256_setzero_si256(),
        )
    }
}

/// Generates `rows::<F, N>`: one weight row in format F times N activations. Per
/// activation the block terms are formed in f64 four blocks at a time and summed in the
/// same lanes and order whatever N, so N = 4 gives each activation's N = 1 result bit
/// for bit while loading and unpacking each weight block once for the four.
macro_rules! kernel {
    ($features:literal, $dot:ident, $dot_add:ident) => {
        /// 32 unsigned weight bytes times 32 signed activations: eight i32 sums.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn block_dot(w: __m256i, x: __m256i) -> __m256i {
            $dot(w, x)
        }

        /// One block of a group of eight interleaved rows ([`super::group`]) times the
        /// activation's block at `x`: the eight rows' exact i32 sums, lane r for row r.
        /// Each 32-byte load holds four consecutive weight bytes of every row, so one
        /// broadcast of four activation bytes serves the eight rows' products.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn group_block<const F: u8>(w: *const u8, x: *const i8) -> __m256i {
            let bcast =
                |at: usize| _mm256_set1_epi32(std::ptr::read_unaligned(x.add(at) as *const i32));
            let mut acc = _mm256_setzero_si256();
            if F == Q8_0 {
                for k in 0..8 {
                    let v = _mm256_loadu_si256(w.add(32 * k) as *const __m256i);
                    // |w| times x carrying w's sign, as in `weights`.
                    let xs = _mm256_sign_epi8(bcast(4 * k), v);
                    acc = $dot_add(acc, _mm256_sign_epi8(v, v), xs);
                }
            } else {
                // Low nibbles are values 4k..4k+4 of each row, high ones 16 + 4k...
                let low = _mm256_set1_epi8(0x0f);
                for k in 0..4 {
                    let v = _mm256_loadu_si256(w.add(32 * k) as *const __m256i);
                    let lo = _mm256_and_si256(v, low);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
                    acc = $dot_add(acc, lo, bcast(4 * k));
                    acc = $dot_add(acc, hi, bcast(16 + 4 * k));
                }
            }
            acc
        }

        /// Groups of eight interleaved rows ([`super::group`]) times one activation,
        /// into `out` (eight values per group, as f32): each value bit for bit what
        /// `rows::<F, 1>` gives for its row. The block terms are the same products in
        /// f64, summed per row in the same lanes (block b into lane b mod 4, the four
        /// lanes added as `hsum` adds them, then the last nb mod 4 blocks in order), only
        /// eight rows side by side instead of four blocks: no per-block fold of lanes.
        ///
        /// # Safety
        /// The CPU has the module's features; `q`, `d` and `m` (Q4_1) hold
        /// `out.len() / 8` groups of `a.blocks()` blocks.
        #[target_feature(enable = $features)]
        pub unsafe fn matvec_groups<const F: u8>(
            q: &[u8],
            d: &[f32],
            m: &[f32],
            a: &Q8Activation,
            out: &mut [f32],
        ) {
            let nb = a.d.len();
            let qb = if F == Q8_0 { 32 } else { 16 };
            let (qp, dp, mp) = (q.as_ptr(), d.as_ptr(), m.as_ptr());
            let (xq, xd, xs, xm) = (a.q.as_ptr(), a.d.as_ptr(), a.qsum.as_ptr(), a.dsum.as_ptr());
            let widen = |p: *const f32| {
                (
                    _mm256_cvtps_pd(_mm_loadu_ps(p)),
                    _mm256_cvtps_pd(_mm_loadu_ps(p.add(4))),
                )
            };
            for (g, o) in out.chunks_exact_mut(8).enumerate() {
                // Block b's terms for rows 0-3 and 4-7, as `rows` forms them.
                let term = |b: usize| {
                    let gb = (g * nb + b) * 8;
                    let mut s = group_block::<F>(qp.add(gb * qb), xq.add(QK * b));
                    if F == Q4_0 {
                        s = _mm256_sub_epi32(s, _mm256_set1_epi32(8 * *xs.add(b)));
                    }
                    let x = _mm256_set1_pd(*xd.add(b));
                    let (dl, dh) = widen(dp.add(gb));
                    let sl = _mm256_cvtepi32_pd(_mm256_castsi256_si128(s));
                    let sh = _mm256_cvtepi32_pd(_mm256_extracti128_si256::<1>(s));
                    let tl = _mm256_mul_pd(_mm256_mul_pd(dl, x), sl);
                    let th = _mm256_mul_pd(_mm256_mul_pd(dh, x), sh);
                    if F == Q4_1 {
                        let xmin = _mm256_set1_pd(*xm.add(b));
                        let (ml, mh) = widen(mp.add(gb));
                        (
                            _mm256_add_pd(tl, _mm256_mul_pd(ml, xmin)),
                            _mm256_add_pd(th, _mm256_mul_pd(mh, xmin)),
                        )
                    } else {
                        (tl, th)
                    }
                };
                let mut acc = [[_mm256_setzero_pd(); 2]; 4];
                let mut b = 0;
                while b + 4 <= nb {
                    for (i, lane) in acc.iter_mut().enumerate() {
                        let (tl, th) = term(b + i);
                        lane[0] = _mm256_add_pd(lane[0], tl);
                        lane[1] = _mm256_add_pd(lane[1], th);
                    }
                    b += 4;
                }
                let [mut lo, mut hi] = [0, 1].map(|h| {
                    _mm256_add_pd(
                        _mm256_add_pd(acc[0][h], acc[2][h]),
                        _mm256_add_pd(acc[1][h], acc[3][h]),
                    )
                });
                while b < nb {
                    let (tl, th) = term(b);
                    lo = _mm256_add_pd(lo, tl);
                    hi = _mm256_add_pd(hi, th);
                    b += 1;
                }
                _mm_storeu_ps(o.as_mut_ptr(), _mm256_cvtpd_ps(lo));
                _mm_storeu_ps(o.as_mut_ptr().add(4), _mm256_cvtpd_ps(hi));
            }
        }

        /// # Safety
        /// The CPU has the module's features; `q`, `d`, `m` (Q4_1) and every activation
        /// hold `d.len()` blocks.
        #[target_feature(enable = $features)]
        pub unsafe fn rows<const F: u8, const N: usize>(
            q: &[u8],
            d: &[f32],
            m: &[f32],
            a: [&Q8Activation; N],
        ) -> [f64; N] {
            let nb = d.len();
            let qb = if F == Q8_0 { 32 } else { 16 };
            let qp = q.as_ptr();
            let xq = a.map(|x| x.q.as_ptr());
            let xd = a.map(|x| x.d.as_ptr());
            let xs = a.map(|x| x.qsum.as_ptr());
            let xm = a.map(|x| x.dsum.as_ptr());
            let dot = |w: (__m256i, __m256i), x: *const i8| {
                let v = _mm256_loadu_si256(x as *const __m256i);
                let v = if F == Q8_0 {
                    _mm256_sign_epi8(v, w.1)
                } else {
                    v
                };
                block_dot(w.0, v)
            };
            let mut acc = [_mm256_setzero_pd(); N];
            let mut b = 0;
            while b + 4 <= nb {
                let w = [
                    weights::<F>(qp.add(qb * b)),
                    weights::<F>(qp.add(qb * (b + 1))),
                    weights::<F>(qp.add(qb * (b + 2))),
                    weights::<F>(qp.add(qb * (b + 3))),
                ];
                let dw = _mm256_cvtps_pd(_mm_loadu_ps(d.as_ptr().add(b)));
                let mins = if F == Q4_1 {
                    _mm256_cvtps_pd(_mm_loadu_ps(m.as_ptr().add(b)))
                } else {
                    _mm256_setzero_pd()
                };
                for k in 0..N {
                    let x = xq[k].add(QK * b);
                    let s = fold4(
                        dot(w[0], x),
                        dot(w[1], x.add(QK)),
                        dot(w[2], x.add(2 * QK)),
                        dot(w[3], x.add(3 * QK)),
                    );
                    let scale = _mm256_mul_pd(dw, _mm256_loadu_pd(xd[k].add(b)));
                    // Multiply, then add (no fused multiply-add): each block's term is
                    // rounded as the portable and NEON kernels round it.
                    let t = if F == Q8_0 {
                        _mm256_mul_pd(scale, _mm256_cvtepi32_pd(s))
                    } else if F == Q4_0 {
                        let qsum = _mm_loadu_si128(xs[k].add(b) as *const __m128i);
                        let s = _mm_sub_epi32(s, _mm_slli_epi32(qsum, 3));
                        _mm256_mul_pd(scale, _mm256_cvtepi32_pd(s))
                    } else {
                        _mm256_add_pd(
                            _mm256_mul_pd(scale, _mm256_cvtepi32_pd(s)),
                            _mm256_mul_pd(mins, _mm256_loadu_pd(xm[k].add(b))),
                        )
                    };
                    acc[k] = _mm256_add_pd(acc[k], t);
                }
                b += 4;
            }
            let mut total = acc.map(|v| hsum(v));
            while b < nb {
                let w = weights::<F>(qp.add(qb * b));
                for k in 0..N {
                    let v = dot(w, xq[k].add(QK * b));
                    let s = _mm_cvtsi128_si32(fold4(v, v, v, v));
                    let scale = d[b] as f64 * *xd[k].add(b);
                    total[k] += if F == Q8_0 {
                        scale * s as f64
                    } else if F == Q4_0 {
                        scale * (s - 8 * *xs[k].add(b)) as f64
                    } else {
                        scale * s as f64 + m[b] as f64 * *xm[k].add(b)
                    };
                }
                b += 1;
            }
            total
        }

        /// `rows` for each of `out.len()` weight rows laid out one after another, one
        /// activation, into `out` (as f32).
        ///
        /// # Safety
        /// As `rows`, for every row.
        #[target_feature(enable = $features)]
        pub unsafe fn matvec<const F: u8>(
            q: &[u8],
            d: &[f32],
            m: &[f32],
            a: &Q8Activation,
            out: &mut [f32],
        ) {
            let nb = a.d.len();
            let qb = nb * if F == Q8_0 { 32 } else { 16 };
            for (r, o) in out.iter_mut().enumerate() {
                let mr = if F == Q4_1 {
                    m.get_unchecked(r * nb..)
                } else {
                    m
                };
                *o = rows::<F, 1>(
                    q.get_unchecked(r * qb..),
                    d.get_unchecked(r * nb..(r + 1) * nb),
                    mr,
                    [a],
                )[0] as f32;
            }
        }

        /// `rows` for each of `acts` into `out` (as f32), four at a time, the rest one
        /// by one.
        ///
        /// # Safety
        /// As `rows`.
        #[target_feature(enable = $features)]
        pub unsafe fn tile<const F: u8>(
            q: &[u8],
            d: &[f32],
            m: &[f32],
            acts: &[Q8Activation],
            out: &mut [f32],
        ) {
            let mut fours = acts.chunks_exact(4);
            let mut outs = out.chunks_exact_mut(4);
            for (a, o) in (&mut fours).zip(&mut outs) {
                let v = rows::<F, 4>(q, d, m, [&a[0], &a[1], &a[2], &a[3]]);
                for (o, v) in o.iter_mut().zip(v) {
                    *o = v as f32;
                }
            }
            for (a, o) in fours.remainder().iter().zip(outs.into_remainder()) {
                *o = rows::<F, 1>(q, d, m, [a])[0] as f32;
            }
        }
    };
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn maddubs(w: __m256i, x: __m256i) -> __m256i {
    // Unsigned times signed bytes, pairs added (at most 2·128·127: no saturation), then
    // pairs of those.
    _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1))
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn maddubs_add(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    _mm256_add_epi32(acc, maddubs(w, x))
}

#[inline]
#[target_feature(enable = "avx2,avx512vnni,avx512vl")]
unsafe fn dpbusd512(w: __m256i, x: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x)
}

#[inline]
#[target_feature(enable = "avx2,avx512vnni,avx512vl")]
unsafe fn dpbusd512_add(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(acc, w, x)
}

#[inline]
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn dpbusd_avx(w: __m256i, x: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w, x)
}

#[inline]
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn dpbusd_avx_add(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(acc, w, x)
}

pub mod avx2 {
    use super::*;
    kernel!("avx2", maddubs, maddubs_add);
    pub fn available() -> bool {
        std::is_x86_feature_detected!("avx2")
    }
}

pub mod avx512vnni {
    use super::*;
    kernel!("avx2,avx512vnni,avx512vl", dpbusd512, dpbusd512_add);
    pub fn available() -> bool {
        std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("avx512vnni")
            && std::is_x86_feature_detected!("avx512vl")
    }
}

pub mod avxvnni {
    use super::*;
    kernel!("avx2,avxvnni", dpbusd_avx, dpbusd_avx_add);
    pub fn available() -> bool {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("avxvnni")
    }
}
