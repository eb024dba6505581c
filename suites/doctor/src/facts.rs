//! What each rank finds out about its own host before any pair is timed: the interface the
//! run's data uses (as the transport described it), which interface the kernel would send to
//! each peer by, the RDMA devices, the tbbench build, the BLAS, free memory, and the problems
//! `tbbench env` would name. Every rank sends this to rank 0, which judges.

use serde::{Deserialize, Serialize};
use std::net::{IpAddr, UdpSocket};
use tbbench_runners::hostcheck::{self, HostProblem, HostState};
use tbbench_runners::netinfo;
use tbbench_runners::suite::Context;
use tbbench_schema::{Blas, Network, Tool};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankFacts {
    pub rank: usize,
    /// The host as the run names it: its hostfile entry, else its hostname. Two network
    /// namespaces (or containers) share a hostname but not a hostfile entry.
    pub host: String,
    pub hostname: String,
    pub tool: Tool,
    pub blas: Blas,
    pub memory_available_bytes: u64,
    /// "macOS 26.2", "Debian GNU/Linux 12": the OS and its version, as the host record has
    /// them (empty from an older tbbench).
    #[serde(default)]
    pub os: String,
    /// The network as this rank's transport describes it: its own interface, kind, speed, MTU.
    pub network: Network,
    /// Where the kernel would send to each peer's data address.
    pub routes: Vec<Route>,
    /// `tbbench env`'s RDMA section: the devices and their ports, or why there are none.
    pub rdma: serde_json::Value,
    pub problems: Vec<HostProblem>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Route {
    pub rank: usize,
    pub address: String,
    /// The interface the kernel picks; None when no way of asking worked.
    pub interface: Option<String>,
    /// How it was found: "ip route get", "route get", or "source address".
    pub how: String,
    /// The interface the traffic should leave by where it is not the run's one: over links,
    /// the cable's own interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
}

/// The name this rank's host goes by in the run: the launcher's label (a hostfile entry),
/// else the hostname (local ranks, mpirun). The driver names ranks the same way in its errors.
fn host_name(hostname: &str) -> String {
    match std::env::var(tbbench_runners::launch::ENV_LABEL) {
        Ok(l) if !l.is_empty() && l != "localhost" => l,
        _ => hostname.to_string(),
    }
}

pub fn gather(ctx: &Context, tool: &Tool) -> RankFacts {
    let host = tbbench_runners::sysinfo::this_host();
    let interfaces = netinfo::interfaces().unwrap_or_default();
    let rdma = hostcheck::rdma();
    let thunderbolt = netinfo::thunderbolt_ports();
    let cable_interfaces: Vec<String> = tbbench_runners::links::local_cables()
        .into_iter()
        .map(|c| c.interface)
        .collect();
    let (blas, blas_below_cpu) = hostcheck::blas();
    let problems = hostcheck::problems(&HostState {
        interfaces: &interfaces,
        thunderbolt: &thunderbolt,
        cable_interfaces: &cable_interfaces,
        rdma: &rdma,
        blas: &blas,
        blas_below_cpu,
        transparent_hugepages: host.transparent_hugepages.as_deref(),
    });
    // Only TCP's data follows the kernel's routes; shm has none and verbs its own device.
    let routes = if ctx.network.transport == "tcp" {
        routes(ctx, &interfaces)
    } else {
        vec![]
    };
    RankFacts {
        rank: ctx.rank(),
        host: host_name(&host.hostname),
        hostname: host.hostname.clone(),
        tool: tool.clone(),
        blas,
        memory_available_bytes: host.memory_available_bytes,
        os: if host.os_version.is_empty() {
            host.os.clone()
        } else {
            host.os_version.clone()
        },
        network: ctx.network.clone(),
        routes,
        rdma: serde_json::to_value(&rdma).unwrap_or_default(),
        problems,
    }
}

/// The route to every peer whose data address is on another host (one of this host's own
/// addresses is delivered locally, whatever interface holds it).
fn routes(ctx: &Context, interfaces: &[netinfo::Interface]) -> Vec<Route> {
    let mine = |ip: &IpAddr| {
        interfaces.iter().any(|i| match ip {
            IpAddr::V4(a) => i.ipv4.contains(a),
            IpAddr::V6(a) => i.ipv6.contains(a),
        })
    };
    let mut out: Vec<Route> = Vec::new();
    // Over links: each cable's far end, which must be reached by the cable's own interface
    // (not the management network, not a bridge that took the port).
    if !ctx.network.links.is_empty() {
        for l in &ctx.network.links {
            let Some(me) = l.ranks.iter().position(|&r| r == ctx.rank()) else {
                continue;
            };
            let (mine, far) = (&l.ends[me], &l.ends[1 - me]);
            let Ok(ip) = far.address.parse::<IpAddr>() else {
                continue;
            };
            let (interface, how) = route_to(ip);
            out.push(Route {
                rank: l.ranks[1 - me],
                address: far.address.clone(),
                interface,
                how,
                expected: Some(mine.interface.clone()),
            });
        }
        return out;
    }
    for (rank, addr) in ctx.network.addresses.iter().enumerate() {
        let Ok(ip) = addr.parse::<IpAddr>() else {
            continue;
        };
        if rank == ctx.rank() || ip.is_loopback() || mine(&ip) {
            continue;
        }
        let found = match out.iter().find(|r| &r.address == addr) {
            Some(r) => (r.interface.clone(), r.how.clone()),
            None => route_to(ip),
        };
        out.push(Route {
            rank,
            address: addr.clone(),
            interface: found.0,
            how: found.1,
            expected: None,
        });
    }
    out
}

/// The interface the kernel would send to `ip` by: the routing table where the OS's tool
/// answers (it names the device even when the source address would belong elsewhere), else
/// the interface holding the source address a connected UDP socket gets (no packet is sent).
fn route_to(ip: IpAddr) -> (Option<String>, String) {
    let asked = if cfg!(target_os = "macos") {
        run_tool("route", &["-n", "get", &ip.to_string()])
            .and_then(|t| parse_route_get(&t))
            .map(|i| (i, "route get"))
    } else {
        run_tool("ip", &["-o", "route", "get", &ip.to_string()])
            .and_then(|t| parse_ip_route_get(&t))
            .map(|i| (i, "ip route get"))
    };
    if let Some((iface, how)) = asked {
        return (Some(iface), how.into());
    }
    let by_source = source_address(ip)
        .and_then(netinfo::interface_for_addr)
        .map(|i| i.name);
    (by_source, "source address".into())
}

/// A tool's output when it ran and succeeded (its absence is not an error: the fallback
/// answers). These tools answer from the kernel's tables at once; none waits on the network.
fn run_tool(program: &str, args: &[&str]) -> Option<String> {
    let o = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

fn source_address(ip: IpAddr) -> Option<IpAddr> {
    let any: IpAddr = if ip.is_ipv4() {
        IpAddr::from([0u8; 4])
    } else {
        IpAddr::from([0u16; 8])
    };
    let s = UdpSocket::bind((any, 0)).ok()?;
    // connect() on UDP only picks the route and the source address.
    s.connect((ip, 9)).ok()?;
    s.local_addr().ok().map(|a| a.ip())
}

/// Linux `ip -o route get ADDR`: "10.73.0.2 dev tbd2a src 10.73.0.1 uid 0 \    cache".
pub fn parse_ip_route_get(text: &str) -> Option<String> {
    let mut words = text.split_whitespace();
    while let Some(w) = words.next() {
        if w == "dev" {
            return words.next().map(str::to_string);
        }
    }
    None
}

/// macOS `route -n get ADDR`: a block of "key: value" lines, the device under "interface".
pub fn parse_route_get(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == "interface")
            .then(|| v.trim().to_string())
            .filter(|v| !v.is_empty())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_route_tools_outputs_name_the_device() {
        assert_eq!(
            parse_ip_route_get("10.73.0.2 dev tbd2a src 10.73.0.1 uid 0 \\    cache \n").as_deref(),
            Some("tbd2a")
        );
        assert_eq!(
            parse_ip_route_get(
                "local 127.0.0.1 dev lo table local src 127.0.0.1 uid 0 \\    cache <local> \n"
            )
            .as_deref(),
            Some("lo")
        );
        assert_eq!(
            parse_ip_route_get(
                "192.0.2.9 via 192.0.2.1 dev eth0 src 192.0.2.2 uid 0 \\    cache \n"
            )
            .as_deref(),
            Some("eth0")
        );
        assert_eq!(
            parse_ip_route_get("RTNETLINK answers: Network is unreachable"),
            None
        );
        let mac = "   route to: 10.0.1.2\ndestination: 10.0.1.0\n       mask: 255.255.255.0\n  interface: en3\n      flags: <UP,DONE,CLONING>\n recvpipe  sendpipe  ssthresh  rtt,msec    rttvar  hopcount      mtu     expire\n       0         0         0         0         0         0      1500         0 \n";
        assert_eq!(parse_route_get(mac).as_deref(), Some("en3"));
        assert_eq!(
            parse_route_get("route: writing to routing socket: not in table"),
            None
        );
    }

    /// The fallback asks the kernel without sending anything: loopback is reached by lo.
    #[test]
    fn the_source_address_to_loopback_is_loopback() {
        let src = source_address("127.0.0.1".parse().unwrap());
        assert!(src.is_some_and(|a| a.is_loopback()), "{src:?}");
    }
}
