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
//! x86-64: AVX-512 VNNI (with VL) or AVX-VNNI where the CPU has them (one `vpdpbusd` per
//! block), else AVX2 (`maddubs` + `madd`), four blocks' sums at a time into f64 lanes; four
//! tokens of a prompt share each weight block's load and unpacking. A decode step's matrix
//! is read in groups of eight interleaved rows ([`group`], [`rows_grouped`]): one broadcast
//! of four activation bytes feeds eight rows' products, and each row's terms are summed in
//! the same lanes and order as the row alone, so the bits do not change. aarch64 (Apple
//! silicon): NEON `sdot` (FEAT_DotProd) or widening products, and for a prompt's tokens
//! `smmla` (FEAT_I8MM), two rows by two tokens. Elsewhere a portable loop. The kernel is chosen at run time per
//! CPU ([`Kernel::chosen`]; `TBBENCH_QDOT` names another, to compare like with like) and the
//! result file records it. All give bit-identical block terms (multiply, then add: no fused
//! multiply-add); only the order in which the terms are added can differ between the x86
//! kernels and the others. The NEON kernel is tested under qemu-aarch64 in CI.

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
    /// Per block: the scale (an f16 value), held as f64 so the x86 kernels load it without a
    /// conversion (a shuffle-port instruction on Intel cores).
    pub d: Vec<f64>,
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
        assert!(
            x.len().is_multiple_of(QK),
            "activations come in whole blocks"
        );
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
            self.d.push(to_f16(d) as f64);
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

/// The kernels these products run on; the decode takes the best this CPU has
/// ([`Kernel::chosen`]). All give bit-identical block terms; only the order in which the terms
/// are added differs between the portable/NEON kernels and the x86 ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Plain Rust, vectorized by the compiler: x86-64 without AVX2, any other CPU.
    Portable,
    /// x86-64 AVX2: `maddubs` and `madd` byte products.
    Avx2,
    /// x86-64 AVX-VNNI (Alder Lake and later cores without AVX-512): one `vpdpbusd`.
    AvxVnni,
    /// x86-64 AVX-512 VNNI with VL (Ice Lake, Sapphire Rapids, Zen 4): `vpdpbusd` on 256 bits.
    Avx512Vnni,
    /// aarch64 baseline NEON: `smull` widening byte products.
    Neon,
    /// aarch64 with FEAT_DotProd (Apple M1 and later, Graviton 2 and later): `sdot`.
    NeonDot,
    /// aarch64 with FEAT_I8MM as well (Apple M2 and later): a prompt's tokens by `smmla`, two
    /// rows by two tokens per instruction; one token by `sdot`.
    NeonI8mm,
}

/// Names a kernel to use instead of the best one, for comparing like with like (e.g. the
/// AVX2 kernel against a llama.cpp built for AVX2 only).
pub const ENV_KERNEL: &str = "TBBENCH_QDOT";

