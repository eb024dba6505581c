//! Reading many result files at once for `report` and `compare`: files and folders in any mix.
//! A file that cannot be used becomes one [`Problem`] line naming it; the others still load.

use crate::{ResultFile, SCHEMA_VERSION};
use std::path::{Path, PathBuf};

/// A result file that loaded, and where it came from.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub path: PathBuf,
    pub result: ResultFile,
}

/// Why one input was left out: shown as `path: message`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Documents tbbench writes that are not run results (report summaries, compare output,
/// exports) carry this field, so a results folder that also holds them loads without noise.
pub const NOT_A_RESULT_MARKER: &str = "tbbench_document";

/// Loads every `*.json` under the given files and folders (folders recursively, in name order).
/// `known_suites` lists the suites a reader understands; others are problems.
pub fn load_paths(paths: &[PathBuf], known_suites: &[&str]) -> (Vec<Loaded>, Vec<Problem>) {
    let mut files = Vec::new();
    let mut problems = Vec::new();
    let mut seen = Seen::default();
    for p in paths {
        if p.is_dir() {
            collect_json(p, &mut files, &mut problems, &mut seen);
        } else if p.exists() {
            if seen.first_time(p) {
                files.push(p.clone());
            }
        } else {
            problems.push(problem(p, "no such file or folder"));
        }
    }
    let mut loaded = Vec::new();
    for f in files {
        match load_one(&f, known_suites) {
            Ok(Some(l)) => loaded.push(l),
            Ok(None) => {}
            Err(message) => problems.push(problem(&f, &message)),
        }
    }
    // Oldest first: history charts and "newest per network" both rely on it.
    loaded.sort_by(|a, b| a.result.started_at.cmp(&b.result.started_at));
    (loaded, problems)
}

fn problem(path: &Path, message: &str) -> Problem {
    Problem {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

/// The largest result file read: far above any run's (a sweep with every sample kept is a few
/// MiB), far below what would exhaust memory.
pub const MAX_RESULT_BYTES: u64 = 64 << 20;

/// Every real folder and file once, however many links and paths lead to it: a link loop
/// (`self -> .`) would otherwise be walked forever, or count one file many times.
#[derive(Default)]
struct Seen(std::collections::HashSet<PathBuf>);

impl Seen {
    fn first_time(&mut self, p: &Path) -> bool {
        match std::fs::canonicalize(p) {
            Ok(real) => self.0.insert(real),
            // Unresolvable (a dangling link): read once as named, its error said then.
            Err(_) => self.0.insert(p.to_path_buf()),
        }
    }
}

fn collect_json(
    dir: &Path,
    files: &mut Vec<PathBuf>,
    problems: &mut Vec<Problem>,
    seen: &mut Seen,
) {
    if !seen.first_time(dir) {
        return;
    }
    let mut entries: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(e) => {
            problems.push(problem(dir, &format!("cannot read folder: {e}")));
            return;
        }
    };
    entries.sort();
    for p in entries {
        let hidden = p
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'));
        if hidden {
            // Temporary files of an atomic write in progress, editor files.
            continue;
        }
        if p.is_dir() {
            collect_json(&p, files, problems, seen);
        } else if p.extension().is_some_and(|e| e == "json") && seen.first_time(&p) {
            files.push(p);
        }
    }
}

/// Ok(None): a tbbench document that is not a run result, skipped quietly.
fn load_one(path: &Path, known_suites: &[&str]) -> Result<Option<Loaded>, String> {
    let text = read_capped(path)?;
    parse_result(&text, known_suites).map(|r| {
        r.map(|result| Loaded {
            path: path.to_path_buf(),
            result,
        })
    })
}

/// A result file's text: a regular file (not a FIFO or a device, which would block or never
/// end) of at most [`MAX_RESULT_BYTES`].
pub fn read_capped(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read: {e}"))?;
    if !meta.is_file() {
        return Err("not a regular file (a pipe, a device or a socket): not read".into());
    }
    if meta.len() > MAX_RESULT_BYTES {
        return Err(format!(
            "{} MiB, larger than any result file ({} MiB at most): not read",
            meta.len() >> 20,
            MAX_RESULT_BYTES >> 20
        ));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_RESULT_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > MAX_RESULT_BYTES {
        return Err(format!(
            "grew past {} MiB while read: not read",
            MAX_RESULT_BYTES >> 20
        ));
    }
    String::from_utf8(bytes).map_err(|_| "not UTF-8 text: not a result file".into())
}

/// The checks behind every problem line, in the order a person would want them.
pub fn parse_result(text: &str, known_suites: &[&str]) -> Result<Option<ResultFile>, String> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        if e.is_eof() {
            format!("truncated JSON (ends at line {})", e.line())
        } else {
            format!("corrupt JSON: {e}")
        }
    })?;
    if value.get(NOT_A_RESULT_MARKER).is_some() {
        return Ok(None);
    }
    let version = match value.get("schema_version") {
        Some(v) => v
            .as_u64()
            .ok_or_else(|| format!("schema_version is {v}, not a number"))?,
        None => return Err("no schema_version: not a tbbench result file".into()),
    };
    if version > SCHEMA_VERSION as u64 {
        return Err(format!(
            "schema_version {version} is newer than this tbbench reads ({SCHEMA_VERSION}): upgrade tbbench"
        ));
    }
    let suite = value
        .get("suite")
        .and_then(|s| s.as_str())
        .ok_or("no suite name: not a tbbench result file")?;
    if !known_suites.contains(&suite) {
        return Err(format!(
            "unknown suite '{suite}' (this tbbench reports {})",
            known_suites.join(", ")
        ));
    }
    let mut value = value;
    cap_strings(&mut value);
    serde_json::from_value(value)
        .map(Some)
        .map_err(|e| format!("does not match the result schema: {e}"))
}

