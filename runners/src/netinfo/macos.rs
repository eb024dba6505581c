use super::{
    bare_interface, bridge_kind, Interface, LinkKind, RawIf, IFF_LOOPBACK, IFF_RUNNING, IFF_UP,
};

/// One block of `networksetup -listallhardwareports`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct HardwarePort {
    /// "Ethernet", "Wi-Fi", "Thunderbolt Bridge", "Thunderbolt 1", ...
    pub port: String,
    /// "en0", "bridge0", ...
    pub device: String,
    /// None where networksetup prints "N/A".
    pub address: Option<String>,
}

/// Parses `system_profiler SPThunderboltDataType -json`: one entry per Thunderbolt bus,
/// its `receptacle_1_tag` naming the port (`receptacle_id_key` N is hardware port
/// "Thunderbolt N") and the link's `current_speed_key` ("Up to 80 Gb/s"); its `_items`,
/// what is connected. Interfaces come from `ports_text` (networksetup's hardware ports).
/// Text that is not such JSON gives no ports.
pub(super) fn parse_thunderbolt(json: &str, ports_text: &str) -> Vec<super::ThunderboltPort> {
    let ports = parse_hardware_ports(ports_text);
    let Ok(v) = serde_json::from_str::<serde_json::Value>(json) else {
        return Vec::new();
    };
    let Some(buses) = v["SPThunderboltDataType"].as_array() else {
        return Vec::new();
    };
    buses
        .iter()
        .filter_map(|bus| {
            let tag = &bus["receptacle_1_tag"];
            let id = match &tag["receptacle_id_key"] {
                serde_json::Value::String(s) => s.trim().to_string(),
                serde_json::Value::Number(n) => n.to_string(),
                _ => return None,
            };
            let port = format!("Thunderbolt {id}");
            let items = bus["_items"].as_array().is_some_and(|i| !i.is_empty());
            let status = tag["receptacle_status_key"].as_str().unwrap_or("");
            let connected = items || status == "receptacle_connected";
            let speed = tag["current_speed_key"].as_str().and_then(parse_tb_speed);
            Some(super::ThunderboltPort {
                interface: ports
                    .iter()
                    .find(|p| p.port == port)
                    .map(|p| p.device.clone()),
                port,
                connected,
                link_gbit_per_s: speed.filter(|_| connected),
            })
        })
        .collect()
}

/// "Up to 80 Gb/s" → 80; "Up to 40 Gb/s x1" → 40; "10 Gb/s" → 10.
fn parse_tb_speed(text: &str) -> Option<f64> {
    let lower = text.to_ascii_lowercase();
    let at = lower.find("gb/s")?;
    let number = lower[..at].split_whitespace().last()?;
    number.parse::<f64>().ok().filter(|v| *v > 0.0)
}

/// Parses `networksetup -listallhardwareports`: blocks of "Hardware Port: X",
/// "Device: Y", "Ethernet Address: Z". Other lines (the VLAN trailer) are ignored.
pub(super) fn parse_hardware_ports(text: &str) -> Vec<HardwarePort> {
    let mut out = Vec::new();
    let mut current: Option<HardwarePort> = None;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key.trim() {
            "Hardware Port" => {
                out.extend(current.take().filter(|p| !p.device.is_empty()));
                current = Some(HardwarePort {
                    port: value.to_string(),
                    device: String::new(),
                    address: None,
                });
            }
            "Device" => {
                if let Some(p) = current.as_mut() {
                    p.device = value.to_string();
                }
            }
            "Ethernet Address" => {
                if let Some(p) = current.as_mut() {
                    let known = !value.is_empty() && !value.eq_ignore_ascii_case("n/a");
                    p.address = known.then(|| value.to_string());
                }
            }
            _ => {}
        }
    }
    out.extend(current.filter(|p| !p.device.is_empty()));
    out
}

/// What one interface's block of `ifconfig` output says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Ifconfig {
    pub name: String,
    /// Flag names from `flags=8863<UP,BROADCAST,...>`.
    pub flags: Vec<String>,
    pub mtu: Option<u32>,
    /// The `media:` value, e.g. "autoselect (10Gbase-T <full-duplex>)".
    pub media: Option<String>,
    /// The `status:` value: "active" or "inactive"; absent on loopback and tunnels.
    pub status: Option<String>,
    /// Bridge `member:` interfaces, in listed order.
    pub members: Vec<String>,
}

