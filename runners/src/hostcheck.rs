//! What is wrong with this host for a cluster run, each problem as a kind and one line saying
//! what to do: read by `tbbench env` (one host, for a person setting it up) and by `tbbench
//! doctor` (every host of a run, before a long one), so both name the same problems the same
//! way. Pure functions over what the OS said (interfaces, RDMA devices, the BLAS record), so
//! the rules are tested without the hardware.

use crate::netinfo::{Interface, LinkKind, ThunderboltPort};
use crate::transport::verbs::devices::{self, DeviceInfo};
use serde::Serialize;

/// This host's BLAS and, where its kernel is older than the CPU's vector unit and tbbench
/// cannot work around it, the line saying so. Only the program that loads BLAS knows them (the hpl suite's kernels do), so it
/// installs this once at start ([`set_blas_probe`]); suites that report BLAS read it here
/// without depending on the hpl suite.
pub type BlasProbe = fn() -> (tbbench_schema::Blas, Option<String>);

static BLAS_PROBE: std::sync::OnceLock<BlasProbe> = std::sync::OnceLock::new();

/// Sets how [`blas`] finds this host's BLAS; the first call wins.
pub fn set_blas_probe(probe: BlasProbe) {
    let _ = BLAS_PROBE.set(probe);
}

/// This host's BLAS record and any kernel-behind-the-CPU line, or "not probed" where the
/// program installed no probe.
pub fn blas() -> (tbbench_schema::Blas, Option<String>) {
    match BLAS_PROBE.get() {
        Some(probe) => probe(),
        None => (
            tbbench_schema::Blas {
                name: "unknown".into(),
                kernel: "not probed (no BLAS probe installed)".into(),
                env: Vec::new(),
                note: None,
            },
            None,
        ),
    }
}

/// This host's RDMA side: whether it is enabled (macOS), its devices, or why there are none.
#[derive(Debug, Serialize)]
pub struct Rdma {
    /// macOS: what `rdma_ctl status` prints; None elsewhere or where it is missing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<String>,
    pub devices: Vec<DeviceInfo>,
    /// Why there are none, where there are none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub none_because: Option<String>,
}

/// Reads this host's RDMA devices (queries only) and, on macOS, `rdma_ctl status`.
pub fn rdma() -> Rdma {
    match devices::list_devices() {
        Ok(devices) => Rdma {
            enabled: rdma_ctl_status(),
            devices,
            none_because: None,
        },
        Err(why) => Rdma {
            enabled: rdma_ctl_status(),
            devices: vec![],
            none_because: Some(why),
        },
    }
}

fn rdma_ctl_status() -> Option<String> {
    if !cfg!(target_os = "macos") {
        return None;
    }
    let o = std::process::Command::new("rdma_ctl")
        .arg("status")
        .output()
        .ok()?;
    let t = String::from_utf8_lossy(&o.stdout).trim().to_string();
    Some(if t.is_empty() {
        String::from_utf8_lossy(&o.stderr).trim().to_string()
    } else {
        t
    })
}

/// One problem of one host: a stable kind (what scripts match on) and one line that says what
/// is wrong and what to do.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct HostProblem {
    pub kind: String,
    pub detail: String,
}

fn problem(kind: &str, detail: String) -> HostProblem {
    HostProblem {
        kind: kind.into(),
        detail,
    }
}

/// What the problems are judged from. `blas_below_cpu` is the line the BLAS's owner gives
/// when its kernel is older than the CPU and tbbench can neither correct it nor stand in for
/// it (the hpl suite knows OpenBLAS's kernel names and its own kernels; the runner does not),
/// None otherwise. A kernel forced by OPENBLAS_CORETYPE is no problem of itself: the results
/// record the variable, and a forced kernel behind the CPU is judged as any other.
pub struct HostState<'a> {
    pub interfaces: &'a [Interface],
    /// macOS: the Thunderbolt ports and their links ([`crate::netinfo::thunderbolt_ports`]).
    pub thunderbolt: &'a [ThunderboltPort],
    /// The interfaces that carry this host's cables (point-to-point subnets,
    /// [`crate::links::local_cables`]): only their Thunderbolt ports are judged, not a dock's,
    /// a display's or a disk's.
    pub cable_interfaces: &'a [String],
    pub rdma: &'a Rdma,
    pub blas: &'a tbbench_schema::Blas,
    pub blas_below_cpu: Option<String>,
    pub transparent_hugepages: Option<&'a str>,
}

