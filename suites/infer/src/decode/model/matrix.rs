//! A weight matrix as a rank holds it (f32 or a quantized GGUF format, rows or a column
//! range), the products a token's step takes with it, and the threads they are spread over.

use super::*;

/// Rows of a weight matrix: `rows` outputs each reading `cols` inputs.
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub(super) w: Weights,
}

/// How a matrix keeps its weights. Block formats stay as the file has them (their scales
/// widened to f32), so a step reads 5 or 9 bits per weight instead of 32 (decode is bound by
/// reading weights, as llama.cpp's is) and multiplies them with integer products (qdot).
pub(super) enum Weights {
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
    pub(super) fn blocks(
        format: Format,
        scale: Vec<f32>,
        min: Vec<f32>,
        q: Vec<u8>,
        rows: usize,
    ) -> Weights {
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
    pub(super) fn load(
        g: &Gguf,
        name: &str,
        rows: (usize, usize),
        cols: (usize, usize),
    ) -> Result<Matrix> {
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
    pub(super) fn random(
        seed: u64,
        rows: (usize, usize),
        cols: (usize, usize),
        full_cols: usize,
    ) -> Matrix {
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
    pub(super) fn memory(&self) -> Vec<&[u8]> {
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
    pub(super) fn held(&self) -> &'static str {
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
        // of activations is several hundred KiB, and untiled the prompt ran markedly slower:
        // re-measure with `scripts/bench-infer.sh`'s pp512 rows). Grouped rows are handed out
        // in whole groups and put back into rows piece by piece for the tile product.
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
pub(super) fn grouping(grouped: bool, rows: usize) -> (usize, usize) {
    if grouped {
        (qdot::GROUP, rows / qdot::GROUP * qdot::GROUP)
    } else {
        (1, 0)
    }
}

/// Rows `rows` of a block matrix: their quants (`qbytes` per row), scales and, for Q4_1,
/// minimums (`nb` blocks per row; other formats have none).
pub(super) fn block_rows<'a>(
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
    pub(super) pool: Option<crate::decode::pool::Pool>,
}

impl Threads {
    /// Products smaller than this many weights run on the calling thread: handing them out
    /// costs more than it saves.
    pub(super) const MIN_PARALLEL: usize = 32 * 1024;

    pub fn new(n: usize) -> Result<Threads> {
        let pool = if n > 1 {
            Some(
                crate::decode::pool::Pool::new(n)
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
    pub(super) fn ranges(&self, weights: usize, count: usize, work: impl Fn(Range<usize>) + Sync) {
        match &self.pool {
            Some(pool) if weights >= Self::MIN_PARALLEL && count > 1 => {
                let chunk = count
                    .div_ceil(4 * pool.threads())
                    .max(count.div_ceil(crate::decode::pool::MAX_CHUNKS));
                pool.run(count.div_ceil(chunk), &|i| {
                    work(i * chunk..((i + 1) * chunk).min(count))
                });
            }
            _ => work(0..count),
        }
    }

    /// Runs `fill(first_row, rows)` over `y` in chunks, in parallel where it pays.
    pub(super) fn rows(
        &self,
        weights: usize,
        y: &mut [f32],
        fill: impl Fn(usize, &mut [f32]) + Sync,
    ) {
        self.rows_by(1, weights, y, fill)
    }

    /// `rows` in chunks of whole `unit`s of rows (the last one short where `y` ends).
    pub(super) fn rows_by(
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
    pub(super) fn each<T: Send>(
        &self,
        weights: usize,
        items: &mut [T],
        f: impl Fn(usize, &mut T) + Sync,
    ) {
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
    pub(super) acts: Vec<qdot::Q8Activation>,
    pub(super) ready: bool,
}

impl Quantized {
    /// Forgets the rows (the next product quantizes its input again).
    pub fn clear(&mut self) {
        self.ready = false;
    }

    /// `n` rows of `cols` values of `x`, quantized (on `threads`) unless they already are.
    pub(super) fn of(
        &mut self,
        x: &[f32],
        cols: usize,
        n: usize,
        threads: &Threads,
    ) -> &[qdot::Q8Activation] {
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

pub(super) fn splitmix(x: u64) -> u64 {
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
pub(super) fn dot_body(a: &[f32], b: &[f32]) -> f64 {
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
