//! A llama-family decoder (token embedding, RMSNorm, rotary attention with grouped KV heads,
//! SwiGLU feed-forward, tied or separate output) evaluated one token at a time, on one rank's
//! share of the model:
//! - tensor parallel: each rank holds a contiguous range of attention heads (with their KV
//!   heads) and of feed-forward columns; the attention output and feed-forward down
//!   projections give partial sums that an all-reduce completes, twice per layer; logits are
//!   split by vocabulary rows and the argmax found with a max-loc all-reduce.
//! - pipeline parallel: each rank holds a contiguous range of layers; the activation vector
//!   goes from stage to stage and the last stage picks the token.
//!
//! Dot products accumulate in f64 so that a sum split over ranks and the same sum on one rank
//! agree to far below what could change a greedy choice.

use super::attention::{self, KvHead};
use super::gguf::{quote, Gguf};
use super::qdot::{self, Format, QK};
use super::quant;
use anyhow::{bail, Result};
use serde::Serialize;
use std::ops::Range;

/// Runs a kernel body compiled for AVX2 where the CPU has it (x86-64 builds target the
/// baseline, whose SSE2 vectors are half as wide); elsewhere (NEON on Apple silicon is the
/// baseline) the plain body. Same body, same operation order: only the vector width changes.
macro_rules! simd {
    ($f:ident($($a:expr),*)) => {{
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx2")]
            unsafe fn wide(f: impl FnOnce() -> f64) -> f64 {
                f()
            }
            if std::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2, checked just above.
                return unsafe { wide(|| $f($($a),*)) };
            }
        }
        $f($($a),*)
    }};
}

#[derive(Debug, Clone, Serialize)]
pub struct Config {
    pub layers: usize,
    pub dim: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub eps: f32,
    pub rope_base: f32,
    pub context: usize,
}

impl Config {
    /// The hyper-parameters of a GGUF llama model, checked against the tensors that hold
    /// them: every tensor the decode reads exists, is of a type it reads, lies in the file
    /// and has the shape the hyper-parameters give, so loading and stepping index only
    /// within what the file holds (and sizes are bounded by it).
    pub fn from_gguf(g: &Gguf) -> Result<Config> {
        let arch = g.string("general.architecture")?;
        if !matches!(arch, "llama" | "mistral") {
            bail!(
                "architecture {}: the decode runs llama-family models only",
                quote(arch)
            );
        }
        let k = |s: &str| format!("{arch}.{s}");
        // Upper bounds only keep the arithmetic below in range; the tensor shapes bound
        // them for real.
        let big = u32::MAX as u64;
        let dim = g.count(&k("embedding_length"), 1, big)?;
        let heads = g.count(&k("attention.head_count"), 1, dim as u64)?;
        let kv_heads = match g.meta.get(&k("attention.head_count_kv")) {
            Some(_) => g.count(&k("attention.head_count_kv"), 1, heads as u64)?,
            None => heads,
        };
        if dim % heads != 0 || heads % kv_heads != 0 {
            bail!("{heads} heads, {kv_heads} KV heads over width {dim} do not fit together");
        }
        let vocab = match g.meta.get(&k("vocab_size")) {
            Some(_) => g.count(&k("vocab_size"), 1, big)?,
            None => g.strings("tokenizer.ggml.tokens")?.len(),
        };
        if vocab == 0 {
            bail!("metadata 'tokenizer.ggml.tokens' is empty and there is no {arch}.vocab_size");
        }
        let cfg = Config {
            layers: g.count(&k("block_count"), 0, big)?,
            dim,
            heads,
            kv_heads,
            head_dim: dim / heads,
            ffn: g.count(&k("feed_forward_length"), 1, big)?,
            vocab,
            eps: g.float(&k("attention.layer_norm_rms_epsilon"))? as f32,
            rope_base: g.float(&k("rope.freq_base")).unwrap_or(10000.0) as f32,
            context: g.count(&k("context_length"), 1, u64::MAX)?,
        };
        cfg.check_tensors(g)?;
        Ok(cfg)
    }

    /// Every tensor the decode reads has the shape the hyper-parameters give (ggml order,
    /// row length first; embedding and output may hold more rows than the vocabulary) and
    /// bytes in the file.
    fn check_tensors(&self, g: &Gguf) -> Result<()> {
        let (d, ffn, vocab) = (self.dim as u64, self.ffn as u64, self.vocab as u64);
        // heads * head_dim is the width; KV heads are no more than the heads.
        let q = d;
        let kv = (self.kv_heads * self.head_dim) as u64;
        let check = |name: &str, want: &[u64], rows_at_least: bool| -> Result<()> {
            let t = g.info(name)?;
            g.check_in_file(t)?;
            let dim = |i: usize| t.dims.get(i).copied().unwrap_or(1);
            let ok = t.dims.iter().skip(want.len()).all(|d| *d == 1)
                && want.iter().enumerate().all(|(i, w)| {
                    let last = i + 1 == want.len();
                    if rows_at_least && last {
                        dim(i) >= *w
                    } else {
                        dim(i) == *w
                    }
                });
            if !ok {
                bail!(
                    "{} has dims {:?} where the hyper-parameters (width {}, {} heads, {} KV heads, feed-forward {}, vocabulary {}) need {}{want:?}",
                    t.label(),
                    t.dims,
                    self.dim,
                    self.heads,
                    self.kv_heads,
                    self.ffn,
                    self.vocab,
                    if rows_at_least { "at least " } else { "" }
                );
            }
            Ok(())
        };
        check("token_embd.weight", &[d, vocab], true)?;
        if g.info("output.weight").is_ok() {
            check("output.weight", &[d, vocab], true)?;
        }
        check("output_norm.weight", &[d], false)?;
        for l in 0..self.layers {
            let name = |n: &str| format!("blk.{l}.{n}.weight");
            check(&name("attn_norm"), &[d], false)?;
            check(&name("ffn_norm"), &[d], false)?;
            check(&name("attn_q"), &[d, q], false)?;
            check(&name("attn_k"), &[d, kv], false)?;
            check(&name("attn_v"), &[d, kv], false)?;
            check(&name("attn_output"), &[q, d], false)?;
            check(&name("ffn_gate"), &[d, ffn], false)?;
            check(&name("ffn_up"), &[d, ffn], false)?;
            check(&name("ffn_down"), &[ffn, d], false)?;
        }
        Ok(())
    }

    /// Published layer shapes of models no one can load here, for `--shape`: the
    /// per-token network cost of a split depends on the width, the layer count and the head
    /// layout, which these keep. Returns the config and what is approximate about it.
    pub fn shape(name: &str) -> Result<(Config, &'static str)> {
        let c = |layers, dim, heads, kv_heads, head_dim, ffn, vocab, rope_base| Config {
            layers,
            dim,
            heads,
            kv_heads,
            head_dim,
            ffn,
            vocab,
            eps: 1e-5,
            rope_base,
            context: 8192,
        };
        Ok(match name {
            "llama-3-70b" => (
                c(80, 8192, 64, 8, 128, 28672, 128256, 500000.0),
                "exact layer shapes",
            ),
            "llama-3.2-3b" => (
                c(28, 3072, 24, 8, 128, 8192, 128256, 500000.0),
                "exact layer shapes",
            ),
            // 64 layers of width 5120 and a dense 17408 feed-forward; its attention layers
            // have 24 query and 4 KV heads of 256, and 3 in 4 layers are Gated DeltaNet, here
            // all run as that attention.
            "qwen3.5-27b" => (
                c(64, 5120, 24, 4, 256, 17408, 248320, 10000000.0),
                "every layer as full attention (3 in 4 are Gated DeltaNet in the model)",
            ),
            // 61 layers of width 7168; MoE with 8 of 384 experts of 2048 plus one shared per
            // token, run as a dense 18432 feed-forward (what one token reads); MLA attention
            // run as 64 plain heads of 128.
            "kimi-k2" => (
                c(61, 7168, 64, 64, 128, 18432, 163840, 50000.0),
                "active experts as one dense feed-forward, MLA as plain attention",
            ),
            other => bail!(
                "unknown --shape '{other}' (use llama-3-70b, qwen3.5-27b, kimi-k2 or llama-3.2-3b)"
            ),
        })
    }

    /// Rank counts tensor parallelism can split this model over: every count dividing the
    /// heads, the KV heads and the feed-forward width.
    pub fn tensor_parallel_sizes(&self) -> Vec<usize> {
        (1..=self.kv_heads)
            .filter(|n| {
                self.kv_heads.is_multiple_of(*n)
                    && self.heads.is_multiple_of(*n)
                    && self.ffn.is_multiple_of(*n)
            })
            .collect()
    }
}

/// How the model is divided, from this rank's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    Tensor { rank: usize, size: usize },
    Pipeline { rank: usize, size: usize },
}

