//! Runs a suite: in the process the user started, as the launcher; in each rank process, as
//! the rank (rendezvous, transport, the suite, the result file). One generic function for every
//! suite, so adding a suite touches nothing here.

use crate::comm::Comm;
use crate::launch::{
    self, ENV_ADDR, ENV_LABEL, ENV_LAUNCHED, ENV_RANK, ENV_RDV, ENV_SIZE, ENV_TOKEN,
    PROTOCOL_ALIVE, PROTOCOL_PREFIX,
};
use crate::netinfo;
use crate::options::RunOptions;
use crate::rendezvous::{self, Control};
use crate::session::{Bootstrap, Launcher, PeerName, RankInfo, Token};
use crate::suite::{Context, Suite};
use crate::sysinfo;
use crate::transport::{self, shm, OpenPlan, Opened, Opening, Peers};
use anyhow::{anyhow, bail, Context as _, Result};
use std::io::{BufRead, Read};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::time::Duration;
use tbbench_schema::{Host, ResultFile, RunRecord, Tool};

/// True in a process started by a launcher (or by hand) as one rank.
pub fn is_rank_process() -> bool {
    std::env::var_os(ENV_RANK).is_some()
}

/// The world size where another launcher started this process as one of its ranks (mpirun,
/// an srun step of several tasks), whatever `--nodes` says.
pub fn size_from_launcher() -> Option<usize> {
    crate::slurm::step()
        .ok()
        .flatten()
        .map(|s| s.size)
        .or_else(crate::mpi_boot::mpirun_size)
}

/// Entry point for every suite: launches the ranks, or runs as one of them.
pub fn run<S: Suite>(config: &S::Config, opts: &RunOptions, tool: &Tool) -> Result<i32> {
    let opts = &RunOptions {
        streams_when_paced: S::STREAMS_WHEN_PACED,
        ..opts.clone()
    };
    if is_rank_process() {
        // A rank of one network of `--over`: the launcher says which, and hands it the network
        // as it built it (from the flags and the hostfile).
        let mut opts = match std::env::var(crate::launch::ENV_NETWORK) {
            Ok(i) if !opts.over.is_empty() => {
                let i: usize =
                    i.parse()
                        .ok()
                        .filter(|i| *i < opts.over.len())
                        .ok_or_else(|| {
                            anyhow!(
                                "{}={i} names no network of --over",
                                crate::launch::ENV_NETWORK
                            )
                        })?;
                opts.on_network(i)
            }
            _ => opts.clone(),
        };
        if let Ok(net) = std::env::var(crate::options::ENV_DATA_NETWORK) {
            opts.net = serde_json::from_str(&net).map_err(|e| {
                anyhow!(
                    "{}={net} is not what the launcher writes: {e}",
                    crate::options::ENV_DATA_NETWORK
                )
            })?;
        }
        return rank_main::<S>(config, &opts, tool, env_bootstrap()?);
    }
    if let Some(unused) = opts.tcp_flags_unused() {
        return Err(crate::cli::UsageError(unused).into());
    }
    if let Some(script) = &opts.slurm_script {
        return crate::slurm::write_script(opts, S::NAME, script);
    }
    // srun's tasks first: srun --mpi=pmi2 also sets PMI_SIZE, which reads as mpirun's.
    if let Some(step) = crate::slurm::step()? {
        let opts = one_network(opts, "srun")?;
        return rank_main::<S>(config, &opts, tool, crate::slurm::bootstrap(&opts, &step)?);
    }
    if let Some(size) = crate::mpi_boot::mpirun_size() {
        let opts = one_network(opts, "mpirun")?;
        return rank_main::<S>(
            config,
            &opts,
            tool,
            crate::mpi_boot::bootstrap(&opts, size)?,
        );
    }
    if let Some(job) = crate::slurm::job_without_step() {
        eprintln!(
            "tbbench: note: in Slurm job {job} but not started by srun: the ranks start on this node only (`srun tbbench {} ...` makes each task a rank)",
            S::NAME
        );
    }
    launch::launch(opts, S::NAME)
}

