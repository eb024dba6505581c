//! `tbbench env` end to end: what it reports about this very machine.

mod support;

use std::time::Duration;
use support::*;

#[test]
fn env_reports_this_hosts_interfaces_rdma_and_blas() {
    let o = run(&["env", "--json"], Duration::from_secs(30));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("env --json is JSON");
    let lo = v["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["kind"] == "loopback")
        .expect("a loopback interface");
    assert!(lo["ipv4"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a == "127.0.0.1"));
    assert!(v["host"]["cores_logical"].as_u64().unwrap() >= 1);
    assert!(!v["blas"]["name"].as_str().unwrap().is_empty());
    // This machine has no RDMA device: env says why in one line instead of failing.
    if !std::path::Path::new("/sys/class/infiniband").exists() {
        let why = v["rdma"]["none_because"].as_str().expect("a reason");
        assert!(why.contains("no RDMA device"), "{why}");
        assert!(v["rdma"]["devices"].as_array().unwrap().is_empty());
    }
    let t = run(&["env"], Duration::from_secs(30));
    let out = text(&t.stdout);
    // No powercap tree in this sandbox's usual hosts, or one: either way env says which.
    let energy = &v["energy"];
    assert!(
        energy["counters"].is_array() || energy["none_because"].is_string(),
        "{energy}"
    );
    for section in [
        "# host",
        "# interfaces",
        "# RDMA",
        "# BLAS",
        "# energy",
        "# problems",
    ] {
        assert!(out.contains(section), "{section} missing:\n{out}");
    }
}

/// OpenBLAS held to a kernel from before AVX by the user's OPENBLAS_CORETYPE (kept: some old
/// builds need it): on a CPU with AVX2 or AVX-512 env names the gap in the BLAS's note, with
/// hpl's packed product standing in, and counts it as a problem only where
/// TBBENCH_HPL_PRODUCT=blas holds hpl to the BLAS.
#[test]
fn an_openblas_kernel_older_than_the_cpu_is_a_problem_only_where_nothing_stands_in() {
    let env = |product: Option<&str>| -> serde_json::Value {
        let mut cmd = std::process::Command::new(bin());
        cmd.args(["env", "--json"])
            .env("OPENBLAS_CORETYPE", "Prescott")
            .env_remove("TBBENCH_HPL_PRODUCT");
        if let Some(p) = product {
            cmd.env("TBBENCH_HPL_PRODUCT", p);
        }
        let o = cmd.output().expect("tbbench starts");
        serde_json::from_slice(&o.stdout).expect("env --json is JSON")
    };
    let v = env(None);
    if v["blas"]["name"] != "openblas" {
        skipped("no OpenBLAS on this host (scripts/setup.sh installs libopenblas0)");
        return;
    }
    let avx2 = has_avx2_and_fma();
    let named = |v: &serde_json::Value| {
        v["problems"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p.as_str())
            .any(|p| p.starts_with("OpenBLAS runs its Prescott kernel on a CPU with"))
    };
    assert!(!named(&v), "{v:#}");
    let note = v["blas"]["note"].as_str().unwrap_or("");
    assert_eq!(
        note.starts_with("OpenBLAS runs its Prescott kernel") && note.contains("packed product"),
        avx2,
        "{note}"
    );
    assert_eq!(named(&env(Some("blas"))), avx2);
}

#[cfg(target_arch = "x86_64")]
fn has_avx2_and_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

#[cfg(not(target_arch = "x86_64"))]
fn has_avx2_and_fma() -> bool {
    false
}
