//! The result file: one JSON document per run, `schema_version` first.
//!
//! This is the contract between a run and everything that reads it later (report, compare):
//! readers never look at a suite's internals, only at these records.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Bumped when a field changes meaning or is removed; adding optional fields does not bump it.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResultFile {
    pub schema_version: u32,
    /// The suite's name: "link", "hpl", ...
    pub suite: String,
    pub tool: Tool,
    /// RFC 3339, UTC.
    pub started_at: String,
    pub finished_at: String,
    /// Every parameter of the run, defaults included, as the suite's config serializes.
    pub params: Value,
    /// Each distinct host that ran a rank.
    pub hosts: Vec<Host>,
    /// Where each rank ran: `ranks[r]` is the hostname of rank r.
    pub ranks: Vec<String>,
    pub network: Network,
    /// The suite's own figures (for link: `latency` and `bandwidth` lists).
    pub results: Value,
    pub verification: Verification,
    /// Reasons not to trust the figures fully (noisy, oversubscribed, unverified).
    pub warnings: Vec<String>,
}

/// A finished run's records, as the suite and its runner know them; [`ResultFile::finished`]
/// adds the bookkeeping every result file shares.
pub struct RunRecord {
    pub suite: String,
    pub params: Value,
    pub hosts: Vec<Host>,
    pub ranks: Vec<String>,
    pub network: Network,
    pub results: Value,
    pub checks: Vec<Check>,
    pub warnings: Vec<String>,
}

