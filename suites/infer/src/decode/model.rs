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

use super::gguf::Gguf;
use super::quant;
use anyhow::{bail, Result};
use serde::Serialize;

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
    pub fn from_gguf(g: &Gguf) -> Result<Config> {
        let arch = g.string("general.architecture")?;
        if !matches!(arch, "llama" | "mistral") {
            bail!("architecture '{arch}': the decode runs llama-family models only");
        }
        let k = |s: &str| format!("{arch}.{s}");
        let dim = g.uint(&k("embedding_length"))? as usize;
        let heads = g.uint(&k("attention.head_count"))? as usize;
        let kv_heads = g
            .uint(&k("attention.head_count_kv"))
            .map(|v| v as usize)
            .unwrap_or(heads);
        if heads == 0 || dim % heads != 0 || kv_heads == 0 || heads % kv_heads != 0 {
            bail!("{heads} heads, {kv_heads} KV heads over width {dim} do not fit together");
        }
        let vocab = match g.uint(&k("vocab_size")) {
            Ok(v) => v as usize,
            Err(_) => g.strings("tokenizer.ggml.tokens")?.len(),
        };
        Ok(Config {
            layers: g.uint(&k("block_count"))? as usize,
            dim,
            heads,
            kv_heads,
            head_dim: dim / heads,
            ffn: g.uint(&k("feed_forward_length"))? as usize,
            vocab,
            eps: g.float(&k("attention.layer_norm_rms_epsilon"))? as f32,
            rope_base: g.float(&k("rope.freq_base")).unwrap_or(10000.0) as f32,
            context: g.uint(&k("context_length"))? as usize,
        })
    }

    /// Rank counts tensor parallelism can split this model over: every count dividing the
    /// heads, the KV heads and the feed-forward width.
    pub fn tensor_parallel_sizes(&self) -> Vec<usize> {
        (1..=self.kv_heads)
            .filter(|n| self.kv_heads % n == 0 && self.heads % n == 0 && self.ffn % n == 0)
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

/// Rows of a weight matrix, as f32: `rows` outputs each reading `cols` inputs.
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub w: Vec<f32>,
}

impl Matrix {
    /// Rows `r0..r1`, columns `c0..c1` of a GGUF tensor (ggml: dims[0] is the row length).
    fn load(g: &Gguf, name: &str, rows: (usize, usize), cols: (usize, usize)) -> Result<Matrix> {
        let t = g.info(name)?;
        let row_len = t.dims[0] as usize;
        let n_rows = t.dims.get(1).copied().unwrap_or(1) as usize;
        if rows.1 > n_rows || cols.1 > row_len {
            bail!("tensor {name} is {n_rows}x{row_len}, smaller than the model says");
        }
        let data = g.data(t)?;
        let row_bytes = quant::bytes_of(t.ggml_type, row_len)?;
        let (nr, nc) = (rows.1 - rows.0, cols.1 - cols.0);
        let mut w = vec![0f32; nr * nc];
        let mut full = vec![0f32; row_len];
        for (i, r) in (rows.0..rows.1).enumerate() {
            let src = &data[r * row_bytes..(r + 1) * row_bytes];
            quant::dequantize(t.ggml_type, src, &mut full)?;
            w[i * nc..(i + 1) * nc].copy_from_slice(&full[cols.0..cols.1]);
        }
        Ok(Matrix {
            rows: nr,
            cols: nc,
            w,
        })
    }

    /// y = W x.
    pub fn apply(&self, x: &[f32], y: &mut [f32]) {
        for (r, yr) in y.iter_mut().enumerate().take(self.rows) {
            *yr = dot(&self.w[r * self.cols..(r + 1) * self.cols], x) as f32;
        }
    }
}

