//! Hostfiles, in the forms cluster owners already have: OpenMPI's (`host slots=N`, one per
//! line, `#` comments; MPICH's `host:N` too) and every form mlx.launch reads (MLX 0.32,
//! `python/mlx/_distributed_utils/common.py`): a JSON list of hosts, or an object with
//! `backend`, `envs` and `hosts`, each host `{"ssh", "ips", "rdma"}`. What a form says about
//! the cabling becomes each host's [`CableHint`]s, which the ranks turn into links per pair
//! (`crate::links`).

use crate::links::{CableHint, Via};
use anyhow::{bail, Context, Result};
use std::net::Ipv4Addr;
use std::path::Path;

/// One host: the name the remote shell reaches it by, its control addresses, its slots, and
/// what the file says about its cables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostEntry {
    /// What `ssh` (or `--rsh`) is given: a hostname, `user@host`, or a namespace name.
    pub name: String,
    /// Addresses other ranks use to reach this host's control side (the rendezvous), in the
    /// file's order; empty means "the name". A `ring` file's `ips` are cable addresses, not
    /// these (they go to `cables`).
    pub ips: Vec<String>,
    /// How many ranks this host takes.
    pub slots: usize,
    /// The cables this host has to other hosts of the file, as the file names them: `rdma`
    /// devices per peer, or a ring file's addresses on the cables to the previous host.
    pub cables: Vec<CableHint>,
}

/// A hostfile read whole: its hosts, and what an MLX object form adds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hostfile {
    pub hosts: Vec<HostEntry>,
    /// `backend` of an MLX object form (`ring`, `jaccl`, `jaccl-ring`, ...).
    pub backend: Option<String>,
    /// `envs` of an MLX object form, `KEY=VALUE` each: set on every rank and recorded.
    pub envs: Vec<String>,
    /// What was read but not used (unknown keys), one line each, for the launcher to print.
    pub notes: Vec<String>,
}

pub fn read_hostfile(path: &Path) -> Result<Hostfile> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read hostfile {}", path.display()))?;
    parse_hostfile(&text).with_context(|| format!("bad hostfile {}", path.display()))
}

/// Parses any form, chosen by the first non-blank character (`[` or `{` is JSON). A UTF-8
/// byte order mark (what some editors write first) is skipped.
pub fn parse_hostfile(text: &str) -> Result<Hostfile> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut start = text.trim_start().chars();
    let first = start.next();
    // `[` opens a JSON list only where a host object (or nothing) follows: OpenMPI's lines may
    // begin with a bracketed IPv6 address (`[::1] slots=2`).
    let json_list =
        first == Some('[') && matches!(start.find(|c| !c.is_whitespace()), Some('{' | ']') | None);
    let file = match first {
        Some('{') => parse_mlx_json(text)?,
        Some('[') if json_list => parse_mlx_json(text)?,
        _ => Hostfile {
            hosts: parse_openmpi(text)?,
            ..Hostfile::default()
        },
    };
    if file.hosts.is_empty() {
        bail!("no hosts listed");
    }
    Ok(file)
}

/// The keys mlx.launch reads; any other is noted and ignored (newer MLX versions add keys).
const MLX_TOP_KEYS: [&str; 3] = ["backend", "envs", "hosts"];
const MLX_HOST_KEYS: [&str; 4] = ["ssh", "ips", "rdma", "slots"];

