//! `coll --peer mlx,mpi`: after tbbench's own sweep, the same ops, sizes and element type
//! through MLX's collectives (`mx.distributed`) and the MPI library's, on the same ranks,
//! hosts and network, timed as tbbench times its own (barrier, the call, the slowest rank's
//! time per iteration, warm-up apart) with every output element checked.
//!
//! The peers' programs are tbbench's own and travel inside the binary: `mlx_coll.py`, which
//! every rank starts with MLX's environment as `mlx.launch` would set it ([`mlx`]), and
//! `mpi_coll.c`, built with `mpicc` on each host and started by rank 0 under `mpirun`
//! ([`mpi`]). Where a peer is missing or fails, one line says why and tbbench's rows stand.

mod mlx;
mod mpi;

use crate::{harness, CollConfig, Row};
use anyhow::Result;
use serde::Serialize;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tbbench_runners::comm::{Algo, CollOp, Dtype, ReduceOp};
use tbbench_runners::suite::Context;

/// An implementation run beside tbbench's own collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    Mlx,
    Mpi,
}

impl Peer {
    /// The name on the command line and in each row's `impl`.
    pub fn name(self) -> &'static str {
        match self {
            Peer::Mlx => "mlx",
            Peer::Mpi => "mpi",
        }
    }

    pub fn parse(s: &str) -> Result<Peer, String> {
        match s.trim() {
            "mlx" => Ok(Peer::Mlx),
            "mpi" => Ok(Peer::Mpi),
            other => Err(format!("unknown peer '{other}' (use mlx, mpi or mlx,mpi)")),
        }
    }

    /// The ops the peer's library has (MLX: all_sum/all_max/all_min, all_gather,
    /// sum_scatter, send/recv for the ping-pong; MPI: all six and the ping-pong).
    fn offers(self, op: CollOp) -> bool {
        match self {
            Peer::Mlx => matches!(
                op,
                CollOp::AllReduce | CollOp::AllGather | CollOp::ReduceScatter | CollOp::PingPong
            ),
            Peer::Mpi => true,
        }
    }

    /// Why the peer cannot run this element type, where it cannot.
    fn lacks_dtype(self, dtype: Dtype) -> Option<&'static str> {
        match (self, dtype) {
            (Peer::Mpi, Dtype::F16 | Dtype::Bf16) => {
                Some("MPI has no 16-bit float type (MPI_Allreduce takes MPI_FLOAT and MPI_DOUBLE)")
            }
            _ => None,
        }
    }
}

/// MLX's distributed backends that a peer run can take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlxBackend {
    /// TCP sockets round the ranks in order, each rank listening on the IPs the hostfile
    /// gives it (its end of the cable from the rank before it).
    Ring,
    /// RDMA over Thunderbolt between every pair (macOS 26.2+).
    Jaccl,
    /// RDMA round the ranks' ring.
    JacclRing,
}

impl MlxBackend {
    pub fn name(self) -> &'static str {
        match self {
            MlxBackend::Ring => "ring",
            MlxBackend::Jaccl => "jaccl",
            MlxBackend::JacclRing => "jaccl-ring",
        }
    }

    pub fn parse(s: &str) -> Result<MlxBackend, String> {
        match s.trim() {
            "ring" => Ok(MlxBackend::Ring),
            "jaccl" => Ok(MlxBackend::Jaccl),
            "jaccl-ring" => Ok(MlxBackend::JacclRing),
            other => Err(format!(
                "unknown MLX backend '{other}' (use ring, jaccl or jaccl-ring)"
            )),
        }
    }
}

