//! The launcher: starts every rank (local processes, or through ssh / any `--rsh` agent for
//! hostfile hosts), hands each the session token on its stdin, relays rank 0's output, writes
//! the result file rank 0 sends back, and makes sure no rank outlives the run.
//!
//! Ranks watch their stdin: when the launcher goes away (Ctrl-C, kill, lost ssh), stdin
//! closes and they exit, so nothing is orphaned on any host.

use crate::hostfile::{place_ranks, read_hostfile, HostEntry};
use crate::links::{HostCables, ENV_CABLES};
use crate::options::RunOptions;
use crate::rendezvous::LIVENESS;
use crate::session::Token;
use crate::session::{EXIT_RANK0_LOST, EXIT_RANK0_SILENT};
use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Lines rank 0 writes for the launcher, not for the user, start with this.
pub const PROTOCOL_PREFIX: &str = "\u{1e}TBBENCH ";
/// Rank 0's heartbeat to the launcher (after the prefix), every `HEARTBEAT` from its start:
/// once the other ranks have ended, nothing else would notice a frozen rank 0.
pub const PROTOCOL_ALIVE: &str = "ALIVE";

pub const ENV_RANK: &str = "TBBENCH_RANK";
pub const ENV_SIZE: &str = "TBBENCH_SIZE";
pub const ENV_LABEL: &str = "TBBENCH_LABEL";
pub const ENV_ADDR: &str = "TBBENCH_ADDR";
/// The hostfile's `envs` as a JSON list, for the result's `params.hostfile_envs`.
pub const ENV_HOSTFILE_ENVS: &str = "TBBENCH_HOSTFILE_ENVS";
/// Set by the hpl suite's kernels where tbbench chose OPENBLAS_CORETYPE for this host (the
/// runner knows its name only, so as not to depend on the suite).
const ENV_OPENBLAS_DETECTED: &str = "TBBENCH_OPENBLAS_DETECTED";
pub const ENV_RDV: &str = "TBBENCH_RDV";
/// Set when the token arrives on stdin (and stdin closing means the launcher is gone).
pub const ENV_LAUNCHED: &str = "TBBENCH_LAUNCHED";
/// Token in the environment, for starting ranks by hand.
pub const ENV_TOKEN: &str = "TBBENCH_TOKEN";
/// Which network of `--over` the ranks of this run use (an index into the list).
pub const ENV_NETWORK: &str = "TBBENCH_NETWORK";

/// Where one rank goes.
#[derive(Debug, Clone)]
struct Placement {
    /// None: a process on this machine.
    host: Option<HostEntry>,
    label: String,
    addr: Option<String>,
    /// Its host's index in the hostfile and the cables the file names ([`ENV_CABLES`]).
    cables: Option<HostCables>,
    /// The hostfile's `envs` (MLX's object form), set on the rank and recorded.
    envs: Vec<String>,
}

/// A rank's host as the ranks' own lines name it: a local rank by this machine's name, a
/// remote one by its hostfile entry.
fn shown_name(p: &Placement) -> String {
    match (&p.host, p.label.as_str()) {
        (None, "localhost") => crate::sysinfo::hostname().unwrap_or_else(|| "localhost".into()),
        (_, label) => label.to_string(),
    }
}

fn is_local(host: &str) -> bool {
    matches!(host, "localhost" | "127.0.0.1" | "::1" | "[::1]")
}

/// The address a hostfile host names itself by, if it is one: `10.0.0.2`, `user@10.0.0.2`,
/// `[fe80::1]`, `::1`.
fn address_literal(host: &str) -> Option<std::net::IpAddr> {
    let bare = host.rsplit('@').next().unwrap_or(host);
    bare.strip_prefix('[')
        .and_then(|b| b.strip_suffix(']'))
        .unwrap_or(bare)
        .parse()
        .ok()
}

/// The most ranks one run takes: far beyond the 2-8 machines tbbench is for, and small enough
/// that every rank's table, connections and buffers stay modest.
pub const MAX_RANKS: usize = 1024;
/// What a rank process holds at the least (binary, stacks, buffers of the rendezvous), for
/// telling before the start how many this host can hold.
const RANK_MIN_BYTES: u64 = 32 << 20;
/// Local ranks per core beyond which a run must be asked for with --oversubscribe: such runs
/// measure the scheduler, not the network, and a mistyped count floods the machine.
const OVERSUBSCRIBE_FACTOR: usize = 4;

