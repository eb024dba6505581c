//! How a run is placed and connected, common to every suite. The CLI fills this; suites never
//! see flags.

use crate::netinfo::mask;
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

/// Connections per peer when the user gives no `--streams` and the connections run a
/// congestion control that paces every segment (`transport::tcp::PACING_CONGESTION`): the
/// default of [`crate::suite::Suite::STREAMS_WHEN_PACED`].
pub const AUTO_STREAMS_PACED: usize = 2;

/// Ranks a run starts when `--nodes` is not given (local ranks over loopback).
pub const DEFAULT_NODES: usize = 2;
/// How hostfile hosts are reached when `--rsh` is not given: ssh that never prompts and
/// gives up on a host that does not answer.
pub const DEFAULT_RSH: &str = "ssh -o BatchMode=yes -o ConnectTimeout=10";
/// How long a rank waits on a silent peer when `--timeout` is not given.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The network a launched rank's data takes, as the launcher built it ([`DataNetwork`], JSON).
pub const ENV_DATA_NETWORK: &str = "TBBENCH_DATA_NETWORK";

/// Names the verbs library, as `--verbs-lib` does; the launcher hands it on to every rank.
pub const ENV_VERBS_LIB: &str = "TBBENCH_VERBS_LIB";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    Tcp,
    Shm,
    Verbs,
}

impl TransportKind {
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        match s {
            "tcp" => Ok(TransportKind::Tcp),
            "shm" => Ok(TransportKind::Shm),
            "verbs" | "rdma" => Ok(TransportKind::Verbs),
            other => anyhow::bail!("unknown transport '{other}' (use tcp, shm or verbs)"),
        }
    }
    pub fn as_str(&self) -> &'static str {
        match self {
            TransportKind::Tcp => "tcp",
            TransportKind::Shm => "shm",
            TransportKind::Verbs => "verbs",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct RunOptions {
    /// Number of ranks.
    pub nodes: usize,
    pub hostfile: Option<PathBuf>,
    /// Remote shell used to start ranks on hostfile hosts (OpenMPI's plm_rsh_agent).
    pub rsh: String,
    /// The tbbench binary on remote hosts; the same path as this one when not given.
    pub exe: Option<PathBuf>,
    /// The network this run's data takes (recorded flat in `params`, as the flags were).
    #[serde(flatten)]
    pub net: DataNetwork,
    /// The verbs library to load (`--verbs-lib`, `TBBENCH_VERBS_LIB`); the system's when None.
    pub verbs_lib: Option<PathBuf>,
    /// Networks to run the suite over, one after another (`--over`); empty: just once.
    pub over: Vec<NetSpec>,
    /// Which of `over` this run is (set by the launcher for its ranks).
    pub network_index: Option<usize>,
    /// Parallel TCP connections per pair of ranks; None: chosen when the ranks meet
    /// (`transport::tcp::auto_streams`).
    pub streams: Option<usize>,
    /// What a run without `--streams` opens where the congestion control paces every segment:
    /// the suite's [`crate::suite::Suite::STREAMS_WHEN_PACED`], set by the driver.
    #[serde(skip)]
    pub streams_when_paced: usize,
    /// SO_SNDBUF/SO_RCVBUF in bytes; None leaves the OS's autotuning on.
    pub sockbuf: Option<usize>,
    /// TCP congestion control for the data connections; None keeps the system's default.
    pub congestion: Option<String>,
    /// Longest wait on the network with no progress.
    #[serde(serialize_with = "secs")]
    pub timeout: Duration,
    /// Rendezvous port on rank 0; 0 picks a free one.
    pub port: u16,
    /// Result file; `results/<suite>-<UTC>.json` when not given.
    pub out: Option<PathBuf>,
    /// `out` is a name the launcher chose (inside an `--over` folder): written under the
    /// first free name, never over another run's file.
    #[serde(skip)]
    pub out_generated: bool,
    /// Local ranks far beyond the host's cores were asked for on purpose.
    pub oversubscribe: bool,
    /// `--slurm`: write the run's sbatch script here ("-": print it) instead of running.
    #[serde(skip)]
    pub slurm_script: Option<PathBuf>,
}

/// The network a run's data takes: built once, by the launcher, from the flags (`--transport`,
/// `--iface`, `--addr`, `--rdma-device`) or one entry of `--over` ([`DataNetwork::from_spec`])
/// and the hostfile ([`DataNetwork::with_hostfile_devices`]), and handed as it is to every rank
/// ([`ENV_DATA_NETWORK`]) and its transport. Control traffic (ssh, rendezvous, heartbeats) goes
/// where the hostfile puts the hosts, whatever this says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataNetwork {
    pub transport: TransportKind,
    /// Address to bind data (and, for local runs, the rendezvous) to.
    pub addr: Option<IpAddr>,
    /// Interface whose IPv4 address each rank binds its data to.
    pub iface: Option<String>,
    /// RDMA device for `--transport verbs` (`rdma_en3`, `mlx5_0`); mapped from `iface` when
    /// not given.
    pub rdma_device: Option<String>,
    /// An IPv4 subnet each rank binds its data to (its own address inside it): one spelling
    /// of a network that works on every host, whatever its interfaces are called.
    #[serde(
        default,
        serialize_with = "subnet_str",
        deserialize_with = "subnet_from_str"
    )]
    pub subnet: Option<(Ipv4Addr, u8)>,
    /// Each pair of ranks over its own cable(s) (`--over tcp:links`, `verbs:links`), not one
    /// network for all.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub links: bool,
}

