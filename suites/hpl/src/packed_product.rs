//! The trailing update's product, A22 −= L21·U12, with L21 packed once per panel and a
//! register-blocked kernel chosen from the CPU at run time ([`Kernel`]): AVX-512F, or AVX2
//! and FMA.
//!
//! A BLAS dgemm copies its A operand into the order its kernel reads on every call (OpenBLAS
//! again for every few thousand columns of a wide call). One rank on several threads
//! applies a panel in chunks of at most 512 columns (each thread calls the product on its own
//! chunks, with the swaps and U12's solve fused ahead of each), so through the BLAS, L21, the
//! tall operand, is copied some twenty times per panel, a few percent of a 1-rank run's
//! core-seconds (`perf record` on `tbbench hpl --nodes 1 --n 10000 --nb 128` shows the
//! copies in OpenBLAS's packing routines). Here
//! L21 is packed once per panel, by the threads that bring the next panel's columns up to
//! date with it (each packs the row blocks it then multiplies), and every chunk reads that
//! copy. Elsewhere (several ranks, one thread, DEPTH 0) a rank updates a panel's columns in
//! one or two calls; the packing is made on the first and read by the second.
//!
//! The AVX-512 kernel holds a 24×8 block of the product in 24 registers (three 8-double
//! vectors per column) while 24 rows of L21 and 8 values of U12 stream per step of k; each C
//! block's cache lines are prefetched as its sum starts, so they arrive while it is computed. Loops
//! as BLIS orders them: U12's chunk packed per pass of up to `KC` rows of k, L21 taken
//! `MC_BYTES` at a time (in L2), each 8-column slice of U12 (in L1) run against those rows.
//! The packing starts on a cache line: vector loads that straddle two cost a tenth of the
//! rate. On that VM, one thread, 4800 × 512 × 128 chunks against a packed L21 (`cargo bench
//! -p tbbench-hpl --bench kernels -- update_chunk`): 81.4 Gflops, OpenBLAS 73.3 for the same
//! calls; whole runs, N=10000 NB 128: 128.0 against 119.3 Gflops (medians of three
//! interleaved pairs). A rank's whole update in one call, 4800 × 4096 × 128 with L21's
//! packing timed (`-- update_whole`): 75.9 against OpenBLAS's 73.4.
//!
//! The AVX2 kernel runs the same 24×8 block as four 12×4 ones (`block_12x4`). On the same
//! core with `TBBENCH_HPL_KERNEL=avx2` against OpenBLAS's Haswell kernel
//! (`OPENBLAS_CORETYPE=Haswell`), the stand-in for an AVX2-only CPU, one thread: chunks
//! 1.00-1.05x OpenBLAS's rate over six criterion runs of an hour, a whole update with the
//! packing 0.94-1.01x over three; the run-time measurement keeps the BLAS where it is ahead.
//!
//! Which product runs is measured once per NB and shape of call (`finding`), as the U12
//! solver is, and agreed by the ranks: a vendor BLAS may beat these kernels, and without
//! AVX-512 or AVX2 there is only the BLAS.

use crate::kernels;
use std::time::Instant;

/// Rows of a packed block and of the AVX-512 kernel's register block: three 512-bit vectors
/// (the AVX2 kernel takes each block as two halves of 12 rows).
const MR: usize = 24;
/// Columns of the kernel's block.
const NR: usize = 8;
/// Bytes of packed L21 run against one packed slice of U12 before the next (480 rows at
/// k = 128): in L2 beside U12's packed chunk.
const MC_BYTES: usize = 480 * 128 * 8;
/// Most rows of k per pass (deeper products, the DGEMM probe's, take several).
const KC: usize = 384;
/// The deepest NB the product is measured at. Deeper, a 24-row block of L21 and U12's slice
/// no longer fit L1 together (24·192 + 8·192 doubles are 48 KiB), and on the Xeon VM it ran
/// level with OpenBLAS at NB 192 and 256 and 2-3% behind at 384 (chunks measured as in
/// `measure`), against 3-7% ahead at NB 128; whole runs agreed (1×2 N=10000: 6% behind at NB
/// 192 and 256, 4% ahead at 128).
const MAX_MEASURED_K: usize = 160;
/// How much faster than this product the BLAS must measure for it to be kept. The measured
/// updates understate what a run gains (on the Xeon VM, NB 128: chunks 0-5% ahead, one call
/// over 1024 columns level, whole runs 4-7% in interleaved pairs), so up to `MAX_MEASURED_K`
/// this one is the default, and the measurement is there to keep a BLAS that is clearly
/// faster (a vendor's may be).
const MARGIN: f64 = 0.02;

/// L21 (`rows` × `k`), packed in blocks of `MR` rows: block `p` holds rows `p·MR ..` for
/// every column, column after column (`MR` values each, zeros past `rows`), so the kernel
/// reads a block front to back and any `KC` columns of it are contiguous.
pub struct PackedL21 {
    /// The register kernel that multiplies this packing ([`Kernel::chosen`] unless a test or
    /// bench names another): every kernel reads the same layout.
    kernel: Kernel,
    rows: usize,
    k: usize,
    values: Vec<f64>,
    /// Where the packing starts in `values`: on a cache line, so no vector load of a block
    /// straddles two (a large allocation starts 16 bytes past a page; split loads cost the
    /// kernel a tenth of its rate).
    start: usize,
}

impl Default for PackedL21 {
    /// A packing for the kernel this process runs; on a CPU with none, one that
    /// `pack_and_update` and `gemm_minus` refuse.
    fn default() -> Self {
        PackedL21::for_kernel(Kernel::chosen().unwrap_or(Kernel::Avx2))
    }
}

impl PackedL21 {
    /// A packing multiplied by `kernel`.
    pub fn for_kernel(kernel: Kernel) -> Self {
        PackedL21 {
            kernel,
            rows: 0,
            k: 0,
            values: Vec::new(),
            start: 0,
        }
    }

    /// An empty packing of `rows` × `k`, for `pack_and_update` to fill (the buffer is kept
    /// from panel to panel: panels only shrink, so after the first nothing is allocated).
    pub fn reset(&mut self, rows: usize, k: usize) {
        self.rows = rows;
        self.k = k;
        let len = Self::len_for(rows, k);
        if self.values.len() < len + self.start {
            self.values = crate::matrix::zeroed(len + 8);
            let misaligned = self.values.as_ptr() as usize % 64;
            self.start = (64 - misaligned) % 64 / std::mem::size_of::<f64>();
        }
    }