/// Refuses, before anything starts, a rank count this host cannot start (file descriptors for
/// the full mesh, memory for the processes) or did not mean to (far more ranks than cores).
fn check_local_ranks(local: usize, opts: &RunOptions) -> Result<()> {
    let host = crate::sysinfo::this_host();
    let cores = host.cores_logical.max(1);
    if local > cores * OVERSUBSCRIBE_FACTOR && !opts.oversubscribe {
        bail!(
            "{local} ranks on this host's {cores} cores (more than {OVERSUBSCRIBE_FACTOR} a core): \
             pass --oversubscribe to run them anyway, or use --hostfile"
        );
    }
    // Rank 0 holds a control connection to every rank and `streams` data connections to each
    // peer (left to the run, as the ranks here will choose: they all share this host's
    // default congestion control); the launcher holds two pipes a rank.
    let streams = opts.streams.unwrap_or_else(|| {
        crate::transport::tcp::auto_streams_for(
            opts.congestion.as_deref(),
            [host.tcp_congestion_control.as_deref()],
            opts.streams_when_paced,
        )
    });
    let fds_needed = (local.saturating_sub(1))
        .saturating_mul(streams.saturating_add(1))
        .saturating_add(64);
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0
        && (fds_needed as u64) > lim.rlim_cur
    {
        bail!(
            "{local} ranks need about {fds_needed} open files each, above this shell's limit of {} \
             (raise it with `ulimit -n`, or run fewer ranks)",
            lim.rlim_cur
        );
    }
    let available = host.memory_available_bytes;
    if available > 0 && (local as u64).saturating_mul(RANK_MIN_BYTES) > available {
        bail!(
            "{local} ranks need at least {} MiB of memory on this host, which has {} MiB available \
             (at most {} ranks fit)",
            (local as u64).saturating_mul(RANK_MIN_BYTES) >> 20,
            available >> 20,
            available / RANK_MIN_BYTES
        );
    }
    Ok(())
}

fn plan(opts: &RunOptions) -> Result<Vec<Placement>> {
    if opts.nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    if opts.nodes > MAX_RANKS {
        bail!(
            "--nodes {} is more ranks than tbbench runs (at most {MAX_RANKS})",
            opts.nodes
        );
    }
    let Some(path) = &opts.hostfile else {
        check_local_ranks(opts.nodes, opts)?;
        let addr = match (&opts.net.addr, &opts.net.iface) {
            (Some(a), _) => Some(a.to_string()),
            (None, Some(_)) => None,
            (None, None) => Some("127.0.0.1".to_string()),
        };
        return Ok((0..opts.nodes)
            .map(|_| Placement {
                host: None,
                label: "localhost".into(),
                addr: addr.clone(),
                cables: None,
                envs: vec![],
            })
            .collect());
    };
    let file = read_hostfile(path)?;
    for note in &file.notes {
        eprintln!("tbbench: note: hostfile {}: {note}", path.display());
    }
    let hosts = &file.hosts;
    let placed =
        place_ranks(hosts, opts.nodes).with_context(|| format!("hostfile {}", path.display()))?;
    let all_local = placed.iter().all(|i| is_local(&hosts[*i].name));
    check_local_ranks(
        placed.iter().filter(|i| is_local(&hosts[**i].name)).count(),
        opts,
    )?;
    Ok(placed
        .into_iter()
        .map(|i| {
            let h = hosts[i].clone();
            let local = is_local(&h.name);
            // A host given as an address is reached there (an IPv6 one included, which rank
            // 0 must listen on: its default is IPv4's any-address). Loopback only when every
            // rank is here: a remote rank cannot reach 127.0.0.1.
            let addr = h.ips.first().cloned().or_else(|| {
                if let Some(ip) = address_literal(&h.name) {
                    Some(ip.to_string())
                } else if local && all_local {
                    Some("127.0.0.1".into())
                } else {
                    None
                }
            });
            Placement {
                label: h.name.clone(),
                cables: Some(HostCables {
                    host: i,
                    hints: h.cables.clone(),
                    backend: file.backend.clone(),
                }),
                envs: file.envs.clone(),
                host: if local { None } else { Some(h) },
                addr,
            }
        })
        .collect())
}

/// Quotes one word for a POSIX shell.
pub(crate) fn sh_quote(w: &str) -> String {
    if !w.is_empty()
        && w.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:@,+".contains(&b))
    {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', r"'\''"))
    }
}

