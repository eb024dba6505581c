//! `tbbench link` end to end: real rank processes, real sockets and shared memory, real files.

#[path = "../../../runners/tests/support.rs"]
mod support;

use serde_json::Value;
use std::time::Duration;
use support::*;

fn result(path: &std::path::Path) -> Value {
    let raw = std::fs::read_to_string(path).unwrap();
    assert!(
        raw.trim_start().starts_with("{\n  \"schema_version\""),
        "schema_version must come first:\n{}",
        &raw[..200.min(raw.len())]
    );
    serde_json::from_str(&raw).unwrap()
}

#[test]
fn two_ranks_over_tcp_write_a_complete_result_file() {
    let dir = tmpdir("tcp2");
    let out = dir.join("r.json");
    let o = run(
        &[
            "link",
            "--nodes",
            "2",
            "--sizes",
            "64,64k",
            "--iters",
            "30",
            "--out",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let stdout = text(&o.stdout);
    assert!(
        stdout.contains("t_typical") && stdout.contains("peak Gb/s"),
        "{stdout}"
    );
    let r = result(&out);
    for key in [
        "schema_version",
        "suite",
        "tool",
        "started_at",
        "params",
        "hosts",
        "network",
        "results",
        "verification",
        "warnings",
    ] {
        assert!(r.get(key).is_some(), "missing {key}");
    }
    assert_eq!(r["suite"], "link");
    assert_eq!(r["tool"]["name"], "tbbench");
    assert_eq!(r["network"]["transport"], "tcp");
    assert_eq!(r["network"]["link_kind"], "loopback");
    assert_eq!(r["network"]["interface"], "lo");
    assert_eq!(r["params"]["nodes"], 2);
    assert_eq!(r["params"]["window"], 64, "defaults are recorded too");
    assert_eq!(r["hosts"][0]["ranks"], serde_json::json!([0, 1]));
    let lat = r["results"]["latency"].as_array().unwrap();
    assert_eq!(lat.len(), 2);
    assert_eq!(lat[0]["size_bytes"], 64);
    assert_eq!(lat[1]["size_bytes"], 65536);
    for row in lat {
        let s = &row["one_way_us"];
        let (min, med, max) = (
            s["min"].as_f64().unwrap(),
            s["median"].as_f64().unwrap(),
            s["max"].as_f64().unwrap(),
        );
        assert!(min > 0.0 && min <= med && med <= max, "{s}");
        assert!(
            s["p99"].as_f64().unwrap() <= max
                && s["p999"].is_number()
                && s["stdev"].is_number()
                && s["mean"].is_number()
        );
        assert_eq!(row["samples_ns"].as_array().unwrap().len(), 30);
        assert_eq!(row["wrong_bytes"], 0);
    }
    let bw = r["results"]["bandwidth"].as_array().unwrap();
    let modes: Vec<&str> = bw.iter().map(|b| b["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["bw", "bw", "bibw", "bibw"]);
    for row in bw {
        let g = row["gbit_per_s"]["avg"].as_f64().unwrap();
        let gib = row["gib_per_s"]["avg"].as_f64().unwrap();
        assert!(g > 0.0 && row["gbit_per_s"]["peak"].as_f64().unwrap() >= g);
        // Gbit/s is 10^9 bit/s and GiB/s is 2^30 byte/s: the two must agree.
        assert!(
            (gib - g * 1e9 / 8.0 / 1073741824.0).abs() < 1e-9 * g.max(1.0),
            "{row}"
        );
        assert!(
            row.get("percent_of_ceiling").is_none(),
            "loopback has no ceiling unless given"
        );
    }
    assert_eq!(r["verification"]["passed"], true);
    assert_eq!(r["verification"]["checks"][0]["name"], "payload");
}

#[test]
fn ceiling_flag_gives_percent_of_ceiling() {
    let dir = tmpdir("ceil");
    let out = dir.join("r.json");
    let o = run(
        &[
            "link",
            "--buffer",
            "1MiB",
            "--mode",
            "bw",
            "--iters",
            "5",
            "--ceiling",
            "80Gbit",
            "--out",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r = result(&out);
    assert_eq!(r["results"]["ceiling_gbit_per_s"], 80.0);
    assert_eq!(r["results"]["ceiling_source"], "flag");
    let row = &r["results"]["bandwidth"][0];
    let pct = row["percent_of_ceiling"]["avg"].as_f64().unwrap();
    let g = row["gbit_per_s"]["avg"].as_f64().unwrap();
    assert!((pct - 100.0 * g / 80.0).abs() < 1e-6);
    assert!(
        r["results"]["latency"].as_array().unwrap().is_empty(),
        "--mode bw measures bandwidth only"
    );
}

#[test]
fn four_ranks_over_shm_measure_every_pair() {
    let dir = tmpdir("shm4");
    let out = dir.join("r.json");
    let o = run(
        &[
            "link",
            "--nodes",
            "4",
            "--transport",
            "shm",
            "--sizes",
            "64,1MiB",
            "--iters",
            "20",
            "--out",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r = result(&out);
    assert_eq!(r["network"]["transport"], "shm");
    assert_eq!(r["network"]["link_kind"], "shm");
    let pairs: Vec<Value> = r["results"]["latency"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["pair"].clone())
        .collect();
    // Every pair, each at both sizes, in order; rows of pairs rank 0 is not in reach it too.
    let every: Vec<Value> = [[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]]
        .iter()
        .flat_map(|p| [serde_json::json!(p), serde_json::json!(p)])
        .collect();
    assert_eq!(pairs, every);
    let summary = r["results"]["pairs"].as_array().unwrap();
    assert_eq!(summary.len(), 6);
    assert!(summary
        .iter()
        .all(|p| p["latency_p50_us"].as_f64().unwrap() > 0.0
            && p["best_gbit_per_s"].as_f64().unwrap() > 0.0));
    let c = &r["results"]["concurrent"];
    assert_eq!(
        (c["directions"].as_u64(), c["wrong_bytes"].as_u64()),
        (Some(12), Some(0))
    );
    assert!(c["aggregate_gbit_per_s"].as_f64().unwrap() > 0.0);
    let stdout = text(&o.stdout);
    assert!(
        stdout.contains("rank 2 <-> rank 3")
            && stdout.contains("# best bandwidth (bw, average), Gbit/s"),
        "{stdout}"
    );
    assert_eq!(r["verification"]["passed"], true);
    // 4 ranks on a 2-core machine is oversubscribed, and the file must say so.
    let cores = std::thread::available_parallelism().unwrap().get();
    let warned = r["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|w| w.as_str().unwrap().contains("oversubscribed"));
    assert_eq!(warned, cores < 4, "{}", r["warnings"]);
    let leftovers: Vec<_> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("tbbench-"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "shared-memory segments left behind: {leftovers:?}"
    );
}

#[test]
fn four_ranks_over_tcp_with_two_streams() {
    let dir = tmpdir("tcp4");
    let out = dir.join("r.json");
    let o = run(
        &[
            "link",
            "--nodes",
            "4",
            "--streams",
            "2",
            "--sizes",
            "512k,4MiB",
            "--mode",
            "bibw",
            "--iters",
            "5",
            "--window",
            "8",
            "--addr",
            "127.0.0.1",
            "--out",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r = result(&out);
    assert_eq!(r["network"]["streams"], 2);
    assert!(
        r["network"]["streams_auto"].is_null(),
        "asked for, not chosen"
    );
    // Six pairs, two sizes each.
    assert_eq!(r["results"]["bandwidth"].as_array().unwrap().len(), 12);
    assert_eq!(
        r["verification"]["passed"], true,
        "striped messages must arrive intact"
    );
}

#[test]
fn iface_flag_binds_to_that_interface() {
    let dir = tmpdir("iface");
    let out = dir.join("r.json");
    let o = run(
        &[
            "link",
            "--iface",
            "lo",
            "--buffer",
            "4k",
            "--iters",
            "10",
            "--mode",
            "latency",
            "--out",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r = result(&out);
    assert_eq!(r["network"]["interface"], "lo");
    assert_eq!(
        r["network"]["addresses"],
        serde_json::json!(["127.0.0.1", "127.0.0.1"])
    );
    let o = run(
        &[
            "link",
            "--iface",
            "nope0",
            "--buffer",
            "4k",
            "--out",
            dir.join("x.json").to_str().unwrap(),
        ],
        Duration::from_secs(30),
    );
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(err.contains("nope0") && err.lines().count() == 1, "{err}");
    assert!(!dir.join("x.json").exists());
}

/// One network is `--over` with one entry: the same run, one result file where `--out` says,
/// no side-by-side table.
#[test]
fn over_with_one_network_is_the_plain_run_on_it() {
    let dir = tmpdir("over-one");
    let out = dir.join("r.json");
    let o = run(
        &[
            "link",
            "--over",
            "tcp:lo",
            "--buffer",
            "4k",
            "--iters",
            "10",
            "--mode",
            "latency",
            "--out",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let stdout = text(&o.stdout);
    assert!(!stdout.contains("side by side"), "{stdout}");
    let r = result(&out);
    assert_eq!(r["network"]["interface"], "lo");
    assert_eq!(r["network"]["label"], "tcp/lo (loopback)");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
}

#[test]
fn nonsense_sizes_get_one_line_errors_and_no_file() {
    let dir = tmpdir("badsize");
    for bad in ["abc", "0", "-1", "1.5.3MiB", "12XB"] {
        let out = dir.join("r.json");
        let o = run(
            &["link", "--buffer", bad, "--out", out.to_str().unwrap()],
            Duration::from_secs(10),
        );
        assert_eq!(o.status.code(), Some(2), "{bad}");
        let err = text(&o.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{bad}: {err}");
        assert!(err.contains("bad size"), "{bad}: {err}");
        assert!(!out.exists());
    }
    let o = run(&["link", "--mode", "sideways"], Duration::from_secs(10));
    assert!(text(&o.stderr).contains("unknown mode 'sideways'"));
    let o = run(
        &["link", "--transport", "carrier-pigeon"],
        Duration::from_secs(10),
    );
    assert!(text(&o.stderr).contains("unknown transport"));
}

#[test]
fn one_rank_is_refused_with_a_clear_line() {
    let o = run(
        &["link", "--nodes", "1", "--buffer", "64"],
        Duration::from_secs(30),
    );
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("at least 2 ranks"),
        "{}",
        text(&o.stderr)
    );
}

/// The congestion control shapes TCP's figures (BBR paces even loopback), so `--congestion`
/// sets it on every data connection and the result names the one that ran, asked or not; with
/// no `--streams` link opens one connection per peer, as iperf3 does, even where that one
/// paces every segment (collectives open two there: coll's tests), and says it chose.
#[cfg(target_os = "linux")]
#[test]
fn congestion_flag_sets_the_data_connections_and_the_result_names_it() {
    let dir = tmpdir("congestion");
    let out = dir.join("r.json");
    let system = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control").unwrap();
    // reno is built into every Linux kernel, and root (or the default allowed list) may set it.
    // bbr, which paces every segment, where this kernel has it.
    for (asked, expect) in [
        (None, system.trim()),
        (Some("reno"), "reno"),
        (Some("bbr"), "bbr"),
    ] {
        let mut args = vec![
            "link",
            // 64 KiB, and a size that ends partway into a 120 KiB slice.
            "--sizes",
            "64k,1000003",
            "--mode",
            "bw",
            "--iters",
            "5",
            "--out",
            out.to_str().unwrap(),
        ];
        if let Some(cc) = asked {
            args.extend(["--congestion", cc]);
        }
        let o = run(&args, Duration::from_secs(60));
        if asked == Some("bbr") && text(&o.stderr).contains("--congestion bbr: not") {
            skipped(&format!(
                "bbr cannot be set here: {}",
                text(&o.stderr).trim()
            ));
            continue;
        }
        assert!(o.status.success(), "{asked:?}: {}", text(&o.stderr));
        let r = result(&out);
        // Every message whole, whatever the congestion control cut its writes into.
        assert_eq!(
            r["verification"]["passed"], true,
            "{asked:?}: {}",
            r["verification"]
        );
        let net = &r["network"];
        assert_eq!(net["congestion"], expect, "{asked:?}");
        // One connection whatever the congestion control, as iperf3 measures.
        let streams = 1;
        assert_eq!(net["streams"], streams, "{asked:?}");
        assert_eq!(net["streams_auto"], true, "{asked:?}");
        let first = text(&o.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .to_string();
        assert!(
            first.contains(&format!(
                "congestion control {expect}, {streams} connection"
            )),
            "{first}"
        );
        std::fs::remove_file(&out).unwrap();
    }
    let o = run(
        &[
            "link",
            "--congestion",
            "no-such-cc",
            "--sizes",
            "64k",
            "--out",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("--congestion no-such-cc") && err.contains("available"),
        "{err}"
    );
    assert!(!out.exists());
}

/// TCP's own flags on a run with no TCP connection are a mistake, not something to ignore.
#[test]
fn tcp_flags_on_a_run_without_tcp_are_refused_in_one_line() {
    let dir = tmpdir("tcpflags");
    let out = dir.join("r.json");
    for (flags, named) in [
        (&["--sockbuf", "1MiB"][..], "--sockbuf applies"),
        (
            &["--streams", "2", "--congestion", "reno"][..],
            "--streams and --congestion apply",
        ),
    ] {
        let mut args = vec![
            "link",
            "-t",
            "shm",
            "--sizes",
            "64",
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(flags);
        let o = run(&args, Duration::from_secs(30));
        assert_eq!(o.status.code(), Some(2), "{flags:?}: {}", text(&o.stderr));
        let err = text(&o.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(
            err.contains(named) && err.contains("it uses shm"),
            "{flags:?}: {err}"
        );
        assert!(!out.exists());
    }
}

/// Runs started in the same second each keep their result: the time-stamped name of the
/// second and third takes `-2`, `-3`, and each says which it wrote.
#[test]
fn runs_in_the_same_second_write_a_file_each() {
    let dir = tmpdir("same-second");
    let mut said = Vec::new();
    for _ in 0..3 {
        let o = std::process::Command::new(bin())
            .args([
                "link", "--nodes", "2", "--sizes", "8", "--iters", "3", "--mode", "latency",
            ])
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o.stderr));
        let line = text(&o.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("result: ").map(str::to_string))
            .unwrap();
        said.push(line);
    }
    let files = std::fs::read_dir(dir.join("results")).unwrap().count();
    assert_eq!(files, 3, "{said:?}");
    said.sort();
    said.dedup();
    assert_eq!(said.len(), 3, "each run names its own file: {said:?}");
    for s in &said {
        assert_eq!(read_json(&dir.join(s))["suite"], "link");
    }
}

/// Two busy loops beside the run: the result (and the terminal) warn that other processes
/// took a share of the host's CPU, naming the busiest.
#[test]
fn a_run_beside_busy_processes_says_so() {
    let hogs: Vec<std::process::Child> = (0..2)
        .map(|_| {
            std::process::Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .unwrap()
        })
        .collect();
    let dir = tmpdir("busy");
    let out = dir.join("r.json");
    let o = run(
        &[
            "link",
            "--sizes",
            "8,64k",
            "--iters",
            "200",
            "--mode",
            "latency",
            "--out",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    for mut h in hogs {
        let _ = h.kill();
        let _ = h.wait();
    }
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r = read_json(&out);
    let busy: Vec<&str> = r["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w.as_str())
        .filter(|w| w.starts_with("busy host"))
        .collect();
    assert_eq!(busy.len(), 1, "{}", r["warnings"]);
    // The busiest is named (a loop here, unless another test's process took more).
    assert!(busy[0].contains(", the busiest "), "{busy:?}");
    assert!(text(&o.stderr).contains("busy host"), "{}", text(&o.stderr));
}

/// Without --iters the sweep fits --max-minutes: each size's iterations come from the rate
/// its warm-up measured, never past the fixed defaults nor under two, and the result records
/// the budget and what the sweep took. --iters fixes them instead (and cannot be given with
/// a budget); a budget of no time is refused in one line.
#[test]
fn the_sweep_fits_its_time_budget_unless_iters_fix_it() {
    let dir = tmpdir("link-budget");
    let out = dir.join("r.json");
    let o = run(
        &[
            "link",
            "--nodes",
            "2",
            "--sizes",
            "4,64k,4MiB",
            "--mode",
            "latency,bw",
            "--max-minutes",
            "0.05",
            "--out",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("iterations per size chosen to fit --max-minutes 0.05"),
        "{}",
        text(&o.stdout)
    );
    let r = result(&out);
    let budget = &r["results"]["time_budget"];
    assert_eq!(budget["max_minutes"], 0.05);
    assert!(budget["sweep_s"].as_f64().unwrap() > 0.0);
    // Fixed defaults: 1000 ping-pongs up to 256 KiB, then fewer; bw 100 at most.
    for (rows, most) in [("latency", 1000), ("bandwidth", 100)] {
        for row in r["results"][rows].as_array().unwrap() {
            let iters = row["iters"].as_u64().unwrap();
            assert!((2..=most).contains(&iters), "{row}");
            assert!(row["warmup"].as_u64().unwrap() >= 1, "{row}");
        }
    }
    // --iters fixes them: no budget recorded.
    let o = run(
        &[
            "link",
            "--nodes",
            "2",
            "--sizes",
            "64",
            "--iters",
            "7",
            "--out",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r = result(&out);
    assert!(r["results"].get("time_budget").is_none());
    assert_eq!(r["results"]["latency"][0]["iters"], 7);
    for (args, want) in [
        (
            &["--iters", "7", "--max-minutes", "1"][..],
            "cannot be used with",
        ),
        (&["--max-minutes", "0"][..], "give more than 0"),
    ] {
        let mut all = vec!["link", "--nodes", "2"];
        all.extend(args);
        let o = run(&all, Duration::from_secs(10));
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(
            text(&o.stderr).contains(want),
            "{args:?}: {}",
            text(&o.stderr)
        );
    }
}