impl Split {
    pub fn check(&self, cfg: &Config) -> Result<()> {
        match *self {
            Split::Tensor { size, .. } => {
                if !cfg.tensor_parallel_sizes().contains(&size) {
                    bail!(
                        "tensor parallelism over {size} ranks needs {size} to divide the {} attention heads, {} KV heads and {} feed-forward columns; this model splits over {} rank(s) (or use --parallel pp)",
                        cfg.heads,
                        cfg.kv_heads,
                        cfg.ffn,
                        cfg.tensor_parallel_sizes()
                            .iter()
                            .map(|n| n.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
            }
            Split::Pipeline { size, .. } => {
                if size > cfg.layers {
                    bail!(
                        "pipeline parallelism over {size} ranks needs at least {size} layers; this model has {} (use --nodes {} or fewer)",
                        cfg.layers,
                        cfg.layers
                    );
                }
            }
        }
        Ok(())
    }

    /// This rank's layers.
    pub fn layers(&self, cfg: &Config) -> std::ops::Range<usize> {
        match *self {
            Split::Tensor { .. } => 0..cfg.layers,
            Split::Pipeline { rank, size } => {
                (rank * cfg.layers / size)..((rank + 1) * cfg.layers / size)
            }
        }
    }
}

/// Rows of a weight matrix: `rows` outputs each reading `cols` inputs.
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    w: Weights,
}

/// How a matrix keeps its weights. Block formats stay as the file has them (their scales
/// widened to f32), so a step reads 5 or 9 bits per weight instead of 32 (decode is bound by
/// reading weights, as llama.cpp's is) and multiplies them with integer products (qdot).
enum Weights {
    F32(Vec<f32>),
    Blocks {
        format: Format,
        /// One per block of 32, row by row.
        scale: Vec<f32>,
        /// Q4_1's per-block minimum (empty for the others).
        min: Vec<f32>,
        /// The block's quants: 16 bytes of nibbles (Q4) or 32 signed bytes (Q8_0).
        q: Vec<u8>,
        /// Rows interleaved in groups of `qdot::GROUP` (`qdot::group`; the rows past the
        /// last whole group as they were), where the kernel has a product over groups: a
        /// decode step then multiplies eight rows per activation broadcast (measured on the
        /// Intel VM, SmolLM2's 1536x576 Q4_1: 25 -> 40 Gweights/s). A range of whole groups
        /// sits where those rows would in row order, so rows are sliced alike either way.
        grouped: bool,
    },
}

impl Weights {
    /// Block weights `rows` rows long, grouped where the kernel pays for it.
    fn blocks(format: Format, scale: Vec<f32>, min: Vec<f32>, q: Vec<u8>, rows: usize) -> Weights {
        if !qdot::groups_pay() || rows < qdot::GROUP {
            return Weights::Blocks {
                format,
                scale,
                min,
                q,
                grouped: false,
            };
        }
        let (q, scale, min) = qdot::group(format, &q, &scale, &min, rows);
        Weights::Blocks {
            format,
            scale,
            min,
            q,
            grouped: true,
        }
    }
}

impl Matrix {
    /// Rows `r0..r1`, columns `c0..c1` of a GGUF tensor (ggml: dims[0] is the row length).
    /// Block formats are kept as blocks; f32 and f16 tensors, and a column range off block
    /// edges, are held as f32.
    fn load(g: &Gguf, name: &str, rows: (usize, usize), cols: (usize, usize)) -> Result<Matrix> {
        let t = g.info(name)?;
        let data = g.data(t)?;
        // The data is in memory, so its element count (and each dimension) fits a usize.
        let row_len = t.dims.first().copied().unwrap_or(1) as usize;
        let n_rows = t.dims.get(1).copied().unwrap_or(1) as usize;
        if rows.0 > rows.1 || rows.1 > n_rows || cols.0 > cols.1 || cols.1 > row_len {
            bail!(
                "{} is {n_rows}x{row_len}, smaller than the model says",
                t.label()
            );
        }
        let row_bytes = quant::bytes_of(t.ggml_type, row_len)?;
        if n_rows.checked_mul(row_bytes).is_none_or(|n| n > data.len()) {
            bail!("{} holds fewer bytes than its rows", t.label());
        }
        let (nr, nc) = (rows.1 - rows.0, cols.1 - cols.0);
        let kind = t.ggml_type;
        let format =
            Format::of(kind).filter(|_| cols.0.is_multiple_of(QK) && cols.1.is_multiple_of(QK));
        if let Some(format) = format {
            // Whole blocks: keep them. Columns split between ranks fall on block edges
            // (a head is 64 wide, a feed-forward share a multiple of 32).
            let fb = quant::bytes_of(kind, QK)?;
            let qb = format.quant_bytes();
            let nb = nc / QK;
            let (mut scale, mut min, mut q) = (
                Vec::with_capacity(nr * nb),
                Vec::new(),
                Vec::with_capacity(nr * nb * qb),
            );
            for r in rows.0..rows.1 {
                let row = &data[r * row_bytes..(r + 1) * row_bytes];
                for b in cols.0 / QK..cols.1 / QK {
                    let blk = &row[b * fb..(b + 1) * fb];
                    scale.push(quant::f16_to_f32(u16::from_le_bytes([blk[0], blk[1]])));
                    let at = if kind == quant::Q4_1 {
                        min.push(quant::f16_to_f32(u16::from_le_bytes([blk[2], blk[3]])));
                        4
                    } else {
                        2
                    };
                    q.extend_from_slice(&blk[at..at + qb]);
                }
            }
            return Ok(Matrix {
                rows: nr,
                cols: nc,
                w: Weights::blocks(format, scale, min, q, nr),
            });
        }
        let mut w = vec![0f32; nr * nc];
        let mut full = vec![0f32; row_len];
        for (i, r) in (rows.0..rows.1).enumerate() {
            let src = &data[r * row_bytes..(r + 1) * row_bytes];
            quant::dequantize(kind, src, &mut full)?;
            w[i * nc..(i + 1) * nc].copy_from_slice(&full[cols.0..cols.1]);
        }
        Ok(Matrix {
            rows: nr,
            cols: nc,
            w: Weights::F32(w),
        })
    }

    /// Random Q8_0 weights for rows `rows` and columns `cols` of a `full_cols`-wide matrix:
    /// each global row comes from its own seed, so every rank's slice is a slice of the same
    /// matrix and a 1-rank run reproduces a split one. Values about ±2/√cols keep activations
    /// in range through the layers.
    fn random(seed: u64, rows: (usize, usize), cols: (usize, usize), full_cols: usize) -> Matrix {
        let (nr, nc) = (rows.1 - rows.0, cols.1 - cols.0);
        let nb = nc / QK;
        let d = 1.0 / (64.0 * (full_cols as f32).sqrt());
        let mut q = Vec::with_capacity(nr * nc);
        let mut row = vec![0u8; full_cols];
        for r in rows.0..rows.1 {
            let mut st = splitmix(seed ^ (r as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            for c in row.chunks_mut(8) {
                st = splitmix(st);
                c.copy_from_slice(&st.to_le_bytes()[..c.len()]);
            }
            q.extend_from_slice(&row[cols.0..cols.1]);
        }
        if !cols.0.is_multiple_of(QK) || !cols.1.is_multiple_of(QK) {
            // A split off block edges: the same values, widened.
            return Matrix {
                rows: nr,
                cols: nc,
                w: Weights::F32(q.iter().map(|b| d * (*b as i8) as f32).collect()),
            };
        }
        Matrix {
            rows: nr,
            cols: nc,
            w: Weights::blocks(Format::Q8_0, vec![d; nr * nb], Vec::new(), q, nr),
        }
    }

    /// Bytes one product with this matrix reads.
    pub fn bytes(&self) -> usize {
        match &self.w {
            Weights::F32(w) => 4 * w.len(),
            Weights::Blocks { scale, min, q, .. } => q.len() + 4 * (scale.len() + min.len()),
        }
    }

    /// The memory a product with this matrix reads, as byte slices (quants, scales, minimums).
    fn memory(&self) -> Vec<&[u8]> {
        fn bytes_of(v: &[f32]) -> &[u8] {
            // SAFETY: f32 has no padding and any byte pattern is a valid u8; the slice covers
            // exactly v's initialized elements and borrows v.
            unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
        }
        match &self.w {
            Weights::F32(w) => vec![bytes_of(w)],
            Weights::Blocks { scale, min, q, .. } => vec![q, bytes_of(scale), bytes_of(min)],
        }
    }

    /// How the weights are held: "f32", or the block format kept.
    fn held(&self) -> &'static str {
        match &self.w {
            Weights::F32(_) => "f32",
            Weights::Blocks { format, .. } => format.name(),
        }
    }

    /// y = W x, its rows dealt out over `threads`.
    pub fn apply(&self, x: &[f32], y: &mut [f32], threads: &Threads) {
        let y = &mut y[..self.rows];
        match &self.w {
            Weights::F32(w) => threads.rows(self.rows * self.cols, y, |first, ys| {
                for (i, yr) in ys.iter_mut().enumerate() {
                    let r = first + i;
                    *yr = dot(&w[r * self.cols..(r + 1) * self.cols], x) as f32;
                }
            }),
            Weights::Blocks {
                format,
                scale,
                min,
                q,
                grouped,
            } => {
                let nb = self.cols / QK;
                let qb = format.quant_bytes();
                let mut a = qdot::Q8Activation::default();
                a.quantize(x);
                let a = &a;
                // Chunks of whole groups; the rows past the last group one by one.
                let (unit, in_groups) = grouping(*grouped, self.rows);
                threads.rows_by(unit, self.rows * self.cols, y, |first, ys| {
                    let end = first + ys.len();
                    let split = in_groups.clamp(first, end) - first;
                    let (gys, rys) = ys.split_at_mut(split);
                    if !gys.is_empty() {
                        let rows = first..first + split;
                        let (qs, sc, mins) = block_rows(q, scale, min, rows, nb * qb, nb);
                        qdot::rows_grouped(*format, qs, sc, mins, a, gys);
                    }
                    if !rys.is_empty() {
                        let rows = first + split..end;
                        let (qs, sc, mins) = block_rows(q, scale, min, rows, nb * qb, nb);
                        qdot::rows(*format, qs, sc, mins, a, rys);
                    }
                })
            }
        }
    }
}

impl Matrix {
    /// Y = X Wᵀ for `n` rows of X at once (a prompt's tokens): `x` holds n rows of `cols`
    /// values, `y` gets n rows of `self.rows`. Each of Y's rows equals [`Matrix::apply`]'s for
    /// that row of X bit for bit; the weights are read once for the batch instead of once per
    /// token, and each block is unpacked once for several tokens (qdot::rows_many).
    pub fn apply_batch(
        &self,
        x: &[f32],
        n: usize,
        y: &mut [f32],
        threads: &Threads,
        quantized: &mut Quantized,
    ) {
        let (rows, cols) = (self.rows, self.cols);
        let Weights::Blocks {
            format,
            scale,
            min,
            q,
            grouped,
        } = &self.w
        else {
            for (xr, yr) in x.chunks_exact(cols).zip(y.chunks_exact_mut(rows)).take(n) {
                self.apply(xr, yr, threads);
            }
            return;
        };
        let acts = quantized.of(x, cols, n, threads);
        let nb = cols / QK;
        let qb = format.quant_bytes();
        // Each thread's rows go a piece at a time (PIECE rows, a few tens of KiB), the tokens
        // in tiles of TILE: a tile's activations stay in L1 while the piece's rows pass over
        // them, and the piece's rows stay in cache from tile to tile (a whole 256-token batch
        // of activations is several hundred KiB; measured on a 2-core EPYC VM, SmolLM2 pp512
        // at 2 threads: 171 tokens/s untiled). Grouped rows are handed out in whole groups
        // and put back into rows piece by piece for the tile product.
        const TILE: usize = 32;
        const PIECE: usize = 8 * qdot::GROUP;
        let y = &mut y[..n * rows];
        let base = y.as_mut_ptr() as usize;
        let (unit, in_groups) = grouping(*grouped, rows);
        let (row_q, row_s) = (nb * qb, nb);
        threads.ranges(rows * cols * n, rows.div_ceil(unit), |units| {
            let range = units.start * unit..(units.end * unit).min(rows);
            let mut tile = vec![0f32; PIECE * TILE];
            let (mut pq, mut ps, mut pm) = (Vec::new(), Vec::new(), Vec::new());
            let mut p0 = range.start;
            while p0 < range.end {
                // Pieces of groups end where the groups do.
                let last = if p0 < in_groups { in_groups } else { rows };
                let piece = p0..(p0 + PIECE).min(range.end).min(last);
                p0 = piece.end;
                // The piece's rows one after another: as held, or put back from groups.
                let held = block_rows(q, scale, min, piece.clone(), row_q, row_s);
                let (qs, sc, mins) = if piece.start < in_groups {
                    let (gq, gs, gm) = held;
                    qdot::ungroup(*format, gq, gs, gm, nb, (&mut pq, &mut ps, &mut pm));
                    (&pq[..], &ps[..], &pm[..])
                } else {
                    held
                };
                for t0 in (0..n).step_by(TILE) {
                    let t1 = (t0 + TILE).min(n);
                    let out = &mut tile[..piece.len() * (t1 - t0)];
                    qdot::rows_many(*format, qs, sc, mins, piece.len(), &acts[t0..t1], out);
                    for (r, vs) in piece.clone().zip(out.chunks_exact(t1 - t0)) {
                        for (k, v) in vs.iter().enumerate() {
                            // SAFETY: value r of each token's row belongs to this chunk's
                            // range alone, and `y` (n rows of `rows`) outlives `ranges`.
                            unsafe { *(base as *mut f32).add((t0 + k) * rows + r) = *v };
                        }
                    }
                }
            }
        });
    }
}

/// How a block matrix of `rows` rows is handed out: in units of a group where its rows are
/// grouped (else one row), and how many rows lie in whole groups.
fn grouping(grouped: bool, rows: usize) -> (usize, usize) {
    if grouped {
        (qdot::GROUP, rows / qdot::GROUP * qdot::GROUP)
    } else {
        (1, 0)
    }
}

/// Rows `rows` of a block matrix: their quants (`qbytes` per row), scales and, for Q4_1,
/// minimums (`nb` blocks per row; other formats have none).
fn block_rows<'a>(
    q: &'a [u8],
    scale: &'a [f32],
    min: &'a [f32],
    rows: std::ops::Range<usize>,
    qbytes: usize,
    nb: usize,
) -> (&'a [u8], &'a [f32], &'a [f32]) {
    let (r0, r1) = (rows.start, rows.end);
    let mins = if min.is_empty() {
        &[][..]
    } else {
        &min[r0 * nb..r1 * nb]
    };
    (&q[r0 * qbytes..r1 * qbytes], &scale[r0 * nb..r1 * nb], mins)
}

/// The threads one rank multiplies with. A product's rows are dealt out in chunks and each
/// row is computed whole by one thread, so results do not depend on the thread count (a
/// distributed run still reproduces the 1-rank one whatever threads either had).
pub struct Threads {
    pool: Option<super::pool::Pool>,
}

impl Threads {
    /// Products smaller than this many weights run on the calling thread: handing them out
    /// costs more than it saves.
    const MIN_PARALLEL: usize = 32 * 1024;

    pub fn new(n: usize) -> Result<Threads> {
        let pool = if n > 1 {
            Some(
                super::pool::Pool::new(n)
                    .map_err(|e| anyhow::anyhow!("cannot start {n} decode threads: {e}"))?,
            )
        } else {
            None
        };
        Ok(Threads { pool })
    }

    pub fn count(&self) -> usize {
        self.pool.as_ref().map_or(1, |p| p.threads())
    }

    /// Runs `work(range)` over 0..count in chunks of consecutive indices, in parallel where
    /// `weights` (multiply-adds in all) make it pay; a few chunks per thread even out chunks
    /// that take longer (cache misses).
    fn ranges(&self, weights: usize, count: usize, work: impl Fn(Range<usize>) + Sync) {
        match &self.pool {
            Some(pool) if weights >= Self::MIN_PARALLEL && count > 1 => {
                let chunk = count
                    .div_ceil(4 * pool.threads())
                    .max(count.div_ceil(super::pool::MAX_CHUNKS));
                pool.run(count.div_ceil(chunk), &|i| {
                    work(i * chunk..((i + 1) * chunk).min(count))
                });
            }
            _ => work(0..count),
        }
    }

    /// Runs `fill(first_row, rows)` over `y` in chunks, in parallel where it pays.
    fn rows(&self, weights: usize, y: &mut [f32], fill: impl Fn(usize, &mut [f32]) + Sync) {
        self.rows_by(1, weights, y, fill)
    }

    /// `rows` in chunks of whole `unit`s of rows (the last one short where `y` ends).
    fn rows_by(
        &self,
        unit: usize,
        weights: usize,
        y: &mut [f32],
        fill: impl Fn(usize, &mut [f32]) + Sync,
    ) {
        // Each chunk writes its own rows: hand out the base address, and let each rebuild
        // only its own range.
        let (base, len) = (y.as_mut_ptr() as usize, y.len());
        self.ranges(weights, len.div_ceil(unit), |u| {
            let r = u.start * unit..(u.end * unit).min(len);
            // SAFETY: chunks cover disjoint row ranges of `y`, which outlives `ranges`.
            let ys =
                unsafe { std::slice::from_raw_parts_mut((base as *mut f32).add(r.start), r.len()) };
            fill(r.start, ys);
        });
    }

    /// Runs `f(i, &mut items[i])` for every item, in parallel where `weights` make it pay.
    fn each<T: Send>(&self, weights: usize, items: &mut [T], f: impl Fn(usize, &mut T) + Sync) {
        let base = items.as_mut_ptr() as usize;
        self.ranges(weights, items.len(), |r| {
            for i in r {
                // SAFETY: every index is handed out once; `items` outlives `ranges`.
                f(i, unsafe { &mut *(base as *mut T).add(i) });
            }
        });
    }
}

/// A prompt's rows quantized for the block matrices, once for all the matrices that take the
/// same rows (query, key and value share one; gate and up another).
#[derive(Default)]
pub struct Quantized {
    acts: Vec<qdot::Q8Activation>,
    ready: bool,
}

impl Quantized {
    /// Forgets the rows (the next product quantizes its input again).
    pub fn clear(&mut self) {
        self.ready = false;
    }

    /// `n` rows of `cols` values of `x`, quantized (on `threads`) unless they already are.
    fn of(&mut self, x: &[f32], cols: usize, n: usize, threads: &Threads) -> &[qdot::Q8Activation] {
        if !self.ready || self.acts.len() != n {
            self.acts.resize_with(n, Default::default);
            threads.each(n * cols, &mut self.acts, |t, a| {
                a.quantize(&x[t * cols..(t + 1) * cols])
            });
            self.ready = true;
        }
        &self.acts
    }
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Dot product accumulated in f64 over eight independent lanes: the lanes let the compiler
/// vectorise and keep the adds from waiting on each other; f64 keeps a sum split over ranks
/// equal to the whole sum far below f32's precision.
pub fn dot(a: &[f32], b: &[f32]) -> f64 {
    simd!(dot_body(a, b))
}

#[inline(always)]
fn dot_body(a: &[f32], b: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            lanes[i] += x[i] as f64 * y[i] as f64;
        }
    }
    let mut sum = lanes.iter().sum::<f64>();
    for (x, y) in ra.iter().zip(rb) {
        sum += *x as f64 * *y as f64;
    }
    sum
}

fn vector(g: &Gguf, name: &str) -> Result<Vec<f32>> {
    let t = g.info(name)?;
    let data = g.data(t)?;
    // The data is in memory, so its element count fits a usize.
    let mut v = vec![0f32; t.elements() as usize];
    quant::dequantize(t.ggml_type, data, &mut v)?;
    Ok(v)
}

struct Layer {
    attn_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    wq: Matrix,
    wk: Matrix,
    wv: Matrix,
    /// Columns of this rank's heads.
    wo: Matrix,
    gate: Matrix,
    up: Matrix,
    /// Columns of this rank's feed-forward share.
    down: Matrix,
    /// The KV cache, one per local KV head (f16: [`attention`]).
    kv: Vec<KvHead>,
}

/// The greedy choice: (index, score) of the largest score, ties to the smallest index.
pub fn argmax(scores: &[f32]) -> (usize, f32) {
    let (mut at, mut best) = (0usize, f32::NEG_INFINITY);
    for (i, v) in scores.iter().enumerate() {
        if *v > best {
            (at, best) = (i, *v);
        }
    }
    (at, best)
}

/// The collective steps a shard needs; the runner's Comm provides them across ranks, and
/// [`Alone`] on one process (the reference run).
pub trait Collective {
    fn all_sum(&mut self, v: &mut [f32]) -> Result<()>;
    /// (value, index) of the largest value over all ranks; ties to the smallest index.
    fn all_maxloc(&mut self, value: f32, index: usize) -> Result<(f32, usize)>;
    /// Pipeline: hand the activation to the next stage / take it from the previous one.
    fn send_to(&mut self, rank: usize, v: &[f32]) -> Result<()>;
    fn recv_from(&mut self, rank: usize, v: &mut [f32]) -> Result<()>;
    /// The chosen token and its score, from the last stage to every stage.
    fn share_choice(&mut self, root: usize, token: &mut u32, score: &mut f32) -> Result<()>;
    /// Time spent in these calls so far (the rest of a step is computation).
    fn waited(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

/// One process holding the whole model: every collective is the identity.
pub struct Alone;

impl Collective for Alone {
    fn all_sum(&mut self, _: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn all_maxloc(&mut self, value: f32, index: usize) -> Result<(f32, usize)> {
        Ok((value, index))
    }
    fn send_to(&mut self, _: usize, _: &[f32]) -> Result<()> {
        bail!("a single process has no next stage")
    }
    fn recv_from(&mut self, _: usize, _: &mut [f32]) -> Result<()> {
        bail!("a single process has no previous stage")
    }
    fn share_choice(&mut self, _: usize, _: &mut u32, _: &mut f32) -> Result<()> {
        Ok(())
    }
}

/// The matrices of one layer, in the order synthetic weights number them.
const LAYER_MATRICES: [&str; 7] = [
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
];

/// Which part of the model a rank holds: its heads, KV heads, feed-forward columns and output
/// rows (tensor parallel: a contiguous share of each; pipeline: all of them), its layers, and
/// whether it embeds (first stage) and scores (last stage).
struct Share {
    heads: (usize, usize),
    kv: (usize, usize),
    ffn: (usize, usize),
    vocab: (usize, usize),
    layers: std::ops::Range<usize>,
    first: bool,
    last: bool,
}

impl Share {
    fn of(cfg: &Config, split: Split) -> Result<Share> {
        split.check(cfg)?;
        let (rank, size, tp) = match split {
            Split::Tensor { rank, size } => (rank, size, true),
            Split::Pipeline { rank, size } => (rank, size, false),
        };
        let part = |n: usize| {
            if tp {
                (rank * n / size, (rank + 1) * n / size)
            } else {
                (0, n)
            }
        };
        let first = tp || rank == 0;
        let last = tp || rank + 1 == size;
        Ok(Share {
            heads: part(cfg.heads),
            kv: part(cfg.kv_heads),
            ffn: part(cfg.ffn),
            vocab: if last { part(cfg.vocab) } else { (0, 0) },
            layers: split.layers(cfg),
            first,
            last,
        })
    }

    /// This rank's layers, each matrix from `mat(layer, name, rows, cols, full row length)`
    /// and each norm from `norm(layer, name)`.
    fn layers(
        &self,
        cfg: &Config,
        mut mat: impl FnMut(usize, &str, (usize, usize), (usize, usize), usize) -> Result<Matrix>,
        mut norm: impl FnMut(usize, &str) -> Result<Vec<f32>>,
    ) -> Result<Vec<Layer>> {
        let hd = cfg.head_dim;
        let d = (0, cfg.dim);
        let q = (self.heads.0 * hd, self.heads.1 * hd);
        let kv = (self.kv.0 * hd, self.kv.1 * hd);
        let mut out = Vec::new();
        for l in self.layers.clone() {
            out.push(Layer {
                attn_norm: norm(l, "attn_norm")?,
                ffn_norm: norm(l, "ffn_norm")?,
                wq: mat(l, "attn_q", q, d, cfg.dim)?,
                wk: mat(l, "attn_k", kv, d, cfg.dim)?,
                wv: mat(l, "attn_v", kv, d, cfg.dim)?,
                wo: mat(l, "attn_output", d, q, cfg.heads * hd)?,
                gate: mat(l, "ffn_gate", self.ffn, d, cfg.dim)?,
                up: mat(l, "ffn_up", self.ffn, d, cfg.dim)?,
                down: mat(l, "ffn_down", d, self.ffn, cfg.ffn)?,
                kv: vec![KvHead::new(hd); self.kv.1 - self.kv.0],
            });
        }
        Ok(out)
    }
}

/// One rank's share of the model, with its KV cache.
pub struct Shard {
    pub cfg: Config,
    pub split: Split,
    layers: Vec<Layer>,
    /// Token embedding rows, kept in their file encoding and decoded one row per lookup.
    embd_type: u32,
    embd_row_bytes: usize,
    embd: Vec<u8>,
    /// Synthetic models (`--shape`) make each embedding row from this seed and the token.
    synthetic: Option<u64>,
    out_norm: Vec<f32>,
    /// Output rows this rank scores, and their first token id.
    out: Matrix,
    out_first: usize,
    local_heads: usize,
    local_kv: usize,
    /// The threads its products run on (one until `set_threads`).
    threads: Threads,
    /// Bytes of weights this rank holds, as held.
    pub weight_bytes: usize,
    /// The scores of the last step for this rank's output rows (every row on one rank), for
    /// checking a distributed run against the whole model.
    logits: Vec<f32>,
    /// The score of the token the last step chose, over all ranks' output rows.
    score: f32,
}

impl Shard {
    pub fn load(g: &Gguf, split: Split) -> Result<Shard> {
        let cfg = Config::from_gguf(g)?;
        let share = Share::of(&cfg, split)?;
        let layers = share.layers(
            &cfg,
            |l, name, rows, cols, _| Matrix::load(g, &format!("blk.{l}.{name}.weight"), rows, cols),
            |l, name| vector(g, &format!("blk.{l}.{name}.weight")),
        )?;
        let embd_info = g.info("token_embd.weight")?;
        let embd_row_bytes = quant::bytes_of(embd_info.ggml_type, cfg.dim)?;
        let embd = if share.first {
            g.data(embd_info)?.to_vec()
        } else {
            Vec::new()
        };
        // Tied embeddings (no output.weight) score with the embedding rows.
        let out_name = if g.info("output.weight").is_ok() {
            "output.weight"
        } else {
            "token_embd.weight"
        };
        let out = Matrix::load(g, out_name, share.vocab, (0, cfg.dim))?;
        let out_norm = if share.last {
            vector(g, "output_norm.weight")?
        } else {
            Vec::new()
        };
        let mut shard = Shard::assemble(cfg, split, &share, layers, out, out_norm);
        shard.embd_type = embd_info.ggml_type;
        shard.embd_row_bytes = embd_row_bytes;
        shard.weight_bytes += embd.len();
        shard.embd = embd;
        Ok(shard)
    }

    /// Random weights at `cfg`'s shapes (`--shape`), the same on every rank for one `seed`.
    pub fn synthetic(cfg: Config, split: Split, seed: u64) -> Result<Shard> {
        let share = Share::of(&cfg, split)?;
        let layers = share.layers(
            &cfg,
            |l, name, rows, cols, full_cols| {
                let id = LAYER_MATRICES.iter().position(|m| *m == name).unwrap_or(0) as u64 + 1;
                Ok(Matrix::random(
                    seed ^ ((l as u64) << 40) ^ (id << 32),
                    rows,
                    cols,
                    full_cols,
                ))
            },
            |_, _| Ok(vec![1.0; cfg.dim]),
        )?;
        let out = Matrix::random(seed ^ 0x07, share.vocab, (0, cfg.dim), cfg.dim);
        let out_norm = if share.last {
            vec![1.0; cfg.dim]
        } else {
            Vec::new()
        };
        let mut shard = Shard::assemble(cfg, split, &share, layers, out, out_norm);
        shard.synthetic = Some(seed);
        Ok(shard)
    }

    /// A shard from its parts; the embedding is set by the caller.
    fn assemble(
        cfg: Config,
        split: Split,
        share: &Share,
        layers: Vec<Layer>,
        out: Matrix,
        out_norm: Vec<f32>,
    ) -> Shard {
        let weight_bytes = layers
            .iter()
            .map(|l| {
                [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down]
                    .iter()
                    .map(|m| m.bytes())
                    .sum::<usize>()
            })
            .sum::<usize>()
            + out.bytes();
        Shard {
            cfg,
            split,
            layers,
            embd_type: quant::F32,
            embd_row_bytes: 0,
            embd: Vec::new(),
            synthetic: None,
            out_norm,
            out,
            out_first: share.vocab.0,
            local_heads: share.heads.1 - share.heads.0,
            local_kv: share.kv.1 - share.kv.0,
            threads: Threads { pool: None },
            weight_bytes,
            logits: Vec::new(),
            score: 0.0,
        }
    }

    /// Multiplies on `n` threads from now on.
    pub fn set_threads(&mut self, n: usize) -> Result<()> {
        self.threads = Threads::new(n)?;
        Ok(())
    }

    pub fn threads(&self) -> usize {
        self.threads.count()
    }

    /// Bytes of weights a synthetic shard of `cfg` holds on the fullest rank (for refusing a
    /// split that does not fit before anything is made).
    pub fn synthetic_bytes(cfg: &Config, split: Split) -> u64 {
        let (size, tp) = match split {
            Split::Tensor { size, .. } => (size as u64, true),
            Split::Pipeline { size, .. } => (size as u64, false),
        };
        let (dim, hd) = (cfg.dim as u64, cfg.head_dim as u64);
        let per_layer =
            dim * hd * (2 * cfg.heads as u64 + 2 * cfg.kv_heads as u64) + 3 * dim * cfg.ffn as u64;
        let (layers, out) = if tp {
            (
                cfg.layers as u64 * per_layer / size,
                cfg.vocab as u64 * dim / size,
            )
        } else {
            (
                cfg.layers as u64 * per_layer / size + per_layer,
                cfg.vocab as u64 * dim,
            )
        };
        // One byte per weight and a 4-byte scale per 32.
        (layers + out) * 9 / 8
    }

    fn rms_norm(&self, x: &[f32], w: &[f32], out: &mut [f32]) {
        let ss: f64 = x.iter().map(|v| (*v as f64) * (*v as f64)).sum();
        let scale = 1.0 / ((ss / x.len() as f64) as f32 + self.cfg.eps).sqrt();
        for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
            *o = v * scale * g;
        }
    }

    /// The rotary embedding's sine and cosine at `pos` for each pair of a head.
    fn rotation(&self, pos: usize) -> Vec<(f32, f32)> {
        let hd = self.cfg.head_dim;
        (0..hd / 2)
            .map(|i| {
                let freq = self.cfg.rope_base.powf(-2.0 * i as f32 / hd as f32);
                (pos as f32 * freq).sin_cos()
            })
            .collect()
    }

    /// Rotary embedding of one head by `rot` ([`Shard::rotation`]): adjacent pairs, as GGUF
    /// llama weights expect.
    fn rope(v: &mut [f32], rot: &[(f32, f32)]) {
        for (pair, (s, c)) in v.chunks_exact_mut(2).zip(rot) {
            let (a, b) = (pair[0], pair[1]);
            pair[0] = a * c - b * s;
            pair[1] = a * s + b * c;
        }
    }

    /// Runs `token` at `pos` through this rank's share; returns the next token (greedy), the
    /// same on every rank.
    pub fn step(&mut self, c: &mut dyn Collective, token: u32, pos: usize) -> Result<u32> {
        self.forward(c, &[token], pos)
    }

    /// Runs a prompt's `tokens`, at positions `pos0..`, through this rank's share as one batch;
    /// returns the token after the last (greedy), the same on every rank. The matrix products
    /// take all the tokens at once ([`Matrix::apply_batch`], each row bit for bit as one
    /// token's), attention goes token by token over the cache as in [`Shard::step`], and
    /// tensor-parallel sums and pipeline hand-overs carry the whole batch in one message.
    pub fn prefill(&mut self, c: &mut dyn Collective, tokens: &[u32], pos0: usize) -> Result<u32> {
        if tokens.is_empty() {
            bail!("an empty prompt has nothing to run");
        }
        self.forward(c, tokens, pos0)
    }

    /// The embedding of `token` into `x`.
    fn embed(&self, token: u32, x: &mut [f32]) -> Result<()> {
        let t = token as usize;
        if t >= self.cfg.vocab {
            bail!("token {t} is outside the vocabulary of {}", self.cfg.vocab);
        }
        match self.synthetic {
            Some(seed) => {
                let mut st = splitmix(seed ^ 0xe3bd ^ (t as u64) << 20);
                for v in x.iter_mut() {
                    st = splitmix(st);
                    *v = (st >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                }
            }
            None => {
                let row = &self.embd[t * self.embd_row_bytes..(t + 1) * self.embd_row_bytes];
                quant::dequantize(self.embd_type, row, x)?;
            }
        }
        Ok(())
    }

    /// One token entering layer `li`: rotates its query and key by its position's `rot`, and
    /// appends its key and value to the layer's cache.
    fn enter(&mut self, li: usize, q: &mut [f32], k: &mut [f32], v: &[f32], rot: &[(f32, f32)]) {
        let hd = self.cfg.head_dim;
        for hq in q.chunks_exact_mut(hd) {
            Self::rope(hq, rot);
        }
        for hk in k.chunks_exact_mut(hd) {
            Self::rope(hk, rot);
        }
        let l = &mut self.layers[li];
        for ((c, k), v) in
            l.kv.iter_mut()
                .zip(k.chunks_exact(hd))
                .zip(v.chunks_exact(hd))
        {
            c.push(k, v);
        }
    }

    /// Attention in layer `li` for `n` tokens at positions `pos0..`, already in the cache
    /// ([`Shard::enter`]): token t's local heads (queries in `q`, n rows of heads × head
    /// size) attend to positions 0..=pos0 + t and write their outputs to the same place in
    /// `att`. Every query's arithmetic is the same whatever the threads and however the work
    /// is cut ([`attention`]): a batch goes out in units of one KV head's query heads for a
    /// few consecutive tokens, each unit reading every block of that head's cache once for all
    /// of its queries; where that makes too few units to share (a step), each block of each
    /// token's KV head is a unit, and the blocks' partial results are folded in order after.
    fn attend(&self, li: usize, q: &[f32], n: usize, pos0: usize, att: &mut [f32]) {
        let hd = self.cfg.head_dim;
        let heads = self.local_heads;
        let kvs = self.local_kv;
        let group = self.cfg.heads / self.cfg.kv_heads;
        let l = &self.layers[li];
        let scale = 1.0 / (hd as f32).sqrt();
        let kernel = attention::Kernel::chosen();
        // Token t's queries of KV head h: its heads h·group.. (consecutive in its row).
        let queries = |t: usize, h: usize| (t * heads + h * group) * hd;
        // Multiply-adds of the whole job: each query reads its positions' keys and values.
        let work = heads * hd * (n * pos0 + n * (n + 1) / 2);
        let pool = match &self.threads.pool {
            Some(pool) if work >= Threads::MIN_PARALLEL && n * kvs > 1 => Some(pool),
            _ => None,
        };
        let threads = pool.map_or(1, |p| p.threads());
        if let Some(pool) = pool.filter(|_| n * kvs < 4 * threads) {
            // Each block of each token's KV head a unit, its partials folded in order after.
            let blocks = |t: usize| (pos0 + t + 1).div_ceil(attention::BLOCK);
            let mut first = Vec::with_capacity(n * kvs + 1);
            first.push(0usize);
            for t in 0..n {
                for _ in 0..kvs {
                    first.push(first.last().unwrap_or(&0) + blocks(t));
                }
            }
            let units = *first.last().unwrap_or(&0);
            let pl = attention::part_len(hd);
            let mut parts = vec![0f32; units * group * pl];
            let parts_base = parts.as_mut_ptr() as usize;
            let chunk = units
                .div_ceil(4 * threads)
                .max(units.div_ceil(super::pool::MAX_CHUNKS));
            pool.run(units.div_ceil(chunk), &|c| {
                let mut scores = Vec::new();
                let mut valid = Vec::new();
                for u in c * chunk..((c + 1) * chunk).min(units) {
                    // The (token, KV head) whose blocks hold unit u.
                    let th = first.partition_point(|f| *f <= u) - 1;
                    let (t, h, b) = (th / kvs, th % kvs, u - first[th]);
                    let end = pos0 + t + 1;
                    valid.clear();
                    valid.resize(group, (end - b * attention::BLOCK).min(attention::BLOCK));
                    // SAFETY: unit u alone writes its own partials, in `parts`, which outlives
                    // `run`.
                    let part = unsafe {
                        std::slice::from_raw_parts_mut(
                            (parts_base as *mut f32).add(u * group * pl),
                            group * pl,
                        )
                    };
                    let qs = &q[queries(t, h)..queries(t, h) + group * hd];
                    attention::block(
                        kernel,
                        qs,
                        hd,
                        &valid,
                        &l.kv[h],
                        b,
                        scale,
                        &mut scores,
                        part,
                    );
                }
            });
            for th in 0..n * kvs {
                let (t, h) = (th / kvs, th % kvs);
                let mine = &mut parts[first[th] * group * pl..first[th + 1] * group * pl];
                let (state, rest) = mine.split_at_mut(group * pl);
                for p in rest.chunks_exact(group * pl) {
                    for (s, p) in state.chunks_exact_mut(pl).zip(p.chunks_exact(pl)) {
                        attention::fold(s, p, hd);
                    }
                }
                let at = queries(t, h);
                for (s, o) in state
                    .chunks_exact(pl)
                    .zip(att[at..at + group * hd].chunks_exact_mut(hd))
                {
                    attention::finish(s, hd, o);
                }
            }
            return;
        }
        let base = att.as_mut_ptr() as usize;
        // Tokens in tiles of up to 8 (fewer where the units would be too few to share).
        let per = match pool {
            Some(_) => (n * kvs / (4 * threads)).clamp(1, 8),
            None => 8,
        };
        let tiles = n.div_ceil(per);
        let units = kvs * tiles;
        let chunk = units
            .div_ceil(4 * threads)
            .max(units.div_ceil(super::pool::MAX_CHUNKS));
        let job = |c: usize| {
            let mut scratch = attention::Scratch::default();
            let (mut qs, mut ends, mut outs) = (Vec::new(), Vec::new(), Vec::new());
            for u in c * chunk..((c + 1) * chunk).min(units) {
                let (h, tile) = (u / tiles, u % tiles);
                let toks = tile * per..((tile + 1) * per).min(n);
                qs.clear();
                ends.clear();
                for t in toks.clone() {
                    qs.extend_from_slice(&q[queries(t, h)..queries(t, h) + group * hd]);
                    ends.resize(ends.len() + group, pos0 + t + 1);
                }
                outs.resize(qs.len(), 0.0);
                let kv = &l.kv[h];
                attention::attend(kernel, &qs, hd, &ends, kv, scale, &mut scratch, &mut outs);
                for (t, o) in toks.zip(outs.chunks_exact(group * hd)) {
                    // SAFETY: unit u alone writes its tokens' heads of KV head h in `att`,
                    // which outlives this job.
                    let out = unsafe {
                        std::slice::from_raw_parts_mut(
                            (base as *mut f32).add(queries(t, h)),
                            group * hd,
                        )
                    };
                    out.copy_from_slice(o);
                }
            }
        };
        match pool {
            Some(pool) => pool.run(units.div_ceil(chunk), &job),
            None => (0..units.div_ceil(chunk)).for_each(job),
        }
    }

    /// `tokens` at positions `pos0..` through this rank's share; the next token after the
    /// last, greedy, the same on every rank.
    fn forward(&mut self, c: &mut dyn Collective, tokens: &[u32], pos0: usize) -> Result<u32> {
        let n = tokens.len();
        if pos0 + n > self.cfg.context {
            bail!(
                "position {} is past the model's context of {}",
                pos0 + n - 1,
                self.cfg.context
            );
        }
        let cfg = self.cfg.clone();
        let (dim, hd) = (cfg.dim, cfg.head_dim);
        let (rank, size, pipeline) = match self.split {
            Split::Tensor { rank, size } => (rank, size, false),
            Split::Pipeline { rank, size } => (rank, size, true),
        };
        let mut x = vec![0f32; n * dim];
        if !pipeline || rank == 0 {
            for (t, xr) in tokens.iter().zip(x.chunks_exact_mut(dim)) {
                self.embed(*t, xr)?;
            }
        } else {
            c.recv_from(rank - 1, &mut x)?;
        }
        let (nq, nkv) = (self.local_heads * hd, self.local_kv * hd);
        let mut h = vec![0f32; n * dim];
        let mut q = vec![0f32; n * nq];
        let mut k = vec![0f32; n * nkv];
        let mut v = vec![0f32; n * nkv];
        let mut att = vec![0f32; n * nq];
        let mut o = vec![0f32; n * dim];
        // A product's input quantized once for every matrix that takes it (cleared whenever
        // the input changes).
        let mut quantized = Quantized::default();
        let product = |m: &Matrix, x: &[f32], y: &mut [f32], t: &Threads, qz: &mut Quantized| {
            if n == 1 {
                m.apply(x, y, t);
            } else {
                m.apply_batch(x, n, y, t, qz);
            }
        };
        // Each token's rotation (sine and cosine per pair of a head), the same for every head
        // and layer.
        let rotations: Vec<Vec<(f32, f32)>> = (0..n).map(|t| self.rotation(pos0 + t)).collect();
        for li in 0..self.layers.len() {
            for (xr, hr) in x.chunks_exact(dim).zip(h.chunks_exact_mut(dim)) {
                self.rms_norm(xr, &self.layers[li].attn_norm, hr);
            }
            let l = &self.layers[li];
            quantized.clear();
            product(&l.wq, &h, &mut q, &self.threads, &mut quantized);
            product(&l.wk, &h, &mut k, &self.threads, &mut quantized);
            product(&l.wv, &h, &mut v, &self.threads, &mut quantized);
            for t in 0..n {
                self.enter(
                    li,
                    &mut q[t * nq..(t + 1) * nq],
                    &mut k[t * nkv..(t + 1) * nkv],
                    &v[t * nkv..(t + 1) * nkv],
                    &rotations[t],
                );
            }
            self.attend(li, &q, n, pos0, &mut att);
            let l = &self.layers[li];
            quantized.clear();
            product(&l.wo, &att, &mut o, &self.threads, &mut quantized);
            if !pipeline {
                // Tensor parallel: each rank holds part of the sum.
                c.all_sum(&mut o)?;
            }
            for (a, b) in x.iter_mut().zip(&o) {
                *a += b;
            }
            for (xr, hr) in x.chunks_exact(dim).zip(h.chunks_exact_mut(dim)) {
                self.rms_norm(xr, &self.layers[li].ffn_norm, hr);
            }
            let l = &self.layers[li];
            let f = l.gate.rows;
            let mut g = vec![0f32; n * f];
            let mut u = vec![0f32; n * f];
            quantized.clear();
            product(&l.gate, &h, &mut g, &self.threads, &mut quantized);
            product(&l.up, &h, &mut u, &self.threads, &mut quantized);
            for (a, b) in g.iter_mut().zip(&u) {
                *a = *a / (1.0 + (-*a).exp()) * b;
            }
            quantized.clear();
            product(&l.down, &g, &mut o, &self.threads, &mut quantized);
            if !pipeline {
                // Tensor parallel: each rank holds part of the sum.
                c.all_sum(&mut o)?;
            }
            for (a, b) in x.iter_mut().zip(&o) {
                *a += b;
            }
        }
        if pipeline && rank + 1 != size {
            c.send_to(rank + 1, &x)?;
            let mut t = 0u32;
            c.share_choice(size - 1, &mut t, &mut self.score)?;
            return Ok(t);
        }
        // Only the last token's scores choose the next one.
        let last = x[(n - 1) * dim..].to_vec();
        let mut xl = vec![0f32; dim];
        self.rms_norm(&last, &self.out_norm, &mut xl);
        let mut logits = std::mem::take(&mut self.logits);
        logits.resize(self.out.rows, 0.0);
        self.out.apply(&xl, &mut logits, &self.threads);
        self.logits = logits;
        let (at, best) = argmax(&self.logits);
        let mut t = if pipeline {
            self.score = best;
            (self.out_first + at) as u32
        } else {
            let (score, at) = c.all_maxloc(best, self.out_first + at)?;
            self.score = score;
            at as u32
        };
        if pipeline {
            c.share_choice(size - 1, &mut t, &mut self.score)?;
        }
        Ok(t)
    }

    /// Bytes of weights one step reads: every matrix of this rank's layers and its share of
    /// the output rows (the embedding contributes one row, left out).
    pub fn bytes_per_token(&self) -> usize {
        self.weights_read_per_token().iter().map(|s| s.len()).sum()
    }

    /// The memory behind [`Self::bytes_per_token`], for timing how fast this host reads it.
    pub fn weights_read_per_token(&self) -> Vec<&[u8]> {
        self.layers
            .iter()
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down])
            .chain([&self.out])
            .flat_map(Matrix::memory)
            .collect()
    }

    /// How fast this rank reads the weights a step reads, in bytes/s: the best of eight timed
    /// passes over those very weights, dealt out over the decode's own threads as its products
    /// deal out rows. Weights that sit in the host's caches are read at the caches' speed
    /// here as in the decode, so the ceiling quoted from it holds there too; no buffer is
    /// allocated beside them.
    pub fn read_bandwidth(&self) -> f64 {
        let weights = self.weights_read_per_token();
        let total: usize = weights.iter().map(|w| w.len()).sum();
        if total == 0 {
            return 0.0;
        }
        // Pieces of at most 256 KiB, a few per thread, each read start to end by one thread.
        const PIECE: usize = 256 << 10;
        let pieces: Vec<&[u8]> = weights.iter().flat_map(|w| w.chunks(PIECE)).collect();
        let threads = self.threads.count();
        let per_job = pieces
            .len()
            .div_ceil(super::pool::MAX_CHUNKS)
            .max(pieces.len().div_ceil(16 * threads))
            .max(1);
        let jobs: Vec<&[&[u8]]> = pieces.chunks(per_job).collect();
        let read = |i: usize| {
            let mut acc = [0u64; 4];
            for p in jobs[i] {
                let words = p.chunks_exact(32);
                for w in words.clone() {
                    for (k, a) in acc.iter_mut().enumerate() {
                        let b: [u8; 8] = w[8 * k..8 * k + 8].try_into().unwrap_or([0; 8]);
                        *a = a.wrapping_add(u64::from_ne_bytes(b));
                    }
                }
                for b in words.remainder() {
                    acc[0] = acc[0].wrapping_add(*b as u64);
                }
            }
            std::hint::black_box(acc);
        };
        // Tiny models are read several times a round, so a round is long enough to time.
        let passes = (64usize << 20).div_ceil(total).max(1);
        let mut best = 0f64;
        // One untimed round brings the weights in, as the previous token did.
        for round in 0..9 {
            let t = std::time::Instant::now();
            for _ in 0..if round == 0 { 1 } else { passes } {
                match &self.threads.pool {
                    Some(pool) => pool.run(jobs.len(), &read),
                    None => (0..jobs.len()).for_each(read),
                }
            }
            let secs = t.elapsed().as_secs_f64();
            if round > 0 && secs > 0.0 {
                best = best.max((total * passes) as f64 / secs);
            }
        }
        best
    }

    /// The sum of the matrices' sizes (equals [`Self::bytes_per_token`]).
    #[cfg(test)]
    fn matrix_bytes(&self) -> usize {
        let m = |x: &Matrix| x.bytes();
        self.layers
            .iter()
            .map(|l| m(&l.wq) + m(&l.wk) + m(&l.wv) + m(&l.wo) + m(&l.gate) + m(&l.up) + m(&l.down))
            .sum::<usize>()
            + m(&self.out)
    }

    /// How this rank holds its weights, e.g. "q4_1, q8_0 blocks x 8-bit activations".
    pub fn held(&self) -> String {
        let mut kinds: Vec<&str> = self
            .layers
            .iter()
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down])
            .chain([&self.out])
            .map(Matrix::held)
            .collect();
        kinds.sort_unstable();
        kinds.dedup();
        let blocks: Vec<&str> = kinds.iter().copied().filter(|k| *k != "f32").collect();
        let mut parts = Vec::new();
        if !blocks.is_empty() {
            parts.push(format!("{} blocks x 8-bit activations", blocks.join(", ")));
        }
        if kinds.contains(&"f32") {
            parts.push("f32".to_string());
        }
        parts.join(" + ")
    }