impl ResultFile {
    /// The result file of a run that started at `started` and ends now. The one place a
    /// result file is put together (the ranks' driver and `infer --endpoint` both come here):
    /// the schema version, the times, and the verification from the checks.
    pub fn finished(tool: &Tool, started: time::OffsetDateTime, run: RunRecord) -> ResultFile {
        ResultFile {
            schema_version: SCHEMA_VERSION,
            suite: run.suite,
            tool: tool.clone(),
            started_at: crate::write::rfc3339(started),
            finished_at: crate::write::rfc3339(time::OffsetDateTime::now_utc()),
            params: run.params,
            hosts: run.hosts,
            ranks: run.ranks,
            network: run.network,
            results: run.results,
            verification: Verification::from_checks(run.checks),
            warnings: run.warnings,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Tool {
    pub name: String,
    pub version: String,
    /// `git rev-parse HEAD` at build time, "unknown" outside a checkout.
    pub git_commit: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Host {
    pub hostname: String,
    /// "linux", "macos", ...
    pub os: String,
    /// Distribution or product version, e.g. "Debian GNU/Linux 12 (bookworm)", "macOS 26.2".
    pub os_version: String,
    pub kernel: String,
    pub arch: String,
    pub cpu_model: String,
    pub cores_physical: usize,
    pub cores_logical: usize,
    pub memory_total_bytes: u64,
    pub memory_available_bytes: u64,
    /// Linux's transparent huge pages setting ("always", "madvise", "never"): with "never"
    /// the matrix lies in 4 KiB pages and hpl runs slower. None where the OS has no such
    /// setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transparent_hugepages: Option<String>,
    /// The congestion control new TCP connections get by default (Linux's
    /// net.ipv4.tcp_congestion_control: "cubic", "bbr"); a run's own connections are in
    /// `network.congestion`. None where the OS does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_congestion_control: Option<String>,
    /// BLAS library and kernel where a suite uses one (hpl); None where nothing was loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blas: Option<Blas>,
    /// Ranks that ran on this host.
    #[serde(default)]
    pub ranks: Vec<usize>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Blas {
    /// "openblas", "accelerate", "rust-fallback", ...
    pub name: String,
    /// The kernel in use, e.g. openblas_get_corename() ("Haswell"), and the config string.
    pub kernel: String,
    /// Variables that change the kernel choice (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE) or its
    /// threads (OPENBLAS_NUM_THREADS, OPENBLAS_THREAD_TIMEOUT), as set.
    #[serde(default)]
    pub env: Vec<String>,
    /// Where the kernel is not the one OpenBLAS picks on a CPU it knows: what happened and
    /// what tbbench did (it set OPENBLAS_CORETYPE itself after OpenBLAS chose an older
    /// kernel, or hpl times its own product against a kernel the user held back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// What the data travelled over.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Network {
    /// "tcp", "shm", "verbs".
    pub transport: String,
    /// The interface the data used ("lo", "en3", "bridge0"), where one applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    /// ethernet | thunderbolt-ip | thunderbolt-bridge | rdma | loopback | shm | wifi | virtual | unknown
    pub link_kind: String,
    /// Nominal link speed in Gbit/s (10^9) as the OS reports it; None where unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nominal_gbit_per_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Data address of each rank (tcp), in rank order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// Parallel connections per peer (tcp).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams: Option<usize>,
    /// Whether the run chose `streams` (no --streams given): 2 where the connections' congestion
    /// control paces every segment (bbr; 1 in link and doctor), else 1.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub streams_auto: bool,
    /// TCP congestion control of the data connections ("cubic", "bbr"), as the kernel reports
    /// it for them (tcp, where the OS has a per-connection setting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub congestion: Option<String>,
    /// The socket buffer size the data connections set (SO_SNDBUF and SO_RCVBUF, tcp), as the
    /// kernel granted it (Linux caps it at net.core.wmem_max and rmem_max, and turns
    /// autotuning off); None: the OS's autotuning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sockbuf_bytes: Option<u64>,
    /// Whether the run chose `sockbuf_bytes` (no --sockbuf given): fixed buffers on a host
    /// running more ranks than it has cores.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sockbuf_auto: bool,
    /// A short label for tables and charts: "tcp/lo (loopback)".
    pub label: String,
    /// A run over links (`--over tcp:links`): every cable between two ranks, as each end
    /// reports it. Empty for a run over one network.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<Link>,
    /// The shape the links make, and the pairs of ranks with no cable; None for a run over
    /// one network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<Topology>,
}

/// One cable between two ranks' hosts (or, for two ranks on one host, the loopback they share).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Link {
    /// The two ranks, lower first.
    pub ranks: [usize; 2],
    /// Their hosts, as the run names them.
    pub hosts: [String; 2],
    /// Which of the pair's cables this is (0 where the pair has one).
    pub cable: usize,
    /// Each end, in the order of `ranks`.
    pub ends: [LinkEnd; 2],
}

/// One end of a cable, as its host reports it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkEnd {
    pub interface: String,
    pub address: String,
    /// The RDMA device on this interface (`rdma_en3`), where the hostfile or the host names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_device: Option<String>,
    /// ethernet | thunderbolt-ip | loopback | ... (as `network.link_kind`).
    pub link_kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed_gbit_per_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
}

/// What the cables make of the hosts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Topology {
    /// "full-mesh" (every pair of hosts has a cable), "ring" (each host cabled to exactly
    /// two others, in one cycle), "partial" (anything else), "single" (one host).
    pub shape: String,
    /// The hosts in ring order, where the shape is a ring.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ring: Vec<String>,
    /// Pairs of ranks with no cable between them, lower rank first.
    #[serde(default)]
    pub unlinked: Vec<[usize; 2]>,
    /// The backend the hostfile names (MLX's `jaccl`, `jaccl-ring`, `ring`): the cabling it
    /// needs (the doctor holds the cables to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
}

impl Network {
    /// What TCP's figures depend on besides the cable, for headers and tables: "congestion
    /// control bbr, 2 connections per peer (auto: bbr paces each)". None where the run
    /// recorded neither (other transports, older files).
    pub fn tcp_setup(&self) -> Option<String> {
        let mut parts = Vec::new();
        if let Some(cc) = &self.congestion {
            parts.push(format!("congestion control {cc}"));
        }
        if let Some(k) = self.streams {
            let plural = if k == 1 { "" } else { "s" };
            // A collective's run opens two where a host's congestion control paces every
            // segment (link and doctor one); the connections here ran rank 0's, which names
            // that reason only when it paces.
            let why = match self.congestion.as_deref() {
                _ if !self.streams_auto => String::new(),
                Some(cc) if k > 1 && cc.starts_with("bbr") => format!(" (auto: {cc} paces each)"),
                _ => " (auto)".into(),
            };
            parts.push(format!("{k} connection{plural} per peer{why}"));
        }
        if let Some(b) = self.sockbuf_bytes {
            let size = match b {
                _ if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
                _ if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
                _ => format!("{b} B"),
            };
            let why = if self.sockbuf_auto {
                " (auto: more ranks than cores)"
            } else {
                ""
            };
            parts.push(format!("socket buffers {size}{why}"));
        }
        (!parts.is_empty()).then(|| parts.join(", "))
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Verification {
    /// True when every check passed.
    pub passed: bool,
    pub checks: Vec<Check>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    pub passed: bool,
    pub detail: String,
}

impl Verification {
    /// The names of the checks that failed.
    pub fn failed(&self) -> Vec<&str> {
        self.checks
            .iter()
            .filter(|c| !c.passed)
            .map(|c| c.name.as_str())
            .collect()
    }

    pub fn from_checks(checks: Vec<Check>) -> Self {
        Verification {
            passed: !checks.is_empty() && checks.iter().all(|c| c.passed),
            checks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Network;

    fn net(cc: Option<&str>, streams: Option<usize>, auto: bool) -> Network {
        Network {
            congestion: cc.map(String::from),
            streams,
            streams_auto: auto,
            ..Default::default()
        }
    }

    /// The reason is given only where the connections named ran a pacing congestion control;
    /// with hosts of different defaults rank 0's may not.
    #[test]
    fn tcp_setup_names_what_tcp_ran_and_why_only_when_it_holds() {
        let says = |n: Network| n.tcp_setup();
        assert_eq!(
            says(net(Some("bbr"), Some(2), true)).as_deref(),
            Some("congestion control bbr, 2 connections per peer (auto: bbr paces each)")
        );
        assert_eq!(
            says(net(Some("cubic"), Some(2), true)).as_deref(),
            Some("congestion control cubic, 2 connections per peer (auto)")
        );
        assert_eq!(
            says(net(Some("cubic"), Some(1), true)).as_deref(),
            Some("congestion control cubic, 1 connection per peer (auto)")
        );
        assert_eq!(
            says(net(Some("bbr"), Some(3), false)).as_deref(),
            Some("congestion control bbr, 3 connections per peer")
        );
        // macOS records no congestion control; the connections are still named.
        assert_eq!(
            says(net(None, Some(4), false)).as_deref(),
            Some("4 connections per peer")
        );
        assert_eq!(says(net(None, None, false)), None);
        // Fixed socket buffers, chosen by the run or asked for.
        let fixed = |bytes, auto| Network {
            sockbuf_bytes: Some(bytes),
            sockbuf_auto: auto,
            ..net(Some("bbr"), Some(2), true)
        };
        assert_eq!(
            says(fixed(512 << 10, true)).as_deref(),
            Some("congestion control bbr, 2 connections per peer (auto: bbr paces each), socket buffers 512 KiB (auto: more ranks than cores)")
        );
        assert_eq!(
            says(fixed(4 << 20, false)).as_deref(),
            Some("congestion control bbr, 2 connections per peer (auto: bbr paces each), socket buffers 4 MiB")
        );
        assert_eq!(
            says(fixed(1000, false)).as_deref(),
            Some("congestion control bbr, 2 connections per peer (auto: bbr paces each), socket buffers 1000 B")
        );
    }
}
