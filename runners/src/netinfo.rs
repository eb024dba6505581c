//! Which network a rank's data travels on, read from the OS, so every result is labelled with
//! transport, interface, link kind, nominal speed and MTU: a bandwidth figure means little
//! unless the reader can tell a Thunderbolt 5 link from 10 GbE or from loopback.
//!
//! Addresses come from `getifaddrs` (Linux and macOS alike). Link details come from
//! `/sys/class/net` on Linux and from `networksetup -listallhardwareports` plus `ifconfig` on
//! macOS, where the hardware port name is the only thing that tells a Thunderbolt IP port
//! (`enX`, "Thunderbolt N") from an Ethernet `enX`. All parsing lives in pure functions over
//! text or plain facts, so it is tested on every OS with samples of the other's output.

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{anyhow, Context as _};
use serde::{Deserialize, Serialize};

/// IFF_* interface flag bits. Linux and the BSDs (macOS) share these values, which lets the
/// pure classification code use them on either OS.
const IFF_UP: u32 = 0x1;
const IFF_LOOPBACK: u32 = 0x8;
const IFF_RUNNING: u32 = 0x40;

/// What kind of link an interface is, as far as the OS lets us tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinkKind {
    Loopback,
    Ethernet,
    /// A single Thunderbolt port carrying IP (macOS "Thunderbolt N", Linux `thunderbolt-net`).
    ThunderboltIp,
    /// A bridge over Thunderbolt ports (macOS "Thunderbolt Bridge", `bridge0`).
    ThunderboltBridge,
    Wifi,
    /// Software-only interfaces: veth, tun/utun, docker bridges, ifb, tunnels.
    Virtual,
    Unknown,
}

impl LinkKind {
    /// The name used in result files (`Network::link_kind`) and labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            LinkKind::Loopback => "loopback",
            LinkKind::Ethernet => "ethernet",
            LinkKind::ThunderboltIp => "thunderbolt-ip",
            LinkKind::ThunderboltBridge => "thunderbolt-bridge",
            LinkKind::Wifi => "wifi",
            LinkKind::Virtual => "virtual",
            LinkKind::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for LinkKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One network interface of this host, with what a result label needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interface {
    pub name: String,
    pub kind: LinkKind,
    /// Administratively up and with a live link (Linux operstate "up"; macOS "status: active").
    pub up: bool,
    pub mtu: Option<u32>,
    /// Nominal speed in 10^9 bit/s as the OS reports it; None where it reports nothing
    /// trustworthy (virtual links, bridges, Thunderbolt 5 ports on macOS).
    pub speed_gbit_per_s: Option<f64>,
    pub ipv4: Vec<Ipv4Addr>,
    pub ipv6: Vec<Ipv6Addr>,
    /// macOS networksetup's "Hardware Port" name; Linux: the driver name.
    pub hardware_port: Option<String>,
    /// For bridges: the member interfaces.
    pub bridge_members: Vec<String>,
}

/// All interfaces on this host, in the order the OS lists them.
pub fn interfaces() -> anyhow::Result<Vec<Interface>> {
    Ok(describe(raw_interfaces()?))
}

/// One Thunderbolt port as macOS's `system_profiler SPThunderboltDataType` reports it: what
/// the link over its cable runs at (80 Gb/s for Thunderbolt 5 at both ends and in the cable,
/// 40 for Thunderbolt 4), which `ifconfig` does not say for Thunderbolt interfaces.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThunderboltPort {
    /// The hardware port, "Thunderbolt 1".
    pub port: String,
    /// Its network interface (`en2`), from networksetup's hardware ports.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    /// Something is connected at the far end of its cable.
    pub connected: bool,
    /// The link's speed ("Up to 80 Gb/s"), where one is up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_gbit_per_s: Option<f64>,
}

/// This host's Thunderbolt ports and their links (macOS; empty elsewhere, or where
/// system_profiler does not answer). Slow (system_profiler takes about a second): read by
/// `tbbench env` and doctor, not by every run.
pub fn thunderbolt_ports() -> Vec<ThunderboltPort> {
    #[cfg(target_os = "macos")]
    {
        let ports = macos::run(
            &["/usr/sbin/networksetup", "networksetup"],
            &["-listallhardwareports"],
        );
        let profile = macos::run(
            &["/usr/sbin/system_profiler", "system_profiler"],
            &["SPThunderboltDataType", "-json"],
        );
        macos::parse_thunderbolt(&profile.unwrap_or_default(), &ports.unwrap_or_default())
    }
    #[cfg(not(target_os = "macos"))]
    {
        Vec::new()
    }
}

/// A result's network record as far as the interface goes (its name, link kind, speed and
/// MTU, as the OS reports them; link kind "unknown" where no interface was found), for the
/// caller to complete with the transport, label and addresses.
pub fn network_of(iface: Option<&Interface>) -> tbbench_schema::Network {
    match iface {
        Some(i) => tbbench_schema::Network {
            interface: Some(i.name.clone()),
            link_kind: i.kind.as_str().to_string(),
            nominal_gbit_per_s: i.speed_gbit_per_s,
            mtu: i.mtu,
            ..Default::default()
        },
        None => tbbench_schema::Network {
            link_kind: "unknown".into(),
            ..Default::default()
        },
    }
}

/// The interface called `name`; the error lists the names that exist, since a typo in a
/// `--interface` flag is the usual cause.
pub fn interface_by_name(name: &str) -> anyhow::Result<Interface> {
    let mut all = interfaces()?;
    match all.iter().position(|i| i.name == name) {
        Some(pos) => Ok(all.swap_remove(pos)),
        None => Err(no_such_interface(name, all.iter().map(|i| i.name.as_str()))),
    }
}