impl Default for DataNetwork {
    fn default() -> Self {
        DataNetwork {
            transport: TransportKind::Tcp,
            addr: None,
            iface: None,
            rdma_device: None,
            subnet: None,
            links: false,
        }
    }
}

impl DataNetwork {
    /// The network one entry of `--over` names.
    pub fn from_spec(spec: &NetSpec) -> DataNetwork {
        let mut n = DataNetwork {
            transport: spec.transport,
            ..DataNetwork::default()
        };
        match &spec.target {
            NetTarget::Default => {}
            NetTarget::Interface(i) => n.iface = Some(i.clone()),
            NetTarget::Address(a) => n.addr = Some(*a),
            NetTarget::Subnet(net, bits) => n.subnet = Some((*net, *bits)),
            NetTarget::Device(d) => n.rdma_device = Some(d.clone()),
            NetTarget::Links => n.links = true,
        }
        n
    }

    /// Verbs with no device named, where the hostfile names each host's devices per peer (MLX's
    /// jaccl `rdma`): over the cables, each peer on its cable's device, as jaccl runs.
    pub fn with_hostfile_devices(mut self, names_devices: bool) -> DataNetwork {
        if self.transport == TransportKind::Verbs
            && self.rdma_device.is_none()
            && self.iface.is_none()
            && self.addr.is_none()
            && self.subnet.is_none()
            && names_devices
        {
            self.links = true;
        }
        self
    }

    /// As `--over` spells it: "tcp:en0", "verbs:rdma_en3", "tcp:links", "shm".
    pub fn spec(&self) -> String {
        let target = if self.links {
            Some("links".to_string())
        } else {
            self.iface
                .clone()
                .or_else(|| self.addr.map(|a| a.to_string()))
                .or_else(|| self.subnet.map(|(n, b)| format!("{n}/{b}")))
                .or_else(|| self.rdma_device.clone())
        };
        match target {
            Some(t) => format!("{}:{t}", self.transport.as_str()),
            None => self.transport.as_str().to_string(),
        }
    }
}

fn subnet_from_str<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<(Ipv4Addr, u8)>, D::Error> {
    let Some(s) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    let bad = || serde::de::Error::custom(format!("'{s}' is not an IPv4 subnet"));
    let (ip, bits) = s.split_once('/').ok_or_else(bad)?;
    Ok(Some((
        ip.parse().map_err(|_| bad())?,
        bits.parse().ok().filter(|b| *b <= 32).ok_or_else(bad)?,
    )))
}

