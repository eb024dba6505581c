//! What each request asks: its prompt and how many tokens it may answer. Synthetic prompts of
//! a fixed length or of lengths drawn from a distribution (`--prompt-tokens`, `--max-tokens`
//! take `128`, `64-512` or `normal:256,64`), a dataset's conversations (`--dataset`,
//! ShareGPT-style JSON or JSON Lines), replayed turn by turn with their history
//! (`--multi-turn`), and a prefix every request shares (`--shared-prefix`), which a server's
//! prefix cache may serve. Each request's tag keeps what follows the shared prefix its own,
//! so no cache serves the rest.

use crate::openai::{self, BodyOptions};
use crate::prompt::{self, Calibration, Rng};
use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// A length in tokens: fixed, or drawn per request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Lengths {
    Fixed(u64),
    /// Uniform over MIN..=MAX.
    Uniform(u64, u64),
    /// Normal with this mean and standard deviation, clipped to 1 ..= mean + 4 sd.
    Normal {
        mean: f64,
        sd: f64,
    },
}

/// The longest length one request may ask for.
pub const MAX_LENGTH: u64 = 1_000_000;

impl Lengths {
    /// `128`, `64-512` or `normal:256,64`; `what` names the flag in errors.
    pub fn parse(s: &str, what: &str) -> Result<Lengths, String> {
        let s = s.trim();
        let num = |w: &str| -> Result<u64, String> {
            let n: u64 = w.trim().parse().map_err(|_| {
                format!("{what} {s}: '{w}' is not a token count (use 128, 64-512 or normal:256,64)")
            })?;
            if !(1..=MAX_LENGTH).contains(&n) {
                return Err(format!("{what} {s}: lengths are 1 to {MAX_LENGTH} tokens"));
            }
            Ok(n)
        };
        if let Some(spec) = s.strip_prefix("normal:") {
            let (m, d) = spec
                .split_once(',')
                .ok_or_else(|| format!("{what} {s}: normal takes MEAN,SD (normal:256,64)"))?;
            let mean = num(m)? as f64;
            let sd = d
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|x| *x >= 0.0 && x.is_finite())
                .ok_or_else(|| format!("{what} {s}: the SD must be a number of tokens"))?;
            if mean + 4.0 * sd > MAX_LENGTH as f64 {
                return Err(format!("{what} {s}: lengths are 1 to {MAX_LENGTH} tokens"));
            }
            return Ok(if sd == 0.0 {
                Lengths::Fixed(mean as u64)
            } else {
                Lengths::Normal { mean, sd }
            });
        }
        if let Some((a, b)) = s.split_once('-') {
            let (a, b) = (num(a)?, num(b)?);
            if b < a {
                return Err(format!("{what} {s}: the range runs from its smaller end"));
            }
            return Ok(if a == b {
                Lengths::Fixed(a)
            } else {
                Lengths::Uniform(a, b)
            });
        }
        Ok(Lengths::Fixed(num(s)?))
    }

    pub fn draw(&self, rng: &mut Rng) -> u64 {
        match *self {
            Lengths::Fixed(n) => n,
            Lengths::Uniform(a, b) => a + rng.next_u64() % (b - a + 1),
            Lengths::Normal { mean, sd } => (mean + sd * rng.normal())
                .round()
                .clamp(1.0, self.max() as f64) as u64,
        }
    }

    /// The most a draw can be.
    pub fn max(&self) -> u64 {
        match *self {
            Lengths::Fixed(n) => n,
            Lengths::Uniform(_, b) => b,
            Lengths::Normal { mean, sd } => (mean + 4.0 * sd).round().max(1.0) as u64,
        }
    }

    /// The mean of the draws (the clipping aside).
    pub fn mean(&self) -> f64 {
        match *self {
            Lengths::Fixed(n) => n as f64,
            Lengths::Uniform(a, b) => (a + b) as f64 / 2.0,
            Lengths::Normal { mean, .. } => mean,
        }
    }

    pub fn fixed(&self) -> Option<u64> {
        match *self {
            Lengths::Fixed(n) => Some(n),
            _ => None,
        }
    }
}

/// A fixed length is written as its number (as before distributions), others as their spec.
impl Serialize for Lengths {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match *self {
            Lengths::Fixed(n) => s.serialize_u64(n),
            Lengths::Uniform(a, b) => s.serialize_str(&format!("{a}-{b}")),
            Lengths::Normal { mean, sd } => s.serialize_str(&format!("normal:{mean},{sd}")),
        }
    }
}

/// One conversation of a dataset: its user turns, each with the length of the answer the
/// dataset recorded (in words) where it has one.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    pub turns: Vec<Turn>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    pub user: String,
    /// The length in tokens of the answer the dataset recorded, estimated ([`reply_tokens`]).
    pub reply_tokens: Option<u64>,
}

