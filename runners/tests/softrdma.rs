//! The verbs transport end to end over the software RDMA device (runners/softrdma): real rank
//! processes loading `libtbbench_softrdma.so` with `--verbs-lib`, on the device with Apple's
//! rules and on the one with ConnectX's. And the device's rules themselves, through the same
//! C entry points tbbench calls.
//!
//! The library is built by `cargo build`/`cargo test` at the workspace root (a default
//! member); the tests find it beside the tbbench binary. Linux only: they read /proc and use
//! network namespaces.
#![cfg(target_os = "linux")]

mod netlab;
mod support;

use netlab::{netlab, Lab};
use std::path::Path;
use std::time::{Duration, Instant};
use support::*;
use tbbench_runners::transport::verbs::ffi::*;

const APPLE: &str = "softrdma_apple0";
const LINUX: &str = "softrdma_linux0";

/// The device's counters as the stats files written at close hold them, one per process.
fn stats(dir: &Path) -> Vec<serde_json::Value> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().extension().is_some_and(|x| x == "json") {
            v.push(read_json(&e.path()));
        }
    }
    v
}

fn sum(stats: &[serde_json::Value], key: &str) -> u64 {
    stats.iter().map(|s| s[key].as_u64().unwrap_or(0)).sum()
}

/// Runs tbbench with the device library and a stats folder; returns the output.
fn run_soft(args: &[&str], stats_dir: &Path, limit: Duration) -> std::process::Output {
    let child = std::process::Command::new(bin())
        .args(args)
        .env("TBBENCH_VERBS_LIB", so())
        .env("TBBENCH_SOFTRDMA_STATS", stats_dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("tbbench starts");
    finish(child, limit).0
}

/// What every clean run over the device must show: labelled emulated, said so on stderr, and
/// the device closed with nothing left registered and no data lost.
fn check_clean(o: &std::process::Output, out: &Path, stats_dir: &Path, ranks: usize) {
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("software stand-in for an RDMA device"),
        "the run says the device is not real: {err}"
    );
    let r = read_json(out);
    assert_eq!(r["network"]["link_kind"], "rdma-emulated");
    assert!(
        r["network"]["label"]
            .as_str()
            .unwrap()
            .contains("(emulated)"),
        "{}",
        r["network"]
    );
    assert_eq!(r["verification"]["passed"], true, "{}", r["verification"]);
    let s = stats(stats_dir);
    assert_eq!(s.len(), ranks, "every rank closed its device: {s:?}");
    for key in [
        "mrs_left_at_close",
        "qps_left_at_close",
        "frame_mismatch",
        "error_completions",
        "dropped_peer_gone",
        "refused_over_depth",
        "refused_bad_state",
        "refused_modify",
        "refused_bad_lkey",
        "refused_remote_access",
    ] {
        assert_eq!(sum(&s, key), 0, "{key}: {s:?}");
    }
    // UC drops a SEND that finds no receive; tbbench sends data only against a ready notice or
    // an eager credit, so the only SENDs that may be dropped are greetings, which are repeated
    // until answered.
    assert!(
        sum(&s, "dropped_no_recv") <= 8 * ranks as u64,
        "dropped {}: {s:?}",
        sum(&s, "dropped_no_recv")
    );
    assert!(sum(&s, "delivered") > 0);
}

fn link(device: &str, nodes: &str, sizes: &str, name: &str) {
    let dir = tmpdir(name);
    let out = dir.join("r.json");
    let sd = dir.join("stats");
    let started = Instant::now();
    let o = run_soft(
        &[
            "link",
            "--nodes",
            nodes,
            "--transport",
            "verbs",
            "--rdma-device",
            device,
            "--sizes",
            sizes,
            "--iters",
            "2",
            "--warmup",
            "1",
            "--window",
            "2",
            "--timeout",
            "20s",
            "--out",
            out.to_str().unwrap(),
        ],
        &sd,
        Duration::from_secs(240),
    );
    check_clean(&o, &out, &sd, nodes.parse().unwrap());
    let r = read_json(&out);
    let mut seen = std::collections::BTreeSet::new();
    for part in ["latency", "bandwidth"] {
        for row in r["results"][part].as_array().unwrap() {
            assert_eq!(row["wrong_bytes"], 0, "{part}: {row}");
            let mode = row["mode"].as_str().unwrap_or("latency").to_string();
            seen.insert((mode, row["size_bytes"].as_u64().unwrap()));
        }
    }
    for mode in ["latency", "bw", "bibw"] {
        for size in [1, 64 << 20] {
            assert!(
                seen.contains(&(mode.to_string(), size)),
                "{mode} at {size} bytes: {seen:?}"
            );
        }
    }
    println!("{name}: {:.1} s", started.elapsed().as_secs_f64());
}

#[test]
fn link_on_two_ranks_apple_rules_every_size_1b_to_64mib() {
    link(APPLE, "2", "1B..64MiB", "sr-link-apple2");
}

#[test]
fn link_on_two_ranks_connectx_rules_every_size_1b_to_64mib() {
    link(LINUX, "2", "1B..64MiB", "sr-link-linux2");
}

#[test]
fn link_on_four_ranks_apple_rules() {
    link(APPLE, "4", "1,4097,64k,1MiB,64MiB", "sr-link-apple4");
}

#[test]
fn link_on_four_ranks_connectx_rules() {
    link(LINUX, "4", "1,4097,64k,1MiB,64MiB", "sr-link-linux4");
}

