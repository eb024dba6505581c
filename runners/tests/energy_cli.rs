//! Energy over a suite's timed part, read from a powercap counter tree that a thread of this
//! test advances while the run goes (TBBENCH_POWERCAP_ROOT points the ranks at it): a known
//! power, a range small enough that the counter wraps during the run, and a sub-zone that
//! must not be added to its package.

mod support;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::*;

/// The counter's power and range: 60 W wraps a 30 J range every half second, more than once
/// in any run below and slower than the meter's 0.2 s reads.
const WATTS: f64 = 60.0;
const RANGE_UJ: u64 = 30_000_000;

/// The tests here that run a solve hold this: the counter test's meter reads a counter that
/// wraps every half second, and another solve on the same 2 cores can starve its thread past
/// a wrap.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ALONE.lock().unwrap_or_else(|e| e.into_inner())
}

fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A package zone and one of its parts; a thread advances both at WATTS until dropped.
struct Counters {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Counters {
    fn start(root: &Path) -> Counters {
        for (zone, name) in [("intel-rapl:0", "package-0"), ("intel-rapl:0:0", "core")] {
            let d = root.join(zone);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("name"), format!("{name}\n")).unwrap();
            std::fs::write(d.join("max_energy_range_uj"), format!("{RANGE_UJ}\n")).unwrap();
            write_atomically(&d.join("energy_uj"), "29000000\n");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let root = root.to_path_buf();
        let thread = std::thread::spawn(move || {
            let t0 = Instant::now();
            while !flag.load(Ordering::Relaxed) {
                let uj = 29_000_000 + (t0.elapsed().as_secs_f64() * WATTS * 1e6) as u64;
                for zone in ["intel-rapl:0", "intel-rapl:0:0"] {
                    write_atomically(
                        &root.join(zone).join("energy_uj"),
                        &format!("{}\n", uj % RANGE_UJ),
                    );
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Counters {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Counters {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn tbbench(root: &Path, args: &[&str]) -> std::process::Output {
    let out = Command::new(bin())
        .args(args)
        .env("TBBENCH_POWERCAP_ROOT", root)
        .output()
        .expect("tbbench starts");
    assert!(out.status.success(), "{}", text(&out.stderr));
    out
}

/// `tbbench hpl` on `nodes` local ranks at order `n`, without the DGEMM probe.
fn hpl(root: &Path, nodes: &str, n: &str, out: &Path) -> std::process::Output {
    tbbench(
        root,
        &[
            "hpl",
            "--nodes",
            nodes,
            "--n",
            n,
            "--no-dgemm-probe",
            "--out",
            out.to_str().unwrap(),
        ],
    )
}

/// The watts the run saw: the counter's, within what the meter's 0.2 s reads and the span's
/// edges leave open.
fn assert_watts(energy: &serde_json::Value) {
    let watts = energy["avg_watts"]
        .as_f64()
        .unwrap_or_else(|| panic!("{energy}"));
    let seconds = energy["seconds"].as_f64().unwrap();
    assert!(seconds > 0.05, "{energy}");
    // One read's worth (0.2 s of WATTS) may fall either side of the span.
    let slack = 0.25 / seconds + 0.05;
    assert!(
        (watts / WATTS - 1.0).abs() < slack,
        "{watts} W measured against the counter's {WATTS} W: {energy}"
    );
    let joules = energy["joules"].as_f64().unwrap();
    assert!((joules / seconds - watts).abs() < 1e-6 * watts);
    // The package alone: its part ("core") is not added again.
    let host = &energy["hosts"][0];
    assert_eq!(
        host["domains"],
        serde_json::json!(["package-0"]),
        "{energy}"
    );
    // More joules than the counter's range: it wrapped on the way, and was followed.
    if joules * 1e6 > RANGE_UJ as f64 {
        assert!(
            host["wraps"].as_u64().unwrap() >= 1,
            "the counter never wrapped: {energy}"
        );
    }
}

#[test]
fn every_suite_records_the_energy_of_its_timed_part() {
    let _alone = one_at_a_time();
    let dir = tmpdir("energy");
    let root = dir.join("powercap");
    let _counters = Counters::start(&root);

    // HPL on two ranks of one host: one meter for the host, the solve's joules and Gflops/W.
    let out = dir.join("hpl.json");
    let printed = hpl(&root, "2", "6000", &out);
    let run = &read_json(&out)["results"]["runs"][0];
    let energy = &run["energy"];
    assert_watts(energy);
    let stdout = text(&printed.stdout);
    assert!(stdout.contains("Gflops/W"), "{stdout}");
    // The solve outlasts the counter's range (N 6000 takes seconds on two ranks), so the
    // check above saw the counter wrap and followed it.
    assert!(
        energy["joules"].as_f64().unwrap() * 1e6 > RANGE_UJ as f64,
        "the solve was too short to wrap the counter: {energy}"
    );
    let seconds = energy["seconds"].as_f64().unwrap();
    let time = run["time_s"].as_f64().unwrap();
    assert!(
        seconds >= time * 0.9 && seconds <= time + 1.0,
        "span {seconds} s, solve {time} s"
    );
    let gpw = run["gflops_per_watt"].as_f64().unwrap();
    let want = run["gflops"].as_f64().unwrap() / energy["avg_watts"].as_f64().unwrap();
    assert!((gpw - want).abs() < 1e-9 * want, "{gpw} vs {want}");

    // The decode: joules per token over the prompt and the generated tokens.
    let out = dir.join("decode.json");
    let printed = tbbench(
        &root,
        &[
            "infer",
            "--shape",
            "llama-3.2-3b",
            "--layers",
            "2",
            "--nodes",
            "1",
            "--max-tokens",
            "48",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let r = &read_json(&out)["results"];
    assert_watts(&r["energy"]);
    let stdout = text(&printed.stdout);
    assert!(stdout.contains("J per token"), "{stdout}");
    let tokens = r["prompt_tokens"].as_u64().unwrap() + r["generated_tokens"].as_u64().unwrap();
    let jpt = r["joules_per_token"].as_f64().unwrap();
    let want = r["energy"]["joules"].as_f64().unwrap() / tokens as f64;
    assert!((jpt - want).abs() < 1e-9 * want, "{jpt} vs {want}");

    // link and coll: over their whole sweep, two ranks of one host.
    for (suite, args) in [
        (
            "link",
            vec![
                "link",
                "--nodes",
                "2",
                "--transport",
                "shm",
                "--sizes",
                "1,64k,4MiB",
            ],
        ),
        (
            "coll",
            vec![
                "coll",
                "--nodes",
                "2",
                "--transport",
                "shm",
                "--sizes",
                "8,64k,4MiB",
            ],
        ),
    ] {
        let out = dir.join(format!("{suite}.json"));
        let mut args = args;
        args.extend(["--out", out.to_str().unwrap()]);
        tbbench(&root, &args);
        assert_watts(&read_json(&out)["results"]["energy"]);
    }
}

#[test]
fn no_counters_is_said_and_the_run_goes_on() {
    let _alone = one_at_a_time();
    let dir = tmpdir("energy-none");
    let empty = dir.join("powercap");
    std::fs::create_dir_all(&empty).unwrap();
    let out = dir.join("hpl.json");
    hpl(&empty, "1", "1000", &out);
    let run = &read_json(&out)["results"]["runs"][0];
    let why = run["energy"]["unavailable"]
        .as_str()
        .unwrap_or_else(|| panic!("{run}"));
    assert!(why.contains("no RAPL package counters"), "{why}");
    assert!(run.get("gflops_per_watt").is_none());
}

/// Counters no meter should believe make the figure unavailable, with the reason, never a
/// number: one above its range, one that never moves (the span outlasts two readings).
#[test]
fn implausible_counters_give_no_figure_but_the_reason() {
    let _alone = one_at_a_time();
    let dir = tmpdir("energy-implausible");
    for (case, value, want) in [
        ("above", "99999999999", "above its range"),
        ("flat", "1000", "did not move"),
    ] {
        let root = dir.join(case);
        let d = root.join("intel-rapl:0");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("name"), "package-0\n").unwrap();
        std::fs::write(d.join("max_energy_range_uj"), format!("{RANGE_UJ}\n")).unwrap();
        std::fs::write(d.join("energy_uj"), format!("{value}\n")).unwrap();
        let out = dir.join(format!("{case}.json"));
        hpl(&root, "1", "1500", &out);
        let run = &read_json(&out)["results"]["runs"][0];
        let why = run["energy"]["unavailable"]
            .as_str()
            .unwrap_or_else(|| panic!("{case}: {run}"));
        assert!(why.contains(want), "{case}: {why}");
        assert!(run.get("gflops_per_watt").is_none(), "{case}");
    }
}

/// A FIFO in a counter's place (or a device) is no counter: `tbbench env` and a run end, and
/// say why, instead of waiting on it forever.
#[test]
fn a_fifo_as_a_counter_is_refused_not_waited_on() {
    let dir = tmpdir("energy-fifo");
    let root = dir.join("powercap");
    let d = root.join("intel-rapl:0");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("name"), "package-0\n").unwrap();
    std::fs::write(d.join("max_energy_range_uj"), format!("{RANGE_UJ}\n")).unwrap();
    let fifo = d.join("energy_uj");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let child = Command::new(bin())
        .args(["env", "--json"])
        .env("TBBENCH_POWERCAP_ROOT", &root)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (o, _) = finish(child, std::time::Duration::from_secs(20));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let why = v["energy"]["none_because"].as_str().unwrap();
    assert!(
        why.contains("not a regular file") && !why.contains("root reads"),
        "{why}"
    );
}