    /// The packed values.
    fn packed(&self) -> &[f64] {
        &self.values[self.start..self.start + Self::len_for(self.rows, self.k)]
    }

    fn packed_mut(&mut self) -> &mut [f64] {
        let len = Self::len_for(self.rows, self.k);
        &mut self.values[self.start..self.start + len]
    }

    pub fn blocks(&self) -> usize {
        self.rows.div_ceil(MR)
    }

    /// Values a packing of `rows` × `k` holds.
    pub fn len_for(rows: usize, k: usize) -> usize {
        rows.div_ceil(MR) * MR * k
    }

    /// Packs blocks `blocks` of `l` (this packing's rows × k, leading dimension `ld`) into
    /// `out`, the part of the packing those blocks occupy (`pack_and_update` hands each
    /// thread its part).
    fn pack_into(
        rows: usize,
        k: usize,
        blocks: std::ops::Range<usize>,
        l: &[f64],
        ld: usize,
        out: &mut [f64],
    ) {
        for (i, p) in blocks.enumerate() {
            let r0 = p * MR;
            let mr = MR.min(rows - r0);
            let dst = &mut out[i * MR * k..(i + 1) * MR * k];
            for (kk, d) in dst.chunks_exact_mut(MR).enumerate() {
                let src = &l[kk * ld + r0..kk * ld + r0 + mr];
                d[..mr].copy_from_slice(src);
                d[mr..].fill(0.0);
            }
        }
    }
}

/// The product this rank runs the trailing update with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Product {
    /// L21 packed once per panel, this module's kernel for the CPU ([`Kernel`]).
    Packed,
    /// The BLAS's dgemm (or the Rust loops without one), per call.
    Blas,
}

impl Product {
    pub fn name(self) -> &'static str {
        match self {
            Product::Packed => match Kernel::chosen() {
                Some(Kernel::Avx512) => "tbbench avx512 24x8 (L21 packed once per panel)",
                Some(Kernel::Avx2) => "tbbench avx2 12x4 (L21 packed once per panel)",
                None => "tbbench packed (no kernel for this CPU)",
            },
            Product::Blas if kernels::blas().is_none() => "tbbench loops (no BLAS)",
            Product::Blas => "BLAS dgemm",
        }
    }
}

/// The register kernels of the packed product. Both read the same packing (blocks of `MR`
/// rows of L21, slices of `NR` columns of U12).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// AVX-512F: a 24×8 block in 24 registers of 8 doubles.
    Avx512,
    /// AVX2 and FMA: each 24×8 block as four 12×4 ones, in 12 registers of 4 doubles (of the
    /// 16 there are). For x86-64 CPUs without AVX-512: AMD's before Zen 4, and Intel's
    /// client cores but for Ice, Tiger and Rocket Lake.
    Avx2,
}

/// Names the kernel to run instead of the best one this CPU has, to time like with like
/// (`avx2` against OpenBLAS's Haswell kernel, `OPENBLAS_CORETYPE=Haswell`: the stand-in for
/// an AVX2-only host on an AVX-512 one).
pub const ENV_KERNEL: &str = "TBBENCH_HPL_KERNEL";

impl Kernel {
    pub const ALL: [Kernel; 2] = [Kernel::Avx512, Kernel::Avx2];

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Avx512 => "avx512",
            Kernel::Avx2 => "avx2",
        }
    }

    /// Whether this CPU runs it.
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Kernel::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
                Kernel::Avx2 => {
                    std::arch::is_x86_feature_detected!("avx2")
                        && std::arch::is_x86_feature_detected!("fma")
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = self;
            false
        }
    }

    /// The kernel this process runs: the one `TBBENCH_HPL_KERNEL` names, else the best this
    /// CPU has; None where it has neither (Apple silicon: Accelerate's dgemm runs there).
    pub fn chosen() -> Option<Kernel> {
        static CHOSEN: std::sync::OnceLock<Option<Kernel>> = std::sync::OnceLock::new();
        *CHOSEN.get_or_init(|| match forced_kernel() {
            Ok(Some(k)) => Some(k),
            Ok(None) => Kernel::ALL.into_iter().find(|k| k.available()),
            // Refused on the launching host before the ranks start (`forced_kernel`); a rank
            // on a host without that kernel says so and runs its best.
            Err(why) => {
                let best = Kernel::ALL.into_iter().find(|k| k.available());
                let runs = best.map_or("the BLAS", |k| k.name());
                eprintln!("tbbench: {why}; this rank runs {runs}");
                best
            }
        })
    }
}

/// What `TBBENCH_HPL_KERNEL` asks for: nothing when unset, an error naming the value when it
/// names no kernel or one this CPU lacks.
pub fn forced_kernel() -> Result<Option<Kernel>, String> {
    let Some(v) = std::env::var_os(ENV_KERNEL) else {
        return Ok(None);
    };
    let here: Vec<&str> = Kernel::ALL
        .iter()
        .filter(|k| k.available())
        .map(|k| k.name())
        .collect();
    let here = if here.is_empty() {
        "none".to_string()
    } else {
        here.join(", ")
    };
    match Kernel::ALL.into_iter().find(|k| v == k.name()) {
        Some(k) if k.available() => Ok(Some(k)),
        Some(k) => Err(format!(
            "{ENV_KERNEL}={}: this CPU lacks that kernel (it has: {here})",
            k.name()
        )),
        None => Err(format!(
            "{ENV_KERNEL}={v:?}: expected avx512 or avx2 (this CPU has: {here}), or unset"
        )),
    }
}

/// Whether this CPU runs a kernel of the packed product (AVX-512F, or AVX2 and FMA).
pub fn available() -> bool {
    Kernel::chosen().is_some()
}

/// How a factorization calls the product, which decides what the BLAS pays per call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One rank on several threads (`factor::one_rank_path`): each thread calls it on chunks
    /// of at most 512 columns, and a BLAS packs L21 again on every chunk.
    Chunks,
    /// Elsewhere: one or two calls per panel over the trailing columns, on the rank's
    /// threads, where a BLAS packs L21 once per call (OpenBLAS again every few thousand
    /// columns) and this product once per panel.
    Whole,
}

