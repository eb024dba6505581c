//! Hostfiles, in the two forms cluster owners already have: OpenMPI's (`host slots=N`, one
//! per line, `#` comments) and mlx.launch's JSON list (`[{"ssh": "host", "ips": ["10.0.0.1"]}]`).

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::Path;

/// One host: the name the remote shell reaches it by, its data addresses, and its slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostEntry {
    /// What `ssh` (or `--rsh`) is given: a hostname, `user@host`, or a namespace name.
    pub name: String,
    /// Addresses other ranks use to reach this host, in the file's order; empty means "the name".
    pub ips: Vec<String>,
    /// How many ranks this host takes.
    pub slots: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MlxHost {
    ssh: String,
    #[serde(default)]
    ips: Vec<String>,
    #[serde(default)]
    slots: Option<usize>,
}

pub fn read_hostfile(path: &Path) -> Result<Vec<HostEntry>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read hostfile {}", path.display()))?;
    parse_hostfile(&text).with_context(|| format!("bad hostfile {}", path.display()))
}

/// Parses either format, chosen by the first non-blank character (`[` is JSON).
pub fn parse_hostfile(text: &str) -> Result<Vec<HostEntry>> {
    let first = text.trim_start().chars().next();
    let hosts = if first == Some('[') {
        parse_mlx_json(text)?
    } else if first == Some('{') {
        bail!(
            "a JSON object, but mlx.launch's hostfile is a JSON list: [{{\"ssh\": \"mac1\"}}, ...]"
        );
    } else {
        parse_openmpi(text)?
    };
    if hosts.is_empty() {
        bail!("no hosts listed");
    }
    Ok(hosts)
}

fn parse_mlx_json(text: &str) -> Result<Vec<HostEntry>> {
    let hosts: Vec<MlxHost> = serde_json::from_str(text)
        .map_err(|e| anyhow::anyhow!("not a valid mlx.launch host list: {e}"))?;
    hosts
        .into_iter()
        .enumerate()
        .map(|(i, h)| {
            if h.ssh.trim().is_empty() {
                bail!("entry {} has an empty \"ssh\" name", i + 1);
            }
            check_host_name(&h.ssh).with_context(|| format!("entry {}", i + 1))?;
            let slots = h.slots.unwrap_or(1);
            if slots == 0 {
                bail!("entry {} ({}) has slots 0", i + 1, h.ssh);
            }
            Ok(HostEntry {
                name: h.ssh,
                ips: h.ips,
                slots,
            })
        })
        .collect()
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
        let name = words.next().unwrap_or_default().to_string();
        check_host_name(&name).with_context(|| format!("line {}", lineno + 1))?;
        let mut slots = 1;
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
        .unwrap();
        assert_eq!(h.len(), 3);
        assert_eq!(
            h[0],
            HostEntry {
                name: "mac1".into(),
                ips: vec![],
                slots: 2
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
        .unwrap();
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
        assert!(e.contains("mlx.launch"), "{e}");
        assert!(parse_hostfile("# nothing\n\n").is_err());
        assert!(parse_hostfile("[{\"ssh\": \"\"}]").is_err());
        // A JSON object is not read as one host named `{"ssh":"a"}`.
        let e = format!("{:#}", parse_hostfile("{\"ssh\":\"a\"}").unwrap_err());
        assert!(e.contains("JSON list"), "{e}");
        let e = format!("{:#}", parse_hostfile("mac1\nmac$(reboot)\n").unwrap_err());
        assert!(e.contains("line 2") && e.contains("not a host name"), "{e}");
    }

    #[test]
    fn huge_slot_counts_do_not_overflow() {
        let h =
            parse_hostfile("a slots=18446744073709551615\nb slots=18446744073709551615\n").unwrap();
        assert_eq!(place_ranks(&h, 3).unwrap(), vec![0, 0, 0]);
    }

    #[test]
    fn ranks_fill_slots_in_order() {
        let h = parse_hostfile("a slots=2\nb slots=2\n").unwrap();
        assert_eq!(place_ranks(&h, 3).unwrap(), vec![0, 0, 1]);
        assert!(place_ranks(&h, 5)
            .unwrap_err()
            .to_string()
            .contains("4 slots"));
    }
}
