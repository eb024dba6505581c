//! `tbbench link` across two network namespaces joined by a veth pair shaped with tc tbf,
//! ranks started with `--rsh 'ip netns exec'` as a hostfile run would start them over ssh.
//! Needs root (skips with the reason printed otherwise).

#[path = "../../../runners/tests/netlab.rs"]
mod netlab;
#[path = "../../../runners/tests/support.rs"]
mod support;

use netlab::{netlab, Lab};
use std::process::Command;
use std::time::Duration;
use support::*;

#[test]
fn shaped_veth_link_is_measured_at_its_shaped_rate() {
    let Some(_lab) = Lab::up("tbt") else {
        return;
    };
    let dir = tmpdir("netns");
    let hosts = dir.join("hosts.json");
    std::fs::write(&hosts, netlab(&["hostfile", "tbt", "0"]).stdout).unwrap();
    let out = dir.join("r.json");
    let o = run(
        &[
            "link",
            "--hostfile",
            hosts.to_str().unwrap(),
            "--rsh",
            "ip netns exec",
            "--sizes",
            "1MiB",
            "--mode",
            "bw",
            "--iters",
            "10",
            "--ceiling",
            "2500mbit",
            "--out",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r: serde_json::Value = read_json(&out);
    assert_eq!(
        r["network"]["addresses"],
        serde_json::json!(["10.71.0.1", "10.71.0.2"])
    );
    assert_eq!(r["network"]["interface"], "tbt0a");
    assert_eq!(r["network"]["mtu"], 9000);
    let gbit = r["results"]["bandwidth"][0]["gbit_per_s"]["avg"]
        .as_f64()
        .unwrap();
    assert!(
        (gbit - 2.5).abs() / 2.5 < 0.05,
        "measured {gbit:.3} Gbit/s over a link shaped to 2.5 Gbit/s"
    );
    let pct = r["results"]["bandwidth"][0]["percent_of_ceiling"]["avg"]
        .as_f64()
        .unwrap();
    assert!(pct > 95.0 && pct < 105.0, "{pct}");
}

/// An OpenMPI-style hostfile names hosts only (no `ips`): rank 0 must advertise the address
/// the others reached it at, not loopback. A small wrapper plays ssh, mapping each host
/// address to its namespace.
#[test]
fn hostfile_without_addresses_routes_data_to_rank_zero_host() {
    let Some(_lab) = Lab::up("tbu") else {
        return;
    };
    let dir = tmpdir("netns-noips");
    let rsh = dir.join("nsrsh");
    std::fs::write(&rsh, "#!/bin/sh\nhost=$1; shift\ncase $host in 10.72.0.1) ns=tbua;; 10.72.0.2) ns=tbub;; *) exit 255;; esac\nexec ip netns exec $ns \"$@\"\n").unwrap();
    Command::new("chmod").arg("+x").arg(&rsh).status().unwrap();
    let hosts = dir.join("hosts");
    std::fs::write(&hosts, "10.72.0.1 slots=1\n10.72.0.2 slots=1\n").unwrap();
    let out = dir.join("r.json");
    let o = run(
        &[
            "link",
            "--hostfile",
            hosts.to_str().unwrap(),
            "--rsh",
            rsh.to_str().unwrap(),
            "--buffer",
            "64k",
            "--iters",
            "20",
            "--out",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r: serde_json::Value = read_json(&out);
    assert_eq!(
        r["network"]["addresses"],
        serde_json::json!(["10.72.0.1", "10.72.0.2"])
    );
}

/// `--over` across two shaped networks of the lab in one invocation: control traffic stays on
/// the hostfile's addresses (the 2.5 Gbit/s network) while each run's data goes over its own
/// subnet; each network is measured within its own shaped rate (the slower one at it), and the
/// report puts both side by side.
#[test]
fn over_runs_each_shaped_network_and_the_report_shows_both() {
    let Some(_lab) = Lab::up("tbo") else {
        return;
    };
    let dir = tmpdir("netns-over");
    let hosts = dir.join("hosts.json");
    std::fs::write(&hosts, netlab(&["hostfile", "tbo", "0"]).stdout).unwrap();
    // A shaped rate is a CPU-bound measurement on two vCPUs: one retry absorbs a neighbour's
    // burst; a link that is not shaped as configured fails both times.
    let mut out = dir.join("results-1");
    let mut labels = Vec::new();
    for attempt in 1..=2 {
        out = dir.join(format!("results-{attempt}"));
        let o = run(
            &[
                "link",
                "--hostfile",
                hosts.to_str().unwrap(),
                "--rsh",
                "ip netns exec",
                "--over",
                "tcp:10.71.0.0/24,tcp:10.72.0.0/24",
                "--sizes",
                "4MiB",
                "--mode",
                "latency,bw",
                "--iters",
                "20",
                "--out",
                out.to_str().unwrap(),
            ],
            Duration::from_secs(240),
        );
        assert!(o.status.success(), "{}", text(&o.stderr));
        let stdout = text(&o.stdout);
        assert!(stdout.contains("== side by side =="), "{stdout}");
        let mut files: Vec<_> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        assert_eq!(files.len(), 2, "{files:?}");
        labels.clear();
        let mut off = Vec::new();
        for (f, (net, shaped)) in files.iter().zip([("10.71.0", 2.5), ("10.72.0", 10.0)]) {
            let r = read_json(f);
            let addrs = r["network"]["addresses"].as_array().unwrap();
            assert!(
                addrs.iter().all(|a| a.as_str().unwrap().starts_with(net)),
                "{}: data went over {addrs:?}, not {net}.x",
                f.display()
            );
            let bw = r["results"]["bandwidth"]
                .as_array()
                .unwrap()
                .iter()
                .find(|b| b["mode"] == "bw")
                .unwrap();
            // The median iteration: a scheduler hiccup in one iteration does not move it.
            let gbit = bw["iteration_gbit_per_s"]["median"].as_f64().unwrap();
            // Each network's shaping holds (never above its rate); the 2.5 Gbit/s one is
            // reached; the 10 Gbit/s one needs more CPU than a busy 2-vCPU host always has
            // (7.3–7.9 Gbit/s seen while neighbours ran), so it must only be well above the
            // 2.5 Gbit/s network's ceiling: proof its data did not go over the slow one.
            let floor = if shaped > 2.5 {
                2.0 * 2.5
            } else {
                0.95 * shaped
            };
            if gbit > 1.05 * shaped || gbit < floor {
                off.push(format!(
                    "{}: measured {gbit:.3} Gbit/s over a network shaped to {shaped} Gbit/s \
                     (expected {floor:.2} to {:.2})",
                    f.display(),
                    1.05 * shaped
                ));
            }
            labels.push(r["network"]["label"].as_str().unwrap().to_string());
        }
        if off.is_empty() {
            break;
        }
        assert!(attempt < 2, "{}", off.join("; "));
        eprintln!("attempt {attempt}: {}; measuring again", off.join("; "));
    }
    assert_ne!(
        labels[0], labels[1],
        "the two networks need their own labels"
    );

    let html = dir.join("report.html");
    let summary = dir.join("summary.json");
    let o = run(
        &[
            "report",
            out.to_str().unwrap(),
            "-o",
            html.to_str().unwrap(),
            "--json",
            summary.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let s = read_json(&summary);
    let nets = s["sections"]["link"]["networks"].as_array().unwrap();
    assert_eq!(nets.len(), 2, "{nets:?}");
    let page = std::fs::read_to_string(&html).unwrap();
    let bw_chart = page
        .split("<figure class=\"chart\"")
        .find(|f| f.contains("Bandwidth, one direction"))
        .expect("a bandwidth chart");
    for l in &labels {
        assert!(
            bw_chart.contains(l.as_str()),
            "{l} not in the bandwidth chart"
        );
    }
}
