//! A link per pair of ranks: which cables join two ranks' hosts, for a cluster cabled without a
//! switch (Thunderbolt: each cable its own interface, subnet and RDMA device). The hostfile may
//! name them ([`CableHint`]s: MLX's `rdma` devices per peer, a ring file's addresses); where it
//! does not, two hosts are linked where they hold addresses in one subnet on interfaces other
//! than the one their control traffic uses. Every rank publishes its [`LinkInfo`] at the
//! rendezvous and derives the same [`Cabling`] from the table ([`derive`]), so both ends of
//! every pair agree on its cables without another exchange.

use crate::netinfo;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv4Addr};
use tbbench_schema::{Link, LinkEnd, Topology};

/// The launcher's word to a rank about its host's cables: a JSON [`HostCables`].
pub const ENV_CABLES: &str = "TBBENCH_CABLES";

/// How a hostfile names one end of a cable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Via {
    /// An RDMA device on the cable's interface (`rdma_en3` is on `en3`, as macOS names them).
    Device(String),
    /// The host's address on the cable (a ring hostfile's `ips`).
    Address(Ipv4Addr),
}

/// One cable a hostfile gives a host: to which other host of the file, and by what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CableHint {
    pub peer_host: usize,
    pub via: Via,
}

/// What the launcher hands each rank: its host's index in the hostfile and its cables.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostCables {
    pub host: usize,
    pub hints: Vec<CableHint>,
    /// The hostfile's backend (MLX's `jaccl`, `jaccl-ring`, `ring`), where it names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
}

impl HostCables {
    /// What the launcher said of this rank's host ([`ENV_CABLES`]); None where it said
    /// nothing (no hostfile, or a rank not started by the launcher).
    pub fn from_launcher() -> Result<Option<HostCables>> {
        match std::env::var(ENV_CABLES) {
            Ok(v) => Ok(Some(serde_json::from_str(&v).map_err(|e| {
                anyhow::anyhow!("{ENV_CABLES} is not what the launcher writes: {e}")
            })?)),
            Err(_) => Ok(None),
        }
    }

    /// The RDMA devices the hostfile names for this host's cables, each once, in its order.
    pub fn devices(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for h in &self.hints {
            if let Via::Device(d) = &h.via {
                if !out.contains(d) {
                    out.push(d.clone());
                }
            }
        }
        out
    }
}

/// One IPv4 address of an interface, with what the OS says of the interface.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IfAddr {
    pub name: String,
    pub ip: Ipv4Addr,
    pub prefix: u8,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed_gbit_per_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
}

impl IfAddr {
    fn same_subnet(&self, other: &IfAddr) -> bool {
        self.prefix == other.prefix
            && crate::netinfo::mask(self.ip, self.prefix)
                == crate::netinfo::mask(other.ip, other.prefix)
            && self.ip != other.ip
    }
}

/// What a rank publishes at the rendezvous of a run over links.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkInfo {
    /// Its host's index in the hostfile; None where no hostfile placed it.
    pub host_index: Option<usize>,
    /// Every IPv4 address of its host, loopback left out.
    pub interfaces: Vec<IfAddr>,
    /// The cables the hostfile names, resolved on this host: (the peer host's index, this
    /// host's interface), in the file's order.
    pub named: Vec<(usize, String)>,
    /// The RDMA device the hostfile names for each of `named`, in the same order.
    #[serde(default)]
    pub devices: Vec<Option<String>>,
    /// The interface its control traffic (ssh, rendezvous) uses: never a cable.
    pub control_iface: Option<String>,
    /// The hostfile's backend, as the launcher passed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
}

