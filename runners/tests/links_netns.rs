//! Suites that move data between every pair (hpl, the built-in decode split by tensors and by
//! pipeline) on a 4-mesh built as a Thunderbolt cluster is cabled (scripts/netlab.sh
//! `cabled`), over `--over tcp:links` with the hostfile MLX's jaccl backend reads: every rank's
//! data goes over its cables, and the management network carries only control traffic (the
//! interfaces' byte counters tell). Needs root (skips with the reason printed otherwise).

#[path = "netlab.rs"]
mod netlab;
#[path = "support.rs"]
mod support;

use std::time::Duration;
use support::*;

#[test]
fn hpl_and_the_decode_move_their_data_over_the_cables_of_a_mesh() {
    let Some(lab) = netlab::CabledLab::up("mesh4", "tbd", &["1000mbit"]) else {
        return;
    };
    let dir = tmpdir("links-suites");
    let hosts = lab.hostfile(&dir, "jaccl");
    let over = [
        "--hostfile",
        hosts.to_str().unwrap(),
        "--rsh",
        "ip netns exec",
        "--nodes",
        "4",
        "--over",
        "tcp:links",
    ];
    let decode = |parallel: &'static str| -> Vec<&'static str> {
        vec![
            "infer",
            "--shape",
            "llama-3.2-3b",
            "--layers",
            "4",
            "--parallel",
            parallel,
            "--max-tokens",
            "4",
        ]
    };
    for (name, mut args) in [
        ("hpl", vec!["hpl", "--n", "1200", "--nb", "64"]),
        ("decode tp", decode("tp")),
        ("decode pp", decode("pp")),
    ] {
        let out = dir.join(format!("{}.json", name.replace(' ', "-")));
        args.extend_from_slice(&over);
        args.extend(["--out", out.to_str().unwrap()]);
        let before: Vec<_> = (0..4).map(|h| lab.tx_bytes(h)).collect();
        let o = run(&args, Duration::from_secs(300));
        let after: Vec<_> = (0..4).map(|h| lab.tx_bytes(h)).collect();
        assert!(o.status.success(), "{name}: {}", text(&o.stderr));
        let r = read_json(&out);
        assert_eq!(r["network"]["topology"]["shape"], "full-mesh", "{name}");
        assert_eq!(r["network"]["links"].as_array().unwrap().len(), 6, "{name}");
        assert_eq!(r["verification"]["passed"], true, "{name}");
        let sent = |pick: &dyn Fn(&str) -> bool| -> u64 {
            let mut total = 0;
            for (now, then) in after.iter().zip(&before) {
                for (n, b) in now.iter().filter(|(n, _)| pick(n)) {
                    total += b - then.iter().find(|(m, _)| m == n).map_or(0, |x| x.1);
                }
            }
            total
        };
        let (cables, mgmt) = (sent(&|n| n.starts_with("en")), sent(&|n| n == "mgmt"));
        // Control traffic (rendezvous, heartbeats, the result) is a few tens of KB a run.
        assert!(
            cables > 1 << 20 && mgmt < cables / 10,
            "{name}: {cables} bytes on the cables, {mgmt} on the management network"
        );
    }
    // `tbbench env` on a host lists its three cables and their far ends, which the runs above
    // made answer.
    let o = std::process::Command::new("ip")
        .args(["netns", "exec", "tbd0", bin(), "env", "--json"])
        .output()
        .unwrap();
    let e: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let cables: Vec<(String, String, bool)> = e["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["interface"].as_str().unwrap().to_string(),
                l["far_end"].as_str().unwrap().to_string(),
                l["far_end_seen"] == true,
            )
        })
        .collect();
    assert_eq!(
        cables,
        [
            ("en1".to_string(), "192.168.0.2".to_string(), true),
            ("en2".into(), "192.168.1.2".into(), true),
            ("en3".into(), "192.168.2.2".into(), true),
        ]
    );
}