impl Kernel {
    pub const ALL: [Kernel; 7] = [
        Kernel::Portable,
        Kernel::Avx2,
        Kernel::AvxVnni,
        Kernel::Avx512Vnni,
        Kernel::Neon,
        Kernel::NeonDot,
        Kernel::NeonI8mm,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Portable => "portable",
            Kernel::Avx2 => "avx2",
            Kernel::AvxVnni => "avx-vnni",
            Kernel::Avx512Vnni => "avx512-vnni",
            Kernel::Neon => "neon",
            Kernel::NeonDot => "neon-dotprod",
            Kernel::NeonI8mm => "neon-i8mm",
        }
    }

    /// What the result file records: the name and the instructions.
    pub fn describe(self) -> &'static str {
        match self {
            Kernel::Portable => "portable (plain Rust, vectorized by the compiler)",
            Kernel::Avx2 => "avx2 (x86-64 AVX2: maddubs/madd byte products)",
            Kernel::AvxVnni => "avx-vnni (x86-64 AVX-VNNI: vpdpbusd byte products)",
            Kernel::Avx512Vnni => {
                "avx512-vnni (x86-64 AVX-512 VNNI+VL: vpdpbusd byte products, 256-bit)"
            }
            Kernel::Neon => "neon (aarch64 baseline: smull byte products)",
            Kernel::NeonDot => "neon-dotprod (aarch64 FEAT_DotProd: sdot byte products)",
            Kernel::NeonI8mm => {
                "neon-i8mm (aarch64 FEAT_I8MM: smmla 2x2 byte products for prompts, sdot for steps)"
            }
        }
    }

    /// The x86-64 kernels: the same lanes and order among themselves, a different order of
    /// adding the block terms from the others.
    pub fn is_x86(self) -> bool {
        matches!(self, Kernel::Avx2 | Kernel::AvxVnni | Kernel::Avx512Vnni)
    }

    /// Whether this CPU runs the kernel.
    pub fn available(self) -> bool {
        match self {
            Kernel::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => x86::avx2::available(),
            #[cfg(target_arch = "x86_64")]
            Kernel::AvxVnni => x86::avxvnni::available(),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni => x86::avx512vnni::available(),
            #[cfg(target_arch = "aarch64")]
            Kernel::Neon => true,
            #[cfg(target_arch = "aarch64")]
            Kernel::NeonDot => std::arch::is_aarch64_feature_detected!("dotprod"),
            #[cfg(target_arch = "aarch64")]
            Kernel::NeonI8mm => {
                std::arch::is_aarch64_feature_detected!("dotprod")
                    && std::arch::is_aarch64_feature_detected!("i8mm")
            }
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The fastest kernel this CPU has.
    pub fn best() -> Kernel {
        [
            Kernel::Avx512Vnni,
            Kernel::AvxVnni,
            Kernel::Avx2,
            Kernel::NeonI8mm,
            Kernel::NeonDot,
            Kernel::Neon,
        ]
        .into_iter()
        .find(|k| k.available())
        .unwrap_or(Kernel::Portable)
    }

    /// The kernel [`row`] and [`row_many`] run: the best, or the one `TBBENCH_QDOT` names where
    /// this CPU has it (else a warning, once, and the best). Decided once per process.
    pub fn chosen() -> Kernel {
        static CHOSEN: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
        *CHOSEN.get_or_init(|| {
            let Ok(want) = std::env::var(ENV_KERNEL) else {
                return Kernel::best();
            };
            match Kernel::ALL.into_iter().find(|k| k.name() == want.trim()) {
                Some(k) if k.available() => k,
                found => {
                    let names: Vec<&str> = Kernel::ALL
                        .iter()
                        .filter(|k| k.available())
                        .map(|k| k.name())
                        .collect();
                    eprintln!(
                        "tbbench: {ENV_KERNEL}={want}: {}; this CPU has {}; using {}",
                        if found.is_some() {
                            "this CPU lacks that kernel"
                        } else {
                            "no such kernel"
                        },
                        names.join(", "),
                        Kernel::best().name()
                    );
                    Kernel::best()
                }
            }
        })
    }
}

/// The kernel the decode runs on this CPU, as the result file records it.
pub fn kernel() -> &'static str {
    Kernel::chosen().describe()
}

/// The SIMD kernels read by pointer: these hold every read of `rows` weight rows (laid out
/// one after another) and their activations in bounds (cheap next to a row).
fn check_lengths<'a>(
    format: Format,
    q: &[u8],
    d: &[f32],
    m: &[f32],
    rows: usize,
    acts: impl IntoIterator<Item = &'a Q8Activation>,
) {
    let nb = d.len() / rows.max(1);
    assert_eq!(d.len(), rows * nb, "scales for {rows} rows of {nb} blocks");
    for a in acts {
        assert!(
            a.blocks() == nb && a.q.len() == nb * QK && a.qsum.len() == nb && a.dsum.len() == nb,
            "activation of {} blocks for a row of {nb}",
            a.blocks()
        );
    }
    assert_eq!(
        q.len(),
        d.len() * format.quant_bytes(),
        "quants for {} blocks",
        d.len()
    );
    assert!(
        format != Format::Q4_1 || m.len() == d.len(),
        "{} Q4_1 minimums for {} blocks",
        m.len(),
        d.len()
    );
}

