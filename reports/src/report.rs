//! `tbbench report`: every loaded result in one self-contained HTML page (and the same content
//! as JSON): each suite's section with networks side by side, history with regressions marked,
//! the environment and warnings of every run, and the inputs that could not be used.

use crate::chart::{self, LineChart, Series, XAxis};
use crate::compare::{judge, Verdict};
use crate::html::{self, escape, Cell};
use crate::load::{load_paths, Loaded, Problem, NOT_A_RESULT_MARKER};
use crate::metrics::Metric;
use crate::views::{self, network_id, short_time};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;

pub struct Report {
    pub html: String,
    pub summary: Value,
    pub problems: Vec<Problem>,
    pub loaded: usize,
}

/// Loads the inputs and keeps those a view can read; the rest become problems.
pub fn load_checked(paths: &[PathBuf]) -> (Vec<Loaded>, Vec<Problem>) {
    let (loaded, mut problems) = load_paths(paths, &views::known_suites());
    let mut ok = Vec::new();
    for l in loaded {
        let view = views::view_for(&l.result.suite).expect("known suite");
        match view.check(&l.result) {
            Ok(()) => ok.push(l),
            Err(message) => problems.push(Problem {
                path: l.path.display().to_string(),
                message,
            }),
        }
    }
    (ok, problems)
}

pub fn metrics_of(l: &Loaded) -> Vec<Metric> {
    views::view_for(&l.result.suite)
        .map(|v| v.metrics(&l.result))
        .unwrap_or_default()
}

