//! Writing result files so that a reader never sees half of one: write a temporary file in the
//! same folder, flush it to disk, then rename it over the final name.

use crate::ResultFile;
use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

fn folder_of(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Refuses a path that names something other than a regular file (a device, a folder, a
/// pipe, a socket): output replaces what is there, and only a file may be replaced.
fn refuse_non_file(path: &Path) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => anyhow::bail!(
            "{} exists and is not a regular file ({}): refusing to replace it",
            path.display(),
            kind_of(&m)
        ),
        _ => Ok(()),
    }
}

fn kind_of(m: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = m.file_type();
    if t.is_dir() {
        "a folder"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else if t.is_fifo() {
        "a pipe"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

/// Checks, before a run spends its time, that its output can be written at `path`: the path
/// is a regular file or nothing, and its folder exists (or can be made) and takes a new file.
pub fn check_writable(path: &Path) -> Result<()> {
    refuse_non_file(path)?;
    path.file_name()
        .with_context(|| format!("{} is not a file name", path.display()))?;
    check_folder_writable(folder_of(path))
}

/// Checks that `dir` exists (or can be made) and takes a new file, by making and removing one.
pub fn check_folder_writable(dir: &Path) -> Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => {
            anyhow::bail!("{} is not a folder ({})", dir.display(), kind_of(&m));
        }
        Ok(_) => {}
        // One missing folder is made (`--out results/r.json` on a first run); a path whose
        // parent is missing too is more likely mistyped than meant.
        Err(_) => {
            let parent = folder_of(dir);
            if parent != dir && !parent.is_dir() {
                anyhow::bail!(
                    "folder {} does not exist, nor {}: check the path (tbbench makes one missing folder, not a tree)",
                    dir.display(),
                    parent.display()
                );
            }
        }
    }
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create folder {}", dir.display()))?;
    let probe = dir.join(format!(".tbbench-probe-{}", std::process::id()));
    std::fs::File::create(&probe)
        .with_context(|| format!("cannot write into folder {}", dir.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    refuse_non_file(path)?;
    let dir = folder_of(path);
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create folder {}", dir.display()))?;
    let name = path
        .file_name()
        .with_context(|| format!("{} is not a file name", path.display()))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| -> Result<()> {
        let mut f = std::fs::File::create(&tmp)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
            .with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))?;
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    // Reports, summaries and exports come through here too: named by their path only.
    result.with_context(|| format!("cannot write {}", path.display()))
}

/// Writes `bytes` under a name the run chose itself (a time stamp: [`default_path`], or one
/// inside an `--over` folder), never over a file already there: two runs started in the same
/// second would otherwise keep only the last. Takes the first free name of `path`, `path`
/// with `-2`, `-3`, ... before its extension, and returns it. A hard link of the written
/// temporary file claims the name, so two writers cannot both take one.
pub fn write_fresh(path: &Path, bytes: &[u8]) -> Result<PathBuf> {
    let dir = folder_of(path);
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create folder {}", dir.display()))?;
    let stem = path
        .file_stem()
        .with_context(|| format!("{} is not a file name", path.display()))?
        .to_string_lossy()
        .into_owned();
    let ext = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    let tmp = dir.join(format!(".{stem}{ext}.tmp-{}", std::process::id()));
    let result = (|| -> Result<PathBuf> {
        let mut f = std::fs::File::create(&tmp)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        for n in 1..10_000u32 {
            let candidate = if n == 1 {
                path.to_path_buf()
            } else {
                dir.join(format!("{stem}-{n}{ext}"))
            };
            match std::fs::hard_link(&tmp, &candidate) {
                Ok(()) => return Ok(candidate),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                // A file system without hard links: the name is checked, then renamed onto
                // (a writer in between could still win; no such file system holds results
                // here in practice).
                Err(_) if !candidate.exists() => {
                    std::fs::rename(&tmp, &candidate).with_context(|| {
                        format!("cannot rename {} to {}", tmp.display(), candidate.display())
                    })?;
                    return Ok(candidate);
                }
                Err(_) => continue,
            }
        }
        anyhow::bail!("no free name beside {} (9999 taken)", path.display())
    })();
    let _ = std::fs::remove_file(&tmp);
    result.with_context(|| format!("cannot write result file {}", path.display()))
}

/// Refuses two output flags that name one file (`--out x --json x`): the second write would
/// replace the first without a word. Paths are compared as the same file where both exist,
/// else by their absolute spelling.
pub fn refuse_same_output(a: (&str, &Path), b: (&str, &Path)) -> Result<()> {
    let absolute = |p: &Path| -> PathBuf {
        let full = if p.is_absolute() {
            p.to_path_buf()
        } else {
            std::env::current_dir().unwrap_or_default().join(p)
        };
        // The folder resolved (links, `..`) where it exists, the name kept as written.
        match (
            full.parent().and_then(|d| d.canonicalize().ok()),
            full.file_name(),
        ) {
            (Some(d), Some(n)) => d.join(n),
            _ => full,
        }
    };
    let same = {
        use std::os::unix::fs::MetadataExt;
        match (std::fs::metadata(a.1), std::fs::metadata(b.1)) {
            (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
            _ => absolute(a.1) == absolute(b.1),
        }
    };
    if same {
        anyhow::bail!(
            "{} and {} both name {}: give each its own file",
            a.0,
            b.0,
            b.1.display()
        );
    }
    Ok(())
}

/// Writes a run's result where `out` says, or else under its time-stamped default name
/// ([`default_path`]) never over another run's file ([`write_fresh`]); returns where it went.
pub fn write_result_out(
    out: Option<&Path>,
    suite: &str,
    started: time::OffsetDateTime,
    result: &ResultFile,
) -> Result<PathBuf> {
    match out {
        Some(p) => {
            write_result(p, result)?;
            Ok(p.to_path_buf())
        }
        None => {
            let mut bytes = serde_json::to_vec_pretty(result)?;
            bytes.push(b'\n');
            write_fresh(&default_path(suite, started), &bytes)
        }
    }
}

pub fn write_result(path: &Path, result: &ResultFile) -> Result<()> {
    let mut bytes = serde_json::to_vec_pretty(result)?;
    bytes.push(b'\n');
    write_atomic(path, &bytes).context("cannot write the result file")
}

/// Reads a result file, refusing ones from a newer tbbench with one clear line.
pub fn read_result(path: &Path) -> Result<ResultFile> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let value: serde_json::Value = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not valid JSON (truncated or corrupt?)",
            path.display()
        )
    })?;
    let version = value
        .get("schema_version")
        .and_then(|v| v.as_u64())
        .with_context(|| {
            format!(
                "{} has no schema_version: not a tbbench result file",
                path.display()
            )
        })?;
    if version > crate::SCHEMA_VERSION as u64 {
        anyhow::bail!(
            "{} has schema_version {version}, newer than this tbbench reads ({}): upgrade tbbench",
            path.display(),
            crate::SCHEMA_VERSION
        );
    }
    serde_json::from_value(value)
        .with_context(|| format!("{} does not match the result schema", path.display()))
}