/// What became of one peer: it ran (its version and backend), or why not; and what it left
/// out because its library lacks it.
#[derive(Debug, Clone, Serialize)]
pub struct PeerRun {
    #[serde(rename = "impl")]
    pub implementation: &'static str,
    /// For tables, charts and compare's figure names: "MLX ring", "MPI" (the version apart).
    pub label: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<&'static str>,
    /// How it was started.
    pub started: String,
    pub ran: bool,
    /// Why it did not run, or failed part way.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// Ops (and element types) the library does not have, one line each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

/// One row for a peer to run: an op on `count` elements as tbbench counts them.
#[derive(Debug, Clone, Copy)]
struct Job {
    op: CollOp,
    count: usize,
}

/// What a peer's rank 0 printed, read back.
struct Printed {
    version: Option<String>,
    rows: Vec<PrintedRow>,
    skipped: Vec<String>,
}

struct PrintedRow {
    op: CollOp,
    count: usize,
    times_us: Vec<f64>,
    wrong: u64,
}

/// Runs each peer in turn on every rank; rank 0 gets what each did and its rows.
/// `own_time` is how long tbbench's own sweep took: a peer gets 30 times that, and a minute,
/// before it is stopped.
pub fn run_all(
    config: &CollConfig,
    ctx: &mut Context,
    own_time: Duration,
    ceiling_gbps: Option<f64>,
) -> Result<(Vec<PeerRun>, Vec<Row>)> {
    let n = ctx.size();
    let mut runs = Vec::new();
    let mut rows = Vec::new();
    let deadline = Duration::from_secs(60) + own_time * 30;
    for &peer in &config.peers {
        let mut skipped = Vec::new();
        for op in &config.ops {
            if !peer.offers(*op) {
                skipped.push(format!("{} has no {}", label_of(peer), op.name()));
            }
        }
        let jobs: Vec<Job> = match peer.lacks_dtype(config.dtype) {
            Some(why) => {
                skipped.push(why.to_string());
                Vec::new()
            }
            None => jobs(config, n, peer),
        };
        let mut run = PeerRun {
            implementation: peer.name(),
            label: label_of(peer).to_string(),
            version: None,
            backend: None,
            started: String::new(),
            ran: false,
            why: None,
            skipped,
        };
        if jobs.is_empty() {
            run.why = Some(format!(
                "{} runs none of the ops and sizes asked for here",
                run.label
            ));
        } else {
            let outcome = match peer {
                Peer::Mlx => mlx::run(config, ctx, &jobs, deadline, &mut run)?,
                Peer::Mpi => mpi::run(config, ctx, &jobs, deadline, &mut run)?,
            };
            match outcome {
                Ok(Some(printed)) => {
                    run.ran = true;
                    if let Some(v) = printed.version {
                        run.version = Some(v);
                    }
                    run.skipped.extend(printed.skipped);
                    for p in printed.rows {
                        rows.push(row_of(peer, run.backend, config, n, &p, ceiling_gbps));
                    }
                }
                Ok(None) => run.ran = true,
                Err(why) => run.why = Some(why),
            }
        }
        if ctx.rank() == 0 {
            if let Some(why) = &run.why {
                eprintln!("tbbench: warning: --peer {}: {why}", peer.name());
            }
            for s in &run.skipped {
                eprintln!("tbbench: note: --peer {}: {s}", peer.name());
            }
        }
        runs.push(run);
    }
    Ok((runs, rows))
}

fn label_of(peer: Peer) -> &'static str {
    match peer {
        Peer::Mlx => "MLX",
        Peer::Mpi => "MPI",
    }
}

/// The rows tbbench's own sweep ran, as element counts, for the ops the peer has.
fn jobs(config: &CollConfig, n: usize, peer: Peer) -> Vec<Job> {
    let elt = config.dtype.size();
    let mut out: Vec<Job> = Vec::new();
    for &op in config.ops.iter().filter(|op| peer.offers(**op)) {
        for &size in &config.sizes {
            let count = harness::count_for(op, size, elt, n);
            if count > 0 && !out.iter().any(|j| j.op == op && j.count == count) {
                out.push(Job { op, count });
            }
        }
    }
    out
}

/// A peer's printed row as one of the result's rows, with tbbench's figures (time summary,
/// algbw, busbw by nccl-tests' factors).
fn row_of(
    peer: Peer,
    backend: Option<&'static str>,
    config: &CollConfig,
    n: usize,
    p: &PrintedRow,
    ceiling_gbps: Option<f64>,
) -> Row {
    // The algorithm is the library's own choice; the column names the backend that ran it.
    let algo = match peer {
        Peer::Mlx => backend.unwrap_or("mlx"),
        Peer::Mpi => "mpi",
    };
    harness::row(
        config,
        n,
        ceiling_gbps,
        harness::Timed {
            implementation: peer.name(),
            op: p.op,
            algo,
            requested: algo,
            // The peers run out of place (MLX's collectives return a new array).
            in_place: false,
            count: p.count,
            times_us: &p.times_us,
            wrong: p.wrong,
        },
    )
}

