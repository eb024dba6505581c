//! An OpenAI-compatible chat server with no model, for holding `tbbench infer`'s figures
//! against a server's own clock (scripts/bench-client-cost.sh): each request gets its first
//! token `--ttft-ms` after its request was read and one more every `--gap-ms`, max_tokens
//! in all, and the last chunk carries the server's clock as llama-server's `timings` does
//! (prompt_ms from the request read to the first token written, predicted_ms from the
//! first token to the last). A thread per connection, so no request waits on another's
//! writes: what the client sees beyond these timings is the client's.
//!
//!   cargo run --release --example timed_server -- PORT [--ttft-ms 200] [--gap-ms 20]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

fn chunk(s: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    s.write_all(format!("{:x}\r\n", data.len()).as_bytes())?;
    s.write_all(data)?;
    s.write_all(b"\r\n")
}

fn serve(stream: TcpStream, ttft: Duration, gap: Duration) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut head = String::new();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        let end = line == "\r\n";
        head.push_str(&line);
        if end {
            break;
        }
    }
    let mut body = vec![0u8; length.min(1 << 20)];
    reader.read_exact(&mut body)?;
    // The server's clock starts with the whole request read, as a server's own does: the
    // client's connect and send count against the client.
    let arrived = Instant::now();
    let mut s = stream;
    if head.starts_with("GET /v1/models") {
        let text = r#"{"object":"list","data":[{"id":"timed"}]}"#;
        return write!(
            s,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
            text.len()
        );
    }
    let asked: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let tokens = asked["max_tokens"].as_u64().unwrap_or(16).clamp(1, 100_000);
    s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")?;
    let (mut first, mut last) = (None, arrived);
    for i in 0..tokens {
        // Each token is due at a fixed time from the arrival: one late wake-up does not move
        // every later token.
        let due = arrived + ttft + gap * i as u32;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let event = format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" w{i}\"}},\"finish_reason\":null}}]}}\n\n"
        );
        chunk(&mut s, event.as_bytes())?;
        last = Instant::now();
        first.get_or_insert(last);
    }
    let first = first.unwrap_or(last);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let tail = format!(
        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"length\"}}],\"timings\":{{\"prompt_n\":8,\"prompt_ms\":{},\"predicted_n\":{tokens},\"predicted_ms\":{}}},\"usage\":{{\"prompt_tokens\":8,\"completion_tokens\":{tokens},\"total_tokens\":{}}}}}\n\ndata: [DONE]\n\n",
        ms(first - arrived),
        ms(last - first),
        8 + tokens
    );
    chunk(&mut s, tail.as_bytes())?;
    chunk(&mut s, b"")
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str, default: f64| -> f64 {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(|v| v.parse().expect("a number of milliseconds"))
            .unwrap_or(default)
    };
    let Some(port) = args.first().and_then(|p| p.parse::<u16>().ok()) else {
        eprintln!("usage: timed_server PORT [--ttft-ms 200] [--gap-ms 20]");
        std::process::exit(2);
    };
    let ttft = Duration::from_secs_f64(flag("--ttft-ms", 200.0) / 1e3);
    let gap = Duration::from_secs_f64(flag("--gap-ms", 20.0) / 1e3);
    let listener = TcpListener::bind(("127.0.0.1", port)).expect("the port is free");
    for conn in listener.incoming().flatten() {
        std::thread::spawn(move || {
            let _ = serve(conn, ttft, gap);
        });
    }
}