fn parse_mlx_json(text: &str) -> Result<Hostfile> {
    use serde_json::Value;
    let v: Value = serde_json::from_str(text)
        .map_err(|e| anyhow::anyhow!("not valid JSON (an mlx.launch hostfile): {e}"))?;
    let mut file = Hostfile::default();
    let hosts = match &v {
        Value::Array(h) => h,
        Value::Object(o) => {
            for k in o.keys().filter(|k| !MLX_TOP_KEYS.contains(&k.as_str())) {
                file.notes
                    .push(format!("key \"{k}\" is not one tbbench reads: ignored"));
            }
            file.backend = match o.get("backend") {
                None | Some(Value::Null) => None,
                Some(Value::String(b)) if b.is_empty() => None,
                Some(Value::String(b)) => Some(b.clone()),
                Some(other) => bail!("\"backend\" must be a string, got {other}"),
            };
            file.envs = match o.get("envs") {
                None | Some(Value::Null) => vec![],
                Some(Value::Array(e)) => e
                    .iter()
                    .map(|x| match x.as_str() {
                        Some(s) if valid_env(s) => Ok(s.to_string()),
                        _ => bail!("\"envs\" entries are \"KEY=VALUE\" strings, got {x}"),
                    })
                    .collect::<Result<_>>()?,
                Some(other) => bail!("\"envs\" must be a list of \"KEY=VALUE\", got {other}"),
            };
            match o.get("hosts") {
                Some(Value::Array(h)) => h,
                Some(_) => bail!("\"hosts\" must be a list of hosts"),
                None => bail!(
                    "a JSON object without \"hosts\": mlx.launch's object form is {{\"backend\": ..., \"hosts\": [{{\"ssh\": \"mac1\"}}, ...]}}"
                ),
            }
        }
        _ => bail!("an mlx.launch hostfile is a JSON list of hosts or an object with \"hosts\""),
    };
    let ring = file.backend.as_deref() == Some("ring");
    let n = hosts.len();
    for (i, h) in hosts.iter().enumerate() {
        let at = || format!("host {} of the hostfile", i + 1);
        let o = h
            .as_object()
            .with_context(|| format!("{}: not an object like {{\"ssh\": \"mac1\"}}", at()))?;
        for k in o.keys().filter(|k| !MLX_HOST_KEYS.contains(&k.as_str())) {
            file.notes.push(format!(
                "{}: key \"{k}\" is not one tbbench reads: ignored",
                at()
            ));
        }
        let name = match o.get("ssh") {
            Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
            Some(Value::String(_)) => bail!("{} has an empty \"ssh\" name", at()),
            _ => bail!(
                "{} has no \"ssh\" name (mlx.launch's hosts are {{\"ssh\": \"mac1\", ...}})",
                at()
            ),
        };
        check_host_name(&name).with_context(at)?;
        let ips: Vec<String> = match o.get("ips") {
            None | Some(Value::Null) => vec![],
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| {
                    let s = x.as_str().unwrap_or_default();
                    s.parse::<std::net::IpAddr>()
                        .map(|_| s.to_string())
                        .map_err(|_| {
                            anyhow::anyhow!(
                                "{} ({name}): \"ips\" entry {x} is not an IP address",
                                at()
                            )
                        })
                })
                .collect::<Result<_>>()?,
            Some(other) => bail!(
                "{} ({name}): \"ips\" must be a list of addresses, got {other}",
                at()
            ),
        };
        let slots = match o.get("slots") {
            None | Some(Value::Null) => 1,
            Some(x) => match x.as_u64() {
                Some(s) if s > 0 => usize::try_from(s).unwrap_or(usize::MAX),
                _ => bail!(
                    "{} ({name}) has slots {x}: a positive whole number is needed",
                    at()
                ),
            },
        };
        let mut cables = Vec::new();
        match o.get("rdma") {
            None | Some(Value::Null) => {}
            Some(Value::Array(per_peer)) => {
                if per_peer.len() > n {
                    bail!(
                        "{} ({name}): \"rdma\" lists {} peers, the file has {n} hosts",
                        at(),
                        per_peer.len()
                    );
                }
                for (j, d) in per_peer.iter().enumerate() {
                    let names: Vec<&Value> = match d {
                        Value::Null => vec![],
                        Value::String(_) => vec![d],
                        Value::Array(a) => a.iter().collect(),
                        other => bail!("{} ({name}): \"rdma\" entry {j} is {other}: null, a device name or a list of names", at()),
                    };
                    for d in names {
                        let dev = d.as_str().filter(|s| valid_device(s)).with_context(|| {
                            format!("{} ({name}): \"rdma\" entry {j}: {d} is not a device name like \"rdma_en3\"", at())
                        })?;
                        if j == i {
                            bail!("{} ({name}): \"rdma\" names device {dev} for the host itself (entry {j} should be null)", at());
                        }
                        cables.push(CableHint {
                            peer_host: j,
                            via: Via::Device(dev.to_string()),
                        });
                    }
                }
            }
            Some(other) => bail!(
                "{} ({name}): \"rdma\" must be a list, one entry per host, got {other}",
                at()
            ),
        }
        // A ring file's ips: this host's addresses on its cables to the previous host.
        let ips = if ring && n > 1 {
            let prev = (i + n - 1) % n;
            for ip in &ips {
                let v4: Ipv4Addr = ip.parse().with_context(|| {
                    format!("{} ({name}): ring addresses are IPv4, got {ip}", at())
                })?;
                cables.push(CableHint {
                    peer_host: prev,
                    via: Via::Address(v4),
                });
            }
            vec![]
        } else {
            ips
        };
        file.hosts.push(HostEntry {
            name,
            ips,
            slots,
            cables,
        });
    }
    Ok(file)
}