/// A hostfile of names alone (OpenMPI's form) and the data on one cable's subnet: the others
/// reach rank 0 by its name, on the management network, so rank 0 listens there too (on
/// every address), not on the subnet's, where they would wait for it until the timeout.
#[test]
fn names_alone_and_a_subnet_for_the_data_meet_on_the_management_network() {
    let Some(lab) = netlab::CabledLab::up("pair2", "tbs", &["1000mbit"]) else {
        return;
    };
    let dir = tmpdir("links-subnet");
    let hosts = lab.hostfile(&dir, "openmpi");
    let out = dir.join("r.json");
    let before = lab.tx_bytes(0);
    let o = run(
        &[
            "link",
            "--hostfile",
            hosts.to_str().unwrap(),
            "--rsh",
            "ip netns exec",
            "--over",
            "tcp:192.168.0.0/30",
            "--sizes",
            "1MiB",
            "--iters",
            "20",
            "--timeout",
            "10",
            "--out",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r = read_json(&out);
    assert_eq!(r["verification"]["passed"], true);
    let after = lab.tx_bytes(0);
    let sent = |name: &str| {
        let b = |v: &[(String, u64)]| v.iter().find(|(n, _)| n == name).map_or(0, |x| x.1);
        b(&after) - b(&before)
    };
    assert!(
        sent("en1") > 20 << 20 && sent("mgmt") < sent("en1") / 10,
        "en1 {} bytes, mgmt {}",
        sent("en1"),
        sent("mgmt")
    );
}

/// Collectives on a ring of four (no diagonals) over its cables: an algorithm that moves
/// data between 0 and 2 or 1 and 3 is refused in one line naming those pairs and what runs;
/// `--algo all` runs what fits and leaves the rest out; `auto` keeps to the cables; every
/// byte is checked. With the hosts listed out of the ring's order, the ring still goes round
/// the cables, and the decode (tp and pp) runs on them.
#[test]
fn collectives_on_a_ring_keep_to_its_cables() {
    let Some(lab) = netlab::CabledLab::up("ring4", "tbq", &["1000mbit"]) else {
        return;
    };
    let dir = tmpdir("links-coll-ring");
    let hosts = lab.hostfile(&dir, "jaccl-ring");
    let coll = |extra: &[&str], out: &std::path::Path| {
        let mut args = vec![
            "coll",
            "--hostfile",
            hosts.to_str().unwrap(),
            "--rsh",
            "ip netns exec",
            "--nodes",
            "4",
            "--over",
            "tcp:links",
            "--op",
            "allreduce",
            "--sizes",
            "4k,1MiB",
            "--iters",
            "5",
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        run(&args, Duration::from_secs(120))
    };
    let out = dir.join("mesh.json");
    let o = coll(&["--algo", "mesh"], &out);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(
        err.contains("all-reduce by mesh moves data between ranks with no cable between them (0-2, 1-3): --algo ring runs on the cables"),
        "{err}"
    );
    assert!(!out.exists());
    for (algo, name) in [("all", "all.json"), ("auto", "auto.json")] {
        let out = dir.join(name);
        let o = coll(&["--algo", algo], &out);
        assert!(o.status.success(), "--algo {algo}: {}", text(&o.stderr));
        let r = read_json(&out);
        assert_eq!(r["verification"]["passed"], true, "--algo {algo}");
        assert_eq!(r["network"]["topology"]["shape"], "ring");
        let ran: Vec<&str> = r["results"]["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| row["algo"].as_str().unwrap())
            .collect();
        assert!(
            !ran.is_empty() && ran.iter().all(|a| *a == "ring"),
            "--algo {algo}: {ran:?}"
        );
    }

    // The hosts listed another way round than the cables run: ranks 0 2 1 3 are the ring.
    // The ring all-reduce goes round the cables, and the decode runs on them, its pipeline's
    // stages in the ring's order, tokens checked against one rank's.
    let permuted = dir.join("permuted.hosts");
    std::fs::write(
        &permuted,
        "tbq0 slots=1\ntbq2 slots=1\ntbq1 slots=1\ntbq3 slots=1\n",
    )
    .unwrap();
    let on_permuted = |args: &[&str], out: &std::path::Path| {
        let mut all: Vec<&str> = args.to_vec();
        all.extend_from_slice(&[
            "--hostfile",
            permuted.to_str().unwrap(),
            "--rsh",
            "ip netns exec",
            "--nodes",
            "4",
            "--over",
            "tcp:links",
            "--out",
            out.to_str().unwrap(),
        ]);
        let o = run(&all, Duration::from_secs(180));
        assert!(o.status.success(), "{args:?}: {}", text(&o.stderr));
        read_json(out)
    };
    let r = on_permuted(
        &[
            "coll",
            "--op",
            "allreduce",
            "--algo",
            "ring",
            "--sizes",
            "1MiB",
            "--iters",
            "5",
        ],
        &dir.join("permuted-coll.json"),
    );
    assert_eq!(r["verification"]["passed"], true);
    assert_eq!(
        r["network"]["topology"]["unlinked"],
        serde_json::json!([[0, 1], [2, 3]])
    );
    for parallel in ["tp", "pp"] {
        let r = on_permuted(
            &[
                "infer",
                "--shape",
                "llama-3.2-3b",
                "--layers",
                "4",
                "--parallel",
                parallel,
                "--max-tokens",
                "4",
            ],
            &dir.join(format!("permuted-{parallel}.json")),
        );
        assert_eq!(
            r["verification"]["passed"], true,
            "{parallel}: {}",
            r["verification"]
        );
    }
}