/// Rows `r` of a block matrix laid out one row after another (`nb` blocks a row): their
/// quants, scales and, for Q4_1, minimums (other formats' `m` is passed through).
fn rows_of<'a>(
    format: Format,
    q: &'a [u8],
    d: &'a [f32],
    m: &'a [f32],
    nb: usize,
    r: std::ops::Range<usize>,
) -> (&'a [u8], &'a [f32], &'a [f32]) {
    let qb = nb * format.quant_bytes();
    let m = if format == Format::Q4_1 {
        &m[r.start * nb..r.end * nb]
    } else {
        m
    };
    (
        &q[r.start * qb..r.end * qb],
        &d[r.start * nb..r.end * nb],
        m,
    )
}

/// `$f` of kernel `$k`'s x86 module at format `$format` (its first generic argument, any
/// further ones after it), called with `$args`: `Some` of its result, `None` for a kernel
/// that is not an x86 one. The callers check that the CPU has the kernel and that every
/// length matches the block count.
#[cfg(target_arch = "x86_64")]
macro_rules! on_x86 {
    ($k:expr, $format:expr, $f:ident [$($n:tt)*] ($($args:expr),*)) => {{
        macro_rules! by_format {
            ($module:ident) => {
                // SAFETY: see above: the kernel is one this CPU has, the lengths are checked.
                unsafe {
                    match $format {
                        Format::Q8_0 => x86::$module::$f::<{ x86::Q8_0 } $($n)*>($($args),*),
                        Format::Q4_0 => x86::$module::$f::<{ x86::Q4_0 } $($n)*>($($args),*),
                        Format::Q4_1 => x86::$module::$f::<{ x86::Q4_1 } $($n)*>($($args),*),
                    }
                }
            };
        }
        match $k {
            Kernel::Avx512Vnni => Some(by_format!(avx512vnni)),
            Kernel::AvxVnni => Some(by_format!(avxvnni)),
            Kernel::Avx2 => Some(by_format!(avx2)),
            _ => None,
        }
    }};
}

/// One weight row (its blocks' quants, scales and, for Q4_1, minimums) times `a`, whose
/// blocks line up with the row's, on the chosen kernel.
pub fn row(format: Format, q: &[u8], d: &[f32], m: &[f32], a: &Q8Activation) -> f64 {
    row_with(Kernel::chosen(), format, q, d, m, a)
}

/// `out.len()` weight rows laid out one after another (quants, scales and, for Q4_1,
/// minimums; `a.blocks()` blocks each) times `a`, into `out` as f32: each value bit for bit
/// what [`row`] gives for its row, the kernel chosen and the lengths checked once for all of
/// them instead of once per row (a decode step's rows are short: 18 blocks in SmolLM2).
pub fn rows(format: Format, q: &[u8], d: &[f32], m: &[f32], a: &Q8Activation, out: &mut [f32]) {
    check_lengths(format, q, d, m, out.len(), [a]);
    let k = Kernel::chosen();
    #[cfg(target_arch = "x86_64")]
    if on_x86!(k, format, matvec[](q, d, m, a, &mut *out)).is_some() {
        return;
    }
    for (r, o) in out.iter_mut().enumerate() {
        let (rq, rd, rm) = rows_of(format, q, d, m, a.blocks(), r..r + 1);
        *o = row_with(k, format, rq, rd, rm, a) as f32;
    }
}