impl LinkInfo {
    /// This host's side: its addresses, its cables as the launcher passed them
    /// ([`ENV_CABLES`]), and its control interface (the one holding `control_ip`, or the one
    /// the route to rank 0's rendezvous `rdv` leaves by).
    pub fn gather(control_ip: Option<IpAddr>, rdv: Option<&str>) -> Result<LinkInfo> {
        let ifs = netinfo::interfaces().unwrap_or_default();
        let interfaces: Vec<IfAddr> = netinfo::ipv4_prefixes()?
            .into_iter()
            .filter(|(_, ip, _)| !ip.is_loopback())
            .map(|(name, ip, prefix)| {
                let i = ifs.iter().find(|i| i.name == name);
                IfAddr {
                    kind: i.map(|i| i.kind.as_str()).unwrap_or("unknown").into(),
                    speed_gbit_per_s: i.and_then(|i| i.speed_gbit_per_s),
                    mtu: i.and_then(|i| i.mtu),
                    name,
                    ip,
                    prefix,
                }
            })
            .collect();
        let source = control_ip.or_else(|| rdv.and_then(route_source));
        let control_iface = source.and_then(|ip| match ip {
            IpAddr::V4(v4) if v4.is_loopback() => Some("lo".to_string()),
            IpAddr::V4(v4) => interfaces
                .iter()
                .find(|i| i.ip == v4)
                .map(|i| i.name.clone()),
            IpAddr::V6(_) => None,
        });
        let cables = HostCables::from_launcher()?;
        let mut named = Vec::new();
        let mut devices = Vec::new();
        for h in cables.iter().flat_map(|c| &c.hints) {
            let (iface, device) = match &h.via {
                Via::Device(d) => {
                    let iface = d.strip_prefix("rdma_").unwrap_or(d);
                    if !interfaces.iter().any(|i| i.name == iface) {
                        bail!(
                            "the hostfile names RDMA device {d} for a cable to host {} of the file, but this host has no interface {iface} with an IPv4 address (each cable needs one: `tbbench env` lists them)",
                            h.peer_host + 1
                        );
                    }
                    (iface.to_string(), Some(d.clone()))
                }
                Via::Address(ip) => {
                    let i = interfaces.iter().find(|i| i.ip == *ip).with_context(|| {
                        format!(
                            "the hostfile gives {ip} for a cable to host {} of the file, but no interface of this host has that address",
                            h.peer_host + 1
                        )
                    })?;
                    (i.name.clone(), None)
                }
            };
            named.push((h.peer_host, iface));
            devices.push(device);
        }
        Ok(LinkInfo {
            host_index: cables.as_ref().map(|c| c.host),
            backend: cables.and_then(|c| c.backend),
            interfaces,
            named,
            devices,
            control_iface,
        })
    }
}

/// One cable as this host alone can see it: a point-to-point subnet (a /30 or /31, as
/// mlx.distributed_config gives each Thunderbolt cable) on an interface, the far end's
/// address in it, and whether the far end has answered (the kernel's neighbour table holds its
/// hardware address; Linux only, None elsewhere).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LocalCable {
    pub interface: String,
    pub address: Ipv4Addr,
    pub prefix: u8,
    pub far_end: Ipv4Addr,
    pub far_end_seen: Option<bool>,
}

/// This host's point-to-point subnets, in the order the OS lists them: what `tbbench env`
/// shows as its cables.
pub fn local_cables() -> Vec<LocalCable> {
    let neighbours = std::fs::read_to_string("/proc/net/arp").ok();
    netinfo::ipv4_prefixes()
        .unwrap_or_default()
        .into_iter()
        .filter(|(_, ip, prefix)| !ip.is_loopback() && *prefix >= 30 && *prefix < 32)
        .filter_map(|(interface, address, prefix)| {
            let far_end = far_end(address, prefix)?;
            let far_end_seen = neighbours.as_deref().map(|t| seen_in_arp(t, far_end));
            Some(LocalCable {
                interface,
                address,
                prefix,
                far_end,
                far_end_seen,
            })
        })
        .collect()
}

/// The other host address of a /30 (the two between network and broadcast) or a /31.
fn far_end(ip: Ipv4Addr, prefix: u8) -> Option<Ipv4Addr> {
    let net = u32::from(crate::netinfo::mask(ip, prefix));
    let me = u32::from(ip);
    let hosts = match prefix {
        31 => [net, net + 1],
        30 => [net + 1, net + 2],
        _ => return None,
    };
    hosts
        .into_iter()
        .find(|h| *h != me)
        .filter(|_| hosts.contains(&me))
        .map(Ipv4Addr::from)
}