/// An interface block starts at an unindented "name: flags=..." line.
fn is_header(line: &str) -> bool {
    !line.starts_with([' ', '\t']) && line.contains(": flags=")
}

/// Parses the output of `ifconfig NAME`: the first interface block in `text`, or the
/// default (no name) when there is none, e.g. "interface en9 does not exist".
pub(super) fn parse_ifconfig(text: &str) -> Ifconfig {
    let mut lines = text.lines().skip_while(|l| !is_header(l));
    let Some((name, rest)) = lines.next().and_then(|l| l.split_once(':')) else {
        return Ifconfig::default();
    };
    let mut out = parse_header(name, rest);
    for line in lines.take_while(|l| !is_header(l)) {
        let line = line.trim();
        if let Some(v) = line.strip_prefix("media:") {
            out.media = Some(v.trim().to_string());
        } else if let Some(v) = line.strip_prefix("status:") {
            out.status = Some(v.trim().to_string());
        } else if let Some(v) = line.strip_prefix("member:") {
            out.members
                .extend(v.split_whitespace().next().map(str::to_string));
        }
    }
    out
}

/// Parses `ifconfig -a`: one [`parse_ifconfig`] block per interface, in listed order.
pub(super) fn parse_ifconfig_all(text: &str) -> Vec<Ifconfig> {
    let mut starts = Vec::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if is_header(line) {
            starts.push(offset);
        }
        offset += line.len();
    }
    let ends = starts
        .iter()
        .skip(1)
        .copied()
        .chain(std::iter::once(text.len()));
    starts
        .iter()
        .zip(ends)
        .map(|(&a, b)| parse_ifconfig(&text[a..b]))
        .collect()
}

/// "en0" and " flags=8863<UP,BROADCAST,...> mtu 1500".
fn parse_header(name: &str, rest: &str) -> Ifconfig {
    let flags = rest
        .split_once('<')
        .and_then(|(_, after)| after.split_once('>'))
        .map(|(list, _)| {
            list.split(',')
                .filter(|s| !s.is_empty())
                .map(|s| s.trim().to_string())
                .collect()
        })
        .unwrap_or_default();
    let mut words = rest.split_whitespace();
    let mut mtu = None;
    while let Some(word) = words.next() {
        if word == "mtu" {
            mtu = words.next().and_then(|v| v.parse().ok());
        }
    }
    Ifconfig {
        name: name.trim().to_string(),
        flags,
        mtu,
        ..Ifconfig::default()
    }
}

/// Nominal speed in Gbit/s from an ifconfig `media:` value: "10Gbase-T" → 10,
/// "1000baseT" → 1, "2500Base-T" → 2.5, "100baseTX" → 0.1. None when no speed is named
/// ("autoselect", "<unknown type>", Thunderbolt ports' "autoselect <full-duplex>").
pub(super) fn parse_media_speed(media: &str) -> Option<f64> {
    media
        .split(|c: char| c.is_whitespace() || "()<>,".contains(c))
        .find_map(|token| {
            let lower = token.to_ascii_lowercase();
            let (prefix, _) = lower.split_once("base")?;
            let (number, per_gbit) = match prefix.strip_suffix('g') {
                Some(n) => (n, 1.0),
                None => (prefix.strip_suffix('m').unwrap_or(prefix), 1000.0),
            };
            let value: f64 = number.parse().ok()?;
            (value > 0.0).then_some(value / per_gbit)
        })
}

/// The kind a networksetup hardware port name implies; Unknown where it implies none
/// ("iPhone USB", "Bluetooth PAN", a bare chip name).
pub(super) fn classify_port(port: &str) -> LinkKind {
    let lower = port.trim().to_ascii_lowercase();
    if lower == "thunderbolt bridge" {
        return LinkKind::ThunderboltBridge;
    }
    if lower.starts_with("wi-fi") || lower == "airport" {
        return LinkKind::Wifi;
    }
    // Before the Thunderbolt test: Apple's "Thunderbolt Ethernet Slot 1" adapter is Ethernet.
    if lower.contains("ethernet") || lower.split_whitespace().any(|w| w == "lan") {
        return LinkKind::Ethernet;
    }
    if lower.starts_with("thunderbolt") {
        return LinkKind::ThunderboltIp;
    }
    LinkKind::Unknown
}

