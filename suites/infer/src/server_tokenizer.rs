//! Exact output token counts where a stream carries none: the server's own tokenizer applied
//! to the text it streamed. llama-cpp-python's server sends no `usage` in a stream and no
//! timings, so without this a run could only count text-bearing chunks (a chunk may hold
//! several tokens, and a token that ends mid-character holds none). Servers offer their
//! tokenizer under different paths, all beside the API rather than under it:
//! - llama-cpp-python: `POST /extras/tokenize/count` `{"input": text}` → `{"count": n}`
//! - llama.cpp's llama-server: `POST /tokenize` `{"content": text}` → `{"tokens": [...]}`
//! - vLLM: `POST /tokenize` `{"model": m, "prompt": text}` → `{"count": n, "tokens": [...]}`
//!
//! Some add the model's start-of-text token to every count; the count of the empty text is
//! that offset, measured once and taken off.
//!
//! Counting runs after a level's requests are done, never while they are timed.

use crate::http::{self, Url};
use serde_json::{json, Value};
use std::time::Duration;

/// Texts longer than this are not sent back to be counted (an answer of --max-tokens tokens
/// is far shorter; a server streaming megabytes is counted by its chunks instead).
const MAX_TEXT: usize = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    LlamaCppPython,
    LlamaServer,
    Vllm,
}

pub struct Tokenizer {
    root: Url,
    kind: Kind,
    model: String,
    auth: Option<String>,
    timeout: Duration,
    /// What the server counts for the empty text (a start-of-text token it adds).
    offset: u64,
}

impl Tokenizer {
    /// The first tokenizer endpoint the server answers sensibly, or None (then the run
    /// counts chunks and says so).
    pub fn probe(api: &Url, model: &str, auth: Option<&str>, timeout: Duration) -> Option<Self> {
        let root = Url {
            base_path: String::new(),
            ..api.clone()
        };
        for kind in [Kind::LlamaCppPython, Kind::LlamaServer, Kind::Vllm] {
            let mut t = Tokenizer {
                root: root.clone(),
                kind,
                model: model.to_string(),
                auth: auth.map(str::to_string),
                timeout,
                offset: 0,
            };
            let (Some(empty), Some(two)) = (t.raw_count(""), t.raw_count("hello world")) else {
                continue;
            };
            // Two words are at least one token more than nothing, and not a hundred.
            if two > empty && two - empty < 100 {
                t.offset = empty;
                return Some(t);
            }
        }
        None
    }

    /// Which server's tokenizer this is, for the result file.
    pub fn name(&self) -> &'static str {
        match self.kind {
            Kind::LlamaCppPython => "llama-cpp-python /extras/tokenize/count",
            Kind::LlamaServer => "llama.cpp /tokenize",
            Kind::Vllm => "vLLM /tokenize",
        }
    }

    /// Tokens in `text` as the server's model splits it.
    pub fn count(&self, text: &str) -> Option<u64> {
        if text.len() > MAX_TEXT {
            return None;
        }
        self.raw_count(text)?.checked_sub(self.offset)
    }

    fn raw_count(&self, text: &str) -> Option<u64> {
        let (path, body) = match self.kind {
            Kind::LlamaCppPython => (
                "/extras/tokenize/count",
                json!({ "input": text, "model": self.model }),
            ),
            Kind::LlamaServer => ("/tokenize", json!({ "content": text })),
            Kind::Vllm => (
                "/tokenize",
                json!({ "model": self.model, "prompt": text, "add_special_tokens": false }),
            ),
        };
        let mut headers = vec![("Content-Type", "application/json")];
        if let Some(a) = &self.auth {
            headers.push(("Authorization", a.as_str()));
        }
        let mut resp = http::send(
            &self.root,
            "POST",
            path,
            &headers,
            body.to_string().as_bytes(),
            self.timeout,
        )
        .ok()?;
        if resp.status != 200 {
            return None;
        }
        let v: Value = serde_json::from_str(&resp.text(MAX_TEXT * 8)).ok()?;
        v.get("count")
            .and_then(Value::as_u64)
            .or_else(|| v.get("tokens")?.as_array().map(|t| t.len() as u64))
    }
}