fn subnet_str<S: serde::Serializer>(v: &Option<(Ipv4Addr, u8)>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some((ip, bits)) => s.serialize_str(&format!("{ip}/{bits}")),
        None => s.serialize_none(),
    }
}

/// One network of `--over`: a transport and where its data goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NetSpec {
    /// As the user wrote it: "tcp:en0", "verbs:rdma_en3", "shm".
    pub spec: String,
    pub transport: TransportKind,
    pub target: NetTarget,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NetTarget {
    /// The transport's default (loopback for local tcp runs).
    Default,
    Interface(String),
    Address(IpAddr),
    Subnet(Ipv4Addr, u8),
    /// An RDMA device (`verbs:rdma_en3`, `verbs:mlx5_0`).
    Device(String),
    /// Each pair of ranks over its own cable(s) (`tcp:links`, `verbs:links`: each peer on its
    /// cable's RDMA device), from the hostfile or found by subnet (`crate::links`).
    Links,
}

impl NetSpec {
    /// `TRANSPORT[:WHERE]`, WHERE an interface, an address, an IPv4 subnet (a.b.c.d/n), or for
    /// verbs an RDMA device.
    pub fn parse(s: &str) -> anyhow::Result<NetSpec> {
        let (t, target) = match s.split_once(':') {
            Some((t, w)) => (t, Some(w)),
            None => (s, None),
        };
        let transport =
            TransportKind::parse(t).map_err(|e| anyhow::anyhow!("network '{s}': {e}"))?;
        let target = match target {
            None => NetTarget::Default,
            Some("") => anyhow::bail!("network '{s}': nothing after ':'"),
            Some(w) => {
                if w == "links" {
                    if transport == TransportKind::Shm {
                        anyhow::bail!("network '{s}': shm runs between ranks of one host, over no cable (links per pair: tcp:links or verbs:links)");
                    }
                    NetTarget::Links
                } else if let Some((ip, bits)) = w.split_once('/') {
                    let ip: Ipv4Addr = ip.parse().map_err(|_| {
                        anyhow::anyhow!("network '{s}': '{ip}' is not an IPv4 address")
                    })?;
                    let bits: u8 = bits.parse().ok().filter(|b| *b <= 32).ok_or_else(|| {
                        anyhow::anyhow!("network '{s}': '/{bits}' is not a prefix length (0-32)")
                    })?;
                    NetTarget::Subnet(mask(ip, bits), bits)
                } else if let Ok(ip) = w.parse::<IpAddr>() {
                    NetTarget::Address(ip)
                } else if transport == TransportKind::Verbs {
                    NetTarget::Device(w.to_string())
                } else {
                    NetTarget::Interface(w.to_string())
                }
            }
        };
        if transport == TransportKind::Shm && target != NetTarget::Default {
            anyhow::bail!("network '{s}': shm takes no interface or address (write 'shm')");
        }
        Ok(NetSpec {
            spec: s.to_string(),
            transport,
            target,
        })
    }

    /// A piece of a file name: "tcp-en0", "verbs-rdma_en3", "tcp-10.71.0.0-24".
    pub fn slug(&self) -> String {
        self.spec
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                    c
                } else {
                    '-'
                }
            })
            .collect()
    }
}

/// `--over a,b,c`: the networks in order; each at most once.
pub fn parse_over(s: &str) -> anyhow::Result<Vec<NetSpec>> {
    let specs = s
        .split(',')
        .map(|p| p.trim())
        .filter(|p| !p.is_empty())
        .map(NetSpec::parse)
        .collect::<anyhow::Result<Vec<_>>>()?;
    if specs.is_empty() {
        anyhow::bail!("--over names no network (e.g. --over tcp:eth0,tcp:en3,verbs:rdma_en3)");
    }
    for (i, a) in specs.iter().enumerate() {
        if specs[..i].iter().any(|b| b.spec == a.spec) {
            anyhow::bail!("--over names '{}' twice", a.spec);
        }
    }
    Ok(specs)
}