/// Ranks another launcher started run once, so on one network only.
fn one_network(opts: &RunOptions, launcher: &str) -> Result<RunOptions> {
    match opts.over.len() {
        0 => Ok(opts.clone()),
        1 => Ok(opts.on_network(0)),
        _ => bail!("--over with several networks is not supported under {launcher}: run once per network (--over NET or --transport, --iface)"),
    }
}

fn env_usize(name: &str) -> Result<usize> {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow!("{name} is not set to a number"))
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn env_bootstrap() -> Result<Bootstrap> {
    let rank = env_usize(ENV_RANK)?;
    let size = env_usize(ENV_SIZE)?;
    if rank >= size {
        bail!("{ENV_RANK}={rank} is not below {ENV_SIZE}={size}");
    }
    let launched = std::env::var(ENV_LAUNCHED).as_deref() == Ok("1");
    if launched {
        // Rank 0's stdout is a pipe to the launcher. When the launcher is gone, a write must
        // end this rank quietly (as SIGPIPE ends any Unix tool), not panic in println!, and
        // remove a shared-memory segment not every rank attached to yet; the stdin watcher
        // below ends the others the same way.
        extern "C" fn on_sigpipe(_: libc::c_int) {
            // Only async-signal-safe calls: the segment's unlink, then _exit.
            shm::unlink_pending_from_signal();
            // SAFETY: _exit is async-signal-safe.
            unsafe { libc::_exit(141) };
        }
        // SAFETY: installs a handler that makes only async-signal-safe calls.
        unsafe { libc::signal(libc::SIGPIPE, on_sigpipe as *const () as libc::sighandler_t) };
    }
    let token = if launched {
        let mut line = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut line)
            .context("cannot read the session token from the launcher")?;
        // The launcher holds our stdin open for the whole run; EOF means it is gone.
        std::thread::spawn(|| {
            let mut sink = [0u8; 64];
            while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
            crate::abort::abort_and_exit(1);
        });
        Token::from_hex(&line)?
    } else {
        Token::from_hex(&std::env::var(ENV_TOKEN).map_err(|_| anyhow!("{ENV_TOKEN} is not set"))?)?
    };
    Ok(Bootstrap {
        rank,
        size,
        token,
        rdv: std::env::var(ENV_RDV).ok(),
        listener: None,
        label: std::env::var(ENV_LABEL).ok(),
        addr: std::env::var(ENV_ADDR).ok(),
        launched,
        launcher: Launcher::named(if launched { "tbbench" } else { "by hand" }),
        keepalive: None,
    })
}