/// The interface holding local address `ip`. Any 127.0.0.0/8 address and ::1 map to the
/// loopback interface, since the kernel routes them there even when only 127.0.0.1 is listed.
pub fn interface_for_addr(ip: IpAddr) -> Option<Interface> {
    find_for_addr(interfaces().ok()?, ip)
}

/// The first IPv4 address of interface `name`: what TCP ranks bind to when told an interface.
pub fn ipv4_of(name: &str) -> anyhow::Result<Ipv4Addr> {
    first_ipv4(&raw_interfaces()?, name)
}

/// This host's IPv4 address inside `subnet` (the first, in interface order).
pub fn ipv4_in_subnet(subnet: (Ipv4Addr, u8)) -> anyhow::Result<Ipv4Addr> {
    let raw = raw_interfaces()?;
    raw.iter()
        .flat_map(|r| r.ipv4.iter())
        .copied()
        .find(|ip| in_subnet(*ip, subnet))
        .ok_or_else(|| {
            let have: Vec<String> = raw
                .iter()
                .flat_map(|r| r.ipv4.iter().map(move |ip| format!("{} {ip}", r.name)))
                .collect();
            anyhow!(
                "no address in {}/{} on this host (have: {})",
                subnet.0,
                subnet.1,
                have.join(", ")
            )
        })
}

fn no_such_interface<'a>(name: &str, names: impl Iterator<Item = &'a str>) -> anyhow::Error {
    let have = names.collect::<Vec<_>>().join(", ");
    anyhow!("no interface named '{name}' on this host (have: {have})")
}

fn first_ipv4(raw: &[RawIf], name: &str) -> anyhow::Result<Ipv4Addr> {
    let Some(r) = raw.iter().find(|r| r.name == name) else {
        return Err(no_such_interface(name, raw.iter().map(|r| r.name.as_str())));
    };
    if let Some(ip) = r.ipv4.first() {
        return Ok(*ip);
    }
    let state = if r.flags & IFF_UP == 0 {
        "it is down"
    } else {
        "it is up"
    };
    let v6 = if r.ipv6.is_empty() {
        "no IPv6 either".to_string()
    } else {
        let list: Vec<String> = r.ipv6.iter().map(|a| a.to_string()).collect();
        format!("IPv6 only: {}", list.join(", "))
    };
    Err(anyhow!(
        "interface '{name}' has no IPv4 address ({state}, {v6}); \
         assign one or pick another interface"
    ))
}

fn find_for_addr(mut all: Vec<Interface>, ip: IpAddr) -> Option<Interface> {
    // An IPv4-mapped IPv6 address (::ffff:a.b.c.d, from a dual-stack socket) is the IPv4 one.
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    let holds = |i: &Interface| match ip {
        IpAddr::V4(a) => i.ipv4.contains(&a),
        IpAddr::V6(a) => i.ipv6.contains(&a),
    };
    if let Some(pos) = all.iter().position(holds) {
        return Some(all.swap_remove(pos));
    }
    if ip.is_loopback() {
        return all.into_iter().find(|i| i.kind == LinkKind::Loopback);
    }
    None
}

/// What `getifaddrs` says about one interface: flags and addresses.
#[derive(Debug, Clone, Default, PartialEq)]
struct RawIf {
    name: String,
    flags: u32,
    ipv4: Vec<Ipv4Addr>,
    ipv6: Vec<Ipv6Addr>,
}

/// An interface as far as getifaddrs knows it, before OS-specific details are added.
fn bare_interface(raw: RawIf) -> Interface {
    let kind = if raw.flags & IFF_LOOPBACK != 0 {
        LinkKind::Loopback
    } else {
        LinkKind::Unknown
    };
    Interface {
        name: raw.name,
        kind,
        up: raw.flags & IFF_UP != 0 && raw.flags & IFF_RUNNING != 0,
        mtu: None,
        speed_gbit_per_s: None,
        ipv4: raw.ipv4,
        ipv6: raw.ipv6,
        hardware_port: None,
        bridge_members: Vec::new(),
    }
}

/// One entry of getifaddrs' list: the interface's name, flags, address and netmask.
struct IfaddrEntry {
    name: String,
    flags: u32,
    addr: Option<IpAddr>,
    netmask: Option<IpAddr>,
}

/// Every entry of one getifaddrs walk, in the order the OS lists them.
fn getifaddrs_entries() -> anyhow::Result<Vec<IfaddrEntry>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: on success getifaddrs stores the head of a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error()).context("getifaddrs: listing interfaces");
    }
    let mut entries = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a non-null node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list; ifa_addr and
        // ifa_netmask are null or point to sockaddrs of the family they name.
        entries.push(unsafe {
            IfaddrEntry {
                name: CStr::from_ptr(ifa.ifa_name).to_string_lossy().into_owned(),
                flags: ifa.ifa_flags,
                addr: sockaddr_ip(ifa.ifa_addr),
                netmask: sockaddr_ip(ifa.ifa_netmask),
            }
        });
    }
    // SAFETY: `head` came from getifaddrs, is freed once, and nothing borrowed from it remains.
    unsafe { libc::freeifaddrs(head) };
    Ok(entries)
}

/// Every interface with its flags and addresses, from one getifaddrs walk.
fn raw_interfaces() -> anyhow::Result<Vec<RawIf>> {
    Ok(merge_entries(
        getifaddrs_entries()?
            .into_iter()
            .map(|e| (e.name, e.flags, e.addr))
            .collect(),
    ))
}

