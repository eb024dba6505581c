//! The flags every suite that runs on ranks shares (where ranks run and how they connect), and
//! the one record a suite registers itself with. A suite's own flags live in its crate and
//! flatten these in; the suite's code past its config never sees clap.

use crate::options::{NetSpec, RunOptions, TransportKind};
use crate::units;
use clap::Args;
use std::net::IpAddr;
use std::path::PathBuf;

/// Where ranks run and how they connect; the same for every suite.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Number of ranks (local processes unless --hostfile is given).
    #[arg(long, default_value_t = crate::options::DEFAULT_NODES)]
    pub nodes: usize,
    /// OpenMPI-style (`host slots=N`) or mlx.launch JSON hostfile; ranks start over --rsh.
    #[arg(long)]
    pub hostfile: Option<PathBuf>,
    /// Remote shell for hostfile hosts, as OpenMPI's plm_rsh_agent (e.g. 'ip netns exec').
    #[arg(long, default_value = crate::options::DEFAULT_RSH)]
    pub rsh: String,
    /// Path of tbbench on the remote hosts (default: the same path as this binary).
    #[arg(long)]
    pub exe: Option<PathBuf>,
    /// How ranks move data: tcp, shm (ranks on one host), or verbs (RDMA).
    #[arg(long, short = 't', default_value = "tcp", value_parser = parse_transport)]
    pub transport: TransportKind,
    /// IP address to bind data (and the local rendezvous) to.
    #[arg(long)]
    pub addr: Option<IpAddr>,
    /// Network interface each rank binds its data to (its IPv4 address).
    #[arg(long, value_parser = non_empty_name)]
    pub iface: Option<String>,
    /// RDMA device for --transport verbs (rdma_en3, mlx5_0); mapped from --iface when not given.
    #[arg(long, value_name = "NAME", value_parser = non_empty_name)]
    pub rdma_device: Option<String>,
    /// The verbs library to load instead of the system's (libibverbs.so.1, librdma.dylib),
    /// e.g. the software device target/release/libtbbench_softrdma.so; also TBBENCH_VERBS_LIB.
    #[arg(long, value_name = "PATH")]
    pub verbs_lib: Option<PathBuf>,
    /// Run once per network and put them side by side: TRANSPORT[:WHERE],... where WHERE is an
    /// interface, an address, an IPv4 subnet (a.b.c.d/n, each host its own address in it) or
    /// an RDMA device (tcp:eth0,tcp:en3,verbs:rdma_en3). With it, --out names a folder.
    #[arg(long, value_parser = parse_over, conflicts_with_all = ["iface", "addr", "rdma_device"])]
    pub over: Option<Networks>,
    /// Parallel TCP connections per pair of ranks (large messages are striped over them, as
    /// jaccl-ring stripes over several cables); default 1, or 2 where the connections run a
    /// congestion control that paces every segment (bbr), so two pacers run at once, with
    /// broadcast and reduce sending each message on one (link and doctor: 1, as iperf3
    /// measures).
    #[arg(long, visible_alias = "conns", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub streams: Option<u16>,
    /// TCP socket buffer size (e.g. 4MiB); default leaves the OS's autotuning on, except on
    /// a host running more ranks than it has cores (512KiB there); 0 keeps autotuning.
    #[arg(long, value_parser = parse_sockbuf)]
    pub sockbuf: Option<u64>,
    /// TCP congestion control for the data connections (cubic, bbr, reno; Linux), as iperf3's
    /// -C; default: the system's (the result records which ran).
    #[arg(long, value_name = "ALGO", value_parser = parse_congestion)]
    pub congestion: Option<String>,
    /// Longest wait on the network with no progress (e.g. 30s, 2m; default 30s, and 60s for
    /// infer --endpoint, where a server may think long before its first byte).
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<std::time::Duration>,
    /// Rendezvous port on rank 0 (default: any free port).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Result file (default: results/<suite>-<UTC time>.json).
    #[arg(long, short = 'o')]
    pub out: Option<PathBuf>,
    /// Start more local ranks than 4 a core (they then share cores, and figures say so).
    #[arg(long)]
    pub oversubscribe: bool,
    /// Write an sbatch script for this run (every --nodes rank an srun task) to FILE, or
    /// print it; nothing runs.
    #[arg(long, value_name = "FILE", num_args = 0..=1, require_equals = true,
          default_missing_value = "-", conflicts_with_all = ["hostfile", "exe"])]
    pub slurm: Option<PathBuf>,
}

/// `--over`'s value: one flag value that is a list (clap would otherwise take a Vec as repeated
/// flags).
#[derive(Debug, Clone)]
pub struct Networks(pub Vec<NetSpec>);

