//! The byte-level BPE tokenizer GGUF llama-family models carry (`tokenizer.ggml.model` =
//! "gpt2": tokens, merges, special tokens), enough to turn a prompt into ids and ids back into
//! text. Pre-tokenization follows GPT-2's classes (letters, digits, other symbols, spaces, each
//! word taking one leading space); a model's own pre-tokenizer may cut a few words
//! differently, which changes which ids a prompt gets, not how the model runs on them.

use super::gguf::Gguf;
use anyhow::{bail, Result};
use std::collections::HashMap;

pub struct Tokenizer {
    tokens: Vec<String>,
    ids: HashMap<String, u32>,
    ranks: HashMap<(String, String), usize>,
    /// Control tokens (`<|im_start|>`), matched whole in the text before anything else.
    specials: Vec<(String, u32)>,
    byte_to_char: [char; 256],
    char_to_byte: HashMap<char, u8>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
}

/// GPT-2's reversible map from bytes to printable characters.
fn byte_chars() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = (b'!'..=b'~').contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
        map[b as usize] = if printable {
            char::from(b)
        } else {
            let c = char::from_u32(next).expect("below the surrogates");
            next += 1;
            c
        };
    }
    map
}

#[derive(PartialEq, Clone, Copy)]
enum Class {
    Letter,
    Digit,
    Space,
    Other,
}

fn class(c: char) -> Class {
    if c.is_alphabetic() {
        Class::Letter
    } else if c.is_numeric() {
        Class::Digit
    } else if c.is_whitespace() {
        Class::Space
    } else {
        Class::Other
    }
}

/// Words: runs of one class, a single space joining the word after it.
fn pre_tokenize(text: &str) -> Vec<&str> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let start = chars[i].0;
        let mut j = i;
        // A lone space before a non-space run belongs to that run.
        if chars[j].1 == ' ' && j + 1 < chars.len() && class(chars[j + 1].1) != Class::Space {
            j += 1;
        }
        let k = class(chars[j].1);
        while j < chars.len() && class(chars[j].1) == k {
            // Keep the last space of a space run for the word that follows it.
            if k == Class::Space
                && j + 1 < chars.len()
                && chars[j + 1].1 != ' '
                && class(chars[j + 1].1) != Class::Space
                && chars[j].1 == ' '
                && j > i
            {
                break;
            }
            j += 1;
        }
        let end = chars.get(j).map(|c| c.0).unwrap_or(text.len());
        out.push(&text[start..end]);
        i = j;
    }
    out
}

/// An optional token id from the metadata, which must name one of the `n` tokens.
fn special_id(g: &Gguf, key: &str, n: usize) -> Result<Option<u32>> {
    if !g.meta.contains_key(key) {
        return Ok(None);
    }
    // n - 1 <= u32::MAX, checked by the caller.
    Ok(Some(g.count(key, 0, n as u64 - 1)? as u32))
}