impl RunOptions {
    /// The TCP-only flags given to a run with no TCP network, as one line; None when they fit.
    pub fn tcp_flags_unused(&self) -> Option<String> {
        let kinds: Vec<TransportKind> = if self.over.is_empty() {
            vec![self.net.transport]
        } else {
            self.over.iter().map(|n| n.transport).collect()
        };
        if kinds.contains(&TransportKind::Tcp) {
            return None;
        }
        let given: Vec<&str> = [
            (self.streams.is_some(), "--streams"),
            (self.sockbuf.is_some(), "--sockbuf"),
            (self.congestion.is_some(), "--congestion"),
        ]
        .into_iter()
        .filter_map(|(set, flag)| set.then_some(flag))
        .collect();
        if given.is_empty() {
            return None;
        }
        let mut used: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
        used.dedup();
        let (last, rest) = given.split_last()?;
        let flags = match rest {
            [] => last.to_string(),
            _ => format!("{} and {last}", rest.join(", ")),
        };
        Some(format!(
            "{flags} appl{} to TCP connections, and this run has none (it uses {})",
            if rest.is_empty() { "ies" } else { "y" },
            used.join(", ")
        ))
    }

    /// These options on network `index` of `--over`: its network replaces the one the
    /// single-network flags name.
    pub fn on_network(&self, index: usize) -> RunOptions {
        RunOptions {
            net: DataNetwork::from_spec(&self.over[index]),
            network_index: Some(index),
            ..self.clone()
        }
    }
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            nodes: DEFAULT_NODES,
            hostfile: None,
            rsh: DEFAULT_RSH.into(),
            exe: None,
            net: DataNetwork::default(),
            over: Vec::new(),
            network_index: None,
            verbs_lib: None,
            streams: None,
            streams_when_paced: AUTO_STREAMS_PACED,
            sockbuf: None,
            congestion: None,
            timeout: DEFAULT_TIMEOUT,
            port: 0,
            out: None,
            out_generated: false,
            oversubscribe: false,
            slurm_script: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netinfo::in_subnet;

    #[test]
    fn transport_names_parse_including_both_rdma_spellings() {
        assert_eq!(TransportKind::parse("tcp").unwrap(), TransportKind::Tcp);
        assert_eq!(TransportKind::parse("shm").unwrap(), TransportKind::Shm);
        assert_eq!(TransportKind::parse("verbs").unwrap(), TransportKind::Verbs);
        assert_eq!(TransportKind::parse("rdma").unwrap(), TransportKind::Verbs);
        assert_eq!(TransportKind::Verbs.as_str(), "verbs");
        let e = TransportKind::parse("ib").unwrap_err().to_string();
        assert!(
            e.contains("unknown transport 'ib'") && e.contains("verbs"),
            "{e}"
        );
        assert_eq!(RunOptions::default().net.rdma_device, None);
    }