/// `KEY=VALUE` with a shell-safe key, as an environment entry must be.
fn valid_env(s: &str) -> bool {
    match s.split_once('=') {
        Some((k, _)) => {
            !k.is_empty()
                && !k.starts_with(|c: char| c.is_ascii_digit())
                && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        }
        None => false,
    }
}

/// An RDMA device name as ibverbs lists them (`rdma_en3`, `mlx5_0`).
fn valid_device(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
}

/// A name the remote shell can be given: a host name, `user@host`, an IPv6 address in brackets
/// or a namespace name. Anything else (quotes, braces, shell syntax) is a mistake in the file,
/// caught here rather than as an ssh failure.
fn check_host_name(name: &str) -> Result<()> {
    let ok = |c: char| c.is_ascii_alphanumeric() || "._-@:[]%".contains(c);
    if name.len() > 255 || !name.chars().all(ok) {
        bail!("'{name}' is not a host name (letters, digits and . _ - @ : [ ] % only)");
    }
    Ok(())
}

fn parse_openmpi(text: &str) -> Result<Vec<HostEntry>> {
    let mut hosts = Vec::new();
    for (lineno, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let mut name = words.next().unwrap_or_default().to_string();
        let mut slots = 1;
        // MPICH's `host:N` (N ranks on host), as its hydra launcher reads it; a bracketed
        // IPv6 address keeps its colons.
        if let Some((host, n)) = name
            .rsplit_once(':')
            .filter(|(h, _)| !h.contains(':') || h.ends_with(']'))
        {
            if n.chars().all(|c| c.is_ascii_digit()) && !n.is_empty() {
                slots = n.parse().ok().filter(|n| *n > 0).with_context(|| {
                    format!(
                        "line {}: '{name}': slots must be a positive whole number",
                        lineno + 1
                    )
                })?;
                name = host.to_string();
            }
        }
        check_host_name(&name).with_context(|| format!("line {}", lineno + 1))?;
        for w in words {
            let (key, value) = w.split_once('=').with_context(|| {
                format!(
                    "line {}: '{w}' is not key=value (expected 'host slots=N')",
                    lineno + 1
                )
            })?;
            match key {
                "slots" | "max_slots" | "max-slots" => {
                    let n: usize = value.parse().ok().filter(|n| *n > 0).with_context(|| {
                        format!(
                            "line {}: slots must be a positive whole number, got '{value}'",
                            lineno + 1
                        )
                    })?;
                    if key == "slots" {
                        slots = n;
                    }
                }
                other => bail!(
                    "line {}: unknown key '{other}' (expected slots=N)",
                    lineno + 1
                ),
            }
        }
        hosts.push(HostEntry {
            name,
            ips: Vec::new(),
            slots,
            cables: Vec::new(),
        });
    }
    Ok(hosts)
}

