//! One query head's attention over its KV head's cached positions: scaled dot products, a
//! softmax, the values' weighted sum, in f32.
//!
//! Two kernels with one arithmetic: x86-64 with AVX2 runs eight lanes in 256-bit registers
//! (written with intrinsics: the compiler's own vectorizer makes 2-lane code of these loops),
//! every other CPU the same eight lanes in plain Rust. Both multiply then add (no fused
//! multiply-add), sum the lanes in the same tree and use the same polynomial exp, so a
//! token's attention is bit for bit the same in a prompt's batch and in a step, on every rank
//! and host.

/// One KV head's keys and values in a layer's cache: position p's vector starts at
/// p · stride + offset, for `positions` positions.
pub struct KvView<'a> {
    pub keys: &'a [f32],
    pub values: &'a [f32],
    pub stride: usize,
    pub offset: usize,
    pub positions: usize,
}

impl KvView<'_> {
    fn check(&self, hd: usize) {
        if self.positions > 0 {
            let end = (self.positions - 1) * self.stride + self.offset + hd;
            assert!(
                end <= self.keys.len() && end <= self.values.len(),
                "cache of {} values for {} positions",
                self.keys.len().min(self.values.len()),
                self.positions
            );
        }
    }
}

/// Attention of query `qh` (one head, head size `qh.len()`) over `kv` into `out`, its
/// scores scaled by `scale`; `scores` is scratch.
pub fn attend_head(qh: &[f32], kv: &KvView, scale: f32, scores: &mut Vec<f32>, out: &mut [f32]) {
    let hd = qh.len();
    assert_eq!(out.len(), hd, "one output per query value");
    kv.check(hd);
    scores.resize(kv.positions, 0.0);
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 checked; every position's vectors lie in the cache (checked above).
        return unsafe { avx2::attend_head(qh, kv, scale, scores, out) };
    }
    portable::attend_head(qh, kv, scale, scores, out)
}

/// The most query heads [`attend_group`] takes at once (their accumulators fit the registers).
pub const GROUP_MAX: usize = 4;

