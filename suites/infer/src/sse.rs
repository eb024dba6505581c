//! Server-sent events, decoded as the WHATWG HTML standard's "event stream interpretation"
//! says: UTF-8 with an optional leading BOM, lines ended by CRLF, LF or CR, `field: value`
//! lines, comments, multi-line data, an event dispatched at each blank line, and a half event
//! at the end of the stream dropped.
//!
//! Bytes are fed as they come off the socket, so a read may end anywhere: inside a UTF-8
//! sequence, between the CR and LF of one line end, inside a field name. Lines are cut on
//! bytes (every line end is ASCII, which never occurs inside a multi-byte sequence) and only a
//! whole line is decoded, which makes a code point split across reads whole again.

/// What a stream yields: events at blank lines, and comments as they arrive (servers put
/// their own statistics in comments, e.g. exo's `: generation_stats`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseItem {
    Event(Event),
    Comment(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The `event:` field, "message" when none was given.
    pub event_type: String,
    /// The `data:` lines joined with LF.
    pub data: String,
    /// The last event ID seen so far (it persists across events, as the spec says).
    pub last_event_id: String,
}

/// The longest line the decoder keeps: an OpenAI chunk is a few KiB; a line that never ends
/// would otherwise grow until memory runs out.
pub const MAX_LINE_BYTES: usize = 1 << 20;

#[derive(Debug, Default)]
pub struct SseDecoder {
    line: Vec<u8>,
    /// A line grew past [`MAX_LINE_BYTES`]: the rest of it was not kept.
    overflowed: bool,
    /// The previous feed ended on CR: an LF opening the next one belongs to that line end.
    after_cr: bool,
    /// Still at the very start of the stream, where one BOM is dropped.
    at_start: bool,
    data: String,
    event_type: String,
    last_event_id: String,
    /// Any field seen since the last dispatch: a stream that ends here cut an event short.
    pending: bool,
    /// The reconnection time a `retry:` field asked for; kept because the spec defines it,
    /// though tbbench never reconnects (a re-sent request would be a different measurement).
    pub retry_ms: Option<u64>,
}

impl SseDecoder {
    pub fn new() -> Self {
        SseDecoder {
            at_start: true,
            ..Default::default()
        }
    }