/// Whether /proc/net/arp holds a complete entry (flags 0x2) for `ip`.
fn seen_in_arp(table: &str, ip: Ipv4Addr) -> bool {
    let ip = ip.to_string();
    table.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() >= 4 && f[0] == ip && f[2] == "0x2"
    })
}

/// The local address the kernel's route to `rdv` ("host:port") leaves from: a UDP socket
/// connected there (no packet is sent) says.
fn route_source(rdv: &str) -> Option<IpAddr> {
    use std::net::ToSocketAddrs;
    let to = rdv.to_socket_addrs().ok()?.find(|a| a.is_ipv4())?;
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect(to).ok()?;
    Some(s.local_addr().ok()?.ip())
}

/// The cables of a run, every rank's view the same.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Cabling {
    pub links: Vec<Link>,
    pub topology: Topology,
}

impl Cabling {
    /// The cables between ranks `a` and `b`, in cable order; empty where there is none.
    pub fn between(&self, a: usize, b: usize) -> Vec<&Link> {
        let key = [a.min(b), a.max(b)];
        self.links.iter().filter(|l| l.ranks == key).collect()
    }

    /// `(this end, the far end)` of a cable, seen from rank `me`.
    pub fn ends(link: &Link, me: usize) -> (&LinkEnd, &LinkEnd) {
        if link.ranks[0] == me {
            (&link.ends[0], &link.ends[1])
        } else {
            (&link.ends[1], &link.ends[0])
        }
    }

