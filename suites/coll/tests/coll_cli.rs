//! `tbbench coll` end to end: real rank processes over real sockets and shared memory, every
//! output element checked by the ranks themselves, real result and CSV files, real bad input.

#[path = "../../../runners/tests/support.rs"]
mod support;

use serde_json::Value;
use std::time::Duration;
use support::*;

fn coll(args: &[&str], out: &std::path::Path) -> (std::process::Output, Value) {
    let mut all = vec!["coll", "--out", out.to_str().unwrap()];
    all.extend_from_slice(args);
    let o = run(&all, Duration::from_secs(120));
    assert!(
        o.status.success(),
        "{all:?}: {}\n{}",
        text(&o.stderr),
        text(&o.stdout)
    );
    let r = read_json(out);
    (o, r)
}

/// Every op by every algorithm it has, in every dtype, on 1 to 5 ranks over tcp and shm, in
/// and out of place, at sizes whose counts do not divide by the ranks: every element right.
#[test]
fn every_op_algorithm_and_dtype_is_exact_on_one_to_five_ranks() {
    let dir = tmpdir("coll-matrix");
    let mut failures = Vec::new();
    for nodes in 1..=5usize {
        for transport in ["tcp", "shm"] {
            for (d, dtype) in ["f32", "f64", "f16", "bf16"].iter().enumerate() {
                // In and out of place alternate over the dtypes, the other way round on the
                // other transport, so both placements meet every dtype and rank count.
                let in_place = (d + nodes + (transport == "shm") as usize).is_multiple_of(2);
                let out = dir.join(format!("{nodes}-{transport}-{dtype}-{in_place}.json"));
                let n = nodes.to_string();
                let mut args = vec![
                    "--nodes",
                    &n,
                    "-t",
                    transport,
                    "--op",
                    "all,ping-pong",
                    "--algo",
                    "all,auto",
                    "--dtype",
                    dtype,
                    "--sizes",
                    "8,1000,70004",
                    "--iters",
                    "2",
                    "--warmup",
                    "1",
                    "--root",
                    "0",
                ];
                if in_place {
                    args.push("--in-place");
                }
                let (_, r) = coll(&args, &out);
                let rows = r["results"]["rows"].as_array().unwrap();
                // Every algorithm of the 6 ops and the ping-pong and auto for each at the
                // largest size at least; reduce-scatter and all-gather have no rd on 3 and 5
                // ranks.
                let per_size = if nodes.is_power_of_two() { 26 } else { 24 };
                assert!(
                    rows.len() >= per_size,
                    "{nodes} ranks {transport} {dtype}: {} rows",
                    rows.len()
                );
                for row in rows {
                    assert_eq!(row["dtype"], *dtype);
                    assert_eq!(row["in_place"], in_place);
                    if row["wrong"] != 0 {
                        failures.push(format!("{nodes} ranks {transport} {dtype}: {row}"));
                    }
                }
                assert_eq!(r["verification"]["passed"], true, "{}", r["verification"]);
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Where the congestion control paces every segment (bbr) each send syscall moves a fixed
/// slice, one-way messages too; under cubic one-way messages go whole. Of the two connections
/// a run opens under bbr, broadcast and reduce send each message on one while the other ops
/// stripe it over both; with `--conns` given every op stripes. Messages that end partway into
/// a slice, on every op and algorithm, still arrive whole and in order.
#[cfg(target_os = "linux")]
#[test]
fn paced_and_unpaced_connections_carry_every_op_exactly() {
    let dir = tmpdir("coll-paced");
    for (cc, conns) in [("cubic", None), ("bbr", None), ("bbr", Some(3))] {
        let out = dir.join(format!("{cc}-{conns:?}.json"));
        let mut all = vec!["coll", "--out", out.to_str().unwrap()];
        all.extend_from_slice(&[
            "--nodes",
            "3",
            "-t",
            "tcp",
            "--congestion",
            cc,
            "--op",
            "all",
            "--algo",
            "all",
            // Not a whole number of 120 KiB slices, nor of 64 KiB.
            "--sizes",
            "70004,1000008",
            "--iters",
            "2",
            "--warmup",
            "1",
        ]);
        let asked = conns.map(|k: usize| k.to_string());
        if let Some(k) = &asked {
            all.extend_from_slice(&["--conns", k]);
        }
        let o = run(&all, Duration::from_secs(120));
        let err = text(&o.stderr);
        if !o.status.success() && err.contains(&format!("--congestion {cc}: not")) {
            skipped(&format!("{cc} cannot be set here: {}", err.trim()));
            continue;
        }
        assert!(o.status.success(), "{cc}: {err}");
        let r = read_json(&out);
        assert_eq!(r["network"]["congestion"], cc);
        // Left to the run: two connections per pair where bbr paces each, one under cubic.
        let streams = conns.unwrap_or(if cc == "bbr" { 2 } else { 1 });
        assert_eq!(r["network"]["streams"], streams, "{cc}");
        // Written only where the run chose.
        let chosen = r["network"]["streams_auto"].as_bool().unwrap_or(false);
        assert_eq!(chosen, conns.is_none(), "{cc}");
        let rows = r["results"]["rows"].as_array().unwrap();
        assert!(rows.len() >= 2 * 15, "{cc}: {} rows", rows.len());
        for row in rows {
            assert_eq!(row["wrong"], 0, "{cc}: {row}");
        }
        assert_eq!(r["verification"]["passed"], true, "{}", r["verification"]);
    }
}

/// Over tcp a reduction step receives and adds its message in 1 MiB segments: messages of
/// several segments that do not divide evenly (pieces differing by an element, f32 and
/// 2-byte elements, folded ranks in halving-doubling) still give every element right.
#[test]
fn reductions_received_in_segments_are_exact() {
    let dir = tmpdir("coll-segments");
    for (nodes, dtype) in [("2", "f16"), ("3", "f32"), ("5", "bf16"), ("5", "f32")] {
        let out = dir.join(format!("{nodes}-{dtype}.json"));
        let (_, r) = coll(
            &[
                "--nodes",
                nodes,
                "--op",
                "all-reduce,reduce-scatter",
                "--algo",
                "ring,rd",
                "--dtype",
                dtype,
                // 5 MiB + 12 bytes: 1 to 5 segments per message, never a whole number.
                "--sizes",
                "5242892",
                "--iters",
                "2",
                "--warmup",
                "1",
            ],
            &out,
        );
        let rows = r["results"]["rows"].as_array().unwrap();
        assert!(rows.len() >= 3, "{nodes} ranks {dtype}: {rows:?}");
        for row in rows {
            assert_eq!(row["wrong"], 0, "{nodes} ranks {dtype}: {row}");
        }
        assert_eq!(r["verification"]["passed"], true, "{}", r["verification"]);
    }
}

/// The result keys users read, nccl-tests' bandwidth factors, auto's record, the table's
/// columns, and the CSV.
#[test]
fn result_rows_carry_nccl_tests_figures_and_the_winners() {
    let dir = tmpdir("coll-keys");
    let out = dir.join("r.json");
    let csv = dir.join("rows.csv");
    let (o, r) = coll(
        &[
            "--nodes",
            "3",
            "--op",
            "all-reduce,all-gather,broadcast",
            "--algo",
            "ring,mesh,auto",
            "--sizes",
            "8,64k,3MiB",
            // Every peer's messages striped over two connections from 256 KiB up.
            "--conns",
            "2",
            "--iters",
            "5",
            "--csv",
            csv.to_str().unwrap(),
        ],
        &out,
    );
    let stdout = text(&o.stdout);
    for col in [
        "size", "count", "type", "redop", "root", "time(us)", "algbw", "busbw", "#wrong",
    ] {
        assert!(stdout.contains(col), "column {col} missing:\n{stdout}");
    }
    assert!(stdout.contains("# fastest:"), "{stdout}");
    assert_eq!(r["suite"], "coll");
    assert_eq!(r["params"]["dtype"], "f32");
    assert_eq!(
        r["params"]["algos"],
        serde_json::json!(["ring", "mesh", "auto"])
    );
    let res = &r["results"];
    assert_eq!(res["ranks"], 3);
    let rows = res["rows"].as_array().unwrap();
    for row in rows {
        for key in [
            "op",
            "algo",
            "dtype",
            "size_bytes",
            "count",
            "time_us",
            "algbw_gbps",
            "busbw_gbps",
            "wrong",
        ] {
            assert!(row.get(key).is_some(), "row lacks {key}: {row}");
        }
        let t = &row["time_us"];
        assert!(
            t["median"].as_f64().unwrap() > 0.0
                && t["p99"].as_f64().unwrap() >= t["median"].as_f64().unwrap()
        );
        let (alg, bus) = (
            row["algbw_gbps"].as_f64().unwrap(),
            row["busbw_gbps"].as_f64().unwrap(),
        );
        let factor = match row["op"].as_str().unwrap() {
            "all-reduce" => 2.0 * 2.0 / 3.0,
            "all-gather" => 2.0 / 3.0,
            "broadcast" => 1.0,
            other => panic!("unexpected op {other}"),
        };
        assert!((bus - alg * factor).abs() <= 1e-9 * alg.max(1.0), "{row}");
        let algbw = row["size_bytes"].as_f64().unwrap() / (t["median"].as_f64().unwrap() * 1e3);
        assert!((alg - algbw).abs() <= 1e-9 * algbw.max(1.0), "{row}");
        // auto names what it ran.
        if row["requested"] == "auto" {
            assert_ne!(row["algo"], "auto", "{row}");
        }
    }
    // all-gather's size is the whole array: 64 KiB over 3 ranks is 5461 f32 per rank.
    let ag = rows
        .iter()
        .find(|r| r["op"] == "all-gather" && r["count"] == 5461)
        .expect("all-gather of 64 KiB");
    assert_eq!(ag["size_bytes"], 5461 * 3 * 4);
    // Best: one per op and size, the fastest there.
    let best = res["best"].as_array().unwrap();
    for b in best {
        let fastest = rows
            .iter()
            .filter(|r| r["op"] == b["op"] && r["size_bytes"] == b["size_bytes"])
            .map(|r| r["time_us"]["median"].as_f64().unwrap())
            .fold(f64::MAX, f64::min);
        assert_eq!(b["time_us"].as_f64().unwrap(), fastest, "{b}");
    }
    // 3 ops at 3 sizes, less all-gather at 8 B (no whole f32 per rank on 3 ranks).
    assert_eq!(best.len(), 8, "{best:?}");
    assert_eq!(r["network"]["streams"], 2);
    // auto's probe is recorded with a winner per probed size: every size of every op, but
    // all-gather's 8 B (nothing to time), whose gap the probe steps over.
    let tuning = res["tuning"].as_array().unwrap();
    // Each names the model's choice, and follows it unless another ran more than 5% faster.
    for p in tuning {
        let t = |a: &str| p["time_us"][a].as_f64();
        let fastest = p["time_us"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::MAX, f64::min);
        let (winner, model) = (p["winner"].as_str().unwrap(), p["model"].as_str().unwrap());
        match t(model) {
            Some(m) if m <= fastest * 1.05 => assert_eq!(winner, model, "{p}"),
            _ => assert_eq!(t(winner), Some(fastest), "{p}"),
        }
    }
    let probed: Vec<(String, u64)> = tuning
        .iter()
        .map(|p| {
            (
                p["op"].as_str().unwrap().to_string(),
                p["size_bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    for op in ["all-reduce", "all-gather", "broadcast"] {
        for size in [8u64, 64 << 10, 3 << 20] {
            let expected = !(op == "all-gather" && size == 8);
            assert_eq!(
                probed.contains(&(op.to_string(), size)),
                expected,
                "{op} {size}: {probed:?}"
            );
        }
    }
    // Each size is probed just before its rows, and the line saying so follows the op's rows.
    assert!(stdout.contains("# auto: probed 64KiB "), "{stdout}");
    let csv_text = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(csv_text.lines().count(), rows.len() + 1, "{csv_text}");
    assert!(csv_text.starts_with("impl,op,algo,"));
}

/// `auto` follows, at every size, the winner of the probed size nearest on a log scale (the
/// smaller on a tie), probing as the sweep goes: sizes where nothing can run (an 8-byte
/// all-gather on 3 ranks has no whole f32 per rank) are stepped over, so the 12 B row follows
/// the 32 B probe rather than a fallback.
#[test]
fn auto_rows_follow_the_nearest_probe_that_ran() {
    let dir = tmpdir("coll-auto");
    let out = dir.join("r.json");
    let (_, r) = coll(
        &[
            "--nodes",
            "3",
            "--op",
            "all-gather",
            "--sizes",
            "8B..16KiB",
            "--iters",
            "3",
            "--warmup",
            "1",
        ],
        &out,
    );
    let res = &r["results"];
    let probes: Vec<(f64, &str)> = res["tuning"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["size_bytes"].as_f64().unwrap(),
                p["winner"].as_str().unwrap(),
            )
        })
        .collect();
    assert!(
        !probes.iter().any(|p| p.0 == 8.0),
        "8 B has nothing to time: {probes:?}"
    );
    let rows = res["rows"].as_array().unwrap();
    assert!(rows.iter().any(|r| r["size_bytes"] == 12), "{rows:?}");
    for row in rows {
        let b = row["size_bytes"].as_f64().unwrap();
        let ratio = |s: f64| if s > b { s / b } else { b / s };
        let nearest = probes
            .iter()
            .min_by(|x, y| ratio(x.0).total_cmp(&ratio(y.0)))
            .unwrap();
        assert_eq!(row["algo"], nearest.1, "{b} B: {probes:?}");
    }
}

/// More ranks than CPUs: each rank is bound to one CPU, dealt round-robin, and the result says
/// so; launched inside a narrower CPU set (as mpirun's binding or taskset leave it), the ranks
/// keep the placement they were given.
#[test]
fn oversubscribed_ranks_are_bound_one_cpu_each_unless_already_placed() {
    let dir = tmpdir("coll-pin");
    let cpus = std::thread::available_parallelism().unwrap().get();
    let nodes = (cpus + 1).to_string();
    let args = |out: &std::path::Path| -> Vec<String> {
        [
            "coll", "--nodes", &nodes, "-t", "shm", "--sizes", "8", "--iters", "2", "--out",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([out.to_str().unwrap().to_string()])
        .collect()
    };
    let out = dir.join("free.json");
    let o = run(
        &args(&out).iter().map(String::as_str).collect::<Vec<_>>(),
        Duration::from_secs(120),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r = read_json(&out);
    let warnings = r["warnings"].to_string();
    assert!(warnings.contains("oversubscribed"), "{warnings}");
    let online = r["hosts"][0]["cores_logical"].as_u64().unwrap() as usize;
    if cpus == online {
        assert!(
            warnings.contains("bound one CPU each") && warnings.contains("rank 0 on CPU"),
            "{warnings}"
        );
    } else {
        // This test itself runs in a narrower set than the host's CPUs: already placed.
        assert!(!warnings.contains("bound one CPU each"), "{warnings}");
    }

    // The same run confined to one CPU by taskset (the first this test may use): that
    // placement stands.
    let out = dir.join("taskset.json");
    let o = on_one_cpu(&args(&out));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let warnings = read_json(&out)["warnings"].to_string();
    assert!(warnings.contains("oversubscribed"), "{warnings}");
    assert!(!warnings.contains("bound one CPU each"), "{warnings}");
}

/// Runs tbbench with `args` confined by taskset to the first CPU this test may use, so that
/// two ranks are more than the CPUs it has (Linux).
fn on_one_cpu<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> std::process::Output {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let first_cpu: String = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let child = std::process::Command::new("taskset")
        .args(["-c", &first_cpu, bin()])
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("taskset runs");
    finish(child, Duration::from_secs(120)).0
}

/// With more ranks than the host has cores, the tcp connections set fixed socket buffers
/// (512 KiB, or the kernel's limit where lower) rather than leave the OS's autotuning on; the
/// result and the header say so. `--sockbuf` given wins, and `--sockbuf 0` keeps autotuning.
/// With a core for each rank autotuning stays. Every row still exact.
#[cfg(target_os = "linux")]
#[test]
fn oversubscribed_tcp_ranks_use_fixed_socket_buffers_unless_told() {
    let dir = tmpdir("coll-sockbuf");
    let out = dir.join("free.json");
    let (_, r) = coll(
        &["--nodes", "2", "-t", "tcp", "--sizes", "8", "--iters", "2"],
        &out,
    );
    let cores = r["hosts"][0]["cores_logical"].as_u64().unwrap() as usize;
    if cores >= 2 {
        assert!(r["network"]["sockbuf_bytes"].is_null(), "{}", r["network"]);
    }
    if cores > 16 {
        skipped(&format!(
            "{} tcp ranks on this host's {cores} cores: too many",
            cores + 1
        ));
        return;
    }
    // What Linux grants: the size asked for, up to its limits.
    let limit = |name: &str| -> u64 {
        let path = format!("/proc/sys/net/core/{name}");
        std::fs::read_to_string(&path)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let granted = |asked: u64| asked.min(limit("wmem_max")).min(limit("rmem_max"));
    let nodes = (cores + 1).to_string();
    let cases = [
        (None, Some(granted(512 << 10))),
        (Some("0"), None),
        (Some("64KiB"), Some(granted(64 << 10))),
    ];
    for (asked, want) in cases {
        let out = dir.join(format!("{asked:?}.json"));
        let mut args = vec![
            "--nodes",
            &nodes,
            "-t",
            "tcp",
            "--op",
            "all-reduce,broadcast",
            "--sizes",
            "8,1MiB",
            "--iters",
            "2",
        ];
        if let Some(b) = asked {
            args.extend_from_slice(&["--sockbuf", b]);
        }
        let (o, r) = coll(&args, &out);
        let net = &r["network"];
        assert_eq!(net["sockbuf_bytes"].as_u64(), want, "{asked:?}: {net}");
        let auto = net["sockbuf_auto"].as_bool().unwrap_or(false);
        assert_eq!(auto, asked.is_none(), "{asked:?}: {net}");
        let header = text(&o.stdout);
        if let Some(b) = want {
            let size = if b % 1024 == 0 {
                format!("{} KiB", b >> 10)
            } else {
                format!("{b} B")
            };
            let why = if auto {
                " (auto: more ranks than cores)"
            } else {
                ""
            };
            let says = format!("socket buffers {size}{why}");
            assert!(header.contains(&says), "{asked:?}: no '{says}' in {header}");
        } else {
            assert!(!header.contains("socket buffers"), "{asked:?}: {header}");
        }
        for row in r["results"]["rows"].as_array().unwrap() {
            assert_eq!(row["wrong"], 0, "{asked:?}: {row}");
        }
    }
}

/// Mistakes a user can make end in one line naming the cause, before any rank starts where
/// the flags alone show it.
#[test]
fn bad_input_is_refused_in_one_line() {
    let dir = tmpdir("coll-bad");
    let out = dir.join("r.json");
    let cases: &[(&[&str], &str)] = &[
        (&["--op", "allreduse"], "unknown collective"),
        (&["--algo", "butterfly"], "unknown algorithm"),
        (&["--dtype", "int8"], "unknown dtype"),
        (&["--sizes", "0"], "at least 1 byte"),
        (&["-b", "1MiB", "-e", "8"], "larger than"),
        (&["--root", "5"], "--root 5"),
        (
            &["--nodes", "3", "--op", "reduce-scatter", "--algo", "rd"],
            "power-of-two",
        ),
        (
            &["--op", "all-to-all", "--algo", "tree"],
            "no tree algorithm",
        ),
        (&["--csv", "/dev/null"], "--csv"),
        (&["--sizes", "1TiB"], "largest power of two that fits"),
    ];
    for (args, want) in cases {
        let mut all = vec!["coll", "--out", out.to_str().unwrap()];
        all.extend_from_slice(args);
        let o = run(&all, Duration::from_secs(60));
        let err = text(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: wanted '{want}' in:\n{err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        // One error line (a warning such as oversubscription may come before it).
        let errors = err.lines().filter(|l| !l.contains("warning:")).count();
        assert_eq!(errors, 1, "{args:?}: not one line:\n{err}");
        assert!(!out.exists(), "{args:?} wrote a result");
    }
}

/// A rank killed in the middle of a long collective ends the run, on every rank, within ten
/// seconds, with no result file.
#[test]
fn killed_rank_mid_collective_ends_the_run_within_ten_seconds() {
    for transport in ["tcp", "shm"] {
        let dir = tmpdir(&format!("coll-kill-{transport}"));
        let out = dir.join("r.json");
        let child = spawn(&[
            "coll",
            "--nodes",
            "3",
            "-t",
            transport,
            "--algo",
            "ring",
            "--sizes",
            "4MiB",
            "--iters",
            "100000",
            "--out",
            out.to_str().unwrap(),
        ]);
        let launcher = child.id();
        let ranks = wait_for_ranks(launcher, 3, Duration::from_millis(1500));
        let victim = ranks.iter().find(|r| r.1 == 1).unwrap().0;
        let (o, took) = kill_and_finish(child, victim);
        assert!(
            took < Duration::from_secs(10),
            "{transport}: run took {took:?} to end"
        );
        assert!(!o.status.success());
        let err = text(&o.stderr);
        // One error line naming a rank: the killed one, or the survivor whose peer closed
        // on it first (which one a loaded host reports first varies).
        let errors: Vec<&str> = err.lines().filter(|l| l.contains("error:")).collect();
        assert_eq!(errors.len(), 1, "{transport}: {err}");
        assert!(errors[0].contains("rank "), "{transport}: {err}");
        assert!(!err.contains("panicked"), "{transport}: {err}");
        assert!(!out.exists(), "{transport}: a result was written");
        assert_ranks_gone(&ranks, Duration::from_secs(5), "a killed rank");
    }
}

/// A CSV that cannot be written (a full disk: a 64 KiB tmpfs filled first) does not lose the
/// run: the result file is written whole, its check `csv export` failed and named, exit 1.
#[test]
fn a_csv_on_a_full_disk_keeps_the_result_and_names_the_export() {
    if !is_root() {
        skipped("needs root to mount a small tmpfs");
        return;
    }
    let dir = tmpdir("csv-full");
    let full = dir.join("full");
    std::fs::create_dir_all(&full).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&full)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        skipped("cannot mount a tmpfs here");
        return;
    }
    // Fill it: the CSV then finds no block to write into.
    let _ = std::fs::write(full.join("filler"), vec![0u8; 64 << 10]);
    let out = dir.join("ok.json");
    let csv = full.join("rows.csv");
    let o = run(
        &[
            "coll",
            "--sizes",
            "8,64k",
            "--csv",
            csv.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    let _ = std::process::Command::new("umount").arg(&full).status();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let r = read_json(&out);
    assert!(!r["results"]["rows"].as_array().unwrap().is_empty());
    let checks = r["verification"]["checks"].as_array().unwrap();
    let export = checks.iter().find(|c| c["name"] == "csv export").unwrap();
    assert_eq!(export["passed"], false);
    assert!(
        export["detail"].as_str().unwrap().contains("rows.csv"),
        "{export}"
    );
    assert!(text(&o.stderr).contains("--csv"), "{}", text(&o.stderr));
}

/// Sizes that hold no whole element are refused in one line when nothing would run; a size
/// that is no whole number of elements runs the array below it and says so, in the result
/// too, instead of rounding in silence.
#[test]
fn sizes_that_are_not_whole_elements_are_refused_or_named() {
    let dir = tmpdir("coll-odd-sizes");
    let o = run(
        &[
            "coll",
            "--sizes",
            "3",
            "--dtype",
            "f64",
            "--out",
            dir.join("none.json").to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(
        err.contains("no --sizes value holds one whole f64 element (8 B)"),
        "{err}"
    );
    assert!(!dir.join("none.json").exists());
    let out = dir.join("odd.json");
    let o = run(
        &[
            "coll",
            "--op",
            "all-reduce",
            "--sizes",
            "4097",
            "--dtype",
            "f64",
            "--out",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r = read_json(&out);
    assert_eq!(r["results"]["rows"][0]["size_bytes"], 4096);
    let said = r["warnings"].as_array().unwrap();
    assert!(
        said.iter().any(|w| w
            .as_str()
            .unwrap()
            .contains("all-reduce at 4097 B: runs 4096 B (512 whole f64 elements)")),
        "{said:?}"
    );
}
