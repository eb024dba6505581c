//! One streamed request, timed: when each SSE event arrived, what it said, and the figures of
//! the request (TTFT, TPOT, gaps, E2E) that follow. A failure is a record too, with its kind
//! and message; it never stops the run.

use crate::http::{self, FailKind, Failure, Url};
use crate::openai::{self, Api, ServerTimings, Usage};
use crate::sse::{SseDecoder, SseItem};
use serde::Serialize;
use std::io::Read;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Where a request's output token count came from, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TokenSource {
    /// The server's `usage.completion_tokens`.
    Usage,
    /// The server's own timings (llama-server `timings.predicted_n`, exo's generation_stats).
    ServerTimings,
    /// The server's tokenizer applied to the text it streamed (servers that send neither).
    Tokenizer,
    /// Stream chunks that carried text: approximate, since a chunk may hold several tokens.
    Chunks,
}

pub struct Target<'a> {
    pub url: &'a Url,
    pub api: Api,
    /// `Authorization` header value, when a key is set. Never printed or stored.
    pub auth: Option<&'a str>,
    pub timeout: Duration,
    /// The most one request may take, first byte to [DONE], however the server trickles:
    /// [`request_deadline`].
    pub deadline: Duration,
    /// The tokens each request asks for at most: a server count above it is not believed.
    pub max_tokens: u64,
}

/// Why a server's own count of the tokens it generated cannot be believed, if it cannot: more
/// than the request allowed (`max_tokens`, one over for a counted end-of-sequence token), or
/// far from the chunks that carried text (a chunk holds a few tokens at most; a count below
/// one per four chunks, or above 16 per chunk and 16 more, is no count of this stream).
/// Such a figure would put 1.5e23 tokens/s in a result.
pub fn unbelievable(
    tokens: u64,
    source: TokenSource,
    max_tokens: u64,
    chunks: u64,
) -> Option<String> {
    if source == TokenSource::Chunks {
        return None;
    }
    let what = match source {
        TokenSource::Usage => "usage.completion_tokens",
        _ => "the server's generated-token count",
    };
    if tokens > max_tokens.saturating_add(1) {
        return Some(format!(
            "{what} {tokens} is more than the {max_tokens} tokens asked for: not believed"
        ));
    }
    if tokens > chunks.saturating_mul(16).saturating_add(16) || tokens.saturating_mul(4) < chunks {
        return Some(format!(
            "{what} {tokens} is far from the {chunks} chunks of text streamed: not believed"
        ));
    }
    None
}

/// The most one streamed request may take: `timeout` (which bounds each wait without
/// progress) plus a second for every token asked for. A server slower than a token a second
/// is no server to benchmark, and one that trickles a byte at a time, or only comments, or
/// never sends [DONE], would otherwise hold a run forever.
pub fn request_deadline(timeout: Duration, max_tokens: u64) -> Duration {
    timeout + Duration::from_secs(max_tokens)
}

impl Target<'_> {
    /// POSTs a JSON `body` to the API's path, with the key where one is set and `extra`
    /// headers.
    pub fn post(&self, body: &[u8], extra: &[(&str, &str)]) -> Result<http::Response, Failure> {
        let mut headers = vec![("Content-Type", "application/json")];
        headers.extend_from_slice(extra);
        if let Some(a) = self.auth {
            headers.push(("Authorization", a));
        }
        http::send(
            self.url,
            "POST",
            self.api.path(),
            &headers,
            body,
            self.timeout,
        )
    }
}

impl Record {
    /// Sets the output token count and what it came from, and the figures that follow from
    /// it: TPOT and the decode rate over the time from the first token to the end.
    pub fn set_tokens(&mut self, tokens: u64, source: TokenSource) {
        self.output_tokens = Some(tokens);
        self.token_source = Some(source);
        self.tpot_ms = None;
        self.decode_tokens_per_s = None;
        if let (Some(ttft), Some(e2e), true) = (self.ttft_ms, self.e2e_ms, tokens >= 2) {
            let decode_ms = e2e - ttft;
            if decode_ms > 0.0 {
                self.tpot_ms = Some(decode_ms / (tokens - 1) as f64);
                self.decode_tokens_per_s = Some((tokens - 1) as f64 / (decode_ms / 1e3));
            }
        }
    }
}

/// The streamed text kept per request for counting (an answer of --max-tokens tokens is far
/// shorter).
const STREAMED_TEXT_KEPT: usize = 1 << 20;

