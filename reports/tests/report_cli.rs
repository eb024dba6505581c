//! `tbbench report` and `tbbench compare` end to end, on result files real runs produced
//! (fixtures/results, made by scripts/make-report-fixtures.sh), and on damaged copies of them.

#[path = "../../runners/tests/support.rs"]
mod support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;
use support::*;

const LIMIT: Duration = Duration::from_secs(60);

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/results")
}

/// A link run over the cables of the 4-ring lab (fixtures/README.md).
fn cabled_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/cabled/link-ring4-tcp-links.json")
}

fn fixture(rel: &str) -> Value {
    read_json(&fixtures().join(rel))
}

fn write_json(path: &Path, v: &Value) {
    std::fs::write(path, serde_json::to_vec_pretty(v).unwrap()).unwrap();
}

fn json_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(json_files(&p));
        } else if p.extension().is_some_and(|x| x == "json") {
            out.push(p);
        }
    }
    out
}

/// `tbbench report INPUTS... -o HTML`, which must succeed; the page it wrote.
fn report_page(inputs: &[&Path], html: &Path) -> String {
    let mut args: Vec<&str> = vec!["report"];
    args.extend(inputs.iter().map(|p| p.to_str().unwrap()));
    args.extend(["-o", html.to_str().unwrap()]);
    let o = run(&args, LIMIT);
    assert!(o.status.success(), "{}", text(&o.stderr));
    std::fs::read_to_string(html).unwrap()
}

/// Scales every bandwidth figure of a link result by `bw` and every latency figure by `lat`:
/// a synthetic slowdown of a real run.
fn scaled(mut v: Value, bw: f64, lat: f64) -> Value {
    let scale = |x: &mut Value, f: f64| {
        if let Some(n) = x.as_f64() {
            *x = (n * f).into();
        }
    };
    for row in v["results"]["bandwidth"].as_array_mut().unwrap() {
        for k in ["gbit_per_s", "gib_per_s"] {
            for s in ["avg", "peak"] {
                scale(&mut row[k][s], bw);
            }
        }
        for s in ["min", "median", "mean", "max", "stdev", "p99", "p999"] {
            scale(&mut row["iteration_gbit_per_s"][s], bw);
        }
    }
    for row in v["results"]["latency"].as_array_mut().unwrap() {
        for s in ["min", "median", "mean", "max", "stdev", "p99", "p999"] {
            scale(&mut row["one_way_us"][s], lat);
        }
        for x in row["samples_ns"].as_array_mut().unwrap() {
            *x = ((x.as_f64().unwrap() * lat).round() as u64).into();
        }
    }
    v
}