fn rank_main<S: Suite>(
    config: &S::Config,
    opts: &RunOptions,
    tool: &Tool,
    boot: Bootstrap,
) -> Result<i32> {
    let started = time::OffsetDateTime::now_utc();
    let Bootstrap {
        rank,
        size,
        token,
        rdv,
        listener: bound,
        label,
        addr,
        launched,
        launcher,
        keepalive,
    } = boot;
    if rank == 0 && !launched {
        // Rank 0 writes the file itself (mpirun, by hand): find out now whether it can.
        tbbench_schema::write::check_writable(&launch::standalone_out(opts, S::NAME))?;
    }
    let mut host = sysinfo::this_host();
    let label = label.unwrap_or_else(|| host.hostname.clone());
    // The address the launcher placed this rank at (hostfile `ips`, loopback): the control
    // network. Data may go elsewhere (--iface, a subnet of --over).
    let control_ip: Option<IpAddr> = match addr {
        Some(a) => Some(
            a.parse()
                .map_err(|_| anyhow!("{ENV_ADDR}={a} is not an IP address"))?,
        ),
        None => None,
    };
    let data_ip: Option<IpAddr> = match &opts.net.iface {
        // Over links each peer is reached on its own cable: the data listener takes every
        // address, and the connections pick theirs per peer (transport::tcp).
        _ if opts.net.links => None,
        Some(iface) => Some(IpAddr::V4(netinfo::ipv4_of(iface)?)),
        // A subnet: this host's own address in it, whatever the interface is called here.
        None if opts.net.subnet.is_some() => Some(IpAddr::V4(netinfo::ipv4_in_subnet(
            opts.net.subnet.expect("checked"),
        )?)),
        None => control_ip.or(opts.net.addr),
    };
    // What the peers need to reach this rank's transport (a port, queue pair numbers) exists
    // before the rendezvous so it travels with it. A failure waits until the control channel
    // is up, so it ends the run with one line on every rank.
    let opening = transport::prepare(&OpenPlan {
        rank,
        size,
        opts,
        data_ip,
        token: &token,
    });
    host.ranks = vec![rank];
    let mut me = RankInfo {
        rank,
        hostname: host.hostname.clone(),
        label: label.clone(),
        data_ip: data_ip.map(|ip| ip.to_string()),
        data_port: 0,
        pid: std::process::id(),
        boot_id: boot_id(),
        host,
        rdma: None,
        links: if opts.net.links {
            Some(crate::links::LinkInfo::gather(control_ip, rdv.as_deref())?)
        } else {
            None
        },
    };
    if let Ok(o) = &opening {
        o.advertise(&mut me);
    }

    let (table, conns, rdv_listener) = if rank == 0 {
        // The others reach rank 0 where the launcher placed it, which need not be the data
        // network: ssh and the rendezvous over Ethernet, data over Thunderbolt.
        // Without an address from the launcher the others reach rank 0 by its host's name,
        // which resolves to whatever network that name is on (the management network beside
        // a --over subnet or --iface): every address, then, and the gate keeps strangers off.
        // (IPv6's any-address takes IPv4 too where the host has IPv6.)
        let listener = match (bound, control_ip) {
            (Some(l), _) => l,
            (None, Some(ip)) => {
                let bind = SocketAddr::new(ip, opts.port);
                TcpListener::bind(bind)
                    .with_context(|| format!("cannot listen for the rendezvous on {bind}"))?
            }
            (None, None) => TcpListener::bind(SocketAddr::new(
                IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
                opts.port,
            ))
            .or_else(|_| {
                TcpListener::bind(SocketAddr::new(
                    IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                    opts.port,
                ))
            })
            .with_context(|| format!("cannot listen for the rendezvous on port {}", opts.port))?,
        };
        // Where a person starting the others by hand should point them.
        let bind = SocketAddr::new(
            control_ip
                .or(data_ip)
                .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
            opts.port,
        );
        let port = listener.local_addr()?.port();
        if launched {
            heartbeat_to_launcher();
            println!("{PROTOCOL_PREFIX}RENDEZVOUS {port}");
        } else if launcher.kind == "by hand" {
            // Started by hand: say where the other ranks must connect. (Under mpirun and
            // srun they know.)
            eprintln!(
                "tbbench: rank 0 waiting for {} rank(s) at {}",
                size - 1,
                SocketAddr::new(bind.ip(), port)
            );
        }
        // On failure the opening is dropped on the way out, which removes what it made.
        let (table, conns) = rendezvous::gather_ranks(&listener, &token, size, me, opts.timeout)?;
        (table, conns, Some(listener))
    } else {
        let rdv = rdv.ok_or_else(|| anyhow!("{ENV_RDV} (rank 0's address:port) is not set"))?;
        // A name only ssh knows (an alias in ~/.ssh/config) does not resolve here: said now,
        // by the rank that cannot resolve it, rather than lost behind "rank 0 dropped its
        // control connections".
        let addrs = match rendezvous::resolve(&rdv) {
            Ok(a) => a,
            Err((alt, e)) => {
                let host = alt.rsplit_once(':').map_or(alt.as_str(), |(h, _)| h);
                bail!(
                    "rank {rank} ({label}) cannot resolve rank 0's host {host}: {e} (a name only ssh knows, such as an alias in ~/.ssh/config, does not resolve for tbbench: give the host's address in the hostfile's \"ips\", or a name every host resolves)"
                );
            }
        };
        // Rank 0 waits `timeout` for every rank and then names the ones missing; this rank
        // waits a little longer, so that line (the cause) comes first.
        let joined = rendezvous::join(
            &rdv,
            &addrs,
            &token,
            size,
            me,
            opts.timeout + Duration::from_secs(5),
        );
        let (table, stream) = match joined {
            Ok(j) => j,
            // Under the launcher, rank 0 or the launcher names what went wrong (rank 0 gave
            // up on a missing rank, or died); this rank only says, by its exit code, that it
            // lost rank 0, instead of a second line blaming rank 0.
            Err(_) if launched => crate::abort::exit_now(crate::session::EXIT_RANK0_LOST),
            Err(e) => return Err(e),
        };
        (table, vec![Some(stream)], None)
    };
    let names: Vec<PeerName> = table
        .iter()
        .map(|i| PeerName {
            rank: i.rank,
            host: if i.label == "localhost" {
                i.hostname.clone()
            } else {
                i.label.clone()
            },
        })
        .collect();
    // Over links: the cables every pair has, derived alike on every rank from the table. An
    // error waits for the control channel, as the opening's does.
    let cabling = if opts.net.links {
        derive_cabling(&table, &names).map(Some)
    } else {
        Ok(None)
    };
    // Verbs over links says how to reach it only now (each peer's queue pairs on its cable's
    // device), in a second round on the rendezvous connections. A rank that cannot say (its
    // device failed, the cabling did not derive) says nothing and keeps its error.
    let mut opening = opening;
    let cabled = if transport::cabled_round(opts) {
        let word = match (&mut opening, &cabling) {
            (Ok(o), Ok(Some(c))) => match o.advertise_cabled(c) {
                Ok(w) => w,
                Err(e) => {
                    opening = Err(e);
                    None
                }
            },
            _ => None,
        };
        let wait = opts.timeout + Duration::from_secs(if rank == 0 { 0 } else { 5 });
        match rendezvous::second_round(rank, &conns, word, wait) {
            Ok(all) => Some(all),
            Err(_) if launched && rank != 0 => {
                crate::abort::exit_now(crate::session::EXIT_RANK0_LOST)
            }
            Err(e) => return Err(e),
        }
    } else {
        None
    };
    let ctl = Control::start(rank, names.clone(), conns, rdv_listener, token, launched)?;
    // From here on an error ends the run on every rank, with one line naming where it started.
    match run_suite::<S>(
        config,
        opts,
        tool,
        started,
        &token,
        rank,
        &table,
        names.clone(),
        opening,
        cabling,
        cabled.as_deref(),
        launched,
        &launcher,
    ) {
        Ok(code) => {
            ctl.finish();
            drop(keepalive);
            Ok(code)
        }
        Err(e) => {
            // Everything the run opened is closed now (it unwound to here). When the control
            // thread is ending the run (another rank died or failed, and this rank's waits
            // stopped for it), that thread names the cause and exits; this one only waits.
            if crate::abort::main_thread_unwound() {
                loop {
                    std::thread::park();
                }
            }
            let msg = if rank == 0 {
                format!("{e:#}")
            } else {
                format!("{}: {e:#}", names[rank])
            };
            ctl.abort(&msg)
        }
    }
}

