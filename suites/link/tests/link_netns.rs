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

/// `tbbench link --over tcp:links` with the hostfile a form of MLX's writes: every cabled
/// pair, one at a time, on its own cable.
fn link_over_links(
    lab: &netlab::CabledLab,
    dir: &std::path::Path,
    form: &str,
    extra: &[&str],
) -> (std::process::Output, serde_json::Value) {
    link_over(lab, dir, form, "tcp:links", extra)
}

/// `tbbench link --over NET` (`tcp:links`, `verbs:links` on the software RDMA device; `verbs`:
/// `--transport verbs`, which a hostfile naming devices per peer puts over the cables) with
/// the hostfile a form of MLX's writes.
fn link_over(
    lab: &netlab::CabledLab,
    dir: &std::path::Path,
    form: &str,
    net: &str,
    extra: &[&str],
) -> (std::process::Output, serde_json::Value) {
    let hosts = lab.hostfile(dir, form);
    let out = dir.join(format!(
        "{}-{form}-{}.json",
        lab.shape,
        net.replace(':', "-")
    ));
    let lib = so();
    let mut args = vec![
        "link",
        "--hostfile",
        hosts.to_str().unwrap(),
        "--rsh",
        "ip netns exec",
        "--nodes",
        if lab.shape == "pair2" { "2" } else { "4" },
        if net == "verbs" {
            "--transport"
        } else {
            "--over"
        },
        net,
        "--out",
        out.to_str().unwrap(),
    ];
    if net.starts_with("verbs") {
        args.extend_from_slice(&["--verbs-lib", lib.to_str().unwrap()]);
    }
    args.extend_from_slice(extra);
    let o = run(&args, Duration::from_secs(300));
    assert!(
        o.status.success(),
        "{form}: {}\n{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    (o, read_json(&out))
}

/// Cable k's rate in Gbit/s, as `rates` gives it to scripts/netlab.sh (the last repeats).
fn rate_of(rates: &[&str], k: usize) -> f64 {
    let r = rates[k.min(rates.len() - 1)];
    r.trim_end_matches("mbit").parse::<f64>().unwrap() / 1000.0
}

/// The 4-mesh with cables of three rates and the 4-ring, over tcp and over the software RDMA
/// device (a device per cable, as macOS lists them): every cabled pair is measured on its own
/// cable within 10% of that cable's rate, the ring's diagonals named unlinked and not
/// measured, every cable at once moves at least 90% of their rates added up both ways (and not
/// more than they carry), and the management network carries only control traffic. Verbs
/// reads the devices from jaccl's hostfile on the mesh (`--transport verbs`, as a jaccl user
/// runs it) and finds them from the cables' interfaces on the ring (`--over verbs:links` with
/// MLX's ring hostfile, which names none).
#[test]
fn every_cable_of_a_mesh_and_a_ring_is_measured_at_its_own_rate() {
    let dir = tmpdir("links");
    let bw = [
        "--mode", "bw", "--sizes", "1MiB", "--window", "8", "--iters", "10",
    ];
    // Rates low enough that every cable at once (12 directions on the mesh) leaves the 2
    // cores of a CI machine room to spare while other tests run.
    for (shape, prefix, rates) in [
        (
            "mesh4",
            "tbq",
            &[
                "300mbit", "400mbit", "500mbit", "300mbit", "400mbit", "500mbit",
            ][..],
        ),
        (
            "ring4",
            "tbr",
            &["400mbit", "500mbit", "400mbit", "500mbit"][..],
        ),
    ] {
        let Some(lab) = netlab::CabledLab::up(shape, prefix, rates) else {
            return;
        };
        for (net, form) in [
            ("tcp:links", "jaccl"),
            // jaccl names each host's devices: plain --transport verbs runs over the cables.
            if shape == "mesh4" {
                ("verbs", "jaccl")
            } else {
                ("verbs:links", "ring")
            },
        ] {
            let shape = format!("{shape} {net}");
            let shape = shape.as_str();
            let before: Vec<_> = (0..4).map(|h| lab.tx_bytes(h)).collect();
            let (_, r) = link_over(&lab, &dir, form, net, &bw);
            let after: Vec<_> = (0..4).map(|h| lab.tx_bytes(h)).collect();
            let topo = &r["network"]["topology"];
            let links = r["network"]["links"].as_array().unwrap();
            let mesh = shape.starts_with("mesh4");
            let cables: Vec<(usize, usize)> = if mesh {
                vec![(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
            } else {
                vec![(0, 1), (1, 2), (2, 3), (0, 3)]
            };
            assert_eq!(links.len(), cables.len(), "{shape}: {links:#?}");
            if net.starts_with("verbs") {
                assert_eq!(r["network"]["link_kind"], "rdma-emulated", "{shape}");
            }
            if mesh {
                assert_eq!(topo["shape"], "full-mesh");
                assert_eq!(topo["unlinked"], serde_json::json!([]));
            } else {
                assert_eq!(topo["shape"], "ring");
                assert_eq!(topo["unlinked"], serde_json::json!([[0, 2], [1, 3]]));
            }
            let pairs = r["results"]["pairs"].as_array().unwrap();
            assert_eq!(pairs.len(), cables.len(), "{shape}: {pairs:#?}");
            for (k, &(a, b)) in cables.iter().enumerate() {
                // netlab numbers a ring's last cable 3-0; the pair is 0-3.
                let want = rate_of(rates, k);
                let p = pairs
                    .iter()
                    .find(|p| p["ranks"] == serde_json::json!([a, b]))
                    .unwrap_or_else(|| panic!("{shape}: pair {a}-{b} not measured"));
                let got = p["best_gbit_per_s"].as_f64().unwrap();
                assert!(
                    (got - want).abs() / want < 0.10,
                    "{shape}: pair {a}-{b} moved {got:.3} Gbit/s over a cable shaped to {want}"
                );
                let link = links
                    .iter()
                    .find(|l| l["ranks"] == serde_json::json!([a, b]))
                    .unwrap();
                assert_eq!(link["ends"][0]["interface"], format!("en{b}"), "{link}");
                assert_eq!(link["ends"][1]["interface"], format!("en{a}"), "{link}");
                // Each end's RDMA device: the hostfile's, or the one its interface has.
                if net.starts_with("verbs") {
                    assert_eq!(
                        link["ends"][0]["rdma_device"],
                        format!("rdma_en{b}"),
                        "{link}"
                    );
                    assert_eq!(
                        link["ends"][1]["rdma_device"],
                        format!("rdma_en{a}"),
                        "{link}"
                    );
                }
            }
            let c = &r["results"]["concurrent"];
            let all: f64 = 2.0 * (0..cables.len()).map(|k| rate_of(rates, k)).sum::<f64>();
            let got = c["aggregate_gbit_per_s"].as_f64().unwrap();
            assert_eq!(c["directions"], 2 * cables.len());
            assert_eq!(c["wrong_bytes"], 0);
            assert!(
                got >= 0.9 * all && got <= 1.05 * all,
                "{shape}: every cable at once moved {got:.2} Gbit/s of {all:.2}"
            );
            // The data went over the cables; the management network carried the rest.
            let sent = |h: usize, pick: &dyn Fn(&str) -> bool| -> u64 {
                after[h]
                    .iter()
                    .filter(|(n, _)| pick(n))
                    .map(|(n, b)| b - before[h].iter().find(|(m, _)| m == n).map_or(0, |x| x.1))
                    .sum()
            };
            let cable_bytes: u64 = (0..4).map(|h| sent(h, &|n| n.starts_with("en"))).sum();
            let mgmt_bytes: u64 = (0..4).map(|h| sent(h, &|n| n == "mgmt")).sum();
            assert!(
            cable_bytes > 100 << 20 && mgmt_bytes < cable_bytes / 100,
            "{shape}: {cable_bytes} bytes on the cables, {mgmt_bytes} on the management network"
        );
        }
    }
}

/// Every hostfile form MLX 0.32 writes (its list, jaccl, jaccl-ring, ring) and OpenMPI's give
/// the run the links discovery finds on the 4-ring; jaccl's devices are recorded per end.
#[test]
fn every_hostfile_form_gives_the_links_discovery_finds() {
    let Some(lab) = netlab::CabledLab::up("ring4", "tbh", &["1000mbit"]) else {
        return;
    };
    let dir = tmpdir("links-forms");
    let quick = ["--mode", "latency", "--sizes", "8", "--iters", "20"];
    let ends = |r: &serde_json::Value| -> Vec<String> {
        r["network"]["links"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                format!(
                    "{} {}-{} {}-{}",
                    l["ranks"],
                    l["ends"][0]["interface"],
                    l["ends"][1]["interface"],
                    l["ends"][0]["address"],
                    l["ends"][1]["address"]
                )
            })
            .collect()
    };
    let (_, found) = link_over_links(&lab, &dir, "list", &quick);
    assert_eq!(found["network"]["topology"]["shape"], "ring");
    for form in ["jaccl", "jaccl-ring", "ring", "openmpi"] {
        let (_, r) = link_over_links(&lab, &dir, form, &quick);
        assert_eq!(ends(&r), ends(&found), "{form}");
        // The same cabling; an MLX form also records its backend (the doctor holds the
        // cabling to it).
        let mut topology = r["network"]["topology"].clone();
        let backend = topology
            .as_object_mut()
            .unwrap()
            .remove("backend")
            .unwrap_or_default();
        assert_eq!(topology, found["network"]["topology"], "{form}");
        let want = if form == "openmpi" {
            serde_json::Value::Null
        } else {
            form.into()
        };
        assert_eq!(backend, want, "{form}");
        assert_eq!(r["results"]["pairs"].as_array().unwrap().len(), 4, "{form}");
        let device = &r["network"]["links"][0]["ends"][0]["rdma_device"];
        if form.starts_with("jaccl") {
            assert_eq!(device, "rdma_en1", "{form}");
        } else {
            assert!(device.is_null(), "{form}: {device}");
        }
    }
}

/// On the ring hpl lays its grid on the cables (2x2 by the snake map; a 1x4 grid asked for
/// round the ring in one row, cabled between neighbours); `link --pairs` naming an unlinked
/// pair is refused; two cables between a pair carry one message striped over both, at least
/// 1.8 times one cable's rate, over tcp and the software RDMA device.
#[test]
fn unlinked_pairs_are_named_and_two_cables_carry_twice_one() {
    let dir = tmpdir("links-refused");
    {
        let Some(lab) = netlab::CabledLab::up("ring4", "tbu", &["1000mbit"]) else {
            return;
        };
        let hosts = lab.hostfile(&dir, "jaccl");
        let on_ring = |suite: &str, extra: &[&str]| {
            let mut args = vec![
                suite,
                "--hostfile",
                hosts.to_str().unwrap(),
                "--rsh",
                "ip netns exec",
                "--nodes",
                "4",
                "--over",
                "tcp:links",
            ];
            args.extend_from_slice(extra);
            run(&args, Duration::from_secs(60))
        };
        // hpl's 2x2 grid goes round the ring (the snake map: every row and column on a
        // cable); a 1x4 grid has the diagonals in its one row, named in one line.
        let out = dir.join("hpl-ring.json");
        let o = on_ring("hpl", &["--n", "400", "--out", out.to_str().unwrap()]);
        assert!(o.status.success(), "{}", text(&o.stderr));
        let r = read_json(&out);
        assert_eq!(r["verification"]["passed"], true);
        assert_eq!(
            r["results"]["runs"][0]["pmap"], "snake",
            "{}",
            r["results"]["runs"][0]
        );
        // A 1x4 grid asked for goes round the ring in its one row, cabled only between
        // neighbours, and says so.
        let out = dir.join("hpl-ring-1x4.json");
        let o = on_ring(
            "hpl",
            &[
                "--n",
                "400",
                "--p",
                "1",
                "--q",
                "4",
                "--out",
                out.to_str().unwrap(),
            ],
        );
        assert!(o.status.success(), "{}", text(&o.stderr));
        let r = read_json(&out);
        assert_eq!(r["verification"]["passed"], true);
        assert!(
            text(&o.stderr).contains("process rows are cabled only between neighbours"),
            "{}",
            text(&o.stderr)
        );
        let o = on_ring("link", &["--pairs", "0-2"]);
        assert!(!o.status.success());
        assert!(
            text(&o.stderr).contains("have no cable between them"),
            "{}",
            text(&o.stderr)
        );
    }
    let Some(lab) = netlab::CabledLab::up("pair2", "tbp", &["500mbit"]) else {
        return;
    };
    // Two cables between the pair: tcp stripes each message over a connection on each, the
    // software RDMA device over a queue pair on each cable's device (jaccl-ring's two `rdma`
    // entries per peer).
    for net in ["tcp:links", "verbs:links"] {
        let (_, r) = link_over(
            &lab,
            &dir,
            "jaccl-ring",
            net,
            &[
                "--mode", "bw", "--sizes", "1MiB", "--window", "16", "--iters", "10",
            ],
        );
        let links = r["network"]["links"].as_array().unwrap();
        assert_eq!(links.len(), 2, "{links:#?}");
        assert_eq!(
            (links[0]["cable"].as_u64(), links[1]["cable"].as_u64()),
            (Some(0), Some(1))
        );
        let got = r["results"]["bandwidth"][0]["gbit_per_s"]["avg"]
            .as_f64()
            .unwrap();
        assert!(
            got >= 1.8 * 0.5,
            "{net}: two 0.5 Gbit/s cables moved {got:.3} Gbit/s"
        );
    }
}

/// A ring of six, its hosts listed out of the cables' order (0 2 4 1 3 5): hpl goes round the
/// ring in one process row laid in the cables' order (a 2x3 grid would put uncabled ranks in
/// a column), over tcp and over the software RDMA device, where ranks with no cable have no
/// queue pairs at all, so any message off the cables would end the run; hpl-mxp likewise; a
/// 2x3 grid asked for is refused in one line.
#[test]
fn hpl_goes_round_a_ring_of_six_listed_out_of_order() {
    let Some(_lab) = netlab::CabledLab::up("ring6", "tbg", &["1000mbit"]) else {
        return;
    };
    let dir = tmpdir("hpl-ring6");
    let hosts = dir.join("permuted.hosts");
    std::fs::write(
        &hosts,
        "tbg0 slots=1\ntbg2 slots=1\ntbg4 slots=1\ntbg1 slots=1\ntbg3 slots=1\ntbg5 slots=1\n",
    )
    .unwrap();
    let lib = so();
    let on_ring = |suite: &str, net: &str, extra: &[&str]| {
        let mut args = vec![
            suite,
            "--hostfile",
            hosts.to_str().unwrap(),
            "--rsh",
            "ip netns exec",
            "--nodes",
            "6",
            "--over",
            net,
            "--verbs-lib",
            lib.to_str().unwrap(),
            "--n",
            "600",
            "--nb",
            "50",
        ];
        args.extend_from_slice(extra);
        run(&args, Duration::from_secs(180))
    };
    for (suite, net) in [
        ("hpl", "tcp:links"),
        ("hpl", "verbs:links"),
        ("hpl-mxp", "verbs:links"),
    ] {
        let out = dir.join(format!("{suite}-{}.json", net.replace(':', "-")));
        let o = on_ring(suite, net, &["--out", out.to_str().unwrap()]);
        assert!(o.status.success(), "{suite} {net}: {}", text(&o.stderr));
        let r = read_json(&out);
        assert_eq!(r["verification"]["passed"], true, "{suite} {net}");
        let run = &r["results"]["runs"][0];
        assert_eq!(
            (run["p"].as_u64(), run["q"].as_u64()),
            (Some(1), Some(6)),
            "{run}"
        );
        if suite == "hpl" {
            // The ranks in the cables' order: tbg0 tbg1 ... are ranks 0 3 1 4 2 5.
            assert_eq!(run["order"], serde_json::json!([0, 3, 1, 4, 2, 5]), "{run}");
        }
    }
    let o = on_ring("hpl", "tcp:links", &["--p", "2", "--q", "3"]);
    assert!(!o.status.success());
    let err = text(&o.stderr);
    let errors: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
    assert!(
        errors.len() == 1
            && errors[0].contains("hpl's 2x3 grid puts ranks with no cable between them"),
        "{err}"
    );
}
