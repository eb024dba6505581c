//! The MPI peer: `mpi_coll.c`, built with `mpicc` on each host (once per version of the
//! source, under /tmp/tbbench-peers-UID), started by rank 0 under `mpirun` with the run's
//! hosts, rank count and network while the other ranks wait.

use super::{
    agree, clean_env, failure_line, gather_lines, peer_dir, read_printed, run_to_end, Job, PeerRun,
    Printed,
};
use crate::{redop_str, CollConfig};
use anyhow::Result;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use tbbench_runners::netinfo;
use tbbench_runners::suite::Context;

/// The program: this crate's own, carried in the binary and compiled where it runs.
const PROGRAM: &str = include_str!("mpi_coll.c");

/// The variables naming another `mpicc` and `mpirun` (an MPI other than the PATH's).
pub const ENV_MPICC: &str = "TBBENCH_MPICC";
pub const ENV_MPIRUN: &str = "TBBENCH_MPIRUN";

pub(super) fn run(
    config: &CollConfig,
    ctx: &mut Context,
    jobs: &[Job],
    deadline: Duration,
    run: &mut PeerRun,
) -> Result<Result<Option<Printed>, String>> {
    // Each host's first rank builds the program; its other ranks wait for that.
    let built = if ctx.first_on_my_host() {
        build()
    } else {
        binary_path().map_err(|e| e.to_string())
    };
    ctx.comm.barrier_patient()?;
    let built = built.and_then(|path| {
        if path.exists() {
            Ok(path)
        } else {
            Err(format!("{} was not built", path.display()))
        }
    });
    if let Some(why) = agree(ctx, built.as_ref().err().cloned())? {
        return Ok(Err(why));
    }
    let program = built.expect("agreed above");
    // The subnets the run's data went over, each rank naming its own: OpenMPI's TCP takes
    // them (interface names differ from host to host; a subnet is the same on both ends).
    let mut subnets: Vec<String> = Vec::new();
    for line in gather_lines(ctx, &my_subnets(ctx).join(","))? {
        for s in line.split(',').filter(|s| !s.is_empty()) {
            if !subnets.iter().any(|x| x == s) {
                subnets.push(s.to_string());
            }
        }
    }
    // Rank 0 runs the whole peer job; the others wait, however long it takes (the control
    // channel still ends the run if a rank dies).
    let command = (ctx.rank() == 0).then(|| mpirun(config, ctx, jobs, &program, &subnets));
    let mine = command.as_ref().and_then(|c| c.as_ref().err().cloned());
    if let Some(why) = agree(ctx, mine)? {
        return Ok(Err(why));
    }
    let outcome = command.map(|c| {
        let (cmd, shown, agent_file) = c.expect("agreed above");
        run.started = format!("rank 0: {shown}");
        let finished = run_to_end(cmd, deadline);
        if let Some(agent) = agent_file {
            let _ = std::fs::remove_file(agent);
        }
        finished
    });
    ctx.comm.barrier_patient()?;
    let mine = match &outcome {
        None => None,
        Some(Ok(f)) => failure_line("mpirun", f, deadline),
        Some(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => Some(format!(
            "{} is not installed (apt install openmpi-bin; brew install open-mpi; {ENV_MPIRUN} names another)",
            std::env::var(ENV_MPIRUN).unwrap_or_else(|_| "mpirun".into())
        )),
        Some(Err(e)) => Some(format!("could not start mpirun: {e}")),
    };
    if let Some(why) = agree(ctx, mine)? {
        return Ok(Err(why));
    }
    let Some(Ok(finished)) = outcome else {
        return Ok(Ok(None));
    };
    Ok(read_printed(&finished.stdout, jobs)
        .map(Some)
        .map_err(|e| format!("MPI: {e}")))
}

/// What mpirun is to start its daemons with: tbbench's own `--rsh`. mpirun hands an agent the
/// daemon's command as one string, which ssh's remote shell splits and an agent such as
/// `ip netns exec` does not: such an agent gets a small wrapper that runs the string with
/// /bin/sh on the far side (removed once mpirun ends).
fn rsh_agent(rsh: &str) -> Result<(String, Option<PathBuf>), String> {
    let base = rsh
        .split_whitespace()
        .next()
        .and_then(|p| std::path::Path::new(p).file_name())
        .and_then(|s| s.to_str())
        .unwrap_or("");
    if matches!(base, "ssh" | "rsh" | "oarsh") {
        return Ok((rsh.to_string(), None));
    }
    let dir = peer_dir().map_err(|e| format!("no folder for mpirun's agent: {e}"))?;
    let path = dir.join(format!("rsh-agent-{}.sh", std::process::id()));
    let script = format!(
        "#!/bin/sh\n# mpirun's agent for tbbench coll --peer mpi: {rsh} HOST, the command through sh.\nhost=\"$1\"; shift\nexec {rsh} \"$host\" /bin/sh -c \"$*\"\n"
    );
    let written = std::fs::write(&path, script).and_then(|_| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))
    });
    written.map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((path.display().to_string(), Some(path)))
}