/// What one process found out about the product at an NB and shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Finding {
    /// Chosen without timing (`choose`).
    Decided(Product),
    /// Seconds for the same update, best of five: this product's and the BLAS's.
    Timed { mine: f64, blas: f64 },
}

impl Finding {
    /// This finding as numbers the ranks can add up: [must run the BLAS, told or bound to
    /// this product, its seconds, the BLAS's seconds].
    pub fn sums(self) -> [f64; 4] {
        match self {
            Finding::Decided(Product::Blas) => [1.0, 0.0, 0.0, 0.0],
            Finding::Decided(Product::Packed) => [0.0, 1.0, 0.0, 0.0],
            Finding::Timed { mine, blas } => [0.0, 0.0, mine, blas],
        }
    }

    /// The product every rank runs, from the ranks' `sums` added up: the BLAS where any rank
    /// must (no kernel there, or told so), else this product where a rank was told or has
    /// no BLAS, else the timings' verdict over all ranks together (`faster`).
    pub fn agreed(sums: [f64; 4]) -> Product {
        match sums {
            [blas, ..] if blas > 0.0 => Product::Blas,
            [_, packed, ..] if packed > 0.0 => Product::Packed,
            [_, _, mine, blas] => faster(mine, blas),
        }
    }
}

/// This product unless the BLAS took more than `MARGIN` less time (a choice by noise would
/// flip between runs).
fn faster(mine: f64, blas: f64) -> Product {
    if blas * (1.0 + MARGIN) > mine {
        Product::Packed
    } else {
        Product::Blas
    }
}

/// What this process finds at block size `nb`, the product called as `shape` says: timed
/// against the BLAS on an update of that depth and shape (3000 rows; 512 columns per chunk,
/// two per thread, or one call over as many columns; the rank's threads at once), once per
/// NB and shape, up to `MAX_MEASURED_K` (at every NB where the BLAS runs a kernel older than
/// the CPU); decided without timing otherwise (`choose`): `TBBENCH_HPL_PRODUCT=packed|blas`,
/// no kernel for this CPU, no BLAS, a deeper NB.
pub fn finding(nb: usize, shape: Shape) -> Finding {
    type Found = Vec<(usize, Shape, Finding)>;
    static FOUND: std::sync::Mutex<Found> = std::sync::Mutex::new(Vec::new());
    // A bad value is refused before the ranks start (`forced`); here it only times both.
    let told = forced().ok().flatten();
    // A BLAS kernel older than the CPU (held there by OPENBLAS_CORETYPE, or a build with one
    // kernel) is timed against at every NB: past MAX_MEASURED_K it is no longer the faster.
    let behind = kernels::blas().is_some_and(|b| {
        b.name == "openblas"
            && kernels::kernel_below_cpu(&b.kernel, kernels::cpu_vectors()).is_some()
    });
    let nb_told = if behind { nb.min(MAX_MEASURED_K) } else { nb };
    if let Some(p) = choose(available(), told, kernels::blas().is_some(), nb_told) {
        return Finding::Decided(p);
    }
    let mut found = FOUND.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, _, f)) = found.iter().find(|(k, s, _)| (*k, *s) == (nb, shape)) {
        return f;
    }
    let (mine, blas) = measure(nb, shape);
    let f = Finding::Timed { mine, blas };
    found.push((nb, shape, f));
    f
}

/// The choice where it needs no measurement (None: measure): without the kernel the BLAS
/// (or its loops), else what the user `told`, else without a BLAS this product (far ahead of
/// the Rust loops at any depth), else the BLAS past `MAX_MEASURED_K`.
fn choose(kernel: bool, told: Option<Product>, blas: bool, nb: usize) -> Option<Product> {
    match told {
        _ if !kernel => Some(Product::Blas),
        Some(p) => Some(p),
        None if !blas => Some(Product::Packed),
        None if nb > MAX_MEASURED_K => Some(Product::Blas),
        None => None,
    }
}

/// What TBBENCH_HPL_PRODUCT asks for: nothing when unset, an error naming the value when it
/// is neither "packed" nor "blas".
pub fn forced() -> Result<Option<Product>, String> {
    let bad = |v: &dyn std::fmt::Debug| {
        format!("TBBENCH_HPL_PRODUCT={v:?}: expected packed or blas (or unset, to time both)")
    };
    match std::env::var("TBBENCH_HPL_PRODUCT") {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Ok(v) if v == "packed" => Ok(Some(Product::Packed)),
        Ok(v) if v == "blas" => Ok(Some(Product::Blas)),
        Ok(v) => Err(bad(&v)),
        Err(std::env::VarError::NotUnicode(v)) => Err(bad(&v)),
    }
}