/// The command that starts one rank. Remote shells that hand the command to a shell (ssh,
/// rsh) get it as one quoted string; other agents (`ip netns exec`, `docker exec`) get argv.
fn rank_command(
    p: &Placement,
    rank: usize,
    size: usize,
    opts: &RunOptions,
    rdv: Option<&str>,
) -> Result<Command> {
    let exe = match &opts.exe {
        Some(e) => e.clone(),
        None => std::env::current_exe().context("cannot find this tbbench binary")?,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut env = vec![
        (ENV_RANK, rank.to_string()),
        (ENV_SIZE, size.to_string()),
        (ENV_LABEL, p.label.clone()),
        (ENV_LAUNCHED, "1".into()),
    ];
    if let Some(a) = &p.addr {
        env.push((ENV_ADDR, a.clone()));
    }
    if let Some(c) = &p.cables {
        env.push((ENV_CABLES, serde_json::to_string(c)?));
    }
    if !p.envs.is_empty() {
        env.push((ENV_HOSTFILE_ENVS, serde_json::to_string(&p.envs)?));
    }
    if let Some(r) = rdv {
        env.push((ENV_RDV, r.to_string()));
    }
    if let Some(i) = opts.network_index {
        env.push((ENV_NETWORK, i.to_string()));
    }
    env.push((
        crate::options::ENV_DATA_NETWORK,
        serde_json::to_string(&opts.net)?,
    ));
    // From the flag or the launcher's environment: ranks on other hosts see neither otherwise
    // (an ssh session does not carry the environment).
    if let Some(lib) = &opts.verbs_lib {
        env.push((
            crate::options::ENV_VERBS_LIB,
            lib.to_string_lossy().into_owned(),
        ));
    }
    // The hostfile's own variables (MLX_METAL_FAST_SYNCH=1 and the like), as mlx.launch sets
    // them; parse_hostfile checked each is KEY=VALUE.
    let file_envs: Vec<(String, String)> = p
        .envs
        .iter()
        .filter_map(|e| e.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let Some(host) = &p.host else {
        let mut c = Command::new(exe);
        c.args(&args);
        for (k, v) in &file_envs {
            c.env(k, v);
        }
        for (k, v) in env {
            c.env(k, v);
        }
        return Ok(c);
    };
    let agent: Vec<&str> = opts.rsh.split_whitespace().collect();
    let Some((prog, agent_args)) = agent.split_first() else {
        bail!("--rsh is empty");
    };
    let mut argv: Vec<String> = vec!["env".into()];
    // The OpenBLAS kernel tbbench chose for this host is this host's: a remote shell that
    // forwards the environment must not carry it to a host with another CPU.
    if std::env::var_os(ENV_OPENBLAS_DETECTED).is_some() {
        for v in ["OPENBLAS_CORETYPE", ENV_OPENBLAS_DETECTED] {
            argv.extend(["-u".to_string(), v.to_string()]);
        }
    }
    argv.extend(file_envs.iter().map(|(k, v)| format!("{k}={v}")));
    argv.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    argv.push(exe.to_string_lossy().into_owned());
    argv.extend(args);
    let mut c = Command::new(prog);
    c.args(agent_args).arg(&host.name);
    let base = std::path::Path::new(prog)
        .file_name()
        .and_then(|s| s.to_str())
        .unwrap_or("");
    if matches!(base, "ssh" | "rsh" | "oarsh") {
        c.arg(
            argv.iter()
                .map(|w| sh_quote(w))
                .collect::<Vec<_>>()
                .join(" "),
        );
    } else {
        c.args(argv);
    }
    Ok(c)
}

struct Rank {
    child: Child,
    label: String,
    status: Option<ExitStatus>,
}

/// Set by Ctrl-C. One flag for the whole process, installed once: a `--over` run launches
/// several times, and the handler can only be set once.
fn interrupted() -> Arc<AtomicBool> {
    static FLAG: std::sync::OnceLock<Arc<AtomicBool>> = std::sync::OnceLock::new();
    FLAG.get_or_init(|| {
        let flag = Arc::new(AtomicBool::new(false));
        let f = flag.clone();
        // Ctrl-C: local ranks get the signal from the terminal too; the launcher makes sure
        // remote ones stop by closing their stdin (killing the ssh clients).
        let _ = ctrlc::set_handler(move || f.store(true, Ordering::SeqCst));
        flag
    })
    .clone()
}

/// Runs the whole job once per network: the networks of `--over`, or the one the flags name
/// (a run on one network is `--over` with one entry). Several networks write one result file
/// each into the `--out` folder and then put their figures side by side; one writes `--out`.
pub fn launch(opts: &RunOptions, suite: &str) -> Result<i32> {
    let networks: Vec<(String, RunOptions)> = if opts.over.is_empty() {
        vec![(opts.net.spec(), opts.clone())]
    } else {
        (0..opts.over.len())
            .map(|i| (opts.over[i].spec.clone(), opts.on_network(i)))
            .collect()
    };
    let n = networks.len();
    let folder = if n > 1 {
        let dir = opts.out.clone().unwrap_or_else(|| PathBuf::from("results"));
        if dir.is_file() || dir.extension().is_some_and(|e| e == "json") {
            bail!(
                "with --over, --out names a folder (one result per network), not {}",
                dir.display()
            );
        }
        tbbench_schema::write::check_folder_writable(&dir)?;
        let stamp = tbbench_schema::write::default_path(suite, time::OffsetDateTime::now_utc());
        let stem = stamp
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        Some((dir, stem))
    } else {
        None
    };
    let mut written = Vec::new();
    let mut failed = Vec::new();
    let mut unverified = Vec::new();
    for (i, (spec, mut o)) in networks.into_iter().enumerate() {
        if let Some((dir, stem)) = &folder {
            let slug = opts.over[i].slug();
            o.out = Some(dir.join(format!("{stem}-{}-{slug}.json", i + 1)));
            o.out_generated = true;
            println!("\n== network {}/{n}: {spec} ==", i + 1);
        }
        let code = match launch_once(&o, suite) {
            Ok(code) => code,
            Err(e) if n == 1 => return Err(e),
            Err(e) => {
                eprintln!("tbbench: error: network {spec}: {e:#}");
                1
            }
        };
        if n == 1 {
            return Ok(code);
        }
        if code == 130 || interrupted().load(Ordering::SeqCst) {
            return Ok(130);
        }
        // The file this network's run wrote, where it wrote one (never a file of the same
        // name another run left).
        let wrote = written_path();
        if code != 0 {
            // A run that wrote its result and exits 1 ran, and its checks failed (a doctor
            // that found problems); one that wrote nothing did not run through.
            if wrote.is_some() {
                unverified.push(spec);
            } else {
                failed.push(spec);
            }
        }
        written.extend(wrote);
    }
    if !written.is_empty() {
        if let Some(table) = SIDE_BY_SIDE.get() {
            println!("\n== side by side ==");
            print!("{}", table(&written));
        }
        for p in &written {
            println!("result: {}", p.display());
        }
    }
    if failed.is_empty() && unverified.is_empty() {
        return Ok(0);
    }
    let mut parts = Vec::new();
    if !failed.is_empty() {
        parts.push(format!(
            "{} did not run through ({})",
            failed.len(),
            failed.join(", ")
        ));
    }
    if !unverified.is_empty() {
        parts.push(format!(
            "{} ran and failed its checks ({}; the result says which)",
            unverified.len(),
            unverified.join(", ")
        ));
    }
    eprintln!("tbbench: error: of {n} networks, {}", parts.join(" and "));
    Ok(1)
}

/// Renders the key figures of result files side by side, a column per file.
pub type SideBySide = fn(&[PathBuf]) -> String;

/// How `--over` shows its networks side by side. Which figures are worth comparing is the
/// report layer's knowledge (each suite's view), and the runner does not depend on it: the
/// program that has both plugs it in. Without one, `--over` lists its result files only.
static SIDE_BY_SIDE: std::sync::OnceLock<SideBySide> = std::sync::OnceLock::new();

/// Sets the table `--over` prints after its runs; the first call wins.
pub fn set_side_by_side(table: SideBySide) {
    let _ = SIDE_BY_SIDE.set(table);
}

/// Runs the whole job on one network from this process; returns the exit code for the user.
fn launch_once(opts: &RunOptions, suite: &str) -> Result<i32> {
    // Nothing written yet by this network's run (`written_path`).
    *WRITTEN.lock().unwrap_or_else(|e| e.into_inner()) = None;
    let placements = plan(opts)?;
    // The network, built once here from the flags and the hostfile, goes to every rank as is.
    let names_devices = placements
        .iter()
        .flat_map(|p| p.cables.iter())
        .any(|c| !c.devices().is_empty());
    let opts = &RunOptions {
        net: opts.net.clone().with_hostfile_devices(names_devices),
        ..opts.clone()
    };
    let token = Token::random()?;
    let result = run_ranks(opts, suite, placements, &token);
    // Ranks killed before they all attached (Ctrl-C, a failed start) leave rank 0's shm
    // segment; shm ranks share this host's /dev/shm, so the launcher can always remove it.
    // (Only shm runs make one; the name is the session's, so other runs remove nothing.)
    crate::transport::shm::unlink_segment(&token.0);
    result
}

fn run_ranks(
    opts: &RunOptions,
    suite: &str,
    placements: Vec<Placement>,
    token: &Token,
) -> Result<i32> {
    let size = placements.len();
    let interrupted = interrupted();
    // A name the launcher chose (a time stamp) never replaces another run's file.
    let fresh = opts.out.is_none() || opts.out_generated;
    let out_path = opts.out.clone().unwrap_or_else(|| {
        tbbench_schema::write::default_path(suite, time::OffsetDateTime::now_utc())
    });
    // Before the run, not after it: a measurement that cannot be saved is lost.
    tbbench_schema::write::check_writable(&out_path)?;

    let mut ranks: Vec<Rank> = Vec::with_capacity(size);
    let (line_tx, line_rx) = mpsc::channel::<String>();
    let r0 = spawn(
        &placements[0],
        0,
        size,
        opts,
        None,
        token,
        true,
        Some(line_tx),
    )?;
    ranks.push(r0);

    // When rank 0 was last heard from (any line, its heartbeat included); None until its
    // first line, as a remote shell may take a while to start it.
    let mut rank0_heard: Option<Instant> = None;
    // Rank 0 reports its rendezvous port first; everything else waits for that.
    let deadline = Instant::now() + opts.timeout + Duration::from_secs(10);
    let rdv_port = loop {
        if interrupted.load(Ordering::SeqCst) {
            return Ok(stop_all(&mut ranks, "interrupted", 130));
        }
        match line_rx.recv_timeout(Duration::from_millis(50)) {
            Ok(line) => {
                rank0_heard = Some(Instant::now());
                if is_alive(&line) {
                    continue;
                }
                if let Some(rest) = line.strip_prefix(&format!("{PROTOCOL_PREFIX}RENDEZVOUS ")) {
                    break rest
                        .trim()
                        .parse::<u16>()
                        .map_err(|_| anyhow!("rank 0 reported a bad rendezvous port '{rest}'"))?;
                }
                println!("{line}");
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Some(msg) = rank0_silent(rank0_heard, &placements[0]) {
                    return Ok(stop_all(&mut ranks, &msg, 1));
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let st = ranks[0].child.wait()?;
                if interrupted.load(Ordering::SeqCst) {
                    // Ctrl-C reached rank 0 too (one process group): not a failure of its own.
                    return Ok(stop_all(&mut ranks, "interrupted: stopped every rank", 130));
                }
                let signal = std::os::unix::process::ExitStatusExt::signal(&st);
                if placements[0].host.is_none() && signal.is_some() {
                    // A local rank 0 killed before it could say anything.
                    crate::gate::say(&format!(
                        "tbbench: error: rank 0 ({}) died before the rendezvous ({st})",
                        shown_name(&placements[0])
                    ));
                    return Ok(1);
                }
                // A local rank 0 printed its own error line. A remote one may not have started
                // at all (the remote shell failed), so the launcher names the host.
                if placements[0].host.is_some() || st.code().unwrap_or(0) == 0 {
                    eprintln!(
                        "tbbench: error: rank 0 ({}) exited before the rendezvous ({st}); check that `{} {}` works",
                        ranks[0].label, opts.rsh, ranks[0].label
                    );
                }
                return Ok(exit_code_of(st));
            }
        }
        if Instant::now() > deadline {
            let msg = format!(
                "rank 0 ({}) did not start within {:.0} s",
                shown_name(&placements[0]),
                (opts.timeout + Duration::from_secs(10)).as_secs_f64()
            );
            return Ok(stop_all(&mut ranks, &msg, 1));
        }
    };
    let host0 = match &placements[0].addr {
        Some(a) => a.clone(),
        None => match &placements[0].host {
            Some(h) => h.name.rsplit('@').next().unwrap_or(&h.name).to_string(),
            // Rank 0 is here but others are remote: they reach it by this machine's name.
            None => crate::sysinfo::this_host().hostname,
        },
    };
    let rdv = if host0.contains(':') {
        format!("[{host0}]:{rdv_port}")
    } else {
        format!("{host0}:{rdv_port}")
    };
    for (r, p) in placements.iter().enumerate().skip(1) {
        match spawn(p, r, size, opts, Some(&rdv), token, false, None) {
            Ok(rank) => ranks.push(rank),
            Err(e) => {
                let msg = format!("cannot start rank {r} ({}): {e:#}", p.label);
                return Ok(stop_all(&mut ranks, &msg, 1));
            }
        }
    }

    let names: Vec<String> = placements.iter().map(shown_name).collect();
    let rank0 = names[0].clone();
    let mut first_failure: Option<(usize, Instant)> = None;
    // A rank that lost rank 0 while rank 0 still runs: which way, and when it said so.
    let mut rank0_lost: Option<(i32, Instant)> = None;
    let mut wrote_result = false;
    let mut cut_off = false;
    let mut take = |relayed: Relayed| match relayed {
        Relayed::Result => wrote_result = true,
        Relayed::CutOff => cut_off = true,
        Relayed::Text | Relayed::Heartbeat => {}
    };
    loop {
        while let Ok(line) = line_rx.try_recv() {
            rank0_heard = Some(Instant::now());
            take(relay(&line, &out_path, fresh)?);
        }
        if interrupted.load(Ordering::SeqCst) {
            if wrote_result {
                // The result was whole and written before the interrupt: it stands.
                stop_all(&mut ranks, "interrupted after the result was written", 130);
                println!(
                    "result: {}",
                    written_path().unwrap_or_else(|| out_path.clone()).display()
                );
                return Ok(0);
            }
            return Ok(stop_all(&mut ranks, "interrupted: stopped every rank", 130));
        }
        for (r, rank) in ranks.iter_mut().enumerate() {
            if rank.status.is_none() {
                if let Some(st) = rank.child.try_wait()? {
                    rank.status = Some(st);
                    if r > 0 && lost_rank0(st).is_some() {
                        rank0_lost.get_or_insert((st.code().unwrap_or(0), Instant::now()));
                    } else if !st.success() && first_failure.is_none() {
                        first_failure = Some((r, Instant::now()));
                    }
                }
            }
        }
        if let Some(st0) = ranks[0].status {
            // Drain what rank 0 printed last, then give the others a moment to finish.
            for line in line_rx.iter() {
                take(relay(&line, &out_path, fresh)?);
            }
            let grace = Instant::now() + Duration::from_secs(3);
            while Instant::now() < grace && poll_statuses(&mut ranks) {
                std::thread::sleep(Duration::from_millis(20));
            }
            for r in ranks.iter_mut() {
                let _ = r.child.kill();
                let _ = r.child.wait();
            }
            // A Ctrl-C reaches the ranks too (one process group), and rank 0 may be gone
            // before this process's handler has said so: it is still the interrupt, and says
            // so in its one line.
            if interrupted.load(Ordering::SeqCst) && !wrote_result && !cut_off {
                return Ok(stop_all(&mut ranks, "interrupted: stopped every rank", 130));
            }
            // Rank 0 names the cause itself whenever it exits (its error line); killed by a
            // signal it could not, and the others only saw it go: one line here.
            let killed = std::os::unix::process::ExitStatusExt::signal(&st0).is_some();
            let died = killed && !interrupted.load(Ordering::SeqCst);
            // A run whose verification failed still wrote its file, which says why.
            if wrote_result {
                println!(
                    "result: {}",
                    written_path().unwrap_or_else(|| out_path.clone()).display()
                );
            } else if cut_off {
                crate::gate::say(&format!(
                    "tbbench: error: rank 0 ({rank0}) died ({st0}) while handing over its result; no result file written"
                ));
                return Ok(exit_code_of(st0));
            } else if died {
                crate::gate::say(&format!(
                    "tbbench: error: rank 0 ({rank0}) died ({st0}); no result file written"
                ));
                return Ok(exit_code_of(st0));
            }
            return Ok(if st0.success() { 0 } else { exit_code_of(st0) });
        }
        if let Some((code, at)) = rank0_lost {
            // Rank 0 may be dying this moment (the others saw its connections close first);
            // after that it is frozen or cut off, and the line must name it, not the rank
            // that noticed.
            if at.elapsed() > Duration::from_secs(1) {
                let msg = if code == EXIT_RANK0_SILENT {
                    silent_line(&rank0)
                } else {
                    format!("rank 0 ({rank0}) dropped its control connections")
                };
                return Ok(stop_all(&mut ranks, &msg, 1));
            }
        }
        // Rank 0 frozen (stopped, swapped out, its host hung) once the others have ended
        // cleanly: no rank is left to notice, so the launcher does, by its heartbeat.
        if ranks[0].status.is_none() {
            if let Some(msg) = rank0_silent(rank0_heard, &placements[0]) {
                return Ok(stop_all(&mut ranks, &msg, 1));
            }
        }
        if let Some((r, at)) = first_failure {
            // Rank 0 notices a dead rank within LIVENESS and ends the run with a message;
            // this is the backstop for when it cannot.
            if at.elapsed() > LIVENESS + Duration::from_secs(5) {
                let st = ranks[r].status.map(|s| s.to_string()).unwrap_or_default();
                let msg = format!(
                    "rank {r} ({}) exited ({st}) and rank 0 did not end the run",
                    names[r]
                );
                return Ok(stop_all(&mut ranks, &msg, 1));
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a line from rank 0 is its heartbeat (for the launcher alone).
fn is_alive(line: &str) -> bool {
    line.strip_prefix(PROTOCOL_PREFIX) == Some(PROTOCOL_ALIVE)
}

/// The error line for a rank 0 not heard from for `LIVENESS` (its heartbeat comes every
/// `HEARTBEAT`), if that is so.
fn rank0_silent(heard: Option<Instant>, p: &Placement) -> Option<String> {
    heard
        .filter(|at| at.elapsed() > LIVENESS)
        .map(|_| silent_line(&shown_name(p)))
}

/// The one line for a rank 0 that stopped answering, whoever noticed.
fn silent_line(rank0: &str) -> String {
    format!(
        "rank 0 ({rank0}) stopped answering (no heartbeat for {} s)",
        LIVENESS.as_secs()
    )
}

/// The exit code by which a rank said it lost rank 0, if it did.
fn lost_rank0(st: ExitStatus) -> Option<i32> {
    st.code()
        .filter(|c| *c == EXIT_RANK0_LOST || *c == EXIT_RANK0_SILENT)
}

/// Records the status of every rank that has exited; true while any still runs.
fn poll_statuses(ranks: &mut [Rank]) -> bool {
    let mut running = false;
    for r in ranks.iter_mut().filter(|r| r.status.is_none()) {
        match r.child.try_wait() {
            Ok(Some(st)) => r.status = Some(st),
            Ok(None) => running = true,
            Err(_) => {}
        }
    }
    running
}

/// What one line of rank 0's output was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Relayed {
    /// Output for the user, printed.
    Text,
    /// The result, whole, and now written.
    Result,
    /// A result line that does not parse: rank 0 was cut off while sending it.
    CutOff,
    /// Rank 0's heartbeat: not shown.
    Heartbeat,
}

/// Passes one line of rank 0's output on to the user, or writes the result it carries. Only a
/// result that parses whole as a result file is written: a line cut off when rank 0 died
/// leaves no file at all.
/// Where the last result a launcher relayed went: its `--out`, or for a name the launcher
/// chose itself the first free one (`write_fresh`: never over another run's file).
static WRITTEN: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);

/// The file the last result this process relayed went to, None where the last run wrote none:
/// a name the launcher chose may have taken a `-2` to keep clear of another run's file.
pub fn written_path() -> Option<PathBuf> {
    WRITTEN.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

fn relay(line: &str, out_path: &std::path::Path, fresh: bool) -> Result<Relayed> {
    if is_alive(line) {
        return Ok(Relayed::Heartbeat);
    }
    match line.strip_prefix(&format!("{PROTOCOL_PREFIX}RESULT ")) {
        Some(json) => {
            // Written as rank 0 sent it (every key, in order), once it reads as a result file.
            let whole = serde_json::from_str::<serde_json::Value>(json)
                .ok()
                .filter(|v| tbbench_schema::ResultFile::deserialize(v).is_ok());
            let Some(value) = whole else {
                return Ok(Relayed::CutOff);
            };
            let mut bytes = serde_json::to_vec_pretty(&value)?;
            bytes.push(b'\n');
            let path = if fresh {
                tbbench_schema::write::write_fresh(out_path, &bytes)?
            } else {
                tbbench_schema::write::write_atomic(out_path, &bytes)?;
                out_path.to_path_buf()
            };
            *WRITTEN.lock().unwrap_or_else(|e| e.into_inner()) = Some(path);
            Ok(Relayed::Result)
        }
        None => {
            println!("{line}");
            Ok(Relayed::Text)
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn spawn(
    p: &Placement,
    rank: usize,
    size: usize,
    opts: &RunOptions,
    rdv: Option<&str>,
    token: &Token,
    capture: bool,
    lines: Option<mpsc::Sender<String>>,
) -> Result<Rank> {
    let mut cmd = rank_command(p, rank, size, opts, rdv)?;
    cmd.stdin(Stdio::piped()).stderr(Stdio::inherit());
    cmd.stdout(if capture {
        Stdio::piped()
    } else {
        Stdio::inherit()
    });
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {:?}", cmd.get_program()))?;
    let mut stdin = child.stdin.take().context("no stdin pipe")?;
    // The token goes over the pipe, never on a command line where `ps` would show it. The pipe
    // then stays open (leaked on purpose) until this process exits: its closing is the signal.
    if writeln!(stdin, "{}", token.hex()).is_err() {
        // The rank was gone before it could read a line: a remote shell that could not reach
        // the host, or a binary that does not run there.
        let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
        let hint = if p.host.is_some() {
            format!("; check that `{} {}` works", opts.rsh, p.label)
        } else {
            String::new()
        };
        bail!(
            "rank {rank} ({}) exited as it started ({status}){hint}",
            p.label
        );
    }
    std::mem::forget(stdin);
    if let (Some(out), Some(tx)) = (child.stdout.take(), lines) {
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                match line {
                    Ok(l) => {
                        if tx.send(l).is_err() {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
        });
    }
    Ok(Rank {
        child,
        label: p.label.clone(),
        status: None,
    })
}

/// The launcher's exit code for a rank 0 that failed: tbbench's own codes (1 an error, 2 a
/// usage error, 130 interrupted) pass through; anything else, such as ssh's 255 for a host it
/// could not reach, or a signal, is 1, as the commands promise.
fn exit_code_of(st: ExitStatus) -> i32 {
    st.code().filter(|c| matches!(c, 1 | 2 | 130)).unwrap_or(1)
}

fn stop_all(ranks: &mut [Rank], message: &str, code: i32) -> i32 {
    for r in ranks.iter_mut() {
        let _ = r.child.kill();
    }
    for r in ranks.iter_mut() {
        let _ = r.child.wait();
    }
    crate::gate::say(&format!(
        "tbbench: {}{message}",
        if code == 130 { "" } else { "error: " }
    ));
    code
}

/// The result path a launcher-less rank 0 (started by hand or by mpirun) writes to.
pub fn standalone_out(opts: &RunOptions, suite: &str) -> PathBuf {
    opts.out.clone().unwrap_or_else(|| {
        tbbench_schema::write::default_path(suite, time::OffsetDateTime::now_utc())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quoting_survives_spaces_and_quotes() {
        assert_eq!(sh_quote("plain-word_1.2"), "plain-word_1.2");
        assert_eq!(sh_quote("two words"), "'two words'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        assert_eq!(sh_quote(""), "''");
    }

    #[test]
    fn local_plan_defaults_to_loopback() {
        let opts = RunOptions {
            nodes: 3,
            ..Default::default()
        };
        let p = plan(&opts).unwrap();
        assert_eq!(p.len(), 3);
        assert!(p
            .iter()
            .all(|x| x.host.is_none() && x.addr.as_deref() == Some("127.0.0.1")));
        assert!(plan(&RunOptions {
            nodes: 0,
            ..Default::default()
        })
        .is_err());
    }

    #[test]
    fn a_result_cut_off_mid_line_writes_no_file() {
        let dir = std::env::temp_dir().join(format!("tbbench-relay-{}", std::process::id()));
        let out = dir.join("r.json");
        let whole = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fixtures/results/network/link-tcp-loopback.json"
        ))
        .unwrap();
        let one_line: String =
            serde_json::to_string(&serde_json::from_str::<serde_json::Value>(&whole).unwrap())
                .unwrap();
        for cut in [1, one_line.len() / 2, one_line.len() - 1] {
            let line = format!("{PROTOCOL_PREFIX}RESULT {}", &one_line[..cut]);
            assert_eq!(
                relay(&line, &out, false).unwrap(),
                Relayed::CutOff,
                "cut at {cut}"
            );
            assert!(!out.exists(), "cut at {cut} wrote a file");
        }
        let line = format!("{PROTOCOL_PREFIX}RESULT {one_line}");
        assert_eq!(relay(&line, &out, false).unwrap(), Relayed::Result);
        let written: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        assert_eq!(
            written,
            serde_json::from_str::<serde_json::Value>(&whole).unwrap()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn rank_counts_the_host_cannot_start_are_refused_up_front() {
        let err = |nodes, oversubscribe| {
            format!(
                "{:#}",
                plan(&RunOptions {
                    nodes,
                    oversubscribe,
                    ..Default::default()
                })
                .unwrap_err()
            )
        };
        assert!(err(usize::MAX, true).contains("at most 1024"));
        assert!(err(100_000, true).contains("at most 1024"));
        let cores = crate::sysinfo::this_host().cores_logical;
        let many = cores * OVERSUBSCRIBE_FACTOR + 1;
        if many <= MAX_RANKS {
            assert!(err(many, false).contains("--oversubscribe"));
        }
    }
}