/// This rank's data addresses (its ends of the cables, or its one address) as the subnets
/// its host has them in: "10.71.0.0/24".
fn my_subnets(ctx: &Context) -> Vec<String> {
    let me = ctx.rank();
    let net = &ctx.network;
    let mine: Vec<&str> = if net.links.is_empty() {
        net.addresses
            .get(me)
            .map(|a| a.as_str())
            .into_iter()
            .collect()
    } else {
        net.links
            .iter()
            .filter_map(|l| {
                l.ranks
                    .iter()
                    .position(|&r| r == me)
                    .map(|i| l.ends[i].address.as_str())
            })
            .collect()
    };
    let Ok(prefixes) = netinfo::ipv4_prefixes() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for a in mine {
        let Ok(ip) = a.parse::<std::net::Ipv4Addr>() else {
            continue;
        };
        if let Some((_, _, bits)) = prefixes.iter().find(|(_, p, _)| *p == ip) {
            let s = format!("{}/{bits}", netinfo::mask(ip, *bits));
            if !out.contains(&s) {
                out.push(s);
            }
        }
    }
    out
}

/// Where this host's build of the program lives: named by a hash of its source, so a newer
/// tbbench builds its own.
fn binary_path() -> std::io::Result<PathBuf> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in PROGRAM.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    Ok(peer_dir()?.join(format!("mpi_coll-{h:016x}")))
}

/// Builds the program with `mpicc` unless this host has it already: into a temporary name,
/// renamed into place, so a build cut short is never run.
fn build() -> Result<PathBuf, String> {
    let path = binary_path().map_err(|e| format!("no folder for the MPI peer: {e}"))?;
    if path.exists() {
        return Ok(path);
    }
    let dir = path.parent().expect("in the peer folder");
    let source = dir.join(format!("mpi_coll-{}.c", std::process::id()));
    let tmp = dir.join(format!("mpi_coll-{}.tmp", std::process::id()));
    std::fs::write(&source, PROGRAM).map_err(|e| format!("{}: {e}", source.display()))?;
    let mpicc = std::env::var(ENV_MPICC).unwrap_or_else(|_| "mpicc".into());
    let mut cmd = Command::new(&mpicc);
    cmd.arg("-O2").arg("-o").arg(&tmp).arg(&source);
    clean_env(&mut cmd);
    let result = run_to_end(cmd, Duration::from_secs(120));
    let _ = std::fs::remove_file(&source);
    let outcome = match result {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!(
            "{mpicc} is not installed (apt install libopenmpi-dev openmpi-bin; brew install open-mpi; {ENV_MPICC} names another)"
        )),
        Err(e) => Err(format!("could not run {mpicc}: {e}")),
        Ok(f) => match failure_line(&mpicc, &f, Duration::from_secs(120)) {
            Some(why) => Err(why),
            None => std::fs::rename(&tmp, &path)
                .map(|_| path.clone())
                .map_err(|e| format!("{}: {e}", path.display())),
        },
    };
    let _ = std::fs::remove_file(&tmp);
    outcome
}