/// Reads what a peer's rank 0 printed: a first line with its version, then one JSON object per
/// row. Lines that are not JSON (a library's own chatter on stdout) are passed over.
fn read_printed(stdout: &str, jobs: &[Job]) -> Result<Printed, String> {
    let mut printed = Printed {
        version: None,
        rows: Vec::new(),
        skipped: Vec::new(),
    };
    let mut answered: Vec<(CollOp, usize)> = Vec::new();
    for line in stdout.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line.trim()) else {
            continue;
        };
        if let Some(version) = v.get("version").and_then(|x| x.as_str()) {
            printed.version = Some(version.to_string());
            continue;
        }
        let (Some(op), Some(count)) = (
            v.get("op")
                .and_then(|x| x.as_str())
                .and_then(|s| CollOp::parse(s).ok()),
            v.get("count").and_then(|x| x.as_u64()),
        ) else {
            continue;
        };
        answered.push((op, count as usize));
        if let Some(why) = v.get("skipped").and_then(|x| x.as_str()) {
            if !printed.skipped.iter().any(|s| s == why) {
                printed.skipped.push(why.to_string());
            }
            continue;
        }
        let times_us: Vec<f64> = v
            .get("times_us")
            .and_then(|x| x.as_array())
            .map(|a| a.iter().filter_map(|t| t.as_f64()).collect())
            .unwrap_or_default();
        if times_us.is_empty() || !times_us.iter().all(|t| t.is_finite() && *t >= 0.0) {
            return Err(format!("its row for {} had no times", op.name()));
        }
        printed.rows.push(PrintedRow {
            op,
            count: count as usize,
            times_us,
            wrong: v.get("wrong").and_then(|x| x.as_u64()).unwrap_or(0),
        });
    }
    // Every job is answered, by a row or by a line saying the library lacks it.
    let missing = jobs
        .iter()
        .filter(|j| !answered.contains(&(j.op, j.count)))
        .count();
    if missing > 0 {
        return Err(format!(
            "it stopped after {} of {} rows",
            jobs.len() - missing,
            jobs.len()
        ));
    }
    Ok(printed)
}

/// Every rank agrees whether the peer failed anywhere: None where no rank says so, else the
/// first failing rank's line, naming its rank and host.
fn agree(ctx: &mut Context, mine: Option<String>) -> Result<Option<String>> {
    let n = ctx.size();
    let mut flags = vec![0.0f64; n];
    if mine.is_some() {
        flags[ctx.rank()] = 1.0;
    }
    ctx.comm.all_reduce(&mut flags, ReduceOp::Sum, Algo::Auto)?;
    let Some(first) = flags.iter().position(|&f| f > 0.0) else {
        return Ok(None);
    };
    let mut buf = [0u8; 600];
    if ctx.rank() == first {
        let text = mine.unwrap_or_default();
        let mut end = text.len().min(buf.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        buf[..end].copy_from_slice(&text.as_bytes()[..end]);
    }
    ctx.comm.bcast(first, &mut buf)?;
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let text = String::from_utf8_lossy(&buf[..len]).into_owned();
    let place = if !one_host(ctx) {
        format!(" (rank {first} on {})", ctx.rank_names[first])
    } else {
        String::new()
    };
    Ok(Some(format!("{text}{place}")))
}

/// Whether every rank runs on one host, as the run names hosts (the hostfile's names: the
/// lab's namespaces share a hostname and are still hosts of their own).
fn one_host(ctx: &Context) -> bool {
    ctx.rank_names.iter().all(|h| *h == ctx.rank_names[0])
}

/// Every rank's line, in rank order, on every rank (each rank's in turn from it; lines cut
/// at 600 bytes).
fn gather_lines(ctx: &mut Context, mine: &str) -> Result<Vec<String>> {
    let mut lines = Vec::with_capacity(ctx.size());
    for r in 0..ctx.size() {
        let mut buf = [0u8; 600];
        if r == ctx.rank() {
            let mut end = mine.len().min(buf.len());
            while !mine.is_char_boundary(end) {
                end -= 1;
            }
            buf[..end].copy_from_slice(&mine.as_bytes()[..end]);
        }
        ctx.comm.bcast(r, &mut buf)?;
        let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        lines.push(String::from_utf8_lossy(&buf[..len]).into_owned());
    }
    Ok(lines)
}

/// How a peer's process ended.
struct Finished {
    stdout: String,
    /// The last lines of its stderr, for the one line that says why it failed.
    stderr_tail: String,
    status: Option<std::process::ExitStatus>,
    timed_out: bool,
}

/// Runs `cmd` to its end, or until `deadline` passes or the run is aborted (another rank
/// failed): it is killed then. Its stdout and stderr are read on threads of their own, so a
/// chatty peer cannot block on a full pipe.
fn run_to_end(mut cmd: Command, deadline: Duration) -> std::io::Result<Finished> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child: Child = cmd.spawn()?;
    let mut out = child.stdout.take().expect("piped");
    let err = child.stderr.take().expect("piped");
    let out_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_thread = std::thread::spawn(move || {
        let mut tail: Vec<String> = Vec::new();
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if !line.trim().is_empty() {
                tail.push(line);
                if tail.len() > 20 {
                    tail.remove(0);
                }
            }
        }
        tail.join("\n")
    });
    let start = Instant::now();
    let mut timed_out = false;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if start.elapsed() > deadline || tbbench_runners::abort::aborting() {
            timed_out = start.elapsed() > deadline;
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(Finished {
        stdout: out_thread.join().unwrap_or_default(),
        stderr_tail: err_thread.join().unwrap_or_default(),
        status,
        timed_out,
    })
}