/// Attention of `g = qs.len() / hd` query heads that share one KV head (grouped-query
/// attention), each into its `hd` values of `outs`: every cached key and value is read once
/// for all of them rather than once per head. Each head's arithmetic is exactly
/// [`attend_head`]'s (the same sums in the same order), so the result is bit for bit the
/// same; `scores` is scratch.
pub fn attend_group(
    qs: &[f32],
    hd: usize,
    kv: &KvView,
    scale: f32,
    scores: &mut Vec<f32>,
    outs: &mut [f32],
) {
    let g = qs.len() / hd;
    assert!((1..=GROUP_MAX).contains(&g) && qs.len() == g * hd && outs.len() == g * hd);
    kv.check(hd);
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        scores.resize(g * kv.positions, 0.0);
        // SAFETY: AVX2 checked; every position's vectors lie in the cache (checked above).
        return unsafe { avx2::attend_group(qs, hd, g, kv, scale, scores, outs) };
    }
    for (qh, out) in qs.chunks_exact(hd).zip(outs.chunks_exact_mut(hd)) {
        attend_head(qh, kv, scale, scores, out);
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

    /// The lanes' sum as the AVX2 kernel adds them: halves, then quarters, then the pair.
    fn sum8(l: [f32; 8]) -> f32 {
        let h: [f32; 4] = std::array::from_fn(|i| l[i] + l[i + 4]);
        (h[0] + h[2]) + (h[1] + h[3])
    }

    fn dot(a: &[f32], b: &[f32]) -> f32 {
        let mut lanes = [0f32; 8];
        let ((ca, ra), (cb, rb)) = (a.as_chunks::<8>(), b.as_chunks::<8>());
        for (x, y) in ca.iter().zip(cb) {
            for i in 0..8 {
                lanes[i] += x[i] * y[i];
            }
        }
        let mut sum = sum8(lanes);
        for (x, y) in ra.iter().zip(rb) {
            sum += x * y;
        }
        sum
    }

    pub fn attend_head(qh: &[f32], kv: &KvView, scale: f32, scores: &mut [f32], out: &mut [f32]) {
        let hd = qh.len();
        let at = |p: usize| p * kv.stride + kv.offset..p * kv.stride + kv.offset + hd;
        for (p, s) in scores.iter_mut().enumerate() {
            *s = dot(qh, &kv.keys[at(p)]) * scale;
        }
        let max = scores.iter().fold(f32::NEG_INFINITY, |m, s| m.max(*s));
        let mut lanes = [0f32; 8];
        let (blocks, rest) = scores.as_chunks_mut::<8>();
        for c in blocks {
            for i in 0..8 {
                c[i] = exp(c[i] - max);
                lanes[i] += c[i];
            }
        }
        let mut total = sum8(lanes);
        for s in rest {
            *s = exp(*s - max);
            total += *s;
        }
        let norm = 1.0 / total;
        for s in scores.iter_mut() {
            *s *= norm;
        }
        for (j, o) in out.iter_mut().enumerate() {
            let mut acc = 0f32;
            for (p, w) in scores.iter().enumerate() {
                acc += w * kv.values[p * kv.stride + kv.offset + j];
            }
            *o = acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn sum8(v: __m256) -> f32 {
        let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        // (h0 + h2, h1 + h3), then their sum.
        let q = _mm_add_ps(h, _mm_movehl_ps(h, h));
        _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)))
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn exp(x: __m256) -> __m256 {
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

    #[target_feature(enable = "avx2")]
    pub unsafe fn attend_head(
        qh: &[f32],
        kv: &KvView,
        scale: f32,
        scores: &mut [f32],
        out: &mut [f32],
    ) {
        let hd = qh.len();
        let full = hd / 8 * 8;
        let (keys, values) = (kv.keys.as_ptr(), kv.values.as_ptr());
        let row = |base: *const f32, p: usize| base.add(p * kv.stride + kv.offset);
        let qp = qh.as_ptr();
        for (p, s) in scores.iter_mut().enumerate() {
            let k = row(keys, p);
            let mut acc = _mm256_setzero_ps();
            let mut i = 0;
            while i < full {
                acc = _mm256_add_ps(
                    acc,
                    _mm256_mul_ps(_mm256_loadu_ps(qp.add(i)), _mm256_loadu_ps(k.add(i))),
                );
                i += 8;
            }
            let mut sum = sum8(acc);
            while i < hd {
                sum += *qp.add(i) * *k.add(i);
                i += 1;
            }
            *s = sum * scale;
        }
        let max = scores.iter().fold(f32::NEG_INFINITY, |m, s| m.max(*s));
        let n = scores.len();
        let sp = scores.as_mut_ptr();
        let vmax = _mm256_set1_ps(max);
        let mut lanes = _mm256_setzero_ps();
        let mut p = 0;
        while p + 8 <= n {
            let e = exp(_mm256_sub_ps(_mm256_loadu_ps(sp.add(p)), vmax));
            _mm256_storeu_ps(sp.add(p), e);
            lanes = _mm256_add_ps(lanes, e);
            p += 8;
        }
        let mut total = sum8(lanes);
        for s in &mut scores[p..] {
            *s = portable::exp(*s - max);
            total += *s;
        }
        let norm = 1.0 / total;
        for s in scores.iter_mut() {
            *s *= norm;
        }
        // Output values eight at a time, four such groups at once so that their sums over
        // the positions are independent chains.
        let op = out.as_mut_ptr();
        let mut j = 0;
        while j + 32 <= full {
            let mut acc = [_mm256_setzero_ps(); 4];
            for (p, w) in scores.iter().enumerate() {
                let (v, w) = (row(values, p).add(j), _mm256_set1_ps(*w));
                for (g, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_add_ps(*a, _mm256_mul_ps(w, _mm256_loadu_ps(v.add(8 * g))));
                }
            }
            for (g, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(op.add(j + 8 * g), *a);
            }
            j += 32;
        }
        while j < full {
            let mut acc = _mm256_setzero_ps();
            for (p, w) in scores.iter().enumerate() {
                let v = _mm256_loadu_ps(row(values, p).add(j));
                acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(*w), v));
            }
            _mm256_storeu_ps(op.add(j), acc);
            j += 8;
        }
        for (jj, o) in out.iter_mut().enumerate().skip(full) {
            let mut acc = 0f32;
            for (p, w) in scores.iter().enumerate() {
                acc += w * *row(values, p).add(jj);
            }
            *o = acc;
        }
    }

    /// [`attend_head`] for `g` heads over one pass of the cache; per head, the same
    /// operations in the same order. `scores` holds g rows of the positions.
    #[target_feature(enable = "avx2")]
    pub unsafe fn attend_group(
        qs: &[f32],
        hd: usize,
        g: usize,
        kv: &KvView,
        scale: f32,
        scores: &mut [f32],
        outs: &mut [f32],
    ) {
        let n = kv.positions;
        let full = hd / 8 * 8;
        let (keys, values) = (kv.keys.as_ptr(), kv.values.as_ptr());
        let row = |base: *const f32, p: usize| base.add(p * kv.stride + kv.offset);
        let sp = scores.as_mut_ptr();
        // Four positions at a time: four independent sums in flight rather than one chain of
        // additions waiting on each other (each sum's own order unchanged).
        let mut p = 0;
        while p + 4 <= n && hd.is_multiple_of(8) {
            let k: [*const f32; 4] = std::array::from_fn(|d| row(keys, p + d));
            for h in 0..g {
                let qp = qs.as_ptr().add(h * hd);
                let mut acc = [_mm256_setzero_ps(); 4];
                let mut i = 0;
                while i < full {
                    let qv = _mm256_loadu_ps(qp.add(i));
                    for (a, kd) in acc.iter_mut().zip(&k) {
                        *a = _mm256_add_ps(*a, _mm256_mul_ps(qv, _mm256_loadu_ps(kd.add(i))));
                    }
                    i += 8;
                }
                for (d, a) in acc.iter().enumerate() {
                    *sp.add(h * n + p + d) = sum8(*a) * scale;
                }
            }
            p += 4;
        }
        for p in p..n {
            let k = row(keys, p);
            for h in 0..g {
                let qp = qs.as_ptr().add(h * hd);
                let mut acc = _mm256_setzero_ps();
                let mut i = 0;
                while i < full {
                    acc = _mm256_add_ps(
                        acc,
                        _mm256_mul_ps(_mm256_loadu_ps(qp.add(i)), _mm256_loadu_ps(k.add(i))),
                    );
                    i += 8;
                }
                let mut sum = sum8(acc);
                while i < hd {
                    sum += *qp.add(i) * *k.add(i);
                    i += 1;
                }
                *sp.add(h * n + p) = sum * scale;
            }
        }
        for h in 0..g {
            let s = &mut scores[h * n..(h + 1) * n];
            let max = s.iter().fold(f32::NEG_INFINITY, |m, x| m.max(*x));
            let vmax = _mm256_set1_ps(max);
            let mut lanes = _mm256_setzero_ps();
            let mut p = 0;
            let hp = s.as_mut_ptr();
            while p + 8 <= n {
                let e = exp(_mm256_sub_ps(_mm256_loadu_ps(hp.add(p)), vmax));
                _mm256_storeu_ps(hp.add(p), e);
                lanes = _mm256_add_ps(lanes, e);
                p += 8;
            }
            let mut total = sum8(lanes);
            for x in &mut s[p..] {
                *x = portable::exp(*x - max);
                total += *x;
            }
            let norm = 1.0 / total;
            for x in s.iter_mut() {
                *x *= norm;
            }
        }
        // Each output value's sum runs over the positions in order, as in attend_head;
        // sixteen values of every head at a time, each value vector loaded once for all.
        let op = outs.as_mut_ptr();
        let sp = scores.as_ptr();
        let mut j = 0;
        while j + 16 <= full {
            let mut acc = [[_mm256_setzero_ps(); 2]; GROUP_MAX];
            for p in 0..n {
                let v = row(values, p).add(j);
                let (v0, v1) = (_mm256_loadu_ps(v), _mm256_loadu_ps(v.add(8)));
                for (h, a) in acc.iter_mut().enumerate().take(g) {
                    let w = _mm256_set1_ps(*sp.add(h * n + p));
                    a[0] = _mm256_add_ps(a[0], _mm256_mul_ps(w, v0));
                    a[1] = _mm256_add_ps(a[1], _mm256_mul_ps(w, v1));
                }
            }
            for (h, a) in acc.iter().enumerate().take(g) {
                _mm256_storeu_ps(op.add(h * hd + j), a[0]);
                _mm256_storeu_ps(op.add(h * hd + j + 8), a[1]);
            }
            j += 16;
        }
        while j < full {
            for h in 0..g {
                let mut acc = _mm256_setzero_ps();
                for p in 0..n {
                    let v = _mm256_loadu_ps(row(values, p).add(j));
                    acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(*sp.add(h * n + p)), v));
                }
                _mm256_storeu_ps(op.add(h * hd + j), acc);
            }
            j += 8;
        }
        for h in 0..g {
            for jj in full..hd {
                let mut acc = 0f32;
                for p in 0..n {
                    acc += *sp.add(h * n + p) * *row(values, p).add(jj);
                }
                *op.add(h * hd + jj) = acc;
            }
        }
    }
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

    /// Heads of one group at once give each head's own result, bit for bit.
    #[test]
    fn a_group_at_once_is_each_head_alone() {
        for hd in [64usize, 40, 12, 3] {
            for positions in [1usize, 9, 33, 200] {
                for g in 1..=GROUP_MAX {
                    let stride = 2 * hd;
                    let fill = |seed: usize, i: usize| {
                        (((i * 7919 + seed * 104_729) % 2003) as f32 / 2003.0 - 0.5) * 3.0
                    };
                    let keys: Vec<f32> = (0..positions * stride).map(|i| fill(1, i)).collect();
                    let values: Vec<f32> = (0..positions * stride).map(|i| fill(2, i)).collect();
                    let qs: Vec<f32> = (0..g * hd).map(|i| fill(3, i)).collect();
                    let kv = KvView {
                        keys: &keys,
                        values: &values,
                        stride,
                        offset: hd,
                        positions,
                    };
                    let scale = 0.125;
                    let mut together = vec![0f32; g * hd];
                    attend_group(&qs, hd, &kv, scale, &mut Vec::new(), &mut together);
                    for h in 0..g {
                        let mut alone = vec![0f32; hd];
                        attend_head(
                            &qs[h * hd..(h + 1) * hd],
                            &kv,
                            scale,
                            &mut Vec::new(),
                            &mut alone,
                        );
                        for j in 0..hd {
                            assert_eq!(
                                together[h * hd + j].to_bits(),
                                alone[j].to_bits(),
                                "hd {hd} n {positions} g {g} head {h} [{j}]"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Every kernel this CPU has against a softmax computed in f64, and bit for bit against
    /// the portable one, at head sizes with and without a tail and position counts around
    /// the eight-lane blocks.
    #[test]
    fn kernels_agree_bit_for_bit_and_with_f64() {
        for hd in [64usize, 40, 12, 3] {
            for positions in [1usize, 7, 8, 9, 33, 200] {
                let stride = 3 * hd;
                let offset = hd;
                let fill = |seed: usize, i: usize| {
                    (((i * 7919 + seed * 104_729) % 2003) as f32 / 2003.0 - 0.5) * 3.0
                };
                let keys: Vec<f32> = (0..positions * stride).map(|i| fill(1, i)).collect();
                let values: Vec<f32> = (0..positions * stride).map(|i| fill(2, i)).collect();
                let q: Vec<f32> = (0..hd).map(|i| fill(3, i)).collect();
                let kv = KvView {
                    keys: &keys,
                    values: &values,
                    stride,
                    offset,
                    positions,
                };
                let scale = 1.0 / (hd as f32).sqrt();
                let (mut s1, mut s2) = (Vec::new(), vec![0f32; positions]);
                let (mut got, mut plain) = (vec![0f32; hd], vec![0f32; hd]);
                attend_head(&q, &kv, scale, &mut s1, &mut got);
                portable::attend_head(&q, &kv, scale, &mut s2, &mut plain);
                // The exact softmax-weighted sum.
                let at = |p: usize, j: usize| p * stride + offset + j;
                let sc: Vec<f64> = (0..positions)
                    .map(|p| {
                        (0..hd)
                            .map(|j| q[j] as f64 * keys[at(p, j)] as f64)
                            .sum::<f64>()
                            * scale as f64
                    })
                    .collect();
                let max = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = sc.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = e.iter().sum();
                for j in 0..hd {
                    let want: f64 = (0..positions)
                        .map(|p| e[p] / total * values[at(p, j)] as f64)
                        .sum();
                    assert_eq!(
                        got[j].to_bits(),
                        plain[j].to_bits(),
                        "hd {hd} n {positions}"
                    );
                    assert!(
                        (got[j] as f64 - want).abs() <= 1e-5,
                        "hd {hd} n {positions} [{j}]: {} vs {want}",
                        got[j]
                    );
                }
            }
        }
    }
}