/// `results/<suite>-<UTC timestamp>.json`, the default place for a run's file.
pub fn default_path(suite: &str, started: time::OffsetDateTime) -> PathBuf {
    let f = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    let stamp = started.format(&f).unwrap_or_else(|_| "unknown".into());
    PathBuf::from("results").join(format!("{suite}-{stamp}.json"))
}

pub fn rfc3339(t: time::OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_names_never_replace_a_file_and_same_outputs_are_refused() {
        let dir = std::env::temp_dir().join(format!("tbbench-fresh-{}", std::process::id()));
        let path = dir.join("link-20261207T000000Z.json");
        let names: Vec<PathBuf> = (0..3)
            .map(|i| write_fresh(&path, format!("{i}").as_bytes()).unwrap())
            .collect();
        assert_eq!(names[0], path);
        assert_eq!(names[1], dir.join("link-20261207T000000Z-2.json"));
        assert_eq!(names[2], dir.join("link-20261207T000000Z-3.json"));
        for (i, n) in names.iter().enumerate() {
            assert_eq!(std::fs::read_to_string(n).unwrap(), format!("{i}"));
        }
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            3,
            "no temporary left"
        );
        let x = dir.join("x.json");
        let e = refuse_same_output(
            ("--json", &x),
            (
                "--out",
                &dir.join("../")
                    .join(dir.file_name().unwrap())
                    .join("x.json"),
            ),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("--json and --out both name"), "{e}");
        assert!(refuse_same_output(("--json", &x), ("--out", &dir.join("y.json"))).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn one_missing_folder_is_made_but_not_a_mistyped_tree() {
        let dir = std::env::temp_dir().join(format!("tbbench-tree-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        assert!(check_writable(&dir.join("new/r.json")).is_ok());
        let e = check_writable(&dir.join("typo/deeper/r.json"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not exist, nor"), "{e}");
        assert!(!dir.join("typo").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn atomic_write_leaves_no_temp_file_and_replaces_old_content() {
        let dir = std::env::temp_dir().join(format!("tbbench-write-{}", std::process::id()));
        let path = dir.join("sub/r.json");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(dir.join("sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unreadable_results_get_one_line_naming_the_file() {
        let dir = std::env::temp_dir().join(format!("tbbench-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("cut.json");
        std::fs::write(&p, "{\"schema_version\": 1, \"suite\": \"li").unwrap();
        let e = format!("{:#}", read_result(&p).unwrap_err());
        assert!(
            e.contains("cut.json") && e.contains("not valid JSON"),
            "{e}"
        );
        std::fs::write(&p, "{\"schema_version\": 99}").unwrap();
        let e = format!("{:#}", read_result(&p).unwrap_err());
        assert!(e.contains("newer"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn default_path_has_suite_and_utc_stamp() {
        let t = time::macros::datetime!(2026-12-02 13:05:01 UTC);
        assert_eq!(
            default_path("link", t),
            PathBuf::from("results/link-20261202T130501Z.json")
        );
    }
}
