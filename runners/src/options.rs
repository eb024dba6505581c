//! How a run is placed and connected, common to every suite. The CLI fills this; suites never
//! see flags.

use serde::Serialize;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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
    pub transport: TransportKind,
    /// Address to bind data (and, for local runs, the rendezvous) to.
    pub addr: Option<IpAddr>,
    /// Interface whose IPv4 address each rank binds its data to.
    pub iface: Option<String>,
    /// RDMA device for `--transport verbs` (`rdma_en3`, `mlx5_0`); mapped from `iface` when
    /// not given.
    pub rdma_device: Option<String>,
    /// Parallel TCP connections per pair of ranks.
    pub streams: usize,
    /// SO_SNDBUF/SO_RCVBUF in bytes; None leaves the OS's autotuning on.
    pub sockbuf: Option<usize>,
    /// Longest wait on the network with no progress.
    #[serde(serialize_with = "secs")]
    pub timeout: Duration,
    /// Rendezvous port on rank 0; 0 picks a free one.
    pub port: u16,
    /// Result file; `results/<suite>-<UTC>.json` when not given.
    pub out: Option<PathBuf>,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            nodes: 2,
            hostfile: None,
            rsh: "ssh -o BatchMode=yes -o ConnectTimeout=10".into(),
            exe: None,
            transport: TransportKind::Tcp,
            addr: None,
            iface: None,
            rdma_device: None,
            streams: 1,
            sockbuf: None,
            timeout: Duration::from_secs(30),
            port: 0,
            out: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(RunOptions::default().rdma_device, None);
    }
}