/// One weight row times each of `acts` (a tile of a prompt's tokens), into `out` as f32:
/// each value bit for bit what [`row`] gives for that activation, four tokens at a time
/// where the kernel has a four-token form, the kernel chosen once for the tile.
pub fn row_many(
    format: Format,
    q: &[u8],
    d: &[f32],
    m: &[f32],
    acts: &[Q8Activation],
    out: &mut [f32],
) {
    assert_eq!(acts.len(), out.len(), "one output per activation");
    check_lengths(format, q, d, m, 1, acts);
    let k = Kernel::chosen();
    #[cfg(target_arch = "x86_64")]
    if on_x86!(k, format, tile[](q, d, m, acts, &mut *out)).is_some() {
        return;
    }
    for (a, o) in acts.iter().zip(out) {
        *o = row_with(k, format, q, d, m, a) as f32;
    }
}

/// `rows` weight rows laid out one after another times each of `acts` (a tile of a prompt's
/// tokens), into `out` row by row (`out[r * acts.len() + t]`) as f32: each value bit for bit
/// what [`row`] gives. Two rows by two tokens at a time where the kernel multiplies 2x2
/// blocks of bytes (`neon-i8mm`), else row by row as [`row_many`].
pub fn rows_many(
    format: Format,
    q: &[u8],
    d: &[f32],
    m: &[f32],
    rows: usize,
    acts: &[Q8Activation],
    out: &mut [f32],
) {
    rows_many_with(Kernel::chosen(), format, q, d, m, rows, acts, out)
}

/// [`rows_many`] on kernel `k` (row by row on the portable kernel where this CPU lacks `k`):
/// for tests and benches.
#[allow(clippy::too_many_arguments)]
pub fn rows_many_with(
    k: Kernel,
    format: Format,
    q: &[u8],
    d: &[f32],
    m: &[f32],
    rows: usize,
    acts: &[Q8Activation],
    out: &mut [f32],
) {
    let n = acts.len();
    assert_eq!(out.len(), rows * n, "one output per row and activation");
    check_lengths(format, q, d, m, rows, acts);
    #[cfg(target_arch = "aarch64")]
    if k == Kernel::NeonI8mm && k.available() {
        // SAFETY: the CPU has i8mm and dotprod (available), the lengths are checked above.
        unsafe { neon::rows_many_i8mm(format, q, d, m, rows, acts, out) };
        return;
    }
    let nb = d.len() / rows.max(1);
    for (r, o) in out.chunks_exact_mut(n.max(1)).take(rows).enumerate() {
        let (rq, rd, mr) = rows_of(format, q, d, m, nb, r..r + 1);
        #[cfg(target_arch = "x86_64")]
        if k.available() && on_x86!(k, format, tile[](rq, rd, mr, acts, &mut *o)).is_some() {
            continue;
        }
        for (a, o) in acts.iter().zip(o) {
            *o = row_with(k, format, rq, rd, mr, a) as f32;
        }
    }
}

/// Rows per group in the interleaved layout ([`group`]).
pub const GROUP: usize = 8;

/// Whether the chosen kernel has a product over interleaved rows ([`rows_grouped`]): the x86
/// ones. Elsewhere a matrix keeps its rows one after another.
pub fn groups_pay() -> bool {
    Kernel::chosen().is_x86()
}

/// `rows` weight rows of `nb` blocks (laid out one after another: quants, scales and, for
/// Q4_1, minimums) rearranged so that every [`GROUP`] rows share their blocks: group g's
/// block b holds, for each 4 bytes of quants, those 4 bytes of each of its 8 rows in turn,
/// then (in the scales and minimums) the 8 rows' values. The x86 kernels then multiply 8
/// rows with one broadcast of 4 activation bytes. Rows past the last whole group stay as
/// they were, after the groups. Same size as before.
pub fn group(
    format: Format,
    q: &[u8],
    d: &[f32],
    m: &[f32],
    rows: usize,
) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
    check_lengths(format, q, d, m, rows, []);
    let nb = d.len() / rows.max(1);
    let qb = format.quant_bytes();
    let grouped = rows / GROUP * GROUP;
    let (mut gq, mut gd, mut gm) = (
        Vec::with_capacity(q.len()),
        Vec::with_capacity(d.len()),
        Vec::with_capacity(m.len()),
    );
    for g0 in (0..grouped).step_by(GROUP) {
        for b in 0..nb {
            for k in (0..qb).step_by(4) {
                for r in g0..g0 + GROUP {
                    let at = (r * nb + b) * qb + k;
                    gq.extend_from_slice(&q[at..at + 4]);
                }
            }
            gd.extend((g0..g0 + GROUP).map(|r| d[r * nb + b]));
            if format == Format::Q4_1 {
                gm.extend((g0..g0 + GROUP).map(|r| m[r * nb + b]));
            }
        }
    }
    gq.extend_from_slice(&q[grouped * nb * qb..]);
    gd.extend_from_slice(&d[grouped * nb..]);
    if format == Format::Q4_1 {
        gm.extend_from_slice(&m[grouped * nb..]);
    }
    (gq, gd, gm)
}

