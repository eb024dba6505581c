//! What `tbbench report` and `tbbench compare` do with their options: load, build, write
//! (atomically), print, and choose the exit code. The binary's cli.rs only parses flags.

use crate::compare::{aggregate, compare, text_table};
use crate::export::{export, Format};
use crate::report::{build, load_checked, metrics_of};
use crate::write::{rfc3339, write_atomic};
use anyhow::{bail, Result};
use std::path::PathBuf;

pub struct ReportOptions {
    pub inputs: Vec<PathBuf>,
    pub html: PathBuf,
    pub json: Option<PathBuf>,
    pub strict: bool,
    pub threshold_pct: f64,
    pub exports: Vec<Format>,
    pub export_dir: PathBuf,
    /// "tbbench 0.1.0 (commit)": written into the page's footer.
    pub generator: String,
}

fn now() -> String {
    rfc3339(time::OffsetDateTime::now_utc())
}

fn json_bytes(v: &serde_json::Value) -> Result<Vec<u8>> {
    let mut b = serde_json::to_vec_pretty(v)?;
    b.push(b'\n');
    Ok(b)
}

/// Returns the exit code: 0, or 1 with --strict when an input was left out.
pub fn run_report(o: &ReportOptions) -> Result<i32> {
    crate::views::require_installed()?;
    crate::write::check_writable(&o.html)?;
    if let Some(j) = &o.json {
        crate::write::check_writable(j)?;
        tbbench_schema::write::refuse_same_output(("-o", &o.html), ("--json", j))?;
    }
    if !o.exports.is_empty() {
        crate::write::check_folder_writable(&o.export_dir)?;
    }
    let report = build(&o.inputs, o.threshold_pct, &o.generator, &now());
    for p in &report.problems {
        eprintln!("tbbench: report: left out {p}");
    }
    if o.strict && !report.problems.is_empty() {
        bail!(
            "--strict: {} input(s) could not be used; nothing written",
            report.problems.len()
        );
    }
    if report.loaded == 0 {
        bail!(
            "no usable result files in {}",
            o.inputs
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    write_atomic(&o.html, report.html.as_bytes())?;
    println!("report: {} ({} runs)", o.html.display(), report.loaded);
    if let Some(j) = &o.json {
        write_atomic(j, &json_bytes(&report.summary)?)?;
        println!("summary: {}", j.display());
    }
    if !o.exports.is_empty() {
        let (loaded, _) = load_checked(&o.inputs);
        let figures = aggregate(loaded.iter().map(metrics_of).collect());
        for f in &o.exports {
            for (name, doc) in export(*f, &figures) {
                let path = o.export_dir.join(name);
                write_atomic(&path, &json_bytes(&doc)?)?;
                println!("export: {}", path.display());
            }
        }
    }
    Ok(0)
}

pub struct CompareOptions {
    pub base: PathBuf,
    pub new: PathBuf,
    pub threshold_pct: f64,
    pub json: Option<PathBuf>,
    pub strict: bool,
}

/// Exit code: 0 no regression, 1 at least one, 2 when nothing could be compared.
pub fn run_compare(o: &CompareOptions) -> Result<i32> {
    crate::views::require_installed()?;
    if let Some(j) = &o.json {
        crate::write::check_writable(j)?;
    }
    let (base, pb) = load_checked(std::slice::from_ref(&o.base));
    let (new, pn) = load_checked(std::slice::from_ref(&o.new));
    for p in pb.iter().chain(&pn) {
        eprintln!("tbbench: compare: left out {p}");
    }
    if o.strict && !(pb.is_empty() && pn.is_empty()) {
        bail!("--strict: an input could not be used");
    }
    if base.is_empty() || new.is_empty() {
        let which = if base.is_empty() { &o.base } else { &o.new };
        bail!("no usable result files in {}", which.display());
    }
    for note in tcp_setup_changes(&base, &new)
        .into_iter()
        .chain(suite_setup_changes(&base, &new))
    {
        eprintln!("tbbench: compare: note: {note}");
    }
    let c = compare(&base, &new, &metrics_of, o.threshold_pct);
    print!("{}", text_table(&c));
    if let Some(j) = &o.json {
        let mut v = serde_json::to_value(&c)?;
        v[crate::load::NOT_A_RESULT_MARKER] = "comparison".into();
        v["regressions"] = c.regressions().into();
        write_atomic(j, &json_bytes(&v)?)?;
    }
    if c.comparable() == 0 {
        eprintln!(
            "tbbench: compare: nothing to compare: {} and {} share no figure (different suites, networks or sizes?)",
            o.base.display(),
            o.new.display()
        );
        return Ok(2);
    }
    Ok(if c.regressions() > 0 { 1 } else { 0 })
}

/// Networks whose TCP ran another congestion control or another number of connections per
/// peer in the new runs than in the baseline (where both sides recorded it): TCP's figures
/// follow those as much as the code (one connection over loopback under bbr against cubic:
/// 57-68 against 79-86 Gbit/s; two connections under bbr 41-42),
/// so a change there is named beside any verdict it causes.
fn tcp_setup_changes(base: &[crate::load::Loaded], new: &[crate::load::Loaded]) -> Vec<String> {
    use std::collections::{BTreeMap, BTreeSet};
    type Seen = BTreeMap<String, (BTreeSet<String>, BTreeSet<usize>)>;
    let seen = |side: &[crate::load::Loaded]| {
        let mut by_net = Seen::new();
        for l in side {
            let n = &l.result.network;
            let e = by_net.entry(crate::views::network_label(n)).or_default();
            e.0.extend(n.congestion.clone());
            e.1.extend(n.streams);
        }
        by_net
    };
    fn list<T: std::fmt::Display>(s: &BTreeSet<T>) -> String {
        s.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join("/")
    }
    fn differs<T: Ord>(a: &BTreeSet<T>, b: &BTreeSet<T>) -> bool {
        !a.is_empty() && !b.is_empty() && a != b
    }
    let (b, n) = (seen(base), seen(new));
    b.iter()
        .filter_map(|(net, (cc0, k0))| {
            let (cc1, k1) = n.get(net)?;
            let mut parts = Vec::new();
            if differs(cc0, cc1) {
                parts.push(format!("congestion control {} -> {}", list(cc0), list(cc1)));
            }
            if differs(k0, k1) {
                parts.push(format!("connections per peer {} -> {}", list(k0), list(k1)));
            }
            (!parts.is_empty()).then(|| {
                format!(
                    "{net}: {} from the baseline to the new runs; TCP's figures follow these as much as the code",
                    parts.join(", ")
                )
            })
        })
        .collect()
}

/// What the suites' views name as the runs' own choices (`SuiteView::setup`) where, on one
/// network, the new runs chose otherwise than the baseline (each side's values, where both
/// recorded any): a verdict may follow such a choice as much as the code.
fn suite_setup_changes(base: &[crate::load::Loaded], new: &[crate::load::Loaded]) -> Vec<String> {
    use std::collections::{BTreeMap, BTreeSet};
    // (suite, network, what) -> the values the runs recorded.
    type Seen = BTreeMap<(String, String, String), BTreeSet<String>>;
    let seen = |side: &[crate::load::Loaded]| {
        let mut by_what = Seen::new();
        for l in side {
            let Some(view) = crate::views::view_for(&l.result.suite) else {
                continue;
            };
            let net = crate::views::network_label(&l.result.network);
            for (what, value) in view.setup(&l.result) {
                by_what
                    .entry((l.result.suite.clone(), net.clone(), what))
                    .or_default()
                    .insert(value);
            }
        }
        by_what
    };
    let list = |s: &BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>().join("/");
    let (b, n) = (seen(base), seen(new));
    b.iter()
        .filter_map(|(key, v0)| {
            let v1 = n.get(key)?;
            let (suite, net, what) = key;
            (v0 != v1).then(|| {
                format!(
                    "{suite} on {net}: {what} {} -> {} from the baseline to the new runs; {suite}'s figures follow it as much as the code",
                    list(v0),
                    list(v1)
                )
            })
        })
        .collect()
}

/// "5%", "5" or "2.5 %": a non-negative percentage.
pub fn parse_threshold(s: &str) -> Result<f64, String> {
    let t = s.trim().trim_end_matches('%').trim();
    match t.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!(
            "threshold '{s}' is not a percentage (e.g. 5% or 2.5)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // No test in this crate installs views (the suites' crates bring them), so this holds
    // whichever test runs first.
    #[test]
    fn report_and_compare_without_installed_views_fail_in_one_line() {
        let report = run_report(&ReportOptions {
            inputs: vec![PathBuf::from("results")],
            html: PathBuf::from("report.html"),
            json: None,
            strict: false,
            threshold_pct: 5.0,
            exports: vec![],
            export_dir: PathBuf::from("."),
            generator: "test".into(),
        });
        let compare = run_compare(&CompareOptions {
            base: PathBuf::from("base.json"),
            new: PathBuf::from("new.json"),
            threshold_pct: 5.0,
            json: None,
            strict: false,
        });
        for result in [report, compare] {
            assert_eq!(result.unwrap_err().to_string(), "no suite views installed");
        }
    }
}