/// The most characters any one string of a result keeps once read: far past any label,
/// command line or warning tbbench writes, and small enough that a file of a few huge
/// strings (a 50 MB label) cannot make a report of gigabytes or a table that wide.
pub const MAX_STRING_CHARS: usize = 2048;

/// Cuts every string in `v` longer than [`MAX_STRING_CHARS`], saying where and how much.
fn cap_strings(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::String(s) => cut(s),
        Value::Array(a) => a.iter_mut().for_each(cap_strings),
        Value::Object(o) => {
            if o.keys().any(|k| k.len() > MAX_STRING_CHARS) {
                *o = std::mem::take(o)
                    .into_iter()
                    .map(|(mut k, v)| {
                        cut(&mut k);
                        (k, v)
                    })
                    .collect();
            }
            o.values_mut().for_each(cap_strings)
        }
        _ => {}
    }
}

/// `s` cut to [`MAX_STRING_CHARS`] characters, saying how many bytes went.
fn cut(s: &mut String) {
    if s.len() <= MAX_STRING_CHARS {
        return;
    }
    if let Some((keep, _)) = s.char_indices().nth(MAX_STRING_CHARS) {
        let gone = s.len() - keep;
        s.truncate(keep);
        s.push_str(&format!("… [{gone} more bytes not read]"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bad_input_gets_its_own_reason() {
        let known = ["link", "hpl"];
        let cases = [
            ("{\"schema_version\": 1, \"suite\": \"li", "truncated JSON"),
            ("{\"schema_version\": 1,, }", "corrupt JSON"),
            ("{\"suite\": \"link\"}", "no schema_version"),
            ("{\"schema_version\": \"1\"}", "not a number"),
            ("{\"schema_version\": 7, \"suite\": \"link\"}", "newer than"),
            (
                "{\"schema_version\": 1, \"suite\": \"disk\"}",
                "unknown suite 'disk'",
            ),
            (
                "{\"schema_version\": 1, \"suite\": \"link\"}",
                "does not match",
            ),
        ];
        for (text, want) in cases {
            let e = parse_result(text, &known).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
        let doc = format!("{{\"{NOT_A_RESULT_MARKER}\": \"report-summary\"}}");
        assert!(parse_result(&doc, &known).unwrap().is_none());
    }

    #[test]
    fn missing_paths_are_problems_and_folders_are_walked() {
        let dir = std::env::temp_dir().join(format!("tbbench-load-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/bad.json"), "{").unwrap();
        std::fs::write(dir.join("notes.txt"), "not json, ignored").unwrap();
        std::fs::write(dir.join(".r.json.tmp-1.json"), "{").unwrap();
        let (loaded, problems) = load_paths(&[dir.clone(), dir.join("gone.json")], &["link"]);
        assert!(loaded.is_empty());
        let mut lines: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
        lines.sort_by_key(|l| l.contains("gone.json"));
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("bad.json") && lines[0].contains("truncated"));
        assert!(lines[1].contains("gone.json") && lines[1].contains("no such file"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A FIFO, a link to /dev/zero and link loops inside a results folder: read at once, each
    /// non-file named, each real folder and file once (`self -> .` and `up -> ..` loops), the
    /// same file given twice on the command line read once.
    #[test]
    fn fifos_devices_and_link_loops_are_named_not_followed_forever() {
        let dir = std::env::temp_dir().join(format!("tbbench-load-odd-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/one.json"), "{").unwrap();
        let fifo = dir.join("pipe.json");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        std::os::unix::fs::symlink("/dev/zero", dir.join("zero.json")).unwrap();
        std::os::unix::fs::symlink(".", dir.join("self")).unwrap();
        std::os::unix::fs::symlink("..", dir.join("sub/up")).unwrap();
        let started = std::time::Instant::now();
        let (_, problems) = load_paths(&[dir.clone(), dir.join("sub/one.json")], &["link"]);
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        let lines: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert_eq!(
            lines.iter().filter(|l| l.contains("one.json")).count(),
            1,
            "{lines:?}"
        );
        for odd in ["pipe.json", "zero.json"] {
            assert!(
                lines
                    .iter()
                    .any(|l| l.contains(odd) && l.contains("not a regular file")),
                "{odd}: {lines:?}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
