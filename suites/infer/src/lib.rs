//! `tbbench infer`: end-to-end token rates.
//!
//! Against a server (`--endpoint`): streamed OpenAI-compatible completions, timed per SSE
//! event, at closed-loop concurrency levels or open-loop Poisson arrivals; TTFT, TPOT, chunk
//! gaps, E2E latency, per-request decode rate and aggregate tokens/s (README, "tbbench
//! infer", defines each once). This mode has no ranks: one client process talks to the
//! server, so it does not go through the rank driver; it writes the same result file (one
//! host, the client; the network the requests travelled).

pub mod cli;
pub mod decode;
pub mod endpoint;
mod export;
pub mod figures;
pub mod http;
pub mod load;
pub mod openai;
pub mod prompt;
pub mod request;
mod server_tokenizer;
pub mod slo;
pub mod sse;
pub mod sweep;
mod table;
pub mod view;
pub mod workload;

pub use openai::Api;
use serde::Serialize;
use std::path::PathBuf;

/// Every parameter of an endpoint run; serialized whole into the result's `params`.
#[derive(Debug, Clone, Serialize)]
pub struct InferConfig {
    /// Base URL of the OpenAI-compatible API, e.g. `http://127.0.0.1:8080/v1`.
    pub endpoint: String,
    /// None: the first model the server lists at GET /models.
    pub model: Option<String>,
    pub api: Api,
    /// Prompt length to aim for, in the server's tokens (tuned during warm-up from `usage`):
    /// fixed or drawn per request.
    pub prompt_tokens: workload::Lengths,
    pub max_tokens: workload::Lengths,
    /// Measured requests per level.
    pub requests: u64,
    /// Untimed full-size requests before the first level (they also tune the prompt length).
    pub warmup: u64,
    /// Closed-loop levels, one measurement each; unused with `rate_per_s`.
    pub concurrency: Vec<usize>,
    /// Open loop: arrivals at this mean rate.
    pub rate_per_s: Option<f64>,
    /// `--sweep`: the levels of a rate sweep (with a list of concurrencies, the list).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sweep: Option<usize>,
    /// How open-loop requests arrive.
    pub arrivals: load::Arrivals,
    /// Each level's ramp-up, seconds (0: none).
    pub ramp_up_s: f64,
    /// `--context`: prompt depths, tokens, each a set of levels.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub context: Vec<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dataset: Option<PathBuf>,
    pub multi_turn: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_prefix: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests_out: Option<PathBuf>,
    /// The variable the API key is read from. The key itself is never printed or stored.
    pub api_key_env: String,
    /// Longest wait on the network with no progress (connect, send, each read).
    pub timeout_s: f64,
    pub ignore_eos: bool,
    pub temperature: Option<f64>,
    /// Seeds the prompt words and the arrival times (prompts are unique per run anyway).
    pub seed: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub out: Option<PathBuf>,
    /// `--slo`: targets each level's goodput is counted against.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slo: Option<slo::Slo>,
    /// `--find-max`: search the highest concurrency (or rate, with `--rate`) that meets the
    /// SLO, from the first level given.
    pub find_max: bool,
}

impl Default for InferConfig {
    fn default() -> Self {
        InferConfig {
            endpoint: String::new(),
            model: None,
            api: Api::Chat,
            prompt_tokens: workload::Lengths::Fixed(128),
            max_tokens: workload::Lengths::Fixed(128),
            requests: 16,
            warmup: 2,
            concurrency: vec![1],
            rate_per_s: None,
            sweep: None,
            arrivals: load::Arrivals::Poisson,
            ramp_up_s: 0.0,
            context: vec![],
            dataset: None,
            multi_turn: false,
            shared_prefix: None,
            requests_out: None,
            api_key_env: "OPENAI_API_KEY".into(),
            timeout_s: 60.0,
            ignore_eos: false,
            temperature: None,
            seed: 1,
            out: None,
            slo: None,
            find_max: false,
        }
    }
}

/// `1,2,4,8` (also `1-8`, every power of two from 1 to 8).
/// The most concurrent requests one level may hold open, and the most levels in one run.
pub const MAX_CONCURRENCY: usize = 4096;
pub const MAX_LEVELS: usize = 64;

pub fn parse_concurrency(text: &str) -> Result<Vec<usize>, String> {
    let bad = |w: &str| format!("'{w}' is not a concurrency (use a list like 1,2,4,8 or 1-8)");
    let mut out = Vec::new();
    for w in text.split(',').map(str::trim) {
        if let Some((a, b)) = w.split_once('-') {
            let (a, b): (usize, usize) = (
                a.trim().parse().map_err(|_| bad(w))?,
                b.trim().parse().map_err(|_| bad(w))?,
            );
            if a == 0 || b < a {
                return Err(bad(w));
            }
            // Checked before expanding: doubling toward a huge bound would never end.
            if b > MAX_CONCURRENCY {
                return Err(format!(
                    "{text}: at most {MAX_CONCURRENCY} concurrent requests"
                ));
            }
            let mut c = a;
            while c <= b {
                out.push(c);
                c *= 2;
            }
        } else {
            let c: usize = w.parse().map_err(|_| bad(w))?;
            if c == 0 {
                return Err(bad(w));
            }
            if c > MAX_CONCURRENCY {
                return Err(format!(
                    "{text}: at most {MAX_CONCURRENCY} concurrent requests"
                ));
            }
            out.push(c);
        }
        if out.len() > MAX_LEVELS {
            return Err(format!("{text}: at most {MAX_LEVELS} concurrency levels"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrency_lists_and_ranges() {
        assert_eq!(parse_concurrency("1,2,4,8").unwrap(), vec![1, 2, 4, 8]);
        assert_eq!(parse_concurrency("1-8").unwrap(), vec![1, 2, 4, 8]);
        assert_eq!(parse_concurrency("3").unwrap(), vec![3]);
        for bad in ["0", "a", "1,,2", "4-2", "-1", "99999"] {
            assert!(parse_concurrency(bad).is_err(), "{bad}");
        }
        // Ranges are bounded before they are expanded (these once looped for ever).
        for huge in ["1-9223372036854775808", "1-18446744073709551615", "2-4097"] {
            let err = parse_concurrency(huge).unwrap_err();
            assert!(err.contains("at most 4096"), "{huge}: {err}");
        }
        let many = vec!["1"; MAX_LEVELS + 1].join(",");
        assert!(parse_concurrency(&many).unwrap_err().contains("levels"));
    }
}
