//! The OpenAI-compatible wire format, both ways: the request body for `/chat/completions` and
//! `/completions`, and what one streamed chunk says (text, reasoning, the end, token counts,
//! the server's own timings, an error).

use serde::Serialize;
use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// POST /chat/completions with one user message.
    Chat,
    /// POST /completions with a plain prompt.
    Completions,
}

impl Api {
    pub fn path(self) -> &'static str {
        match self {
            Api::Chat => "/chat/completions",
            Api::Completions => "/completions",
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct BodyOptions<'a> {
    pub api: Api,
    pub model: &'a str,
    pub max_tokens: u64,
    /// Ask for a last chunk with `usage` (`stream_options.include_usage`).
    pub include_usage: bool,
    /// Ask servers that know it (vLLM, llama-server, SGLang) to go on past end-of-sequence.
    pub ignore_eos: bool,
    pub temperature: Option<f64>,
}

pub fn body(o: &BodyOptions, prompt: &str) -> Vec<u8> {
    conversation_body(o, &[], prompt, false)
}

/// A request that carries a conversation's earlier turns, (user, assistant) pairs, before
/// its new user turn: as messages for the chat API, as one transcript for completions
/// (`transcript`: in the transcript's form from the first turn on, so each turn's prompt
/// begins with the one before it).
pub fn conversation_body(
    o: &BodyOptions,
    history: &[(&str, &str)],
    prompt: &str,
    transcript: bool,
) -> Vec<u8> {
    let mut b = json!({
        "model": o.model,
        "stream": true,
        "max_tokens": o.max_tokens,
    });
    match o.api {
        Api::Chat => {
            let mut messages = Vec::with_capacity(2 * history.len() + 1);
            for (user, assistant) in history {
                messages.push(json!({ "role": "user", "content": user }));
                messages.push(json!({ "role": "assistant", "content": assistant }));
            }
            messages.push(json!({ "role": "user", "content": prompt }));
            b["messages"] = json!(messages);
        }
        Api::Completions => {
            let mut text = String::new();
            for (user, assistant) in history {
                text.push_str(&format!("User: {user}\nAssistant: {assistant}\n"));
            }
            if !transcript {
                text.push_str(prompt);
            } else {
                text.push_str(&format!("User: {prompt}\nAssistant:"));
            }
            b["prompt"] = json!(text);
        }
    }
    if o.include_usage {
        b["stream_options"] = json!({ "include_usage": true });
    }
    if o.ignore_eos {
        b["ignore_eos"] = json!(true);
    }
    if let Some(t) = o.temperature {
        b["temperature"] = json!(t);
    }
    serde_json::to_vec(&b).expect("a JSON value serializes")
}

/// The same request without streaming: every server reports `usage` in a whole answer,
/// which tunes the prompt length where the stream carries none.
pub fn unstreamed(body: &[u8]) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(body).expect("built by body()");
    if let Some(o) = v.as_object_mut() {
        o.insert("stream".into(), json!(false));
        o.remove("stream_options");
    }
    serde_json::to_vec(&v).expect("a JSON value serializes")
}

/// `usage.prompt_tokens` of a whole (unstreamed) answer.
pub fn answer_prompt_tokens(answer: &str) -> Option<u64> {
    let v: Value = serde_json::from_str(answer).ok()?;
    v.get("usage")?.get("prompt_tokens")?.as_u64()
}

/// Token counts as the server reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Usage {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
}

/// The server's own clock for one request: llama-server's `timings` object, or exo's
/// `generation_stats` comment.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ServerTimings {
    /// Where they came from: "llama-server timings", "exo generation_stats".
    pub source: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generated_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation_tokens_per_s: Option<f64>,
}

/// What one `data:` event says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Chunk {
    pub content: String,
    pub reasoning: String,
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
    pub timings: Option<ServerTimings>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Parsed {
    Chunk(Chunk),
    /// `data: [DONE]`: the stream is over.
    Done,
    /// An error object in the stream: the server gave up on this request.
    Error(String),
}