/// The kind of interface `name`: the hardware port decides where it names a kind;
/// otherwise bridges follow their members, a `media:` with a speed means Ethernet, other
/// `enX` stay Unknown, and the rest (utun, gif, stf, awdl, llw, anpi, ap) are Virtual.
pub(super) fn classify(
    name: &str,
    flags: u32,
    port: Option<&str>,
    ifc: Option<&Ifconfig>,
    member_kinds: &[LinkKind],
) -> LinkKind {
    let loopback_flag = ifc.is_some_and(|i| i.flags.iter().any(|f| f == "LOOPBACK"));
    if flags & IFF_LOOPBACK != 0 || loopback_flag {
        return LinkKind::Loopback;
    }
    if let Some(kind) = port.map(classify_port).filter(|k| *k != LinkKind::Unknown) {
        return kind;
    }
    if name.starts_with("bridge") || ifc.is_some_and(|i| !i.members.is_empty()) {
        return bridge_kind(member_kinds);
    }
    if ifc
        .and_then(|i| i.media.as_deref())
        .and_then(parse_media_speed)
        .is_some()
    {
        return LinkKind::Ethernet;
    }
    if port.is_some() || name.starts_with("en") {
        return LinkKind::Unknown;
    }
    LinkKind::Virtual
}

/// Interfaces from getifaddrs entries and the text of networksetup and `ifconfig -a`
/// (either may be empty when the command failed: kinds then fall back to Unknown).
pub(super) fn describe(raw: Vec<RawIf>, ports_text: &str, ifconfig_text: &str) -> Vec<Interface> {
    let ports = parse_hardware_ports(ports_text);
    let blocks = parse_ifconfig_all(ifconfig_text);
    let port_of = |name: &str| {
        ports
            .iter()
            .find(|p| p.device == name)
            .map(|p| p.port.as_str())
    };
    let ifc_of = |name: &str| blocks.iter().find(|b| b.name == name);
    let flags_of = |name: &str| raw.iter().find(|r| r.name == name).map_or(0, |r| r.flags);
    let kinds: Vec<LinkKind> = raw
        .iter()
        .map(|r| {
            let ifc = ifc_of(&r.name);
            let member_kinds: Vec<LinkKind> = ifc
                .map(|i| &i.members[..])
                .unwrap_or_default()
                .iter()
                .map(|m| classify(m, flags_of(m), port_of(m), ifc_of(m), &[]))
                .collect();
            classify(&r.name, r.flags, port_of(&r.name), ifc, &member_kinds)
        })
        .collect();
    raw.clone()
        .into_iter()
        .zip(kinds)
        .map(|(r, kind)| {
            let ifc = ifc_of(&r.name);
            // "status:" is the link state; without one (loopback, tunnels) trust RUNNING.
            let link = match ifc.and_then(|i| i.status.as_deref()) {
                Some(status) => status == "active",
                None => r.flags & IFF_RUNNING != 0,
            };
            let speed = match kind {
                LinkKind::Loopback | LinkKind::Virtual => None,
                _ => ifc
                    .and_then(|i| i.media.as_deref())
                    .and_then(parse_media_speed),
            };
            Interface {
                kind,
                up: r.flags & IFF_UP != 0 && link,
                mtu: ifc.and_then(|i| i.mtu),
                speed_gbit_per_s: speed,
                hardware_port: port_of(&r.name).map(str::to_string),
                bridge_members: ifc.map(|i| i.members.clone()).unwrap_or_default(),
                ..bare_interface(r)
            }
        })
        .collect()
}

/// Stdout of the first of `programs` that runs and succeeds with `args`. Absolute paths
/// come first because ssh sessions may start with a minimal PATH.
#[cfg(target_os = "macos")]
pub(super) fn run(programs: &[&str], args: &[&str]) -> Option<String> {
    programs.iter().find_map(|program| {
        let out = std::process::Command::new(program)
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    })
}
