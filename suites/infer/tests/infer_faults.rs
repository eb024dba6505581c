//! `tbbench infer --endpoint` against a tiny HTTP server written here, which answers each
//! request as a script says: good streams with known timing, HTTP errors, streams cut short,
//! error objects mid-stream, silence. Real sockets and the real binary.

#[path = "../../../runners/tests/support.rs"]
mod support;

use serde_json::Value;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use support::*;

/// What the server does with the n-th POST (0-based; the probe is 0).
#[derive(Clone, Copy, Debug)]
enum Act {
    /// A good stream: first token after `ttft_ms`, then `tokens - 1` more every `gap_ms`,
    /// usage unless the request did not ask for it.
    Stream {
        ttft_ms: u64,
        gap_ms: u64,
        tokens: u64,
    },
    Status500,
    /// Headers and two chunks, then the connection closes mid-stream.
    Cut,
    /// Two tokens, then an error object.
    ErrorObject,
    /// Reads the request and says nothing.
    Silent,
    /// A proper stream with [DONE] but no token: a request the server dropped.
    EmptyStream,
    /// 400 when the body asks for stream_options (servers that refuse it), else a stream.
    RefuseStreamOptions,
    /// One token, then SSE comments every 100 ms, never [DONE] (for at most 30 s).
    CommentsForever,
    /// A `data:` line that never ends: 4 MiB with no line break, then silence.
    EndlessLine,
    /// Two tokens, then usage claiming 2^64 - 1 of them.
    HugeUsage,
    /// A server that slows with load: the first token after `per_in_flight_ms` for every
    /// request in flight when this one arrives (itself included), then `tokens - 1` more
    /// every `gap_ms`.
    Loaded {
        per_in_flight_ms: u64,
        gap_ms: u64,
        tokens: u64,
    },
    /// A server of `slots` batch slots: a request waits for a free one, then streams as
    /// `Stream` does (usage always).
    Capacity {
        slots: usize,
        ttft_ms: u64,
        gap_ms: u64,
        tokens: u64,
    },
}

struct Server {
    url: String,
    seen: Arc<Mutex<Vec<String>>>,
}

fn read_request(s: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).unwrap_or(0) == 0 {
            return String::new();
        }
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).to_string();
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    head + &String::from_utf8_lossy(&body)
}

fn chunk(s: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    s.write_all(format!("{:x}\r\n", data.len()).as_bytes())?;
    s.write_all(data)?;
    s.write_all(b"\r\n")?;
    s.flush()
}

const SSE_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";

fn token_event(i: u64) -> String {
    // CRLF line ends and a multi-byte character, sent in pieces below.
    format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tök{i} \"}},\"finish_reason\":null}}]}}\r\n\r\n")
}

fn good_stream(s: &mut TcpStream, ttft_ms: u64, gap_ms: u64, tokens: u64, usage: bool) {
    let _ = s.write_all(SSE_HEAD);
    let _ = chunk(
        s,
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n: keep-alive\n\n",
    );
    std::thread::sleep(Duration::from_millis(ttft_ms));
    for i in 0..tokens {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(gap_ms));
        }
        let ev = token_event(i);
        let bytes = ev.as_bytes();
        // Split inside "ö" (two bytes) so the client must join a code point across reads.
        let cut = ev.find('ö').unwrap() + 1;
        let _ = chunk(s, &bytes[..cut]);
        let _ = chunk(s, &bytes[cut..]);
    }
    let mut tail = String::from(
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n",
    );
    if usage {
        tail.push_str(&format!(
            "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":100,\"completion_tokens\":{tokens},\"total_tokens\":{}}}}}\n\n",
            100 + tokens
        ));
    }
    tail.push_str("data: [DONE]\n\n");
    let _ = chunk(s, tail.as_bytes());
    let _ = chunk(s, b"");
}

fn serve(script: impl Fn(usize) -> Act + Send + Sync + 'static) -> Server {
    serve_with(script, false)
}