/// The ranks in the order of a ring cabling's hosts, where each host runs one rank.
fn ring_ranks(ring: &[String], rank_names: &[String]) -> Option<Vec<usize>> {
    if ring.len() != rank_names.len() || ring.len() < 3 {
        return None;
    }
    ring.iter()
        .map(|h| {
            let mut of_host = rank_names.iter().enumerate().filter(|(_, n)| *n == h);
            match (of_host.next(), of_host.next()) {
                (Some((r, _)), None) => Some(r),
                _ => None,
            }
        })
        .collect()
}

/// The cables between every pair of ranks, from what each published at the rendezvous.
fn derive_cabling(table: &[RankInfo], names: &[PeerName]) -> Result<crate::links::Cabling> {
    let hosts: Vec<String> = names.iter().map(|n| n.host.clone()).collect();
    // A rank that could not tell its control interface (rank 0 with no address from the
    // hostfile) is known by the address the others reached it at, which the rendezvous
    // recorded.
    let infos: Vec<crate::links::LinkInfo> = table
        .iter()
        .map(|i| {
            let mut info = i.links.clone().unwrap_or_default();
            if info.control_iface.is_none() {
                let seen: Option<Ipv4Addr> = i.data_ip.as_deref().and_then(|a| a.parse().ok());
                info.control_iface = info
                    .interfaces
                    .iter()
                    .find(|x| Some(x.ip) == seen)
                    .map(|x| x.name.clone());
            }
            info
        })
        .collect();
    crate::links::derive(&hosts, &infos)
}

