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

    /// Runs on every rank. Rank 0 returns Some(output); the others return None.
    fn run(config: &Self::Config, ctx: &mut Context) -> Result<Option<SuiteOutput>>;
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
    /// Show progress bars (rank 0 with a terminal on stderr).
    pub progress: bool,
    pub timeout: Duration,
}

impl Context {
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }
    pub fn size(&self) -> usize {
        self.comm.size()
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