/// Whole groups of [`group`]'s layout (their quants, scales and, for Q4_1, minimums; `nb`
/// blocks a row) put back into rows one after another, into the `out` buffers (resized to
/// fit): for products that take one row at a time (a prompt's tiles).
pub fn ungroup(
    format: Format,
    q: &[u8],
    d: &[f32],
    m: &[f32],
    nb: usize,
    out: (&mut Vec<u8>, &mut Vec<f32>, &mut Vec<f32>),
) {
    let qb = format.quant_bytes();
    let (oq, od, om) = out;
    oq.resize(q.len(), 0);
    od.resize(d.len(), 0.0);
    om.resize(m.len(), 0.0);
    let at = |g: usize, b: usize| g * nb + b;
    for g in 0..d.len() / (GROUP * nb).max(1) {
        for b in 0..nb {
            for k in (0..qb).step_by(4) {
                for r in 0..GROUP {
                    let from = at(g, b) * GROUP * qb + k * GROUP + 4 * r;
                    let to = (at(g * GROUP + r, 0) + b) * qb + k;
                    oq[to..to + 4].copy_from_slice(&q[from..from + 4]);
                }
            }
            for r in 0..GROUP {
                od[at(g * GROUP + r, b)] = d[at(g, b) * GROUP + r];
                if format == Format::Q4_1 {
                    om[at(g * GROUP + r, b)] = m[at(g, b) * GROUP + r];
                }
            }
        }
    }
}

/// [`rows`] over whole groups of [`group`]'s layout (`out.len()` a multiple of [`GROUP`]):
/// each value bit for bit what [`row`] gives for its row. Kernels without a grouped form put
/// each group back into rows first.
pub fn rows_grouped(
    format: Format,
    q: &[u8],
    d: &[f32],
    m: &[f32],
    a: &Q8Activation,
    out: &mut [f32],
) {
    rows_grouped_with(Kernel::chosen(), format, q, d, m, a, out)
}

/// [`rows_grouped`] on kernel `k` (the portable one where this CPU lacks `k`): for tests and
/// benches.
pub fn rows_grouped_with(
    k: Kernel,
    format: Format,
    q: &[u8],
    d: &[f32],
    m: &[f32],
    a: &Q8Activation,
    out: &mut [f32],
) {
    assert!(
        out.len().is_multiple_of(GROUP),
        "whole groups of {GROUP} rows"
    );
    check_lengths(format, q, d, m, out.len(), [a]);
    #[cfg(target_arch = "x86_64")]
    if k.available() && on_x86!(k, format, matvec_groups[](q, d, m, a, &mut *out)).is_some() {
        return;
    }
    let nb = a.blocks();
    let (mut rq, mut rd, mut rm) = (Vec::new(), Vec::new(), Vec::new());
    for (g, o) in out.chunks_exact_mut(GROUP).enumerate() {
        let (gq, gd, gm) = rows_of(format, q, d, m, nb, g * GROUP..(g + 1) * GROUP);
        ungroup(format, gq, gd, gm, nb, (&mut rq, &mut rd, &mut rm));
        for (r, o) in o.iter_mut().enumerate() {
            let (oq, od, om) = rows_of(format, &rq, &rd, &rm, nb, r..r + 1);
            *o = row_with(k, format, oq, od, om, a) as f32;
        }
    }
}

