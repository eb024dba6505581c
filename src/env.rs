//! `tbbench env`: what this host offers for a cluster run, and what is wrong with it, for a
//! person setting one up. Reads the OS only; changes nothing.

use anyhow::Result;
use serde::Serialize;
use tbbench_runners::hostcheck::{self, Rdma};
use tbbench_runners::netinfo::{self, Interface};
use tbbench_runners::sysinfo;

#[derive(Serialize)]
struct Env {
    host: tbbench_schema::Host,
    interfaces: Vec<Interface>,
    rdma: Rdma,
    blas: tbbench_schema::Blas,
    /// The energy counters suites read (`counters`), or why there are none (`none_because`).
    energy: serde_json::Value,
    /// One line per problem found, each saying what to do.
    problems: Vec<String>,
}

/// The problems a cluster owner would want pointed out, each as one line (the rules live in
/// the runner, which `tbbench doctor` reads too; the BLAS kernel's age is the hpl suite's).
fn problems(
    interfaces: &[Interface],
    rdma: &Rdma,
    blas: &tbbench_schema::Blas,
    cpu_vectors: Option<&str>,
    transparent_hugepages: Option<&str>,
) -> Vec<String> {
    let blas_below_cpu = if blas.name == "openblas" {
        tbbench_hpl::kernels::kernel_below_cpu(&blas.kernel, cpu_vectors)
    } else {
        None
    };
    hostcheck::problems(&hostcheck::HostState {
        interfaces,
        rdma,
        blas,
        blas_below_cpu,
        transparent_hugepages,
    })
    .into_iter()
    .map(|p| p.detail)
    .collect()
}

pub fn run(json: bool) -> Result<i32> {
    let host = sysinfo::this_host();
    let interfaces = netinfo::interfaces()?;
    let rdma = hostcheck::rdma();
    let blas = tbbench_hpl::kernels::record();
    let problems = problems(
        &interfaces,
        &rdma,
        &blas,
        tbbench_hpl::kernels::cpu_vectors(),
        host.transparent_hugepages.as_deref(),
    );
    let energy = match tbbench_runners::energy::available() {
        Ok(names) => serde_json::json!({ "counters": names }),
        Err(why) => serde_json::json!({ "none_because": why }),
    };
    let env = Env {
        host,
        interfaces,
        rdma,
        blas,
        energy,
        problems,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&env)?);
        return Ok(0);
    }
    print_text(&env);
    Ok(0)
}