/// Dot product accumulated in f64 over eight independent lanes: the lanes let the compiler
/// vectorise and keep the adds from waiting on each other; f64 keeps a sum split over ranks
/// equal to the whole sum far below f32's precision.
pub fn dot(a: &[f32], b: &[f32]) -> f64 {
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
    let mut v = vec![0f32; t.elements() as usize];
    quant::dequantize(t.ggml_type, g.data(t)?, &mut v)?;
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
    /// [position][local kv head][head_dim]
    k_cache: Vec<f32>,
    v_cache: Vec<f32>,
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
    /// The chosen token, from the last stage to every stage.
    fn share_token(&mut self, root: usize, token: &mut u32) -> Result<()>;
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
    fn share_token(&mut self, _: usize, _: &mut u32) -> Result<()> {
        Ok(())
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
    out_norm: Vec<f32>,
    /// Output rows this rank scores, and their first token id.
    out: Matrix,
    out_first: usize,
    local_heads: usize,
    local_kv: usize,
    /// Bytes of weights this rank holds, as f32.
    pub weight_bytes: usize,
}

impl Shard {
    pub fn load(g: &Gguf, split: Split) -> Result<Shard> {
        let cfg = Config::from_gguf(g)?;
        split.check(&cfg)?;
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
        let hd = cfg.head_dim;
        let (h0, h1) = part(cfg.heads);
        let (k0, k1) = part(cfg.kv_heads);
        let (f0, f1) = part(cfg.ffn);
        let d = (0, cfg.dim);
        let range = split.layers(&cfg);
        let mut layers = Vec::new();
        for l in range.clone() {
            let n = |s: &str| format!("blk.{l}.{s}.weight");
            layers.push(Layer {
                attn_norm: vector(g, &n("attn_norm"))?,
                ffn_norm: vector(g, &n("ffn_norm"))?,
                wq: Matrix::load(g, &n("attn_q"), (h0 * hd, h1 * hd), d)?,
                wk: Matrix::load(g, &n("attn_k"), (k0 * hd, k1 * hd), d)?,
                wv: Matrix::load(g, &n("attn_v"), (k0 * hd, k1 * hd), d)?,
                wo: Matrix::load(g, &n("attn_output"), d, (h0 * hd, h1 * hd))?,
                gate: Matrix::load(g, &n("ffn_gate"), (f0, f1), d)?,
                up: Matrix::load(g, &n("ffn_up"), (f0, f1), d)?,
                down: Matrix::load(g, &n("ffn_down"), d, (f0, f1))?,
                k_cache: Vec::new(),
                v_cache: Vec::new(),
            });
        }
        let embd_info = g.info("token_embd.weight")?;
        let embd_row_bytes = quant::bytes_of(embd_info.ggml_type, cfg.dim)?;
        // Pipeline: only the first stage embeds and only the last scores; tensor: all do.
        let first = !matches!(split, Split::Pipeline { rank, .. } if rank != 0);
        let last = !matches!(split, Split::Pipeline { rank, size } if rank + 1 != size);
        let embd = if first {
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
        let (v0, v1) = if !last { (0, 0) } else { part(cfg.vocab) };
        let out = Matrix::load(g, out_name, (v0, v1), d)?;
        let out_norm = if last {
            vector(g, "output_norm.weight")?
        } else {
            Vec::new()
        };
        let weight_bytes = 4
            * (layers
                .iter()
                .map(|l| {
                    l.wq.w.len()
                        + l.wk.w.len()
                        + l.wv.w.len()
                        + l.wo.w.len()
                        + l.gate.w.len()
                        + l.up.w.len()
                        + l.down.w.len()
                })
                .sum::<usize>()
                + out.w.len())
            + embd.len();
        Ok(Shard {
            cfg,
            split,
            layers,
            embd_type: embd_info.ggml_type,
            embd_row_bytes,
            embd,
            out_norm,
            out,
            out_first: v0,
            local_heads: h1 - h0,
            local_kv: k1 - k0,
            weight_bytes,
        })
    }

    fn rms_norm(&self, x: &[f32], w: &[f32], out: &mut [f32]) {
        let ss: f64 = x.iter().map(|v| (*v as f64) * (*v as f64)).sum();
        let scale = 1.0 / ((ss / x.len() as f64) as f32 + self.cfg.eps).sqrt();
        for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
            *o = v * scale * g;
        }
    }

    /// Rotary embedding of one head at `pos`: adjacent pairs, as GGUF llama weights expect.
    fn rope(&self, v: &mut [f32], pos: usize) {
        let hd = self.cfg.head_dim;
        for i in 0..hd / 2 {
            let freq = self.cfg.rope_base.powf(-2.0 * i as f32 / hd as f32);
            let (s, c) = (pos as f32 * freq).sin_cos();
            let (a, b) = (v[2 * i], v[2 * i + 1]);
            v[2 * i] = a * c - b * s;
            v[2 * i + 1] = a * s + b * c;
        }
    }

    /// Runs `token` at `pos` through this rank's share; returns the next token (greedy), the
    /// same on every rank.
    pub fn step(&mut self, c: &mut dyn Collective, token: u32, pos: usize) -> Result<u32> {
        if pos >= self.cfg.context {
            bail!(
                "position {pos} is past the model's context of {}",
                self.cfg.context
            );
        }
        let cfg = self.cfg.clone();
        let (dim, hd) = (cfg.dim, cfg.head_dim);
        let mut x = vec![0f32; dim];
        let (rank, size, pipeline) = match self.split {
            Split::Tensor { rank, size } => (rank, size, false),
            Split::Pipeline { rank, size } => (rank, size, true),
        };
        if !pipeline || rank == 0 {
            let t = token as usize;
            if t >= cfg.vocab {
                bail!("token {t} is outside the vocabulary of {}", cfg.vocab);
            }
            let row = &self.embd[t * self.embd_row_bytes..(t + 1) * self.embd_row_bytes];
            quant::dequantize(self.embd_type, row, &mut x)?;
        } else {
            c.recv_from(rank - 1, &mut x)?;
        }
        let (nh, nkv) = (self.local_heads, self.local_kv);
        let group = cfg.heads / cfg.kv_heads;
        let mut h = vec![0f32; dim];
        let mut q = vec![0f32; nh * hd];
        let mut k = vec![0f32; nkv * hd];
        let mut v = vec![0f32; nkv * hd];
        let mut att = vec![0f32; nh * hd];
        let mut o = vec![0f32; dim];
        let mut scores = vec![0f32; pos + 1];
        for li in 0..self.layers.len() {
            self.rms_norm(&x, &self.layers[li].attn_norm, &mut h);
            let l = &self.layers[li];
            l.wq.apply(&h, &mut q);
            l.wk.apply(&h, &mut k);
            l.wv.apply(&h, &mut v);
            for hq in q.chunks_exact_mut(hd) {
                self.rope(hq, pos);
            }
            for hk in k.chunks_exact_mut(hd) {
                self.rope(hk, pos);
            }
            let l = &mut self.layers[li];
            l.k_cache.extend_from_slice(&k);
            l.v_cache.extend_from_slice(&v);
            let stride = nkv * hd;
            let inv = 1.0 / (hd as f32).sqrt();
            for head in 0..nh {
                let kvh = head / group;
                let qh = &q[head * hd..(head + 1) * hd];
                let mut max = f32::NEG_INFINITY;
                for (t, s) in scores.iter_mut().enumerate() {
                    let kt = &l.k_cache[t * stride + kvh * hd..t * stride + (kvh + 1) * hd];
                    *s = dot(qh, kt) as f32 * inv;
                    max = max.max(*s);
                }
                let mut total = 0f64;
                for s in scores.iter_mut() {
                    *s = (*s - max).exp();
                    total += *s as f64;
                }
                let out = &mut att[head * hd..(head + 1) * hd];
                out.fill(0.0);
                for (t, s) in scores.iter().enumerate() {
                    let p = (*s as f64 / total) as f32;
                    let vt = &l.v_cache[t * stride + kvh * hd..t * stride + (kvh + 1) * hd];
                    for (a, b) in out.iter_mut().zip(vt) {
                        *a += p * b;
                    }
                }
            }
            l.wo.apply(&att, &mut o);
            if !pipeline {
                // Tensor parallel: each rank holds part of the sum.
                c.all_sum(&mut o)?;
            }
            for (a, b) in x.iter_mut().zip(&o) {
                *a += b;
            }
            self.rms_norm(&x, &self.layers[li].ffn_norm, &mut h);
            let l = &self.layers[li];
            let mut g = vec![0f32; l.gate.rows];
            let mut u = vec![0f32; l.up.rows];
            l.gate.apply(&h, &mut g);
            l.up.apply(&h, &mut u);
            for (a, b) in g.iter_mut().zip(&u) {
                *a = *a / (1.0 + (-*a).exp()) * b;
            }
            l.down.apply(&g, &mut o);
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
            c.share_token(size - 1, &mut t)?;
            return Ok(t);
        }
        self.rms_norm(&x.clone(), &self.out_norm, &mut x);
        let mut logits = vec![0f32; self.out.rows];
        self.out.apply(&x, &mut logits);
        let (mut best, mut at) = (f32::NEG_INFINITY, 0usize);
        for (i, v) in logits.iter().enumerate() {
            if *v > best {
                best = *v;
                at = i;
            }
        }
        let mut t = if pipeline {
            (self.out_first + at) as u32
        } else {
            c.all_maxloc(best, self.out_first + at)?.1 as u32
        };
        if pipeline {
            c.share_token(size - 1, &mut t)?;
        }
        Ok(t)
    }

    /// Forgets the context (the KV cache), for a fresh sequence.
    pub fn reset(&mut self) {
        for l in &mut self.layers {
            l.k_cache.clear();
            l.v_cache.clear();
        }
    }
}