#[test]
fn hpl_on_four_ranks_passes_over_both_devices() {
    for device in [APPLE, LINUX] {
        let dir = tmpdir(&format!("sr-hpl-{device}"));
        let out = dir.join("r.json");
        let sd = dir.join("stats");
        let o = run_soft(
            &[
                "hpl",
                "--nodes",
                "4",
                "--n",
                "1000",
                "--transport",
                "verbs",
                "--rdma-device",
                device,
                "--timeout",
                "20s",
                "--out",
                out.to_str().unwrap(),
            ],
            &sd,
            Duration::from_secs(120),
        );
        check_clean(&o, &out, &sd, 4);
        assert!(text(&o.stdout).contains("PASSED"), "{}", text(&o.stdout));
    }
}

#[test]
fn every_collective_and_algorithm_over_both_devices() {
    for device in [APPLE, LINUX] {
        let dir = tmpdir(&format!("sr-coll-{device}"));
        let out = dir.join("r.json");
        let sd = dir.join("stats");
        let o = run_soft(
            &[
                "coll",
                "--nodes",
                "4",
                "--op",
                "all",
                "--algo",
                "all",
                "--sizes",
                "4,4100,256k",
                "--iters",
                "2",
                "--warmup",
                "1",
                "--transport",
                "verbs",
                "--rdma-device",
                device,
                "--timeout",
                "20s",
                "--out",
                out.to_str().unwrap(),
            ],
            &sd,
            Duration::from_secs(120),
        );
        check_clean(&o, &out, &sd, 4);
    }
}

#[test]
fn decode_split_by_tensor_and_pipeline_gives_the_1_rank_tokens() {
    for (parallel, layers) in [("tp", "1"), ("pp", "2")] {
        let dir = tmpdir(&format!("sr-decode-{parallel}"));
        let out = dir.join("r.json");
        let sd = dir.join("stats");
        let o = run_soft(
            &[
                "infer",
                "--shape",
                "llama-3.2-3b",
                "--layers",
                layers,
                "--nodes",
                "2",
                "--parallel",
                parallel,
                "--max-tokens",
                "4",
                "--transport",
                "verbs",
                "--rdma-device",
                APPLE,
                "--timeout",
                "20s",
                "--out",
                out.to_str().unwrap(),
            ],
            &sd,
            Duration::from_secs(300),
        );
        check_clean(&o, &out, &sd, 2);
        assert_eq!(read_json(&out)["results"]["matched"], true, "{parallel}");
    }
}