    #[test]
    fn network_specs_name_transport_and_target() {
        let n = |s: &str| NetSpec::parse(s).unwrap().target;
        assert_eq!(n("tcp"), NetTarget::Default);
        assert_eq!(n("tcp:en0"), NetTarget::Interface("en0".into()));
        assert_eq!(
            n("tcp:10.0.0.2"),
            NetTarget::Address("10.0.0.2".parse().unwrap())
        );
        // The subnet is normalised to its network address.
        assert_eq!(
            n("tcp:10.71.0.9/24"),
            NetTarget::Subnet(Ipv4Addr::new(10, 71, 0, 0), 24)
        );
        assert_eq!(n("verbs:rdma_en3"), NetTarget::Device("rdma_en3".into()));
        assert_eq!(
            NetSpec::parse("verbs:rdma_en3").unwrap().slug(),
            "verbs-rdma_en3"
        );
        for (bad, why) in [
            ("udp:en0", "unknown transport 'udp'"),
            ("tcp:", "nothing after"),
            ("tcp:10.0.0.0/33", "prefix length"),
            ("tcp:10.0.0/8", "not an IPv4 address"),
            ("shm:lo", "shm takes no"),
        ] {
            let e = NetSpec::parse(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
        assert!(parse_over("tcp:a,tcp:a")
            .unwrap_err()
            .to_string()
            .contains("twice"));
        assert!(parse_over(" , ").is_err());
        assert_eq!(parse_over("tcp:lo, shm").unwrap().len(), 2);
    }

    #[test]
    fn the_data_network_travels_to_the_ranks_whole_and_spells_as_over_does() {
        for spec in [
            "tcp:en0",
            "tcp:10.72.0.0/24",
            "tcp:192.168.1.5",
            "verbs:rdma_en3",
            "tcp:links",
            "shm",
        ] {
            let net = DataNetwork::from_spec(&NetSpec::parse(spec).unwrap());
            assert_eq!(net.spec(), spec);
            let json = serde_json::to_string(&net).unwrap();
            let back: DataNetwork = serde_json::from_str(&json).unwrap();
            assert_eq!(back, net, "{json}");
        }
        assert!(serde_json::from_str::<DataNetwork>(
            r#"{"transport":"tcp","addr":null,"iface":null,"rdma_device":null,"subnet":"10.0.0.0/33"}"#
        )
        .is_err());
        // Verbs with nothing named goes over the cables where the hostfile names devices per
        // peer; a device or interface the user named keeps its single network.
        let verbs = DataNetwork::from_spec(&NetSpec::parse("verbs").unwrap());
        assert!(verbs.clone().with_hostfile_devices(true).links);
        assert!(!verbs.clone().with_hostfile_devices(false).links);
        for kept in ["verbs:rdma_en3", "verbs:10.0.0.0/24", "verbs:10.0.0.5"] {
            let named = DataNetwork::from_spec(&NetSpec::parse(kept).unwrap());
            assert!(!named.with_hostfile_devices(true).links, "{kept}");
        }
        let tcp = DataNetwork::from_spec(&NetSpec::parse("tcp").unwrap());
        assert!(!tcp.with_hostfile_devices(true).links);
    }

    #[test]
    fn each_network_replaces_the_single_network_flags() {
        let o = RunOptions {
            net: DataNetwork {
                iface: Some("eth0".into()),
                rdma_device: Some("mlx5_0".into()),
                ..Default::default()
            },
            over: parse_over("tcp:10.72.0.0/24,verbs:rdma_en3,shm").unwrap(),
            ..Default::default()
        };
        let a = o.on_network(0);
        assert_eq!(
            (a.net.transport, a.net.iface.clone(), a.net.subnet),
            (
                TransportKind::Tcp,
                None,
                Some((Ipv4Addr::new(10, 72, 0, 0), 24))
            )
        );
        let b = o.on_network(1);
        assert_eq!(
            (b.net.transport, b.net.rdma_device.as_deref()),
            (TransportKind::Verbs, Some("rdma_en3"))
        );
        let c = o.on_network(2);
        assert_eq!(
            (c.net.transport, c.network_index),
            (TransportKind::Shm, Some(2))
        );
        assert!(in_subnet(
            Ipv4Addr::new(10, 72, 0, 2),
            (Ipv4Addr::new(10, 72, 0, 0), 24)
        ));
        assert!(!in_subnet(
            Ipv4Addr::new(10, 71, 0, 2),
            (Ipv4Addr::new(10, 72, 0, 0), 24)
        ));
        assert!(in_subnet(
            Ipv4Addr::new(1, 2, 3, 4),
            (Ipv4Addr::new(0, 0, 0, 0), 0)
        ));
    }
}