impl Tokenizer {
    pub fn from_gguf(g: &Gguf) -> Result<Tokenizer> {
        let model = g.string("tokenizer.ggml.model")?;
        if model != "gpt2" {
            bail!("tokenizer '{model}': the decode reads byte-level BPE (gpt2) tokenizers only");
        }
        let tokens: Vec<String> = g
            .strings("tokenizer.ggml.tokens")?
            .into_iter()
            .map(String::from)
            .collect();
        // Ids are u32 and the model's vocabulary is not empty.
        if tokens.is_empty() || tokens.len() - 1 > u32::MAX as usize {
            bail!(
                "metadata 'tokenizer.ggml.tokens' holds {} tokens (1 to 2^32)",
                tokens.len()
            );
        }
        let merges = g.strings("tokenizer.ggml.merges")?;
        let types: Vec<u64> = match g.meta.get("tokenizer.ggml.token_type") {
            Some(super::gguf::Meta::Array(v)) => v
                .iter()
                .map(|m| match m {
                    super::gguf::Meta::Int(i) => *i as u64,
                    super::gguf::Meta::Uint(u) => *u,
                    _ => 1,
                })
                .collect(),
            _ => vec![],
        };
        let ids = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let ranks = merges
            .iter()
            .enumerate()
            .filter_map(|(i, m)| {
                m.split_once(' ')
                    .map(|(a, b)| ((a.to_string(), b.to_string()), i))
            })
            .collect();
        // Type 3 is "control" in llama.cpp's vocabulary: matched whole, never merged into.
        // Types past the last token (a damaged file) name nothing.
        let mut specials: Vec<(String, u32)> = types
            .iter()
            .zip(&tokens)
            .enumerate()
            .filter(|(_, (t, _))| **t == 3)
            .map(|(i, (_, s))| (s.clone(), i as u32))
            .filter(|(t, _)| !t.is_empty())
            .collect();
        specials.sort_by_key(|s| std::cmp::Reverse(s.0.len()));
        let byte_to_char = byte_chars();
        let char_to_byte = byte_to_char
            .iter()
            .enumerate()
            .map(|(b, c)| (*c, b as u8))
            .collect();
        let bos = special_id(g, "tokenizer.ggml.bos_token_id", tokens.len())?;
        let eos = special_id(g, "tokenizer.ggml.eos_token_id", tokens.len())?;
        Ok(Tokenizer {
            tokens,
            ids,
            ranks,
            specials,
            byte_to_char,
            char_to_byte,
            bos,
            eos,
        })
    }

    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            // The earliest special token in what is left, if any.
            let next = self
                .specials
                .iter()
                .filter_map(|(s, id)| rest.find(s.as_str()).map(|at| (at, s.len(), *id)))
                .min_by_key(|(at, len, _)| (*at, std::cmp::Reverse(*len)));
            let (plain, special) = match next {
                Some((at, len, id)) => (&rest[..at], Some((len, id, at))),
                None => (rest, None),
            };
            for word in pre_tokenize(plain) {
                self.encode_word(word, &mut out);
            }
            match special {
                Some((len, id, at)) => {
                    out.push(id);
                    rest = &rest[at + len..];
                }
                None => rest = "",
            }
        }
        out
    }

    fn encode_word(&self, word: &str, out: &mut Vec<u32>) {
        let mut parts: Vec<String> = word
            .bytes()
            .map(|b| self.byte_to_char[b as usize].to_string())
            .collect();
        loop {
            let best = parts
                .windows(2)
                .enumerate()
                .filter_map(|(i, w)| {
                    self.ranks
                        .get(&(w[0].clone(), w[1].clone()))
                        .map(|r| (*r, i))
                })
                .min();
            let Some((_, i)) = best else { break };
            let merged = format!("{}{}", parts[i], parts[i + 1]);
            parts.splice(i..i + 2, [merged]);
        }
        for p in parts {
            match self.ids.get(&p) {
                Some(id) => out.push(*id),
                // Not in the vocabulary whole: its characters one by one (each a byte).
                None => out.extend(p.chars().filter_map(|c| self.ids.get(&c.to_string()))),
            }
        }
    }

    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for id in ids {
            let Some(t) = self.tokens.get(*id as usize) else {
                continue;
            };
            if self.specials.iter().any(|(_, s)| s == id) {
                bytes.extend(t.as_bytes());
                continue;
            }
            for c in t.chars() {
                match self.char_to_byte.get(&c) {
                    Some(b) => bytes.push(*b),
                    None => bytes.extend(c.to_string().as_bytes()),
                }
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The ChatML turn SmolLM2 and other instruct models expect, when the model has the
    /// `<|im_start|>` token; the text itself otherwise.
    pub fn chat(&self, user: &str) -> String {
        if self.ids.contains_key("<|im_start|>") {
            format!("<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")
        } else {
            user.to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::decode::gguf::{tests::write, Meta};
    use crate::decode::model::tests::tiny_llama_parts;

    /// The tiny llama's tokenizer after `edit`.
    fn tokenizer(edit: impl FnOnce(&mut Vec<(&'static str, Meta)>)) -> Result<Tokenizer> {
        let (mut kvs, t) = tiny_llama_parts(true);
        edit(&mut kvs);
        Tokenizer::from_gguf(&Gguf::parse(write(&kvs, &t)).unwrap())
    }

    fn entry<'a>(kvs: &'a mut [(&'static str, Meta)], key: &str) -> &'a mut Meta {
        &mut kvs.iter_mut().find(|(k, _)| *k == key).unwrap().1
    }

    #[test]
    fn token_types_past_the_last_token_name_nothing() {
        let tok = tokenizer(|kvs| {
            if let Meta::Array(v) = entry(kvs, "tokenizer.ggml.token_type") {
                v.extend([Meta::Int(3), Meta::Int(3)]);
            }
        })
        .unwrap();
        assert_eq!(tok.specials.len(), 2);
        assert_eq!(tok.decode(&tok.encode("Hello")), "Hello");
    }

    #[test]
    fn special_token_ids_outside_the_vocabulary_are_refused() {
        for key in ["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"] {
            let e = tokenizer(|kvs| *entry(kvs, key) = Meta::Uint(104))
                .err()
                .expect("refused");
            assert!(
                format!("{e:#}").contains(&format!("metadata '{key}' (at byte "))
                    && e.to_string().contains("is 104, outside 0..=103"),
                "{e:#}"
            );
        }
    }

    #[test]
    fn empty_or_mistyped_token_lists_are_refused() {
        let e = tokenizer(|kvs| *entry(kvs, "tokenizer.ggml.tokens") = Meta::Array(vec![]));
        assert!(format!("{:#}", e.err().unwrap()).contains("holds 0 tokens"));
        // GGUF arrays hold one type: a list of numbers where strings belong.
        let e = tokenizer(|kvs| {
            *entry(kvs, "tokenizer.ggml.merges") = Meta::Array(vec![Meta::Uint(5), Meta::Uint(7)])
        });
        let e = format!("{:#}", e.err().unwrap());
        assert!(
            e.contains("'tokenizer.ggml.merges' (at byte")
                && e.contains("holds the number 5 at index 0, not a string"),
            "{e}"
        );
    }

    #[test]
    fn ids_decoded_past_the_vocabulary_are_skipped() {
        let tok = tokenizer(|_| {}).unwrap();
        assert_eq!(tok.decode(&[u32::MAX, 7]), tok.decode(&[7]));
    }

    #[test]
    fn words_keep_their_leading_space() {
        assert_eq!(
            pre_tokenize("Hello world, 42!"),
            vec!["Hello", " world", ",", " 42", "!"]
        );
        assert_eq!(pre_tokenize("a  b"), vec!["a", " ", " b"]);
        assert_eq!(pre_tokenize("x\n\ny"), vec!["x", "\n\n", "y"]);
    }

    #[test]
    fn byte_map_is_a_bijection() {
        let m = byte_chars();
        let mut seen: Vec<char> = m.to_vec();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 256);
        assert_eq!(m[b' ' as usize], 'Ġ');
        assert_eq!(m[b'A' as usize], 'A');
    }
}