/// A recorded answer's length in tokens, estimated (tbbench has no tokenizer of the
/// server's): 1.3 tokens a word, as BPE vocabularies give English; text mostly outside ASCII
/// (Chinese, Japanese: no spaces between words) at 0.7 tokens a character.
pub fn reply_tokens(text: &str) -> u64 {
    let chars = text.chars().count();
    let wide = text.chars().filter(|c| !c.is_ascii()).count();
    let estimate = if 2 * wide > chars {
        chars as f64 * 0.7
    } else {
        text.split_whitespace().count() as f64 * 1.3
    };
    estimate.round().max(1.0) as u64
}

/// A dataset file's biggest size: far above ShareGPT's 650 MB, below what would not fit.
const MAX_DATASET_BYTES: u64 = 4 << 30;

#[derive(Deserialize)]
struct Entry {
    #[serde(default)]
    conversations: Option<Vec<ShareGptTurn>>,
    #[serde(default)]
    conversation: Option<Vec<ShareGptTurn>>,
    #[serde(default)]
    messages: Option<Vec<Message>>,
}

#[derive(Deserialize)]
struct ShareGptTurn {
    from: String,
    value: String,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    #[serde(default)]
    content: serde_json::Value,
}

fn role(r: &str) -> Option<bool> {
    match r.to_ascii_lowercase().as_str() {
        "human" | "user" => Some(true),
        "gpt" | "chatgpt" | "assistant" | "bard" | "bing" | "model" => Some(false),
        _ => None,
    }
}

fn conversation_of(turns: Vec<(bool, String)>) -> Option<Conversation> {
    let mut out: Vec<Turn> = Vec::new();
    for (is_user, text) in turns {
        if is_user {
            if !text.trim().is_empty() {
                out.push(Turn {
                    user: text,
                    reply_tokens: None,
                });
            }
        } else if let Some(last) = out.last_mut().filter(|t| t.reply_tokens.is_none()) {
            last.reply_tokens = Some(reply_tokens(&text));
        }
    }
    (!out.is_empty()).then_some(Conversation { turns: out })
}

/// Reads a dataset: a JSON array, or JSON Lines, of ShareGPT entries (`conversations`:
/// [{`from`: human|gpt, `value`}]) or chat entries (`messages`: [{`role`, `content`}]).
/// System turns are left out; entries with no user turn are skipped.
pub fn read_dataset(path: &Path) -> Result<Vec<Conversation>> {
    let shown = path.display();
    let meta = std::fs::metadata(path).with_context(|| format!("--dataset {shown}"))?;
    if !meta.is_file() {
        bail!("--dataset {shown}: not a file");
    }
    if meta.len() > MAX_DATASET_BYTES {
        bail!(
            "--dataset {shown}: {} GiB, more than the {} GiB tbbench reads",
            meta.len() >> 30,
            MAX_DATASET_BYTES >> 30
        );
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("--dataset {shown}"))?;
    let shape = "expected a JSON array (or JSON Lines) of {\"conversations\": [{\"from\": \"human\", \"value\": ...}]} or {\"messages\": [{\"role\": \"user\", \"content\": ...}]}";
    let entries: Vec<Entry> =
        if text.trim_start().starts_with('[') {
            serde_json::from_str(&text)
                .map_err(|e| anyhow::anyhow!("--dataset {shown}: {e}; {shape}"))?
        } else {
            let mut v = Vec::new();
            for (n, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                v.push(serde_json::from_str(line).map_err(|e| {
                    anyhow::anyhow!("--dataset {shown}: line {}: {e}; {shape}", n + 1)
                })?);
            }
            v
        };
    let total = entries.len();
    let conversations: Vec<Conversation> = entries
        .into_iter()
        .filter_map(|e| {
            let turns: Vec<(bool, String)> = if let Some(c) = e.conversations.or(e.conversation) {
                c.into_iter()
                    .filter_map(|t| Some((role(&t.from)?, t.value)))
                    .collect()
            } else {
                e.messages?
                    .into_iter()
                    .filter_map(|m| {
                        let text = match m.content {
                            serde_json::Value::String(s) => s,
                            // Parts: [{"type": "text", "text": ...}]
                            serde_json::Value::Array(parts) => parts
                                .iter()
                                .filter_map(|p| p.get("text").and_then(|t| t.as_str()))
                                .collect::<Vec<_>>()
                                .join("\n"),
                            _ => return None,
                        };
                        Some((role(&m.role)?, text))
                    })
                    .collect()
            };
            conversation_of(turns)
        })
        .collect();
    if conversations.is_empty() {
        bail!("--dataset {shown}: none of its {total} entries has a user turn; {shape}");
    }
    Ok(conversations)
}