/// Seconds, best of five, for an update of depth `k` called as `shape` says: this product's
/// and the BLAS's.
fn measure(k: usize, shape: Shape) -> (f64, f64) {
    // 26 MB per thread at NB 128, freed before the run allocates its share.
    let (m, chunk, chunks) = (3000, 512, 2);
    let threads = kernels::threads();
    let l: Vec<f64> = (0..m * k)
        .map(|i| ((i * 37) % 101) as f64 / 404.0)
        .collect();
    let ld = k + m;
    // Each thread's own columns, as the chunks are shared out in a run. The sums are not
    // restored between rounds: B is only read, and C moves by a few hundred at most.
    let width = chunk * chunks * threads;
    let mut bc: Vec<f64> = (0..ld * width)
        .map(|i| ((i * 53) % 97) as f64 / 97.0)
        .collect();
    let mut packed = PackedL21::default();
    let mut prepacked = PackedL21::default();
    if shape == Shape::Chunks {
        prepacked.reset(m, k);
        let blocks = prepacked.blocks();
        PackedL21::pack_into(m, k, 0..blocks, &l, m, prepacked.packed_mut());
    }
    // Chunks: every thread's at once (the threads share L3 and memory in a run too), against
    // L21 packed beforehand (once per panel for all of its chunks, tens of them on a
    // trailing matrix this deep); one BLAS thread per caller, as there.
    let chunks_round = |bc: &mut [f64], packed_l21: Option<&PackedL21>| {
        let t = Instant::now();
        std::thread::scope(|s| {
            for mine in bc.chunks_mut(ld * chunk * chunks) {
                let l = &l;
                s.spawn(move || {
                    for c in mine.chunks_mut(ld * chunk) {
                        match packed_l21 {
                            Some(p) => gemm_minus(p, Columns::Below { bc: c, ld }, chunk, 1),
                            None => kernels::gemm_minus_below(m, chunk, k, l, m, c, ld),
                        }
                    }
                });
            }
        });
        t.elapsed().as_secs_f64()
    };
    // Whole: one call over every column, L21's packing timed with it, on the rank's threads.
    let mut whole_round = |bc: &mut [f64], mine: bool| {
        let t = Instant::now();
        if mine {
            let cols = Columns::Below { bc, ld };
            pack_and_update(&mut packed, m, k, &l, m, cols, width, threads);
        } else {
            kernels::gemm_minus_below(m, width, k, &l, m, bc, ld);
        }
        t.elapsed().as_secs_f64()
    };
    let mut round = |bc: &mut [f64], mine: bool| match shape {
        Shape::Chunks => {
            kernels::set_blas_threads(1);
            let s = chunks_round(bc, mine.then_some(&prepacked));
            kernels::set_blas_threads(threads);
            s
        }
        Shape::Whole => whole_round(bc, mine),
    };
    // A round of each first: the BLAS's buffers and the threads' first pages.
    round(&mut bc, true);
    round(&mut bc, false);
    let (mut mine, mut blas) = (f64::MAX, f64::MAX);
    for _ in 0..5 {
        mine = mine.min(round(&mut bc, true));
        blas = blas.min(round(&mut bc, false));
    }
    (mine, blas)
}

/// This product's rate on an n×n×n multiply (A packed within the timing), Gflops, best of
/// three, with the rank's threads; None where the CPU lacks the kernel.
pub fn probe_gflops(n: usize) -> Option<f64> {
    if !available() {
        return None;
    }
    // In huge-page-backed memory, as the BLAS's probe and the share are.
    let mut a = crate::matrix::zeroed(n * n);
    for (i, v) in a.iter_mut().enumerate() {
        *v = (i % 7) as f64 * 0.1;
    }
    // B in rows 0..n of each column, C right below it.
    let mut bc = crate::matrix::zeroed(2 * n * n);
    for (i, v) in bc.iter_mut().enumerate() {
        *v = if i % (2 * n) < n {
            (i % 5) as f64 * 0.1
        } else {
            0.0
        };
    }
    let mut packed = PackedL21::default();
    let threads = kernels::threads();
    let ld = 2 * n;
    pack_and_update(
        &mut packed,
        n,
        n,
        &a,
        n,
        Columns::Below { bc: &mut bc, ld },
        n,
        threads,
    );
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        let cols = Columns::Below { bc: &mut bc, ld };
        pack_and_update(&mut packed, n, n, &a, n, cols, n, threads);
        best = best.min(t.elapsed().as_secs_f64());
    }
    Some(2.0 * (n * n * n) as f64 / best / 1e9)
}

/// Where a product's B (U12: k × width) and C (the rows of A22 it updates: rows × width)
/// lie.
pub enum Columns<'a> {
    /// One process row: U12 in rows 0..k of each column of `bc` (leading dimension `ld`), C
    /// right below it.
    Below { bc: &'a mut [f64], ld: usize },
    /// Several process rows: U12 held apart (`b`, leading dimension `ldb`), C in `c`
    /// (leading dimension `ldc`).
    Apart {
        b: &'a [f64],
        ldb: usize,
        c: &'a mut [f64],
        ldc: usize,
    },
}

/// `Columns` as the kernel reads them, checked to hold `width` columns of k and `rows`
/// values that do not overlap, and bound to the borrow they came from.
struct Operands<'a> {
    b: *const f64,
    ldb: usize,
    c: *mut f64,
    ldc: usize,
    width: usize,
    _columns: std::marker::PhantomData<&'a mut [f64]>,
}

// SAFETY: the threads `on_threads` starts read B and write disjoint row ranges of C.
unsafe impl Sync for Operands<'_> {}

impl<'a> Columns<'a> {
    fn operands(self, rows: usize, k: usize, width: usize) -> Operands<'a> {
        // Bounds (without overflow, whatever the leading dimension), and for `Below` columns
        // that do not overlap (or C's rows would be another column's B); `Apart`'s are two
        // borrows, apart by construction.
        let fits = |len: usize, ld: usize, used: usize| {
            let end = (width.max(1) - 1)
                .checked_mul(ld)
                .and_then(|e| e.checked_add(used));
            width == 0 || (ld >= used && end.is_some_and(|e| len >= e))
        };
        match self {
            Columns::Below { bc, ld } => {
                assert!(
                    fits(bc.len(), ld, k + rows),
                    "U12 and C overrun their columns"
                );
                let b = bc.as_mut_ptr();
                Operands {
                    b,
                    ldb: ld,
                    // Read only where width > 0, and then inside `bc` (checked above).
                    c: b.wrapping_add(k),
                    ldc: ld,
                    width,
                    _columns: std::marker::PhantomData,
                }
            }
            Columns::Apart { b, ldb, c, ldc } => {
                assert!(fits(b.len(), ldb, k), "U12 overruns its columns");
                assert!(fits(c.len(), ldc, rows), "C overruns its columns");
                Operands {
                    b: b.as_ptr(),
                    ldb,
                    c: c.as_mut_ptr(),
                    ldc,
                    width,
                    _columns: std::marker::PhantomData,
                }
            }
        }
    }
}

/// Packs L21 (`l`: rows × k, leading dimension `ld`) into `packed` and applies it to the
/// `width` columns of `cols`, with `threads` threads, each packing the row blocks it
/// multiplies.
#[allow(clippy::too_many_arguments)]
pub fn pack_and_update(
    packed: &mut PackedL21,
    rows: usize,
    k: usize,
    l: &[f64],
    ld: usize,
    cols: Columns,
    width: usize,
    threads: usize,
) {
    assert!(
        packed.kernel.available(),
        "the packed product's {} kernel needs features this CPU lacks",
        packed.kernel.name()
    );
    packed.reset(rows, k);
    if rows == 0 || k == 0 {
        return;
    }
    assert!(l.len() >= (k - 1) * ld + rows && ld >= rows);
    let ops = cols.operands(rows, k, width);
    let kernel = packed.kernel;
    let blocks = packed.blocks();
    let parts = split(packed.packed_mut(), blocks, MR * k, threads);
    on_threads(parts, |range, mine| {
        PackedL21::pack_into(rows, k, range.clone(), l, ld, mine);
        if ops.width > 0 {
            // SAFETY: the threads write disjoint row ranges (their blocks) of C and only read
            // B, inside the columns `Columns::operands` checked.
            unsafe { product_rows(kernel, mine, k, range, rows, &ops) };
        }
    });
}

