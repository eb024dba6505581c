//! The MLX peer: every rank starts `mlx_coll.py` with MLX's own environment, as `mlx.launch`
//! sets it for the backend (ring: `MLX_RANK`, `MLX_HOSTFILE`, a JSON list per rank of the
//! "ip:port" it listens on; jaccl: `MLX_IBV_DEVICES`, `MLX_JACCL_COORDINATOR`), on the same
//! ranks and addresses tbbench's own sweep used. tbbench's launcher already has a process on
//! every host, so nothing is copied to the hosts and no ssh is needed beyond tbbench's own.

use super::{
    agree, failure_line, peer_dir, read_printed, run_to_end, Job, MlxBackend, PeerRun, Printed,
};
use crate::{redop_str, CollConfig};
use anyhow::Result;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use tbbench_runners::comm::{Algo, ReduceOp};
use tbbench_runners::suite::Context;

/// The program every rank runs: this crate's own, carried in the binary.
const PROGRAM: &str = include_str!("mlx_coll.py");

/// The variable naming a Python that has MLX (`mlx` from PyPI: `mlx[cpu]` on Linux).
pub const ENV_MLX_PYTHON: &str = "TBBENCH_MLX_PYTHON";

/// Runs the MLX peer on every rank. The outer error is tbbench's own (its connections); the
/// inner one the line saying why MLX did not run, the same on every rank.
pub(super) fn run(
    config: &CollConfig,
    ctx: &mut Context,
    jobs: &[Job],
    deadline: Duration,
    run: &mut PeerRun,
) -> Result<Result<Option<Printed>, String>> {
    let n = ctx.size();
    let backend = config
        .peer_backend
        .or_else(|| {
            ctx.network
                .topology
                .as_ref()
                .and_then(|t| t.backend.as_deref())
                .and_then(|b| MlxBackend::parse(b).ok())
        })
        .unwrap_or(MlxBackend::Ring);
    run.backend = Some(backend.name());
    run.label = format!("MLX {}", backend.name());

    let python = find_python();
    if let Some(why) = agree(ctx, python.as_ref().err().cloned())? {
        return Ok(Err(why));
    }
    let (python, version) = python.expect("agreed above");
    run.version = Some(version);

    // Each rank's port: one the OS has free now, on every address (MLX binds it a moment
    // later). Every rank learns every rank's.
    let mine = std::net::TcpListener::bind(("0.0.0.0", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port());
    let mut ports = vec![0.0f64; n];
    if let Ok(p) = &mine {
        ports[ctx.rank()] = f64::from(*p);
    }
    if let Some(why) = agree(
        ctx,
        mine.as_ref().err().map(|e| format!("no free port: {e}")),
    )? {
        return Ok(Err(why));
    }
    ctx.comm.all_reduce(&mut ports, ReduceOp::Sum, Algo::Auto)?;

    // What every rank computes alike from the run's network: no agreement needed.
    let ips = match listen_ips(ctx) {
        Ok(ips) => ips,
        Err(why) => return Ok(Err(why)),
    };
    let mut env: Vec<(String, String)> = vec![("MLX_RANK".into(), ctx.rank().to_string())];
    let files = match backend {
        MlxBackend::Ring => {
            let hosts: Vec<Vec<String>> = ips
                .iter()
                .zip(&ports)
                .map(|(list, &port)| list.iter().map(|ip| join(ip, port as u16)).collect())
                .collect();
            // One rank: no hostfile, as mlx.launch gives it none.
            if n > 1 {
                vec![("MLX_HOSTFILE", serde_json::to_string(&hosts)?)]
            } else {
                Vec::new()
            }
        }
        MlxBackend::Jaccl | MlxBackend::JacclRing => {
            let devices = match rdma_devices(ctx) {
                Ok(d) => d,
                Err(why) => return Ok(Err(why)),
            };
            env.push((
                "MLX_JACCL_COORDINATOR".into(),
                join(&ips[0][0], ports[0] as u16),
            ));
            if backend == MlxBackend::JacclRing {
                env.push(("MLX_JACCL_RING".into(), "1".into()));
            }
            vec![("MLX_IBV_DEVICES", serde_json::to_string(&devices)?)]
        }
    };
    let job = serde_json::json!({
        "backend": backend.name(),
        "ranks": n,
        "dtype": config.dtype.name(),
        "redop": redop_str(config.redop),
        "warmup": config.warmup,
        "iters": config.iters,
        "rows": jobs.iter().map(|j| serde_json::json!({"op": j.op.name(), "count": j.count})).collect::<Vec<_>>(),
    });
    env.push(("TBBENCH_PEER_JOB".into(), job.to_string()));
    run.started = format!(
        "each rank by tbbench's launcher with MLX's environment for {} ({}), as mlx.launch sets it; {}",
        backend.name(),
        match backend {
            MlxBackend::Ring => "MLX_RANK, MLX_HOSTFILE",
            _ => "MLX_RANK, MLX_IBV_DEVICES, MLX_JACCL_COORDINATOR",
        },
        python.display()
    );

    let outcome = start(&python, &env, &files, ctx.rank(), deadline);
    let mine = match &outcome {
        Ok(f) => failure_line(&format!("MLX ({})", backend.name()), f, deadline),
        Err(e) => Some(format!("could not start MLX's program: {e}")),
    };
    if let Some(why) = agree(ctx, mine)? {
        return Ok(Err(why));
    }
    if ctx.rank() != 0 {
        return Ok(Ok(None));
    }
    let finished = outcome.expect("agreed above");
    Ok(read_printed(&finished.stdout, jobs)
        .map(Some)
        .map_err(|e| format!("MLX ({}): {e}", backend.name())))
}

/// Writes the program and MLX's files (each named by its variable) into this user's peer
/// folder, runs the program, and removes them.
fn start(
    python: &Path,
    env: &[(String, String)],
    files: &[(&str, String)],
    rank: usize,
    deadline: Duration,
) -> std::io::Result<super::Finished> {
    let dir = peer_dir()?;
    // Ranks on one host write files of their own: nothing is shared, nothing raced.
    let tag = format!("{}-{rank}", std::process::id());
    let script = dir.join(format!("mlx_coll-{tag}.py"));
    std::fs::write(&script, PROGRAM)?;
    let mut written = vec![script.clone()];
    let mut cmd = Command::new(python);
    cmd.arg(&script);
    super::clean_env(&mut cmd);
    for (var, content) in files {
        let path = dir.join(format!("{}-{tag}.json", var.to_ascii_lowercase()));
        std::fs::write(&path, content)?;
        cmd.env(var, &path);
        written.push(path);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let r = run_to_end(cmd, deadline);
    for f in written {
        let _ = std::fs::remove_file(f);
    }
    r
}

/// "ip:port", with an IPv6 address in brackets.
fn join(ip: &str, port: u16) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// The addresses each rank listens on, as MLX's ring hostfile lists them. Over a cluster's
/// cables, each rank's ends of the cables from the rank before it (MLX's ring goes round the
/// ranks in order, and `mlx.distributed_config` writes the same: several cables, several
/// addresses, striped); over one network each rank's data address; all ranks on one host,
/// loopback.
fn listen_ips(ctx: &Context) -> Result<Vec<Vec<String>>, String> {
    let n = ctx.size();
    let net = &ctx.network;
    if !net.links.is_empty() {
        return (0..n)
            .map(|i| {
                let left = (i + n - 1) % n;
                let pair = [i.min(left), i.max(left)];
                let ips: Vec<String> = net
                    .links
                    .iter()
                    .filter(|l| l.ranks == pair)
                    .map(|l| l.ends[usize::from(l.ranks[0] != i)].address.clone())
                    .collect();
                if ips.is_empty() {
                    Err(format!(
                        "MLX's ring goes round the ranks in order, and ranks {left} and {i} ({} and {}) have no cable",
                        ctx.rank_names[left], ctx.rank_names[i]
                    ))
                } else {
                    Ok(ips)
                }
            })
            .collect();
    }
    if net.addresses.len() == n && net.addresses.iter().all(|a| !a.is_empty()) {
        return Ok(net.addresses.iter().map(|a| vec![a.clone()]).collect());
    }
    if super::one_host(ctx) {
        return Ok(vec![vec!["127.0.0.1".to_string()]; n]);
    }
    Err(format!(
        "MLX's ring backend needs each rank's IP address, which a {} run across hosts does not have (run it over tcp)",
        net.transport
    ))
}

/// JACCL's device table: row i, column j the RDMA device rank i reaches rank j by (null on
/// the diagonal and where the pair has none), from the cables' recorded devices.
fn rdma_devices(ctx: &Context) -> Result<Vec<Vec<Option<String>>>, String> {
    let n = ctx.size();
    let mut table = vec![vec![None; n]; n];
    for l in &ctx.network.links {
        let [a, b] = l.ranks;
        if table[a][b].is_none() {
            table[a][b] = l.ends[0].rdma_device.clone();
            table[b][a] = l.ends[1].rdma_device.clone();
        }
    }
    if table.iter().flatten().all(Option::is_none) {
        return Err(
            "MLX's jaccl backend needs the RDMA device of each cable (the hostfile's rdma lists, over --over verbs:links or tcp:links)"
                .into(),
        );
    }
    Ok(table)
}

/// A Python that imports MLX with its distributed module: the one `TBBENCH_MLX_PYTHON`
/// names (only that one), else `.venv-mlx` in the checkout this binary was built from (scripts/setup.sh puts it
/// there), `.venv-mlx` in the current folder, then `python3` on the PATH. With its version.
fn find_python() -> Result<(PathBuf, String), String> {
    // A python named by the variable is the only one tried: the user chose it.
    let named = std::env::var_os(ENV_MLX_PYTHON).filter(|p| !p.is_empty());
    let mut candidates: Vec<PathBuf> = Vec::new();
    if named.is_none() {
        if let Some(checkout) = Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2) {
            candidates.push(checkout.join(".venv-mlx/bin/python"));
        }
        candidates.push(PathBuf::from(".venv-mlx/bin/python"));
    }
    let mut looked = Vec::new();
    let last = named.map_or_else(|| PathBuf::from("python3"), PathBuf::from);
    for py in candidates.into_iter().filter(|p| p.exists()).chain([last]) {
        looked.push(py.display().to_string());
        let mut cmd = Command::new(&py);
        cmd.args([
            "-c",
            "import mlx.core as mx; print(mx.__version__, mx.distributed.is_available())",
        ]);
        let Ok(f) = run_to_end(cmd, Duration::from_secs(60)) else {
            continue;
        };
        if f.status.is_some_and(|s| s.success()) {
            let mut words = f.stdout.split_whitespace();
            if let (Some(version), Some("True")) = (words.next(), words.next()) {
                return Ok((py, version.to_string()));
            }
        }
    }
    Err(format!(
        "MLX is not installed: no mlx.core with distributed support in {} (scripts/setup.sh installs mlx[cpu] into .venv-mlx; {ENV_MLX_PYTHON} names another python)",
        looked.join(", ")
    ))
}