/// Where prompts come from.
pub enum Prompts {
    /// Synthetic words, lengths as drawn; the calibration turns tokens into words.
    Synthetic {
        lengths: Lengths,
        calibration: Calibration,
        /// Words for the first request before any calibration.
        words: u64,
    },
    Dataset(Vec<Conversation>),
}

/// Builds every request's body.
pub struct Workload<'a> {
    pub options: BodyOptions<'a>,
    pub tag: String,
    pub seed: u64,
    pub prompts: Prompts,
    pub output: Lengths,
    /// Text every prompt starts with (`--shared-prefix`), and the tokens it was made for.
    pub shared_prefix: Option<(String, u64)>,
    /// `--context`: every prompt this many tokens instead of drawn ones.
    pub context: Option<u64>,
}

impl Workload<'_> {
    fn rng(&self, index: u64, salt: u64) -> Rng {
        Rng::new(self.seed ^ salt ^ index.wrapping_mul(0x9FB2_1C65_1E98_DF25))
    }

    /// Synthetic prompt words for `tokens` tokens of prompt in all (the shared prefix
    /// counted), as the calibration reads the server.
    pub fn words_for(&self, tokens: u64) -> u64 {
        match &self.prompts {
            Prompts::Synthetic {
                calibration, words, ..
            } => calibration.next_words(tokens, *words),
            Prompts::Dataset(_) => 0,
        }
    }

    fn with_prefix(&self, prompt: String) -> String {
        match &self.shared_prefix {
            Some((p, _)) => format!("{p}\n\n{prompt}"),
            None => prompt,
        }
    }

    /// The conversation request `index` replays: the dataset in its order, from a place drawn
    /// from `--seed` anew for each pass over it.
    pub fn conversation_of(&self, index: u64) -> usize {
        match &self.prompts {
            Prompts::Dataset(c) => {
                let n = c.len() as u64;
                let start = self.rng(index / n, 0xC0_4E).next_u64() % n;
                ((start + index % n) % n) as usize
            }
            Prompts::Synthetic { .. } => 0,
        }
    }

    /// The output tokens request `index` asks for: drawn, or for a dataset turn the length
    /// of the answer it recorded (at most the largest `--max-tokens`).
    fn max_tokens(&self, index: u64, turn: Option<&Turn>) -> u64 {
        match turn.and_then(|t| t.reply_tokens) {
            Some(t) => t.clamp(1, self.output.max()),
            None => self.output.draw(&mut self.rng(index, 0x0_7u64)),
        }
    }

    /// The prompt tokens request `index` was made to have (synthetic prompts only): for a
    /// server that reports no count, what the calibration aimed its words at.
    pub fn prompt_target(&self, index: u64) -> Option<u64> {
        let Prompts::Synthetic {
            lengths,
            calibration,
            ..
        } = &self.prompts
        else {
            return None;
        };
        let shared = self.shared_prefix.as_ref().map_or(0, |p| p.1);
        match self.context {
            // The instruction alone, one word.
            Some(0) => calibration.tokens_for(1),
            Some(d) => Some(d),
            None => Some(lengths.draw(&mut self.rng(index, 0x9_9u64)) + shared),
        }
    }

    /// A single-turn request's body: its prompt (synthetic, or a dataset conversation's first
    /// turn) and its output length.
    pub fn body(&self, index: u64) -> Vec<u8> {
        let options = |max_tokens| BodyOptions {
            max_tokens,
            ..self.options
        };
        match &self.prompts {
            Prompts::Synthetic { lengths, .. } => {
                let tokens = match self.context {
                    Some(d) => d,
                    None => lengths.draw(&mut self.rng(index, 0x9_9u64)),
                };
                let shared = self.shared_prefix.as_ref().map_or(0, |p| p.1);
                let words = if self.context == Some(0) {
                    1
                } else {
                    self.words_for(tokens + shared)
                };
                let p = self.with_prefix(prompt::build(&self.tag, index, words, self.seed));
                openai::body(&options(self.max_tokens(index, None)), &p)
            }
            Prompts::Dataset(c) => {
                let conv = &c[self.conversation_of(index)];
                let turn = &conv.turns[0];
                let p = self.with_prefix(format!("[{}-{index}] {}", self.tag, turn.user));
                openai::body(&options(self.max_tokens(index, Some(turn))), &p)
            }
        }
    }

    /// `--multi-turn`: turn `turn` of conversation `conv`, after the answers the server gave
    /// to the turns before it. The first turn carries the tag of the conversation (`tag`: the
    /// index of its first request), so no cache serves it from another conversation, and each
    /// later turn repeats the history exactly as it was sent, which a prefix cache may serve.
    pub fn turn_body(
        &self,
        index: u64,
        tag: u64,
        conv: usize,
        turn: usize,
        answers: &[String],
    ) -> Vec<u8> {
        let Prompts::Dataset(c) = &self.prompts else {
            return self.body(index);
        };
        let turns = &c[conv].turns;
        let first = self.with_prefix(format!("[{}-{tag}] {}", self.tag, turns[0].user));
        let user = |t: usize| {
            if t == 0 {
                first.as_str()
            } else {
                turns[t].user.as_str()
            }
        };
        let history: Vec<(&str, &str)> =
            (0..turn).map(|t| (user(t), answers[t].as_str())).collect();
        let o = BodyOptions {
            max_tokens: self.max_tokens(index, Some(&turns[turn])),
            ..self.options
        };
        openai::conversation_body(&o, &history, user(turn), true)
    }

    pub fn turns_of(&self, conv: usize) -> usize {
        match &self.prompts {
            Prompts::Dataset(c) => c[conv].turns.len(),
            Prompts::Synthetic { .. } => 1,
        }
    }

    pub fn conversations(&self) -> usize {
        match &self.prompts {
            Prompts::Dataset(c) => c.len(),
            Prompts::Synthetic { .. } => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_parse_draw_and_refuse() {
        assert_eq!(Lengths::parse("128", "--x"), Ok(Lengths::Fixed(128)));
        assert_eq!(
            Lengths::parse("64-512", "--x"),
            Ok(Lengths::Uniform(64, 512))
        );
        assert_eq!(
            Lengths::parse("normal:256,64", "--x"),
            Ok(Lengths::Normal {
                mean: 256.0,
                sd: 64.0
            })
        );
        for bad in ["0", "512-64", "normal:256", "x", "1-", "2000000"] {
            let e = Lengths::parse(bad, "--prompt-tokens").unwrap_err();
            assert!(e.starts_with("--prompt-tokens"), "{bad}: {e}");
        }
        let mut r = Rng::new(5);
        let u = Lengths::Uniform(10, 20);
        let v: Vec<u64> = (0..2000).map(|_| u.draw(&mut r)).collect();
        assert!(v.iter().all(|x| (10..=20).contains(x)));
        assert!(v.contains(&10) && v.contains(&20));
        let n = Lengths::Normal {
            mean: 100.0,
            sd: 10.0,
        };
        let mean = (0..4000).map(|_| n.draw(&mut r) as f64).sum::<f64>() / 4000.0;
        assert!((mean - 100.0).abs() < 1.5, "{mean}");
        assert_eq!(serde_json::to_value(Lengths::Fixed(7)).unwrap(), 7);
        assert_eq!(serde_json::to_value(u).unwrap(), "10-20");
    }

    fn write(name: &str, text: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("tbbench-ds-{}-{name}", std::process::id()));
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn datasets_read_sharegpt_and_chat_entries() {
        let p = write(
            "a.json",
            r#"[{"id": "x", "conversations": [{"from": "system", "value": "be brief"},
                  {"from": "human", "value": "hello there"}, {"from": "gpt", "value": "hi, how can I help"},
                  {"from": "human", "value": "a poem"}]},
                {"conversations": [{"from": "gpt", "value": "no user here"}]},
                {"messages": [{"role": "user", "content": [{"type": "text", "text": "parts"}]}]}]"#,
        );
        let c = read_dataset(&p).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].turns.len(), 2);
        assert_eq!(c[0].turns[0].reply_tokens, Some(7), "5 words");
        assert_eq!(c[0].turns[1].reply_tokens, None);
        assert_eq!(
            reply_tokens("这是一个很长的中文回答，没有空格"),
            11,
            "16 characters"
        );
        assert_eq!(c[1].turns[0].user, "parts");
        let p2 = write(
            "b.jsonl",
            "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}\n\n{\"messages\": []}\n",
        );
        assert_eq!(read_dataset(&p2).unwrap().len(), 1);
        for (name, bad, want) in [
            (
                "c.json",
                "[{\"conversations\": 3}]",
                "expected a JSON array",
            ),
            ("d.json", "[{\"messages\": []}]", "none of its 1 entries"),
            ("e.jsonl", "{}\nnot json\n", "line 2"),
        ] {
            let p = write(name, bad);
            let e = read_dataset(&p).unwrap_err().to_string();
            assert!(e.contains(want), "{bad}: {e}");
            std::fs::remove_file(p).ok();
        }
        assert!(read_dataset(Path::new("/nonexistent/x.json"))
            .unwrap_err()
            .to_string()
            .starts_with("--dataset /nonexistent/x.json"));
        std::fs::remove_file(p).ok();
        std::fs::remove_file(p2).ok();
    }
}