#[allow(clippy::too_many_arguments)]
fn run_suite<S: Suite>(
    config: &S::Config,
    opts: &RunOptions,
    tool: &Tool,
    started: time::OffsetDateTime,
    token: &Token,
    rank: usize,
    table: &[RankInfo],
    names: Vec<PeerName>,
    opening: Result<Box<dyn Opening>>,
    cabling: Result<Option<crate::links::Cabling>>,
    cabled: Option<&[Option<String>]>,
    launched: bool,
    launcher: &Launcher,
) -> Result<i32> {
    // A suite that needs a pair with no cable ends here, before anything is opened.
    let cabling = cabling?;
    if let Some(c) = &cabling {
        if !c.topology.unlinked.is_empty() && S::needs_every_pair(config) {
            let hosts: Vec<String> = names.iter().map(|n| n.host.clone()).collect();
            bail!(
                "{} needs a cable between every pair of ranks, and these have none: {} (run it over one network, e.g. --over tcp:IFACE, or cable those hosts)",
                S::NAME,
                c.unlinked_line(&hosts)
            );
        }
    }
    let rank_names: Vec<String> = names.iter().map(|n| n.host.clone()).collect();
    let Opened {
        transport,
        mut network,
    } = opening?.connect(&Peers {
        rank,
        table,
        names,
        token,
        opts,
        cabling: cabling.as_ref(),
        cabled,
    })?;
    if let Some(c) = cabling {
        // A transport may have filled in what it learnt of each cable (its RDMA devices).
        if network.links.is_empty() {
            network.links = c.links;
        }
        network.topology = Some(c.topology);
    }
    let hosts = group_hosts(table);
    let rank_hosts = table.iter().map(|i| i.hostname.clone()).collect();
    let progress = rank == 0 && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut comm = Comm::new(transport);
    // On a partial cabling (a ring's diagonals), collectives keep to the cables, and on a
    // ring they go round it in the cables' order.
    if let Some(t) = &network.topology {
        comm.set_unlinked(t.unlinked.clone());
        if let Some(order) = ring_ranks(&t.ring, &rank_names) {
            comm.set_ring_order(order);
        }
    }
    // Over a cluster's cables each neighbour has a full-duplex cable of its own: the ring
    // all-reduce uses both directions of both.
    comm.set_ring_both_ways(
        network
            .links
            .iter()
            .any(|l| l.ends[0].link_kind != "loopback"),
    );
    let mut ctx = Context {
        comm,
        network,
        hosts,
        rank_hosts,
        rank_names,
        progress,
        timeout: opts.timeout,
        rsh: opts.rsh.clone(),
    };
    if let Some(w) = ctx.oversubscribed() {
        if rank == 0 {
            eprintln!("tbbench: warning: {w}");
        }
    }
    let watch = crate::others::Watch::begin(&ctx);
    let output = S::run(config, &mut ctx)?;
    ctx.comm.barrier()?;
    // Other processes' share of each host's CPU over the suite: a figure taken beside a
    // compiler says so.
    let busy = watch.end(&mut ctx)?;
    let Some(output) = output else { return Ok(0) };

    let mut warnings = output.warnings;
    for w in busy {
        eprintln!("tbbench: warning: {w}");
        warnings.push(w);
    }
    if let Some(w) = ctx.oversubscribed() {
        warnings.insert(0, w);
    }
    let mut params = merge_params(serde_json::to_value(opts)?, serde_json::to_value(config)?)?;
    // The ranks that ran (mpirun's and srun's, not the --nodes default), and who started them.
    if let Some(p) = params.as_object_mut() {
        p.insert("nodes".into(), table.len().into());
        p.insert("launcher".into(), serde_json::to_value(launcher)?);
    }
    // The hostfile's `envs` (MLX's object form), which the launcher set on every rank; values
    // of keys that look like secrets are not written into files people share.
    if let Ok(envs) = std::env::var(launch::ENV_HOSTFILE_ENVS) {
        if let (Ok(list), Some(p)) = (
            serde_json::from_str::<Vec<String>>(&envs),
            params.as_object_mut(),
        ) {
            let shown: Vec<String> = list.iter().map(|e| redact_secret(e)).collect();
            p.insert("hostfile_envs".into(), shown.into());
        }
    }
    let result = ResultFile::finished(
        tool,
        started,
        RunRecord {
            suite: S::NAME.to_string(),
            params,
            hosts: ctx.hosts.clone(),
            ranks: ctx.rank_hosts.clone(),
            network: ctx.network.clone(),
            results: output.results,
            checks: output.checks,
            warnings,
        },
    );
    if launched {
        println!(
            "{PROTOCOL_PREFIX}RESULT {}",
            serde_json::to_string(&result)?
        );
    } else {
        // A time-stamped name never replaces the file of a run started in the same second.
        let path = tbbench_schema::write::write_result_out(
            opts.out.as_deref(),
            S::NAME,
            started,
            &result,
        )?;
        println!("result: {}", path.display());
    }
    if !result.verification.passed {
        let failed = result.verification.failed();
        eprintln!(
            "tbbench: error: verification FAILED ({}); the result file records it",
            failed.join(", ")
        );
        return Ok(1);
    }
    Ok(0)
}

