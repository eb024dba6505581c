//! Every parser and reader a user's input reaches, fed seeded mutants of valid inputs: sizes,
//! rates, durations, concurrency lists, thresholds, `--over`, hostfiles, HPL.dat, result files
//! (through report and compare, as real files), and server-sent events with the OpenAI chunks
//! they carry. Each must answer Ok or a one-line error: never panic, never hang, never ask
//! for memory the input did not justify (the test process runs under an address-space limit,
//! so such an allocation aborts it and the test fails).
//!
//! Bounded for CI (seconds on 2 cores at the default `TBBENCH_FUZZ_SCALE=3`); a larger scale
//! runs proportionally more mutants (60: a few minutes), `TBBENCH_FUZZ_SEED` starts from
//! another seed. A failure prints the target and the input, to be kept as a named case in
//! `found_cases_stay_fixed`.
//! The GGUF reader has its own fuzz test beside it (suites/infer).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Once;

/// xorshift64*: small, seedable, the same sequence on every machine.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Pieces that break parsers: number edges, separators, units, JSON syntax.
const INTERESTING: &[&str] = &[
    "0",
    "-1",
    "1e19",
    "1e308",
    "NaN",
    "inf",
    "18446744073709551615",
    "18446744073709551616",
    "9223372036854775808",
    "4294967296",
    "99999999999999999999999999",
    ".",
    "..",
    ",",
    ":",
    "/",
    "-",
    "%",
    "e",
    "GiB",
    "TiB",
    "Gbit",
    "ms",
    "m",
    "{",
    "}",
    "[",
    "]",
    "\"",
    "\n",
    "\r",
    "\0",
    " ",
    "slots=",
    "=",
    "#",
    "data:",
    "\u{feff}",
    "é",
];

/// One random edit of `input`, sometimes splicing in a piece of `other`.
fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    let edits = 1 + rng.below(4);
    for _ in 0..edits {
        let at = rng.below(v.len() + 1);
        match rng.below(8) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 => {
                let piece = rng.pick(INTERESTING).as_bytes();
                v.splice(at..at, piece.iter().copied());
            }
            2 if !v.is_empty() => {
                let end = (at + 1 + rng.below(16)).min(v.len());
                let piece = rng.pick(INTERESTING).as_bytes();
                let start = at.min(end);
                v.splice(start..end, piece.iter().copied());
            }
            3 => {
                let end = (at + rng.below(32)).min(v.len());
                v.drain(at.min(end)..end);
            }
            4 => v.truncate(at),
            5 if !other.is_empty() => {
                let from = rng.below(other.len());
                let to = (from + 1 + rng.below(64)).min(other.len());
                v.splice(at..at, other[from..to].iter().copied());
            }
            6 if !v.is_empty() => {
                // Repeat a stretch: long lists, long numbers.
                let end = (at + 1 + rng.below(8)).min(v.len());
                let start = at.min(end);
                let piece = v[start..end].to_vec();
                for _ in 0..1 + rng.below(40) {
                    v.splice(start..start, piece.iter().copied());
                }
            }
            _ => {
                let digits = "9".repeat(1 + rng.below(30));
                v.splice(at..at, digits.bytes());
            }
        }
    }
    v
}

/// Values that break code downstream of a JSON parser: extremes, wrong types, empties.
fn json_extreme(rng: &mut Rng) -> serde_json::Value {
    use serde_json::json;
    match rng.below(14) {
        0 => json!(0),
        1 => json!(-1),
        2 => json!(u64::MAX),
        3 => json!(i64::MIN),
        4 => json!(1e308),
        5 => json!(-1e308),
        6 => json!(5e-324),
        7 => json!(""),
        8 => json!(null),
        9 => json!([]),
        10 => json!({}),
        11 => json!("x".repeat(1 + rng.below(300))),
        12 => json!(true),
        _ => json!([1e308, -1, 0, null]),
    }
}

/// Replaces, deletes or empties one node of the tree (structure survives the parser, so the
/// code after it gets tested).
fn mutate_json(rng: &mut Rng, v: &mut serde_json::Value, depth: usize) {
    use serde_json::Value;
    let stop = depth > 0 && rng.below(4) == 0;
    match v {
        Value::Object(map) if !map.is_empty() && !stop => {
            let keys: Vec<String> = map.keys().cloned().collect();
            let k = rng.pick(&keys).clone();
            match rng.below(10) {
                0 => {
                    map.remove(&k);
                }
                1 => {
                    map.insert(k, json_extreme(rng));
                }
                _ => mutate_json(rng, map.get_mut(&k).expect("key"), depth + 1),
            }
        }
        Value::Array(items) if !items.is_empty() && !stop => {
            let i = rng.below(items.len());
            match rng.below(10) {
                0 => {
                    items.remove(i);
                }
                1 => items[i] = json_extreme(rng),
                2 => {
                    let copy = items[i].clone();
                    for _ in 0..rng.below(50) {
                        items.push(copy.clone());
                    }
                }
                _ => mutate_json(rng, &mut items[i], depth + 1),
            }
        }
        _ => *v = json_extreme(rng),
    }
}