fn print_text(e: &Env) {
    let h = &e.host;
    println!("# host");
    println!(
        "{}  {} · {} · {}  {} ({} cores, {} logical)  {:.1} GiB memory, {:.1} GiB available",
        h.hostname,
        h.os_version,
        h.kernel,
        h.arch,
        h.cpu_model,
        h.cores_physical,
        h.cores_logical,
        h.memory_total_bytes as f64 / (1u64 << 30) as f64,
        h.memory_available_bytes as f64 / (1u64 << 30) as f64
    );
    println!("\n# interfaces");
    println!(
        "{:<12} {:<19} {:<5} {:>10} {:>6}  addresses",
        "name", "kind", "state", "speed", "MTU"
    );
    for i in &e.interfaces {
        let mut addrs: Vec<String> = i.ipv4.iter().map(|a| a.to_string()).collect();
        if !i.ipv6.is_empty() {
            addrs.push(format!("+{} IPv6", i.ipv6.len()));
        }
        if !i.bridge_members.is_empty() {
            addrs.push(format!("bridge of {}", i.bridge_members.join(",")));
        }
        println!(
            "{:<12} {:<19} {:<5} {:>10} {:>6}  {}",
            i.name,
            i.kind.as_str(),
            if i.up { "up" } else { "down" },
            i.speed_gbit_per_s
                .map(|s| format!("{s} Gbit/s"))
                .unwrap_or_else(|| "–".into()),
            i.mtu.map(|m| m.to_string()).unwrap_or_else(|| "–".into()),
            addrs.join(" ")
        );
    }
    println!("\n# RDMA");
    if let Some(s) = &e.rdma.enabled {
        println!("rdma_ctl status: {s}");
    }
    match &e.rdma.none_because {
        Some(why) => println!("{why}"),
        None => {
            for d in &e.rdma.devices {
                for p in &d.ports {
                    println!(
                        "{} port {}: {}, {} link layer, active MTU {}{}{}",
                        d.name,
                        p.port,
                        p.state,
                        p.link_layer,
                        p.active_mtu_bytes,
                        d.interface
                            .as_ref()
                            .map(|i| format!(", interface {i}"))
                            .unwrap_or_default(),
                        if d.emulated {
                            " (software stand-in, not RDMA hardware)"
                        } else {
                            ""
                        }
                    );
                }
            }
        }
    }
    println!("\n# BLAS");
    let env = if e.blas.env.is_empty() {
        String::new()
    } else {
        format!(" [{}]", e.blas.env.join(" "))
    };
    println!("{}: {}{env}", e.blas.name, e.blas.kernel);
    if let Some(thp) = &h.transparent_hugepages {
        println!("transparent huge pages: {thp}");
    }
    println!("\n# energy");
    match e.energy["counters"].as_array() {
        Some(c) => println!(
            "powercap: {} (hpl, infer --gguf, link and coll record joules)",
            c.iter()
                .filter_map(|v| v.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => println!(
            "none: {}",
            e.energy["none_because"].as_str().unwrap_or("unknown")
        ),
    }
    println!("\n# problems");
    if e.problems.is_empty() {
        println!("none found");
    }
    for p in &e.problems {
        println!("- {p}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tbbench_runners::netinfo::LinkKind;
    use tbbench_runners::transport::verbs::devices::{self, DeviceInfo};

    fn iface(name: &str, kind: LinkKind, up: bool, ipv4: &[&str], members: &[&str]) -> Interface {
        Interface {
            name: name.into(),
            kind,
            up,
            mtu: Some(1500),
            speed_gbit_per_s: None,
            ipv4: ipv4.iter().map(|a| a.parse().unwrap()).collect(),
            ipv6: vec![],
            hardware_port: None,
            bridge_members: members.iter().map(|m| m.to_string()).collect(),
        }
    }

    #[test]
    fn the_problems_a_mac_cluster_owner_hits_are_named() {
        let ifs = vec![
            iface("lo0", LinkKind::Loopback, true, &["127.0.0.1"], &[]),
            iface(
                "bridge0",
                LinkKind::ThunderboltBridge,
                true,
                &[],
                &["en2", "en3"],
            ),
            iface("en3", LinkKind::ThunderboltIp, true, &[], &[]),
            iface("en4", LinkKind::ThunderboltIp, false, &[], &[]),
            iface("en0", LinkKind::Ethernet, true, &["192.168.1.5"], &[]),
        ];
        let rdma = Rdma {
            enabled: Some("RDMA is disabled".into()),
            devices: vec![DeviceInfo {
                name: "rdma_en3".into(),
                interface: Some("en3".into()),
                emulated: false,
                ports: vec![devices::PortInfo {
                    port: 1,
                    state: "down".into(),
                    active_mtu_bytes: 1024,
                    link_layer: "ethernet".into(),
                    lid: 0,
                }],
            }],
            none_because: None,
        };
        let blas = tbbench_schema::Blas {
            name: "rust-fallback".into(),
            kernel: String::new(),
            env: vec![],
        };
        let p = problems(&ifs, &rdma, &blas, Some("avx2"), Some("never"));
        let has = |s: &str| p.iter().any(|l| l.contains(s));
        assert!(
            has("bridge0 (Thunderbolt Bridge) is on with en2, en3"),
            "{p:#?}"
        );
        assert!(has("en3 (thunderbolt-ip) is up but has no IPv4"), "{p:#?}");
        assert!(has("en4 (thunderbolt-ip) is down"), "{p:#?}");
        assert!(has("rdma_en3 port 1 is down"), "{p:#?}");
        assert!(has("maps to en3, which has no IPv4"), "{p:#?}");
        assert!(has("RDMA is disabled"), "{p:#?}");
        assert!(has("no BLAS found"), "{p:#?}");
        assert!(has("transparent huge pages are off"), "{p:#?}");
        let fine = problems(&[], &rdma, &blas, Some("avx2"), Some("madvise"));
        assert!(!fine.iter().any(|l| l.contains("huge pages")), "{fine:#?}");
        // A forced kernel is named, with only the variables that force it.
        let forced = tbbench_schema::Blas {
            name: "openblas".into(),
            kernel: "Haswell".into(),
            env: vec![
                "OPENBLAS_CORETYPE=Haswell".into(),
                "OPENBLAS_THREAD_TIMEOUT=18".into(),
            ],
        };
        let f = problems(&[], &rdma, &forced, Some("avx2"), None);
        assert!(
            f.iter()
                .any(|l| l.starts_with("OPENBLAS_CORETYPE=Haswell: OpenBLAS's kernel is forced")),
            "{f:#?}"
        );
        assert!(!f.iter().any(|l| l.contains("TIMEOUT")), "{f:#?}");
        assert!(!f.iter().any(|l| l.contains("kernel on a CPU")), "{f:#?}");
        // A kernel generations older than the CPU (a VM hiding its model from OpenBLAS).
        let old = tbbench_schema::Blas {
            name: "openblas".into(),
            kernel: "Prescott (OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH)".into(),
            env: vec![],
        };
        let o = problems(&[], &rdma, &old, Some("avx512"), None);
        assert!(
            o.iter()
                .any(|l| l.starts_with("OpenBLAS runs its Prescott kernel on a CPU with AVX-512")),
            "{o:#?}"
        );
        assert!(
            !has("en0") && !has("lo0"),
            "healthy interfaces are not problems: {p:#?}"
        );
        assert!(p.iter().all(|l| !l.contains('\n')));
    }
}
