//! Damaged GGUF files through everything `tbbench infer --gguf` does with one (read, load the
//! model whole and split, build the tokenizer, tokenize a chat prompt, generate, detokenize),
//! minus the network: each must end in Ok or one readable error line, never a panic, a hang
//! or an allocation the file cannot account for.
//!
//! The mutants come from a tiny llama-shaped model (model::tests::tiny_llama) damaged by a
//! seeded mutator: bit flips, bytes and whole fields overwritten with edge values, lengths
//! and counts grown or shrunk, truncation at and around every region boundary, chunks
//! spliced, inserted or cut. TBBENCH_FUZZ_ITERS sets how many mutants (default 30000, about
//! 20 s), TBBENCH_FUZZ_SEED the first seed (to replay one: that seed and ITERS=1).
//!
//! Memory is watched by a counting allocator: while a mutant runs, the bytes its thread holds
//! may not exceed a fixed multiple of the mutant's size (a request past that is reported with
//! its seed before the allocation fails).

use super::gguf::tests::{write_laid_out, Layout, Tensor};
use super::gguf::{Gguf, Meta};
use super::model::{tests::tiny_llama_parts, Alone, Shard, Split};
use super::tokenizer::Tokenizer;
use anyhow::{bail, Result};
use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// Bytes a mutant's run may hold at once, per byte of the mutant, plus a fixed allowance
/// (the prompt, the KV cache, small tables). The most any part of a file grows in memory is
/// a metadata array of 1-byte values, each held as a 32-byte Meta; the undamaged model holds
/// about 2.5 bytes per file byte.
const BYTES_PER_FILE_BYTE: usize = 48;
const FIXED_ALLOWANCE: usize = 1 << 20;

thread_local! {
    /// The byte budget while a mutant runs on this thread (0: not watching).
    static LIMIT: Cell<usize> = const { Cell::new(0) };
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
    static SEED: Cell<u64> = const { Cell::new(0) };
}

struct Counting;

/// Counts `delta` bytes against this thread's budget; false for a request past it.
fn count(delta: isize) -> bool {
    let limit = LIMIT.try_with(|l| l.get()).unwrap_or(0);
    if limit == 0 {
        return true;
    }
    let live = LIVE.with(|l| {
        let v = l.get() + delta;
        l.set(v);
        v
    });
    PEAK.with(|p| p.set(p.get().max(live)));
    if live > limit as isize {
        // Stop watching first: the report below allocates.
        LIMIT.with(|l| l.set(0));
        eprintln!(
            "fuzz seed {:#x}: {live} bytes held, over the {limit} the file accounts for",
            SEED.with(|s| s.get())
        );
        return false;
    }
    true
}

