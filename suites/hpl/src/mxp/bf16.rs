//! HPL-MxP's trailing update in BF16 with FP32 accumulation, on x86's AVX-512 BF16
//! (`vdpbf16ps`: sixteen FP32 lanes, each adding the products of two BF16 pairs): C −= A·B
//! with A and B rounded to BF16 (to nearest, ties to even) as they are packed, and C, the
//! trailing matrix, kept in FP32. Chosen at run time: a CPU without the instructions runs
//! none of this (`available`).
//!
//! Laid out as GotoBLAS's GEMM: A packed in panels of MR rows and B in panels of NR columns,
//! each holding for every pair of k the pair of BF16 values side by side in 32 bits (the order
//! `vdpbf16ps` reads); a micro-kernel keeps a 32×12 block of C in 24 registers over the whole
//! k; row blocks of MC rows keep A's part in L2 while B's panels stream. The threads split C's
//! columns.

/// Rows of C a micro-kernel computes (two 16-lane registers).
const MR: usize = 32;
/// Columns of C a micro-kernel computes.
const NR: usize = 12;
/// Rows of A kept in L2 while B's panels pass.
const MC: usize = 256;

/// Whether this CPU runs the BF16 kernel (x86-64 with AVX-512F and AVX-512 BF16, enabled by
/// the OS).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The kernel's name for the result.
pub const NAME: &str = "tbbench's AVX-512 BF16 (vdpbf16ps, FP32 accumulation)";

/// FP32 to BF16 bits (to nearest, ties to even), widened for packing in pairs.
#[inline]
fn bf16(x: f32) -> u32 {
    super::rounded::bf16_bits(x) as u32
}

/// The packed operands, kept between calls so each step reuses their memory.
#[derive(Default)]
pub struct Scratch {
    a: Vec<u32>,
    b: Vec<u32>,
}

/// C[m×n] −= A[m×k]·B[k×n], A and B in BF16, on `threads` threads.
///
/// # Safety
/// As `kernels32::gemm_minus`: each pointer addresses its block and C overlaps neither A nor
/// B; `available()` must be true.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_minus(
    scratch: &mut Scratch,
    threads: usize,
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
    let kp = k.div_ceil(2);
    let (apanels, bpanels) = (m.div_ceil(MR), n.div_ceil(NR));
    scratch.a.resize(apanels * kp * MR, 0);
    scratch.b.resize(bpanels * kp * NR, 0);
    let threads = threads.clamp(1, bpanels);
    // Pointers cross into the threads as addresses: each thread packs and writes disjoint
    // parts (its share of A's panels, of B's panels, of C's columns).
    let (pa, pb) = (
        scratch.a.as_mut_ptr() as usize,
        scratch.b.as_mut_ptr() as usize,
    );
    let (a, b, c) = (a as usize, b as usize, c as usize);
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let (i0, i1) = (apanels * t / threads, apanels * (t + 1) / threads);
                let (j0, j1) = (bpanels * t / threads, bpanels * (t + 1) / threads);
                // SAFETY: the caller's shapes; disjoint panels per thread.
                unsafe {
                    pack_a(m, k, a as *const f32, lda, pa as *mut u32, i0..i1);
                    pack_b(k, n, b as *const f32, ldb, pb as *mut u32, j0..j1);
                }
            });
        }
    });
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let (j0, j1) = (bpanels * t / threads, bpanels * (t + 1) / threads);
                let (pa, pb, c) = (pa as *const u32, pb as *const u32, c as *mut f32);
                for ic in (0..m).step_by(MC) {
                    for jp in j0..j1 {
                        let cols = (n - jp * NR).min(NR);
                        for ip in ic / MR..(ic + MC).min(m).div_ceil(MR) {
                            let rows = (m - ip * MR).min(MR);
                            // SAFETY: panels packed above; C's block in the caller's shape,
                            // its columns this thread's alone.
                            unsafe {
                                micro(
                                    kp,
                                    pa.add(ip * kp * MR),
                                    pb.add(jp * kp * NR),
                                    c.add(jp * NR * ldc + ip * MR),
                                    ldc,
                                    rows,
                                    cols,
                                )
                            };
                        }
                    }
                }
            });
        }
    });
}

/// A's row panels `panels`: [panel][pair][MR], rows past m and the odd k's partner zero.
unsafe fn pack_a(
    m: usize,
    k: usize,
    a: *const f32,
    lda: usize,
    out: *mut u32,
    panels: std::ops::Range<usize>,
) {
    let kp = k.div_ceil(2);
    for i in panels {
        let rows = (m - i * MR).min(MR);
        for p in 0..kp {
            let dst = out.add((i * kp + p) * MR);
            let lo = a.add(2 * p * lda + i * MR);
            let hi = (2 * p + 1 < k).then(|| a.add((2 * p + 1) * lda + i * MR));
            for r in 0..MR {
                let v = if r < rows {
                    bf16(*lo.add(r)) | hi.map_or(0, |h| bf16(*h.add(r)) << 16)
                } else {
                    0
                };
                *dst.add(r) = v;
            }
        }
    }
}