#[test]
fn over_tcp_and_the_apple_device_in_one_run() {
    let dir = tmpdir("sr-over");
    // Beside the results folder, which the report reads whole.
    let sd = tmpdir("sr-over-stats");
    let o = run_soft(
        &[
            "link",
            "--nodes",
            "2",
            "--over",
            &format!("tcp:lo,verbs:{APPLE}"),
            "--sizes",
            "64,64k",
            "--iters",
            "5",
            "--timeout",
            "20s",
            "--out",
            dir.to_str().unwrap(),
        ],
        &sd,
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let stdout = text(&o.stdout);
    assert!(
        stdout.contains("tcp/lo") && stdout.contains(&format!("verbs/{APPLE} (emulated)")),
        "{stdout}"
    );
    let kinds: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .map(|e| {
            read_json(&e.path())["network"]["link_kind"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert!(kinds.contains(&"rdma-emulated".to_string()), "{kinds:?}");
    assert!(kinds.contains(&"loopback".to_string()), "{kinds:?}");
    // The report names the device's figures emulated wherever it shows them.
    let html = dir.join("report.html");
    let o = run(
        &[
            "report",
            dir.to_str().unwrap(),
            "-o",
            html.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    // Every label (file names aside) of the device's network.
    let named = page.matches(&format!("{APPLE} (")).count();
    let emulated = page.matches(&format!("{APPLE} (emulated)")).count();
    assert!(
        named > 0 && named == emulated,
        "{named} mentions, {emulated} say emulated"
    );
}

/// Ranks in two network namespaces, started as a hostfile run starts them: the device
/// reaches its peer at the GID (the namespace's address) the rendezvous carried.
#[test]
fn hostfile_run_across_network_namespaces() {
    let Some(_lab) = Lab::up("tbsr") else {
        return;
    };
    let dir = tmpdir("sr-netns");
    let hosts = dir.join("hosts.json");
    std::fs::write(&hosts, netlab(&["hostfile", "tbsr", "0"]).stdout).unwrap();
    let out = dir.join("r.json");
    let sd = dir.join("stats");
    let o = run_soft(
        &[
            "link",
            "--hostfile",
            hosts.to_str().unwrap(),
            "--rsh",
            "ip netns exec",
            "--transport",
            "verbs",
            "--rdma-device",
            APPLE,
            "--sizes",
            "64,1MiB",
            "--iters",
            "5",
            "--timeout",
            "20s",
            "--out",
            out.to_str().unwrap(),
        ],
        &sd,
        Duration::from_secs(120),
    );
    check_clean(&o, &out, &sd, 2);
    assert_eq!(
        read_json(&out)["network"]["addresses"],
        serde_json::json!(["10.71.0.1", "10.71.0.2"])
    );
}

/// A pair of hosts cabled as Macs are (scripts/netlab.sh `cabled pair2`) and the hostfile MLX's
/// jaccl backend reads, naming per host the device of its cable to the other (`rdma_en1` on one,
/// `rdma_en0` on the other): the library lists a device per interface with Apple's rules,
/// bound to that interface's address, and each rank opens the one its hostfile names, so the
/// data moves on that cable, not the second one nor the management network.
#[test]
fn each_rank_opens_the_device_its_hostfile_names_for_its_cable() {
    let Some(lab) = netlab::CabledLab::up("pair2", "tbv", &["1000mbit"]) else {
        return;
    };
    let dir = tmpdir("sr-cable");
    let hosts = lab.hostfile(&dir, "jaccl");
    let out = dir.join("r.json");
    let sd = dir.join("stats");
    let before = lab.tx_bytes(0);
    let o = run_soft(
        &[
            "link",
            "--hostfile",
            hosts.to_str().unwrap(),
            "--rsh",
            "ip netns exec",
            "--transport",
            "verbs",
            "--sizes",
            "64,1MiB",
            "--iters",
            "10",
            "--timeout",
            "20s",
            "--out",
            out.to_str().unwrap(),
        ],
        &sd,
        Duration::from_secs(120),
    );
    check_clean(&o, &out, &sd, 2);
    let r = read_json(&out);
    let net = &r["network"];
    assert_eq!(net["label"], "verbs/rdma_en1 (emulated)", "{net}");
    assert_eq!(net["interface"], "en1", "{net}");
    assert_eq!(
        net["addresses"],
        serde_json::json!(["192.168.0.1", "192.168.0.2"]),
        "{net}"
    );
    let after = lab.tx_bytes(0);
    let sent = |name: &str| {
        let b = |v: &[(String, u64)]| v.iter().find(|(n, _)| n == name).map_or(0, |x| x.1);
        b(&after) - b(&before)
    };
    assert!(
        sent("en1") > 10 << 20 && sent("en1c1") < 1 << 20 && sent("mgmt") < sent("en1") / 10,
        "en1 {} bytes, en1c1 {}, mgmt {}",
        sent("en1"),
        sent("en1c1"),
        sent("mgmt")
    );
}

/// The device fails one receive (`TBBENCH_SOFTRDMA_FAIL_RECV`): tbbench reports the error
/// status in one line and writes no result, never using the buffer as data.
#[test]
fn a_completion_with_an_error_status_ends_the_run_in_one_line() {
    let dir = tmpdir("sr-fail");
    let out = dir.join("r.json");
    let child = std::process::Command::new(bin())
        .args([
            "link",
            "--nodes",
            "2",
            "--transport",
            "verbs",
            "--rdma-device",
            APPLE,
            "--sizes",
            "64k",
            "--iters",
            "20",
            "--timeout",
            "10s",
            "--out",
            out.to_str().unwrap(),
        ])
        .env("TBBENCH_VERBS_LIB", so())
        .env("TBBENCH_SOFTRDMA_FAIL_RECV", "60")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (o, took) = finish(child, Duration::from_secs(60));
    assert!(!o.status.success());
    let err = text(&o.stderr);
    let errors: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(
        errors[0].contains("failed: local length error"),
        "names the status: {err}"
    );
    assert!(took < Duration::from_secs(30), "{took:?}");
    assert!(!out.exists(), "no result from a failed run");
}

/// What a small message costs in device operations, counted by the device (time on a
/// software device means nothing): the eager path sends it in one SEND, its credits riding back
/// in the header of the answer, and no SEND is ever dropped for want of a posted receive.
#[test]
fn a_small_message_costs_one_send_on_the_apple_device() {
    let dir = tmpdir("sr-ops");
    let out = dir.join("r.json");
    let sd = dir.join("stats");
    let (iters, warmup) = (200u64, 10u64);
    let o = run_soft(
        &[
            "link",
            "--nodes",
            "2",
            "--transport",
            "verbs",
            "--rdma-device",
            APPLE,
            "--buffer",
            "64",
            "--mode",
            "latency",
            "--iters",
            &iters.to_string(),
            "--warmup",
            &warmup.to_string(),
            "--timeout",
            "20s",
            "--out",
            out.to_str().unwrap(),
        ],
        &sd,
        Duration::from_secs(60),
    );
    check_clean(&o, &out, &sd, 2);
    let s = stats(&sd);
    // A ping-pong iteration moves two messages, one each way.
    let messages = 2 * (iters + warmup);
    let per_message = sum(&s, "sends_posted") as f64 / messages as f64;
    println!("{per_message:.2} SENDs per 64-byte message");
    assert!(
        (0.95..1.1).contains(&per_message),
        "{per_message:.2} SENDs per message: {s:?}"
    );
}

#[test]
fn env_lists_the_devices_as_software_stand_ins() {
    let o = run_soft(&["env"], &tmpdir("sr-env"), Duration::from_secs(60));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    for d in [APPLE, LINUX] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(d) && l.contains("software stand-in")),
            "{out}"
        );
    }
}

#[test]
fn too_many_ranks_for_apples_ten_queue_pairs_is_one_clear_line() {
    let dir = tmpdir("sr-qps");
    let out = dir.join("r.json");
    let o = run_soft(
        &[
            "link",
            "--nodes",
            "7",
            "--transport",
            "verbs",
            "--rdma-device",
            APPLE,
            "--sizes",
            "64",
            "--iters",
            "2",
            "--timeout",
            "10s",
            "--out",
            out.to_str().unwrap(),
        ],
        &dir.join("stats"),
        Duration::from_secs(60),
    );
    assert!(!o.status.success());
    let err = text(&o.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("error"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        line.contains("12 queue pairs") && line.contains("the 10 it allows"),
        "{err}"
    );
    assert!(!out.exists());
}

#[test]
fn a_rank_killed_mid_transfer_ends_every_rank_within_ten_seconds() {
    // UC: the survivors' sends go on without an error; the heartbeats notice.
    killed_rank(APPLE);
}

#[test]
fn a_rank_killed_mid_transfer_on_rc_ends_every_rank_within_ten_seconds() {
    // RC: a send to the dead peer may complete with retry-exceeded first; still one line.
    killed_rank(LINUX);
}

fn killed_rank(device: &str) {
    let dir = tmpdir(&format!("sr-kill-{device}"));
    let out = dir.join("r.json");
    let sd = dir.join("stats");
    let child = std::process::Command::new(bin())
        .args([
            "link",
            "--nodes",
            "4",
            "--transport",
            "verbs",
            "--rdma-device",
            device,
            "--buffer",
            "4MiB",
            "--mode",
            "bibw",
            "--iters",
            "100000",
            "--timeout",
            "20s",
            "--out",
            out.to_str().unwrap(),
        ])
        .env("TBBENCH_VERBS_LIB", so())
        .env("TBBENCH_SOFTRDMA_STATS", &sd)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let launcher = child.id();
    // Then until data moves (the device has sent bytes on rank 0).
    let ranks = wait_for_ranks(launcher, 4, Duration::from_secs(3));
    let victim = ranks.iter().find(|r| r.1 == 1).unwrap().0;
    let (o, took) = kill_and_finish(child, victim);
    assert!(
        took < Duration::from_secs(10),
        "took {took:?} after the kill"
    );
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(err.contains("rank 1"), "names the dead rank: {err}");
    assert_eq!(
        err.lines().filter(|l| l.contains("error")).count(),
        1,
        "one error line: {err}"
    );
    assert_ranks_gone(&ranks, Duration::from_secs(1), "the run");
    assert!(!out.exists());
    // The survivors' waits stopped for the abort and their main threads unwound before the
    // exit: each closed its device (writing its counters) with every memory registration and
    // queue pair already released by tbbench.
    let s = stats(&sd);
    assert_eq!(
        s.len(),
        3,
        "the three survivors closed their devices: {s:?}"
    );
    for key in [
        "mrs_left_at_close",
        "qps_left_at_close",
        "error_completions",
    ] {
        if key == "error_completions" && device == LINUX {
            // RC: sends to the dead peer may complete with retry-exceeded before the abort.
            continue;
        }
        assert_eq!(sum(&s, key), 0, "{key}: {s:?}");
    }
}

/// Survivors wait for a frozen peer (5 s until its heartbeats are missed): they must use
/// well under a core while they do.
#[test]
fn ranks_waiting_on_a_frozen_peer_use_well_under_a_core() {
    let dir = tmpdir("sr-freeze");
    let out = dir.join("r.json");
    let child = std::process::Command::new(bin())
        .args([
            "link",
            "--nodes",
            "3",
            "--transport",
            "verbs",
            "--rdma-device",
            APPLE,
            "--buffer",
            "64",
            "--mode",
            "latency",
            "--iters",
            "50000000",
            "--timeout",
            "30s",
            "--out",
            out.to_str().unwrap(),
        ])
        .env("TBBENCH_VERBS_LIB", so())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let launcher = child.id();
    let ranks = wait_for_ranks(launcher, 3, Duration::from_secs(2));
    let victim = ranks.iter().find(|r| r.1 == 1).unwrap().0;
    let _ = std::process::Command::new("kill")
        .args(["-STOP", &victim.to_string()])
        .status();
    let cpu = |pid: u32| -> Option<u64> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let f: Vec<&str> = s.rsplit(')').next()?.split_whitespace().collect();
        Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
    };
    // Past the first instants, while they still wait (the heartbeat gives up after 5 s).
    std::thread::sleep(Duration::from_millis(500));
    let survivors: Vec<u32> = ranks.iter().filter(|r| r.1 != 1).map(|r| r.0).collect();
    let before: Vec<Option<u64>> = survivors.iter().map(|p| cpu(*p)).collect();
    let window = Duration::from_secs(2);
    std::thread::sleep(window);
    let after: Vec<Option<u64>> = survivors.iter().map(|p| cpu(*p)).collect();
    let (o, _) = finish(child, Duration::from_secs(30));
    // The launcher ends the frozen rank; resume it in case it did not, so nothing lingers.
    let _ = std::process::Command::new("kill")
        .args(["-CONT", &victim.to_string()])
        .stderr(std::process::Stdio::null())
        .status();
    assert!(!o.status.success());
    let hz = 100.0; // USER_HZ on Linux
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        if let (Some(b), Some(a)) = (b, a) {
            let cores = (a - b) as f64 / hz / window.as_secs_f64();
            assert!(
                cores < 0.3,
                "survivor {} used {cores:.2} cores while waiting",
                survivors[i]
            );
        }
    }
}

// --- the device's rules, through the entry points tbbench uses -------------------------------

struct Dev {
    lib: Lib,
    ctx: *mut IbvContext,
    pd: *mut IbvPd,
    cq: *mut IbvCq,
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

impl Dev {
    fn open(name: &str) -> Dev {
        let lib = Lib::open(so().to_str().unwrap()).unwrap();
        assert!(
            lib.emulated.is_some(),
            "the library says it is the software device"
        );
        unsafe {
            let mut n = 0;
            let list = (lib.get_device_list)(&mut n);
            let devs: Vec<*mut IbvDevice> = (0..n as usize).map(|i| *list.add(i)).collect();
            let names: Vec<String> = devs.iter().map(|d| lib.device_name(*d)).collect();
            // The two rule sets first, then one device per interface (`rdma_<ifname>`).
            assert_eq!(names[..2], [APPLE, LINUX]);
            assert!(
                names[2..].iter().all(|n| n.starts_with("rdma_")),
                "{names:?}"
            );
            let i = names.iter().position(|x| x == name).unwrap();
            let ctx = (lib.open_device)(devs[i]);
            (lib.free_device_list)(list);
            assert!(!ctx.is_null());
            let pd = (lib.alloc_pd)(ctx);
            let cq = (lib.create_cq)(ctx, 256, std::ptr::null_mut(), std::ptr::null_mut(), 0);
            assert!(!pd.is_null() && !cq.is_null());
            Dev { lib, ctx, pd, cq }
        }
    }

    fn qp(&self, qp_type: u32) -> *mut IbvQp {
        let mut init = IbvQpInitAttr {
            qp_context: std::ptr::null_mut(),
            send_cq: self.cq,
            recv_cq: self.cq,
            srq: std::ptr::null_mut(),
            cap: IbvQpCap {
                max_send_wr: 256,
                max_recv_wr: 256,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type,
            sq_sig_all: 0,
        };
        unsafe { (self.lib.create_qp)(self.pd, &mut init) }
    }

    fn modify(&self, qp: *mut IbvQp, a: &mut IbvQpAttr, mask: i32) -> i32 {
        unsafe { (self.lib.modify_qp)(qp, a, mask) }
    }

    /// Brings `a` to RTS connected to `b` (both on this device).
    fn connect(&self, a: *mut IbvQp, b: *mut IbvQp, rc: bool) {
        use tbbench_runners::transport::verbs::profile::*;
        let profile = Profile::for_platform(if rc { Platform::Linux } else { Platform::MacOs });
        let local = Local {
            port: 1,
            gid_index: Some(1),
            psn: 7,
        };
        let mut gid = IbvGid::default();
        assert_eq!(unsafe { (self.lib.query_gid)(self.ctx, 1, 1, &mut gid) }, 0);
        let remote = Remote {
            lid: 0,
            qpn: unsafe { (*b).qp_num },
            psn: 7,
            gid: gid.0,
        };
        let (mut x, m) = init_attr(&profile, &local);
        assert_eq!(self.modify(a, &mut x, m), 0);
        let (mut x, m) = rtr_attr(&profile, &local, &remote, IBV_MTU_1024);
        assert_eq!(self.modify(a, &mut x, m), 0);
        let (mut x, m) = rts_attr(&profile, &local);
        assert_eq!(self.modify(a, &mut x, m), 0);
    }

    fn reg(&self, buf: &mut [u8]) -> *mut IbvMr {
        unsafe {
            (self.lib.reg_mr)(
                self.pd,
                buf.as_mut_ptr() as *mut _,
                buf.len(),
                IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
            )
        }
    }

    /// Waits up to 5 s for `n` completions.
    fn wait(&self, n: usize) -> Vec<IbvWc> {
        let mut got = Vec::new();
        let start = Instant::now();
        let mut wc = [IbvWc::default(); 16];
        while got.len() < n && start.elapsed() < Duration::from_secs(5) {
            let k = unsafe { poll_cq(self.cq, &mut wc) };
            assert!(k >= 0);
            got.extend_from_slice(&wc[..k as usize]);
            std::thread::sleep(Duration::from_millis(1));
        }
        got
    }

    fn counter(&self, key: &str) -> u64 {
        let path = std::ffi::CString::new(so().to_str().unwrap()).unwrap();
        unsafe {
            let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW);
            let f = libc::dlsym(h, c"softrdma_counters_json".as_ptr());
            assert!(!f.is_null());
            let f: unsafe extern "C" fn(*mut IbvContext, *mut std::ffi::c_char, usize) -> isize =
                std::mem::transmute(f);
            let mut buf = vec![0u8; 4096];
            let n = f(self.ctx, buf.as_mut_ptr() as *mut _, buf.len());
            libc::dlclose(h);
            let v: serde_json::Value = serde_json::from_slice(&buf[..n as usize]).unwrap();
            v[key].as_u64().unwrap()
        }
    }
}

fn send(d: &Dev, qp: *mut IbvQp, mr: *mut IbvMr, addr: *const u8, len: usize, opcode: u32) -> i32 {
    let mut sge = IbvSge {
        addr: addr as u64,
        length: len as u32,
        lkey: unsafe { (*mr).lkey },
    };
    let mut wr = IbvSendWr::zeroed();
    wr.wr_id = 1;
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    wr.opcode = opcode;
    wr.send_flags = IBV_SEND_SIGNALED;
    let _ = d;
    unsafe { post_send(qp, &mut wr) }
}

fn recv(qp: *mut IbvQp, mr: *mut IbvMr, addr: *mut u8, len: usize, id: u64) -> i32 {
    let mut sge = IbvSge {
        addr: addr as u64,
        length: len as u32,
        lkey: unsafe { (*mr).lkey },
    };
    let mut wr = IbvRecvWr {
        wr_id: id,
        next: std::ptr::null_mut(),
        sg_list: &mut sge,
        num_sge: 1,
    };
    unsafe { post_recv(qp, &mut wr) }
}

#[test]
fn apple_rules_refuse_rc_writes_the_11th_qp_the_101st_mr_and_sends_over_the_depth() {
    let d = Dev::open(APPLE);
    assert!(d.qp(IBV_QPT_RC).is_null(), "RC is refused");
    assert_eq!(errno(), 102, "with errno 102, as on macOS 26.2");

    let qps: Vec<*mut IbvQp> = (0..10).map(|_| d.qp(IBV_QPT_UC)).collect();
    assert!(qps.iter().all(|q| !q.is_null()), "ten UC queue pairs");
    assert!(d.qp(IBV_QPT_UC).is_null(), "the 11th is refused");
    assert_eq!(errno(), libc::ENOMEM);

    // Depth is granted at 32, not the 256 asked for.
    let mut attr = IbvQpAttr::default();
    let mut init: IbvQpInitAttr = unsafe { std::mem::zeroed() };
    assert_eq!(
        unsafe { (d.lib.query_qp)(qps[0], &mut attr, IBV_QP_CAP, &mut init) },
        0
    );
    assert_eq!((attr.cap.max_send_wr, attr.cap.max_recv_wr), (32, 32));

    // State machine: RTR straight from RESET, or INIT without its port, is refused.
    let mut a = IbvQpAttr {
        qp_state: IBV_QPS_RTR,
        ..Default::default()
    };
    assert_eq!(d.modify(qps[0], &mut a, IBV_QP_STATE), libc::EINVAL);
    let mut a = IbvQpAttr {
        qp_state: IBV_QPS_INIT,
        ..Default::default()
    };
    assert_eq!(
        d.modify(
            qps[0],
            &mut a,
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS
        ),
        libc::EINVAL
    );

    let mut bufs: Vec<Vec<u8>> = (0..101).map(|_| vec![0u8; 4096]).collect();
    let mrs: Vec<*mut IbvMr> = bufs[..100].iter_mut().map(|b| d.reg(b)).collect();
    assert!(mrs.iter().all(|m| !m.is_null()), "100 memory regions");
    assert!(d.reg(&mut bufs[100]).is_null(), "the 101st is refused");
    assert_eq!(errno(), libc::ENOMEM);
    for m in &mrs[1..] {
        assert_eq!(unsafe { (d.lib.dereg_mr)(*m) }, 0);
    }

    let (a, b) = (qps[0], qps[1]);
    d.connect(a, b, false);
    d.connect(b, a, false);
    let mut big = vec![7u8; 40 * 4096];
    let mr = d.reg(&mut big);
    let base = big.as_mut_ptr();

    assert_eq!(
        send(&d, a, mr, base, 64, IBV_WR_RDMA_WRITE_WITH_IMM),
        102,
        "no RDMA WRITE"
    );
    assert_eq!(
        send(&d, a, mr, base, 33 * 4096, IBV_WR_SEND),
        libc::ENOMEM,
        "33 frames exceed the depth of 32"
    );

    // A SEND that finds no receive is dropped without an error.
    assert_eq!(send(&d, a, mr, base, 64, IBV_WR_SEND), 0);
    let wc = d.wait(1);
    assert_eq!(wc.len(), 1);
    assert_eq!(wc[0].status, IBV_WC_SUCCESS);
    let start = Instant::now();
    while d.counter("dropped_no_recv") < 1 && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(d.counter("dropped_no_recv"), 1);

    // A SEND of one frame into a RECV of two is an error completion, not data.
    let rbuf = unsafe { base.add(20 * 4096) };
    assert_eq!(recv(b, mr, rbuf, 8192, 10), 0);
    assert_eq!(send(&d, a, mr, base, 100, IBV_WR_SEND), 0);
    let wc = d.wait(2);
    let r = wc
        .iter()
        .find(|w| w.wr_id == 10)
        .expect("the receive completes");
    assert_ne!(r.status, IBV_WC_SUCCESS, "an error status");
    assert_eq!(d.counter("frame_mismatch"), 1);

    // The same number of frames: the bytes arrive.
    unsafe { std::ptr::write_bytes(base, 0xab, 5000) };
    assert_eq!(recv(b, mr, rbuf, 5000, 11), 0);
    assert_eq!(send(&d, a, mr, base, 5000, IBV_WR_SEND), 0);
    let wc = d.wait(2);
    let r = wc
        .iter()
        .find(|w| w.wr_id == 11)
        .expect("the receive completes");
    assert_eq!((r.status, r.byte_len), (IBV_WC_SUCCESS, 5000));
    assert!(unsafe { std::slice::from_raw_parts(rbuf, 5000) }
        .iter()
        .all(|x| *x == 0xab));

    unsafe {
        for q in qps {
            assert_eq!((d.lib.destroy_qp)(q), 0);
        }
        (d.lib.dereg_mr)(mr);
        (d.lib.dereg_mr)(mrs[0]);
        assert_eq!((d.lib.destroy_cq)(d.cq), 0);
        assert_eq!((d.lib.dealloc_pd)(d.pd), 0);
        assert_eq!((d.lib.close_device)(d.ctx), 0);
    }
}

#[test]
fn connectx_rules_allow_rc_and_rdma_write_with_immediate() {
    let d = Dev::open(LINUX);
    let (a, b) = (d.qp(IBV_QPT_RC), d.qp(IBV_QPT_RC));
    assert!(!a.is_null() && !b.is_null());
    d.connect(a, b, true);
    d.connect(b, a, true);
    let mut buf = vec![0u8; 1 << 20];
    let mr = d.reg(&mut buf);
    let base = buf.as_mut_ptr();
    unsafe { std::ptr::write_bytes(base, 0x5a, 4096) };
    // The receive that carries the immediate; the data lands at the remote address.
    let mut wr = IbvRecvWr {
        wr_id: 20,
        next: std::ptr::null_mut(),
        sg_list: std::ptr::null_mut(),
        num_sge: 0,
    };
    assert_eq!(unsafe { post_recv(b, &mut wr) }, 0);
    let mut sge = IbvSge {
        addr: base as u64,
        length: 4096,
        lkey: unsafe { (*mr).lkey },
    };
    let mut w = IbvSendWr::zeroed();
    w.wr_id = 21;
    w.sg_list = &mut sge;
    w.num_sge = 1;
    w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    w.send_flags = IBV_SEND_SIGNALED;
    w.imm_data = 4096u32.to_be();
    w.remote_addr = base as u64 + (512 << 10);
    w.rkey = unsafe { (*mr).rkey };
    assert_eq!(unsafe { post_send(a, &mut w) }, 0);
    let wc = d.wait(2);
    let r = wc
        .iter()
        .find(|x| x.wr_id == 20)
        .expect("the immediate arrives");
    assert_eq!(r.status, IBV_WC_SUCCESS);
    assert_eq!(r.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
    assert_eq!(u32::from_be(r.imm_data), 4096);
    let landed = unsafe { std::slice::from_raw_parts(base.add(512 << 10), 4096) };
    assert!(landed.iter().all(|x| *x == 0x5a));
    unsafe {
        (d.lib.destroy_qp)(a);
        (d.lib.destroy_qp)(b);
        (d.lib.dereg_mr)(mr);
        (d.lib.destroy_cq)(d.cq);
        (d.lib.dealloc_pd)(d.pd);
        assert_eq!((d.lib.close_device)(d.ctx), 0);
    }
}

/// A C program compiled against the installed verbs.h (rdma-core's own inline functions and
/// struct layouts) runs a SEND and its RECV on the device.
#[test]
fn a_program_built_against_verbs_h_runs_on_the_device() {
    let header = Path::new("/usr/include/infiniband/verbs.h");
    if !header.exists() {
        skipped(&format!(
            "{} is missing (Debian: apt-get install libibverbs-dev)",
            header.display()
        ));
        return;
    }
    let dir = tmpdir("sr-verbs-h");
    let src = dir.join("t.c");
    let exe = dir.join("t");
    std::fs::write(&src, include_str!("softrdma_verbs_h.c")).unwrap();
    let lib = so();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = match std::process::Command::new(&cc)
        .args(["-O2", "-Wall"])
        .arg(&src)
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.parent().unwrap().display()))
        .arg("-o")
        .arg(&exe)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            skipped(&format!("no C compiler ({cc}: {e})"));
            return;
        }
    };
    assert!(built.status.success(), "{}", text(&built.stderr));
    let o = run_with_limit(&exe, Duration::from_secs(30));
    assert_eq!(text(&o.stdout).trim(), "ok", "{}", text(&o.stderr));
}

