//! One rank's share of the model (its layers or its heads and columns), its KV cache, and a
//! token's step through it, with the collective steps between ranks (`ShardComm`).

use super::*;

pub(super) fn vector(g: &Gguf, name: &str) -> Result<Vec<f32>> {
    let t = g.info(name)?;
    let data = g.data(t)?;
    // The data is in memory, so its element count fits a usize.
    let mut v = vec![0f32; t.elements() as usize];
    quant::dequantize(t.ggml_type, data, &mut v)?;
    Ok(v)
}

pub(super) struct Layer {
    pub(super) attn_norm: Vec<f32>,
    pub(super) ffn_norm: Vec<f32>,
    pub(super) wq: Matrix,
    pub(super) wk: Matrix,
    pub(super) wv: Matrix,
    /// Columns of this rank's heads.
    pub(super) wo: Matrix,
    pub(super) gate: Matrix,
    pub(super) up: Matrix,
    /// Columns of this rank's feed-forward share.
    pub(super) down: Matrix,
    /// The KV cache, one per local KV head (f16: [`attention`]).
    pub(super) kv: Vec<KvHead>,
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
pub trait ShardComm {
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

impl ShardComm for Alone {
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
pub(super) const LAYER_MATRICES: [&str; 7] = [
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
pub(super) struct Share {
    pub(super) heads: (usize, usize),
    pub(super) kv: (usize, usize),
    pub(super) ffn: (usize, usize),
    pub(super) vocab: (usize, usize),
    pub(super) layers: std::ops::Range<usize>,
    pub(super) first: bool,
    pub(super) last: bool,
}

impl Share {
    pub(super) fn of(cfg: &Config, split: Split) -> Result<Share> {
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
    pub(super) fn layers(
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
    pub(super) layers: Vec<Layer>,
    /// Token embedding rows, kept in their file encoding and decoded one row per lookup.
    pub(super) embd_type: u32,
    pub(super) embd_row_bytes: usize,
    pub(super) embd: Vec<u8>,
    /// Synthetic models (`--shape`) make each embedding row from this seed and the token.
    pub(super) synthetic: Option<u64>,
    pub(super) out_norm: Vec<f32>,
    /// Output rows this rank scores, and their first token id.
    pub(super) out: Matrix,
    pub(super) out_first: usize,
    pub(super) local_heads: usize,
    pub(super) local_kv: usize,
    /// The threads its products run on (one until `set_threads`).
    pub(super) threads: Threads,
    /// Bytes of weights this rank holds, as held.
    pub weight_bytes: usize,
    /// The scores of the last step for this rank's output rows (every row on one rank), for
    /// checking a distributed run against the whole model.
    pub(super) logits: Vec<f32>,
    /// The score of the token the last step chose, over all ranks' output rows.
    pub(super) score: f32,
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
    pub(super) fn assemble(
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

    pub(super) fn rms_norm(&self, x: &[f32], w: &[f32], out: &mut [f32]) {
        let ss: f64 = x.iter().map(|v| (*v as f64) * (*v as f64)).sum();
        let scale = 1.0 / ((ss / x.len() as f64) as f32 + self.cfg.eps).sqrt();
        for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
            *o = v * scale * g;
        }
    }

    /// The rotary embedding's sine and cosine at `pos` for each pair of a head.
    pub(super) fn rotation(&self, pos: usize) -> Vec<(f32, f32)> {
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
    pub(super) fn rope(v: &mut [f32], rot: &[(f32, f32)]) {
        for (pair, (s, c)) in v.chunks_exact_mut(2).zip(rot) {
            let (a, b) = (pair[0], pair[1]);
            pair[0] = a * c - b * s;
            pair[1] = a * s + b * c;
        }
    }

    /// Runs `token` at `pos` through this rank's share; returns the next token (greedy), the
    /// same on every rank.
    pub fn step(&mut self, c: &mut dyn ShardComm, token: u32, pos: usize) -> Result<u32> {
        self.forward(c, &[token], pos)
    }

    /// Runs a prompt's `tokens`, at positions `pos0..`, through this rank's share as one batch;
    /// returns the token after the last (greedy), the same on every rank. The matrix products
    /// take all the tokens at once ([`Matrix::apply_batch`], each row bit for bit as one
    /// token's), attention goes token by token over the cache as in [`Shard::step`], and
    /// tensor-parallel sums and pipeline hand-overs carry the whole batch in one message.
    pub fn prefill(&mut self, c: &mut dyn ShardComm, tokens: &[u32], pos0: usize) -> Result<u32> {
        if tokens.is_empty() {
            bail!("an empty prompt has nothing to run");
        }
        self.forward(c, tokens, pos0)
    }

    /// The embedding of `token` into `x`.
    pub(super) fn embed(&self, token: u32, x: &mut [f32]) -> Result<()> {
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
    pub(super) fn enter(
        &mut self,
        li: usize,
        q: &mut [f32],
        k: &mut [f32],
        v: &[f32],
        rot: &[(f32, f32)],
    ) {
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
    pub(super) fn attend(&self, li: usize, q: &[f32], n: usize, pos0: usize, att: &mut [f32]) {
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
                .max(units.div_ceil(crate::decode::pool::MAX_CHUNKS));
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
            .max(units.div_ceil(crate::decode::pool::MAX_CHUNKS));
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
    pub(super) fn forward(
        &mut self,
        c: &mut dyn ShardComm,
        tokens: &[u32],
        pos0: usize,
    ) -> Result<u32> {
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
            .div_ceil(crate::decode::pool::MAX_CHUNKS)
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
    pub(super) fn matrix_bytes(&self) -> usize {
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