/// [`row`] on kernel `k` (the portable one where this CPU lacks `k`): for tests and benches.
pub fn row_with(
    k: Kernel,
    format: Format,
    q: &[u8],
    d: &[f32],
    m: &[f32],
    a: &Q8Activation,
) -> f64 {
    check_lengths(format, q, d, m, 1, [a]);
    if !k.available() {
        return portable::row(format, q, d, m, a);
    }
    #[cfg(target_arch = "x86_64")]
    if let Some([v]) = on_x86!(k, format, rows[, 1](q, d, m, [a])) {
        return v;
    }
    #[cfg(target_arch = "aarch64")]
    match k {
        // SAFETY: NEON is part of every aarch64 target, and the CPU has dotprod where
        // NeonDot is available (checked above); the lengths are checked above.
        Kernel::Neon => return unsafe { neon::row(format, q, d, m, a) },
        Kernel::NeonDot | Kernel::NeonI8mm => return unsafe { neon::row_dot(format, q, d, m, a) },
        _ => {}
    }
    portable::row(format, q, d, m, a)
}

/// One weight row times four activations (four tokens of a prompt) on kernel `k`: each
/// result is bit for bit what [`row_with`] gives for that activation; the x86 kernels load
/// and unpack each weight block once for the four, so a batch of tokens costs less than its
/// tokens one at a time.
pub fn row4_with(
    k: Kernel,
    format: Format,
    q: &[u8],
    d: &[f32],
    m: &[f32],
    a: [&Q8Activation; 4],
) -> [f64; 4] {
    check_lengths(format, q, d, m, 1, a);
    #[cfg(target_arch = "x86_64")]
    if k.available() {
        if let Some(v) = on_x86!(k, format, rows[, 4](q, d, m, a)) {
            return v;
        }
    }
    a.map(|x| row_with(k, format, q, d, m, x))
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
            let scale = *dw as f64 * a.d[b];
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

/// x86-64: one kernel body, built three times for the byte product each CPU does best:
/// AVX2's `maddubs` + `madd` (two instructions per block), and the single `vpdpbusd` of
/// AVX-512 VNNI (with AVX-512 VL for 256-bit registers) or of AVX-VNNI. The block's integer
/// sum is exact in all three, so all give bit-identical results.
#[cfg(target_arch = "x86_64")]
mod x86 {
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
                let bcast = |at: usize| {
                    _mm256_set1_epi32(std::ptr::read_unaligned(x.add(at) as *const i32))
                };
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
                let (xq, xd, xs, xm) =
                    (a.q.as_ptr(), a.d.as_ptr(), a.qsum.as_ptr(), a.dsum.as_ptr());
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
}

/// Apple silicon (and any aarch64): baseline NEON, widening byte products (`smull`) summed
/// pairwise into i32 lanes, or where the CPU has FEAT_DotProd (every Apple M-series core)
/// `sdot`, four byte products into each i32 lane in one instruction; then the block terms in
/// f64 in row order, as the portable kernel. Both sums are exact, so both kernels give the
/// portable kernel's bits.
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
        assert_eq!(a.d[0], to_f16(amax / 127.0) as f64);
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
                let four_refs = [&acts[0], &acts[1], &acts[2], &acts[3]];
                // Every kernel this CPU has: four at once equal one at a time, a tile equals
                // its rows, and the x86 kernels (same lanes, same order) equal each other.
                let first_x86 = std::cell::Cell::new(None::<[f64; 4]>);
                for k in Kernel::ALL.into_iter().filter(|k| k.available()) {
                    let four = row4_with(k, format, &q, &d, &m, four_refs);
                    for (t, a) in acts.iter().enumerate() {
                        let one = row_with(k, format, &q, &d, &m, a);
                        assert_eq!(
                            four[t].to_bits(),
                            one.to_bits(),
                            "{k:?} {format:?} {nb} blocks, activation {t}"
                        );
                    }
                    if k.is_x86() {
                        match first_x86.get() {
                            None => first_x86.set(Some(four)),
                            Some(other) => assert_eq!(
                                other.map(f64::to_bits),
                                four.map(f64::to_bits),
                                "{k:?} {format:?} {nb} blocks"
                            ),
                        }
                    }
                }
                let mut tile = [0f32; 4];
                row_many(format, &q, &d, &m, &acts[..3], &mut tile[..3]);
                row_many(format, &q, &d, &m, &acts, &mut tile);
                for (t, a) in acts.iter().enumerate() {
                    assert_eq!(tile[t], row(format, &q, &d, &m, a) as f32);
                }
            }
        }
    }

    /// Test weights: `rows` rows of `nb` blocks in `format` (Q8_0's awkward −128 in a middle
    /// row), with scales and, for Q4_1, minimums, laid out one row after another.
    struct TestRows {
        format: Format,
        nb: usize,
        q: Vec<u8>,
        d: Vec<f32>,
        m: Vec<f32>,
    }

    impl TestRows {
        fn new(format: Format, rows: usize, nb: usize, seed: u32) -> TestRows {
            let qb = format.quant_bytes();
            let mut q = noise(rows * nb * qb, seed);
            if format == Format::Q8_0 {
                q[qb * nb * (rows / 2) + 4] = 0x80;
            }
            let d = (0..rows * nb).map(|b| 0.01 + b as f32 * 1e-3).collect();
            let m = if format == Format::Q4_1 {
                (0..rows * nb).map(|b| -0.3 + b as f32 * 1e-2).collect()
            } else {
                Vec::new()
            };
            TestRows {
                format,
                nb,
                q,
                d,
                m,
            }
        }

        /// Rows `r` as the kernels take them: quants, scales, minimums.
        fn slice(&self, r: std::ops::Range<usize>) -> (&[u8], &[f32], &[f32]) {
            rows_of(self.format, &self.q, &self.d, &self.m, self.nb, r)
        }

        /// Row `r` alone times `a` on kernel `k`, as the f32 a product stores.
        fn one(&self, k: Kernel, r: usize, a: &Q8Activation) -> u32 {
            let (q, d, m) = self.slice(r..r + 1);
            (row_with(k, self.format, q, d, m, a) as f32).to_bits()
        }
    }

    /// Activation `t` of a test's tokens, `nb` blocks.
    fn activation(nb: usize, t: usize) -> Q8Activation {
        let x: Vec<f32> = (0..nb * QK)
            .map(|i| (((i + 7 * t) * 29 % 31) as f32 - 15.0) / (3.0 + t as f32))
            .collect();
        let mut a = Q8Activation::default();
        a.quantize(&x);
        a
    }

    const FORMATS: [Format; 3] = [Format::Q4_0, Format::Q4_1, Format::Q8_0];

    #[test]
    fn a_matrix_of_rows_equals_each_row_alone() {
        for format in FORMATS {
            for nb in [1usize, 3, 4, 5, 18] {
                let w = TestRows::new(format, 3, nb, 7 + nb as u32);
                let a = activation(nb, 0);
                let mut out = vec![0f32; 3];
                super::rows(format, &w.q, &w.d, &w.m, &a, &mut out);
                for (r, o) in out.iter().enumerate() {
                    let one = w.one(Kernel::chosen(), r, &a);
                    assert_eq!(o.to_bits(), one, "{format:?} {nb} blocks, row {r}");
                }
            }
        }
    }

    /// Several rows times a tile of tokens give each row's product for each token bit for bit,
    /// on every kernel this CPU has (under qemu-aarch64 in CI: neon-i8mm's 2x2 blocks with odd
    /// row and token counts left over).
    #[test]
    fn rows_times_tokens_equal_each_row_and_token_alone() {
        let nb = 5;
        let acts: Vec<Q8Activation> = (0..5).map(|t| activation(nb, t)).collect();
        for format in FORMATS {
            let w = TestRows::new(format, 5, nb, 19);
            for k in Kernel::ALL.into_iter().filter(|k| k.available()) {
                for (nr, nt) in [(1, 1), (2, 2), (2, 5), (5, 4), (5, 5), (4, 1)] {
                    let (q, d, m) = w.slice(0..nr);
                    let mut out = vec![0f32; nr * nt];
                    rows_many_with(k, format, q, d, m, nr, &acts[..nt], &mut out);
                    for r in 0..nr {
                        for (t, a) in acts[..nt].iter().enumerate() {
                            assert_eq!(
                                out[r * nt + t].to_bits(),
                                w.one(k, r, a),
                                "{k:?} {format:?} {nr}x{nt}: row {r}, token {t}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// CI names the kernels its machine (or emulator) must have, so a kernel whose feature
    /// went undetected fails here instead of being skipped by the tests above.
    #[test]
    fn the_kernels_ci_expects_are_available() {
        let Ok(want) = std::env::var("TBBENCH_EXPECT_KERNELS") else {
            return;
        };
        for name in want.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let k = Kernel::ALL.into_iter().find(|k| k.name() == name);
            assert!(
                k.is_some_and(|k| k.available()),
                "kernel {name} is not available here"
            );
        }
    }

    /// Rows interleaved in groups of eight give each row's product bit for bit, on every
    /// kernel this CPU has, and put back into rows they are the rows they were.
    #[test]
    fn grouped_rows_equal_each_row_alone() {
        for format in FORMATS {
            for nb in [1usize, 3, 4, 5, 18] {
                // Two whole groups and three rows past them.
                let (rows, whole) = (2 * GROUP + 3, 2 * GROUP);
                let w = TestRows::new(format, rows, nb, 11 + nb as u32);
                let a = activation(nb, 1);
                let (q, d, m) = group(format, &w.q, &w.d, &w.m, rows);
                let g = TestRows {
                    format,
                    nb,
                    q,
                    d,
                    m,
                };
                assert_eq!(
                    (g.q.len(), g.d.len(), g.m.len()),
                    (w.q.len(), w.d.len(), w.m.len())
                );
                // Past the groups, the rows as they were.
                assert_eq!(g.slice(whole..rows), w.slice(whole..rows));
                // The second group, and both, put back into rows: the rows they came from.
                let (mut rq, mut rd, mut rm) = (Vec::new(), Vec::new(), Vec::new());
                for from in [GROUP, 0] {
                    let (q, d, m) = g.slice(from..whole);
                    ungroup(format, q, d, m, nb, (&mut rq, &mut rd, &mut rm));
                    assert_eq!((&rq[..], &rd[..], &rm[..]), w.slice(from..whole));
                }
                for k in Kernel::ALL.into_iter().filter(|k| k.available()) {
                    let mut out = vec![0f32; whole];
                    let (q, d, m) = g.slice(0..whole);
                    rows_grouped_with(k, format, q, d, m, &a, &mut out);
                    for (r, o) in out.iter().enumerate() {
                        let one = w.one(k, r, &a);
                        assert_eq!(o.to_bits(), one, "{k:?} {format:?} {nb} blocks, row {r}");
                    }
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
                    exact += d[b] as f64 * a.d[b] * s as f64;
                    if format == Format::Q4_1 {
                        exact += m[b] as f64 * a.dsum[b];
                    }
                }
                let plain = portable::row(format, &q, &d, &m, &a);
                for k in Kernel::ALL.into_iter().filter(|k| k.available()) {
                    let got = row_with(k, format, &q, &d, &m, &a);
                    if nb < 4 || !k.is_x86() {
                        // Without 4-block lanes (and always on NEON) the terms are added in
                        // row order, as the portable kernel adds them.
                        assert_eq!(got.to_bits(), plain.to_bits(), "{k:?} {format:?} {nb}");
                    }
                    assert!(
                        (got - exact).abs() <= 1e-12 * exact.abs().max(1.0),
                        "{k:?} {format:?} {nb} blocks: {got} vs {exact}"
                    );
                }
            }
        }
    }
}
