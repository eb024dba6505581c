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
//!
//! Files: `config.rs` the hyper-parameters and the split, `matrix.rs` the weights and their
//! products, `shard.rs` one rank's share, its step and the collective steps it needs
//! (`ShardComm`: what the runner's Comm provides across ranks, `Alone` on one process).

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

mod config;
mod matrix;
mod shard;
pub use config::*;
pub use matrix::*;
pub use shard::*;

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