pub fn build(paths: &[PathBuf], threshold_pct: f64, generator: &str, now: &str) -> Report {
    let (loaded, problems) = load_checked(paths);
    let mut body = String::new();
    let mut sections = serde_json::Map::new();

    // Overview: what went in, what was left out.
    let suites: Vec<&str> = views::registry()
        .iter()
        .map(|v| v.suite())
        .filter(|s| loaded.iter().any(|l| l.result.suite == *s))
        .collect();
    let mut nets: Vec<String> = loaded
        .iter()
        .map(|l| views::network_label(&l.result.network))
        .collect();
    nets.sort();
    nets.dedup();
    body.push_str(&format!(
        "<p>{} result file(s): suites {}; networks {}.</p>\n",
        loaded.len(),
        escape(&if suites.is_empty() {
            "none".into()
        } else {
            suites.join(", ")
        }),
        escape(&if nets.is_empty() {
            "none".into()
        } else {
            nets.join(", ")
        }),
    ));
    if !problems.is_empty() {
        body.push_str("<div class=\"problems\"><p><strong>Left out:</strong></p><ul>");
        for p in &problems {
            body.push_str(&format!("<li>{}</li>", escape(&p.to_string())));
        }
        body.push_str("</ul></div>\n");
    }
    let unverified: Vec<&Loaded> = loaded
        .iter()
        .filter(|l| !l.result.verification.passed)
        .collect();
    if !unverified.is_empty() {
        body.push_str(&format!(
            "<p><span class=\"fail\">FAILED</span> {} run(s) failed their own verification: {}</p>\n",
            unverified.len(),
            escape(
                &unverified
                    .iter()
                    .map(|l| l.path.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        ));
    }

    for view in views::registry() {
        let runs: Vec<&Loaded> = loaded
            .iter()
            .filter(|l| {
                l.result.suite == view.suite()
                    || view.companions().contains(&l.result.suite.as_str())
            })
            .collect();
        if runs.iter().all(|l| l.result.suite != view.suite()) {
            continue;
        }
        let (section, data) = view.section(&runs);
        body.push_str(&html::section(view.suite(), view.title(), &section));
        sections.insert(view.suite().into(), data);
    }

    if let Some((topology_html, topology)) = crate::topology::section(&loaded) {
        body.push_str(&html::section("topology", "Topology", &topology_html));
        sections.insert("topology".into(), topology);
    }

    let (history_html, history) = history(&loaded, threshold_pct);
    if !history.is_empty() {
        body.push_str(&html::section("history", "History", &history_html));
    }
    body.push_str(&html::section(
        "environment",
        "Environment and warnings",
        &environment(&loaded),
    ));
    body.push_str(&format!(
        "<p class=\"meta\">Written by {} at {}.</p>\n",
        escape(generator),
        escape(now)
    ));

    let files: Vec<Value> = loaded
        .iter()
        .map(|l| {
            let r = &l.result;
            json!({
                "path": l.path.display().to_string(),
                "suite": r.suite,
                "started_at": r.started_at,
                "tool": r.tool,
                "network": r.network,
                "ranks": r.ranks.len(),
                "hosts": r.hosts,
                "verification": r.verification,
                "warnings": r.warnings,
                "metrics": metrics_of(l),
            })
        })
        .collect();
    let summary = json!({
        NOT_A_RESULT_MARKER: "report-summary",
        "generated_by": generator,
        "generated_at": now,
        "threshold_pct": threshold_pct,
        "files": files,
        "problems": problems,
        "sections": sections,
        "history": history,
    });
    let title = "tbbench report";
    let subtitle = format!("{} runs · {}", loaded.len(), now);
    Report {
        html: html::page(title, &subtitle, &body),
        summary,
        problems,
        loaded: loaded.len(),
    }
}

/// Runs of the same configuration over time: same suite, network, hosts and rank count.
fn history(loaded: &[Loaded], threshold_pct: f64) -> (String, Vec<Value>) {
    type GroupKey = (String, (String, Vec<String>), usize);
    let mut groups: BTreeMap<GroupKey, Vec<&Loaded>> = BTreeMap::new();
    for l in loaded {
        let k = (
            l.result.suite.clone(),
            network_id(&l.result),
            l.result.ranks.len(),
        );
        groups.entry(k).or_default().push(l);
    }
    let mut out = String::new();
    let mut data = Vec::new();
    for ((suite, (label, hosts), ranks), runs) in groups {
        if runs.len() < 2 {
            continue;
        }
        let mut labels: Vec<String> = runs
            .iter()
            .map(|l| short_time(&l.result.started_at))
            .collect();
        if labels.windows(2).any(|w| w[0] == w[1]) {
            // Runs minutes apart share a label: show the seconds (HH:MM:SS) instead.
            labels = runs
                .iter()
                .map(|l| l.result.started_at.get(11..19).unwrap_or("?").to_string())
                .collect();
        }
        let per_run: Vec<Vec<Metric>> = runs.iter().map(|l| metrics_of(l)).collect();
        let mut keys: Vec<(String, Metric)> = per_run
            .iter()
            .flatten()
            .filter(|m| m.headline)
            .map(|m| (m.key.clone(), m.clone()))
            .collect();
        keys.sort_by(|a, b| a.0.cmp(&b.0));
        keys.dedup_by(|a, b| a.0 == b.0);
        let mut charts = String::new();
        for (key, proto) in keys {
            // (run index, value, spread) where the run has this figure.
            let points: Vec<(usize, f64, f64)> = per_run
                .iter()
                .enumerate()
                .filter_map(|(i, ms)| {
                    ms.iter()
                        .find(|m| m.key == key)
                        .map(|m| (i, m.value, m.spread))
                })
                .collect();
            if points.len() < 2 {
                continue;
            }
            // Each run is judged against the one before it, by compare's rule.
            let mut marks = Vec::new();
            let mut pts_data = Vec::new();
            for (j, p) in points.iter().enumerate() {
                let regressed = j > 0 && {
                    let prev = points[j - 1];
                    judge(proto.better, prev.1, prev.2, p.1, p.2, threshold_pct)
                        == Verdict::Regressed
                };
                if regressed {
                    marks.push((p.0 as f64, p.1));
                }
                pts_data.push(json!({
                    "started_at": runs[p.0].result.started_at,
                    "path": runs[p.0].path.display().to_string(),
                    "value": p.1, "spread": p.2, "regressed": regressed,
                }));
            }
            charts.push_str(&chart::line_chart(&LineChart {
                title: format!(
                    "{} {} over time ({})",
                    proto.measure, proto.subject, proto.unit
                ),
                x_label: "run".into(),
                y_label: proto.unit.clone(),
                x: XAxis::Labels(labels.clone()),
                log_y: false,
                series: vec![Series {
                    name: format!("{} {}", proto.measure, proto.subject),
                    points: points.iter().map(|p| (p.0 as f64, p.1)).collect(),
                    // Every figure tbbench tracks (times, rates, Gflops) is positive: a spread
                    // wider than the value stops the band at zero, not below it.
                    band: points
                        .iter()
                        .map(|p| (p.0 as f64, (p.1 - p.2).max(0.0), p.1 + p.2))
                        .collect(),
                    marks,
                    colour: None,
                }],
                hlines: vec![],
            }));
            data.push(json!({
                "suite": suite, "network": label, "hosts": hosts, "ranks": ranks,
                "key": key, "unit": proto.unit, "better": proto.better, "points": pts_data,
            }));
        }
        if !charts.is_empty() {
            out.push_str(&format!(
                "<h3>{} on {} ({} ranks on {}), {} runs</h3>\n<p class=\"meta\">Shaded: the run's own spread. Circled: a regression against the run before it (beyond {}% and beyond both runs' spread).</p>\n{charts}",
                escape(&suite),
                escape(&label),
                ranks,
                escape(&hosts.join(", ")),
                runs.len(),
                threshold_pct
            ));
        }
    }
    (out, data)
}

/// Two tables: each run (file, suite, tool, network, which host ran which ranks) and each
/// distinct host setup once (OS, CPU, memory, BLAS), so a row stays one line wide.
fn environment(loaded: &[Loaded]) -> String {
    // Host setups, numbered in the order they first appear.
    let mut setups: Vec<Vec<String>> = Vec::new();
    let mut run_rows = Vec::new();
    for l in loaded {
        let r = &l.result;
        let mut placed = Vec::new();
        for h in &r.hosts {
            let blas = h
                .blas
                .as_ref()
                .map(|b| {
                    let env = if b.env.is_empty() {
                        String::new()
                    } else {
                        format!(" [{}]", b.env.join(" "))
                    };
                    // OpenBLAS's config string ("Cooperlake (OpenBLAS 0.3.21 NO_LAPACKE
                    // DYNAMIC_ARCH ...)"): the kernel and the version; the whole string stays
                    // in the result file.
                    let mut words = b.kernel.split_whitespace();
                    let kernel = words.next().unwrap_or("?");
                    let version = match (words.next(), words.next()) {
                        (Some(n), Some(v)) if n.trim_start_matches('(') == "OpenBLAS" => {
                            format!(" (OpenBLAS {})", v.trim_end_matches(')'))
                        }
                        _ => String::new(),
                    };
                    format!("{} {kernel}{version}{env}", b.name)
                })
                .unwrap_or_else(|| "–".into());
            let setup = vec![
                h.hostname.clone(),
                format!("{} · {} · {}", h.os_version, h.kernel, h.arch),
                h.cpu_model.clone(),
                format!("{}/{}", h.cores_physical, h.cores_logical),
                format!("{:.1}", h.memory_total_bytes as f64 / (1u64 << 30) as f64),
                blas,
            ];
            let id = match setups.iter().position(|s| *s == setup) {
                Some(i) => i,
                None => {
                    setups.push(setup);
                    setups.len() - 1
                }
            };
            let ranks = h
                .ranks
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(",");
            placed.push(format!("{} (host {}): {ranks}", h.hostname, id + 1));
        }
        let file = l
            .path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_else(|| l.path.display().to_string());
        run_rows.push(vec![
            Cell::Html(format!(
                "<span title=\"{}\">{}</span>",
                escape(&l.path.display().to_string()),
                escape(&file)
            )),
            Cell::from(r.suite.as_str()),
            Cell::from(short_time(&r.started_at)),
            Cell::from(format!(
                "{} ({})",
                r.tool.version,
                r.tool.git_commit.chars().take(10).collect::<String>()
            )),
            // TCP's figures follow the congestion control and connections per peer it ran.
            Cell::from(match r.network.tcp_setup() {
                Some(tcp) => format!("{}, {tcp}", views::network_label(&r.network)),
                None => views::network_label(&r.network),
            }),
            Cell::from(placed.join("; ")),
        ]);
    }
    let mut s = html::table(
        "runs",
        &[
            "file",
            "suite",
            "started",
            "tbbench",
            "network",
            "ranks per host",
        ],
        run_rows,
    );
    let host_rows = setups
        .into_iter()
        .enumerate()
        .map(|(i, f)| {
            let mut row = vec![Cell::Num((i + 1).to_string())];
            for (c, v) in f.into_iter().enumerate() {
                row.push(if c == 3 || c == 4 {
                    Cell::Num(v)
                } else {
                    Cell::from(v)
                });
            }
            row
        })
        .collect();
    s.push_str(&html::table(
        "environment",
        &[
            "host",
            "name",
            "OS · kernel · arch",
            "CPU",
            "cores phys/log",
            "memory GiB",
            "BLAS and its kernel",
        ],
        host_rows,
    ));
    for l in loaded {
        let w = &l.result.warnings;
        let failed: Vec<_> = l
            .result
            .verification
            .checks
            .iter()
            .filter(|c| !c.passed)
            .collect();
        if w.is_empty() && failed.is_empty() {
            continue;
        }
        s.push_str(&format!(
            "<details{}><summary class=\"warn\">{}: {} warning(s){}</summary><ul>",
            if w.len() <= 5 { " open" } else { "" },
            escape(&l.path.display().to_string()),
            w.len(),
            if failed.is_empty() {
                String::new()
            } else {
                format!(", {} failed check(s)", failed.len())
            }
        ));
        for c in failed {
            s.push_str(&format!(
                "<li><span class=\"fail\">FAILED</span> {}: {}</li>",
                escape(&c.name),
                escape(&c.detail)
            ));
        }
        for x in w {
            s.push_str(&format!("<li>{}</li>", escape(x)));
        }
        s.push_str("</ul></details>\n");
    }
    s
}

/// The key figures of runs over different networks as one text table: a row per figure, a
/// column per network. What `--over` prints after its runs.
pub fn network_table(paths: &[PathBuf]) -> String {
    let (loaded, problems) = load_checked(paths);
    let mut out = String::new();
    for p in &problems {
        out.push_str(&format!("left out {p}\n"));
    }
    let nets: Vec<String> = loaded
        .iter()
        .map(|l| views::network_label(&l.result.network))
        .collect();
    let per_run: Vec<Vec<Metric>> = loaded.iter().map(metrics_of).collect();
    let mut rows: Vec<(String, String)> = Vec::new();
    for m in per_run.iter().flatten() {
        let k = (m.name(), m.unit.clone());
        if !rows.contains(&k) {
            rows.push(k);
        }
    }
    if rows.is_empty() {
        return out;
    }
    let mut cells: Vec<Vec<String>> = vec![];
    let mut head = vec!["figure".to_string()];
    head.extend(nets.iter().cloned());
    cells.push(head);
    for (name, unit) in &rows {
        let mut row = vec![format!("{name} ({unit})")];
        for ms in &per_run {
            row.push(
                ms.iter()
                    .find(|m| &m.name() == name)
                    .map(|m| chart::number_label(m.value))
                    .unwrap_or_else(|| "–".into()),
            );
        }
        cells.push(row);
    }
    let cols = cells[0].len();
    let width: Vec<usize> = (0..cols)
        .map(|c| {
            cells
                .iter()
                .map(|r| r[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for r in &cells {
        let mut line = String::new();
        for (c, v) in r.iter().enumerate() {
            let pad = " ".repeat(width[c] - v.chars().count());
            if c == 0 {
                line.push_str(&format!("{v}{pad}"));
            } else {
                line.push_str(&format!("  {pad}{v}"));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