fn run_with_limit(exe: &Path, limit: Duration) -> std::process::Output {
    let child = std::process::Command::new(exe)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    finish(child, limit).0
}

// --- the transport itself, two ranks as threads of this process ------------------------------

/// Two verbs ranks on `device`, each running `body` on its own thread; their results.
fn verbs_pair<T: Send + 'static>(
    device: &'static str,
    body: fn(&mut dyn tbbench_runners::transport::Transport, usize) -> T,
) -> Vec<T> {
    verbs_pair_watched(device, body, None)
}

/// As [`verbs_pair`], the ranks having joined one run (a secret, loopback) as tbbench's do;
/// `watch` gets each rank's published connection data, as a stranger could learn its ports.
fn verbs_pair_watched<T: Send + 'static>(
    device: &'static str,
    body: fn(&mut dyn tbbench_runners::transport::Transport, usize) -> T,
    watch: Option<std::sync::mpsc::Sender<String>>,
) -> Vec<T> {
    use std::sync::mpsc;
    use tbbench_runners::session::PeerName;
    use tbbench_runners::transport::verbs::{prepare, VerbsOptions};
    let lib = so().to_string_lossy().into_owned();
    let secret = *b"run-secret-16byt";
    let (tx, rx): (Vec<_>, Vec<_>) = (0..2).map(|_| mpsc::channel::<String>()).unzip();
    let mut rx: Vec<Option<mpsc::Receiver<String>>> = rx.into_iter().map(Some).collect();
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            let to_peer = tx[1 - rank].clone();
            let from_peer = rx[rank].take().unwrap();
            let lib = lib.clone();
            let watch = watch.clone();
            std::thread::spawn(move || {
                let opts = VerbsOptions {
                    device: Some(device.into()),
                    timeout: Duration::from_secs(3),
                    library: Some(lib),
                    run: Some((secret, Some(std::net::Ipv4Addr::LOCALHOST))),
                    ..Default::default()
                };
                let prepared = prepare(rank, 2, &opts).unwrap();
                to_peer.send(prepared.hello()).unwrap();
                if let Some(w) = watch {
                    w.send(prepared.hello()).unwrap();
                }
                let theirs = from_peer.recv().unwrap();
                let mut hellos = vec![None, None];
                hellos[1 - rank] = Some(theirs);
                let names = (0..2)
                    .map(|r| PeerName {
                        rank: r,
                        host: "test".into(),
                    })
                    .collect();
                let mut t = prepared.connect(&hellos, names).unwrap();
                body(&mut t, 1 - rank)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Queue pair numbers follow from the device's port, so a process outside the run can find
/// them. Hundreds of idle connections, hellos without the run's secret and SEND frames aimed
/// at the ranks' queue pairs neither stop the run, nor corrupt a message, nor cost a thread
/// each.
#[test]
fn a_stranger_cannot_stop_crowd_or_feed_a_verbs_run() {
    use std::io::Write;
    use std::net::TcpStream;
    use std::sync::mpsc;
    use tbbench_runners::transport::verbs::handshake::Hello;
    for device in [APPLE, LINUX] {
        let (seen_tx, seen_rx) = mpsc::channel::<String>();
        let stranger = std::thread::spawn(move || {
            // Every queue pair the ranks published, and the device port each lives behind.
            let mut qpns = Vec::new();
            for _ in 0..2 {
                let h = Hello::decode(&seen_rx.recv().unwrap(), 2).unwrap();
                for q in &h.qps {
                    qpns.extend([q.data_qpn, q.ctl_qpn]);
                }
            }
            let port_of = |qpn: u32| (qpn >> 8) as u16;
            let mut held = Vec::new();
            for i in 0..258 {
                if let Ok(s) = TcpStream::connect(("127.0.0.1", port_of(qpns[i % qpns.len()]))) {
                    held.push(s);
                }
            }
            // A hello of the first version (no secret), one with a wrong secret, each
            // followed by 256 SEND frames to a queue pair, claiming its peer as the source.
            for (version, secret) in [(1u32, None), (2, Some([7u8; 16]))] {
                for (i, &dst) in qpns.iter().enumerate() {
                    let src = qpns[i ^ 1];
                    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port_of(dst))) else {
                        continue;
                    };
                    let mut b = Vec::new();
                    for w in [0x5352_4448u32, version, src, dst, 0, 0] {
                        b.extend_from_slice(&w.to_le_bytes());
                    }
                    if let Some(sec) = secret {
                        b.extend_from_slice(&sec);
                    }
                    for _ in 0..256 {
                        for w in [0x5352_4446u32, 1, dst, src] {
                            b.extend_from_slice(&w.to_le_bytes());
                        }
                        b.extend_from_slice(&64u64.to_le_bytes());
                        b.extend_from_slice(&[0u8; 16]);
                        b.extend_from_slice(&[0xee; 64]);
                    }
                    let _ = s.write_all(&b);
                    held.push(s);
                }
            }
            held
        });
        let threads_before = threads_of_this_process();
        let results = verbs_pair_watched(
            device,
            |t, peer| {
                // Long enough that the stranger has done everything while the ranks talk:
                // rank 0 decides when to stop, and says so in the first byte.
                let deadline = Instant::now() + Duration::from_secs(2);
                let mut rounds = 0u32;
                loop {
                    let mut msg: Vec<u8> = (0..4096u32).map(|i| (i + rounds) as u8).collect();
                    let more = Instant::now() < deadline || rounds < 50;
                    msg[0] = more as u8;
                    if t.rank() == 0 {
                        t.send(peer, &msg).unwrap();
                        let mut back = vec![0u8; 4096];
                        t.recv(peer, &mut back).unwrap();
                        assert_eq!(back, msg, "round {rounds}");
                        if !more {
                            break;
                        }
                    } else {
                        let mut got = vec![0u8; 4096];
                        t.recv(peer, &mut got).unwrap();
                        msg[0] = got[0];
                        assert_eq!(got, msg, "round {rounds}");
                        t.send(peer, &got).unwrap();
                        if got[0] == 0 {
                            break;
                        }
                    }
                    rounds += 1;
                }
                threads_of_this_process()
            },
            Some(seen_tx),
        );
        let held = stranger.join().unwrap();
        assert!(
            held.len() > 258,
            "{device}: the stranger reached the devices"
        );
        // Strangers wait at the door (16 at most, no thread each): the ranks' threads alone.
        let most = results.into_iter().max().unwrap();
        assert!(
            most < threads_before + 60,
            "{device}: {most} threads with the stranger's connections open (from {threads_before})"
        );
    }
}

fn threads_of_this_process() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

/// Small messages go eagerly and large ones against a notice; a receive of the wrong size is
/// named whichever way the sizes fall, never delivered as data.
#[test]
fn verbs_names_a_size_mismatch_small_or_large() {
    type Case = fn(&mut dyn tbbench_runners::transport::Transport, usize) -> Option<String>;
    let cases: [(Case, &[&str]); 2] = [
        (
            |t, peer| {
                if t.rank() == 0 {
                    t.send(peer, &[0u8; 10]).unwrap();
                    None
                } else {
                    Some(t.recv(peer, &mut [0u8; 12]).unwrap_err().to_string())
                }
            },
            &["size mismatch", "10-byte", "12", "rank 0"],
        ),
        (
            |t, peer| {
                if t.rank() == 0 {
                    t.send(peer, &[0u8; 8]).unwrap();
                    None
                } else {
                    Some(
                        t.recv(peer, &mut vec![0u8; 1 << 20])
                            .unwrap_err()
                            .to_string(),
                    )
                }
            },
            &["size mismatch", "8-byte", "1048576", "rank 0"],
        ),
    ];
    for device in [APPLE, LINUX] {
        for (body, words) in cases {
            let results = verbs_pair(device, body);
            let err = results[1].clone().unwrap();
            assert!(words.iter().all(|w| err.contains(w)), "{device}: {err}");
        }
    }
    // And the sizes around the eager limit arrive whole, both ways at once.
    for device in [APPLE, LINUX] {
        verbs_pair(device, |t, peer| {
            let limit = tbbench_runners::transport::verbs::EAGER_MAX;
            for len in [0, 1, limit - 1, limit, limit + 1, 3 * limit] {
                let out: Vec<u8> = (0..len).map(|i| (i * 7 + t.rank()) as u8).collect();
                let mut back = vec![0u8; len];
                t.exchange(
                    &[tbbench_runners::transport::SendOp { peer, buf: &out }],
                    &mut [tbbench_runners::transport::RecvOp {
                        peer,
                        buf: &mut back,
                    }],
                )
                .unwrap();
                let want: Vec<u8> = (0..len).map(|i| (i * 7 + peer) as u8).collect();
                assert!(back == want, "{len} bytes arrived wrong");
            }
        });
    }
}

/// Apple's device holds at most 100 memory regions: the buffer that would take one more is
/// refused by tbbench in one line naming the limit, before the device is asked.
#[test]
fn the_apple_devices_memory_region_limit_is_one_clear_error() {
    let results = verbs_pair(APPLE, |t, _| {
        let mut held = Vec::new();
        for _ in 0..200 {
            match t.alloc(4096) {
                Ok(b) => held.push(b),
                Err(e) => return (held.len(), e.to_string()),
            }
        }
        (held.len(), String::new())
    });
    for (held, err) in results {
        // The transport's own control and staging buffers take a few of the 100.
        assert!((90..100).contains(&held), "{held} buffers before the limit");
        assert!(
            err.contains("softrdma_apple0") && err.contains("100 memory regions"),
            "{err}"
        );
    }
}