    /// The last step's scores of this rank's output rows, from token id `out_first` on (all of
    /// them on a single rank); empty on a pipeline stage that scores nothing.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    /// The score of the token the last step chose (the same on every rank).
    pub fn score(&self) -> f32 {
        self.score
    }

    /// Forgets the context (the KV cache), for a fresh sequence.
    pub fn reset(&mut self) {
        for l in &mut self.layers {
            l.kv.iter_mut().for_each(KvHead::clear);
        }
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::decode::gguf::{self, Meta};

    /// Tokens of the tiny llama's vocabulary: printable ASCII (byte-level BPE keeps those
    /// bytes as themselves), 'Ġ' and 'Ċ' for a space and a newline, a few merges' results and two control tokens.
    fn tiny_vocab() -> (Vec<String>, Vec<String>, Vec<i64>) {
        let mut tokens: Vec<String> = (b'!'..=b'~').map(|b| (b as char).to_string()).collect();
        // GPT-2's byte characters for a space and a newline.
        tokens.push("Ġ".into());
        tokens.push("Ċ".into());
        let merges: Vec<String> = ["H e", "l l", "He ll", "Ġ w", "o r", "Ġw or"]
            .iter()
            .map(|m| m.to_string())
            .collect();
        tokens.extend(merges.iter().map(|m| m.replace(' ', "")));
        let mut types = vec![1i64; tokens.len()];
        for special in ["<|im_start|>", "<|im_end|>"] {
            tokens.push(special.into());
            types.push(3);
        }
        (tokens, merges, types)
    }

    /// A tiny llama-shaped model's metadata and tensors, as `tbbench infer --gguf` reads
    /// them: 2 layers of width 64 (4 heads of 16 over 2 KV heads), a feed-forward of 96, the
    /// vocabulary above with its tokenizer metadata, and weights in every type the decode
    /// reads. `tied` leaves out output.weight (the embedding scores).
    pub fn tiny_llama_parts(tied: bool) -> (Vec<(&'static str, Meta)>, Vec<gguf::tests::Tensor>) {
        let (dim, ffn, kv) = (64u64, 96u64, 32u64);
        let (tokens, merges, types) = tiny_vocab();
        let vocab = tokens.len() as u64;
        let strs = |v: &[String]| Meta::Array(v.iter().map(|s| Meta::Str(s.clone())).collect());
        let kvs = vec![
            ("general.architecture", Meta::Str("llama".into())),
            ("general.alignment", Meta::Uint(32)),
            ("llama.block_count", Meta::Uint(2)),
            ("llama.context_length", Meta::Uint(32)),
            ("llama.embedding_length", Meta::Uint(dim)),
            ("llama.feed_forward_length", Meta::Uint(ffn)),
            ("llama.attention.head_count", Meta::Uint(4)),
            ("llama.attention.head_count_kv", Meta::Uint(2)),
            ("llama.attention.layer_norm_rms_epsilon", Meta::Float(1e-5)),
            ("llama.rope.freq_base", Meta::Float(10000.0)),
            ("llama.vocab_size", Meta::Uint(vocab)),
            ("tokenizer.ggml.model", Meta::Str("gpt2".into())),
            ("tokenizer.ggml.tokens", strs(&tokens)),
            (
                "tokenizer.ggml.token_type",
                Meta::Array(types.into_iter().map(Meta::Int).collect()),
            ),
            ("tokenizer.ggml.merges", strs(&merges)),
            ("tokenizer.ggml.bos_token_id", Meta::Uint(vocab - 2)),
            ("tokenizer.ggml.eos_token_id", Meta::Uint(vocab - 1)),
        ];
        let mut seed = 0u32;
        let mut weights = |kind: u32, row: u64, rows: u64| -> Vec<u8> {
            seed += 1;
            let n = (row * rows) as usize;
            match kind {
                quant::F32 => (0..n)
                    .flat_map(|i| {
                        (((i * 7 + seed as usize) % 13) as f32 / 40.0 - 0.15).to_le_bytes()
                    })
                    .collect(),
                quant::F16 => (0..n)
                    .flat_map(|i| [0x1e, if i % 2 == 0 { 0x21 } else { 0xa1 }])
                    .collect(),
                quant::Q4_0 => {
                    let mut d = noise(n / 32 * 18, seed);
                    for b in d.chunks_exact_mut(18) {
                        b[..2].copy_from_slice(&0x211eu16.to_le_bytes());
                    }
                    d
                }
                _ => blocks(kind, n / 32),
            }
        };
        let norm = |w: &mut dyn FnMut(u32, u64, u64) -> Vec<u8>| w(quant::F32, dim, 1);
        let mut t: Vec<gguf::tests::Tensor> = Vec::new();
        t.push((
            "token_embd.weight".into(),
            vec![dim, vocab],
            quant::Q8_0,
            weights(quant::Q8_0, dim, vocab),
        ));
        t.push((
            "output_norm.weight".into(),
            vec![dim],
            quant::F32,
            norm(&mut weights),
        ));
        if !tied {
            t.push((
                "output.weight".into(),
                vec![dim, vocab],
                quant::F16,
                weights(quant::F16, dim, vocab),
            ));
        }
        for l in 0..2 {
            let mut m = |name: &str, kind: u32, row: u64, rows: u64| {
                let dims = if rows == 1 {
                    vec![row]
                } else {
                    vec![row, rows]
                };
                t.push((
                    format!("blk.{l}.{name}.weight"),
                    dims,
                    kind,
                    weights(kind, row, rows),
                ));
            };
            m("attn_norm", quant::F32, dim, 1);
            m("ffn_norm", quant::F32, dim, 1);
            m("attn_q", quant::Q4_0, dim, dim);
            m("attn_k", quant::Q4_1, dim, kv);
            m("attn_v", quant::Q8_0, dim, kv);
            m("attn_output", quant::F16, dim, dim);
            m("ffn_gate", quant::Q8_0, dim, ffn);
            m("ffn_up", quant::Q4_1, dim, ffn);
            m("ffn_down", quant::F32, ffn, dim);
        }
        (kvs, t)
    }

    pub fn tiny_llama(tied: bool) -> Vec<u8> {
        let (kvs, t) = tiny_llama_parts(tied);
        gguf::tests::write(&kvs, &t)
    }

    /// The tiny llama loads, tokenizes and decodes, whole and split.
    /// The read-bandwidth pass covers exactly the bytes a step reads, on one thread or many.
    #[test]
    fn the_bandwidth_pass_reads_what_a_step_reads() {
        let g = Gguf::parse(tiny_llama(false)).unwrap();
        for split in [
            Split::Tensor { rank: 0, size: 1 },
            Split::Tensor { rank: 1, size: 2 },
            Split::Pipeline { rank: 0, size: 2 },
        ] {
            let mut s = Shard::load(&g, split).unwrap();
            assert_eq!(s.bytes_per_token(), s.matrix_bytes(), "{split:?}");
            assert!(s.bytes_per_token() > 0);
            for threads in [1, 3] {
                s.set_threads(threads).unwrap();
                let bw = s.read_bandwidth();
                assert!(bw.is_finite() && bw > 0.0, "{split:?} {threads}: {bw}");
            }
        }
    }

    /// A prompt run as one batch, or in two, leaves the same scores bit for bit as running
    /// its tokens one step at a time, and chooses the same next token.
    #[test]
    fn prefill_in_batches_equals_stepping_token_by_token() {
        let g = Gguf::parse(tiny_llama(false)).unwrap();
        let tok = super::super::tokenizer::Tokenizer::from_gguf(&g).unwrap();
        let prompt = tok.encode(&tok.chat("Hello world, how are you"));
        // The tiny model's context is 32: room for the prompt and one more step.
        let prompt = &prompt[..prompt.len().min(24)];
        assert!(prompt.len() > 8, "{prompt:?}");
        let bits = |s: &Shard| s.logits().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for threads in [1, 3] {
            let mut stepped = Shard::load(&g, Split::Tensor { rank: 0, size: 1 }).unwrap();
            stepped.set_threads(threads).unwrap();
            let mut want = 0;
            for (pos, t) in prompt.iter().enumerate() {
                want = stepped.step(&mut Alone, *t, pos).unwrap();
            }
            let mut whole = Shard::load(&g, Split::Tensor { rank: 0, size: 1 }).unwrap();
            whole.set_threads(threads).unwrap();
            assert_eq!(whole.prefill(&mut Alone, prompt, 0).unwrap(), want);
            assert_eq!(bits(&whole), bits(&stepped), "one batch, {threads} threads");
            let mut halves = Shard::load(&g, Split::Tensor { rank: 0, size: 1 }).unwrap();
            halves.set_threads(threads).unwrap();
            let cut = prompt.len() / 2 + 1;
            halves.prefill(&mut Alone, &prompt[..cut], 0).unwrap();
            assert_eq!(
                halves.prefill(&mut Alone, &prompt[cut..], cut).unwrap(),
                want
            );
            assert_eq!(
                bits(&halves),
                bits(&stepped),
                "two batches, {threads} threads"
            );
            // And the next step from there is the same too.
            let next = |s: &mut Shard| s.step(&mut Alone, want, prompt.len()).unwrap();
            assert_eq!(next(&mut whole), next(&mut stepped));
            assert_eq!(bits(&whole), bits(&stepped));
        }
    }

    #[test]
    fn tiny_llama_runs_whole_and_split() {
        for tied in [false, true] {
            let g = Gguf::parse(tiny_llama(tied)).unwrap();
            let tok = super::super::tokenizer::Tokenizer::from_gguf(&g).unwrap();
            let prompt = tok.encode(&tok.chat("Hello world"));
            assert!(prompt.len() > 5, "{prompt:?}");
            assert_eq!(tok.decode(&prompt), tok.chat("Hello world"));
            let run = |split| {
                let mut s = Shard::load(&g, split).unwrap();
                (0..4)
                    .map(|pos| s.step(&mut Alone, prompt[pos], pos).unwrap())
                    .collect::<Vec<_>>()
            };
            let whole = run(Split::Tensor { rank: 0, size: 1 });
            assert!(whole
                .iter()
                .all(|t| (*t as usize) < g.strings("tokenizer.ggml.tokens").unwrap().len()));
            Shard::load(&g, Split::Tensor { rank: 1, size: 2 }).unwrap();
            Shard::load(&g, Split::Pipeline { rank: 1, size: 2 }).unwrap();
        }
    }

    /// The tiny llama after `edit`, loaded whole: the error line it is refused with.
    fn refused(
        edit: impl FnOnce(&mut Vec<(&'static str, Meta)>, &mut Vec<gguf::tests::Tensor>),
    ) -> String {
        let (mut kvs, mut t) = tiny_llama_parts(false);
        edit(&mut kvs, &mut t);
        let g = Gguf::parse(gguf::tests::write(&kvs, &t)).unwrap();
        let e = Shard::load(&g, Split::Tensor { rank: 0, size: 1 })
            .err()
            .expect("refused");
        let e = format!("{e:#}");
        assert!(!e.contains('\n'), "one line: {e}");
        e
    }

    fn set(kvs: &mut [(&'static str, Meta)], key: &str, v: Meta) {
        kvs.iter_mut().find(|(k, _)| *k == key).unwrap().1 = v;
    }

    fn reshape(t: &mut [gguf::tests::Tensor], name: &str, dims: Vec<u64>) {
        t.iter_mut().find(|x| x.0 == name).unwrap().1 = dims;
    }

    #[test]
    fn embedding_with_fewer_rows_than_the_vocabulary_is_refused() {
        let e = refused(|_, t| reshape(t, "token_embd.weight", vec![64, 50]));
        assert!(
            e.contains("tensor 'token_embd.weight' (entry at byte")
                && e.contains("has dims [64, 50] where the hyper-parameters (width 64, 4 heads, 2 KV heads, feed-forward 96, vocabulary 104) need at least [64, 104]"),
            "{e}"
        );
    }

    #[test]
    fn layer_tensor_shape_off_the_hyper_parameters_is_refused() {
        let e = refused(|_, t| reshape(t, "blk.1.attn_k.weight", vec![64, 16]));
        assert!(
            e.contains("tensor 'blk.1.attn_k.weight'") && e.contains("need [64, 32]"),
            "{e}"
        );
        let e = refused(|_, t| reshape(t, "blk.0.ffn_down.weight", vec![96, 64, 2]));
        assert!(e.contains("has dims [96, 64, 2]"), "{e}");
        // A narrower width than the tensors hold would read part of each row.
        let e = refused(|kvs, _| set(kvs, "llama.embedding_length", Meta::Uint(32)));
        assert!(
            e.contains("'token_embd.weight'") && e.contains("need at least [32, 104]"),
            "{e}"
        );
    }

    #[test]
    fn zero_and_huge_hyper_parameters_are_refused() {
        let cases = [
            (
                "llama.attention.head_count",
                Meta::Uint(0),
                "is 0, outside 1..=64",
            ),
            (
                "llama.attention.head_count_kv",
                Meta::Uint(1 << 40),
                "outside 1..=4",
            ),
            (
                "llama.embedding_length",
                Meta::Uint(0),
                "is 0, outside 1..=",
            ),
            (
                "llama.block_count",
                Meta::Uint(u64::MAX),
                "outside 0..=4294967295",
            ),
            ("llama.context_length", Meta::Uint(0), "is 0, outside 1..="),
            (
                "llama.feed_forward_length",
                Meta::Int(-1),
                "is the number -1, not a count",
            ),
            ("llama.vocab_size", Meta::Uint(1 << 33), "outside 1..="),
        ];
        for (key, v, want) in cases {
            let e = refused(|kvs, _| set(kvs, key, v));
            assert!(
                e.contains(&format!("metadata '{key}' (at byte ")) && e.contains(want),
                "{key}: {e}"
            );
        }
        let e = refused(|kvs, _| set(kvs, "llama.attention.head_count", Meta::Uint(3)));
        assert!(
            e.contains("3 heads, 2 KV heads over width 64 do not fit"),
            "{e}"
        );
    }

    #[test]
    fn missing_layer_tensor_is_refused() {
        let e = refused(|kvs, _| set(kvs, "llama.block_count", Meta::Uint(3)));
        assert!(e.contains("no tensor 'blk.2.attn_norm.weight'"), "{e}");
        let e = refused(|_, t| t.retain(|x| x.0 != "blk.1.ffn_down.weight"));
        assert!(e.contains("no tensor 'blk.1.ffn_down.weight'"), "{e}");
    }

    #[test]
    fn unreadable_tensor_type_is_refused_with_its_name() {
        let e = refused(|_, t| {
            t.iter_mut()
                .find(|x| x.0 == "blk.0.attn_q.weight")
                .unwrap()
                .2 = 12;
        });
        assert!(
            e.contains("tensor 'blk.0.attn_q.weight' (entry at byte") && e.contains("k-quant"),
            "{e}"
        );
        // A type with no known size has unchecked dims: refused before anything is sized
        // from them.
        let e = refused(|_, t| {
            let norm = t.iter_mut().find(|x| x.0 == "output_norm.weight").unwrap();
            (norm.1, norm.2) = (vec![1 << 40, 1 << 20], 12);
        });
        assert!(
            e.contains("tensor 'output_norm.weight'") && e.contains("k-quant"),
            "{e}"
        );
    }

    /// A GGUF holding the given tensors (name, dims, ggml type, bytes), no metadata.
    fn gguf_with(tensors: &[(&str, Vec<u64>, u32, Vec<u8>)]) -> Gguf {
        let tensors: Vec<_> = tensors
            .iter()
            .map(|(n, d, t, b)| (n.to_string(), d.clone(), *t, b.clone()))
            .collect();
        Gguf::parse(gguf::tests::write(&[], &tensors)).unwrap()
    }

    /// Deterministic pseudo-random bytes.
    fn noise(n: usize, seed: u32) -> Vec<u8> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 24) as u8
            })
            .collect()
    }

    /// Q4_0, Q4_1 and Q8_0 blocks with sane f16 scales (0.01; Q4_1's minimum −0.5) and random
    /// quants.
    fn blocks(kind: u32, n_blocks: usize) -> Vec<u8> {
        let (fb, at) = match kind {
            quant::Q8_0 => (34, 2),
            quant::Q4_0 => (18, 2),
            _ => (20, 4),
        };
        let mut out = noise(n_blocks * fb, kind + 7);
        for b in out.chunks_exact_mut(fb) {
            b[..2].copy_from_slice(&0x211eu16.to_le_bytes()); // ~0.01
            if at == 4 {
                b[2..4].copy_from_slice(&0xb800u16.to_le_bytes()); // -0.5
            }
        }
        out
    }

    /// Kept blocks times x against the same weights dequantized, in f64 with x exact: within
    /// what rounding x to 8 bits per block allows. And two ranks' column halves, each
    /// quantizing its own half of x, add up to the whole row, as tensor parallelism needs.
    #[test]
    fn block_products_match_the_dequantized_weights_and_split_at_block_edges() {
        let (rows, cols) = (3usize, 128usize);
        let one = Threads::new(1).unwrap();
        for kind in [quant::Q4_1, quant::Q8_0, quant::Q4_0] {
            let data = blocks(kind, rows * cols / 32);
            let g = gguf_with(&[("w", vec![cols as u64, rows as u64], kind, data.clone())]);
            let x: Vec<f32> = (0..cols)
                .map(|i| ((i * 37 % 11) as f32 - 5.0) / 7.0)
                .collect();
            let kept = Matrix::load(&g, "w", (0, rows), (0, cols)).unwrap();
            assert!(matches!(kept.w, Weights::Blocks { .. }));
            let mut wide = vec![0f32; rows * cols];
            quant::dequantize(kind, &data, &mut wide).unwrap();
            let mut b = vec![0f32; rows];
            kept.apply(&x, &mut b, &one);
            for (r, got) in b.iter().enumerate() {
                let w = &wide[r * cols..(r + 1) * cols];
                let exact: f64 = w.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
                // Each x moves by at most half its block's step (max|x|/127/2).
                let bound: f64 =
                    w.iter().map(|a| a.abs() as f64).sum::<f64>() * (5.0 / 7.0) / 254.0;
                assert!(
                    (*got as f64 - exact).abs() <= bound * 1.01 + 1e-6,
                    "type {kind} row {r}: {got} vs {exact} (bound {bound})"
                );
            }
            let left = Matrix::load(&g, "w", (0, rows), (0, 64)).unwrap();
            let right = Matrix::load(&g, "w", (0, rows), (64, 128)).unwrap();
            let (mut l, mut r) = (vec![0f32; rows], vec![0f32; rows]);
            left.apply(&x[..64], &mut l, &one);
            right.apply(&x[64..], &mut r, &one);
            for i in 0..rows {
                assert!((l[i] + r[i] - b[i]).abs() <= 1e-6 * b[i].abs().max(1.0));
            }
            // Off block edges the columns are held as f32 and multiplied exactly.
            let odd = Matrix::load(&g, "w", (0, rows), (16, 48)).unwrap();
            assert_eq!(odd.held(), "f32");
            let mut y = vec![0f32; rows];
            odd.apply(&x[16..48], &mut y, &one);
            let exact: f64 = wide[16..48]
                .iter()
                .zip(&x[16..48])
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum();
            assert!((y[0] as f64 - exact).abs() <= 1e-5 * exact.abs().max(1.0));
        }
    }

    /// A matrix whose rows are kept in groups of eight (where the kernel has the grouped
    /// product: the x86 ones) gives each row's product bit for bit, as the row alone gives
    /// it: token by token and for a prompt's batch, on one thread and on several (203 rows
    /// of 192: 25 groups and 3 rows past them, enough weights to be split).
    #[test]
    fn grouped_rows_give_each_rows_own_product() {
        let (rows, cols, n) = (203usize, 192usize, 5usize);
        for kind in [quant::Q4_0, quant::Q4_1, quant::Q8_0] {
            let data = blocks(kind, rows * cols / 32);
            let g = gguf_with(&[("w", vec![cols as u64, rows as u64], kind, data)]);
            let m = Matrix::load(&g, "w", (0, rows), (0, cols)).unwrap();
            let Weights::Blocks { grouped, .. } = m.w else {
                panic!("blocks kept")
            };
            assert_eq!(grouped, qdot::groups_pay(), "type {kind}");
            let x: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 37 % 19) as f32 - 9.0) / 5.0)
                .collect();
            let one = Threads::new(1).unwrap();
            let mut want = vec![0f32; n * rows];
            for r in 0..rows {
                let alone = Matrix::load(&g, "w", (r, r + 1), (0, cols)).unwrap();
                for t in 0..n {
                    let mut y = [0f32];
                    alone.apply(&x[t * cols..(t + 1) * cols], &mut y, &one);
                    want[t * rows + r] = y[0];
                }
            }
            let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            for threads in [1, 3] {
                let th = Threads::new(threads).unwrap();
                let mut got = vec![0f32; n * rows];
                for t in 0..n {
                    let y = &mut got[t * rows..(t + 1) * rows];
                    m.apply(&x[t * cols..(t + 1) * cols], y, &th);
                }
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "type {kind}, {threads} threads, steps"
                );
                let mut batch = vec![0f32; n * rows];
                m.apply_batch(&x, n, &mut batch, &th, &mut Quantized::default());
                assert_eq!(
                    bits(&batch),
                    bits(&want),
                    "type {kind}, {threads} threads, batch"
                );
            }
        }
    }

    /// Rows dealt out over threads give bit-identical products to one thread (big enough to
    /// be split: 1000 rows of 256).
    #[test]
    fn threads_do_not_change_products() {
        let (rows, cols) = (1000usize, 256usize);
        let g = gguf_with(&[(
            "w",
            vec![cols as u64, rows as u64],
            quant::Q4_1,
            blocks(quant::Q4_1, rows * cols / 32),
        )]);
        let m = Matrix::load(&g, "w", (0, rows), (0, cols)).unwrap();
        let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut want = vec![0f32; rows];
        m.apply(&x, &mut want, &Threads::new(1).unwrap());
        for n in [2, 3, 7] {
            let t = Threads::new(n).unwrap();
            assert_eq!(t.count(), n);
            let mut got = vec![0f32; rows];
            m.apply(&x, &mut got, &t);
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{n} threads"
            );
        }
    }

    /// `predict` reads a model's shape from its header alone: the same configuration as the
    /// whole file gives, when the first read stops inside the header; a file cut inside its
    /// header is still refused.
    #[test]
    fn the_header_alone_gives_the_models_configuration() {
        let bytes = tiny_llama(false);
        let dir = std::env::temp_dir().join(format!("tbbench-gguf-meta-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tiny.gguf");
        std::fs::write(&path, &bytes).unwrap();
        let whole = Config::from_gguf(&Gguf::open(&path).unwrap()).unwrap();
        let head = Config::from_gguf(&Gguf::open_metadata_from(&path, 64).unwrap()).unwrap();
        assert_eq!(format!("{whole:?}"), format!("{head:?}"));
        let cut = dir.join("cut.gguf");
        std::fs::write(&cut, &bytes[..200]).unwrap();
        let Err(e) = Gguf::open_metadata_from(&cut, 64) else {
            panic!("a header cut short was read");
        };
        let e = format!("{e:#}");
        assert!(e.contains("cut.gguf"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