pub fn parse_data(api: Api, data: &str) -> Result<Parsed, String> {
    let data = data.trim();
    if data == "[DONE]" {
        return Ok(Parsed::Done);
    }
    let v: Value = serde_json::from_str(data).map_err(|e| {
        let head: String = data.chars().take(80).collect();
        format!("a data event that is not JSON ({e}): {head:?}")
    })?;
    if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
        return Ok(Parsed::Error(error_message(err)));
    }
    let mut c = Chunk::default();
    if let Some(choice) = v
        .get("choices")
        .and_then(|c| c.as_array())
        .and_then(|a| a.first())
    {
        let text = |v: Option<&Value>| v.and_then(|x| x.as_str()).unwrap_or("").to_string();
        match api {
            Api::Chat => {
                let delta = choice.get("delta");
                c.content = text(delta.and_then(|d| d.get("content")));
                // DeepSeek and vLLM say reasoning_content; Ollama and OpenRouter say reasoning.
                c.reasoning = text(delta.and_then(|d| d.get("reasoning_content")));
                if c.reasoning.is_empty() {
                    c.reasoning = text(delta.and_then(|d| d.get("reasoning")));
                }
                // Some servers send a chat chunk with `text` (old llama.cpp builds).
                if c.content.is_empty() && delta.is_none() {
                    c.content = text(choice.get("text"));
                }
            }
            Api::Completions => c.content = text(choice.get("text")),
        }
        c.finish_reason = choice
            .get("finish_reason")
            .and_then(|f| f.as_str())
            .map(str::to_string);
    }
    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
        c.usage = Some(Usage {
            prompt_tokens: u.get("prompt_tokens").and_then(Value::as_u64),
            completion_tokens: u.get("completion_tokens").and_then(Value::as_u64),
        });
    }
    if let Some(t) = v.get("timings").filter(|t| t.is_object()) {
        c.timings = Some(ServerTimings {
            source: "llama-server timings".into(),
            prompt_tokens: t.get("prompt_n").and_then(Value::as_u64),
            prompt_ms: t.get("prompt_ms").and_then(Value::as_f64),
            generated_tokens: t.get("predicted_n").and_then(Value::as_u64),
            generation_ms: t.get("predicted_ms").and_then(Value::as_f64),
            generation_tokens_per_s: t.get("predicted_per_second").and_then(Value::as_f64),
        });
    }
    Ok(Parsed::Chunk(c))
}

fn error_message(err: &Value) -> String {
    let msg = match err {
        Value::String(s) => s.clone(),
        Value::Object(o) => o
            .get("message")
            .and_then(|m| m.as_str())
            .map(str::to_string)
            .unwrap_or_else(|| err.to_string()),
        other => other.to_string(),
    };
    msg.chars().take(300).collect()
}

/// The message of an error body (`{"error": {"message": ...}}`, `{"detail": ...}`), else the
/// body's start: what a failed request's line shows.
pub fn error_body_message(body: &str) -> String {
    if let Ok(v) = serde_json::from_str::<Value>(body) {
        if let Some(e) = v.get("error").filter(|e| !e.is_null()) {
            return error_message(e);
        }
        if let Some(d) = v.get("detail").or(v.get("message")) {
            return error_message(d);
        }
    }
    body.trim().chars().take(300).collect()
}