/// The mpirun command line for the run's ranks: the same hosts with as many ranks each, in
/// rank order; the same network (TCP on the run's subnets, or shared memory); ranks bound
/// to cores where a host runs more than it has, as tbbench binds its own; and the
/// dissemination barrier tbbench's timing loop uses, so each iteration starts alike. With
/// the command as one line for the result file.
fn mpirun(
    config: &CollConfig,
    ctx: &Context,
    jobs: &[Job],
    program: &std::path::Path,
    subnets: &[String],
) -> Result<(Command, String, Option<PathBuf>), String> {
    let n = ctx.size();
    // MPI's TCP transport connects every pair of ranks directly and routes nothing itself.
    if let Some(t) = ctx
        .network
        .topology
        .as_ref()
        .filter(|t| !t.unlinked.is_empty())
    {
        let pairs: Vec<String> = t
            .unlinked
            .iter()
            .map(|[a, b]| format!("{a}-{b} ({}-{})", ctx.rank_names[*a], ctx.rank_names[*b]))
            .collect();
        return Err(format!(
            "MPI connects every pair of ranks directly, and these have no cable: {}",
            pairs.join(", ")
        ));
    }
    let mpirun = std::env::var(ENV_MPIRUN).unwrap_or_else(|_| "mpirun".into());
    let mut args: Vec<String> = Vec::new();
    let mut agent_file = None;
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        args.push("--allow-run-as-root".into());
    }
    args.extend(["--oversubscribe".into(), "-np".into(), n.to_string()]);
    if !super::one_host(ctx) {
        // mpirun fills each host's slots in turn: the run's ranks must come host by host.
        let mut groups: Vec<(String, usize)> = Vec::new();
        for name in &ctx.rank_names {
            match groups.last_mut() {
                Some((h, k)) if h == name => *k += 1,
                _ => groups.push((name.clone(), 1)),
            }
        }
        let distinct = {
            let mut names: Vec<&String> = groups.iter().map(|(h, _)| h).collect();
            names.sort();
            names.dedup();
            names.len()
        };
        if distinct != groups.len() {
            return Err(
                "mpirun places ranks host by host, and this run's ranks alternate between hosts"
                    .into(),
            );
        }
        let hosts: Vec<String> = groups.iter().map(|(h, k)| format!("{h}:{k}")).collect();
        args.extend(["--host".into(), hosts.join(",")]);
        // The hosts are reached as tbbench reached them (ssh with its options, or the lab's
        // `ip netns exec`).
        let (agent, file) = rsh_agent(&ctx.rsh)?;
        agent_file = file;
        args.extend(["--mca".into(), "plm_rsh_agent".into(), agent]);
    }
    let net = &ctx.network;
    match net.transport.as_str() {
        "shm" => args.extend(["--mca", "btl", "vader,self"].map(String::from)),
        "tcp" => {
            args.extend(["--mca", "pml", "ob1", "--mca", "btl", "tcp,self"].map(String::from));
            if !subnets.is_empty() {
                args.extend([
                    "--mca".into(),
                    "btl_tcp_if_include".into(),
                    subnets.join(","),
                ]);
            }
        }
        // Over RDMA the library takes what it finds (UCX, or its own verbs component).
        _ => {}
    }
    // Hosts that are one machine's namespaces or containers (the lab's) each get a daemon of
    // their own that binds its first rank to the machine's first core: every rank on one
    // core. They stay unbound; elsewhere ranks are bound as tbbench binds its own.
    let shared_machine = (0..n).any(|a| {
        (0..n).any(|b| {
            ctx.rank_names[a] != ctx.rank_names[b] && ctx.rank_hosts[a] == ctx.rank_hosts[b]
        })
    });
    if shared_machine {
        // Unbound, and without the daemons' hwloc run-time control, whose shared topology
        // segment OpenMPI 4.1's daemons crash on now and then when several share a machine.
        args.extend(["--bind-to", "none", "--mca", "rtc", "^hwloc"].map(String::from));
    } else if ctx.oversubscribed().is_some() {
        args.extend(["--bind-to".into(), "core:overload-allowed".into()]);
    }
    args.extend(
        [
            "--mca",
            "coll_tuned_use_dynamic_rules",
            "1",
            "--mca",
            "coll_tuned_barrier_algorithm",
            "4",
        ]
        .map(String::from),
    );
    args.push(program.display().to_string());
    args.extend([
        config.dtype.name().to_string(),
        redop_str(config.redop).to_string(),
        config.root.to_string(),
        config.warmup.to_string(),
        config.iters.to_string(),
    ]);
    args.extend(jobs.iter().map(|j| format!("{}:{}", j.op.name(), j.count)));
    let shown = format!(
        "{mpirun} {}",
        args.iter()
            .take_while(|a| a.as_str() != program.display().to_string())
            .cloned()
            .collect::<Vec<_>>()
            .join(" ")
    ) + " mpi_coll ...";
    let mut cmd = Command::new(&mpirun);
    cmd.args(&args);
    clean_env(&mut cmd);
    Ok((cmd, shown, agent_file))
}
