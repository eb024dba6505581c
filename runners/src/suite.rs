//! The one seam between the runner and a suite. A suite names itself, brings its config, and
//! runs on every rank; rank 0 returns what goes into the result file. Everything else (launch,
//! rendezvous, transport, host records, writing the file) is the driver's.

use crate::comm::Comm;
use anyhow::Result;
use serde::Serialize;
use std::time::Duration;
use tbbench_schema::{Check, Host, Network};

pub trait Suite {
    /// Used for the result file's `suite` field and its default name.
    const NAME: &'static str;
    type Config: Serialize;
    /// Connections per pair of ranks where `--streams` is not given and the connections'
    /// congestion control paces every segment (bbr); one elsewhere. Two, where ranks
    /// exchange: the connections wait for their pacing timers at once.
    const STREAMS_WHEN_PACED: usize = crate::options::AUTO_STREAMS_PACED;

    /// Runs on every rank. Rank 0 returns Some(output); the others return None.
    fn run(config: &Self::Config, ctx: &mut Context) -> Result<Option<SuiteOutput>>;

    /// Whether a run over links (`--over tcp:links`) needs a cable between every pair of
    /// ranks: collectives, hpl and the decode exchange with any rank. A suite that measures
    /// only the pairs it finds linked (`network.links`) says no. Where one is needed and
    /// missing, the run ends before it starts, naming the pairs.
    fn needs_every_pair(_config: &Self::Config) -> bool {
        true
    }
}

/// What a suite sees of the run.
pub struct Context {
    pub comm: Comm,
    /// The network the data travels on (transport, interface, link kind, speed, MTU).
    pub network: Network,
    /// One record per distinct host, each listing its ranks.
    pub hosts: Vec<Host>,
    /// `rank_hosts[r]`: the hostname rank r runs on.
    pub rank_hosts: Vec<String>,
    /// `rank_names[r]`: the host rank r runs on as the run names it (the hostfile's name,
    /// else the hostname): what `network.links` and `network.topology` call hosts, and what
    /// tells hosts apart where they share a hostname (network namespaces).
    pub rank_names: Vec<String>,
    /// Show progress bars (rank 0 with a terminal on stderr).
    pub progress: bool,
    pub timeout: Duration,
    /// The remote shell hostfile ranks were started with (`--rsh`): what a peer's own
    /// launcher (mpirun's plm_rsh_agent) is given to reach the same hosts the same way.
    pub rsh: String,
}

impl Context {
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }
    pub fn size(&self) -> usize {
        self.comm.size()
    }
    /// How many ranks run on this rank's host.
    pub fn ranks_on_my_host(&self) -> usize {
        self.my_host().map_or(1, |h| h.ranks.len().max(1))
    }
    /// Whether this rank is the lowest of its host's: the one that reads what is the host's
    /// alone (its energy counters, its other processes).
    pub fn first_on_my_host(&self) -> bool {
        let me = self.rank();
        self.my_host()
            .and_then(|h| h.ranks.iter().min().copied())
            .is_none_or(|r| r == me)
    }
    /// This rank's host record.
    pub fn my_host(&self) -> Option<&Host> {
        let me = &self.rank_hosts[self.rank()];
        self.hosts.iter().find(|h| &h.hostname == me)
    }
    /// Threads a rank uses when the user did not say: its host's cores over the ranks on that
    /// host (not over all ranks of the run, which may sit on other hosts).
    pub fn threads_per_rank(&self) -> usize {
        let cores = self
            .my_host()
            .map(|h| h.cores_logical)
            .filter(|c| *c > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        (cores / self.ranks_on_my_host()).max(1)
    }
    /// Where this rank's host runs more ranks than it has cores, binds this rank to one CPU
    /// (see [`crate::pinning`]) and says so for the result's warnings; rank 0's line states
    /// the rule every rank followed. For suites whose ranks each run one thread: a rank bound
    /// to one CPU keeps its threads there.
    pub fn pin_when_oversubscribed(&self) -> Option<String> {
        let host = self.my_host()?;
        let local = host.ranks.iter().position(|&r| r == self.rank())?;
        let cpu =
            crate::pinning::pin_when_oversubscribed(local, host.ranks.len(), host.cores_logical)?;
        Some(format!(
            "ranks bound one CPU each, dealt round-robin over {}'s {} CPUs (rank {} on CPU {cpu}), so that which ranks share a core is the same in every launch",
            host.hostname,
            host.cores_logical,
            self.rank()
        ))
    }
    /// True when more ranks run on some host than it has cores: figures then measure the
    /// scheduler as much as the work.
    pub fn oversubscribed(&self) -> Option<String> {
        self.hosts
            .iter()
            .find(|h| h.cores_logical > 0 && h.ranks.len() > h.cores_logical)
            .map(|h| {
                format!(
                    "oversubscribed: {} ranks on {} with {} cores",
                    h.ranks.len(),
                    h.hostname,
                    h.cores_logical
                )
            })
    }
}

/// Rank 0's contribution to the result file.
pub struct SuiteOutput {
    pub results: serde_json::Value,
    pub checks: Vec<Check>,
    pub warnings: Vec<String>,
}