/// `tokenizer`: the server answers llama.cpp's `POST /tokenize`, counting each "tökN" word as
/// two tokens (a stream chunk that holds two tokens) and any other word as one; without it
/// the tokenizer paths are not found, as on a server that has none.
fn serve_with(script: impl Fn(usize) -> Act + Send + Sync + 'static, tokenizer: bool) -> Server {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", l.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let count = Arc::new(AtomicUsize::new(0));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let busy = Arc::new((Mutex::new(0usize), Condvar::new()));
    let script = Arc::new(script);
    let seen2 = seen.clone();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut s) = conn else { continue };
            let (seen, count, script) = (seen2.clone(), count.clone(), script.clone());
            let (in_flight, busy) = (in_flight.clone(), busy.clone());
            std::thread::spawn(move || {
                let req = read_request(&mut s);
                if req.is_empty() {
                    return;
                }
                seen.lock().unwrap().push(req.clone());
                if req.starts_with("POST /tokenize") || req.starts_with("POST /extras/") {
                    let body = req.split("\r\n\r\n").nth(1).unwrap_or("");
                    let content = serde_json::from_str::<serde_json::Value>(body)
                        .ok()
                        .and_then(|v| v["content"].as_str().map(str::to_string));
                    let answer = match (tokenizer && req.starts_with("POST /tokenize"), content) {
                        (true, Some(c)) => {
                            let n = c.split_whitespace().count() + c.matches("tök").count();
                            Some(serde_json::json!({ "tokens": vec![7; n] }).to_string())
                        }
                        _ => None,
                    };
                    let _ = match answer {
                        Some(body) => write!(
                            s,
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        ),
                        None => write!(s, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"),
                    };
                    return;
                }
                if req.starts_with("GET /v1/models") {
                    let body = r#"{"object":"list","data":[{"id":"scripted-model"}]}"#;
                    let _ = write!(
                        s,
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    return;
                }
                let n = count.fetch_add(1, Ordering::SeqCst);
                let usage = req.contains("include_usage");
                match script(n) {
                    Act::Stream {
                        ttft_ms,
                        gap_ms,
                        tokens,
                    } => good_stream(&mut s, ttft_ms, gap_ms, tokens, usage),
                    Act::Status500 => {
                        let body = r#"{"error":{"message":"model crashed","type":"server_error"}}"#;
                        let _ = write!(
                            s,
                            "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        );
                    }
                    Act::Cut => {
                        let _ = s.write_all(SSE_HEAD);
                        let _ = chunk(&mut s, token_event(0).as_bytes());
                        let _ = chunk(&mut s, b"data: {\"choices\":[{\"delta\":{\"cont");
                        // Dropping the socket ends the stream inside an event and a chunk.
                    }
                    Act::ErrorObject => {
                        let _ = s.write_all(SSE_HEAD);
                        let _ = chunk(&mut s, token_event(0).as_bytes());
                        let _ = chunk(&mut s, token_event(1).as_bytes());
                        let _ = chunk(
                            &mut s,
                            b"data: {\"error\":{\"message\":\"KV cache full\",\"code\":500}}\n\n",
                        );
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    Act::Silent => std::thread::sleep(Duration::from_secs(20)),
                    Act::EmptyStream => {
                        let _ = s.write_all(SSE_HEAD);
                        let _ = chunk(&mut s, b"data: [DONE]\n\n");
                        let _ = chunk(&mut s, b"");
                    }
                    Act::CommentsForever => {
                        let _ = s.write_all(SSE_HEAD);
                        let _ = chunk(&mut s, token_event(0).as_bytes());
                        for _ in 0..300 {
                            if chunk(&mut s, b": keep-alive\n\n").is_err() {
                                break;
                            }
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                    Act::EndlessLine => {
                        let _ = s.write_all(SSE_HEAD);
                        let _ = chunk(&mut s, b"data: ");
                        let piece = vec![b'a'; 256 << 10];
                        for _ in 0..16 {
                            if chunk(&mut s, &piece).is_err() {
                                break;
                            }
                        }
                        std::thread::sleep(Duration::from_secs(20));
                    }
                    Act::HugeUsage => {
                        let _ = s.write_all(SSE_HEAD);
                        for i in 0..2 {
                            let _ = chunk(&mut s, token_event(i).as_bytes());
                        }
                        let tail = format!(
                            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"length\"}}]}}\n\ndata: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":10,\"completion_tokens\":{},\"total_tokens\":1}}}}\n\ndata: [DONE]\n\n",
                            u64::MAX
                        );
                        let _ = chunk(&mut s, tail.as_bytes());
                        let _ = chunk(&mut s, b"");
                    }
                    Act::Loaded {
                        per_in_flight_ms,
                        gap_ms,
                        tokens,
                    } => {
                        let load = in_flight.fetch_add(1, Ordering::SeqCst) as u64 + 1;
                        // Counted out before the answer ends, so the client's next request
                        // never finds this one still counted.
                        let ttft = per_in_flight_ms * load;
                        let _ = s.write_all(SSE_HEAD);
                        std::thread::sleep(Duration::from_millis(ttft));
                        for i in 0..tokens {
                            if i > 0 {
                                std::thread::sleep(Duration::from_millis(gap_ms));
                            }
                            let _ = chunk(&mut s, token_event(i).as_bytes());
                        }
                        in_flight.fetch_sub(1, Ordering::SeqCst);
                        let tail = format!(
                            "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":100,\"completion_tokens\":{tokens},\"total_tokens\":{}}}}}\n\ndata: [DONE]\n\n",
                            100 + tokens
                        );
                        let _ = chunk(&mut s, tail.as_bytes());
                        let _ = chunk(&mut s, b"");
                    }
                    Act::Capacity {
                        slots,
                        ttft_ms,
                        gap_ms,
                        tokens,
                    } => {
                        let (lock, freed) = &*busy;
                        let mut n = lock.lock().unwrap();
                        while *n >= slots {
                            n = freed.wait(n).unwrap();
                        }
                        *n += 1;
                        drop(n);
                        good_stream(&mut s, ttft_ms, gap_ms, tokens, true);
                        *lock.lock().unwrap() -= 1;
                        freed.notify_one();
                    }
                    Act::RefuseStreamOptions => {
                        if req.contains("stream_options") {
                            let body = r#"{"detail":"unknown field stream_options"}"#;
                            let _ = write!(
                                s,
                                "HTTP/1.1 422 Unprocessable Entity\r\nContent-Length: {}\r\n\r\n{body}",
                                body.len()
                            );
                        } else {
                            good_stream(&mut s, 5, 2, 6, false);
                        }
                    }
                }
            });
        }
    });
    Server { url, seen }
}

fn infer(
    server_url: &str,
    out: &std::path::Path,
    extra: &[&str],
) -> (std::process::Output, Duration) {
    let mut args = vec![
        "infer",
        "--endpoint",
        server_url,
        "--warmup",
        "0",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let t = Instant::now();
    let o = run(&args, Duration::from_secs(60));
    (o, t.elapsed())
}

/// The JSON bodies of the requests the server was sent after the probe, in order.
fn posted_bodies(server: &Server) -> Vec<Value> {
    server
        .seen
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.starts_with("POST"))
        .skip(1)
        .map(|r| serde_json::from_str(r.split("\r\n\r\n").nth(1).unwrap()).unwrap())
        .collect()
}

fn level(r: &Value, i: usize) -> &Value {
    &r["results"]["levels"][i]
}

#[test]
fn faults_are_counted_per_request_and_the_run_goes_on() {
    let server = serve(|n| match n {
        0 | 1 => Act::Stream {
            ttft_ms: 5,
            gap_ms: 2,
            tokens: 5,
        },
        2 => Act::Status500,
        3 => Act::Cut,
        4 => Act::ErrorObject,
        5 => Act::Silent,
        6 => Act::EmptyStream,
        _ => Act::Stream {
            ttft_ms: 5,
            gap_ms: 2,
            tokens: 5,
        },
    });
    let dir = tmpdir("infer-faults");
    let out = dir.join("r.json");
    let (o, took) = infer(
        &server.url,
        &out,
        &[
            "--model",
            "m",
            "--requests",
            "7",
            "--timeout",
            "1s",
            "--max-tokens",
            "5",
        ],
    );
    let stderr = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "failures fail the run\n{stderr}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    assert!(
        stderr.contains("5 of 7 requests failed"),
        "one line says how many failed:\n{stderr}"
    );
    let r = read_json(&out);
    let l = level(&r, 0);
    assert_eq!((l["ok"].as_u64(), l["failed"].as_u64()), (Some(2), Some(5)));
    let f = &l["failures"];
    for kind in [
        "http-500",
        "broken-stream",
        "stream-error",
        "timeout",
        "empty-stream",
    ] {
        assert_eq!(f[kind], 1, "{kind} in {f}");
    }
    let per = l["per_request"].as_array().unwrap();
    assert_eq!(per.len(), 7);
    let err = |i: usize| per[i]["error"].as_str().unwrap_or("").to_string();
    assert!(err(1).contains("model crashed"), "{}", err(1));
    assert!(err(2).starts_with("broken-stream"), "{}", err(2));
    assert!(
        err(3).contains("KV cache full") && err(3).contains("after 2 chunks"),
        "{}",
        err(3)
    );
    assert!(err(4).starts_with("timeout"), "{}", err(4));
    assert!(err(5).starts_with("empty-stream"), "{}", err(5));
    assert_eq!(per[6]["ok"], true, "the run went on after the failures");
    assert_eq!(r["verification"]["passed"], false);
    let detail = r["verification"]["checks"][0]["detail"].as_str().unwrap();
    assert!(detail.contains("5 of 7 requests failed"), "{detail}");
}

/// A stream of comments that never ends, a line that never ends, and a usage count no
/// stream of two chunks could have (2^64 - 1 tokens): each request is bounded (the deadline
/// is --timeout plus a second per token; a line is capped at 1 MiB) or not believed, and
/// counted as a failure; no absurd token rate reaches the result, and the run ends on its
/// own well before the server would.
#[test]
fn endless_streams_lines_and_unbelievable_counts_fail_their_requests() {
    let server = serve(|n| match n {
        1 => Act::CommentsForever,
        2 => Act::EndlessLine,
        3 => Act::HugeUsage,
        _ => Act::Stream {
            ttft_ms: 5,
            gap_ms: 2,
            tokens: 2,
        },
    });
    let dir = tmpdir("infer-endless");
    let out = dir.join("r.json");
    let (o, took) = infer(
        &server.url,
        &out,
        &[
            "--model",
            "m",
            "--requests",
            "3",
            "--timeout",
            "1s",
            "--max-tokens",
            "2",
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(took < Duration::from_secs(15), "{took:?}");
    let r = read_json(&out);
    let l = level(&r, 0);
    let errors: Vec<&str> = l["per_request"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["error"].as_str().unwrap_or(""))
        .collect();
    for (kind, says) in [
        ("timeout", "no end of the stream within 3 s"),
        ("bad-response", "ran past 1024 KiB"),
        ("bad-response", "not believed"),
    ] {
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with(kind) && e.contains(says)),
            "{kind} {says}: {errors:?}"
        );
    }
    let rate = l["output_tokens_per_s"].as_f64().unwrap_or(0.0);
    assert!(rate < 1e6, "{rate}");
}

#[test]
fn figures_follow_a_server_with_known_timing() {
    // TTFT 120 ms, then a token every 25 ms: the client must see those, whatever its reads.
    let server = serve(|_| Act::Stream {
        ttft_ms: 120,
        gap_ms: 25,
        tokens: 12,
    });
    let dir = tmpdir("infer-timing");
    let out = dir.join("r.json");
    let key = "sk-test-do-not-print-9f3a";
    let o = std::process::Command::new(bin())
        .args([
            "infer",
            "--endpoint",
            &server.url,
            "--requests",
            "4",
            "--warmup",
            "1",
            "--max-tokens",
            "12",
            "--api-key-env",
            "TBBENCH_TEST_INFER_KEY",
            "--out",
            out.to_str().unwrap(),
        ])
        .env("TBBENCH_TEST_INFER_KEY", key)
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("TTFT p50") && stdout.contains("c=1"),
        "{stdout}"
    );
    let raw = std::fs::read_to_string(&out).unwrap();
    assert!(
        raw.starts_with("{\n  \"schema_version\""),
        "schema_version first"
    );
    for text in [&raw, &stdout, &stderr] {
        assert!(!text.contains(key), "the API key leaked");
    }
    let requests = server.seen.lock().unwrap().clone();
    assert!(
        requests
            .iter()
            .filter(|r| r.starts_with("POST"))
            .all(|r| r.contains(&format!("Authorization: Bearer {key}"))),
        "every request carries the key"
    );
    // Model from GET /models; every measured prompt unique from its first words.
    assert!(requests[0].starts_with("GET /v1/models"));
    let prompts: Vec<String> = requests
        .iter()
        .filter_map(|r| {
            let body: Value = serde_json::from_str(&r[r.find("\r\n\r\n")? + 4..]).ok()?;
            Some(
                body["messages"][0]["content"]
                    .as_str()?
                    .chars()
                    .take(20)
                    .collect(),
            )
        })
        .collect();
    let mut unique = prompts.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), prompts.len(), "{prompts:?}");

    let r: Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(r["suite"], "infer");
    assert_eq!(r["network"]["transport"], "http");
    assert_eq!(r["network"]["link_kind"], "loopback");
    assert_eq!(r["params"]["model"], "scripted-model");
    assert_eq!(r["params"]["api_key_set"], true);
    assert_eq!(r["params"]["api_key_env"], "TBBENCH_TEST_INFER_KEY");
    assert_eq!(r["results"]["token_source"], "usage");
    assert_eq!(r["verification"]["passed"], true);
    let l = level(&r, 0);
    assert_eq!(l["output_tokens"], 48);
    let med = |k: &str| l[k]["median"].as_f64().unwrap();
    let ttft = med("ttft_ms");
    assert!((120.0..300.0).contains(&ttft), "TTFT {ttft}");
    assert_eq!(l["ttft_content_ms"]["median"], l["ttft_ms"]["median"]);
    assert!(l.get("ttft_reasoning_ms").is_none());
    let tpot = med("tpot_ms");
    assert!((24.0..45.0).contains(&tpot), "TPOT {tpot}");
    let gap = med("gap_ms");
    assert!((24.0..45.0).contains(&gap), "gap {gap}");
    let e2e = med("e2e_ms");
    assert!(
        (ttft + 11.0 * 24.0..ttft + 11.0 * 45.0 + 50.0).contains(&e2e),
        "E2E {e2e}"
    );
    let agg = l["aggregate_tokens_per_s"].as_f64().unwrap();
    let wall = l["wall_s"].as_f64().unwrap();
    assert!((agg - 48.0 / wall).abs() < 1e-6);
    for p in l["per_request"].as_array().unwrap() {
        assert_eq!(p["output_tokens"], 12);
        assert_eq!(p["token_chunks"], 12);
        assert_eq!(p["prompt_tokens"], 100);
        // Decode tokens/s is TPOT's reciprocal, request by request.
        let (tpot, rate) = (
            p["tpot_ms"].as_f64().unwrap(),
            p["decode_tokens_per_s"].as_f64().unwrap(),
        );
        assert!((tpot * rate - 1000.0).abs() < 1e-6, "{tpot} ms vs {rate}/s");
    }
}

