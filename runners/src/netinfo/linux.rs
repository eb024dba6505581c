use super::{bare_interface, bridge_kind, Interface, LinkKind, RawIf, IFF_RUNNING, IFF_UP};

/// ARPHRD_* values from `/sys/class/net/<if>/type`.
const ARPHRD_ETHER: u32 = 1;
const ARPHRD_LOOPBACK: u32 = 772;

/// What sysfs says about one interface; gathered apart from classification so that the
/// rules can be tested without the hardware.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Facts {
    /// `type`: ARPHRD_* (1 Ethernet, 772 loopback, 65534 none/tun).
    pub if_type: Option<u32>,
    /// `operstate`: "up", "down", "unknown", "dormant", "lowerlayerdown", ...
    pub operstate: Option<String>,
    /// `flags` (hex IFF_* bits). This is the admin state only: IFF_RUNNING is not in it,
    /// so it is OR-ed with getifaddrs' flags, which have it.
    pub flags: Option<u32>,
    pub mtu: Option<u32>,
    /// `speed` in Mb/s; -1 or unreadable (EINVAL when the link is down) means unknown.
    pub speed_mbit: Option<i64>,
    /// `wireless/` or `phy80211` present.
    pub wireless: bool,
    /// `bridge/` present.
    pub bridge: bool,
    /// Entries of `brif/`, sorted.
    pub bridge_members: Vec<String>,
    /// `device` link present: backed by hardware (or a paravirtual NIC such as virtio).
    pub has_device: bool,
    /// Basename of the `device/driver` link ("ixgbe", "virtio_net", "thunderbolt-net").
    pub driver: Option<String>,
}

#[cfg(target_os = "linux")]
pub(super) fn read_facts(name: &str) -> Facts {
    use std::fs;
    use std::path::Path;

    let dir = Path::new("/sys/class/net").join(name);
    let read = |file: &str| {
        fs::read_to_string(dir.join(file))
            .ok()
            .map(|s| s.trim().to_string())
    };
    let mut members: Vec<String> = fs::read_dir(dir.join("brif"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    members.sort();
    Facts {
        if_type: read("type").and_then(|s| s.parse().ok()),
        operstate: read("operstate"),
        flags: read("flags").and_then(|s| u32::from_str_radix(s.trim_start_matches("0x"), 16).ok()),
        mtu: read("mtu").and_then(|s| s.parse().ok()),
        speed_mbit: read("speed").and_then(|s| s.parse().ok()),
        wireless: dir.join("wireless").exists() || dir.join("phy80211").exists(),
        bridge: dir.join("bridge").is_dir(),
        bridge_members: members,
        has_device: dir.join("device").exists(),
        driver: fs::read_link(dir.join("device/driver"))
            .ok()
            .and_then(|p| p.file_name().map(|s| s.to_string_lossy().into_owned())),
    }
}

fn is_thunderbolt_driver(driver: &str) -> bool {
    driver.replace('_', "-") == "thunderbolt-net"
}

/// The kind of interface `name`; `member_kinds` are the kinds of its bridge members.
pub(super) fn classify(name: &str, f: &Facts, member_kinds: &[LinkKind]) -> LinkKind {
    if f.if_type == Some(ARPHRD_LOOPBACK) {
        return LinkKind::Loopback;
    }
    if f.bridge {
        return bridge_kind(member_kinds);
    }
    if f.wireless {
        return LinkKind::Wifi;
    }
    let tb_driver = f.driver.as_deref().is_some_and(is_thunderbolt_driver);
    if tb_driver || (f.has_device && name.starts_with("thunderbolt")) {
        return LinkKind::ThunderboltIp;
    }
    if !f.has_device {
        return LinkKind::Virtual;
    }
    match f.if_type {
        Some(ARPHRD_ETHER) | None => LinkKind::Ethernet,
        // IPoIB (32), CAN and the like: hardware, but not a kind we label.
        Some(_) => LinkKind::Unknown,
    }
}

/// Up means a live link: operstate "up", or "unknown" (loopback, tun: drivers that do not
/// report link state) with IFF_UP and IFF_RUNNING set.
pub(super) fn is_up(operstate: Option<&str>, flags: u32) -> bool {
    match operstate {
        Some("up") => true,
        Some("unknown") | None => flags & IFF_UP != 0 && flags & IFF_RUNNING != 0,
        Some(_) => false,
    }
}

/// Nominal speed in Gbit/s. None for virtual links (veth claims 10000 Mb/s, which is
/// fiction), bridges and loopback, and for the "unknown" values sysfs uses.
pub(super) fn speed(kind: LinkKind, f: &Facts) -> Option<f64> {
    if f.bridge || matches!(kind, LinkKind::Loopback | LinkKind::Virtual) {
        return None;
    }
    match f.speed_mbit {
        // Old kernels print SPEED_UNKNOWN as u32::MAX rather than -1.
        Some(m) if m > 0 && m < i64::from(u32::MAX) => Some(m as f64 / 1000.0),
        _ => None,
    }
}

/// Interfaces from getifaddrs entries and a sysfs reader (a fake in tests).
pub(super) fn describe(raw: Vec<RawIf>, facts_of: impl Fn(&str) -> Facts) -> Vec<Interface> {
    raw.into_iter()
        .map(|r| {
            let facts = facts_of(&r.name);
            let member_kinds: Vec<LinkKind> = facts
                .bridge_members
                .iter()
                .map(|m| classify(m, &facts_of(m), &[]))
                .collect();
            let kind = classify(&r.name, &facts, &member_kinds);
            let flags = facts.flags.unwrap_or(0) | r.flags;
            Interface {
                kind,
                up: is_up(facts.operstate.as_deref(), flags),
                mtu: facts.mtu,
                speed_gbit_per_s: speed(kind, &facts),
                hardware_port: facts.driver.clone(),
                bridge_members: facts.bridge_members.clone(),
                ..bare_interface(r)
            }
        })
        .collect()
}