#[test]
fn report_of_recorded_runs_puts_networks_side_by_side() {
    let dir = tmpdir("report-fixtures");
    let html_path = dir.join("r.html");
    let json_path = dir.join("s.json");
    let o = run(
        &[
            "report",
            fixtures().to_str().unwrap(),
            "-o",
            html_path.to_str().unwrap(),
            "--json",
            json_path.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let html = std::fs::read_to_string(&html_path).unwrap();
    let summary = read_json(&json_path);

    // Every network recorded under network/ is a series of the latency chart.
    let mut labels: Vec<String> = json_files(&fixtures().join("network"))
        .iter()
        .map(|p| {
            read_json(p)["network"]["label"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    labels.sort();
    labels.dedup();
    assert!(labels.len() >= 2, "fixtures need two networks: {labels:?}");
    let latency_fig = html
        .split("<figure class=\"chart\"")
        .find(|f| f.contains("One-way latency"))
        .expect("a latency chart");
    for l in &labels {
        assert!(latency_fig.contains(l.as_str()), "series {l} missing");
    }
    let networks: Vec<String> = summary["sections"]["link"]["networks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    for l in &labels {
        assert!(
            networks.iter().any(|n| n.starts_with(l.as_str())),
            "{l} not in {networks:?}"
        );
    }

    // The percentile table carries the recorded numbers.
    let shm = fixture("network/link-shm.json");
    let p99 = shm["results"]["latency"][0]["one_way_us"]["p99"]
        .as_f64()
        .unwrap();
    assert!(
        html.contains(&format!(">{p99:.2}<")),
        "shm p99 {p99:.2} missing"
    );
    // Bandwidth at the largest size, with the ceiling drawn where the run knew one.
    assert!(html.contains("Bandwidth, one direction"));
    assert!(html.contains("ceiling"));

    // HPL: every solve with its verdict, Gflops, and the scaling chart over 1, 2, 4 ranks.
    let hpl4 = fixture("hpl/hpl-4-ranks.json");
    let g = hpl4["results"]["runs"][0]["gflops"].as_f64().unwrap();
    assert!(
        html.contains(&format!(">{g:.2}<")),
        "4-rank Gflops {g:.2} missing"
    );
    assert!(html.contains("3 of 3 solves passed"), "verdict line");
    let section = |id: &str| -> String {
        let start = html
            .find(&format!("<section id=\"{id}\">"))
            .unwrap_or_else(|| panic!("no {id} section"));
        let end = start + html[start..].find("</section>").unwrap();
        html[start..end].to_string()
    };
    let hpl = section("hpl");
    assert_eq!(hpl.matches("<span class=\"pass\">PASSED</span>").count(), 4);
    assert!(html.contains("Gflops vs number of ranks"));
    assert!(html.contains("Time split of the slowest rank"));
    assert_eq!(summary["sections"]["hpl"]["total"], 3);

    // The built-in decode: a real model and a synthetic shape, each matching its 1-rank run.
    let decode = section("decode");
    assert!(decode.contains("SmolLM2-135M-Instruct.Q4_1"), "{decode}");
    assert!(decode.contains("llama-3.2-3b (synthetic)"));
    assert_eq!(
        decode.matches("<span class=\"pass\">PASSED</span>").count(),
        2
    );
    let tps = fixture("decode/decode-smollm2-pp2.json")["results"]["decode_tokens_per_s"]
        .as_f64()
        .unwrap();
    assert!(
        decode.contains(&format!(">{tps:.2}<")),
        "decode rate {tps:.2} missing"
    );
    assert!(decode.contains("threads per rank"), "{decode}");

    // History: the three runs of one configuration, a trend chart per headline figure.
    let hist = summary["history"].as_array().unwrap();
    assert!(!hist.is_empty(), "no history");
    assert!(hist
        .iter()
        .all(|h| h["points"].as_array().unwrap().len() >= 2));
    assert!(html.contains("over time"));

    // Environment: hosts, BLAS, tool version of every run.
    assert!(html.contains("BLAS and its kernel") && html.contains("0.1.0 ("));
    let n_files = json_files(&fixtures()).len();
    assert_eq!(summary["files"].as_array().unwrap().len(), n_files);
    assert_eq!(summary["problems"].as_array().unwrap().len(), 0);

    // Self-contained: nothing fetched, no script.
    assert!(!html.contains("<script"), "a report needs no script");
    for attr in ["src=\"http", "href=\"http", "url(http", "@import"] {
        assert!(!html.contains(attr), "fetches {attr}");
    }
}

#[test]
fn bad_inputs_are_left_out_with_one_line_each_and_strict_fails() {
    let dir = tmpdir("report-bad");
    let good = fixture("hpl/hpl-2-ranks.json");
    write_json(&dir.join("good.json"), &good);
    let text_good = serde_json::to_string_pretty(&good).unwrap();
    std::fs::write(dir.join("cut.json"), &text_good[..text_good.len() / 2]).unwrap();
    let mut newer = good.clone();
    newer["schema_version"] = 99.into();
    write_json(&dir.join("newer.json"), &newer);
    let mut unknown = good.clone();
    unknown["suite"] = "diskio".into();
    write_json(&dir.join("unknown.json"), &unknown);

    let html = dir.join("r.html");
    let o = run(
        &[
            "report",
            dir.to_str().unwrap(),
            "-o",
            html.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "{err}");
    for (file, why) in [
        ("cut.json", "truncated"),
        ("newer.json", "schema_version 99 is newer"),
        ("unknown.json", "unknown suite 'diskio'"),
    ] {
        assert!(
            lines.iter().any(|l| l.contains(file) && l.contains(why)),
            "{file}: {err}"
        );
    }
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("1 of 1 solves passed") && page.contains("Left out"));

    let strict = dir.join("strict.html");
    let o = run(
        &[
            "report",
            dir.to_str().unwrap(),
            "--strict",
            "-o",
            strict.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(!strict.exists(), "--strict must write nothing");
    assert!(text(&o.stderr).contains("--strict"));

    // Nothing usable at all: an error, not an empty page.
    let o = run(
        &[
            "report",
            dir.join("cut.json").to_str().unwrap(),
            "-o",
            dir.join("x.html").to_str().unwrap(),
        ],
        LIMIT,
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("no usable result files"));
}

#[test]
fn hostile_strings_in_a_result_show_as_text() {
    let dir = tmpdir("report-escape");
    let mut v = fixture("network/link-tcp-loopback.json");
    v["hosts"][0]["hostname"] = "<script>alert(1)</script>".into();
    v["network"]["label"] = "<img src=x onerror=alert(2)>".into();
    v["network"]["congestion"] = "<i>cc</i>".into();
    v["warnings"] = serde_json::json!(["\"><b>bold</b>"]);
    write_json(&dir.join("evil.json"), &v);
    let page = report_page(&[&dir.join("evil.json")], &dir.join("r.html"));
    assert!(!page.contains("<script"), "script tag reached the page");
    assert!(!page.contains("<img"), "img tag reached the page");
    assert!(
        !page.contains("<b>bold"),
        "markup in a warning reached the page"
    );
    assert!(
        !page.contains("<i>cc"),
        "markup in the congestion control reached the page"
    );
    assert!(page.contains("congestion control &lt;i&gt;cc&lt;/i&gt;"));
    assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(page.contains("&lt;img src=x onerror=alert(2)&gt;"));
}

/// A 50 MB label (any string far past what tbbench writes) is cut when read: the report, its
/// JSON and compare's table stay the size of an ordinary run's, and say what was cut.
#[test]
fn a_huge_label_is_cut_when_read() {
    let dir = tmpdir("report-huge-label");
    let huge = "x".repeat(50 << 20);
    let base = dir.join("base");
    std::fs::create_dir(&base).unwrap();
    let mut files = Vec::new();
    for name in ["link-run1", "link-run2", "link-run3"] {
        let mut v = fixture(&format!("history/{name}.json"));
        v["network"]["label"] = huge.clone().into();
        let path = if name == "link-run3" {
            dir.clone()
        } else {
            base.clone()
        }
        .join(format!("{name}.json"));
        write_json(&path, &v);
        files.push(path);
    }
    let (html, json) = (dir.join("r.html"), dir.join("r.json"));
    let o = run(
        &[
            "report",
            files[0].to_str().unwrap(),
            "-o",
            html.to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    for f in [&html, &json] {
        let size = std::fs::metadata(f).unwrap().len();
        assert!(size < 4 << 20, "{}: {size} bytes", f.display());
    }
    assert!(std::fs::read_to_string(&html)
        .unwrap()
        .contains("more bytes not read]"));
    let o = run(
        &[
            "compare",
            base.to_str().unwrap(),
            files[2].to_str().unwrap(),
        ],
        LIMIT,
    );
    let out = text(&o.stdout);
    assert!(out.lines().count() > 2, "{out}");
    let widest = out.lines().map(|l| l.chars().count()).max().unwrap();
    assert!(widest < 300, "a {widest}-character line");
}

#[test]
fn compare_flags_a_slowdown_beyond_the_spread_and_gates_with_exit_1() {
    let dir = tmpdir("compare-slow");
    let run3 = fixture("history/link-run3.json");
    let new = dir.join("new.json");
    write_json(&new, &scaled(run3, 0.5, 2.0));
    let json = dir.join("c.json");
    let o = run(
        &[
            "compare",
            fixtures().join("history").to_str().unwrap(),
            new.to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    let out = text(&o.stdout);
    let first = out.lines().nth(1).unwrap();
    assert!(first.contains("REGRESSED"), "regressions first: {out}");
    let c = read_json(&json);
    let rows = c["rows"].as_array().unwrap();
    let regressed = |measure: &str| {
        rows.iter()
            .filter(|r| r["measure"] == measure && r["verdict"] == "regressed")
            .count()
    };
    // Halved bandwidth is beyond any loopback noise at the large sizes, doubled latency too.
    assert!(regressed("bw") >= 2, "{out}");
    assert!(regressed("latency p50") >= 3, "{out}");
    assert!(rows.iter().all(|r| r["verdict"] != "improved"), "{out}");
    assert_eq!(
        c["regressions"].as_u64().unwrap() as usize,
        regressed("bw") + regressed("latency p50")
    );
}

/// TCP's figures follow its congestion control and connections per peer: where the new runs
/// ran others than the baseline, compare says so (one line each network) beside its
/// verdicts, and says nothing where they match or one side never recorded them.
#[test]
fn compare_names_a_change_in_what_tcp_ran() {
    let dir = tmpdir("compare-tcp");
    let with = |cc: Option<&str>, streams: usize, name: &str| {
        let mut v = fixture("history/link-run3.json");
        if let Some(cc) = cc {
            v["network"]["congestion"] = cc.into();
        }
        v["network"]["streams"] = streams.into();
        let path = dir.join(name);
        write_json(&path, &v);
        path
    };
    let base = with(Some("cubic"), 1, "base.json");
    let cases = [
        (with(Some("bbr"), 2, "changed.json"), true),
        (with(Some("cubic"), 1, "same.json"), false),
        (with(None, 1, "unrecorded.json"), false),
    ];
    for (new, named) in cases {
        let o = run(
            &["compare", base.to_str().unwrap(), new.to_str().unwrap()],
            LIMIT,
        );
        let err = text(&o.stderr);
        let note = "tcp/lo (loopback): congestion control cubic -> bbr, connections per peer 1 -> 2 from the baseline to the new runs";
        assert_eq!(err.contains(note), named, "{new:?}: {err}");
        assert_eq!(err.contains("note:"), named, "{new:?}: {err}");
    }
}

/// hpl's trailing update product is timed against the BLAS at start, per NB: where the new
/// runs ran another at an NB than the baseline did, compare names that NB (and no other)
/// beside its verdicts, and says nothing where they match or one side never recorded it.
#[test]
fn compare_names_a_change_in_the_hpl_update_product() {
    let dir = tmpdir("compare-hpl-product");
    // One run per (NB, product), from the fixture's run.
    let with = |runs: &[(u64, Option<&str>)], name: &str| {
        let mut v = fixture("hpl/hpl-2-ranks.json");
        let first = v["results"]["runs"][0].clone();
        v["results"]["runs"] = runs
            .iter()
            .map(|&(nb, product)| {
                let mut run = first.clone();
                run["nb"] = nb.into();
                match product {
                    Some(p) => run["product"] = p.into(),
                    None => {
                        run.as_object_mut().unwrap().remove("product");
                    }
                }
                run
            })
            .collect::<Vec<_>>()
            .into();
        let path = dir.join(name);
        write_json(&path, &v);
        path
    };
    let packed = "tbbench avx512 24x8 (L21 packed once per panel)";
    let blas = "BLAS dgemm";
    let base = with(&[(128, Some(blas)), (256, Some(blas))], "base.json");
    let cases = [
        (
            with(&[(128, Some(packed)), (256, Some(blas))], "changed.json"),
            true,
        ),
        (
            with(&[(128, Some(blas)), (256, Some(blas))], "same.json"),
            false,
        ),
        (with(&[(128, None), (256, None)], "unrecorded.json"), false),
    ];
    for (new, named) in cases {
        let o = run(
            &["compare", base.to_str().unwrap(), new.to_str().unwrap()],
            LIMIT,
        );
        let err = text(&o.stderr);
        let note = format!(
            ": the trailing update's product at NB 128 {blas} -> {packed} from the baseline to the new runs; hpl's figures follow it"
        );
        assert_eq!(err.contains(&note), named, "{new:?}: {err}");
        assert!(err.lines().all(|l| !l.contains("at NB 256")), "{err}");
        assert_eq!(
            err.matches("note:").count(),
            named as usize,
            "{new:?}: {err}"
        );
    }
}

#[test]
fn compare_does_not_flag_a_change_within_the_runs_spread() {
    let dir = tmpdir("compare-noise");
    let run3 = fixture("history/link-run3.json");
    let new = dir.join("new.json");
    // 3% worse everywhere: over a 1% threshold, but inside loopback's run-to-run spread.
    write_json(&new, &scaled(run3, 0.97, 1.03));
    let json = dir.join("c.json");
    let o = run(
        &[
            "compare",
            fixtures().join("history").to_str().unwrap(),
            new.to_str().unwrap(),
            "--threshold",
            "1%",
            "--json",
            json.to_str().unwrap(),
        ],
        LIMIT,
    );
    let out = text(&o.stdout);
    let c = read_json(&json);
    let rows = c["rows"].as_array().unwrap();
    let over_threshold = rows
        .iter()
        .filter(|r| r["change_pct"].as_f64().is_some_and(|p| p.abs() > 1.0))
        .count();
    assert!(
        over_threshold > 0,
        "the test needs changes over the threshold: {out}"
    );
    let regressed: Vec<&Value> = rows
        .iter()
        .filter(|r| r["verdict"] == "regressed")
        .collect();
    // Each regression, if any, must be one whose spread is genuinely below 3%.
    for r in &regressed {
        let spread = r["old_spread"].as_f64().unwrap() + r["new_spread"].as_f64().unwrap();
        let delta = (r["new"].as_f64().unwrap() - r["old"].as_f64().unwrap()).abs();
        assert!(delta > spread, "{r}");
    }
    assert!(
        regressed.len() * 4 < over_threshold,
        "a 3% change within the spread flagged {} of {over_threshold} figures: {out}",
        regressed.len()
    );
    // The same file against itself: nothing moves, exit 0.
    let o = run(
        &["compare", new.to_str().unwrap(), new.to_str().unwrap()],
        LIMIT,
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stdout));
    // Different suites share no figure: exit 2, not a silent pass.
    let o = run(
        &[
            "compare",
            fixtures().join("hpl/hpl-1-ranks.json").to_str().unwrap(),
            new.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("nothing to compare"));
}

#[test]
fn exports_parse_as_the_services_document_them() {
    let dir = tmpdir("export");
    let o = run(
        &[
            "report",
            fixtures().to_str().unwrap(),
            "-o",
            dir.join("r.html").to_str().unwrap(),
            "--export",
            "github-action-benchmark",
            "--export",
            "bencher",
            "--export-dir",
            dir.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    // github-action-benchmark custom tools: an array of {name, unit, value[, range, extra]}.
    for (file, latency_here) in [
        ("github-action-benchmark-bigger.json", false),
        ("github-action-benchmark-smaller.json", true),
    ] {
        let v = read_json(&dir.join(file));
        let items = v.as_array().expect("an array");
        assert!(!items.is_empty(), "{file}");
        for it in items {
            let o = it.as_object().unwrap();
            assert!(o["name"].is_string() && o["unit"].is_string() && o["value"].is_number());
            assert!(o
                .keys()
                .all(|k| ["name", "unit", "value", "range", "extra"].contains(&k.as_str())));
        }
        let has_latency = items
            .iter()
            .any(|i| i["name"].as_str().unwrap().contains("latency"));
        assert_eq!(has_latency, latency_here, "{file}");
    }
    // Bencher Metric Format: benchmark -> measure slug -> {value, lower_value, upper_value}.
    let v = read_json(&dir.join("bencher.json"));
    let benches = v.as_object().unwrap();
    assert!(benches.keys().any(|k| k.starts_with("hpl")));
    for (name, measures) in benches {
        assert!(!name.is_empty() && name.len() <= 1024);
        for (slug, m) in measures.as_object().unwrap() {
            assert!(
                !slug.is_empty()
                    && slug.len() <= 64
                    && slug
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "slug {slug}"
            );
            let (v, lo, hi) = (
                m["value"].as_f64().unwrap(),
                m["lower_value"].as_f64().unwrap(),
                m["upper_value"].as_f64().unwrap(),
            );
            assert!(lo <= v && v <= hi, "{name}/{slug}");
        }
    }
}

/// The README's first command: every suite briefly, then a report a person can open.
#[test]
fn quick_run_writes_every_suite_and_a_report() {
    let dir = tmpdir("quick");
    let o = run(
        &["run", "--quick", "--out-dir", dir.to_str().unwrap()],
        Duration::from_secs(300),
    );
    assert!(
        o.status.success(),
        "{}\n{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    for f in ["link.json", "hpl.json", "report.html", "summary.json"] {
        assert!(dir.join(f).exists(), "{f} missing");
    }
    let page = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(page.contains("id=\"link\"") && page.contains("id=\"hpl\""));
    assert!(page.contains("1 of 1 solves passed"));
    // Local ranks over TCP on Linux: the runs table names the congestion control they ran.
    #[cfg(target_os = "linux")]
    assert!(page.contains("tcp/lo (loopback), congestion control "));
    assert!(text(&o.stdout).contains("report.html"));
}

// ---- the report in a real browser --------------------------------------------------------

fn chromium() -> Option<PathBuf> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// Loads a page headless; returns (the DOM after load, console messages).
fn load_in_chromium(exe: &Path, page: &Path, screenshot: Option<&Path>) -> (String, Vec<String>) {
    load_in_chromium_at(exe, page, screenshot, 1280)
}

/// As [`load_in_chromium`], in a window `width` CSS pixels wide.
fn load_in_chromium_at(
    exe: &Path,
    page: &Path,
    screenshot: Option<&Path>,
    width: u32,
) -> (String, Vec<String>) {
    let profile = tmpdir(&format!(
        "chromium-profile-{}",
        page.file_stem().unwrap().to_string_lossy()
    ));
    let mut args: Vec<String> = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--enable-logging=stderr",
        "--v=0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(format!("--window-size={width},4000"));
    args.push(format!("--user-data-dir={}", profile.display()));
    match screenshot {
        Some(s) => args.push(format!("--screenshot={}", s.display())),
        None => args.push("--dump-dom".into()),
    }
    args.push(format!("file://{}", page.display()));
    let child = std::process::Command::new(exe)
        .args(&args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (o, _) = finish(child, Duration::from_secs(120));
    let console = text(&o.stderr)
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(|l| l.to_string())
        .collect();
    (text(&o.stdout), console)
}

#[test]
fn report_loads_in_headless_chromium_with_every_chart_drawn() {
    let Some(exe) = chromium() else {
        // CI sets TBBENCH_REQUIRE_CHROMIUM so a missing browser fails there instead.
        assert!(
            std::env::var_os("TBBENCH_REQUIRE_CHROMIUM").is_none(),
            "TBBENCH_REQUIRE_CHROMIUM is set but /usr/bin/chromium is missing"
        );
        skipped("no chromium (scripts/setup.sh --deps installs Debian's package)");
        return;
    };
    let dir = tmpdir("chromium");
    // The console check itself must be able to fail: a page with a script error trips it.
    let bad = dir.join("bad.html");
    std::fs::write(
        &bad,
        "<!DOCTYPE html><html><body><script>undefined_fn()</script></body></html>",
    )
    .unwrap();
    let (_, console) = load_in_chromium(&exe, &bad, None);
    assert!(!console.is_empty(), "the console check sees nothing");

    let html = dir.join("report.html");
    let o = run(
        &[
            "report",
            fixtures().to_str().unwrap(),
            cabled_fixture().to_str().unwrap(),
            "-o",
            html.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let (dom, console) = load_in_chromium(&exe, &html, None);
    assert!(
        dom.contains("id=\"topology\"") && dom.contains("<figure class=\"topology\""),
        "no topology drawn"
    );
    assert!(console.is_empty(), "console messages: {console:?}");
    assert!(
        dom.contains("tbbench report"),
        "page did not load: {}",
        &dom[..dom.len().min(300)]
    );
    let figures: Vec<&str> = dom.split("<figure class=\"chart\"").skip(1).collect();
    assert!(figures.len() >= 6, "only {} charts", figures.len());
    for f in &figures {
        let f = &f[..f.find("</figure>").expect("figure closes")];
        assert!(f.contains("<svg"), "a chart without SVG");
        let series = f
            .split("data-series=\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .expect("data-series");
        assert!(!series.is_empty(), "a chart without series");
        for name in series.split('|') {
            // The legend draws each series' name as SVG text.
            assert!(f.matches(name).count() >= 2, "series {name} not drawn");
        }
        assert!(
            f.contains("<polyline") || f.contains("<rect"),
            "nothing plotted"
        );
    }
    // A screenshot for a person to look at.
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("report-screenshot.png");
    let _ = load_in_chromium(&exe, &html, Some(&shot));
    let png = std::fs::read(&shot).expect("screenshot written");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    eprintln!("screenshot: {}", shot.display());
}

/// Measures the laid-out page: the script is added at the end of a copy of the report (the
/// report itself has none), asks for the layout of what is above it, and leaves what it found
/// in an attribute of <body> for --dump-dom to carry out.
const MEASURE: &str = r#"<script>
(() => {
  const out = {tables: [], page: 0, legends: [], inside: [], topology: []};
  for (const s of document.querySelectorAll('#topology figure.topology svg')) {
    out.topology.push(Math.round(s.getBoundingClientRect().right));
  }
  for (const t of document.querySelectorAll('table')) {
    if (t.scrollWidth > t.clientWidth + 1) out.tables.push(t.className + ' ' + t.scrollWidth + '>' + t.clientWidth);
  }
  out.page = document.documentElement.scrollWidth - window.innerWidth;
  for (const f of document.querySelectorAll('figure.chart')) {
    const svg = f.querySelector('svg').getBoundingClientRect();
    const leg = f.querySelector('figcaption.legend');
    if (!leg || leg.getBoundingClientRect().top < svg.bottom - 1) out.legends.push(f.getAttribute('aria-label'));
    const names = (f.getAttribute('data-series') || '').split('|');
    for (const t of f.querySelector('svg').querySelectorAll('text')) {
      if (names.includes(t.textContent.trim())) out.inside.push(t.textContent.trim());
    }
  }
  document.body.setAttribute('data-measured', JSON.stringify(out));
})();
</script>"#;

fn measured(exe: &Path, report: &Path, width: u32) -> Value {
    let page = report.with_file_name(format!(
        "{}-measured.html",
        report.file_stem().unwrap().to_string_lossy()
    ));
    let html = std::fs::read_to_string(report).unwrap();
    std::fs::write(&page, html.replace("</body>", &format!("{MEASURE}</body>"))).unwrap();
    let (dom, console) = load_in_chromium_at(exe, &page, None, width);
    assert!(console.is_empty(), "console messages: {console:?}");
    let attr = dom
        .split("data-measured=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap_or_else(|| panic!("the page was not measured: {}", &dom[..dom.len().min(300)]));
    let json = attr
        .replace("&quot;", "\"")
        .replace("&gt;", ">")
        .replace("&lt;", "<")
        .replace("&amp;", "&");
    serde_json::from_str(&json).unwrap()
}

#[test]
fn report_fits_a_1400_pixel_window_with_legends_off_the_data() {
    let Some(exe) = chromium() else {
        assert!(
            std::env::var_os("TBBENCH_REQUIRE_CHROMIUM").is_none(),
            "TBBENCH_REQUIRE_CHROMIUM is set but /usr/bin/chromium is missing"
        );
        skipped("no chromium (scripts/setup.sh --deps installs Debian's package)");
        return;
    };
    let dir = tmpdir("chromium-layout");
    // Every recorded run, and a fifth network beside them: a copy of the shm run under a long
    // label, the width a real interface name with its kind reaches.
    let mut wide = fixture("network/link-shm.json");
    wide["network"]["label"] = "tcp/thunderbolt-bridge0 (thunderbolt-bridge)".into();
    wide["network"]["transport"] = "tcp".into();
    wide["hosts"][0]["hostname"] = "mac-studio-rack-2.example.internal".into();
    write_json(&dir.join("link-wide.json"), &wide);
    let html = dir.join("report.html");
    report_page(&[&fixtures(), &dir.join("link-wide.json")], &html);
    let m = measured(&exe, &html, 1400);
    assert_eq!(
        m["tables"],
        serde_json::json!([]),
        "tables wider than the page"
    );
    assert!(
        m["page"].as_i64().unwrap() <= 0,
        "the page scrolls sideways by {} px",
        m["page"]
    );
    assert_eq!(m["legends"], serde_json::json!([]), "legends on the plot");
    assert_eq!(
        m["inside"],
        serde_json::json!([]),
        "series named inside a plot"
    );

    // A cabled run beside the long-labelled one: its topology is drawn within the window, its
    // heat maps and the side-by-side tables fit.
    let cabled = dir.join("cabled.html");
    report_page(&[&cabled_fixture(), &dir.join("link-wide.json")], &cabled);
    let m = measured(&exe, &cabled, 1400);
    let drawn = m["topology"].as_array().unwrap();
    assert_eq!(drawn.len(), 1, "{m}");
    assert!(drawn.iter().all(|r| r.as_i64().unwrap() <= 1400), "{m}");
    assert_eq!(m["tables"], serde_json::json!([]), "{m}");
    assert!(m["page"].as_i64().unwrap() <= 0, "{m}");

    // The measurement itself can fail: a table wider than the page is seen.
    let too_wide = dir.join("wide.html");
    let cells: String = (0..60).map(|i| format!("<td>column{i}</td>")).collect();
    std::fs::write(
        &too_wide,
        format!(
            "<!DOCTYPE html><html><body><table class=\"t\"><tr>{cells}</tr></table></body></html>"
        ),
    )
    .unwrap();
    let m = measured(&exe, &too_wide, 1400);
    assert!(m["page"].as_i64().unwrap() > 0, "{m}");
}

/// Scaling with ranks is drawn across runs of one matrix size only: a line from a 2-rank
/// N=3000 run to a 4-rank N=48768 run would show problem size as scaling.
#[test]
fn hpl_scaling_joins_only_runs_of_one_n() {
    let dir = tmpdir("hpl-scaling-n");
    let mut names = Vec::new();
    for (f, n) in [
        ("hpl-1-ranks", 2000),
        ("hpl-2-ranks", 3000),
        ("hpl-4-ranks", 2000),
    ] {
        let mut v = fixture(&format!("hpl/{f}.json"));
        v["results"]["runs"][0]["n"] = n.into();
        let p = dir.join(format!("{f}.json"));
        write_json(&p, &v);
        names.push(p);
    }
    let report = |files: &[PathBuf]| -> String {
        let inputs: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
        report_page(&inputs, &dir.join("r.html"))
    };
    let html = report(&names);
    let fig = html
        .split("<figure class=\"chart\"")
        .find(|f| f.contains("Gflops vs number of ranks"))
        .expect("1 and 4 ranks at N=2000 make a scaling chart");
    let series = fig
        .split("data-series=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    assert!(
        series.contains("N=2000") && !series.contains("N=3000"),
        "{series}"
    );
    // No two runs of one N: no scaling chart.
    let html = report(&names[..2]);
    assert!(
        !html.contains("Gflops vs number of ranks"),
        "a line across N"
    );
}

/// History and compare join only runs of one configuration: a 128-token decode is not the
/// next point of an 8-token one.
#[test]
fn decode_history_joins_only_runs_of_one_configuration() {
    let dir = tmpdir("decode-history-config");
    let base = fixture("decode/decode-smollm2-pp2.json");
    let at = |v: &mut Value, t: &str| {
        v["started_at"] = t.into();
        v["finished_at"] = t.into();
    };
    let mut a = base.clone();
    at(&mut a, "2026-12-01T10:00:00Z");
    let mut b = base.clone();
    at(&mut b, "2026-12-01T11:00:00Z");
    b["params"]["max_tokens"] = 128.into();
    write_json(&dir.join("a.json"), &a);
    write_json(&dir.join("b.json"), &b);
    let history = |dir: &Path| -> Vec<Value> {
        let json = dir.join("s.json");
        let o = run(
            &[
                "report",
                dir.to_str().unwrap(),
                "-o",
                dir.join("r.html").to_str().unwrap(),
                "--json",
                json.to_str().unwrap(),
            ],
            LIMIT,
        );
        assert!(o.status.success(), "{}", text(&o.stderr));
        read_json(&json)["history"].as_array().unwrap().clone()
    };
    assert!(history(&dir).is_empty(), "8 and 128 tokens joined");
    let mut c = a.clone();
    at(&mut c, "2026-12-01T12:00:00Z");
    write_json(&dir.join("c.json"), &c);
    let h = history(&dir);
    assert!(
        !h.is_empty(),
        "two runs of one configuration make a history"
    );
    assert!(h.iter().all(|x| x["points"].as_array().unwrap().len() == 2));
}

/// Collectives on 2 and on 4 ranks of one network are two series, each named with its rank
/// count: the newer does not hide the other, and the two are never read as one.
#[test]
fn coll_runs_of_different_rank_counts_stay_apart() {
    let dir = tmpdir("coll-ranks");
    let two = fixture("coll/coll-shm-2.json");
    let mut four = two.clone();
    four["ranks"] = serde_json::json!(["vm", "vm", "vm", "vm"]);
    four["results"]["ranks"] = 4.into();
    four["started_at"] = "2030-01-01T00:00:00Z".into();
    write_json(&dir.join("two.json"), &two);
    write_json(&dir.join("four.json"), &four);
    let page = report_page(&[&dir], &dir.join("r.html"));
    let label = two["network"]["label"].as_str().unwrap();
    for n in [2, 4] {
        assert!(
            page.contains(&format!("{label}, {n} ranks")),
            "no series for {n} ranks"
        );
    }
}

/// A link run over the cables of a 4-ring: the topology section draws the four cables with
/// their measured figures, the two diagonals dashed, and the heat maps mark them; the JSON
/// summary carries the same edges. Runs on one network with two ranks get no section.
#[test]
fn a_cabled_run_is_drawn_as_its_topology() {
    let dir = tmpdir("report-topology");
    let html_path = dir.join("r.html");
    let json_path = dir.join("s.json");
    let o = run(
        &[
            "report",
            cabled_fixture().to_str().unwrap(),
            "-o",
            html_path.to_str().unwrap(),
            "--json",
            json_path.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let html = std::fs::read_to_string(&html_path).unwrap();
    let section = html
        .split("<section id=\"topology\">")
        .nth(1)
        .and_then(|s| s.split("</section>").next())
        .expect("a topology section");
    let run = read_json(&cabled_fixture());
    let pairs = run["results"]["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 4);
    for p in pairs {
        let g = p["best_gbit_per_s"].as_f64().unwrap();
        let l = p["latency_p50_us"].as_f64().unwrap();
        assert!(
            section.contains(&format!("{g:.2} Gb/s · {l:.1} µs")),
            "pair {} not labelled",
            p["ranks"]
        );
    }
    assert_eq!(
        section.matches("stroke-dasharray").count(),
        2,
        "two diagonals"
    );
    assert_eq!(
        section.matches("title=\"no cable\"").count(),
        8,
        "2 maps × 4 cells"
    );
    let summary = read_json(&json_path);
    let t = &summary["sections"]["topology"]["tcp/links (virtual)"];
    assert_eq!(t["edges"].as_array().unwrap().len(), 4, "{t}");
    assert_eq!(t["unlinked"], serde_json::json!([[0, 2], [1, 3]]));
    assert_eq!(t["shape"], "ring");

    // Two ranks on one network: no topology to draw.
    let plain = report_page(
        &[&fixtures().join("network/link-tcp-loopback.json")],
        &dir.join("plain.html"),
    );
    assert!(!plain.contains("id=\"topology\""));
}
