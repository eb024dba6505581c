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
    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
    /// Gamma distributed with this shape and mean (Marsaglia and Tsang's method; a shape
    /// below 1 through Gamma(shape + 1) times U^(1/shape)). Shape 1 is the exponential.
    pub fn gamma(&mut self, shape: f64, mean: f64) -> f64 {
        let scale = mean / shape;
        if shape < 1.0 {
            let boost = self.unit().powf(1.0 / shape);
            return self.gamma(shape + 1.0, (shape + 1.0) * scale) * boost;
        }
        let d = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let x = self.normal();
            let v = (1.0 + c * x).powi(3);
            if v <= 0.0 {
                continue;
            }
            let u = self.unit();
            if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
                return d * v * scale;
            }
        }
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

    /// The line through the last two points (tokens = fixed + per_word · words), or through
    /// the last one at a token a word.
    fn line(&self) -> Option<(f64, f64)> {
        let n = self.points.len();
        let &(w1, t1) = self.points.last()?;
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
        Some((t1 as f64 - per_word * w1 as f64, per_word))
    }

    pub fn next_words(&self, target: u64, current: u64) -> u64 {
        let Some((fixed, per_word)) = self.line() else {
            return current;
        };
        let w = ((target as f64 - fixed) / per_word).round();
        w.max(1.0) as u64
    }

    /// The tokens a prompt of `words` words should count, by the points seen so far.
    pub fn tokens_for(&self, words: u64) -> Option<u64> {
        let (fixed, per_word) = self.line()?;
        Some((fixed + per_word * words as f64).round().max(1.0) as u64)
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

    /// Gamma gaps keep the mean and have the coefficient of variation 1/sqrt(shape).
    #[test]
    fn gamma_gaps_have_the_asked_mean_and_spread() {
        for shape in [0.25, 1.0, 4.0] {
            let mut r = Rng::new(3);
            let n = 40_000;
            let v: Vec<f64> = (0..n).map(|_| r.gamma(shape, 0.5)).collect();
            let mean = v.iter().sum::<f64>() / n as f64;
            let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
            let cv = var.sqrt() / mean;
            assert!((mean - 0.5).abs() < 0.03, "shape {shape}: mean {mean}");
            assert!(
                (cv - 1.0 / shape.sqrt()).abs() < 0.08 / shape.sqrt(),
                "shape {shape}: cv {cv}"
            );
        }
    }
}