/// exo puts `: generation_stats {json}` comments in its stream. Field names differ between
/// versions, so every known spelling is tried; a comment that says nothing readable is None.
pub fn parse_stats_comment(comment: &str) -> Option<ServerTimings> {
    let rest = comment.trim_start().strip_prefix("generation_stats")?;
    let start = rest.find('{')?;
    let v: Value = serde_json::from_str(rest[start..].trim()).ok()?;
    let v = v.get("generation_stats").unwrap_or(&v);
    let num = |names: &[&str]| names.iter().find_map(|n| v.get(*n).and_then(Value::as_f64));
    let t = ServerTimings {
        source: "exo generation_stats".into(),
        prompt_tokens: num(&["prompt_tokens", "prompt_n", "num_prompt_tokens"]).map(|x| x as u64),
        prompt_ms: num(&["prompt_ms", "prefill_ms"]),
        generated_tokens: num(&[
            "generation_tokens",
            "completion_tokens",
            "generated_tokens",
            "num_generated_tokens",
            "predicted_n",
        ])
        .map(|x| x as u64),
        generation_ms: num(&["generation_ms", "decode_ms", "predicted_ms"]),
        generation_tokens_per_s: num(&[
            "generation_tps",
            "generation_tokens_per_second",
            "tokens_per_second",
            "decode_tps",
        ]),
    };
    let any = t.prompt_tokens.is_some()
        || t.generated_tokens.is_some()
        || t.generation_ms.is_some()
        || t.generation_tokens_per_s.is_some();
    any.then_some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_chunks_give_content_reasoning_and_the_end() {
        let p = parse_data(
            Api::Chat,
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}"#,
        )
        .unwrap();
        let Parsed::Chunk(c) = p else { panic!() };
        assert_eq!((c.content.as_str(), c.finish_reason), ("Hi", None));
        let Parsed::Chunk(c) = parse_data(
            Api::Chat,
            r#"{"choices":[{"delta":{"reasoning_content":"hmm"}}]}"#,
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(c.reasoning, "hmm");
        let Parsed::Chunk(c) = parse_data(
            Api::Chat,
            r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}"#,
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(
            c.usage,
            Some(Usage {
                prompt_tokens: Some(12),
                completion_tokens: Some(34)
            })
        );
        assert_eq!(parse_data(Api::Chat, " [DONE] ").unwrap(), Parsed::Done);
    }

    #[test]
    fn llama_server_timings_are_read() {
        let Parsed::Chunk(c) = parse_data(
            Api::Completions,
            r#"{"choices":[{"text":"","finish_reason":"length"}],"timings":{"prompt_n":9,"prompt_ms":12.5,"predicted_n":32,"predicted_ms":400.0,"predicted_per_second":80.0}}"#,
        )
        .unwrap() else {
            panic!()
        };
        let t = c.timings.unwrap();
        assert_eq!(
            (t.generated_tokens, t.generation_ms, t.prompt_tokens),
            (Some(32), Some(400.0), Some(9))
        );
        assert_eq!(c.finish_reason.as_deref(), Some("length"));
    }

    #[test]
    fn error_objects_in_the_stream_are_errors() {
        for data in [
            r#"{"error":{"message":"out of memory","type":"server_error"}}"#,
            r#"{"error":"out of memory"}"#,
        ] {
            assert_eq!(
                parse_data(Api::Chat, data).unwrap(),
                Parsed::Error("out of memory".into())
            );
        }
        assert!(parse_data(Api::Chat, "{not json").is_err());
        assert_eq!(error_body_message(r#"{"detail":"Not Found"}"#), "Not Found");
    }

    #[test]
    fn exo_stats_comments_are_read_and_others_ignored() {
        let t = parse_stats_comment(
            r#"generation_stats {"prompt_tokens": 20, "generation_tokens": 64, "generation_tps": 31.5}"#,
        )
        .unwrap();
        assert_eq!(t.generated_tokens, Some(64));
        assert_eq!(t.generation_tokens_per_s, Some(31.5));
        assert!(parse_stats_comment("keep-alive").is_none());
        assert!(parse_stats_comment("generation_stats {}").is_none());
    }

    #[test]
    fn bodies_ask_for_usage_only_when_told() {
        let o = BodyOptions {
            api: Api::Chat,
            model: "m",
            max_tokens: 8,
            include_usage: true,
            ignore_eos: false,
            temperature: None,
        };
        let v: Value = serde_json::from_slice(&body(&o, "hi")).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["messages"][0]["content"], "hi");
        assert!(v.get("ignore_eos").is_none());
        let v: Value = serde_json::from_slice(&body(
            &BodyOptions {
                include_usage: false,
                api: Api::Completions,
                ..o
            },
            "hi",
        ))
        .unwrap();
        assert!(v.get("stream_options").is_none());
        assert_eq!(v["prompt"], "hi");
    }
}