#[test]
fn a_server_that_refuses_stream_options_is_asked_again_without() {
    let server = serve(|_| Act::RefuseStreamOptions);
    let dir = tmpdir("infer-refuse");
    let out = dir.join("r.json");
    let (o, _) = infer(&server.url, &out, &["--model", "m", "--requests", "3"]);
    let stderr = text(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let r = read_json(&out);
    assert_eq!(r["results"]["stream_usage"], false);
    assert_eq!(r["results"]["tokens_approximate"], true);
    assert_eq!(level(&r, 0)["token_source"], "chunks");
    let warnings = r["warnings"].to_string();
    assert!(warnings.contains("refused stream_options"), "{warnings}");
    assert!(warnings.contains("approximate"), "{warnings}");
    assert!(stderr.contains("approximate"), "{stderr}");
}

/// A stream without usage from a server that has a tokenizer: the run counts the streamed
/// text with it, and a chunk that carried two tokens counts two.
#[test]
fn a_stream_without_usage_is_counted_by_the_servers_tokenizer() {
    let server = serve_with(|_| Act::RefuseStreamOptions, true);
    let dir = tmpdir("infer-tokenizer");
    let out = dir.join("r.json");
    let (o, _) = infer(&server.url, &out, &["--model", "m", "--requests", "3"]);
    let stderr = text(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let r = read_json(&out);
    assert_eq!(
        r["results"]["token_source"], "tokenizer",
        "{}",
        r["results"]
    );
    assert_eq!(r["results"]["token_counter"], "llama.cpp /tokenize");
    assert_eq!(r["results"]["tokens_approximate"], false);
    for p in level(&r, 0)["per_request"].as_array().unwrap() {
        // Six chunks of "tökN ", two tokens each.
        assert_eq!(p["token_chunks"], 6, "{p}");
        assert_eq!(p["output_tokens"], 12, "{p}");
        assert_eq!(p["token_source"], "tokenizer");
    }
    assert!(!r["warnings"].to_string().contains("approximate"));
    // The counting came after the level: every stream was asked for before any count.
    let seen = server.seen.lock().unwrap().clone();
    let last_stream = seen
        .iter()
        .rposition(|q| q.contains("chat/completions"))
        .unwrap();
    // (The probe before the run counts "" and "hello world"; the recounts hold the answers.)
    let first_count = seen
        .iter()
        .position(|q| q.starts_with("POST /tokenize") && q.contains("tök"))
        .unwrap();
    assert!(
        first_count > last_stream,
        "counted while streams were timed"
    );
}

#[test]
fn levels_start_together_and_open_loop_arrives_at_a_rate() {
    let server = serve(|_| Act::Stream {
        ttft_ms: 30,
        gap_ms: 5,
        tokens: 4,
    });
    let dir = tmpdir("infer-levels");
    let out = dir.join("r.json");
    let (o, _) = infer(
        &server.url,
        &out,
        &[
            "--model",
            "m",
            "--requests",
            "8",
            "--concurrency",
            "1,4",
            "--max-tokens",
            "4",
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r = read_json(&out);
    assert_eq!(level(&r, 0)["concurrency"], 1);
    let l4 = level(&r, 1);
    assert_eq!(l4["concurrency"], 4);
    let starts: Vec<f64> = l4["per_request"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["start_s"].as_f64().unwrap())
        .collect();
    let mut sorted = starts.clone();
    sorted.sort_by(f64::total_cmp);
    assert!(
        sorted[3] - sorted[0] < 0.02,
        "the first four start together: {starts:?}"
    );
    assert!(
        sorted[4] - sorted[0] > 0.03,
        "the fifth waits for a free worker: {starts:?}"
    );

    let out = dir.join("open.json");
    let (o, _) = infer(
        &server.url,
        &out,
        &[
            "--model",
            "m",
            "--requests",
            "10",
            "--rate",
            "50",
            "--max-tokens",
            "4",
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r = read_json(&out);
    let l = level(&r, 0);
    assert_eq!(l["mode"], "open");
    assert_eq!(l["rate_per_s"], 50.0);
    assert!(l["max_in_flight"].as_u64().unwrap() >= 1);
    assert!(l["dispatch_lag_ms"]["n"] == 10);
}

#[test]
fn setup_mistakes_end_in_one_line_without_a_result_file() {
    let dir = tmpdir("infer-mistakes");
    let out = dir.join("never.json");
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{closed}/v1");
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (vec!["--endpoint", &url, "--model", "m"], 1, "connect"),
        (vec!["--endpoint", &url], 1, "cannot reach"),
        (
            vec!["--endpoint", "https://example.invalid/v1", "--model", "m"],
            1,
            "https is not supported",
        ),
        (
            vec!["--endpoint", &url, "--concurrency", "0"],
            2,
            "concurrency",
        ),
        (
            vec!["--endpoint", &url, "--rate", "0", "--model", "m"],
            1,
            "--rate",
        ),
    ];
    for (args, code, says) in cases {
        let mut all = vec!["infer", "--out", out.to_str().unwrap()];
        all.extend(args.iter());
        let t = Instant::now();
        let o = run(&all, Duration::from_secs(30));
        let stderr = text(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(t.elapsed() < Duration::from_secs(10));
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(!out.exists(), "{args:?} wrote a result file");
    }
}

#[test]
fn the_report_reads_infer_results() {
    let server = serve(|_| Act::Stream {
        ttft_ms: 5,
        gap_ms: 2,
        tokens: 6,
    });
    let dir = tmpdir("infer-report");
    let res = dir.join("results");
    let (o, _) = infer(
        &server.url,
        &res.join("infer.json"),
        &[
            "--model",
            "m",
            "--requests",
            "4",
            "--concurrency",
            "1,2",
            "--max-tokens",
            "6",
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    // A sweep of another workload against the same server, held to an SLO: the report
    // shows both runs, its knee, the latency-against-load charts with the SLO's line.
    let (o, _) = infer(
        &server.url,
        &res.join("sweep.json"),
        &[
            "--model",
            "m",
            "--requests",
            "6",
            "--sweep=3",
            "--max-tokens",
            "6",
            "--prompt-tokens",
            "64",
            "--slo",
            "ttft=1s",
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let html = dir.join("report.html");
    let json = dir.join("report.json");
    let o = run(
        &[
            "report",
            res.to_str().unwrap(),
            "-o",
            html.to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
            "--strict",
        ],
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("Infer: token rates"), "section present");
    for title in [
        "TTFT p50 (band to p99) against load",
        "TPOT p50 (band to p99) against load",
        "Aggregate output tokens/s against load",
        "Tokens/s per user against aggregate tokens/s",
    ] {
        assert!(page.contains(title), "{title}");
    }
    assert!(page.contains("SLO TTFT 1000 ms"), "the SLO's line");
    assert!(page.contains("the knee "), "the knee named");
    assert!(page.contains("(synchronous)") && page.contains("(throughput)"));
    assert!(
        page.contains("chat, prompt 128, output 6")
            && page.contains("chat, prompt 64, output 6, sweep"),
        "both workloads shown"
    );
    assert!(page.contains("infer-levels"));
    let o = run(
        &["compare", res.to_str().unwrap(), res.to_str().unwrap()],
        Duration::from_secs(30),
    );
    let stdout = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{stdout}{}", text(&o.stderr));
    for figure in ["TTFT p50", "TPOT p50", "tokens/s"] {
        assert!(stdout.contains(figure), "{figure} in compare:\n{stdout}");
    }
}

/// `--slo` counts each level's goodput; `--find-max` finds the highest concurrency whose
/// level meets it, on a server whose first token takes 50 ms per request in flight: 3 in
/// flight (150 ms) meet a 175 ms TTFT target, 4 (200 ms) do not.
#[test]
fn find_max_finds_the_highest_concurrency_within_the_slo() {
    let server = serve(|_| Act::Loaded {
        per_in_flight_ms: 50,
        gap_ms: 2,
        tokens: 4,
    });
    let dir = tmpdir("infer-slo");
    let out = dir.join("r.json");
    let (o, _) = infer(
        &server.url,
        &out,
        &[
            "--model",
            "m",
            "--requests",
            "6",
            "--max-tokens",
            "4",
            "--slo",
            "ttft=175ms,e2e=2s",
            "--find-max",
        ],
    );
    let stdout = text(&o.stdout);
    assert!(o.status.success(), "{stdout}\n{}", text(&o.stderr));
    assert!(
        stdout.contains("SLO: ttft ≤ 175 ms, e2e ≤ 2000 ms for 99% of requests"),
        "{stdout}"
    );
    assert!(
        stdout.contains("the highest concurrency meeting the SLO is 3"),
        "{stdout}"
    );
    let r = read_json(&out);
    let m = &r["results"]["max_within_slo"];
    assert_eq!(m["by"], "concurrency");
    assert_eq!(m["value"], 3.0, "{m}");
    let probes = m["probes"].as_array().unwrap();
    assert!(probes.len() <= 5, "few probes: {m}");
    let levels = r["results"]["levels"].as_array().unwrap();
    assert_eq!(levels.len(), probes.len(), "one level per probe");
    for l in levels {
        let g = &l["goodput"];
        let c = l["concurrency"].as_u64().unwrap();
        assert_eq!(g["met"], c <= 3, "c={c}: {g}");
        if c <= 3 {
            assert_eq!(g["share_met"], 1.0);
            assert!(g["output_tokens_per_s"].as_f64().unwrap() > 0.0);
        }
        // At least two requests per worker.
        assert!(l["requests"].as_u64().unwrap() >= (2 * c).max(6));
    }
    assert_eq!(r["results"]["slo"]["ttft_ms"], 175.0);
    // The report and compare read it.
    let html = dir.join("report.html");
    let o = std::process::Command::new(bin())
        .args(["report", out.to_str().unwrap(), "-o"])
        .arg(&html)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("goodput tok/s") && page.contains("the highest concurrency within it"));
    let o = std::process::Command::new(bin())
        .args(["compare", out.to_str().unwrap(), out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        text(&o.stdout).contains("highest load within the SLO"),
        "{}",
        text(&o.stdout)
    );
}

#[test]
fn bad_slo_flags_are_refused_in_one_line() {
    let dir = tmpdir("infer-slo-bad");
    let out = dir.join("r.json");
    for (extra, want, code) in [
        (vec!["--slo", "ttfb=1s"], "ttfb", 1),
        (
            vec!["--slo", "ttft=1s", "--slo-percentile", "150"],
            "--slo-percentile",
            1,
        ),
        (vec!["--find-max"], "--slo", 2),
    ] {
        let mut args = vec![
            "infer",
            "--endpoint",
            "http://127.0.0.1:9/v1",
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend(extra.iter());
        let o = run(&args, Duration::from_secs(20));
        assert_eq!(o.status.code(), Some(code), "{args:?}: {}", text(&o.stderr));
        let err = text(&o.stderr);
        assert!(err.contains(want), "want '{want}': {err}");
        assert!(!out.exists());
    }
}

/// A server of 4 slots: one request at a time, then all 16 at once (the saturated rate),
/// then constant rates between; the knee lies below the saturated level, where requests
/// queued for a slot.
#[test]
fn a_sweep_runs_from_one_at_a_time_to_saturation_and_names_the_knee() {
    let server = serve(|_| Act::Capacity {
        slots: 4,
        ttft_ms: 20,
        gap_ms: 10,
        tokens: 4,
    });
    let dir = tmpdir("infer-sweep");
    let out = dir.join("r.json");
    let (o, _) = infer(
        &server.url,
        &out,
        &[
            "--model",
            "m",
            "--requests",
            "16",
            "--max-tokens",
            "4",
            "--sweep=4",
        ],
    );
    let stdout = text(&o.stdout);
    assert!(o.status.success(), "{stdout}\n{}", text(&o.stderr));
    let r = read_json(&out);
    let levels = r["results"]["levels"].as_array().unwrap();
    let roles: Vec<&str> = levels
        .iter()
        .map(|l| l["sweep"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["synchronous", "constant", "constant", "throughput"],
        "{stdout}"
    );
    assert_eq!(levels[0]["concurrency"], 1);
    assert_eq!(levels[3]["concurrency"], 16);
    // The rates lie evenly between one at a time and the saturated rate, arriving evenly.
    let rate = |l: &Value| l["rate_per_s"].as_f64().unwrap();
    let ended = |l: &Value| l["ok"].as_f64().unwrap() / l["wall_s"].as_f64().unwrap();
    let (low, high) = (ended(&levels[0]), ended(&levels[3]));
    assert!(high > 2.0 * low, "4 slots end more at once: {low} {high}");
    for (i, l) in levels[1..3].iter().enumerate() {
        let want = low + (high - low) * (i + 1) as f64 / 3.0;
        assert!(
            (rate(l) - want).abs() < 0.01 * want,
            "{} vs {want}",
            rate(l)
        );
        assert_eq!(l["arrivals"], "constant");
        assert_eq!(l["mode"], "open");
    }
    assert!(rate(&levels[1]) < rate(&levels[2]));
    // Every request at once waits for a slot: its TTFT p99 is well past one at a time's,
    // so the knee is a level below it.
    let p99 = |l: &Value| l["ttft_ms"]["p99"].as_f64().unwrap();
    assert!(p99(&levels[3]) > 3.0 * p99(&levels[0]), "{stdout}");
    let knee = &r["results"]["knee"];
    assert_eq!(knee["by"], "rate_per_s");
    let name = knee["level"].as_str().expect("a knee");
    assert_ne!(name, "c=16", "{knee}");
    assert!(knee["broke"].as_str().unwrap().contains(" at "), "{knee}");
    assert!(stdout.contains(&format!("knee: {name} (then ")), "{stdout}");
    assert_eq!(r["params"]["sweep"], 4);
    assert_eq!(r["params"]["arrivals"], "constant");
}

/// Arrivals at twice what the server ends (2 slots of 50 ms: 40 a second): the level stops
/// sending once requests pile up, and says so, instead of queueing every request asked for.
#[test]
fn an_open_loop_past_saturation_stops_sending() {
    let server = serve(|_| Act::Capacity {
        slots: 2,
        ttft_ms: 40,
        gap_ms: 5,
        tokens: 3,
    });
    let dir = tmpdir("infer-saturated");
    let out = dir.join("r.json");
    let csv = dir.join("requests.csv");
    let (o, _) = infer(
        &server.url,
        &out,
        &[
            "--model",
            "m",
            "--requests",
            "800",
            "--max-tokens",
            "3",
            "--rate",
            "80",
            "--arrivals",
            "gamma:2",
            "--requests-out",
            csv.to_str().unwrap(),
        ],
    );
    let stdout = text(&o.stdout);
    assert!(o.status.success(), "{stdout}\n{}", text(&o.stderr));
    assert!(stdout.contains("stopped sending after"), "{stdout}");
    let r = read_json(&out);
    let l = level(&r, 0);
    assert_eq!(l["arrivals"], "gamma:2");
    let stopped = &l["stopped"];
    let not_sent = stopped["not_sent"].as_u64().unwrap();
    assert!(not_sent > 0, "{stopped}");
    assert!(stopped["in_flight"].as_u64().unwrap() >= 8, "{stopped}");
    assert_eq!(l["requests"].as_u64().unwrap() + not_sent, 800);
    assert_eq!(l["failed"], 0, "what was sent ended");
    // The per-request file: a header and a line per request sent, every column there.
    let rows = std::fs::read_to_string(&csv).unwrap();
    let lines: Vec<&str> = rows.lines().collect();
    assert!(lines[0].starts_with("level,context,index,conversation,turn,start_s,end_s,ok,"));
    assert_eq!(lines.len() as u64, 1 + l["requests"].as_u64().unwrap());
    assert!(lines[1].starts_with("rate=80/s,"), "{}", lines[1]);
}

/// A dataset replayed turn by turn: each request carries the turns before it and the
/// server's own answers; a shared prefix starts every prompt; output lengths follow the
/// dataset's answers; JSON Lines has a line per request with its conversation and turn.
#[test]
fn datasets_replay_conversations_with_their_history() {
    let server = serve(|_| Act::Stream {
        ttft_ms: 2,
        gap_ms: 1,
        tokens: 3,
    });
    let dir = tmpdir("infer-dataset");
    let data = dir.join("chats.json");
    std::fs::write(
        &data,
        r#"[{"conversations": [{"from": "human", "value": "first question"},
                               {"from": "gpt", "value": "one two three four five six seven eight nine ten"},
                               {"from": "human", "value": "second question"},
                               {"from": "gpt", "value": "short"}]},
            {"conversations": [{"from": "human", "value": "another chat"}]}]"#,
    )
    .unwrap();
    let out = dir.join("r.json");
    let jl = dir.join("requests.jsonl");
    let (o, _) = infer(
        &server.url,
        &out,
        &[
            "--model",
            "m",
            "--requests",
            "6",
            "--max-tokens",
            "100",
            "--dataset",
            data.to_str().unwrap(),
            "--multi-turn",
            "--shared-prefix",
            "40",
            "--requests-out",
            jl.to_str().unwrap(),
        ],
    );
    let stdout = text(&o.stdout);
    assert!(o.status.success(), "{stdout}\n{}", text(&o.stderr));
    let bodies = posted_bodies(&server);
    let firsts: Vec<&str> = bodies
        .iter()
        .map(|b| b["messages"][0]["content"].as_str().unwrap())
        .collect();
    let prefix = firsts[0].split("\n\n").next().unwrap();
    assert!(prefix.split(' ').count() > 20, "{prefix}");
    assert!(firsts.iter().all(|f| f.starts_with(prefix)), "{firsts:?}");
    // A second turn: the first turn, the server's answer as it streamed, the next question;
    // it asks for as many tokens as the dataset's second answer had (1 word, 1.3 tokens).
    let second = bodies
        .iter()
        .find(|b| b["messages"].as_array().unwrap().len() == 3)
        .expect("a second turn");
    assert!(second["messages"][0]["content"]
        .as_str()
        .unwrap()
        .ends_with("first question"));
    assert_eq!(second["messages"][1]["role"], "assistant");
    assert_eq!(second["messages"][1]["content"], "tök0 tök1 tök2 ");
    assert_eq!(second["messages"][2]["content"], "second question");
    // The history as it was sent: the first turn byte for byte (a prefix cache may serve it).
    assert!(
        bodies
            .iter()
            .any(|b| b["messages"].as_array().unwrap().len() == 1
                && b["messages"][0]["content"] == second["messages"][0]["content"]),
        "turn 1 repeats turn 0's message exactly"
    );
    assert_eq!(second["max_tokens"], 1);
    // First turns ask for their answer's length: 10 words, 13 tokens.
    assert!(bodies
        .iter()
        .any(|b| b["max_tokens"] == 13 && b["messages"].as_array().unwrap().len() == 1));
    let lines: Vec<Value> = std::fs::read_to_string(&jl)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 6);
    assert!(lines
        .iter()
        .any(|l| l["turn"] == 1 && l["conversation"].is_u64()));
    let r = read_json(&out);
    assert_eq!(r["results"]["prompt"]["conversations"], 2);
    assert_eq!(r["results"]["prompt"]["multi_turn"], true);
    assert_eq!(r["params"]["shared_prefix"], 40);
}

/// Lengths drawn per request stay in their range; bad workload flags end in one line.
#[test]
fn drawn_lengths_and_bad_workload_flags() {
    let server = serve(|_| Act::Stream {
        ttft_ms: 2,
        gap_ms: 1,
        tokens: 3,
    });
    let dir = tmpdir("infer-lengths");
    let out = dir.join("r.json");
    let (o, _) = infer(
        &server.url,
        &out,
        &[
            "--model",
            "m",
            "--requests",
            "12",
            "--max-tokens",
            "3-9",
            "--prompt-tokens",
            "normal:64,16",
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let asked: Vec<u64> = posted_bodies(&server)
        .iter()
        .filter_map(|b| b["max_tokens"].as_u64())
        .collect();
    assert!(asked.iter().all(|m| (3..=9).contains(m)), "{asked:?}");
    assert!(asked.iter().any(|&m| m != asked[0]), "drawn: {asked:?}");
    let r = read_json(&out);
    assert_eq!(r["params"]["max_tokens"], "3-9");
    assert_eq!(r["params"]["prompt_tokens"], "normal:64,16");

    let data = dir.join("bad.json");
    std::fs::write(&data, "[{\"conversations\": 3}]").unwrap();
    let out = dir.join("never.json");
    for (extra, want) in [
        (vec!["--dataset", data.to_str().unwrap()], "bad.json"),
        (vec!["--multi-turn"], "--dataset"),
        (vec!["--sweep", "--rate", "2"], "--rate"),
        (vec!["--max-tokens", "9-3"], "smaller end"),
        (vec!["--arrivals", "bursty"], "gamma:SHAPE"),
        (vec!["--requests-out", "x.txt"], ".jsonl or .csv"),
        (vec!["--context", "0,512", "--sweep"], "--sweep"),
        (
            vec!["--context", "0,512", "--prompt-tokens", "64"],
            "--prompt-tokens",
        ),
        (
            vec!["--arrivals", "constant", "--concurrency", "4"],
            "open-loop",
        ),
        (vec!["--sweep", "--concurrency", "4"], "give a list"),
        (vec!["--sweep", "--requests", "1"], "--requests of 2"),
        (
            vec!["--sweep=3", "--concurrency", "1,2"],
            "the list is the sweep",
        ),
    ] {
        let mut args = vec![
            "infer",
            "--endpoint",
            server.url.as_str(),
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend(extra.iter());
        let o = run(&args, Duration::from_secs(20));
        let err = text(&o.stderr);
        assert!(!o.status.success(), "{args:?}");
        assert!(err.contains(want), "{args:?}: want '{want}': {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: one line: {err}");
        assert!(!out.exists(), "{args:?}");
    }
}
