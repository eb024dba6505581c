//! What every part of a run shares about the run itself: its secret, who each rank is and what
//! it tells the others, how it was started and finds rank 0 ([`Bootstrap`]), and the exit
//! codes by which a rank tells the launcher it lost rank 0.
//! At the bottom of the crate, so the launcher, the rendezvous and the transports name these
//! without importing one another.

use anyhow::{anyhow, bail, Result};
use serde::{Deserialize, Serialize};

/// A random per-run secret, handed to each rank by the launcher.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Token(pub [u8; 16]);

/// Never shown, not even in a debug print.
impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    pub fn random() -> Result<Self> {
        let mut t = [0u8; 16];
        getrandom::getrandom(&mut t)
            .map_err(|e| anyhow!("no randomness for the session token: {e}"))?;
        Ok(Token(t))
    }
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
    pub fn from_hex(s: &str) -> Result<Self> {
        let s = s.trim();
        if s.len() != 32 || !s.is_ascii() {
            bail!("malformed session token");
        }
        let mut t = [0u8; 16];
        for (i, b) in t.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
                .map_err(|_| anyhow!("malformed session token"))?;
        }
        Ok(Token(t))
    }
}

/// What each rank tells the others at the rendezvous.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankInfo {
    pub rank: usize,
    /// The OS hostname.
    pub hostname: String,
    /// The name the launcher used (hostfile entry, namespace); "localhost" for local ranks.
    pub label: String,
    /// Where this rank's data listener is; None until rank 0 fills it from the connection.
    pub data_ip: Option<String>,
    pub data_port: u16,
    pub pid: u32,
    /// Same value on ranks that share a kernel (Linux boot_id), so shm can check it.
    pub boot_id: String,
    pub host: tbbench_schema::Host,
    /// `--transport verbs`: this rank's RDMA connection data (queue pair numbers, LID, GID),
    /// hex-encoded; None when its device did not open or another transport runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma: Option<String>,
    /// A run over links (`--over tcp:links`): this rank's addresses and the cables its
    /// hostfile entry names, from which every rank derives the same links.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub links: Option<crate::links::LinkInfo>,
}

/// Who a rank is, for error messages: "rank 2 (mac3)".
#[derive(Debug, Clone)]
pub struct PeerName {
    pub rank: usize,
    pub host: String,
}

impl std::fmt::Display for PeerName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {} ({})", self.rank, self.host)
    }
}

/// Exit codes by which a launched rank says it lost rank 0, which then cannot name itself:
/// its control connection closed, or its heartbeats stopped. The launcher prints the one line.
pub const EXIT_RANK0_LOST: i32 = 86;
pub const EXIT_RANK0_SILENT: i32 = 87;

/// Who this rank is and how it finds rank 0, however it was started: by tbbench's launcher
/// (environment + token on stdin), by hand (environment + TBBENCH_TOKEN), or by mpirun.
pub struct Bootstrap {
    pub rank: usize,
    pub size: usize,
    pub token: Token,
    /// Rank 0's rendezvous address (host:port), for the other ranks.
    pub rdv: Option<String>,
    /// Rank 0's rendezvous listener, when the bootstrap had to bind it first (MPI).
    pub listener: Option<std::net::TcpListener>,
    /// The launcher's name for this rank's host.
    pub label: Option<String>,
    /// The address the launcher chose for this rank (hostfile `ips`, loopback).
    pub addr: Option<String>,
    /// Started by tbbench's own launcher: rank 0 reports its port and the result on stdout.
    pub launched: bool,
    /// Who started the ranks, for the result (`params.launcher`).
    pub launcher: Launcher,
    /// Kept alive for the whole run (the MPI universe, finalized when dropped).
    pub keepalive: Option<Box<dyn std::any::Any>>,
}

/// Who started the ranks, as the result records it (`params.launcher`): `tbbench` (its own
/// launcher), `mpirun`, `slurm` (srun, with the job and step) or `by hand`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Launcher {
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_id: Option<String>,
    /// Under Slurm, how rank 0's offer reached the others: `pmi` or `file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offer_via: Option<String>,
}

impl Launcher {
    pub fn named(kind: &str) -> Launcher {
        Launcher {
            kind: kind.to_string(),
            job_id: None,
            step_id: None,
            offer_via: None,
        }
    }
}