/// Places `nodes` ranks on hosts: fill each host's slots in file order, as mpirun's default
/// by-slot mapping does. Errors when the file has fewer slots than ranks.
pub fn place_ranks(hosts: &[HostEntry], nodes: usize) -> Result<Vec<usize>> {
    let total = hosts.iter().fold(0usize, |t, h| t.saturating_add(h.slots));
    if nodes > total {
        bail!("{nodes} ranks asked for but the hostfile has {total} slots");
    }
    let mut placement = Vec::with_capacity(nodes);
    'outer: for (i, h) in hosts.iter().enumerate() {
        for _ in 0..h.slots {
            if placement.len() == nodes {
                break 'outer;
            }
            placement.push(i);
        }
    }
    Ok(placement)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmpi_hostfile_with_slots_and_comments() {
        let h = parse_hostfile(
            "# cluster\nmac1 slots=2\nmac2   # second\n\nuser@mac3 slots=1 max_slots=4\n",
        )
        .unwrap()
        .hosts;
        assert_eq!(h.len(), 3);
        assert_eq!(
            h[0],
            HostEntry {
                name: "mac1".into(),
                ips: vec![],
                slots: 2,
                cables: vec![],
            }
        );
        assert_eq!(h[1].slots, 1);
        assert_eq!(h[2].name, "user@mac3");
    }

    #[test]
    fn mlx_json_hostfile_with_ips() {
        let h = parse_hostfile(
            r#"[{"ssh": "mac1", "ips": ["10.0.0.1", "192.168.1.5"]}, {"ssh": "mac2", "ips": []}]"#,
        )
        .unwrap()
        .hosts;
        assert_eq!(h[0].ips, vec!["10.0.0.1", "192.168.1.5"]);
        assert_eq!(h[1].slots, 1);
    }

    #[test]
    fn malformed_hostfiles_name_the_line() {
        let e = format!("{:#}", parse_hostfile("mac1 slots=two\n").unwrap_err());
        assert!(e.contains("line 1") && e.contains("two"), "{e}");
        let e = format!("{:#}", parse_hostfile("mac1\nmac2 cpus=4\n").unwrap_err());
        assert!(e.contains("line 2") && e.contains("cpus"), "{e}");
        let e = format!("{:#}", parse_hostfile("mac1 slots=0").unwrap_err());
        assert!(e.contains("positive"), "{e}");
        let e = format!(
            "{:#}",
            parse_hostfile("[{\"host\": \"mac1\"}]").unwrap_err()
        );
        assert!(e.contains("no \"ssh\" name"), "{e}");
        assert!(parse_hostfile("# nothing\n\n").is_err());
        assert!(parse_hostfile("[{\"ssh\": \"\"}]").is_err());
        // A JSON object is not read as one host named `{"ssh":"a"}`.
        let e = format!("{:#}", parse_hostfile("{\"ssh\":\"a\"}").unwrap_err());
        assert!(e.contains("without \"hosts\""), "{e}");
        let e = format!("{:#}", parse_hostfile("mac1\nmac$(reboot)\n").unwrap_err());
        assert!(e.contains("line 2") && e.contains("not a host name"), "{e}");
    }

    #[test]
    fn huge_slot_counts_do_not_overflow() {
        let h = parse_hostfile("a slots=18446744073709551615\nb slots=18446744073709551615\n")
            .unwrap()
            .hosts;
        assert_eq!(place_ranks(&h, 3).unwrap(), vec![0, 0, 0]);
    }

    #[test]
    fn ranks_fill_slots_in_order() {
        let h = parse_hostfile("a slots=2\nb slots=2\n").unwrap().hosts;
        assert_eq!(place_ranks(&h, 3).unwrap(), vec![0, 0, 1]);
        assert!(place_ranks(&h, 5)
            .unwrap_err()
            .to_string()
            .contains("4 slots"));
    }

    /// Every form MLX 0.32's mlx.distributed_config writes: jaccl (one device per peer),
    /// jaccl-ring (a list per peer, one per cable), ring (addresses on the cables to the
    /// previous host), with envs and unknown keys.
    #[test]
    fn mlx_object_forms_give_each_hosts_cables() {
        let jaccl = parse_hostfile(
            r#"{"backend": "jaccl", "envs": ["MLX_METAL_FAST_SYNCH=1"], "extra": 1,
                "hosts": [
                  {"ssh": "m0", "ips": ["10.0.0.10"], "rdma": [null, "rdma_en3", "rdma_en4"]},
                  {"ssh": "m1", "ips": ["10.0.0.11"], "rdma": ["rdma_en3", null, "rdma_en5"], "note": "x"},
                  {"ssh": "m2", "ips": ["10.0.0.12"], "rdma": ["rdma_en4", "rdma_en5", null]}]}"#,
        )
        .unwrap();
        assert_eq!(jaccl.backend.as_deref(), Some("jaccl"));
        assert_eq!(jaccl.envs, ["MLX_METAL_FAST_SYNCH=1"]);
        assert_eq!(jaccl.notes.len(), 2, "{:?}", jaccl.notes);
        assert_eq!(jaccl.hosts[0].ips, ["10.0.0.10"]);
        assert_eq!(
            jaccl.hosts[0].cables,
            [
                CableHint {
                    peer_host: 1,
                    via: Via::Device("rdma_en3".into())
                },
                CableHint {
                    peer_host: 2,
                    via: Via::Device("rdma_en4".into())
                },
            ]
        );
        let two = parse_hostfile(
            r#"{"backend": "jaccl-ring", "hosts": [
                  {"ssh": "m0", "rdma": [null, ["rdma_en3", "rdma_en4"]]},
                  {"ssh": "m1", "rdma": [["rdma_en5", "rdma_en6"], null]}]}"#,
        )
        .unwrap();
        assert_eq!(two.hosts[1].cables.len(), 2);
        assert_eq!(two.hosts[1].cables[1].via, Via::Device("rdma_en6".into()));
        let ring = parse_hostfile(
            r#"{"backend": "ring", "envs": [], "hosts": [
                  {"ssh": "m0", "ips": ["192.168.0.6"]},
                  {"ssh": "m1", "ips": ["192.168.0.1"]},
                  {"ssh": "m2", "ips": ["192.168.0.2", "192.168.0.9"]}]}"#,
        )
        .unwrap();
        // The addresses are cables to the previous host, not control addresses.
        assert!(ring.hosts.iter().all(|h| h.ips.is_empty()));
        assert_eq!(
            ring.hosts[0].cables,
            [CableHint {
                peer_host: 2,
                via: Via::Address("192.168.0.6".parse().unwrap())
            }]
        );
        assert_eq!(ring.hosts[2].cables.len(), 2);
        assert_eq!(ring.hosts[2].cables[0].peer_host, 1);
    }

    #[test]
    fn bad_cabling_and_other_launchers_forms_are_read_or_named() {
        let e = |t: &str| format!("{:#}", parse_hostfile(t).unwrap_err());
        assert!(e(r#"{"hosts": [{"ssh": "a", "rdma": [["rdma_en3"]]}]}"#)
            .contains("for the host itself"));
        assert!(
            e(r#"{"hosts": [{"ssh": "a", "rdma": [null, 7]}, {"ssh": "b"}]}"#).contains("entry 1")
        );
        assert!(
            e(r#"{"hosts": [{"ssh": "a", "ips": ["not-an-ip"]}]}"#).contains("not an IP address")
        );
        assert!(e(r#"{"envs": ["A B"], "hosts": [{"ssh": "a"}]}"#).contains("KEY=VALUE"));
        // A byte order mark, MPICH's host:N, a bracketed IPv6 host in OpenMPI's form.
        let h = parse_hostfile("\u{feff}[{\"ssh\": \"a\"}]").unwrap();
        assert_eq!(h.hosts[0].name, "a");
        let h = parse_hostfile("node1:4\nnode2\n").unwrap().hosts;
        assert_eq!(
            (h[0].name.as_str(), h[0].slots, h[1].slots),
            ("node1", 4, 1)
        );
        let h = parse_hostfile("[::1] slots=2\n").unwrap().hosts;
        assert_eq!((h[0].name.as_str(), h[0].slots), ("[::1]", 2));
        assert!(e("node1:0\n").contains("positive"));
    }
}