/// The problems a cluster owner would want pointed out, in a fixed order.
pub fn problems(s: &HostState) -> Vec<HostProblem> {
    let mut p = Vec::new();
    for i in s.interfaces {
        let wired = matches!(
            i.kind,
            LinkKind::Ethernet | LinkKind::ThunderboltIp | LinkKind::ThunderboltBridge
        );
        if i.kind == LinkKind::ThunderboltBridge && !i.bridge_members.is_empty() {
            p.push(problem("thunderbolt-bridge", format!(
                "{} (Thunderbolt Bridge) is on with {}: RDMA over those ports needs it off (System Settings > Network > Thunderbolt Bridge > Inactive), and IP over each port is faster without it",
                i.name,
                i.bridge_members.join(", ")
            )));
        }
        if wired && i.up && i.ipv4.is_empty() {
            p.push(problem("interface-no-ipv4", format!(
                "{} ({}) is up but has no IPv4 address: tbbench binds data to IPv4 (give it one, e.g. 10.0.N.x/24 per cable)",
                i.name, i.kind
            )));
        }
        if i.kind == LinkKind::ThunderboltIp && !i.up {
            p.push(problem(
                "thunderbolt-down",
                format!("{} (thunderbolt-ip) is down: is a cable in?", i.name),
            ));
        }
    }
    // A Thunderbolt 5 link runs at 80 Gb/s; a Thunderbolt 4 cable, port or far end holds it
    // to 40 (system_profiler says so per port), and Apple's RDMA needs Thunderbolt 5 on it.
    // Only the ports of the cluster's cables are judged (an interface with a point-to-point
    // subnet, or an RDMA device's).
    let cables: Vec<&ThunderboltPort> = s
        .thunderbolt
        .iter()
        .filter(|t| {
            t.interface.as_ref().is_some_and(|i| {
                s.cable_interfaces.contains(i)
                    || s.rdma
                        .devices
                        .iter()
                        .any(|d| d.interface.as_ref() == Some(i))
            })
        })
        .collect();
    let fastest = cables
        .iter()
        .filter_map(|p| p.link_gbit_per_s.map(|v| (v, *p)))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    for t in cables {
        let (Some(v), Some((top, by))) = (t.link_gbit_per_s, fastest) else {
            continue;
        };
        let name = match &t.interface {
            Some(i) => format!("{i} ({})", t.port),
            None => t.port.clone(),
        };
        let below_siblings = v < 0.75 * top;
        let rdma_wants_more = !s.rdma.devices.is_empty() && v < 80.0;
        if !below_siblings && !rdma_wants_more {
            continue;
        }
        let beside = if below_siblings {
            let other = by.interface.as_deref().unwrap_or(&by.port);
            format!(" where {other} links at up to {top} Gb/s")
        } else {
            String::new()
        };
        p.push(problem("thunderbolt-link-slow", format!(
            "{name} links at up to {v} Gb/s{beside}: a Thunderbolt 4 (or older) cable, port or far end on it; use a Thunderbolt 5 cable between Thunderbolt 5 ports (80 Gb/s, and what RDMA over Thunderbolt needs)"
        )));
    }
    for d in &s.rdma.devices {
        for port in &d.ports {
            if port.state != "active" {
                p.push(problem(
                    "rdma-not-active",
                    format!(
                        "RDMA device {} port {} is {}: the link is not up",
                        d.name, port.port, port.state
                    ),
                ));
            }
        }
        if let Some(iface) = &d.interface {
            if let Some(i) = s.interfaces.iter().find(|i| &i.name == iface) {
                if i.ipv4.is_empty() {
                    p.push(problem("rdma-no-ipv4", format!(
                        "RDMA device {} maps to {iface}, which has no IPv4 address: its GID (the IPv4-mapped address) cannot be found",
                        d.name
                    )));
                }
            }
        }
    }
    if let Some(e) = &s.rdma.enabled {
        let said = e.to_lowercase();
        if said.contains("disabled") {
            p.push(problem(
                "rdma-disabled",
                format!("RDMA is disabled ({e}): enable it with `rdma_ctl enable` in recoveryOS"),
            ));
        } else if said.contains("enabled") && s.rdma.devices.is_empty() {
            // What a Mac whose ports are Thunderbolt 4 (or older) shows: RDMA over
            // Thunderbolt needs Thunderbolt 5 at both ends of each cable.
            p.push(problem(
                "rdma-enabled-no-device",
                format!("RDMA is enabled ({e}) but no RDMA device is listed: RDMA over Thunderbolt needs Thunderbolt 5 ports (and cables) at both ends; this Mac's ports are not, or no Thunderbolt 5 cable is in"),
            ));
        }
    }
    let blas = s.blas;
    if blas.name == "rust-fallback" {
        p.push(problem("no-blas", "no BLAS found: hpl runs on tbbench's own slower kernels (Linux: apt install libopenblas0)".into()));
    }
    if let Some(line) = &s.blas_below_cpu {
        p.push(problem("blas-kernel-below-cpu", line.clone()));
    }
    if s.transparent_hugepages == Some("never") {
        p.push(problem("no-huge-pages", "transparent huge pages are off (never): hpl's matrix lies in 4 KiB pages and runs slower (enable: echo madvise > /sys/kernel/mm/transparent_hugepage/enabled)".into()));
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::verbs::devices::PortInfo;

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

    /// Each problem carries the kind `tbbench doctor` files it under; a healthy host has none.
    #[test]
    fn every_problem_has_its_kind_and_a_healthy_host_has_none() {
        let ifs = vec![
            iface("bridge0", LinkKind::ThunderboltBridge, true, &[], &["en2"]),
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
                ports: vec![PortInfo {
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
            env: vec!["OPENBLAS_CORETYPE=Prescott".into()],
            note: None,
        };
        let p = problems(&HostState {
            interfaces: &ifs,
            thunderbolt: &[],
            cable_interfaces: &[],
            rdma: &rdma,
            blas: &blas,
            blas_below_cpu: Some("OpenBLAS runs its Prescott kernel on a CPU with AVX2".into()),
            transparent_hugepages: Some("never"),
        });
        let kinds: Vec<&str> = p.iter().map(|x| x.kind.as_str()).collect();
        assert_eq!(
            kinds,
            [
                "thunderbolt-bridge",
                "interface-no-ipv4",
                "interface-no-ipv4",
                "thunderbolt-down",
                "rdma-not-active",
                "rdma-no-ipv4",
                "rdma-disabled",
                "no-blas",
                "blas-kernel-below-cpu",
                "no-huge-pages"
            ]
        );
        let healthy = Rdma {
            enabled: None,
            devices: vec![],
            none_because: Some("no RDMA device".into()),
        };
        let openblas = tbbench_schema::Blas {
            name: "openblas".into(),
            kernel: "Haswell".into(),
            env: vec![],
            note: None,
        };
        let none = problems(&HostState {
            interfaces: &ifs[3..],
            thunderbolt: &[],
            cable_interfaces: &[],
            rdma: &healthy,
            blas: &openblas,
            blas_below_cpu: None,
            transparent_hugepages: Some("madvise"),
        });
        assert!(none.is_empty(), "{none:#?}");
        // Each line names the thing and says what to do (what `tbbench env` prints).
        let text: Vec<&str> = p.iter().map(|x| x.detail.as_str()).collect();
        let has = |s: &str| text.iter().any(|l| l.contains(s));
        assert!(
            has("bridge0 (Thunderbolt Bridge) is on with en2"),
            "{text:#?}"
        );
        assert!(
            has("en3 (thunderbolt-ip) is up but has no IPv4"),
            "{text:#?}"
        );
        assert!(has("en4 (thunderbolt-ip) is down"), "{text:#?}");
        assert!(has("rdma_en3 port 1 is down"), "{text:#?}");
        assert!(has("maps to en3, which has no IPv4"), "{text:#?}");
        assert!(has("RDMA is disabled"), "{text:#?}");
        assert!(has("no BLAS found"), "{text:#?}");
        assert!(has("transparent huge pages are off"), "{text:#?}");
        assert!(
            !has("en0"),
            "a healthy interface is not a problem: {text:#?}"
        );
        assert!(text.iter().all(|l| !l.contains('\n')));
        // A kernel forced to the CPU's own is no problem: the result records the variable.
        let forced = tbbench_schema::Blas {
            name: "openblas".into(),
            kernel: "SkylakeX".into(),
            env: vec!["OPENBLAS_CORETYPE=SkylakeX".into()],
            note: None,
        };
        let f = problems(&HostState {
            interfaces: &[],
            thunderbolt: &[],
            cable_interfaces: &[],
            rdma: &healthy,
            blas: &forced,
            blas_below_cpu: None,
            transparent_hugepages: None,
        });
        assert!(f.is_empty(), "{f:#?}");
        // RDMA on but no device: a Thunderbolt 4 Mac.
        let tb4 = Rdma {
            enabled: Some("RDMA is enabled".into()),
            devices: vec![],
            none_because: Some("no RDMA device".into()),
        };
        let t = problems(&HostState {
            interfaces: &[],
            thunderbolt: &[],
            cable_interfaces: &[],
            rdma: &tb4,
            blas: &openblas,
            blas_below_cpu: None,
            transparent_hugepages: None,
        });
        assert_eq!(t.len(), 1, "{t:#?}");
        assert_eq!(t[0].kind, "rdma-enabled-no-device");
        assert!(t[0].detail.contains("Thunderbolt 5"), "{t:#?}");
    }

    fn tb(port: u32, iface: Option<&str>, link: Option<f64>) -> ThunderboltPort {
        ThunderboltPort {
            port: format!("Thunderbolt {port}"),
            interface: iface.map(str::to_string),
            connected: link.is_some(),
            link_gbit_per_s: link,
        }
    }

    /// A Thunderbolt 4 cable among Thunderbolt 5 ones is named by its port; on an RDMA host
    /// any link under 80 Gb/s is, since Apple's RDMA needs Thunderbolt 5 on the cable.
    #[test]
    fn a_thunderbolt_link_below_its_siblings_or_below_rdma_is_named() {
        let openblas = tbbench_schema::Blas {
            name: "openblas".into(),
            kernel: "Haswell".into(),
            env: vec![],
            note: None,
        };
        let no_rdma = Rdma {
            enabled: None,
            devices: vec![],
            none_because: Some("no RDMA device".into()),
        };
        let cabled = ["en2".to_string(), "en3".to_string()];
        let judge = |ports: &[ThunderboltPort], rdma: &Rdma| {
            problems(&HostState {
                interfaces: &[],
                thunderbolt: ports,
                cable_interfaces: &cabled,
                rdma,
                blas: &openblas,
                blas_below_cpu: None,
                transparent_hugepages: None,
            })
        };
        let mixed = [
            tb(1, Some("en2"), Some(80.0)),
            tb(2, Some("en3"), Some(40.0)),
            tb(3, Some("en4"), None),
        ];
        let p = judge(&mixed, &no_rdma);
        assert_eq!(p.len(), 1, "{p:#?}");
        assert_eq!(p[0].kind, "thunderbolt-link-slow");
        assert!(
            p[0].detail.starts_with(
                "en3 (Thunderbolt 2) links at up to 40 Gb/s where en2 links at up to 80 Gb/s"
            ),
            "{p:#?}"
        );
        // A Thunderbolt 4 dock or disk on a port with no cable's subnet is not judged.
        let dock = [
            tb(1, Some("en2"), Some(80.0)),
            tb(3, Some("en4"), Some(40.0)),
        ];
        assert!(judge(&dock, &no_rdma).is_empty());
        // All alike, no RDMA: nothing to compare against, nothing said.
        let all_tb4 = [
            tb(1, Some("en2"), Some(40.0)),
            tb(2, Some("en3"), Some(40.0)),
        ];
        assert!(judge(&all_tb4, &no_rdma).is_empty());
        // All Thunderbolt 5: clean, RDMA or not.
        let all_tb5 = [
            tb(1, Some("en2"), Some(80.0)),
            tb(2, Some("en3"), Some(80.0)),
        ];
        assert!(judge(&all_tb5, &no_rdma).is_empty());
        let rdma = Rdma {
            enabled: Some("RDMA is enabled".into()),
            devices: vec![DeviceInfo {
                name: "rdma_en2".into(),
                interface: Some("en2".into()),
                emulated: false,
                ports: vec![],
            }],
            none_because: None,
        };
        assert!(judge(&all_tb5, &rdma).is_empty());
        let p = judge(&all_tb4, &rdma);
        assert_eq!(p.len(), 2, "{p:#?}");
        assert!(
            p[1].detail
                .starts_with("en3 (Thunderbolt 2) links at up to 40 Gb/s: "),
            "{p:#?}"
        );
    }
}
