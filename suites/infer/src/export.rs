//! `--requests-out`: every request's record on a line of its own, JSON Lines or CSV by the
//! file's extension, for tools that want the raw requests (pandas, a spreadsheet). Written
//! whole or not at all, as the result file is.

use crate::figures::Level;
use crate::request::Record;
use anyhow::{bail, Result};
use serde_json::{json, Value};
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Format {
    JsonLines,
    Csv,
}

/// The format a path's extension names, or the one line that says it names none.
pub fn format_of(path: &Path) -> Result<Format> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("jsonl") | Some("ndjson") => Ok(Format::JsonLines),
        Some("csv") => Ok(Format::Csv),
        _ => bail!(
            "--requests-out {}: name a .jsonl or .csv file (the extension picks the format)",
            path.display()
        ),
    }
}

/// The columns, in order: where the level is, then every timestamp and count a request has.
const COLUMNS: &[&str] = &[
    "level",
    "context",
    "index",
    "conversation",
    "turn",
    "start_s",
    "end_s",
    "ok",
    "fail_kind",
    "error",
    "status",
    "connect_ms",
    "ttft_ms",
    "ttft_content_ms",
    "ttft_reasoning_ms",
    "tpot_ms",
    "e2e_ms",
    "decode_tokens_per_s",
    "gap_max_ms",
    "prompt_tokens",
    "output_tokens",
    "token_source",
    "token_chunks",
    "finish_reason",
];

fn row(level: &Level, r: &Record) -> Value {
    json!({
        "level": level.name(),
        "context": level.context,
        "index": r.index,
        "conversation": r.conversation,
        "turn": r.turn,
        "start_s": r.start_s,
        "end_s": r.end_s,
        "ok": r.ok,
        "fail_kind": r.fail_kind.map(|k| k.to_string()),
        "error": r.error,
        "status": r.status,
        "connect_ms": r.connect_ms,
        "ttft_ms": r.ttft_ms,
        "ttft_content_ms": r.ttft_content_ms,
        "ttft_reasoning_ms": r.ttft_reasoning_ms,
        "tpot_ms": r.tpot_ms,
        "e2e_ms": r.e2e_ms,
        "decode_tokens_per_s": r.decode_tokens_per_s,
        "gap_max_ms": r.gap_max_ms,
        "prompt_tokens": r.prompt_tokens,
        "output_tokens": r.output_tokens,
        "token_source": r.token_source,
        "token_chunks": r.token_chunks,
        "finish_reason": r.finish_reason,
    })
}

/// A CSV field: quoted where it holds a comma, quote or line break (RFC 4180); nothing for
/// null.
fn csv_field(v: &Value) -> String {
    let s = match v {
        Value::Null => return String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s
    }
}

pub fn render(levels: &[Level], format: Format) -> String {
    let mut out = String::new();
    if format == Format::Csv {
        out.push_str(&COLUMNS.join(","));
        out.push('\n');
    }
    for l in levels {
        for r in &l.per_request {
            let v = row(l, r);
            match format {
                Format::JsonLines => out.push_str(&v.to_string()),
                Format::Csv => out.push_str(
                    &COLUMNS
                        .iter()
                        .map(|c| csv_field(&v[*c]))
                        .collect::<Vec<_>>()
                        .join(","),
                ),
            }
            out.push('\n');
        }
    }
    out
}

pub fn write(path: &Path, levels: &[Level]) -> Result<()> {
    let text = render(levels, format_of(path)?);
    tbbench_schema::write::write_atomic(path, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::FailKind;

    #[test]
    fn every_request_is_a_line_of_either_format() {
        let ok = Record {
            index: 0,
            ok: true,
            ttft_ms: Some(12.5),
            end_s: 1.5,
            ..Default::default()
        };
        let mut bad = Record {
            index: 1,
            error: Some("500 Internal, \"boom\"".into()),
            ..Default::default()
        };
        bad.fail_kind = Some(FailKind::Http(500));
        let level = Level::new(Some(2), None, vec![ok, bad], vec![]);
        let csv = render(std::slice::from_ref(&level), Format::Csv);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].split(',').count(), COLUMNS.len());
        assert!(
            lines[1].starts_with("c=2,,0,,,0.0,1.5,true,,,,,12.5,"),
            "{}",
            lines[1]
        );
        assert!(
            lines[2].contains(",http-500,\"500 Internal, \"\"boom\"\"\","),
            "{}",
            lines[2]
        );
        let jl = render(std::slice::from_ref(&level), Format::JsonLines);
        let v: Vec<Value> = jl
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(v.len(), 2);
        assert_eq!(v[1]["fail_kind"], "http-500");
        assert_eq!(v[0]["end_s"], 1.5);
        assert!(format_of(Path::new("x.txt")).is_err());
        assert_eq!(format_of(Path::new("x.csv")).unwrap(), Format::Csv);
    }
}