fn scale() -> usize {
    std::env::var("TBBENCH_FUZZ_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
        .max(1)
}

fn base_seed() -> u64 {
    std::env::var("TBBENCH_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x7BBE_4C11)
}

thread_local! {
    /// Set while a mutant runs.
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A caught panic's message.
fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// Runs `f` with panics caught and not printed (the caller reports them).
fn quietly<R>(f: impl FnOnce() -> R) -> std::thread::Result<R> {
    QUIET.with(|q| q.set(true));
    let r = catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(false));
    r
}

/// An allocation far beyond what a parser needs aborts the process instead of swapping the
/// machine: the test then fails, which is the point.
fn limit_memory() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let lim = libc::rlimit {
            rlim_cur: 8 << 30,
            rlim_max: libc::RLIM_INFINITY,
        };
        // SAFETY: setrlimit reads the struct it is given.
        unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) };
        // A mutant's panic is reported once, with its input, by `fuzz`; the test's own
        // failures keep the usual message.
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(|q| q.get()) {
                default(info);
            }
        }));
    });
}

/// Feeds `iters` mutants of `seeds` to `check`, which returns an error line or Ok. Fails on
/// a panic (naming the input) or on an error that is not one line.
fn fuzz(
    target: &str,
    seeds: &[Vec<u8>],
    iters: usize,
    check: &dyn Fn(&[u8]) -> Result<(), String>,
) {
    limit_memory();
    let mut rng = Rng::new(
        base_seed()
            ^ target
                .bytes()
                .fold(0u64, |h, b| h.wrapping_mul(31) + b as u64),
    );
    let mut corpus: Vec<Vec<u8>> = seeds.to_vec();
    for i in 0..iters * scale() {
        let base = rng.pick(&corpus).clone();
        let other = rng.pick(&corpus).clone();
        let input = mutate(&mut rng, &base, &other);
        let outcome = quietly(|| check(&input));
        match outcome {
            Err(p) => {
                let msg = panic_text(&p);
                panic!(
                    "{target}: mutant {i} panicked ({msg}) on input {:?}",
                    String::from_utf8_lossy(&input)
                );
            }
            // Errors may quote the input; one with line breaks of its own is made one line
            // where errors are printed (tbbench's main), which the CLI test checks.
            Ok(Err(e)) if e.contains('\n') && !input.contains(&b'\n') => panic!(
                "{target}: mutant {i}: error of several lines for {:?}: {e}",
                String::from_utf8_lossy(&input)
            ),
            Ok(Ok(())) if corpus.len() < 256 => corpus.push(input),
            _ => {}
        }
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn one<T, E: std::fmt::Display>(r: Result<T, E>) -> Result<(), String> {
    r.map(|_| ()).map_err(|e| e.to_string())
}

fn seeds(items: &[&str]) -> Vec<Vec<u8>> {
    items.iter().map(|s| s.as_bytes().to_vec()).collect()
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn flag_values_answer_ok_or_one_line() {
    use tbbench_runners::{options, units};
    let sizes = seeds(&[
        "256MiB",
        "1B..64MiB",
        "64,4k,1MiB",
        "1.5MiB",
        "10MB",
        "4096",
        "3..10",
    ]);
    fuzz("sizes", &sizes, 3000, &|b| {
        let t = text(b);
        if let Ok(list) = units::parse_size_list(&t) {
            // A range expands to at most one entry per power of two (plus its ends).
            assert!(list.len() <= 64, "{t}: {} sizes", list.len());
        }
        one(units::parse_size(&t))
    });
    let rates = seeds(&[
        "80Gbit",
        "10Gbit/s",
        "2500mbit",
        "10G",
        "8.65GiB/s",
        "100mbps",
    ]);
    fuzz("rates", &rates, 2000, &|b| {
        one(units::parse_rate_bits(&text(b)))
    });
    let durations = seeds(&["30", "30s", "500ms", "2m", "0.5s"]);
    fuzz("durations", &durations, 2000, &|b| {
        let d = units::parse_duration(&text(b));
        if let Ok(d) = &d {
            // Deadlines add it to now: it must stay representable.
            assert!(std::time::Instant::now().checked_add(*d).is_some());
        }
        one(d)
    });
    let conc = seeds(&["1,2,4,8", "1-8", "3", "1-4096", "16"]);
    fuzz("concurrency", &conc, 2000, &|b| {
        tbbench_infer::parse_concurrency(&text(b)).map(|levels| {
            assert!(levels.len() <= tbbench_infer::MAX_LEVELS);
        })
    });
    let thresholds = seeds(&["5%", "2.5 %", "0", "10"]);
    fuzz("thresholds", &thresholds, 1000, &|b| {
        tbbench_reports::commands::parse_threshold(&text(b)).map(|_| ())
    });
    let over = seeds(&[
        "tcp:eth0,tcp:en3,verbs:rdma_en3",
        "tcp:10.72.0.0/24,shm",
        "verbs:mlx5_0,tcp:127.0.0.1",
        "shm",
    ]);
    fuzz("--over", &over, 2000, &|b| {
        one(options::parse_over(&text(b)))
    });
}

#[test]
fn hostfiles_answer_ok_or_one_line() {
    use tbbench_runners::hostfile::{parse_hostfile, place_ranks};
    let hostfiles = seeds(&[
        "# cluster\nmac1 slots=2\nmac2   # second\n\nuser@mac3 slots=1 max_slots=4\n",
        r#"[{"ssh": "mac1", "ips": ["10.0.0.1", "192.168.1.5"]}, {"ssh": "mac2", "ips": [], "slots": 2}]"#,
        r#"{"backend": "jaccl", "envs": ["A=1"], "hosts": [{"ssh": "m0", "rdma": [null, "rdma_en3"]}, {"ssh": "m1", "rdma": [["rdma_en3"], null]}]}"#,
        r#"{"backend": "ring", "hosts": [{"ssh": "m0", "ips": ["192.168.0.2"]}, {"ssh": "m1", "ips": ["192.168.0.1"]}]}"#,
        "10.72.0.1 slots=1\n10.72.0.2 slots=1\n",
    ]);
    fuzz("hostfile", &hostfiles, 3000, &|b| {
        let hosts = parse_hostfile(&text(b))
            .map_err(|e| format!("{e:#}"))?
            .hosts;
        for nodes in [1, 4, 1024] {
            if let Ok(p) = place_ranks(&hosts, nodes) {
                assert_eq!(p.len(), nodes);
            }
        }
        Ok(())
    });
}

#[test]
fn hpl_dat_answers_ok_or_one_line() {
    use tbbench_hpl::input::{HplDat, MAX_COMBINATIONS};
    let sample = std::fs::read(root().join("fixtures/netlib-HPL.dat")).expect("fixture");
    fuzz("HPL.dat", &[sample], 3000, &|b| {
        let dat = HplDat::parse(&text(b)).map_err(|e| format!("{e:#}"))?;
        let variants = dat.variants();
        assert!(variants.len() as u64 <= MAX_COMBINATIONS);
        for v in variants.iter().take(50) {
            let _ = v.code();
            assert!(v.grid.size() >= 1);
        }
        Ok(())
    });
}

fn result_fixtures() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![root().join("fixtures/results")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("fixtures") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "json") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Damaged result files, written to disk and read back by the report and compare the way
/// `tbbench report` and `tbbench compare` read them.
#[test]
fn result_files_through_report_and_compare() {
    use tbbench_reports::{compare, load, report};
    limit_memory();
    let dir = std::env::temp_dir().join(format!("tbbench-fuzz-results-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let files = result_fixtures();
    assert!(
        files.len() >= 5,
        "fixtures/results has {} files",
        files.len()
    );
    let originals: Vec<(PathBuf, serde_json::Value)> = files
        .iter()
        .map(|p| {
            let v = serde_json::from_str(&std::fs::read_to_string(p).expect("read")).expect("json");
            (p.clone(), v)
        })
        .collect();
    let mut rng = Rng::new(base_seed() ^ 0x5EED);
    let rounds = 25 * scale();
    for round in 0..rounds {
        // A batch: each fixture once, some damaged in structure, some in bytes.
        let batch = dir.join(format!("r{round}"));
        std::fs::create_dir_all(&batch).expect("batch dir");
        let mut written = Vec::new();
        for (i, (path, value)) in originals.iter().enumerate() {
            let name = batch.join(format!(
                "{i}-{}",
                path.file_name().unwrap().to_string_lossy()
            ));
            let bytes = match rng.below(3) {
                0 => serde_json::to_vec_pretty(value).unwrap(),
                1 => {
                    let mut v = value.clone();
                    for _ in 0..1 + rng.below(3) {
                        mutate_json(&mut rng, &mut v, 0);
                    }
                    serde_json::to_vec_pretty(&v).unwrap()
                }
                _ => {
                    let raw = serde_json::to_vec(value).unwrap();
                    mutate(&mut rng, &raw, b"")
                }
            };
            std::fs::write(&name, &bytes).expect("write");
            written.push(name);
        }
        let run = quietly(|| {
            for p in &written {
                let text = String::from_utf8_lossy(&std::fs::read(p).unwrap()).into_owned();
                if let Err(e) = load::parse_result(&text, &["link", "hpl", "infer", "decode"]) {
                    assert!(!e.contains('\n'), "{}: {e}", p.display());
                }
            }
            let r = report::build(
                std::slice::from_ref(&batch),
                5.0,
                "fuzz",
                "2026-01-01T00:00:00Z",
            );
            for p in &r.problems {
                assert!(!p.to_string().contains('\n'), "{p}");
            }
            let (loaded, _) = report::load_checked(std::slice::from_ref(&batch));
            let half = loaded.len() / 2;
            let c = compare::compare(&loaded[..half], &loaded[half..], &report::metrics_of, 5.0);
            let _ = compare::text_table(&c);
        });
        if let Err(p) = run {
            let msg = panic_text(&p);
            panic!(
                "report/compare panicked ({msg}) on the files kept in {}",
                batch.display()
            );
        }
        let _ = std::fs::remove_dir_all(&batch);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn server_sent_events_and_chunks() {
    use tbbench_infer::openai::parse_data;
    use tbbench_infer::sse::{SseDecoder, SseItem};
    use tbbench_infer::Api;
    let streams = seeds(&[
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n\
         data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3,\"total_tokens\":15}}\n\n\
         data: [DONE]\n\n",
        ": generation_stats {\"prompt_tps\": 100.5, \"generation_tps\": 42}\r\nevent: message\r\nid: 7\r\nretry: 1000\r\ndata: {\"choices\":[{\"text\":\"x\",\"finish_reason\":null}]}\r\n\r\n",
        "data: {\"error\":{\"message\":\"model overloaded\",\"type\":\"server_error\"}}\n\n",
        "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"think\"}}],\"timings\":{\"prompt_n\":5,\"prompt_ms\":1.5,\"predicted_n\":9,\"predicted_ms\":90.0}}\n\n",
    ]);
    fuzz("sse", &streams, 3000, &|b| {
        // Fed in arbitrary pieces, as reads arrive.
        let mut dec = SseDecoder::new();
        let mut items = Vec::new();
        let mut at = 0;
        let mut step = 1 + b.len() % 7;
        while at < b.len() {
            let end = (at + step).min(b.len());
            dec.feed(&b[at..end], &mut items);
            at = end;
            step = step * 3 % 11 + 1;
        }
        let _ = dec.finish();
        for item in items {
            if let SseItem::Event(e) = item {
                for api in [Api::Chat, Api::Completions] {
                    if let Err(e) = parse_data(api, &e.data) {
                        assert!(!e.contains('\n'), "{e}");
                    }
                }
            }
        }
        Ok(())
    });
}

/// Inputs that once panicked, hung or asked for unbounded memory, each by name.
#[test]
fn found_cases_stay_fixed() {
    use tbbench_runners::{hostfile, units};
    let refused = |what: &str, r: Result<(), String>| {
        let e = r.expect_err(what);
        assert!(!e.contains('\n'), "{what}: {e}");
    };
    refused("--timeout 1e19", one(units::parse_duration("1e19")));
    refused("--timeout 1e20", one(units::parse_duration("1e20")));
    refused(
        "--concurrency 1-9223372036854775808",
        tbbench_infer::parse_concurrency("1-9223372036854775808").map(|_| ()),
    );
    refused(
        "hostfile as a JSON object",
        hostfile::parse_hostfile("{\"ssh\":\"a\"}")
            .map(|_| ())
            .map_err(|e| format!("{e:#}")),
    );
    let h = hostfile::parse_hostfile("a slots=18446744073709551615\nb slots=3\n")
        .unwrap()
        .hosts;
    assert_eq!(hostfile::place_ranks(&h, 2).unwrap(), vec![0, 0]);
    let dat = std::fs::read_to_string(root().join("fixtures/netlib-HPL.dat")).unwrap();
    let with = |line: usize, text: &str| {
        let mut l: Vec<&str> = dat.lines().collect();
        l[line - 1] = text;
        l.join("\n")
    };
    for (what, text) in [
        ("HPL.dat N=0", with(6, "0 30 34 35 Ns")),
        (
            "HPL.dat Q=4611686018427387905",
            with(12, "4611686018427387905 4 4 Qs"),
        ),
    ] {
        refused(
            what,
            tbbench_hpl::input::HplDat::parse(&text)
                .map(|_| ())
                .map_err(|e| format!("{e:#}")),
        );
    }
}