/// C −= L21·B for the `width` columns of `cols`, L21 as `packed` holds it, on `threads`
/// threads (each its share of the row blocks).
pub fn gemm_minus(packed: &PackedL21, cols: Columns, width: usize, threads: usize) {
    assert!(
        packed.kernel.available(),
        "the packed product's {} kernel needs features this CPU lacks",
        packed.kernel.name()
    );
    let (rows, k, kernel) = (packed.rows, packed.k, packed.kernel);
    if width == 0 || rows == 0 || k == 0 {
        return;
    }
    let ops = cols.operands(rows, k, width);
    let parts = split(packed.packed(), packed.blocks(), MR * k, threads);
    on_threads(parts, |range, mine| {
        // SAFETY: as in `pack_and_update`.
        unsafe { product_rows(kernel, mine, k, range, rows, &ops) };
    });
}

/// `blocks` blocks of `per_block` values in `values`, shared out as evenly as whole blocks
/// allow over at most `threads` parts, none empty.
fn split<S: SplitAt>(
    values: S,
    blocks: usize,
    per_block: usize,
    threads: usize,
) -> Vec<(std::ops::Range<usize>, S)> {
    let threads = threads.clamp(1, blocks.max(1));
    let mut rest = values;
    let mut parts = Vec::with_capacity(threads);
    for t in 0..threads {
        let range = blocks * t / threads..blocks * (t + 1) / threads;
        let (mine, tail) = rest.split(range.len() * per_block);
        rest = tail;
        parts.push((range, mine));
    }
    parts
}

/// A slice `split` can cut, shared or not.
trait SplitAt: Sized + Send {
    fn split(self, at: usize) -> (Self, Self);
}

impl SplitAt for &mut [f64] {
    fn split(self, at: usize) -> (Self, Self) {
        self.split_at_mut(at)
    }
}

impl SplitAt for &[f64] {
    fn split(self, at: usize) -> (Self, Self) {
        self.split_at(at)
    }
}