/// `KEY=VALUE`, its value replaced where the key names a secret (token, key, secret,
/// password, credential).
fn redact_secret(entry: &str) -> String {
    match entry.split_once('=') {
        Some((k, _))
            if ["TOKEN", "KEY", "SECRET", "PASS", "CREDENTIAL"]
                .iter()
                .any(|w| k.to_ascii_uppercase().contains(w)) =>
        {
            format!("{k}=(not recorded)")
        }
        _ => entry.to_string(),
    }
}

/// The run options and the suite's config in one `params` object. A suite key that is also a
/// run option would hide the option's value from every reader, so it is refused.
fn merge_params(run: serde_json::Value, suite: serde_json::Value) -> Result<serde_json::Value> {
    let (serde_json::Value::Object(mut params), serde_json::Value::Object(suite)) = (run, suite)
    else {
        bail!("the run options and the suite's config must serialize as objects");
    };
    for (k, v) in suite {
        if params.contains_key(&k) {
            bail!("the suite's config key '{k}' is also a run option; rename it");
        }
        params.insert(k, v);
    }
    Ok(serde_json::Value::Object(params))
}

fn group_hosts(table: &[RankInfo]) -> Vec<Host> {
    let mut hosts: Vec<Host> = Vec::new();
    for info in table {
        match hosts.iter_mut().find(|h| h.hostname == info.hostname) {
            Some(h) => h.ranks.push(info.rank),
            None => {
                let mut h = info.host.clone();
                h.ranks = vec![info.rank];
                hosts.push(h);
            }
        }
    }
    hosts
}

/// Rank 0 under the launcher says it is alive on its stdout every `HEARTBEAT`, for as long as
/// the process lives: the launcher's only way to tell a frozen rank 0 from a busy one once the
/// other ranks (which watch it too) have ended. A line at a time, as every line is written
/// whole under stdout's lock; a closed stdout (the launcher gone) is the stdin watch's to act on.
fn heartbeat_to_launcher() {
    use std::io::Write;
    let _ = std::thread::Builder::new()
        .name("launcher-heartbeat".into())
        .spawn(|| loop {
            std::thread::sleep(rendezvous::HEARTBEAT);
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{PROTOCOL_PREFIX}{PROTOCOL_ALIVE}");
            let _ = out.flush();
        });
}

#[cfg(test)]
mod tests {
    use super::merge_params;
    use serde_json::json;

    #[test]
    fn suite_keys_join_the_run_options_and_may_not_replace_one() {
        let run = json!({"nodes": 2, "transport": "tcp"});
        let merged = merge_params(run.clone(), json!({"n": 1000})).unwrap();
        assert_eq!(merged, json!({"nodes": 2, "transport": "tcp", "n": 1000}));
        let e = merge_params(run, json!({"nodes": 4}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("'nodes'"), "{e}");
    }
}