#[derive(Debug, Clone, Default, Serialize)]
pub struct Record {
    pub index: u64,
    /// `--multi-turn`: the conversation (its place in the dataset) and the turn of it, from 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conversation: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turn: Option<u32>,
    /// When the request started, seconds after the level started.
    pub start_s: f64,
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip)]
    pub fail_kind: Option<FailKind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connect_ms: Option<f64>,
    /// The first token of either kind (content or reasoning).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_content_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_reasoning_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub e2e_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tpot_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode_tokens_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_source: Option<TokenSource>,
    /// Events that carried content or reasoning text.
    pub token_chunks: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_timings: Option<ServerTimings>,
    /// The streamed text (reasoning and content), for counting its tokens after the level;
    /// not written.
    #[serde(skip)]
    pub text: String,
    /// The longest gap between two text-bearing chunks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gap_max_ms: Option<f64>,
    /// Every gap between text-bearing chunks, for the level's histogram (not written: one
    /// per token would swamp the file).
    #[serde(skip)]
    pub gaps_us: Vec<u64>,
    /// When the request ended, seconds after the level started.
    #[serde(skip)]
    pub end_s: f64,
    /// This end and the server's end of the connection, for the network record.
    #[serde(skip)]
    pub addrs: Option<(SocketAddr, SocketAddr)>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Runs one request to its end. `level_start` anchors `start_s`/`end_s`.
pub fn run(target: &Target, body: &[u8], index: u64, level_start: Instant) -> Record {
    run_watched(
        target,
        body,
        index,
        level_start,
        &AtomicU64::new(NO_TOKEN_YET),
    )
}

/// What [`run_watched`]'s `first_token` holds until the first token comes.
pub const NO_TOKEN_YET: u64 = u64::MAX;

/// As [`run`], and `first_token` set to when the first token came (nanoseconds after
/// `level_start`) as soon as it does, for whoever watches the level while it runs.
pub fn run_watched(
    target: &Target,
    body: &[u8],
    index: u64,
    level_start: Instant,
    first_token: &AtomicU64,
) -> Record {
    let start = Instant::now();
    let mut rec = Record {
        index,
        start_s: start.duration_since(level_start).as_secs_f64(),
        ..Default::default()
    };
    let note = |t: Instant| {
        first_token.store(
            t.duration_since(level_start).as_nanos() as u64,
            Ordering::Relaxed,
        )
    };
    if let Err(f) = stream(target, body, start, &mut rec, &note) {
        rec.ok = false;
        rec.fail_kind = Some(f.kind);
        rec.error = Some(f.to_string());
    } else {
        rec.ok = true;
    }
    rec.end_s = Instant::now().duration_since(level_start).as_secs_f64();
    rec
}