// clap wants one parser per flag, returning the value whole; these keep the one-line errors
// from the units module.
pub fn parse_size(s: &str) -> Result<u64, String> {
    units::parse_size(s).map_err(|e| e.to_string())
}
/// A socket buffer size, or 0 (in any unit): keep the OS's autotuning.
fn parse_sockbuf(s: &str) -> Result<u64, String> {
    let number = s.trim().trim_end_matches(|c: char| c.is_ascii_alphabetic());
    if number.contains('0') && number.trim().chars().all(|c| c == '0' || c == '.') {
        return Ok(0);
    }
    parse_size(s)
}
pub fn parse_size_list(s: &str) -> Result<Vec<u64>, String> {
    units::parse_size_list(s).map_err(|e| e.to_string())
}
pub fn parse_rate(s: &str) -> Result<f64, String> {
    units::parse_rate_bits(s).map_err(|e| e.to_string())
}
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    units::parse_duration(s).map_err(|e| e.to_string())
}
fn parse_over(s: &str) -> Result<Networks, String> {
    crate::options::parse_over(s)
        .map(Networks)
        .map_err(|e| e.to_string())
}
/// A congestion control's name as the kernel spells them: under 16 letters, digits, _ or -.
fn parse_congestion(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() < 16
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    ok.then(|| s.to_string())
        .ok_or_else(|| format!("'{s}' is not a congestion control's name (cubic, bbr, reno, ...)"))
}
pub fn parse_transport(s: &str) -> Result<TransportKind, String> {
    TransportKind::parse(s).map_err(|e| e.to_string())
}

/// An interface or device name: not empty, no spaces or control characters (a shell variable
/// that expanded to nothing would otherwise read "no RDMA device named  on this host").
fn non_empty_name(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("an empty name (was a shell variable unset?)".into());
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{s:?} is not an interface or device name"));
    }
    Ok(s.to_string())
}

/// A library path with a directory in it, made absolute, so ranks started elsewhere (over
/// ssh, in the home directory) load the same file; a bare name stays as it is, for dlopen's
/// search of the library path.
fn absolute_lib(p: PathBuf) -> PathBuf {
    if p.components().count() > 1 {
        std::fs::canonicalize(&p).unwrap_or(p)
    } else {
        p
    }
}

impl RunArgs {
    /// The ids (`nodes`, `rdma_device`, ...) of the flags that place and connect ranks: every
    /// flag of this struct but `--timeout` and `--out`, which serve a run with no ranks too. A
    /// mode that starts no ranks refuses these, and the list cannot fall behind the flags.
    pub fn rank_flag_ids() -> Vec<String> {
        <RunArgs as Args>::augment_args(clap::Command::new("run"))
            .get_arguments()
            .map(|a| a.get_id().to_string())
            .filter(|id| id != "timeout" && id != "out")
            .collect()
    }

    pub fn options(&self) -> RunOptions {
        RunOptions {
            nodes: self.nodes,
            hostfile: self.hostfile.clone(),
            rsh: self.rsh.clone(),
            exe: self.exe.clone(),
            net: crate::options::DataNetwork {
                transport: self.transport,
                addr: self.addr,
                iface: self.iface.clone(),
                rdma_device: self.rdma_device.clone(),
                subnet: None,
                links: false,
            },
            verbs_lib: self
                .verbs_lib
                .clone()
                .or_else(|| std::env::var_os(crate::options::ENV_VERBS_LIB).map(PathBuf::from))
                .map(absolute_lib),
            over: self.over.clone().map(|n| n.0).unwrap_or_default(),
            network_index: None,
            streams: self.streams.map(usize::from),
            streams_when_paced: crate::options::AUTO_STREAMS_PACED,
            sockbuf: self.sockbuf.map(|b| b as usize),
            congestion: self.congestion.clone(),
            timeout: self.timeout.unwrap_or(crate::options::DEFAULT_TIMEOUT),
            port: self.port,
            out: self.out.clone(),
            out_generated: false,
            oversubscribe: self.oversubscribe,
            slurm_script: self.slurm.clone(),
        }
    }
}

/// A mistake in the flags that clap cannot see (a flag the chosen mode does not use): the
/// binary exits 2 for it, as for clap's own usage errors.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// What `tbbench run --quick` asks of every suite.
pub struct QuickPlan {
    pub nodes: usize,
}

/// One suite as the binary sees it: its subcommand (name, help, flags), how to run it from
/// the parsed flags, and its part of `tbbench run --quick`. Each suite crate builds its own;
/// the binary's registry lists them, one line each.
pub struct Registration {
    /// The subcommand.
    pub name: &'static str,
    /// Its clap command, flags and help included.
    pub command: fn() -> clap::Command,
    /// Runs it from the parsed flags; the exit code.
    pub run: fn(&clap::ArgMatches, &tbbench_schema::Tool) -> anyhow::Result<i32>,
    /// Its short run for `tbbench run --quick`: the result file's name and the flags, or why
    /// it is left out on this machine.
    pub quick: fn(&QuickPlan) -> Result<QuickRun, String>,
}

/// A suite's part of `tbbench run --quick`.
pub struct QuickRun {
    /// The result file's name in the quick run's folder (without .json).
    pub result: &'static str,
    /// Flags after the subcommand (the run's --nodes, --transport and --out are added).
    pub args: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_flags_are_every_run_flag_but_timeout_and_out() {
        let ids = RunArgs::rank_flag_ids();
        for id in [
            "nodes",
            "hostfile",
            "verbs_lib",
            "over",
            "rdma_device",
            "oversubscribe",
        ] {
            assert!(ids.iter().any(|x| x == id), "{id} missing from {ids:?}");
        }
        assert!(!ids.iter().any(|x| x == "timeout" || x == "out"), "{ids:?}");
    }
}