    /// Feeds bytes as read; complete items are appended to `out`.
    pub fn feed(&mut self, mut bytes: &[u8], out: &mut Vec<SseItem>) {
        if self.after_cr {
            if let Some(rest) = bytes.strip_prefix(b"\n") {
                bytes = rest;
                self.after_cr = false;
            } else if !bytes.is_empty() {
                self.after_cr = false;
            }
        }
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i..].iter().position(|&b| b == b'\n' || b == b'\r') {
                None => {
                    let room = MAX_LINE_BYTES.saturating_sub(self.line.len());
                    let rest = &bytes[i..];
                    if rest.len() > room {
                        self.overflowed = true;
                    }
                    self.line.extend_from_slice(&rest[..rest.len().min(room)]);
                    break;
                }
                Some(p) => {
                    self.line.extend_from_slice(&bytes[i..i + p]);
                    let end = i + p;
                    i = end + 1;
                    if bytes[end] == b'\r' {
                        if i < bytes.len() {
                            if bytes[i] == b'\n' {
                                i += 1;
                            }
                        } else {
                            self.after_cr = true;
                        }
                    }
                    let line = std::mem::take(&mut self.line);
                    self.process_line(&line, out);
                }
            }
        }
    }

    /// Whether a line ran past [`MAX_LINE_BYTES`] (the caller ends the stream as bad).
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// The stream ended. Returns true when it cut an event short (fields with no blank line
    /// after them, or a last line without its end), which the spec drops unseen.
    pub fn finish(&mut self) -> bool {
        let cut = self.pending || !self.line.is_empty();
        self.line.clear();
        self.data.clear();
        self.event_type.clear();
        self.pending = false;
        cut
    }

    fn process_line(&mut self, raw: &[u8], out: &mut Vec<SseItem>) {
        let mut raw = raw;
        if self.at_start {
            self.at_start = false;
            raw = raw.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(raw);
        }
        let line = String::from_utf8_lossy(raw);
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if let Some(comment) = line.strip_prefix(':') {
            out.push(SseItem::Comment(
                comment.strip_prefix(' ').unwrap_or(comment).to_string(),
            ));
            return;
        }
        let (field, value) = match line.find(':') {
            Some(c) => {
                let v = &line[c + 1..];
                (&line[..c], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (&line[..], ""),
        };
        match field {
            "event" => {
                self.event_type = value.to_string();
                self.pending = true;
            }
            "data" => {
                self.data.push_str(value);
                self.data.push('\n');
                self.pending = true;
            }
            "id" => {
                if !value.contains('\0') {
                    self.last_event_id = value.to_string();
                }
                self.pending = true;
            }
            "retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                self.retry_ms = value.parse().ok();
            }
            // The spec ignores unknown fields.
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseItem>) {
        self.pending = false;
        let event_type = std::mem::take(&mut self.event_type);
        if self.data.is_empty() {
            return;
        }
        let mut data = std::mem::take(&mut self.data);
        data.pop();
        out.push(SseItem::Event(Event {
            event_type: if event_type.is_empty() {
                "message".into()
            } else {
                event_type
            },
            data,
            last_event_id: self.last_event_id.clone(),
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_in_pieces(input: &[u8], piece: usize) -> (Vec<SseItem>, bool) {
        let mut d = SseDecoder::new();
        let mut out = Vec::new();
        for chunk in input.chunks(piece.max(1)) {
            d.feed(chunk, &mut out);
        }
        let cut = d.finish();
        (out, cut)
    }

    fn data_of(items: &[SseItem]) -> Vec<String> {
        items
            .iter()
            .filter_map(|i| match i {
                SseItem::Event(e) => Some(e.data.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn every_split_of_the_input_decodes_the_same() {
        let input = "data: {\"t\":\"héllo 世界 🦀\"}\r\n\r\n: keep-alive\n\ndata: a\rdata: b\r\rdata: [DONE]\n\n";
        let (whole, cut) = decode_in_pieces(input.as_bytes(), usize::MAX);
        assert!(!cut);
        assert_eq!(
            data_of(&whole),
            vec!["{\"t\":\"héllo 世界 🦀\"}", "a\nb", "[DONE]"]
        );
        assert!(whole.contains(&SseItem::Comment("keep-alive".into())));
        for piece in 1..input.len() {
            let (items, cut) = decode_in_pieces(input.as_bytes(), piece);
            assert_eq!(items, whole, "split every {piece} bytes");
            assert!(!cut);
        }
    }

    #[test]
    fn code_point_split_across_reads_is_whole_again() {
        let crab = "🦀".as_bytes();
        let mut d = SseDecoder::new();
        let mut out = Vec::new();
        d.feed(b"data: ", &mut out);
        d.feed(&crab[..1], &mut out);
        d.feed(&crab[1..3], &mut out);
        d.feed(&crab[3..], &mut out);
        d.feed(b"\n\n", &mut out);
        assert_eq!(data_of(&out), vec!["🦀"]);
    }

    #[test]
    fn crlf_split_between_reads_is_one_line_end() {
        // A CR at the end of one read and LF at the start of the next must not make an
        // empty line (which would dispatch early and split the data).
        let mut d = SseDecoder::new();
        let mut out = Vec::new();
        d.feed(b"data: one\r", &mut out);
        d.feed(b"\ndata: two\r", &mut out);
        d.feed(b"\n\r", &mut out);
        d.feed(b"\n", &mut out);
        assert_eq!(data_of(&out), vec!["one\ntwo"]);
    }

    #[test]
    fn fields_follow_the_spec() {
        let input = b"\xEF\xBB\xBFevent: error\nid: 7\ndata:no-space\ndata:  two spaces\nretry: 1500\nunknown: x\ndata\n\nid\ndata: x\n\n";
        let (items, _) = decode_in_pieces(input, usize::MAX);
        let SseItem::Event(first) = &items[0] else {
            panic!("{items:?}")
        };
        assert_eq!(first.event_type, "error");
        assert_eq!(first.last_event_id, "7");
        // One leading space is dropped, not two; a bare `data` line adds an empty line.
        assert_eq!(first.data, "no-space\n two spaces\n");
        let SseItem::Event(second) = &items[1] else {
            panic!("{items:?}")
        };
        assert_eq!(
            second.event_type, "message",
            "the type resets after dispatch"
        );
        assert_eq!(second.last_event_id, "", "a bare id line clears the id");
    }

    #[test]
    fn blank_line_without_data_dispatches_nothing() {
        let (items, _) = decode_in_pieces(b"event: ping\n\n\n\ndata: x\n\n", 3);
        assert_eq!(data_of(&items), vec!["x"]);
        let SseItem::Event(e) = &items[0] else {
            panic!()
        };
        assert_eq!(e.event_type, "message");
    }

    #[test]
    fn an_event_cut_by_the_end_of_stream_is_dropped_and_reported() {
        let (items, cut) = decode_in_pieces(b"data: whole\n\ndata: half", 5);
        assert_eq!(data_of(&items), vec!["whole"]);
        assert!(cut);
        let (items, cut) = decode_in_pieces(b"data: whole\n\ndata: no blank line\n", 5);
        assert_eq!(data_of(&items), vec!["whole"]);
        assert!(cut);
    }

    #[test]
    fn invalid_utf8_becomes_replacement_characters() {
        let (items, _) = decode_in_pieces(b"data: a\xFFb\n\n", 1);
        assert_eq!(data_of(&items), vec!["a\u{FFFD}b"]);
    }

    #[test]
    fn a_line_that_never_ends_is_capped_and_flagged() {
        let mut d = SseDecoder::new();
        let mut out = Vec::new();
        let piece = vec![b'a'; 256 << 10];
        for _ in 0..8 {
            d.feed(&piece, &mut out);
        }
        assert!(d.overflowed());
        assert!(d.line.len() <= MAX_LINE_BYTES);
        let mut fine = SseDecoder::new();
        fine.feed(b"data: {}\n\n", &mut out);
        assert!(!fine.overflowed());
    }

    #[test]
    fn comments_keep_their_text() {
        let (items, _) = decode_in_pieces(
            b": generation_stats {\"generation_tokens\": 12}\r\n:\r\n",
            4,
        );
        assert_eq!(
            items,
            vec![
                SseItem::Comment("generation_stats {\"generation_tokens\": 12}".into()),
                SseItem::Comment(String::new())
            ]
        );
    }
}