/// B's column panels `panels`: [panel][pair][NR], columns past n and the odd k's partner zero.
unsafe fn pack_b(
    k: usize,
    n: usize,
    b: *const f32,
    ldb: usize,
    out: *mut u32,
    panels: std::ops::Range<usize>,
) {
    let kp = k.div_ceil(2);
    for j in panels {
        let cols = (n - j * NR).min(NR);
        for c in 0..NR {
            let col = b.add((j * NR + c) * ldb);
            for p in 0..kp {
                let v = if c < cols {
                    bf16(*col.add(2 * p))
                        | if 2 * p + 1 < k {
                            bf16(*col.add(2 * p + 1)) << 16
                        } else {
                            0
                        }
                } else {
                    0
                };
                *out.add((j * kp + p) * NR + c) = v;
            }
        }
    }
}

/// C[rows×cols] −= A-panel·B-panel over kp pairs of k, the block of C in 24 registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
// The column index walks both rows of accumulators and B's pair at once; the loop unrolls.
#[allow(clippy::needless_range_loop)]
unsafe fn micro(
    kp: usize,
    a: *const u32,
    b: *const u32,
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); NR]; 2];
    for p in 0..kp {
        // SAFETY (of the transmutes): 512 bits of BF16 pairs are what __m512bh holds.
        let a0: __m512bh = std::mem::transmute(_mm512_loadu_si512(a.add(p * MR) as *const _));
        let a1: __m512bh = std::mem::transmute(_mm512_loadu_si512(a.add(p * MR + 16) as *const _));
        let bp = b.add(p * NR);
        for j in 0..NR {
            let bj: __m512bh = std::mem::transmute(_mm512_set1_epi32(*bp.add(j) as i32));
            acc[0][j] = _mm512_dpbf16_ps(acc[0][j], a0, bj);
            acc[1][j] = _mm512_dpbf16_ps(acc[1][j], a1, bj);
        }
    }
    let mask = |from: usize| -> __mmask16 {
        let n = rows.saturating_sub(from).min(16);
        ((1u32 << n) - 1) as __mmask16
    };
    let (m0, m1) = (mask(0), mask(16));
    for (j, [acc0, acc1]) in (0..cols).zip(transpose(acc)) {
        let cj = c.add(j * ldc);
        let c0 = _mm512_maskz_loadu_ps(m0, cj);
        _mm512_mask_storeu_ps(cj, m0, _mm512_sub_ps(c0, acc0));
        if m1 != 0 {
            let c1 = _mm512_maskz_loadu_ps(m1, cj.add(16));
            _mm512_mask_storeu_ps(cj.add(16), m1, _mm512_sub_ps(c1, acc1));
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn transpose<T: Copy>(acc: [[T; NR]; 2]) -> [[T; 2]; NR] {
    std::array::from_fn(|j| [acc[0][j], acc[1][j]])
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn micro(
    _kp: usize,
    _a: *const u32,
    _b: *const u32,
    _c: *mut f32,
    _ldc: usize,
    _rows: usize,
    _cols: usize,
) {
    unreachable!("the BF16 kernel runs only where available() says so")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the product of the BF16-rounded operands in f64, on shapes with every edge
    /// (rows past a panel, columns past a panel, an odd k), one and three threads.
    #[test]
    fn the_bf16_product_is_the_rounded_operands_product() {
        if !available() {
            eprintln!("no AVX-512 BF16 on this CPU: the kernel is not run here");
            return;
        }
        let back = |x: f32| f32::from_bits(bf16(x) << 16) as f64;
        for (m, n, k, threads) in [
            (1, 1, 1, 1),
            (33, 13, 7, 3),
            (70, 25, 64, 1),
            (64, 24, 256, 3),
        ] {
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 7) % 13) as f32 * 0.1 - 0.6)
                .collect();
            let b: Vec<f32> = (0..k * n)
                .map(|i| ((i * 5) % 11) as f32 * 0.13 - 0.5)
                .collect();
            let mut c: Vec<f32> = (0..m * n).map(|i| i as f32 * 0.01).collect();
            let c0 = c.clone();
            let mut s = Scratch::default();
            unsafe {
                gemm_minus(
                    &mut s,
                    threads,
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
                            .map(|p| back(a[p * m + i]) * back(b[j * k + p]))
                            .sum::<f64>();
                    let got = c[j * m + i] as f64;
                    assert!(
                        (got - want).abs() < 1e-4 * (1.0 + want.abs()),
                        "{m}x{n}x{k} ({i},{j}): {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn rounding_is_to_nearest_even() {
        assert_eq!(bf16(1.0), 0x3f80);
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even one, 1.
        assert_eq!(bf16(1.0 + 1.0 / 256.0), 0x3f80);
        assert_eq!(bf16(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(bf16(-2.0), 0xc000);
    }
}
