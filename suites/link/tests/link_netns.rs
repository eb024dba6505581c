//! `tbbench link` across two network namespaces joined by a veth pair shaped with tc tbf,
//! ranks started with `--rsh 'ip netns exec'` as a hostfile run would start them over ssh.
//! Needs root (skips with the reason printed otherwise).

#[path = "../../../runners/tests/support.rs"]
mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;
use support::*;

fn netlab(args: &[&str]) -> std::process::Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/netlab.sh");
    Command::new("bash")
        .arg(script)
        .args(args)
        .output()
        .unwrap()
}

/// Removes the namespaces even when the test fails.
struct Lab(&'static str);
impl Drop for Lab {
    fn drop(&mut self) {
        netlab(&["down", self.0]);
    }
}

#[test]
fn shaped_veth_link_is_measured_at_its_shaped_rate() {
    if !is_root() {
        eprintln!("SKIPPED shaped_veth_link_is_measured_at_its_shaped_rate: needs root for network namespaces");
        return;
    }
    let up = netlab(&["up", "tbt"]);
    if !up.status.success() {
        eprintln!(
            "SKIPPED shaped_veth_link_is_measured_at_its_shaped_rate: cannot build the lab: {}",
            text(&up.stderr)
        );
        return;
    }
    let _lab = Lab("tbt");
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
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
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
