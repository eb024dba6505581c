//! Prompts of about N tokens that no two requests share a prefix of, so no prefix cache
//! serves any of them: a run-and-request tag first, then words drawn at random from common
//! short English words (each one token with its leading space in the BPE vocabularies of
//! Llama, Qwen, Mistral and GPT). tbbench has no tokenizer: the word count is tuned during
//! warm-up from the `usage.prompt_tokens` the server reports.

/// A small, fast, seedable generator (splitmix64): the prompts and the Poisson arrivals of
/// one `--seed` are the same on every run, and no dependency is needed for it.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in (0, 1]: never 0, so `-ln(u)` is finite.
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }
    /// Exponentially distributed with the given mean: the gap between Poisson arrivals.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -self.unit().ln() * mean
    }
}

const WORDS: &[&str] = &[
    "the", "and", "time", "water", "light", "house", "river", "stone", "green", "small", "great",
    "old", "new", "long", "day", "night", "road", "town", "city", "field", "tree", "bird", "fish",
    "horse", "dog", "cat", "king", "queen", "ship", "sea", "wind", "fire", "rain", "snow", "sun",
    "moon", "star", "hill", "door", "wall", "window", "table", "chair", "book", "paper", "letter",
    "word", "song", "music", "voice", "hand", "head", "face", "eye", "heart", "mind", "story",
    "friend", "family", "child", "mother", "father", "brother", "sister", "man", "woman", "boy",
    "girl", "people", "world", "country", "state", "school", "work", "money", "market", "game",
    "team", "player", "ball", "garden", "flower", "apple", "bread", "milk", "coffee", "tea",
    "dinner", "morning", "evening", "summer", "winter", "spring", "year", "week", "hour", "minute",
    "life", "death", "war", "peace", "power", "law", "order", "plan", "idea", "answer", "question",
    "problem", "reason", "change", "place", "point", "line", "side", "end", "part", "number",
    "group", "car", "train", "plane", "boat", "bridge", "tower", "church", "castle", "forest",
    "island", "mountain", "lake", "valley", "desert", "north", "south", "east", "west", "red",
    "blue", "black", "white", "gold", "silver", "iron", "wood", "glass", "fast", "slow", "hot",
    "cold", "dark", "bright", "quiet", "loud", "happy", "sad", "young", "strong", "soft", "hard",
    "open", "close", "walk", "run", "jump", "swim", "sing", "read", "write", "speak", "listen",
    "watch", "build", "break", "carry", "hold", "give", "take", "find", "lose", "keep", "send",
    "bring", "leave", "stay", "turn", "move", "stand", "sit", "sleep", "dream", "wake", "grow",
    "fall", "rise", "begin", "start", "stop", "wait", "hope",
];

/// Words that make a prompt of about `target` tokens before any measurement: a guess that
/// leaves room for the chat template and the instruction.
pub fn initial_words(target: u64) -> u64 {
    target.saturating_sub(24).max(1)
}

/// The prompt of request `index` in run `run_tag`: unique from its first token on.
pub fn build(run_tag: &str, index: u64, words: u64, seed: u64) -> String {
    let mut rng = Rng::new(seed ^ index.wrapping_mul(0xA24B_AED4_963E_E407));
    let mut s = String::with_capacity(words as usize * 7 + 96);
    s.push_str(&format!(
        "[{run_tag}-{index}] Write a long story that uses these words:"
    ));
    for _ in 0..words {
        s.push(' ');
        s.push_str(WORDS[(rng.next_u64() % WORDS.len() as u64) as usize]);
    }
    s.push('.');
    s
}

/// Tunes the word count so the server's prompt token count meets the target: a line through
/// the (words, tokens) points seen so far, or a step of the difference while there is one.
#[derive(Debug, Default, Clone)]
pub struct Calibration {
    points: Vec<(u64, u64)>,
}

impl Calibration {
    pub fn observe(&mut self, words: u64, tokens: u64) {
        self.points.push((words, tokens));
    }

    pub fn next_words(&self, target: u64, current: u64) -> u64 {
        let n = self.points.len();
        let Some(&(w1, t1)) = self.points.last() else {
            return current;
        };
        let per_word = match n {
            0 | 1 => 1.0,
            _ => {
                let (w0, t0) = self.points[n - 2];
                if w1 != w0 {
                    ((t1 as f64 - t0 as f64) / (w1 as f64 - w0 as f64)).clamp(0.25, 4.0)
                } else {
                    1.0
                }
            }
        };
        let fixed = t1 as f64 - per_word * w1 as f64;
        let w = ((target as f64 - fixed) / per_word).round();
        w.max(1.0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_differ_from_the_first_token() {
        let a = build("r1", 0, 50, 7);
        let b = build("r1", 1, 50, 7);
        assert_ne!(a, b);
        assert_ne!(a.split(' ').next(), b.split(' ').next());
        assert_eq!(a, build("r1", 0, 50, 7), "one seed, one prompt");
        assert_eq!(a.matches(' ').count(), 8 + 50);
    }

    #[test]
    fn calibration_meets_the_target() {
        // A server whose tokens = 30 + 1.3 per word.
        let tokens = |w: u64| 30 + (w as f64 * 1.3).round() as u64;
        let mut c = Calibration::default();
        let mut w = initial_words(512);
        for _ in 0..3 {
            c.observe(w, tokens(w));
            w = c.next_words(512, w);
        }
        assert!((tokens(w) as i64 - 512).abs() <= 2, "{w} -> {}", tokens(w));
    }

    #[test]
    fn exponential_gaps_have_the_asked_mean() {
        let mut r = Rng::new(1);
        let n = 20_000;
        let mean = (0..n).map(|_| r.exponential(0.5)).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.02, "{mean}");
    }
}
