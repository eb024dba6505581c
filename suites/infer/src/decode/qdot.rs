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
pub mod portable;

/// x86-64: one kernel body, built three times for the byte product each CPU does best:
/// AVX2's `maddubs` + `madd` (two instructions per block), and the single `vpdpbusd` of
/// AVX-512 VNNI (with AVX-512 VL for 256-bit registers) or of AVX-VNNI. The block's integer
/// sum is exact in all three, so all give bit-identical results.
#[cfg(target_arch = "x86_64")]
mod x86;

/// Apple silicon (and any aarch64): baseline NEON, widening byte products (`smull`) summed
/// pairwise into i32 lanes, or where the CPU has FEAT_DotProd (every Apple M-series core)
/// `sdot`, four byte products into each i32 lane in one instruction; then the block terms in
/// f64 in row order, as the portable kernel. Both sums are exact, so both kernels give the
/// portable kernel's bits.
#[cfg(target_arch = "aarch64")]
mod neon;

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