// SAFETY: every call is passed on to the system allocator unchanged; only a request over the
// budget is refused, by returning null as an allocator may.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: AllocLayout) -> *mut u8 {
        if !count(l.size() as isize) {
            return std::ptr::null_mut();
        }
        System.alloc(l)
    }
    unsafe fn alloc_zeroed(&self, l: AllocLayout) -> *mut u8 {
        if !count(l.size() as isize) {
            return std::ptr::null_mut();
        }
        System.alloc_zeroed(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: AllocLayout) {
        count(-(l.size() as isize));
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: AllocLayout, new: usize) -> *mut u8 {
        if !count(new as isize - l.size() as isize) {
            return std::ptr::null_mut();
        }
        System.realloc(p, l, new)
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// What `tbbench infer --gguf` does with a file, minus the network.
fn run_like_infer(bytes: Vec<u8>) -> Result<Vec<u32>> {
    let g = Gguf::parse(bytes)?;
    let mut shard = Shard::load(&g, Split::Tensor { rank: 0, size: 1 })?;
    let tok = Tokenizer::from_gguf(&g)?;
    let prompt = tok.encode(&tok.chat("Hello world, 42!"));
    if prompt.is_empty() {
        bail!("the prompt is empty after tokenization");
    }
    let n = 3;
    if prompt.len() + n > shard.cfg.context {
        bail!("prompt past the context");
    }
    let run = super::generate(&mut shard, &mut Alone, &prompt, n, None)?;
    tok.decode(&run.tokens);
    // Other ranks' shares read other parts of the tensors.
    for split in [
        Split::Tensor { rank: 1, size: 2 },
        Split::Pipeline { rank: 1, size: 2 },
    ] {
        if let Ok(mut s) = Shard::load(&g, split) {
            if matches!(split, Split::Tensor { .. }) {
                s.step(&mut Alone, prompt[0], 0)?;
            }
        }
    }
    Ok(run.tokens)
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        splitmix(&mut self.0)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// Values that break careless arithmetic, for a field of `width` bytes holding `old`.
fn edge_value(r: &mut Rng, width: usize, old: u64, file_len: u64) -> u64 {
    let top = if width == 4 {
        u32::MAX as u64
    } else {
        u64::MAX
    };
    let v = match r.below(14) {
        0 => 0,
        1 => 1,
        2 => top,
        3 => top / 2,
        4 => top / 2 + 1,
        5 => old.wrapping_add(1 + r.below(64) as u64),
        6 => old.wrapping_sub(1 + r.below(64) as u64),
        7 => old.wrapping_mul(2),
        8 => old / 2,
        9 => file_len,
        10 => file_len.wrapping_sub(old),
        11 => 1 << r.below(64),
        12 => u32::MAX as u64 + 1,
        _ => r.next(),
    };
    v & top
}

/// One damage to `b`, of a file laid out as `l`.
fn mutate(r: &mut Rng, b: &mut Vec<u8>, l: &Layout) {
    let len = b.len();
    if len == 0 {
        return;
    }
    // Most damage goes where the structure is: the header and the two tables.
    let tables_end = l
        .regions
        .iter()
        .copied()
        .filter(|p| *p < len)
        .max()
        .unwrap_or(len);
    let pos = |r: &mut Rng| {
        if r.below(4) == 0 {
            r.below(len)
        } else {
            r.below(tables_end.min(len).max(1))
        }
    };
    match r.below(9) {
        0 => {
            let at = pos(r);
            b[at] ^= 1 << r.below(8);
        }
        1 => {
            let at = pos(r);
            b[at] = [0, 0xff, 0x7f, 0x80, 1, b' '][r.below(6)];
        }
        2 | 3 => {
            // A count, length, type, dimension or offset field set to an edge value.
            let (at, width) = l.fields[r.below(l.fields.len())];
            if at + width <= len {
                let mut old = [0u8; 8];
                old[..width].copy_from_slice(&b[at..at + width]);
                let v = edge_value(r, width, u64::from_le_bytes(old), len as u64);
                b[at..at + width].copy_from_slice(&v.to_le_bytes()[..width]);
            }
        }
        4 => {
            // Cut at a region or field boundary, or just around one.
            let at = if r.below(2) == 0 {
                l.regions[r.below(l.regions.len())]
            } else {
                l.fields[r.below(l.fields.len())].0
            };
            let at = (at as i64 + r.below(9) as i64 - 4).clamp(0, len as i64) as usize;
            b.truncate(at);
        }
        5 => {
            // A chunk copied over another place.
            let n = 1 + r.below(64);
            let (from, to) = (pos(r), pos(r));
            let n = n.min(len - from).min(len - to);
            let chunk = b[from..from + n].to_vec();
            b[to..to + n].copy_from_slice(&chunk);
        }
        6 => {
            // Bytes inserted: everything after shifts.
            let at = pos(r);
            let n = 1 + r.below(16);
            let fill = [0u8, 0xff, r.next() as u8][r.below(3)];
            b.splice(at..at, std::iter::repeat_n(fill, n));
        }
        7 => {
            // Bytes cut out.
            let at = pos(r);
            let n = (1 + r.below(16)).min(len - at);
            b.drain(at..at + n);
        }
        _ => {
            // Cut anywhere.
            b.truncate(r.below(len));
        }
    }
}

/// A model's metadata entries and tensors, before they are written.
type Parts = (Vec<(String, Meta)>, Vec<Tensor>);

/// A metadata value at an edge: zero, one, the tops of u32 and u64, a power of two, a
/// negative, a NaN, an empty string or array; or near `old` when it is a count.
fn edge_meta(r: &mut Rng, old: &Meta) -> Meta {
    if let (Meta::Uint(v), true) = (old, r.below(2) == 0) {
        return Meta::Uint(match r.below(5) {
            0 => v.wrapping_add(1),
            1 => v.wrapping_sub(1),
            2 => v.wrapping_mul(2),
            3 => v / 2,
            _ => v.wrapping_mul(1 << r.below(40)),
        });
    }
    match r.below(12) {
        0 => Meta::Uint(0),
        1 => Meta::Uint(1),
        2 => Meta::Uint(u32::MAX as u64),
        3 => Meta::Uint(u64::MAX),
        4 => Meta::Uint(1 << r.below(64)),
        5 => Meta::Int(-1),
        6 => Meta::Int(i64::MIN),
        7 => Meta::Float(f64::NAN),
        8 => Meta::Float(f64::INFINITY),
        9 => Meta::Str(String::new()),
        10 => Meta::Array(Vec::new()),
        _ => Meta::Uint(r.below(300) as u64),
    }
}

/// One damage to the model's structure that still writes a well-formed file: a value,
/// an array's length, a tensor's shape, type, data or name changed, an entry dropped or
/// repeated. These reach the model and tokenizer checks that byte damage rarely gets past
/// the reader to.
fn mutate_parts(r: &mut Rng, (kvs, ts): &mut Parts) {
    let k = r.below(kvs.len());
    let t = r.below(ts.len());
    match r.below(11) {
        0..=2 if !kvs.is_empty() => kvs[k].1 = edge_meta(r, &kvs[k].1),
        3 if !kvs.is_empty() => {
            if let Meta::Array(v) = &mut kvs[k].1 {
                match r.below(3) {
                    0 => v.truncate(r.below(v.len() + 1)),
                    1 => {
                        let extra = v.last().cloned().unwrap_or(Meta::Uint(0));
                        v.extend(std::iter::repeat_n(extra, 1 + r.below(8)));
                    }
                    _ => {
                        let old = v.first().cloned().unwrap_or(Meta::Uint(0));
                        let at = r.below(v.len() + 1);
                        v.insert(at, edge_meta(r, &old));
                    }
                }
            }
        }
        4 if !kvs.is_empty() => {
            kvs.remove(k);
        }
        5 if !ts.is_empty() => {
            let dims = &mut ts[t].1;
            match r.below(3) {
                0 => dims.push(1 + r.below(2) as u64),
                1 if dims.len() > 1 => {
                    dims.pop();
                }
                _ => {
                    let i = r.below(dims.len());
                    let old = dims[i];
                    dims[i] = match r.below(6) {
                        0 => old * 2,
                        1 => old / 2,
                        2 => 0,
                        3 => 1,
                        4 => old + 32,
                        _ => 1 << r.below(64),
                    };
                }
            }
        }
        6 if !ts.is_empty() => {
            ts[t].2 = [0, 1, 2, 3, 8, 6, 12, 30, r.next() as u32][r.below(9)];
        }
        7 if !ts.is_empty() => {
            ts.remove(t);
        }
        8 if !ts.is_empty() => {
            let data = &mut ts[t].3;
            if r.below(2) == 0 {
                data.truncate(r.below(data.len() + 1));
            } else {
                data.extend(std::iter::repeat_n(0x55, 1 + r.below(64)));
            }
        }
        9 if !ts.is_empty() => {
            let u = r.below(ts.len());
            let name = ts[t].0.clone();
            ts[t].0 = std::mem::replace(&mut ts[u].0, name);
        }
        _ if !kvs.is_empty() => {
            let again = kvs[k].clone();
            kvs.push(again);
        }
        _ => {}
    }
}

/// Runs one mutant, watched: whether it ran (Ok(false): refused with a good error), or what
/// went wrong with it (a panic, an unreadable error line, a slow run).
fn check_one(seed: u64, base: &Parts) -> Result<bool, String> {
    let mut r = Rng(seed);
    let mut parts = base.clone();
    let structural = r.below(2) == 0;
    if structural {
        for _ in 0..1 + r.below(2) {
            mutate_parts(&mut r, &mut parts);
        }
    }
    let kvs: Vec<(&str, Meta)> = parts
        .0
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    let (mut b, l) = write_laid_out(&kvs, &parts.1);
    let byte_damage = if structural {
        r.below(2)
    } else {
        1 + r.below(3)
    };
    for _ in 0..byte_damage {
        mutate(&mut r, &mut b, &l);
    }
    let limit = b.len() * BYTES_PER_FILE_BYTE + FIXED_ALLOWANCE;
    SEED.with(|s| s.set(seed));
    LIVE.with(|v| v.set(0));
    PEAK.with(|v| v.set(0));
    let t0 = Instant::now();
    LIMIT.with(|v| v.set(limit));
    let got = catch_unwind(AssertUnwindSafe(|| {
        run_like_infer(b).map_err(|e| format!("{e:#}"))
    }));
    LIMIT.with(|v| v.set(0));
    let took = t0.elapsed();
    match got {
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(format!("seed {seed:#x} panicked: {msg}"))
        }
        Ok(Err(e)) if e.contains('\n') || e.len() > 600 => {
            Err(format!("seed {seed:#x} gave an unreadable error: {e:?}"))
        }
        _ if took > Duration::from_secs(2) => Err(format!("seed {seed:#x} took {took:?}")),
        Ok(ran) => Ok(ran.is_ok()),
    }
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| {
            let v = v.trim();
            match v.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16).ok(),
                None => v.parse().ok(),
            }
        })
        .unwrap_or(default)
}