/// `work` on each part, the last on the caller's thread, the others on threads of their own.
fn on_threads<S: SplitAt>(
    mut parts: Vec<(std::ops::Range<usize>, S)>,
    work: impl Fn(std::ops::Range<usize>, S) + Sync,
) {
    let Some((range, last)) = parts.pop() else {
        return;
    };
    if parts.is_empty() {
        return work(range, last);
    }
    std::thread::scope(|s| {
        let work = &work;
        let handles: Vec<_> = parts
            .into_iter()
            .map(|(range, mine)| s.spawn(move || work(range, mine)))
            .collect();
        work(range, last);
        for h in handles {
            if let Err(panic) = h.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
}

thread_local! {
    /// U12's slice packed for the kernel, per thread, kept between calls.
    static PACKED_B: std::cell::RefCell<Vec<f64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Row blocks `blocks` of the product (their values `a`, packed, starting with the first of
/// them), over the columns of `ops`; `rows` is L21's row count (the last block may be
/// short).
///
/// # Safety
/// `ops` must be valid for its columns of k values of B and `rows` of C; only C's rows of
/// these blocks are written; the CPU runs `kern`.
unsafe fn product_rows(
    kern: Kernel,
    a: &[f64],
    k: usize,
    blocks: std::ops::Range<usize>,
    rows: usize,
    ops: &Operands,
) {
    let width = ops.width;
    let panels = width.div_ceil(NR);
    PACKED_B.with(|b| {
        let mut b = b.borrow_mut();
        let kc_max = KC.min(k);
        if b.len() < panels * NR * kc_max {
            b.resize(panels * NR * kc_max, 0.0);
        }
        let mut k0 = 0;
        while k0 < k {
            let kc = KC.min(k - k0);
            pack_b(&mut b, ops.b, ops.ldb, k0, kc, width);
            let mc_blocks = (MC_BYTES / (8 * kc * MR)).max(1);
            for ic in blocks.clone().step_by(mc_blocks) {
                let last = (ic + mc_blocks).min(blocks.end);
                for q in 0..panels {
                    let j0 = q * NR;
                    let nr = NR.min(width - j0);
                    let bq = &b[q * NR * kc..(q + 1) * NR * kc];
                    for p in ic..last {
                        let r0 = p * MR;
                        let ap = &a[(p - blocks.start) * MR * k + k0 * MR..][..MR * kc];
                        let c = ops.c.add(j0 * ops.ldc + r0);
                        let mr = MR.min(rows - r0);
                        let blk = Block {
                            kc,
                            a: ap,
                            b: bq,
                            c,
                            ld: ops.ldc,
                            mr,
                            nr,
                        };
                        kernel(kern, &blk);
                    }
                }
            }
            k0 += kc;
        }
    })
}

/// Rows k0..k0 + kc of B's `width` columns (at `b`, leading dimension `ld`) into `out`, in
/// slices of `NR` columns, each row's `NR` values together (zeros past `width`).
///
/// # Safety
/// As `product_rows`.
unsafe fn pack_b(out: &mut [f64], b: *const f64, ld: usize, k0: usize, kc: usize, width: usize) {
    for q in 0..width.div_ceil(NR) {
        let dst = &mut out[q * NR * kc..(q + 1) * NR * kc];
        for j in 0..NR {
            let col = q * NR + j;
            if col < width {
                let src = std::slice::from_raw_parts(b.add(col * ld + k0), kc);
                for (kk, &v) in src.iter().enumerate() {
                    dst[kk * NR + j] = v;
                }
            } else {
                for kk in 0..kc {
                    dst[kk * NR + j] = 0.0;
                }
            }
        }
    }
}

/// One call of a register kernel: C[mr×nr] (at `c`, leading dimension `ld`) −= A·B over `kc`
/// steps, A one packed block (`MR` values per step), B one packed slice (`NR` per step).
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct Block<'a> {
    kc: usize,
    a: &'a [f64],
    b: &'a [f64],
    c: *mut f64,
    ld: usize,
    mr: usize,
    nr: usize,
}

impl Block<'_> {
    /// Every cache line the block's columns of C span: each column's first byte, each 64
    /// bytes on that are still in it, and its last byte (pointers formed only inside the
    /// column), so that C arrives while its sum is computed.
    ///
    /// # Safety
    /// As `kernel`.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn prefetch_c(&self) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        debug_assert!(self.a.len() >= MR * self.kc && self.b.len() >= NR * self.kc);
        for j in 0..self.nr {
            let cj = self.c.add(j * self.ld).cast::<i8>();
            for off in (0..8 * self.mr).step_by(64).chain([8 * self.mr - 1]) {
                _mm_prefetch::<_MM_HINT_T0>(cj.add(off));
            }
        }
    }
}

/// Runs `blk` on `kern`.
///
/// # Safety
/// `blk.c` valid for `nr` columns of `mr` values at stride `ld`; the CPU runs `kern`.
#[inline(always)]
unsafe fn kernel(kern: Kernel, blk: &Block) {
    #[cfg(target_arch = "x86_64")]
    match kern {
        Kernel::Avx512 => kernel_avx512(blk),
        Kernel::Avx2 => kernel_avx2(blk),
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (kern, blk);
        unreachable!("the packed product runs only where `available()`");
    }
}

#[cfg(target_arch = "x86_64")]
/// A kernel's block of C (`rows` × `cols` at `c`, leading dimension `ld`) −= its sums,
/// `acc[j]` column j's vectors of `lanes` doubles (`full` rows in all). A whole block is
/// read, subtracted from and written back in the kernel's own vectors, straight from the
/// registers; a block cut short (the last rows of L21) goes through memory, row by row.
macro_rules! subtract_from_c {
    ($acc:expr, $c:expr, $ld:expr, $rows:expr, $cols:expr, $full:expr, $lanes:expr,
     $load:ident, $sub:ident, $store:ident) => {
        if $rows == $full {
            for (j, accj) in $acc.iter().enumerate().take($cols) {
                let cj = $c.add(j * $ld);
                for (v, &s) in accj.iter().enumerate() {
                    let p = cj.add($lanes * v);
                    $store(p, $sub($load(p), s));
                }
            }
        } else {
            let mut sums = [0.0f64; $full];
            for (j, accj) in $acc.iter().enumerate().take($cols) {
                for (v, &s) in accj.iter().enumerate() {
                    $store(sums.as_mut_ptr().add($lanes * v), s);
                }
                let cj = std::slice::from_raw_parts_mut($c.add(j * $ld), $rows);
                for (ci, s) in cj.iter_mut().zip(&sums) {
                    *ci -= s;
                }
            }
        }
    };
}

/// One step of k of `block_12x4`, in assembly: L21's 12 values `$a` bytes past `{a}` into
/// ymm12-14, and for each of U12's 4 values (`$b` bytes past `{b}`), broadcast into ymm15,
/// three FMAs into that column's sums (ymm0-2, 3-5, 6-8, 9-11). `$a` and `$b` are the step's
/// offsets within an unrolled pass (`MR` and `NR` doubles a step).
#[cfg(target_arch = "x86_64")]
macro_rules! step_12x4 {
    ($a:literal, $b:literal) => {
        concat!(
            "vmovupd ymm12, [{a} + ",
            $a,
            "]\n",
            "vmovupd ymm13, [{a} + ",
            $a,
            " + 32]\n",
            "vmovupd ymm14, [{a} + ",
            $a,
            " + 64]\n",
            "vbroadcastsd ymm15, qword ptr [{b} + ",
            $b,
            "]\n",
            "vfmadd231pd ymm0, ymm12, ymm15\n",
            "vfmadd231pd ymm1, ymm13, ymm15\n",
            "vfmadd231pd ymm2, ymm14, ymm15\n",
            "vbroadcastsd ymm15, qword ptr [{b} + ",
            $b,
            " + 8]\n",
            "vfmadd231pd ymm3, ymm12, ymm15\n",
            "vfmadd231pd ymm4, ymm13, ymm15\n",
            "vfmadd231pd ymm5, ymm14, ymm15\n",
            "vbroadcastsd ymm15, qword ptr [{b} + ",
            $b,
            " + 16]\n",
            "vfmadd231pd ymm6, ymm12, ymm15\n",
            "vfmadd231pd ymm7, ymm13, ymm15\n",
            "vfmadd231pd ymm8, ymm14, ymm15\n",
            "vbroadcastsd ymm15, qword ptr [{b} + ",
            $b,
            " + 24]\n",
            "vfmadd231pd ymm9, ymm12, ymm15\n",
            "vfmadd231pd ymm10, ymm13, ymm15\n",
            "vfmadd231pd ymm11, ymm14, ymm15",
        )
    };
}

/// The 12×4 sum over `kc` steps of k, L21's values at `a` (12 per step, `MR` apart), U12's
/// at `b` (4 per step, `NR` apart): `acc[j][v]` holds rows 4v..4v+4 of column j.
///
/// In assembly, so that the sums stay in registers: the 12 sums, 3 vectors of L21 and the
/// broadcast value of U12 take all 16 of AVX2's, and written in Rust, the compiler loaded the
/// next value of U12 before the last FMAs of the previous one and kept one sum on the stack,
/// a store and a load on its chain every step (33 Gflops on one Xeon core, against 49 for
/// OpenBLAS's Haswell kernel).
///
/// # Safety
/// `a` readable for `kc` steps of `MR` values less 12 past it, `b` for `kc` steps of `NR`
/// values; the CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_12x4(
    kc: usize,
    a: *const f64,
    b: *const f64,
) -> [[std::arch::x86_64::__m256d; 3]; NR_AVX2] {
    use std::arch::x86_64::*;
    let z = _mm256_setzero_pd();
    let [mut c00, mut c01, mut c02, mut c10, mut c11, mut c12] = [z; 6];
    let [mut c20, mut c21, mut c22, mut c30, mut c31, mut c32] = [z; 6];
    {
        std::arch::asm!(
            // Four steps of k per pass while four are left, then one at a time.
            "cmp {k}, 4",
            "jb 3f",
            "2:",
            step_12x4!(0, 0),
            step_12x4!(192, 64),
            step_12x4!(384, 128),
            step_12x4!(576, 192),
            "add {a}, {a_step4}",
            "add {b}, {b_step4}",
            "sub {k}, 4",
            "cmp {k}, 4",
            "jae 2b",
            "3:",
            "test {k}, {k}",
            "jz 5f",
            "4:",
            step_12x4!(0, 0),
            "add {a}, {a_step}",
            "add {b}, {b_step}",
            "dec {k}",
            "jnz 4b",
            "5:",
            a = inout(reg) a => _,
            b = inout(reg) b => _,
            k = inout(reg) kc => _,
            a_step = const MR * 8,
            b_step = const NR * 8,
            a_step4 = const 4 * MR * 8,
            b_step4 = const 4 * NR * 8,
            inout("ymm0") c00,
            inout("ymm1") c01,
            inout("ymm2") c02,
            inout("ymm3") c10,
            inout("ymm4") c11,
            inout("ymm5") c12,
            inout("ymm6") c20,
            inout("ymm7") c21,
            inout("ymm8") c22,
            inout("ymm9") c30,
            inout("ymm10") c31,
            inout("ymm11") c32,
            out("ymm12") _,
            out("ymm13") _,
            out("ymm14") _,
            out("ymm15") _,
            options(nostack, readonly),
        );
    }
    [
        [c00, c01, c02],
        [c10, c11, c12],
        [c20, c21, c22],
        [c30, c31, c32],
    ]
}

/// Rows and columns of the AVX2 kernel's register block.
#[cfg(target_arch = "x86_64")]
const MR_AVX2: usize = 12;
#[cfg(target_arch = "x86_64")]
const NR_AVX2: usize = 4;

/// As `kernel_avx512`, over the same packed block and slice, as four 12×4 register blocks:
/// per step of k three 4-double loads of L21 (half of a 24-row block's step), four values of
/// U12, twelve FMAs.
///
/// # Safety
/// As `kernel`; the CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel_avx2(blk: &Block) {
    use std::arch::x86_64::*;
    blk.prefetch_c();
    let (kc, a, b, c, ld) = (blk.kc, blk.a, blk.b, blk.c, blk.ld);
    let (mr, nr) = (blk.mr, blk.nr);
    for h in (0..mr).step_by(MR_AVX2) {
        let rows = MR_AVX2.min(mr - h);
        for g in (0..nr).step_by(NR_AVX2) {
            let cols = NR_AVX2.min(nr - g);
            let acc = block_12x4(kc, a.as_ptr().add(h), b.as_ptr().add(g));
            let c0 = c.add(g * ld + h);
            let (load, sub, store) = (_mm256_loadu_pd, _mm256_sub_pd, _mm256_storeu_pd);
            subtract_from_c!(acc, c0, ld, rows, cols, MR_AVX2, 4, load, sub, store);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn kernel_avx512(blk: &Block) {
    use std::arch::x86_64::*;
    blk.prefetch_c();
    let (kc, a, b, c, ld, mr, nr) = (blk.kc, blk.a, blk.b, blk.c, blk.ld, blk.mr, blk.nr);
    let mut acc = [[_mm512_setzero_pd(); 3]; NR];
    let (mut ap, mut bp) = (a.as_ptr(), b.as_ptr());
    for _ in 0..kc {
        let a0 = _mm512_loadu_pd(ap);
        let a1 = _mm512_loadu_pd(ap.add(8));
        let a2 = _mm512_loadu_pd(ap.add(16));
        for (j, accj) in acc.iter_mut().enumerate() {
            let bj = _mm512_set1_pd(*bp.add(j));
            accj[0] = _mm512_fmadd_pd(a0, bj, accj[0]);
            accj[1] = _mm512_fmadd_pd(a1, bj, accj[1]);
            accj[2] = _mm512_fmadd_pd(a2, bj, accj[2]);
        }
        ap = ap.add(MR);
        bp = bp.add(NR);
    }
    let (load, sub, store) = (_mm512_loadu_pd, _mm512_sub_pd, _mm512_storeu_pd);
    subtract_from_c!(acc, c, ld, mr, nr, MR, 8, load, sub, store);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(len: usize, seed: usize) -> Vec<f64> {
        (0..len)
            .map(|i| ((i * 31 + seed * 17) % 113) as f64 / 113.0 - 0.5)
            .collect()
    }

    /// C −= A·B the plain way, for the comparison.
    fn reference(
        rows: usize,
        k: usize,
        width: usize,
        l: &[f64],
        ld: usize,
        bc: &mut [f64],
        ldb: usize,
    ) {
        for j in 0..width {
            for p in 0..k {
                let b = bc[j * ldb + p];
                for i in 0..rows {
                    bc[j * ldb + k + i] -= l[p * ld + i] * b;
                }
            }
        }
    }

    #[test]
    fn the_choice_follows_the_kernel_the_user_the_blas_and_the_depth() {
        use Product::{Blas, Packed};
        // No kernel: the BLAS, whatever was asked.
        assert_eq!(choose(false, Some(Packed), true, 128), Some(Blas));
        assert_eq!(choose(false, None, false, 128), Some(Blas));
        // Told: as told, at any depth, with or without a BLAS.
        assert_eq!(choose(true, Some(Blas), false, 128), Some(Blas));
        assert_eq!(choose(true, Some(Packed), true, 384), Some(Packed));
        // No BLAS: this product at any depth.
        assert_eq!(choose(true, None, false, 384), Some(Packed));
        // Past the deepest measured NB: the BLAS; up to it: measure.
        assert_eq!(choose(true, None, true, MAX_MEASURED_K + 1), Some(Blas));
        assert_eq!(choose(true, None, true, MAX_MEASURED_K), None);
        assert_eq!(choose(true, None, true, 128), None);
    }

    #[test]
    fn the_ranks_agree_on_one_product_from_their_findings_added_up() {
        use Product::{Blas, Packed};
        let add = |fs: &[Finding]| {
            fs.iter().fold([0.0; 4], |mut sum, f| {
                for (s, v) in sum.iter_mut().zip(f.sums()) {
                    *s += v;
                }
                sum
            })
        };
        let timed = |mine, blas| Finding::Timed { mine, blas };
        // One rank that must run the BLAS (no kernel, or told) decides for all.
        let fs = [
            timed(1.0, 2.0),
            Finding::Decided(Blas),
            Finding::Decided(Packed),
        ];
        assert_eq!(Finding::agreed(add(&fs)), Blas);
        // A rank bound to this product (told, or no BLAS) outweighs timings.
        assert_eq!(
            Finding::agreed(add(&[timed(1.0, 0.5), Finding::Decided(Packed)])),
            Packed
        );
        // Timings are added up: one rank's BLAS 3% ahead does not outvote another's 5% behind.
        assert_eq!(
            Finding::agreed(add(&[timed(1.03, 1.0), timed(1.0, 1.05)])),
            Packed
        );
        // The BLAS is kept only where it is more than MARGIN faster over all ranks.
        assert_eq!(
            Finding::agreed(add(&[timed(1.01, 1.0), timed(1.01, 1.0)])),
            Packed
        );
        assert_eq!(
            Finding::agreed(add(&[timed(1.05, 1.0), timed(1.04, 1.0)])),
            Blas
        );
    }

    /// The result names `Kernel::chosen()` (`Product::name`): every packing a run makes is
    /// multiplied by that kernel.
    #[test]
    fn a_run_s_packings_use_the_kernel_its_result_names() {
        match Kernel::chosen() {
            Some(k) => {
                assert_eq!(PackedL21::default().kernel, k);
                assert!(Product::Packed.name().contains(k.name()));
            }
            None => assert!(!available()),
        }
    }

    #[test]
    fn packed_products_match_the_plain_sum_at_every_edge() {
        let kernels: Vec<Kernel> = Kernel::ALL.into_iter().filter(|k| k.available()).collect();
        if kernels.is_empty() {
            eprintln!("no AVX-512F and no AVX2: the packed product is not offered here");
            return;
        }
        for kernel in kernels {
            every_edge(kernel);
        }
    }

    fn every_edge(kernel: Kernel) {
        // Rows, k and widths that end mid-block, mid-slice, and k past one KC pass.
        for &(rows, k, width, threads) in &[
            (1, 1, 1, 1),
            (23, 5, 7, 2),
            // k past whole groups of four steps by three (the AVX2 kernel's unrolling).
            (40, 7, 9, 1),
            (24, 128, 8, 1),
            (500, 128, 37, 2),
            (97, 130, 17, 3),
            (1000, 300, 65, 2),
            (100, 500, 9, 2),
            // More threads than row blocks.
            (50, 16, 9, 5),
        ] {
            let ld = rows + 3;
            let l = values(ld * k, 1);
            let ldb = k + rows + 2;
            let start = values(ldb * width, 2);
            let mut want = start.clone();
            reference(rows, k, width, &l, ld, &mut want, ldb);
            // The buffer first holds a larger packing, as a panel before this one left it.
            let mut packed = PackedL21::for_kernel(kernel);
            let (big_rows, big_k) = (rows + 30, k + 3);
            let big = values((big_rows + 1) * big_k, 3);
            pack_and_update(
                &mut packed,
                big_rows,
                big_k,
                &big,
                big_rows + 1,
                Columns::Below { bc: &mut [], ld: 0 },
                0,
                1,
            );
            let mut got = start.clone();
            pack_and_update(
                &mut packed,
                rows,
                k,
                &l,
                ld,
                Columns::Below {
                    bc: &mut got,
                    ld: ldb,
                },
                width,
                threads,
            );
            let mut again = got.clone();
            // The packing, reused on the same columns, applies the product once more.
            gemm_minus(
                &packed,
                Columns::Below {
                    bc: &mut again,
                    ld: ldb,
                },
                width,
                threads,
            );
            let mut twice = want.clone();
            reference(rows, k, width, &l, ld, &mut twice, ldb);

            // U12 held apart from C (several process rows), both with padding of their own,
            // the results put back in `bc`'s layout for the comparison.
            let (ldu, ldc) = (k + 1, rows + 2);
            let mut u = vec![7.0; ldu * width];
            let mut c = vec![9.0; ldc * width];
            for j in 0..width {
                let col = &start[j * ldb..];
                u[j * ldu..j * ldu + k].copy_from_slice(&col[..k]);
                c[j * ldc..j * ldc + rows].copy_from_slice(&col[k..k + rows]);
            }
            let u_before = u.clone();
            let mut apart = Vec::new();
            for pass in 0..2 {
                let cols = Columns::Apart {
                    b: &u,
                    ldb: ldu,
                    c: &mut c,
                    ldc,
                };
                if pass == 0 {
                    pack_and_update(&mut packed, rows, k, &l, ld, cols, width, threads);
                } else {
                    gemm_minus(&packed, cols, width, threads);
                }
                let mut out = start.clone();
                for j in 0..width {
                    out[j * ldb + k..j * ldb + k + rows]
                        .copy_from_slice(&c[j * ldc..j * ldc + rows]);
                    assert!(
                        c[j * ldc + rows..(j + 1) * ldc].iter().all(|&v| v == 9.0),
                        "{kernel:?} {rows}x{k}x{width}: C's padding touched in column {j}"
                    );
                }
                apart.push(out);
            }
            assert_eq!(
                u, u_before,
                "{kernel:?} {rows}x{k}x{width}: U12 held apart was written"
            );
            let cases = [
                (&got, &want),
                (&again, &twice),
                (&apart[0], &want),
                (&apart[1], &twice),
            ];
            for (case, (got, want)) in cases.into_iter().enumerate() {
                for (i, (g, w)) in got.iter().zip(want.iter()).enumerate() {
                    let (j, r) = (i / ldb, i % ldb);
                    if r < k || r >= k + rows {
                        assert_eq!(
                            g.to_bits(),
                            w.to_bits(),
                            "{kernel:?} {rows}x{k}x{width}: B or padding touched at {r},{j}"
                        );
                    } else {
                        assert!(
                            (g - w).abs() <= 1e-12 * k as f64,
                            "{kernel:?} {rows}x{k}x{width} pass {case}: {g} against {w} at {r},{j}"
                        );
                    }
                }
            }
        }
    }
}