    /// One line naming the pairs with no cable, with their hosts ("0-2 (m0-m2)").
    pub fn unlinked_line(&self, hosts: &[String]) -> String {
        self.topology
            .unlinked
            .iter()
            .map(|[a, b]| format!("{a}-{b} ({}-{})", hosts[*a], hosts[*b]))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The cables between every pair of ranks, from what each rank published (`infos[r]`) and the
/// name of its host (`hosts[r]`: ranks with one name share a host). Deterministic in its
/// inputs, so every rank derives the same. Errors name what the hostfile and the hosts
/// disagree on.
pub fn derive(hosts: &[String], infos: &[LinkInfo]) -> Result<Cabling> {
    let size = hosts.len();
    // Each host once, by its first rank.
    let mut firsts: Vec<usize> = Vec::new();
    for r in 0..size {
        if !firsts.iter().any(|&f| hosts[f] == hosts[r]) {
            firsts.push(r);
        }
    }
    let host_of = |r: usize| {
        firsts
            .iter()
            .position(|&f| hosts[f] == hosts[r])
            .unwrap_or(0)
    };
    // Found cables (no hostfile naming them) lie in subnets exactly two hosts of the run hold,
    // off every control network: a LAN, a VPN or Wi-Fi that more hosts share is no cable, nor
    // is the network ssh and the rendezvous ride.
    let net = |i: &IfAddr| (crate::netinfo::mask(i.ip, i.prefix), i.prefix);
    let control: Vec<(Ipv4Addr, u8)> = firsts
        .iter()
        .flat_map(|&r| {
            let c = infos[r].control_iface.clone();
            infos[r]
                .interfaces
                .iter()
                .filter(move |i| Some(&i.name) == c.as_ref())
                .map(net)
        })
        .collect();
    let holders = |subnet: (Ipv4Addr, u8)| {
        firsts
            .iter()
            .filter(|&&r| infos[r].interfaces.iter().any(|i| net(i) == subnet))
            .count()
    };
    let cable_subnet = |i: &IfAddr| !control.contains(&net(i)) && holders(net(i)) == 2;
    let mut per_hosts: Vec<Vec<Vec<(LinkEnd, LinkEnd)>>> =
        vec![vec![vec![]; firsts.len()]; firsts.len()];
    for (ha, &ra) in firsts.iter().enumerate() {
        for (hb, &rb) in firsts.iter().enumerate().skip(ha + 1) {
            per_hosts[ha][hb] = cables_between(
                &hosts[ra],
                &infos[ra],
                &hosts[rb],
                &infos[rb],
                &cable_subnet,
            )?;
        }
    }

    let mut links = Vec::new();
    let mut unlinked = Vec::new();
    for a in 0..size {
        for b in a + 1..size {
            let (ha, hb) = (host_of(a), host_of(b));
            if ha == hb {
                let lo = LinkEnd {
                    interface: "lo".into(),
                    address: "127.0.0.1".into(),
                    link_kind: "loopback".into(),
                    ..LinkEnd::default()
                };
                links.push(Link {
                    ranks: [a, b],
                    hosts: [hosts[a].clone(), hosts[b].clone()],
                    cable: 0,
                    ends: [lo.clone(), lo],
                });
                continue;
            }
            let (lo, hi, flip) = if ha < hb {
                (ha, hb, false)
            } else {
                (hb, ha, true)
            };
            let cables = &per_hosts[lo][hi];
            if cables.is_empty() {
                unlinked.push([a, b]);
            }
            for (c, (x, y)) in cables.iter().enumerate() {
                let ends = if flip {
                    [y.clone(), x.clone()]
                } else {
                    [x.clone(), y.clone()]
                };
                links.push(Link {
                    ranks: [a, b],
                    hosts: [hosts[a].clone(), hosts[b].clone()],
                    cable: c,
                    ends,
                });
            }
        }
    }
    let host_names: Vec<String> = firsts.iter().map(|&f| hosts[f].clone()).collect();
    let degree: Vec<usize> = (0..firsts.len())
        .map(|h| {
            (0..firsts.len())
                .filter(|&o| o != h && linked(&per_hosts, h, o))
                .count()
        })
        .collect();
    let n = firsts.len();
    let (shape, ring) = if n == 1 {
        ("single", vec![])
    } else if degree.iter().all(|&d| d == n - 1) {
        ("full-mesh", vec![])
    } else if n >= 3 && degree.iter().all(|&d| d == 2) {
        // Walk the cycle from host 0; a ring when it visits every host.
        let mut order = vec![0usize];
        while order.len() < n {
            let last = *order.last().expect("not empty");
            match (0..n).find(|&o| o != last && linked(&per_hosts, last, o) && !order.contains(&o))
            {
                Some(next) => order.push(next),
                None => break,
            }
        }
        if order.len() == n {
            (
                "ring",
                order.iter().map(|&h| host_names[h].clone()).collect(),
            )
        } else {
            ("partial", vec![])
        }
    } else {
        ("partial", vec![])
    };
    Ok(Cabling {
        links,
        topology: Topology {
            shape: shape.into(),
            ring,
            unlinked,
            backend: infos.iter().find_map(|i| i.backend.clone()),
        },
    })
}

fn linked(per_hosts: &[Vec<Vec<(LinkEnd, LinkEnd)>>], a: usize, b: usize) -> bool {
    let (lo, hi) = (a.min(b), a.max(b));
    !per_hosts[lo][hi].is_empty()
}

fn end(i: &IfAddr, device: Option<String>) -> LinkEnd {
    LinkEnd {
        interface: i.name.clone(),
        address: i.ip.to_string(),
        rdma_device: device,
        link_kind: i.kind.clone(),
        speed_gbit_per_s: i.speed_gbit_per_s,
        mtu: i.mtu,
    }
}

/// The cables between two hosts. Where the hostfile names cables for either host (any peer),
/// its lists are the whole truth: a pair both leave out (a jaccl `null`, a ring's diagonal)
/// has none, and a cable named at one end finds its far end by subnet (each named end is
/// paired with the far host's end that shares its subnet, whatever order the lists are in).
/// Otherwise every pair of their addresses in a subnet `cable_subnet` allows is one.
fn cables_between(
    name_a: &str,
    a: &LinkInfo,
    name_b: &str,
    b: &LinkInfo,
    cable_subnet: &dyn Fn(&IfAddr) -> bool,
) -> Result<Vec<(LinkEnd, LinkEnd)>> {
    let named = |x: &LinkInfo, peer: Option<usize>| -> Vec<(String, Option<String>)> {
        match peer {
            Some(p) => x
                .named
                .iter()
                .zip(x.devices.iter().chain(std::iter::repeat(&None)))
                .filter(|((h, _), _)| *h == p)
                .map(|((_, i), d)| (i.clone(), d.clone()))
                .collect(),
            None => vec![],
        }
    };
    let usable = |x: &LinkInfo, i: &IfAddr| x.control_iface.as_deref() != Some(i.name.as_str());
    let mut out = Vec::new();
    if a.named.is_empty() && b.named.is_empty() {
        for x in a
            .interfaces
            .iter()
            .filter(|i| usable(a, i) && cable_subnet(i))
        {
            for y in b.interfaces.iter().filter(|i| usable(b, i)) {
                if x.same_subnet(y) {
                    out.push((end(x, None), end(y, None)));
                }
            }
        }
        return Ok(out);
    }
    let (na, nb) = (named(a, b.host_index), named(b, a.host_index));
    // Walk the side that names cables; the other side's named ends (or, where it names none
    // to this peer, its interfaces off the control network) are matched by subnet.
    let (lead, lead_info, lead_name, other, other_info, other_name, flip) = if !na.is_empty() {
        (na, a, name_a, nb, b, name_b, false)
    } else {
        (nb, b, name_b, na, a, name_a, true)
    };
    let mut taken: Vec<String> = Vec::new();
    for (iface, device) in lead {
        let pick = lead_info
            .interfaces
            .iter()
            .filter(|x| x.name == iface)
            .flat_map(|x| {
                other_info
                    .interfaces
                    .iter()
                    .filter(|y| x.same_subnet(y) && !taken.contains(&y.name))
                    .filter(|y| {
                        if other.is_empty() {
                            usable(other_info, y)
                        } else {
                            other.iter().any(|(n, _)| n == &y.name)
                        }
                    })
                    .map(move |y| (x, y))
            })
            .next();
        let Some((x, y)) = pick else {
            bail!(
                "the hostfile names a cable from {lead_name} ({iface}) to {other_name}, but {other_name} holds no address in that cable's subnet{}: give each end of the cable an address in the cable's own subnet (MLX's mlx.distributed_config gives each a /30)",
                if other.is_empty() {
                    String::new()
                } else {
                    let names: Vec<&str> = other.iter().map(|(n, _)| n.as_str()).collect();
                    format!(" on the interfaces the hostfile names there ({})", names.join(", "))
                }
            );
        };
        taken.push(y.name.clone());
        let far_device = other
            .iter()
            .find(|(n, _)| n == &y.name)
            .and_then(|(_, d)| d.clone());
        let (lead_end, other_end) = (end(x, device), end(y, far_device));
        out.push(if flip {
            (other_end, lead_end)
        } else {
            (lead_end, other_end)
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ifa(name: &str, ip: &str, prefix: u8) -> IfAddr {
        IfAddr {
            name: name.into(),
            ip: ip.parse().unwrap(),
            prefix,
            kind: "ethernet".into(),
            speed_gbit_per_s: None,
            mtu: Some(9000),
        }
    }

    /// Four hosts with a management network and a /30 per cable, as mlx.distributed_config
    /// sets up a Thunderbolt cluster; `cabled` lists the host pairs with a cable.
    fn lab(cabled: &[(usize, usize)]) -> Vec<LinkInfo> {
        let mut infos: Vec<LinkInfo> = (0..4)
            .map(|h| LinkInfo {
                interfaces: vec![ifa("mgmt", &format!("10.70.0.{}", h + 1), 24)],
                control_iface: Some("mgmt".into()),
                ..LinkInfo::default()
            })
            .collect();
        for (c, &(a, b)) in cabled.iter().enumerate() {
            let base = 4 * c as u32;
            infos[a].interfaces.push(ifa(
                &format!("en{b}"),
                &format!("192.168.0.{}", base + 1),
                30,
            ));
            infos[b].interfaces.push(ifa(
                &format!("en{a}"),
                &format!("192.168.0.{}", base + 2),
                30,
            ));
        }
        infos
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|h| format!("m{h}")).collect()
    }

    #[test]
    fn a_cables_far_end_is_the_other_host_address_of_its_subnet() {
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert_eq!(far_end(ip("192.168.0.1"), 30), Some(ip("192.168.0.2")));
        assert_eq!(far_end(ip("192.168.0.6"), 30), Some(ip("192.168.0.5")));
        assert_eq!(far_end(ip("10.0.0.7"), 31), Some(ip("10.0.0.6")));
        // The network or broadcast address of a /30 is no host's.
        assert_eq!(far_end(ip("192.168.0.3"), 30), None);
        assert_eq!(far_end(ip("192.168.0.1"), 24), None);
        let arp =
            "IP address       HW type     Flags       HW address            Mask     Device\n\
                   192.168.0.2      0x1         0x2         aa:bb:cc:dd:ee:ff     *        en1\n\
                   192.168.1.2      0x1         0x0         00:00:00:00:00:00     *        en2\n";
        assert!(seen_in_arp(arp, ip("192.168.0.2")));
        assert!(!seen_in_arp(arp, ip("192.168.1.2")));
    }

    #[test]
    fn a_mesh_of_four_is_found_with_every_pair_on_its_own_cable() {
        let mesh = [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)];
        let c = derive(&names(4), &lab(&mesh)).unwrap();
        assert_eq!(c.topology.shape, "full-mesh");
        assert!(c.topology.unlinked.is_empty());
        assert_eq!(c.links.len(), 6);
        let l = c.between(3, 1);
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].ends[0].interface, "en3");
        assert_eq!(l[0].ends[1].interface, "en1");
        assert_eq!(l[0].ends[0].address, "192.168.0.17");
        // The management network joins every pair and is never a cable.
        assert!(c.links.iter().all(|l| l.ends[0].interface != "mgmt"));
    }

    #[test]
    fn a_ring_of_four_names_its_order_and_its_diagonals_unlinked() {
        let c = derive(&names(4), &lab(&[(0, 1), (1, 2), (2, 3), (3, 0)])).unwrap();
        assert_eq!(c.topology.shape, "ring");
        assert_eq!(c.topology.ring, ["m0", "m1", "m2", "m3"]);
        assert_eq!(c.topology.unlinked, [[0, 2], [1, 3]]);
        assert_eq!(c.unlinked_line(&names(4)), "0-2 (m0-m2), 1-3 (m1-m3)");
        let p = derive(&names(4), &lab(&[(0, 1), (1, 2), (2, 3)])).unwrap();
        assert_eq!(p.topology.shape, "partial");
    }

    #[test]
    fn two_cables_between_a_pair_are_two_links_and_ranks_on_one_host_share_loopback() {
        let mut infos = lab(&[(0, 1), (0, 1)]);
        infos.truncate(2);
        let hosts = vec!["m0".to_string(), "m0".into(), "m1".into()];
        let infos = vec![infos[0].clone(), infos[0].clone(), infos[1].clone()];
        let c = derive(&hosts, &infos).unwrap();
        assert_eq!(c.between(0, 1)[0].ends[0].link_kind, "loopback");
        let two = c.between(1, 2);
        assert_eq!(two.len(), 2);
        assert_eq!((two[0].cable, two[1].cable), (0, 1));
        assert_ne!(two[0].ends[0].address, two[1].ends[0].address);
    }

    /// The hostfile's devices (jaccl) and a ring file's addresses give the same links as
    /// discovery; a named cable whose ends share no subnet is refused naming both hosts.
    #[test]
    fn named_cables_agree_with_discovery_and_bad_ones_are_named() {
        let mesh = [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)];
        let found = derive(&names(4), &lab(&mesh)).unwrap();
        let mut told = lab(&mesh);
        for (h, info) in told.iter_mut().enumerate() {
            info.host_index = Some(h);
            for p in (0..4).filter(|&p| p != h) {
                info.named.push((p, format!("en{p}")));
                info.devices.push(Some(format!("rdma_en{p}")));
            }
        }
        let named = derive(&names(4), &told).unwrap();
        assert_eq!(named.topology, found.topology);
        for (a, b) in named.links.iter().zip(&found.links) {
            assert_eq!(
                (a.ranks, &a.ends[0].address, &a.ends[1].address),
                (b.ranks, &b.ends[0].address, &b.ends[1].address)
            );
        }
        assert_eq!(
            named.links[0].ends[0].rdma_device.as_deref(),
            Some("rdma_en1")
        );
        // A ring file: each host names its address towards the previous one only.
        let mut ring = lab(&[(0, 1), (1, 2), (2, 3), (3, 0)]);
        for (h, info) in ring.iter_mut().enumerate() {
            info.host_index = Some(h);
            let prev = (h + 3) % 4;
            info.named.push((prev, format!("en{prev}")));
            info.devices.push(None);
        }
        let r = derive(&names(4), &ring).unwrap();
        assert_eq!(r.topology.shape, "ring");
        assert_eq!(r.links.len(), 4);
        told[0].named[0].1 = "mgmt".into();
        let e = derive(&names(4), &told).unwrap_err().to_string();
        assert!(
            e.contains("from m0 (mgmt) to m1") && e.contains("(en0)"),
            "{e}"
        );
    }