#[test]
fn damaged_gguf_files_give_an_error_never_a_panic() {
    let iters = env("TBBENCH_FUZZ_ITERS", 30000);
    let first = env("TBBENCH_FUZZ_SEED", 0x6767_7566);
    // A panic's report (its backtrace above all) allocates freely: stop watching first.
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let _ = LIMIT.try_with(|l| l.set(0));
        report(info)
    }));
    let bases: Vec<Parts> = [false, true]
        .into_iter()
        .map(|tied| {
            let (kvs, t) = tiny_llama_parts(tied);
            (
                kvs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
                t,
            )
        })
        .collect();
    // The undamaged files run, within the memory budget.
    for (kvs, t) in &bases {
        let kvs: Vec<(&str, Meta)> = kvs.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let b = write_laid_out(&kvs, t).0;
        let len = b.len();
        LIVE.with(|v| v.set(0));
        PEAK.with(|v| v.set(0));
        LIMIT.with(|v| v.set(len * BYTES_PER_FILE_BYTE + FIXED_ALLOWANCE));
        let ran = run_like_infer(b);
        LIMIT.with(|v| v.set(0));
        assert!(ran.is_ok(), "{:#}", ran.unwrap_err());
        eprintln!(
            "undamaged file of {len} bytes: at most {} bytes held besides it",
            PEAK.with(|p| p.get())
        );
    }
    let (mut ran, mut failures) = (0u64, Vec::new());
    for i in 0..iters {
        let seed = first.wrapping_add(i);
        match check_one(seed, &bases[(seed % 2) as usize]) {
            Ok(true) => ran += 1,
            Ok(false) => {}
            Err(f) => failures.push(f),
        }
    }
    eprintln!("{iters} mutants: {ran} ran, the others were refused");
    assert!(
        failures.is_empty(),
        "{} of {iters} mutants failed (replay one with TBBENCH_FUZZ_SEED=<seed> TBBENCH_FUZZ_ITERS=1):\n{}",
        failures.len(),
        failures[..failures.len().min(20)].join("\n")
    );
}
