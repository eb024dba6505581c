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
    /// macOS: each Thunderbolt port's link (80 Gb/s Thunderbolt 5, 40 Thunderbolt 4).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    thunderbolt: Vec<netinfo::ThunderboltPort>,
    /// Point-to-point subnets (a cable each, on a Thunderbolt cluster) and their far ends.
    links: Vec<tbbench_runners::links::LocalCable>,
    rdma: Rdma,
    blas: tbbench_schema::Blas,
    /// The energy counters suites read (`counters`), or why there are none (`none_because`).
    energy: serde_json::Value,
    /// One line per problem found, each saying what to do.
    problems: Vec<String>,
}

/// The problems a cluster owner would want pointed out, each as one line (the rules live in
/// the runner, which `tbbench doctor` reads too; the BLAS kernel's age, and whether tbbench works around it, is the hpl suite's).
fn problems(
    interfaces: &[Interface],
    thunderbolt: &[netinfo::ThunderboltPort],
    cable_interfaces: &[String],
    rdma: &Rdma,
    blas: &tbbench_schema::Blas,
    transparent_hugepages: Option<&str>,
) -> Vec<String> {
    hostcheck::problems(&hostcheck::HostState {
        interfaces,
        thunderbolt,
        cable_interfaces,
        rdma,
        blas,
        blas_below_cpu: tbbench_hpl::kernels::kernel_problem(blas),
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
    let thunderbolt = netinfo::thunderbolt_ports();
    let links = tbbench_runners::links::local_cables();
    let cable_interfaces: Vec<String> = links.iter().map(|c| c.interface.clone()).collect();
    let blas = tbbench_hpl::kernels::record();
    let problems = problems(
        &interfaces,
        &thunderbolt,
        &cable_interfaces,
        &rdma,
        &blas,
        host.transparent_hugepages.as_deref(),
    );
    let energy = match tbbench_runners::energy::available() {
        Ok(names) => serde_json::json!({ "counters": names }),
        Err(why) => serde_json::json!({ "none_because": why }),
    };
    let env = Env {
        host,
        links,
        interfaces,
        thunderbolt,
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
    if !e.thunderbolt.is_empty() {
        println!("\n# thunderbolt ports (system_profiler: what each cable's link runs at)");
        for t in &e.thunderbolt {
            println!(
                "{:<14} {:<6} {}",
                t.port,
                t.interface.as_deref().unwrap_or("–"),
                match (t.connected, t.link_gbit_per_s) {
                    (true, Some(v)) => format!("connected, up to {v} Gb/s"),
                    (true, None) => "connected".into(),
                    (false, _) => "nothing connected".into(),
                }
            );
        }
    }
    if let Some(cc) = &h.tcp_congestion_control {
        let available = sysinfo::tcp_congestion("available_congestion_control")
            .map(|a| format!(" (available: {a}; --congestion picks one for a run)"))
            .unwrap_or_default();
        println!("tcp congestion control: {cc}{available}");
    }
    println!("\n# links (point-to-point subnets: a cable each; `--over tcp:links` runs over them)");
    if e.links.is_empty() {
        println!("none (no /30 or /31 on any interface)");
    }
    for l in &e.links {
        let device = format!("rdma_{}", l.interface);
        let rdma = if e.rdma.devices.iter().any(|d| d.name == device) {
            format!(", RDMA device {device}")
        } else {
            String::new()
        };
        let seen = match l.far_end_seen {
            Some(true) => "has answered",
            Some(false) => "not seen yet",
            None => "not known here",
        };
        println!(
            "{} {}/{} -> far end {} ({seen}){rdma}",
            l.interface, l.address, l.prefix, l.far_end
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
    if let Some(note) = &e.blas.note {
        println!("note: {note}");
    }
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