/// One line for a peer that did not end well: its own last line of complaint, else its
/// exit status.
fn failure_line(what: &str, f: &Finished, deadline: Duration) -> Option<String> {
    if f.timed_out {
        return Some(format!(
            "{what} did not finish within {} s and was stopped",
            deadline.as_secs()
        ));
    }
    match f.status {
        Some(st) if st.success() => None,
        Some(st) => Some(match complaint(&f.stderr_tail) {
            Some(l) => format!("{what} failed ({st}): {l}"),
            None => format!("{what} failed ({st})"),
        }),
        None => Some(format!("{what} was stopped: the run was aborted")),
    }
}

/// The line of a failed program's last words that says what went wrong: the last one naming
/// an error or failure (OpenMPI frames its message in help boxes of dashes and advice), else
/// the last line with any words.
fn complaint(tail: &str) -> Option<String> {
    let lines: Vec<&str> = tail
        .lines()
        .map(str::trim)
        .filter(|l| l.chars().any(char::is_alphanumeric))
        // OpenMPI's advice on how to see more of its messages says nothing of what failed.
        .filter(|l| !l.contains("orte_base_help_aggregate"))
        .collect();
    // The most telling words first: a crash or a refusal outranks a line of advice that
    // happens to say "error".
    let tiers: [&[&str]; 2] = [
        &[
            "segmentation fault",
            "mlx peer:",
            "unable to",
            "not found",
            "no such",
            "failed",
        ],
        &["error"],
    ];
    for words in tiers {
        if let Some(l) = lines.iter().rev().find(|l| {
            let l = l.to_ascii_lowercase();
            words.iter().any(|w| l.contains(w))
        }) {
            return Some(l.to_string());
        }
    }
    lines.last().map(|l| l.to_string())
}

/// The environment a peer's process must not inherit: an mpirun's or a scheduler's
/// variables from tbbench's own start would make the peer join that job instead of its own.
fn clean_env(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("OMPI_") || k.starts_with("PMIX_") || k.starts_with("PMI_") {
            cmd.env_remove(k.as_ref());
        }
    }
}

/// A folder of this user's own under /tmp, the same path on every host (mpirun starts the
/// MPI peer by one path everywhere), where the peers' files are written.
fn peer_dir() -> std::io::Result<std::path::PathBuf> {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let dir = std::path::PathBuf::from(format!("/tmp/tbbench-peers-{uid}"));
    std::fs::create_dir_all(&dir)?;
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let meta = std::fs::symlink_metadata(&dir)?;
        if meta.uid() != uid || !meta.is_dir() {
            return Err(std::io::Error::other(format!(
                "{} belongs to another user",
                dir.display()
            )));
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(dir)
}
