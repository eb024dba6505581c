//! `tbbench doctor` end to end: in the network lab (two network namespaces joined by veth
//! pairs, one per network, shaped with tc tbf; ranks started with `--rsh 'ip netns exec'` as a
//! hostfile run starts them over ssh), and on this machine alone. The lab tests need root
//! (they skip with the reason printed otherwise).

#[path = "../../../runners/tests/netlab.rs"]
mod netlab;
#[path = "../../../runners/tests/support.rs"]
mod support;

use netlab::{netlab, Lab};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;
use support::*;

/// Runs the doctor across the lab's two hosts on network `net`, with `extra` flags.
fn doctor(dir: &Path, net: &str, extra: &[&str]) -> (Output, serde_json::Value) {
    let hosts = dir.join(format!("hosts-{net}.json"));
    std::fs::write(&hosts, netlab(&["hostfile", "tbd", net]).stdout).unwrap();
    let out = dir.join(format!("doctor-{net}.json"));
    let mut args = vec![
        "doctor",
        "--hostfile",
        hosts.to_str().unwrap(),
        "--rsh",
        "ip netns exec",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let o = run(&args, Duration::from_secs(60));
    assert!(
        out.exists(),
        "no result file\nstdout:\n{}\nstderr:\n{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    (o, read_json(&out))
}

fn kinds(r: &serde_json::Value) -> Vec<String> {
    r["results"]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["kind"].as_str().unwrap().to_string())
        .collect()
}

/// The unshaped network with the same MTU at both ends: the one pair of hosts is reached and
/// timed, nothing is wrong, exit 0, and `--json` holds the pair and no problem.
#[test]
fn a_clean_lab_passes_with_no_problems() {
    let Some(_lab) = Lab::up("tbd") else {
        return;
    };
    let dir = tmpdir("doctor-clean");
    let json = dir.join("findings.json");
    let (o, r) = doctor(&dir, "2", &["--json", json.to_str().unwrap()]);
    assert!(
        o.status.success(),
        "{}\n{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    assert_eq!(r["suite"], "doctor");
    assert_eq!(r["verification"]["passed"], true);
    assert_eq!(r["network"]["interface"], "tbd2a");
    assert!(kinds(&r).is_empty(), "{:#}", r["results"]["problems"]);
    let pairs = r["results"]["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 1);
    assert_eq!(pairs[0]["hosts"], serde_json::json!(["tbda", "tbdb"]));
    assert_eq!(pairs[0]["cross_host"], true);
    assert_eq!(pairs[0]["mtu"], serde_json::json!([9000, 9000]));
    assert!(pairs[0]["gbit_per_s"].as_f64().unwrap() > 0.0);
    assert!(pairs[0]["one_way_us_median"].as_f64().unwrap() > 0.0);
    assert_eq!(r["results"]["hosts"].as_array().unwrap().len(), 2);
    let stdout = text(&o.stdout);
    assert!(stdout.contains("no problems found"), "{stdout}");
    assert!(stdout.contains("tbda-tbdb (0-1)"), "{stdout}");
    let f = read_json(&json);
    assert_eq!(f["problems"], serde_json::json!([]));
    assert_eq!(f["pairs"][0]["network"], "tcp/tbd2a (virtual)");
}

/// The 2.5 Gbit/s network held against 10 Gbit/s. veth reports no speed (sysfs `speed` is
/// EINVAL, and tbbench treats virtual links' figures as fiction), so `--ceiling 10gbit` stands
/// for the speed a 10 GbE port would report: the same comparison, its source recorded.
#[test]
fn a_link_shaped_far_below_its_speed_is_named_and_exits_1() {
    let Some(_lab) = Lab::up("tbd") else {
        return;
    };
    let dir = tmpdir("doctor-slow");
    let (o, r) = doctor(&dir, "0", &["--ceiling", "10gbit"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert_eq!(kinds(&r), ["link-below-speed"]);
    let p = &r["results"]["problems"][0];
    assert_eq!(p["hosts"], serde_json::json!(["tbda", "tbdb"]));
    assert_eq!(p["network"], "tcp/tbd0a (virtual)");
    assert_eq!(r["verification"]["passed"], false);
    let pair = &r["results"]["pairs"][0];
    assert_eq!(pair["nominal_gbit_per_s"], 10.0);
    assert_eq!(pair["nominal_source"], "--ceiling");
    // The shaped rate, with room for a busy two-core host; far below a third of 10.
    let gbit = pair["gbit_per_s"].as_f64().unwrap();
    assert!(gbit > 0.0 && gbit < 2.5 * 1.15, "measured {gbit:.2} Gbit/s");
    let line = text(&o.stdout)
        .lines()
        .find(|l| l.starts_with("problem [link-below-speed] tcp/tbd0a (virtual) tbda,tbdb: "))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no problem line:\n{}", text(&o.stdout)));
    assert!(line.contains(" — "), "says what to do: {line}");
    assert!(
        text(&o.stderr).contains("verification FAILED (link-below-speed)"),
        "{}",
        text(&o.stderr)
    );
}

/// `--over` runs the doctor once per network: the slow network's problem comes out under its
/// label, the exit status is 1, and `--json` holds both networks' pairs.
#[test]
fn over_names_each_networks_problems_and_json_holds_every_network() {
    let Some(_lab) = Lab::up("tbd") else {
        return;
    };
    let dir = tmpdir("doctor-over");
    let hosts = dir.join("hosts.json");
    std::fs::write(&hosts, netlab(&["hostfile", "tbd", "0"]).stdout).unwrap();
    let out = dir.join("results");
    let json = dir.join("findings.json");
    let o = run(
        &[
            "doctor",
            "--hostfile",
            hosts.to_str().unwrap(),
            "--rsh",
            "ip netns exec",
            "--over",
            "tcp:10.71.0.0/24,tcp:10.73.0.0/24",
            "--ceiling",
            "10gbit",
            "--out",
            out.to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 2);
    // The slow network ran and found its problem: named so, not as a network that failed.
    let err = text(&o.stderr);
    assert!(
        err.contains("of 2 networks, 1 ran and failed its checks (tcp:10.71.0.0/24"),
        "{err}"
    );
    assert!(!err.contains("did not run through"), "{err}");
    let f = read_json(&json);
    let slow: Vec<&serde_json::Value> = f["problems"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["kind"] == "link-below-speed")
        .collect();
    assert!(
        slow.iter().any(|p| p["network"] == "tcp/tbd0a (virtual)"),
        "{:#}",
        f["problems"]
    );
    let nets: Vec<&str> = f["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["network"].as_str().unwrap())
        .collect();
    assert_eq!(nets, ["tcp/tbd0a (virtual)", "tcp/tbd2a (virtual)"]);
}

#[test]
fn one_end_with_another_mtu_is_named_with_both_hosts() {
    let Some(_lab) = Lab::up("tbd") else {
        return;
    };
    let set = Command::new("ip")
        .args(["-n", "tbdb", "link", "set", "dev", "tbd2b", "mtu", "1500"])
        .status()
        .unwrap();
    assert!(set.success());
    let dir = tmpdir("doctor-mtu");
    let (o, r) = doctor(&dir, "2", &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert_eq!(kinds(&r), ["mtu-mismatch"]);
    let p = &r["results"]["problems"][0];
    assert_eq!(p["hosts"], serde_json::json!(["tbda", "tbdb"]));
    assert_eq!(
        p["detail"].as_str().unwrap().split(" — ").next().unwrap(),
        "MTU 9000 on tbda (tbd2a) but 1500 on tbdb (tbd2b)"
    );
}

/// A host route sends the peer's traffic out by another network's veth (the kernel still
/// delivers it: the peer holds the address): the run names tbd2a, the kernel picks tbd1a.
#[test]
fn traffic_routed_by_another_interface_is_named() {
    let Some(_lab) = Lab::up("tbd") else {
        return;
    };
    let add = Command::new("ip")
        .args(["-n", "tbda", "route", "add", "10.73.0.2/32", "dev", "tbd1a"])
        .status()
        .unwrap();
    assert!(add.success());
    let dir = tmpdir("doctor-route");
    let (o, r) = doctor(&dir, "2", &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert_eq!(kinds(&r), ["route-mismatch"]);
    let p = &r["results"]["problems"][0];
    assert_eq!(p["hosts"], serde_json::json!(["tbda", "tbdb"]));
    let d = p["detail"].as_str().unwrap();
    assert!(
        d.starts_with("tbda would send to tbdb (10.73.0.2) by tbd1a"),
        "{d}"
    );
}

/// Two local ranks: they are timed against each other, the result says no link between hosts
/// was checked, and the exit status follows the problems this machine has (none on a healthy
/// one).
#[test]
fn two_local_ranks_complete_and_write_a_result() {
    let dir = tmpdir("doctor-local");
    let out = dir.join("r.json");
    let o = run(
        &["doctor", "--nodes", "2", "--out", out.to_str().unwrap()],
        Duration::from_secs(60),
    );
    let r = read_json(&out);
    assert_eq!(r["suite"], "doctor");
    let pairs = r["results"]["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 1);
    assert_eq!(pairs[0]["cross_host"], false);
    assert_eq!(pairs[0]["ping_iters"], 200);
    assert!(pairs[0]["gbit_per_s"].as_f64().unwrap() > 0.0);
    assert!(r["results"]["note"]
        .as_str()
        .unwrap()
        .contains("no link between hosts was checked"));
    let problems = r["results"]["problems"].as_array().unwrap();
    assert_eq!(o.status.success(), problems.is_empty(), "{problems:#?}");
    assert_eq!(r["verification"]["passed"], problems.is_empty());
}

/// A host whose OpenBLAS chose a kernel older than its CPU (the stand-in makes it choose
/// Prescott) or was held to one by OPENBLAS_CORETYPE is no problem where tbbench corrects
/// it or its packed product stands in: the doctor passes such a host, and each host's BLAS
/// record names what happened.
#[test]
fn an_openblas_kernel_older_than_the_cpu_that_tbbench_works_around_is_no_problem() {
    let dir = tmpdir("doctor-blas");
    for (name, var, value) in [
        ("detected", "TBBENCH_TEST_OPENBLAS_DETECTS", "Prescott"),
        ("held", "OPENBLAS_CORETYPE", "Prescott"),
    ] {
        let out = dir.join(format!("{name}.json"));
        let child = Command::new(bin())
            .args(["doctor", "--nodes", "2", "--out", out.to_str().unwrap()])
            .env_remove("OPENBLAS_CORETYPE")
            .env_remove("TBBENCH_OPENBLAS_DETECTED")
            .env_remove("TBBENCH_HPL_PRODUCT")
            .env(var, value)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let (o, _) = finish(child, Duration::from_secs(60));
        let r = read_json(&out);
        let k = kinds(&r);
        assert!(
            !k.iter().any(|k| k.starts_with("blas")),
            "{name}: {k:?}\n{}",
            text(&o.stderr)
        );
        assert_eq!(o.status.success(), k.is_empty(), "{name}: {k:?}");
    }
}

/// A planned run larger than any host's memory: named per host, exit 1, the result written.
#[test]
fn a_planned_run_too_large_for_free_memory_is_named() {
    let dir = tmpdir("doctor-memory");
    let out = dir.join("r.json");
    let o = run(
        &[
            "doctor",
            "--nodes",
            "2",
            "--hpl-n",
            "10000000",
            "--out",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let r = read_json(&out);
    let low: Vec<&serde_json::Value> = r["results"]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["kind"] == "low-memory")
        .collect();
    assert_eq!(low.len(), 1, "one host: {low:#?}");
    assert!(low[0]["detail"]
        .as_str()
        .unwrap()
        .contains("hpl --n 10000000 needs"));
    let bad = run(&["doctor", "--memory", "lots"], Duration::from_secs(10));
    assert_eq!(bad.status.code(), Some(2));
    assert_eq!(
        text(&bad.stderr).lines().count(),
        1,
        "{}",
        text(&bad.stderr)
    );
}

/// The two hosts default to different TCP congestion controls (each namespace has its own):
/// named with each host's, from what the ranks' connections really ran.
#[test]
fn hosts_with_different_tcp_congestion_controls_are_named() {
    let Some(_lab) = Lab::up("tbd") else {
        return;
    };
    // A namespace may default only to an algorithm on the host's allowed list.
    let allowed = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
        .unwrap_or_default();
    let algos: Vec<&str> = allowed.split_whitespace().collect();
    if algos.len() < 2 {
        skipped(&format!(
            "one TCP congestion control allowed here ({allowed:?}): no two hosts can differ"
        ));
        return;
    }
    for (ns, cc) in [("tbda", algos[0]), ("tbdb", algos[1])] {
        let set = Command::new("ip")
            .args(["netns", "exec", ns, "sysctl", "-qw"])
            .arg(format!("net.ipv4.tcp_congestion_control={cc}"))
            .status()
            .unwrap();
        assert!(set.success(), "{ns}: {cc}");
    }
    let dir = tmpdir("doctor-congestion");
    let (o, r) = doctor(&dir, "2", &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert_eq!(kinds(&r), ["congestion-mismatch"]);
    let p = &r["results"]["problems"][0];
    assert_eq!(p["hosts"], serde_json::json!(["tbda", "tbdb"]));
    assert_eq!(
        p["detail"].as_str().unwrap().split(" — ").next().unwrap(),
        format!(
            "TCP congestion control {} on tbda; {} on tbdb",
            algos[0], algos[1]
        )
    );
}

/// A ring of four cabled as Thunderbolt clusters are, checked against the hostfile's backend:
/// MLX's jaccl runs a full mesh, so the ring's two missing diagonals are each named with their
/// hosts; jaccl-ring runs on the ring, so none is; a cable whose ends differ in MTU is named
/// with both hosts.
#[test]
fn the_cabling_is_held_to_the_backend_and_each_cable_to_itself() {
    let Some(lab) = netlab::CabledLab::up("ring4", "tbc", &["1000mbit"]) else {
        return;
    };
    let dir = tmpdir("doctor-cabling");
    // Doctor over the cables with a hostfile of `form`, its result saved as `name`.
    let doctor_with = |hosts: &Path, name: &str| -> (Output, serde_json::Value) {
        let out = dir.join(format!("doctor-{name}.json"));
        let o = run(
            &[
                "doctor",
                "--hostfile",
                hosts.to_str().unwrap(),
                "--rsh",
                "ip netns exec",
                "--nodes",
                "4",
                "--over",
                "tcp:links",
                "--out",
                out.to_str().unwrap(),
            ],
            Duration::from_secs(120),
        );
        assert!(out.exists(), "{name}: {}", text(&o.stderr));
        (o, read_json(&out))
    };
    let doctor = |form: &str| doctor_with(&lab.hostfile(&dir, form), form);
    let cable_problems = |r: &serde_json::Value| -> Vec<(String, Vec<String>)> {
        r["results"]["problems"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["kind"].as_str().unwrap().starts_with("cable-"))
            .map(|p| {
                (
                    p["kind"].as_str().unwrap().to_string(),
                    p["hosts"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|h| h.as_str().unwrap().to_string())
                        .collect(),
                )
            })
            .collect()
    };
    let (o, r) = doctor("jaccl");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    assert_eq!(r["network"]["topology"]["backend"], "jaccl");
    let found = cable_problems(&r);
    let h = |a: &str, b: &str| vec![a.to_string(), b.to_string()];
    assert_eq!(
        found,
        vec![
            ("cable-missing".to_string(), h("tbc0", "tbc2")),
            ("cable-missing".to_string(), h("tbc1", "tbc3")),
        ],
        "{}",
        text(&o.stdout)
    );
    assert!(text(&o.stdout).contains("backend jaccl runs a full mesh"));
    // Only the four cables were timed.
    assert_eq!(r["results"]["pairs"].as_array().unwrap().len(), 4);
    let (o, r) = doctor("jaccl-ring");
    assert!(kinds(&r).is_empty(), "{}", text(&o.stdout));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    // Host 1's end of its cable to host 2 (its interface en2) at another MTU.
    let set = Command::new("ip")
        .args(["-n", "tbc1", "link", "set", "en2", "mtu", "1500"])
        .status()
        .unwrap();
    assert!(set.success());
    let (o, r) = doctor("jaccl-ring");
    assert_eq!(
        cable_problems(&r),
        vec![("cable-mtu-differs".to_string(), h("tbc1", "tbc2"))],
        "{}",
        text(&o.stdout)
    );
    // The same ring with one cable (2-3) at a fifth of the others' rate, as a Thunderbolt 4
    // cable among Thunderbolt 5 ones: that pair, and no other, is named.
    drop(lab);
    let Some(lab) = netlab::CabledLab::up(
        "ring4",
        "tbc",
        &["1000mbit", "1000mbit", "200mbit", "1000mbit"],
    ) else {
        return;
    };
    let (o, r) = doctor_with(&lab.hostfile(&dir, "jaccl-ring"), "slow");
    let slow: Vec<(String, serde_json::Value)> = r["results"]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["kind"].as_str().unwrap().to_string(), p["hosts"].clone()))
        .collect();
    assert_eq!(
        slow,
        vec![(
            "pair-slower-than-others".to_string(),
            serde_json::json!(["tbc2", "tbc3"])
        )],
        "{}",
        text(&o.stdout)
    );
}