/// Every IPv4 address on this host with its interface and prefix length, in the order the OS
/// lists them: what two hosts compare to find the cable between them (`crate::links`).
pub fn ipv4_prefixes() -> anyhow::Result<Vec<(String, Ipv4Addr, u8)>> {
    Ok(getifaddrs_entries()?
        .into_iter()
        .filter_map(|e| match (e.addr, e.netmask) {
            (Some(IpAddr::V4(ip)), Some(IpAddr::V4(m))) => {
                Some((e.name, ip, u32::from(m).count_ones() as u8))
            }
            _ => None,
        })
        .collect())
}

/// The IP address in a sockaddr, for AF_INET and AF_INET6; None for other families
/// (AF_PACKET, AF_LINK), which only tell that the interface exists.
///
/// # Safety
/// `sa` must be null or point to a valid sockaddr whose size matches its family.
unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: non-null and valid per the caller's contract.
    let family = i32::from(unsafe { (*sa).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: an AF_INET sockaddr is a sockaddr_in; read_unaligned avoids assuming
            // alignment beyond what the list guarantees.
            let sin = unsafe { std::ptr::read_unaligned(sa.cast::<libc::sockaddr_in>()) };
            // s_addr is in network byte order, so its in-memory bytes are the octets.
            Some(IpAddr::V4(Ipv4Addr::from(
                sin.sin_addr.s_addr.to_ne_bytes(),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 sockaddr is a sockaddr_in6.
            let sin6 = unsafe { std::ptr::read_unaligned(sa.cast::<libc::sockaddr_in6>()) };
            Some(IpAddr::V6(clear_embedded_scope(Ipv6Addr::from(
                sin6.sin6_addr.s6_addr,
            ))))
        }
        _ => None,
    }
}

/// macOS (KAME) getifaddrs embeds the scope id in bytes 2–3 of link-local addresses
/// (fe80:4::1 for fe80::1%en0). Those bits are zero by definition in fe80::/10, so clearing
/// them gives the address `ifconfig` prints, on any OS.
fn clear_embedded_scope(addr: Ipv6Addr) -> Ipv6Addr {
    let mut seg = addr.segments();
    if seg[0] & 0xffc0 == 0xfe80 {
        seg[1] = 0;
    }
    Ipv6Addr::from(seg)
}

/// Groups getifaddrs entries (one per address) into interfaces, in first-seen order.
/// Linux IPv4 alias labels ("eth0:1") are folded into their interface, which is the one
/// sysfs knows and traffic leaves by.
fn merge_entries(entries: Vec<(String, u32, Option<IpAddr>)>) -> Vec<RawIf> {
    let names: Vec<&str> = entries.iter().map(|(n, _, _)| n.as_str()).collect();
    let base_of = |name: &str| -> String {
        match name.split_once(':') {
            Some((base, _)) if names.contains(&base) => base.to_string(),
            _ => name.to_string(),
        }
    };
    let mut out: Vec<RawIf> = Vec::new();
    for (name, flags, addr) in &entries {
        let name = base_of(name);
        let pos = match out.iter().position(|r| r.name == name) {
            Some(pos) => pos,
            None => {
                out.push(RawIf {
                    name,
                    ..RawIf::default()
                });
                out.len() - 1
            }
        };
        let r = &mut out[pos];
        r.flags |= flags;
        match addr {
            Some(IpAddr::V4(a)) if !r.ipv4.contains(a) => r.ipv4.push(*a),
            Some(IpAddr::V6(a)) if !r.ipv6.contains(a) => r.ipv6.push(*a),
            _ => {}
        }
    }
    out
}

/// The kind of a bridge, from its members' kinds: the kind of its physical members when they
/// agree (Thunderbolt ports make a Thunderbolt bridge), else Virtual (docker0 over veths).
fn bridge_kind(members: &[LinkKind]) -> LinkKind {
    let mut physical = members.iter().copied().filter(|k| {
        matches!(
            k,
            LinkKind::Ethernet | LinkKind::ThunderboltIp | LinkKind::Wifi
        )
    });
    match physical.next() {
        Some(first) if physical.all(|k| k == first) => match first {
            LinkKind::ThunderboltIp => LinkKind::ThunderboltBridge,
            other => other,
        },
        _ => LinkKind::Virtual,
    }
}

#[cfg(target_os = "linux")]
fn describe(raw: Vec<RawIf>) -> Vec<Interface> {
    linux::describe(raw, linux::read_facts)
}

#[cfg(target_os = "macos")]
fn describe(raw: Vec<RawIf>) -> Vec<Interface> {
    let ports = macos::run(
        &["/usr/sbin/networksetup", "networksetup"],
        &["-listallhardwareports"],
    );
    let ifconfig = macos::run(&["/sbin/ifconfig", "ifconfig"], &["-a"]);
    macos::describe(
        raw,
        &ports.unwrap_or_default(),
        &ifconfig.unwrap_or_default(),
    )
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn describe(raw: Vec<RawIf>) -> Vec<Interface> {
    raw.into_iter().map(bare_interface).collect()
}

/// Linux: link details from `/sys/class/net/<if>/`.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
mod linux;

/// macOS: link details from `networksetup -listallhardwareports` and `ifconfig`.
#[cfg_attr(not(target_os = "macos"), allow(dead_code))]
mod macos;

/// `ip` with all but its first `bits` bits cleared: the network of a prefix.
pub fn mask(ip: Ipv4Addr, bits: u8) -> Ipv4Addr {
    let m = if bits == 0 {
        0
    } else {
        u32::MAX << (32 - bits as u32)
    };
    Ipv4Addr::from(u32::from(ip) & m)
}

/// Whether `ip` lies in the subnet `net/bits`.
pub fn in_subnet(ip: Ipv4Addr, (net, bits): (Ipv4Addr, u8)) -> bool {
    mask(ip, bits) == net
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(s: &str) -> Ipv4Addr {
        s.parse().expect("test address")
    }

    fn v6(s: &str) -> Ipv6Addr {
        s.parse().expect("test address")
    }

    fn raw(name: &str, flags: u32, ipv4: &[&str], ipv6: &[&str]) -> RawIf {
        RawIf {
            name: name.to_string(),
            flags,
            ipv4: ipv4.iter().map(|s| v4(s)).collect(),
            ipv6: ipv6.iter().map(|s| v6(s)).collect(),
        }
    }

    #[test]
    fn link_kind_names_match_serde() {
        let all = [
            LinkKind::Loopback,
            LinkKind::Ethernet,
            LinkKind::ThunderboltIp,
            LinkKind::ThunderboltBridge,
            LinkKind::Wifi,
            LinkKind::Virtual,
            LinkKind::Unknown,
        ];
        for kind in all {
            let json = serde_json::to_string(&kind).expect("serialize");
            assert_eq!(json, format!("\"{}\"", kind.as_str()));
            assert_eq!(kind.to_string(), kind.as_str());
        }
        assert_eq!(LinkKind::ThunderboltBridge.as_str(), "thunderbolt-bridge");
        assert_eq!(LinkKind::ThunderboltIp.as_str(), "thunderbolt-ip");
    }

    #[test]
    fn merge_entries_groups_addresses_and_folds_alias_labels() {
        let lo = "lo".to_string();
        let eth = "eth0".to_string();
        let entries = vec![
            (lo.clone(), 0x49, None),
            (eth.clone(), 0x1043, None),
            (lo.clone(), 0x49, Some(IpAddr::V4(v4("127.0.0.1")))),
            (eth.clone(), 0x1043, Some(IpAddr::V4(v4("10.0.0.5")))),
            (
                "eth0:1".to_string(),
                0x1043,
                Some(IpAddr::V4(v4("10.0.0.6"))),
            ),
            (lo.clone(), 0x49, Some(IpAddr::V6(v6("::1")))),
            ("tun:x".to_string(), 0x11, None),
        ];
        let merged = merge_entries(entries);
        let names: Vec<&str> = merged.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["lo", "eth0", "tun:x"]);
        assert_eq!(merged[0].ipv4, [v4("127.0.0.1")]);
        assert_eq!(merged[0].ipv6, [v6("::1")]);
        assert_eq!(merged[1].ipv4, [v4("10.0.0.5"), v4("10.0.0.6")]);
    }

    #[test]
    fn link_local_embedded_scope_is_cleared() {
        assert_eq!(
            clear_embedded_scope(v6("fe80:4::1c8a:1")),
            v6("fe80::1c8a:1")
        );
        assert_eq!(clear_embedded_scope(v6("2001:db8::1")), v6("2001:db8::1"));
        assert_eq!(clear_embedded_scope(v6("::1")), v6("::1"));
    }

    #[test]
    fn first_ipv4_errors_are_clear() {
        let list = vec![
            raw("lo", 0x49, &["127.0.0.1"], &["::1"]),
            raw("en2", 0x8963, &[], &["fe80::34a1:b2ff:fec3:d400"]),
            raw("en3", 0x8922, &[], &[]),
        ];
        assert_eq!(
            first_ipv4(&list, "lo").expect("lo has one"),
            v4("127.0.0.1")
        );
        let err = first_ipv4(&list, "en9").expect_err("no en9").to_string();
        assert_eq!(
            err,
            "no interface named 'en9' on this host (have: lo, en2, en3)"
        );
        let err = first_ipv4(&list, "en2").expect_err("v6 only").to_string();
        assert!(err.contains("'en2' has no IPv4 address"), "{err}");
        assert!(err.contains("fe80::34a1:b2ff:fec3:d400"), "{err}");
        let err = first_ipv4(&list, "en3").expect_err("down").to_string();
        assert!(err.contains("it is down"), "{err}");
    }

    #[test]
    fn bridge_kind_follows_physical_members() {
        use LinkKind::*;
        assert_eq!(
            bridge_kind(&[ThunderboltIp, ThunderboltIp]),
            ThunderboltBridge
        );
        assert_eq!(bridge_kind(&[ThunderboltIp, Virtual]), ThunderboltBridge);
        assert_eq!(bridge_kind(&[Ethernet, Virtual, Virtual]), Ethernet);
        assert_eq!(bridge_kind(&[Virtual, Virtual]), Virtual);
        assert_eq!(bridge_kind(&[]), Virtual);
        assert_eq!(bridge_kind(&[Ethernet, ThunderboltIp]), Virtual);
    }

    // ---- Linux classification, from sysfs facts ----

    fn facts(
        if_type: u32,
        operstate: &str,
        driver: Option<&str>,
        speed: Option<i64>,
    ) -> linux::Facts {
        linux::Facts {
            if_type: Some(if_type),
            operstate: Some(operstate.to_string()),
            flags: Some(0x1003),
            mtu: Some(1500),
            speed_mbit: speed,
            has_device: driver.is_some(),
            driver: driver.map(str::to_string),
            ..linux::Facts::default()
        }
    }

    fn linux_sysfs(name: &str) -> linux::Facts {
        match name {
            "lo" => linux::Facts {
                flags: Some(0x9),
                mtu: Some(65536),
                ..facts(772, "unknown", None, None)
            },
            "eth0" => facts(1, "up", Some("virtio_net"), Some(-1)),
            "enp1s0f0" => linux::Facts {
                mtu: Some(9000),
                ..facts(1, "up", Some("mlx5_core"), Some(100_000))
            },
            "eno1" => facts(1, "down", Some("igb"), None),
            "wlan0" => linux::Facts {
                wireless: true,
                ..facts(1, "dormant", Some("iwlwifi"), None)
            },
            "thunderbolt0" => facts(1, "up", Some("thunderbolt-net"), None),
            "thunderbolt1" => facts(1, "up", Some("thunderbolt-net"), Some(40_000)),
            "tbbr0" => linux::Facts {
                bridge: true,
                bridge_members: vec!["thunderbolt0".into(), "thunderbolt1".into()],
                ..facts(1, "up", None, Some(-1))
            },
            "docker0" => linux::Facts {
                bridge: true,
                bridge_members: vec!["veth1a2b3c".into()],
                ..facts(1, "up", None, None)
            },
            "veth1a2b3c" => facts(1, "up", None, Some(10_000)),
            "tun0" => linux::Facts {
                flags: Some(0x1091),
                ..facts(65534, "unknown", None, None)
            },
            "ib0" => facts(32, "up", Some("mlx5_core"), Some(200_000)),
            _ => linux::Facts::default(),
        }
    }

    fn linux_host() -> Vec<Interface> {
        let names = [
            "lo",
            "eth0",
            "enp1s0f0",
            "eno1",
            "wlan0",
            "thunderbolt0",
            "thunderbolt1",
            "tbbr0",
            "docker0",
            "veth1a2b3c",
            "tun0",
            "ib0",
        ];
        let raw_list = names
            .iter()
            .map(|n| match *n {
                "lo" => raw(n, 0x49, &["127.0.0.1"], &["::1"]),
                "tbbr0" => raw(n, 0x1043, &["10.9.0.1"], &[]),
                _ => raw(n, 0x1043, &[], &[]),
            })
            .collect();
        linux::describe(raw_list, linux_sysfs)
    }

    fn find<'a>(all: &'a [Interface], name: &str) -> &'a Interface {
        all.iter()
            .find(|i| i.name == name)
            .unwrap_or_else(|| panic!("{name} missing: {all:?}"))
    }

    #[test]
    fn linux_kinds_from_sysfs_facts() {
        let all = linux_host();
        let kind = |n: &str| find(&all, n).kind;
        assert_eq!(kind("lo"), LinkKind::Loopback);
        assert_eq!(kind("eth0"), LinkKind::Ethernet);
        assert_eq!(kind("enp1s0f0"), LinkKind::Ethernet);
        assert_eq!(kind("eno1"), LinkKind::Ethernet);
        assert_eq!(kind("wlan0"), LinkKind::Wifi);
        assert_eq!(kind("thunderbolt0"), LinkKind::ThunderboltIp);
        assert_eq!(kind("tbbr0"), LinkKind::ThunderboltBridge);
        assert_eq!(kind("docker0"), LinkKind::Virtual);
        assert_eq!(kind("veth1a2b3c"), LinkKind::Virtual);
        assert_eq!(kind("tun0"), LinkKind::Virtual);
        assert_eq!(kind("ib0"), LinkKind::Unknown);
        let br = find(&all, "tbbr0");
        assert_eq!(br.bridge_members, ["thunderbolt0", "thunderbolt1"]);
        assert_eq!(br.ipv4, [v4("10.9.0.1")]);
        assert_eq!(br.hardware_port, None);
        assert_eq!(
            find(&all, "eth0").hardware_port.as_deref(),
            Some("virtio_net")
        );
        assert_eq!(find(&all, "enp1s0f0").mtu, Some(9000));
    }

    #[test]
    fn linux_thunderbolt_driver_spellings() {
        for driver in ["thunderbolt-net", "thunderbolt_net"] {
            let f = facts(1, "up", Some(driver), None);
            assert_eq!(
                linux::classify("tb-a", &f, &[]),
                LinkKind::ThunderboltIp,
                "{driver}"
            );
        }
    }

    #[test]
    fn linux_speed_only_where_real() {
        let all = linux_host();
        let speed = |n: &str| find(&all, n).speed_gbit_per_s;
        assert_eq!(speed("enp1s0f0"), Some(100.0));
        assert_eq!(speed("eth0"), None, "-1 is unknown");
        assert_eq!(speed("eno1"), None, "unreadable is unknown");
        assert_eq!(speed("veth1a2b3c"), None, "veth's 10000 is fake");
        assert_eq!(speed("thunderbolt0"), None);
        assert_eq!(speed("thunderbolt1"), Some(40.0), "sysfs may say");
        assert_eq!(speed("tbbr0"), None);
        assert_eq!(speed("lo"), None);
        let unknown = facts(1, "up", Some("e1000e"), Some(i64::from(u32::MAX)));
        assert_eq!(linux::speed(LinkKind::Ethernet, &unknown), None);
    }

    #[test]
    fn linux_up_from_operstate_and_flags() {
        let all = linux_host();
        let up = |n: &str| find(&all, n).up;
        assert!(up("lo"), "operstate unknown, UP|RUNNING");
        assert!(up("eth0"));
        assert!(!up("eno1"));
        assert!(!up("wlan0"), "dormant");
        assert!(up("tun0"));
        assert!(!linux::is_up(Some("unknown"), IFF_UP));
        assert!(!linux::is_up(Some("lowerlayerdown"), IFF_UP | IFF_RUNNING));
    }

    // ---- macOS parsing, from sample command output ----

    /// A Mac Studio on macOS 15: 10GbE, Wi-Fi, the Thunderbolt Bridge over two Thunderbolt
    /// ports, and a USB Ethernet adapter.
    const PORTS_MACOS15: &str =
        include_str!("../../fixtures/os/macos15-networksetup-listallhardwareports.txt");

    const IFCONFIG_MACOS15: &str = include_str!("../../fixtures/os/macos15-ifconfig.txt");

    fn macos15_raw() -> Vec<RawIf> {
        vec![
            raw("lo0", 0x8049, &["127.0.0.1"], &["::1", "fe80::1"]),
            raw("gif0", 0x8010, &[], &[]),
            raw("stf0", 0x0, &[], &[]),
            raw("anpi0", 0x8863, &[], &[]),
            raw(
                "en0",
                0x8863,
                &["192.168.1.20"],
                &["fe80::10c1:2b3c:4d5e:6f70"],
            ),
            raw("en1", 0x8863, &[], &[]),
            raw("en2", 0x8963, &[], &[]),
            raw("en3", 0x8963, &[], &[]),
            raw("en6", 0x8863, &["192.168.2.7"], &[]),
            raw("en7", 0x8822, &[], &[]),
            raw("bridge0", 0x8863, &["10.0.0.1"], &[]),
            raw("ap1", 0x8843, &[], &[]),
            raw("awdl0", 0x8843, &[], &["fe80::283b:4cff:fe5d:6e7f"]),
            raw("utun0", 0x8051, &[], &["fe80::a1b2:c3d4:e5f6:1"]),
        ]
    }

    #[test]
    fn hardware_ports_macos15_mac_studio() {
        let ports = macos::parse_hardware_ports(PORTS_MACOS15);
        let pairs: Vec<(&str, &str)> = ports
            .iter()
            .map(|p| (p.port.as_str(), p.device.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("Ethernet", "en0"),
                ("Wi-Fi", "en1"),
                ("Thunderbolt Bridge", "bridge0"),
                ("Thunderbolt 1", "en2"),
                ("Thunderbolt 2", "en3"),
                ("USB 10/100/1000 LAN", "en6"),
                ("iPhone USB", "en7"),
            ]
        );
        assert_eq!(ports[0].address.as_deref(), Some("1c:1d:d3:e0:12:34"));
        assert_eq!(ports[6].address, None, "N/A is no address");
    }

    #[test]
    fn hardware_port_names_classify() {
        use LinkKind::*;
        let cases = [
            ("Thunderbolt Bridge", ThunderboltBridge),
            ("Thunderbolt 1", ThunderboltIp),
            ("Thunderbolt 4", ThunderboltIp),
            ("Wi-Fi", Wifi),
            ("Ethernet", Ethernet),
            ("10G Ethernet", Ethernet),
            ("Ethernet Adapter (en4)", Ethernet),
            ("Thunderbolt Ethernet Slot 1", Ethernet),
            ("USB 10/100/1000 LAN", Ethernet),
            ("USB 10/100 LAN", Ethernet),
            ("iPhone USB", Unknown),
            ("Bluetooth PAN", Unknown),
        ];
        for (port, kind) in cases {
            assert_eq!(macos::classify_port(port), kind, "{port}");
        }
    }

    #[test]
    fn ifconfig_single_interface_en0() {
        let en0 = "\
en0: flags=8863<UP,BROADCAST,SMART,RUNNING,SIMPLEX,MULTICAST> mtu 1500
\toptions=50b<RXCSUM,TXCSUM,VLAN_HWTAGGING,AV,CHANNEL_IO>
\tether 1c:1d:d3:e0:12:34
\tinet 192.168.1.20 netmask 0xffffff00 broadcast 192.168.1.255
\tmedia: autoselect (10Gbase-T <full-duplex>)
\tstatus: active
";
        let ifc = macos::parse_ifconfig(en0);
        assert_eq!(ifc.name, "en0");
        assert_eq!(ifc.mtu, Some(1500));
        assert!(ifc.flags.iter().any(|f| f == "UP") && ifc.flags.iter().any(|f| f == "RUNNING"));
        assert_eq!(
            ifc.media.as_deref(),
            Some("autoselect (10Gbase-T <full-duplex>)")
        );
        assert_eq!(ifc.status.as_deref(), Some("active"));
        assert!(ifc.members.is_empty());
        let missing = "ifconfig: interface en9 does not exist";
        assert_eq!(macos::parse_ifconfig(missing), macos::Ifconfig::default());
        assert_eq!(macos::parse_ifconfig(""), macos::Ifconfig::default());
    }

    #[test]
    fn ifconfig_bridge_members_and_blocks() {
        let blocks = macos::parse_ifconfig_all(IFCONFIG_MACOS15);
        let names: Vec<&str> = blocks.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "lo0", "gif0", "stf0", "anpi0", "en0", "en1", "en2", "en3", "en6", "bridge0",
                "ap1", "awdl0", "utun0"
            ]
        );
        let bridge = blocks
            .iter()
            .find(|b| b.name == "bridge0")
            .expect("bridge0");
        assert_eq!(bridge.members, ["en2", "en3"]);
        assert_eq!(bridge.media.as_deref(), Some("<unknown type>"));
        assert_eq!(bridge.status.as_deref(), Some("active"));
        let lo = &blocks[0];
        assert_eq!(lo.mtu, Some(16384));
        assert_eq!(lo.status, None);
        assert!(blocks[2].flags.is_empty(), "stf0: flags=0<>");
    }

    #[test]
    fn media_speeds() {
        assert_eq!(
            macos::parse_media_speed("autoselect (10Gbase-T <full-duplex>)"),
            Some(10.0)
        );
        assert_eq!(
            macos::parse_media_speed("10Gbase-T <full-duplex>"),
            Some(10.0)
        );
        assert_eq!(
            macos::parse_media_speed("autoselect (1000baseT <full-duplex,flow-control>)"),
            Some(1.0)
        );
        assert_eq!(
            macos::parse_media_speed("2500Base-T <full-duplex>"),
            Some(2.5)
        );
        assert_eq!(
            macos::parse_media_speed("autoselect (5000baseT <full-duplex>)"),
            Some(5.0)
        );
        assert_eq!(
            macos::parse_media_speed("100baseTX <full-duplex>"),
            Some(0.1)
        );
        assert_eq!(macos::parse_media_speed("autoselect"), None);
        assert_eq!(
            macos::parse_media_speed("autoselect <full-duplex>"),
            None,
            "Thunderbolt port"
        );
        assert_eq!(macos::parse_media_speed("<unknown type>"), None);
        assert_eq!(macos::parse_media_speed("none"), None);
    }

    #[test]
    fn macos15_mac_studio_thunderbolt_bridge() {
        let all = macos::describe(macos15_raw(), PORTS_MACOS15, IFCONFIG_MACOS15);
        let names: Vec<&str> = all.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(
            names,
            macos15_raw()
                .iter()
                .map(|r| r.name.clone())
                .collect::<Vec<_>>()
        );

        let en0 = find(&all, "en0");
        assert_eq!(en0.kind, LinkKind::Ethernet);
        assert_eq!(en0.speed_gbit_per_s, Some(10.0));
        assert_eq!(en0.mtu, Some(9000));
        assert!(en0.up);
        assert_eq!(en0.hardware_port.as_deref(), Some("Ethernet"));
        assert_eq!(en0.ipv4, [v4("192.168.1.20")]);

        let en1 = find(&all, "en1");
        assert_eq!(
            (en1.kind, en1.up, en1.speed_gbit_per_s),
            (LinkKind::Wifi, false, None)
        );

        let bridge = find(&all, "bridge0");
        assert_eq!(bridge.kind, LinkKind::ThunderboltBridge);
        assert_eq!(bridge.hardware_port.as_deref(), Some("Thunderbolt Bridge"));
        assert_eq!(bridge.bridge_members, ["en2", "en3"]);
        assert_eq!(bridge.speed_gbit_per_s, None);
        assert!(bridge.up);
        assert_eq!(bridge.ipv4, [v4("10.0.0.1")]);

        let en2 = find(&all, "en2");
        assert_eq!(en2.kind, LinkKind::ThunderboltIp);
        assert_eq!(en2.hardware_port.as_deref(), Some("Thunderbolt 1"));
        assert_eq!(
            en2.speed_gbit_per_s, None,
            "Thunderbolt reports no media speed"
        );
        assert!(en2.up);
        let en3 = find(&all, "en3");
        assert_eq!((en3.kind, en3.up), (LinkKind::ThunderboltIp, false));

        let en6 = find(&all, "en6");
        assert_eq!(
            (en6.kind, en6.speed_gbit_per_s),
            (LinkKind::Ethernet, Some(2.5))
        );
        assert_eq!(find(&all, "en7").kind, LinkKind::Unknown, "iPhone USB");

        let lo = find(&all, "lo0");
        assert_eq!(
            (lo.kind, lo.up, lo.mtu),
            (LinkKind::Loopback, true, Some(16384))
        );
        for name in ["gif0", "stf0", "anpi0", "ap1", "awdl0", "utun0"] {
            let i = find(&all, name);
            assert_eq!(i.kind, LinkKind::Virtual, "{name}");
            assert_eq!(i.speed_gbit_per_s, None, "{name}");
        }
        assert!(!find(&all, "gif0").up);
        assert!(find(&all, "utun0").up, "no status line: RUNNING decides");

        let on_bridge = find_for_addr(all.clone(), IpAddr::V4(v4("10.0.0.1"))).expect("bridge0");
        assert_eq!(on_bridge.name, "bridge0");
        let mapped = find_for_addr(all.clone(), "::ffff:10.0.0.1".parse().expect("addr"));
        assert_eq!(mapped.map(|i| i.name).as_deref(), Some("bridge0"));
        let lo_any = find_for_addr(all.clone(), IpAddr::V4(v4("127.0.0.2"))).expect("loopback");
        assert_eq!(lo_any.name, "lo0");
        assert_eq!(find_for_addr(all, IpAddr::V4(v4("8.8.8.8"))), None);
    }

    /// macOS 26 on a Mac Studio cabled point-to-point over Thunderbolt 5 without the bridge:
    /// en2 taken out of bridge0 and given its own address and jumbo MTU. networksetup here
    /// prints the bridge's address as N/A and lists the ports in another order.
    const PORTS_MACOS26: &str =
        include_str!("../../fixtures/os/macos26-networksetup-listallhardwareports.txt");

    const IFCONFIG_MACOS26: &str = include_str!("../../fixtures/os/macos26-ifconfig.txt");

    #[test]
    fn macos26_thunderbolt5_point_to_point() {
        let raw_list = vec![
            raw("lo0", 0x8049, &["127.0.0.1"], &["::1", "fe80::1"]),
            raw("en0", 0x8863, &["192.168.1.31"], &[]),
            raw("en1", 0x8863, &[], &[]),
            raw(
                "en2",
                0x8863,
                &["10.10.0.1"],
                &["fe80::34f0:11ff:fe22:3340"],
            ),
            raw("en3", 0x8963, &[], &[]),
            raw("en4", 0x8963, &[], &[]),
            raw("bridge0", 0x8822, &[], &[]),
        ];
        let all = macos::describe(raw_list, PORTS_MACOS26, IFCONFIG_MACOS26);
        let en2 = find(&all, "en2");
        assert_eq!(en2.kind, LinkKind::ThunderboltIp);
        assert_eq!(
            (en2.up, en2.mtu, en2.speed_gbit_per_s),
            (true, Some(9000), None)
        );
        assert_eq!(en2.ipv4, [v4("10.10.0.1")]);
        let en0 = find(&all, "en0");
        assert_eq!(
            (en0.kind, en0.speed_gbit_per_s),
            (LinkKind::Ethernet, Some(1.0))
        );
        let bridge = find(&all, "bridge0");
        assert_eq!(bridge.kind, LinkKind::ThunderboltBridge);
        assert!(!bridge.up, "admin down");
        assert_eq!(bridge.bridge_members, ["en3", "en4"]);
        // en1 has no ifconfig block in this sample: still Wi-Fi by its port, link unknown.
        let en1 = find(&all, "en1");
        assert_eq!((en1.kind, en1.mtu), (LinkKind::Wifi, None));
        assert_eq!(
            find_for_addr(all, IpAddr::V4(v4("10.10.0.1")))
                .map(|i| i.name)
                .as_deref(),
            Some("en2")
        );
    }

    #[test]
    fn thunderbolt_links_from_system_profiler() {
        let json =
            include_str!("../../fixtures/os/macos26-system_profiler-SPThunderboltDataType.json");
        let tb = macos::parse_thunderbolt(json, PORTS_MACOS26);
        let seen: Vec<(&str, Option<&str>, bool, Option<f64>)> = tb
            .iter()
            .map(|p| {
                (
                    p.port.as_str(),
                    p.interface.as_deref(),
                    p.connected,
                    p.link_gbit_per_s,
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("Thunderbolt 1", Some("en2"), true, Some(80.0)),
                ("Thunderbolt 2", Some("en3"), true, Some(40.0)),
                ("Thunderbolt 3", Some("en4"), false, None),
            ]
        );
        // Without networksetup's ports the links stand, unmapped; bad text gives nothing.
        let bare = macos::parse_thunderbolt(json, "");
        assert_eq!(bare.len(), 3);
        assert!(bare.iter().all(|p| p.interface.is_none()));
        for bad in ["", "{", "[]", "{\"SPThunderboltDataType\": 3}"] {
            assert!(
                macos::parse_thunderbolt(bad, PORTS_MACOS26).is_empty(),
                "{bad}"
            );
        }
        let older = r#"{"SPThunderboltDataType":[{"_items":[{"_name":"x"}],"receptacle_1_tag":{"receptacle_id_key":1,"current_speed_key":"Up to 40 Gb/s x1"}}]}"#;
        assert_eq!(
            macos::parse_thunderbolt(older, "")[0].link_gbit_per_s,
            Some(40.0)
        );
    }

    #[test]
    fn macos_without_command_output_falls_back() {
        // networksetup and ifconfig both failed: getifaddrs alone still gives loopback.
        let all = macos::describe(macos15_raw(), "", "");
        assert_eq!(find(&all, "lo0").kind, LinkKind::Loopback);
        assert_eq!(find(&all, "en0").kind, LinkKind::Unknown);
        assert_eq!(find(&all, "utun0").kind, LinkKind::Virtual);
        assert_eq!(find(&all, "bridge0").kind, LinkKind::Virtual);
        assert!(find(&all, "en0").up, "UP|RUNNING without a status line");
    }

    #[test]
    fn macos_bridge_without_port_follows_members() {
        let ports = "Hardware Port: Thunderbolt 1\nDevice: en2\nEthernet Address: N/A\n";
        let ifc = "\
bridge1: flags=8863<UP,BROADCAST,SMART,RUNNING,SIMPLEX,MULTICAST> mtu 1500
\tmember: en2 flags=3<LEARNING,DISCOVER>
\tstatus: active
en2: flags=8963<UP,BROADCAST,SMART,RUNNING,PROMISC,SIMPLEX,MULTICAST> mtu 1500
\tmedia: autoselect <full-duplex>
\tstatus: active
";
        let raw_list = vec![
            raw("bridge1", 0x8863, &[], &[]),
            raw("en2", 0x8963, &[], &[]),
        ];
        let all = macos::describe(raw_list, ports, ifc);
        assert_eq!(find(&all, "bridge1").kind, LinkKind::ThunderboltBridge);
    }

    // ---- this machine (Linux) ----

    #[cfg(target_os = "linux")]
    #[test]
    fn linux_interfaces_include_loopback() {
        let all = interfaces().expect("interfaces");
        let lo = find(&all, "lo");
        assert_eq!(lo.kind, LinkKind::Loopback);
        assert!(lo.up, "{lo:?}");
        assert!(lo.ipv4.contains(&Ipv4Addr::LOCALHOST), "{lo:?}");
        assert_eq!(lo.speed_gbit_per_s, None);
        assert!(lo.mtu.is_some_and(|m| m > 0), "{lo:?}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn linux_interface_for_loopback_addr_is_lo() {
        let lo = interface_for_addr(IpAddr::V4(Ipv4Addr::LOCALHOST)).expect("lo");
        assert_eq!(lo.name, "lo");
        let lo2 = interface_for_addr(IpAddr::V4(v4("127.0.0.53"))).expect("127/8 is lo");
        assert_eq!(lo2.name, "lo");
        assert_eq!(ipv4_of("lo").expect("lo has IPv4"), Ipv4Addr::LOCALHOST);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn linux_unknown_interface_error_lists_names() {
        let err = interface_by_name("nope0")
            .expect_err("no such interface")
            .to_string();
        assert!(err.contains("'nope0'"), "{err}");
        assert!(err.contains("have: ") && err.contains("lo"), "{err}");
        let lo = interface_by_name("lo").expect("lo exists");
        assert_eq!(lo.kind, LinkKind::Loopback);
        assert!(ipv4_of("nope0").is_err());
    }
}
