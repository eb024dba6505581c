//! A model's hyper-parameters (from a GGUF's header or a published shape) and how it is
//! split over ranks (tensor or pipeline parallel).

use super::*;

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
    pub(super) fn check_tensors(&self, g: &Gguf) -> Result<()> {
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