    /// Named lists are the whole truth (a jaccl `null` is no cable, even where a subnet
    /// joins the two), and two cables listed in different orders at the two ends pair by
    /// subnet, not by position.
    #[test]
    fn named_cables_are_the_whole_list_and_pair_by_subnet() {
        let mut two = lab(&[(0, 1), (0, 1)]);
        two.truncate(2);
        two[0].interfaces[1].name = "en3".into();
        two[0].interfaces[2].name = "en4".into();
        two[1].interfaces[1].name = "en5".into();
        two[1].interfaces[2].name = "en6".into();
        two[0].host_index = Some(0);
        two[1].host_index = Some(1);
        two[0].named = vec![(1, "en3".into()), (1, "en4".into())];
        two[1].named = vec![(0, "en6".into()), (0, "en5".into())];
        let c = derive(&names(2), &two).unwrap();
        let pairs: Vec<(&str, &str)> = c
            .links
            .iter()
            .map(|l| (l.ends[0].interface.as_str(), l.ends[1].interface.as_str()))
            .collect();
        assert_eq!(pairs, [("en3", "en5"), ("en4", "en6")]);
        let mut mesh = lab(&[(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]);
        for (h, info) in mesh.iter_mut().enumerate() {
            info.host_index = Some(h);
            // Every cable named but 0-2 (null both ways).
            for p in (0..4).filter(|&p| p != h && (h, p) != (0, 2) && (h, p) != (2, 0)) {
                info.named.push((p, format!("en{p}")));
            }
        }
        let c = derive(&names(4), &mesh).unwrap();
        assert_eq!(c.topology.unlinked, [[0, 2]]);
    }

    /// Found cables lie in subnets exactly two hosts hold, off the control network: a LAN all
    /// hosts share besides the management one is no cable.
    #[test]
    fn a_shared_lan_is_not_a_cable() {
        let mut infos = lab(&[(0, 1), (1, 2), (2, 3), (3, 0)]);
        for (h, info) in infos.iter_mut().enumerate() {
            info.interfaces
                .push(ifa("wifi", &format!("10.80.0.{}", h + 1), 24));
        }
        infos[0].control_iface = None;
        let c = derive(&names(4), &infos).unwrap();
        assert_eq!(c.topology.shape, "ring", "{:?}", c.links);
        assert_eq!(c.links.len(), 4);
    }
}