fn stream(
    target: &Target,
    body: &[u8],
    start: Instant,
    rec: &mut Record,
    first_token: &dyn Fn(Instant),
) -> Result<(), Failure> {
    let mut resp = target.post(body, &[("Accept", "text/event-stream")])?;
    rec.status = Some(resp.status);
    rec.connect_ms = Some(ms(resp.connect));
    rec.addrs = Some((resp.local, resp.peer));
    if resp.status != 200 {
        let text = resp.text(8192);
        return Err(Failure::new(
            FailKind::Http(resp.status),
            format!(
                "{}: {}",
                resp.status_text(),
                openai::error_body_message(&text)
            ),
        ));
    }
    let ctype = resp
        .header("content-type")
        .unwrap_or("")
        .to_ascii_lowercase();
    if !ctype.starts_with("text/event-stream") {
        let text = resp.text(300);
        return Err(Failure::new(
            FailKind::BadResponse,
            format!(
                "answered with Content-Type {ctype:?}, not an event stream: {}",
                openai::error_body_message(&text)
            ),
        ));
    }

    let mut decoder = SseDecoder::new();
    let mut items = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    let mut first_any: Option<Instant> = None;
    let mut first_content: Option<Instant> = None;
    let mut first_reasoning: Option<Instant> = None;
    let mut last_token: Option<Instant> = None;
    let mut usage: Option<Usage> = None;
    let mut timings: Option<ServerTimings> = None;
    let mut done = false;
    let mut end = start;
    'read: loop {
        let n = match resp.body.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                return Err(Failure::from_io(
                    &e,
                    &format!("reading the stream after {} chunks", rec.token_chunks),
                    FailKind::Broken,
                ))
            }
        };
        let now = Instant::now();
        end = now;
        if now.duration_since(start) > target.deadline {
            return Err(Failure::new(
                FailKind::Timeout,
                format!(
                    "no end of the stream within {:.0} s after {} chunks (the deadline is --timeout plus a second per token asked for)",
                    target.deadline.as_secs_f64(),
                    rec.token_chunks
                ),
            ));
        }
        decoder.feed(&buf[..n], &mut items);
        if decoder.overflowed() {
            return Err(Failure::new(
                FailKind::BadResponse,
                format!(
                    "a line of the event stream ran past {} KiB without ending: not an OpenAI stream",
                    crate::sse::MAX_LINE_BYTES >> 10
                ),
            ));
        }
        for item in items.drain(..) {
            let ev = match item {
                SseItem::Comment(c) => {
                    if let Some(t) = openai::parse_stats_comment(&c) {
                        timings = Some(t);
                    }
                    continue;
                }
                SseItem::Event(ev) => ev,
            };
            if ev.event_type == "error" {
                return Err(Failure::new(
                    FailKind::StreamError,
                    format!(
                        "error event after {} chunks: {}",
                        rec.token_chunks,
                        openai::error_body_message(&ev.data)
                    ),
                ));
            }
            match openai::parse_data(target.api, &ev.data) {
                Err(e) => return Err(Failure::new(FailKind::BadResponse, e)),
                Ok(openai::Parsed::Error(m)) => {
                    return Err(Failure::new(
                        FailKind::StreamError,
                        format!("error object after {} chunks: {m}", rec.token_chunks),
                    ))
                }
                Ok(openai::Parsed::Done) => {
                    done = true;
                    // Whatever follows [DONE] is not part of the answer.
                    break 'read;
                }
                Ok(openai::Parsed::Chunk(c)) => {
                    let has_content = !c.content.is_empty();
                    let has_reasoning = !c.reasoning.is_empty();
                    if has_content || has_reasoning {
                        rec.token_chunks += 1;
                        if rec.text.len() < STREAMED_TEXT_KEPT {
                            rec.text.push_str(&c.reasoning);
                            rec.text.push_str(&c.content);
                        }
                        if first_any.is_none() {
                            first_token(now);
                        }
                        first_any.get_or_insert(now);
                        if has_content {
                            first_content.get_or_insert(now);
                        }
                        if has_reasoning {
                            first_reasoning.get_or_insert(now);
                        }
                        if let Some(prev) = last_token {
                            rec.gaps_us
                                .push(now.duration_since(prev).as_micros().min(u64::MAX as u128)
                                    as u64);
                        }
                        last_token = Some(now);
                    }
                    if c.finish_reason.is_some() {
                        rec.finish_reason = c.finish_reason;
                    }
                    if c.usage.is_some() {
                        usage = c.usage;
                    }
                    if c.timings.is_some() {
                        timings = c.timings;
                    }
                }
            }
        }
    }
    let cut = decoder.finish();
    if !done && (rec.finish_reason.is_none() || cut) {
        return Err(Failure::new(
            FailKind::Broken,
            format!(
                "the stream ended after {} chunks without [DONE]{}",
                rec.token_chunks,
                if cut { ", inside an event" } else { "" }
            ),
        ));
    }
    if rec.token_chunks == 0 && rec.finish_reason.is_none() {
        return Err(Failure::new(
            FailKind::Empty,
            "the stream ended with no token and no finish_reason (the server dropped the request)",
        ));
    }

    let e2e = end.duration_since(start);
    rec.e2e_ms = Some(ms(e2e));
    rec.ttft_ms = first_any.map(|t| ms(t.duration_since(start)));
    rec.ttft_content_ms = first_content.map(|t| ms(t.duration_since(start)));
    rec.ttft_reasoning_ms = first_reasoning.map(|t| ms(t.duration_since(start)));
    rec.gap_max_ms = rec.gaps_us.iter().max().map(|&g| g as f64 / 1e3);
    let (tokens, source) = match (
        usage.and_then(|u| u.completion_tokens),
        timings.as_ref().and_then(|t| t.generated_tokens),
    ) {
        (Some(n), _) => (n, TokenSource::Usage),
        (None, Some(n)) => (n, TokenSource::ServerTimings),
        (None, None) => (rec.token_chunks, TokenSource::Chunks),
    };
    if let Some(why) = unbelievable(tokens, source, target.max_tokens, rec.token_chunks) {
        return Err(Failure::new(FailKind::BadResponse, why));
    }
    rec.prompt_tokens = usage
        .and_then(|u| u.prompt_tokens)
        .or(timings.as_ref().and_then(|t| t.prompt_tokens));
    rec.usage = usage;
    rec.server_timings = timings;
    rec.set_tokens(tokens, source);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_count_is_believed_only_near_the_stream() {
        use TokenSource::*;
        assert_eq!(unbelievable(32, Usage, 32, 32), None);
        assert_eq!(
            unbelievable(33, Usage, 32, 32),
            None,
            "one for a counted EOS"
        );
        assert!(unbelievable(u64::MAX, Usage, 32, 2)
            .unwrap()
            .contains("more than the 32"));
        assert!(unbelievable(40, ServerTimings, 1000, 1)
            .unwrap()
            .contains("far from the 1"));
        assert!(unbelievable(1, Usage, 1000, 40)
            .unwrap()
            .contains("far from"));
        // Chunks are what the client counted itself.
        assert_eq!(unbelievable(10_000, Chunks, 5, 10_000), None);
    }
}
