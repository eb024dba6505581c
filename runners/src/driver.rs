//! Runs a suite: in the process the user started, as the launcher; in each rank process, as
//! the rank (rendezvous, transport, the suite, the result file). One generic function for every
//! suite, so adding a suite touches nothing here.

use crate::comm::Comm;
use crate::launch::{
    self, ENV_ADDR, ENV_LABEL, ENV_LAUNCHED, ENV_RANK, ENV_RDV, ENV_SIZE, ENV_TOKEN,
    PROTOCOL_PREFIX,
};
use crate::netinfo;
use crate::options::{RunOptions, TransportKind};
use crate::rendezvous::{self, Control, RankInfo, Token};
use crate::suite::{Context, Suite};
use crate::sysinfo;
use crate::transport::{shm, tcp, verbs, PeerName, Transport};
use anyhow::{anyhow, bail, Context as _, Result};
use std::io::{BufRead, Read};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::time::Duration;
use tbbench_schema::{Host, Network, ResultFile, RunRecord, Tool};

/// True in a process started by a launcher (or by hand) as one rank.
pub fn is_rank_process() -> bool {
    std::env::var_os(ENV_RANK).is_some()
}

/// Entry point for every suite: launches the ranks, or runs as one of them.
pub fn run<S: Suite>(config: &S::Config, opts: &RunOptions, tool: &Tool) -> Result<i32> {
    if is_rank_process() {
        // A rank of one network of `--over`: the launcher says which.
        let opts = match std::env::var(crate::launch::ENV_NETWORK) {
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
        return rank_main::<S>(config, &opts, tool, env_bootstrap()?);
    }
    if let Some(size) = crate::mpi_boot::mpirun_size() {
        if !opts.over.is_empty() {
            bail!("--over is not supported under mpirun yet: run once per network (--transport, --iface)");
        }
        return rank_main::<S>(config, opts, tool, crate::mpi_boot::bootstrap(opts, size)?);
    }
    launch::launch(opts, S::NAME)
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

/// Who this rank is and how it finds rank 0, however it was started: by tbbench's launcher
/// (environment + token on stdin), by hand (environment + TBBENCH_TOKEN), or by mpirun.
pub struct Bootstrap {
    pub rank: usize,
    pub size: usize,
    pub token: Token,
    /// Rank 0's rendezvous address (host:port), for the other ranks.
    pub rdv: Option<String>,
    /// Rank 0's rendezvous listener, when the bootstrap had to bind it first (MPI).
    pub listener: Option<TcpListener>,
    /// The launcher's name for this rank's host.
    pub label: Option<String>,
    /// The address the launcher chose for this rank (hostfile `ips`, loopback).
    pub addr: Option<String>,
    /// Started by tbbench's own launcher: rank 0 reports its port and the result on stdout.
    pub launched: bool,
    /// Kept alive for the whole run (the MPI universe, finalized when dropped).
    pub keepalive: Option<Box<dyn std::any::Any>>,
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
            rendezvous::abort_and_exit(1);
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
    let data_ip: Option<IpAddr> = match &opts.iface {
        Some(iface) => Some(IpAddr::V4(netinfo::ipv4_of(iface)?)),
        // A subnet: this host's own address in it, whatever the interface is called here.
        None if opts.subnet.is_some() => Some(IpAddr::V4(netinfo::ipv4_in_subnet(
            opts.subnet.expect("checked"),
        )?)),
        None => control_ip.or(opts.addr),
    };
    let data_listener = match opts.transport {
        TransportKind::Tcp => Some(tcp::bind_listener(
            data_ip.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        )?),
        TransportKind::Shm | TransportKind::Verbs => None,
    };
    // The queue pairs exist before the rendezvous so their numbers travel with it. A failure
    // waits until the control channel is up, so it ends the run with one line on every rank.
    let verbs_prepared = match opts.transport {
        TransportKind::Verbs => Some(verbs::prepare(
            rank,
            size,
            &verbs::VerbsOptions {
                device: opts.rdma_device.clone(),
                iface: opts.iface.clone(),
                ip: match data_ip {
                    Some(IpAddr::V4(v4)) if !v4.is_loopback() && !v4.is_unspecified() => Some(v4),
                    _ => None,
                },
                timeout: opts.timeout,
                library: opts
                    .verbs_lib
                    .as_ref()
                    .map(|p| p.to_string_lossy().into_owned()),
            },
        )),
        _ => None,
    };
    host.ranks = vec![rank];
    let me = RankInfo {
        rank,
        hostname: host.hostname.clone(),
        label: label.clone(),
        data_ip: data_ip.map(|ip| ip.to_string()),
        data_port: data_listener
            .as_ref()
            .map(|l| l.local_addr().map(|a| a.port()))
            .transpose()?
            .unwrap_or(0),
        pid: std::process::id(),
        boot_id: boot_id(),
        host,
        rdma: verbs_prepared
            .as_ref()
            .and_then(|p| p.as_ref().ok())
            .map(|p| p.hello()),
    };

    let (table, conns, rdv_listener) = if rank == 0 {
        // The others reach rank 0 where the launcher placed it, which need not be the data
        // network: ssh and the rendezvous over Ethernet, data over Thunderbolt.
        let bind = SocketAddr::new(
            control_ip
                .or(data_ip)
                .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
            opts.port,
        );
        let listener = match bound {
            Some(l) => l,
            None => TcpListener::bind(bind)
                .with_context(|| format!("cannot listen for the rendezvous on {bind}"))?,
        };
        if opts.transport == TransportKind::Shm {
            shm::create_segment(&token.0, size)?;
            // Gone once every rank attached; this covers runs that fail before that.
            let t = token.0;
            rendezvous::on_abort(move || shm::unlink_segment(&t));
            shm::remember_pending(&t);
        }
        let port = listener.local_addr()?.port();
        if launched {
            println!("{PROTOCOL_PREFIX}RENDEZVOUS {port}");
        } else if keepalive.is_none() {
            // Started by hand: say where the other ranks must connect. (Under MPI they know.)
            eprintln!(
                "tbbench: rank 0 waiting for {} rank(s) at {}",
                size - 1,
                SocketAddr::new(bind.ip(), port)
            );
        }
        let gathered = rendezvous::gather_ranks(&listener, &token, size, me, opts.timeout);
        if gathered.is_err() && opts.transport == TransportKind::Shm {
            shm::unlink_segment(&token.0);
        }
        let (table, conns) = gathered?;
        (table, conns, Some(listener))
    } else {
        let rdv = rdv.ok_or_else(|| anyhow!("{ENV_RDV} (rank 0's address:port) is not set"))?;
        // Rank 0 waits `timeout` for every rank and then names the ones missing; this rank
        // waits a little longer, so that line (the cause) comes first.
        let joined = rendezvous::join(
            &rdv,
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
            Err(_) if launched => rendezvous::exit_now(launch::EXIT_RANK0_LOST),
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
        data_listener,
        verbs_prepared,
        launched,
    ) {
        Ok(code) => {
            ctl.finish();
            drop(keepalive);
            Ok(code)
        }
        Err(e) => {
            let msg = if rank == 0 {
                format!("{e:#}")
            } else {
                format!("{}: {e:#}", names[rank])
            };
            ctl.abort(&msg)
        }
    }
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
    data_listener: Option<TcpListener>,
    verbs_prepared: Option<Result<verbs::Prepared>>,
    launched: bool,
) -> Result<i32> {
    let size = table.len();
    let mut verbs_info = None;
    let (transport, data_ip): (Box<dyn Transport>, Option<IpAddr>) = match opts.transport {
        TransportKind::Tcp => {
            let peers = table
                .iter()
                .map(|i| {
                    let ip: IpAddr = i
                        .data_ip
                        .as_deref()
                        .unwrap_or("127.0.0.1")
                        .parse()
                        .map_err(|_| anyhow!("{} advertised a bad address", names[i.rank]))?;
                    Ok(SocketAddr::new(ip, i.data_port))
                })
                .collect::<Result<Vec<_>>>()?;
            let bind_ip = table[rank].data_ip.as_deref().and_then(|a| a.parse().ok());
            let topts = tcp::TcpOptions {
                streams: opts.streams,
                timeout: opts.timeout,
                sockbuf: opts.sockbuf,
            };
            let listener = data_listener.context("no data listener")?;
            let t = tcp::connect_mesh(
                rank,
                listener,
                &peers,
                bind_ip,
                &token.0,
                names.clone(),
                topts,
            )?;
            let used = t.local_ip().or(bind_ip);
            (Box::new(t), used)
        }
        TransportKind::Shm => {
            if let Some(other) = table
                .iter()
                .find(|i| i.hostname != table[0].hostname || i.boot_id != table[0].boot_id)
            {
                bail!("--transport shm needs every rank on one host, but {} runs on {} and rank 0 on {}", names[other.rank], other.hostname, table[0].hostname);
            }
            (
                Box::new(shm::ShmTransport::attach(
                    rank,
                    size,
                    &token.0,
                    names.clone(),
                    opts.timeout,
                )?),
                None,
            )
        }
        TransportKind::Verbs => {
            let prepared = verbs_prepared.context("the RDMA device was not prepared")??;
            let hellos: Vec<Option<String>> = table.iter().map(|i| i.rdma.clone()).collect();
            let t = prepared.connect(&hellos, names.clone())?;
            verbs_info = Some(t.info().clone());
            let ip = table[rank].data_ip.as_deref().and_then(|a| a.parse().ok());
            (Box::new(t), ip)
        }
    };
    let network = describe_network(opts, data_ip, table, verbs_info.as_ref());
    let hosts = group_hosts(table);
    let rank_hosts = table.iter().map(|i| i.hostname.clone()).collect();
    let progress = rank == 0 && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut ctx = Context {
        comm: Comm::new(transport),
        network,
        hosts,
        rank_hosts,
        progress,
        timeout: opts.timeout,
    };
    if let Some(w) = ctx.oversubscribed() {
        if rank == 0 {
            eprintln!("tbbench: warning: {w}");
        }
    }
    let output = S::run(config, &mut ctx)?;
    ctx.comm.barrier()?;
    let Some(output) = output else { return Ok(0) };

    let mut warnings = output.warnings;
    if let Some(w) = ctx.oversubscribed() {
        warnings.insert(0, w);
    }
    let mut params = serde_json::to_value(opts)?;
    if let (Some(p), serde_json::Value::Object(suite)) =
        (params.as_object_mut(), serde_json::to_value(config)?)
    {
        p.extend(suite);
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
        let path = launch::standalone_out(opts, S::NAME);
        tbbench_schema::write::write_result(&path, &result)?;
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

/// Labels the network from what the OS says about the interface the data actually used.
fn describe_network(
    opts: &RunOptions,
    data_ip: Option<IpAddr>,
    table: &[RankInfo],
    verbs_info: Option<&verbs::VerbsInfo>,
) -> Network {
    match opts.transport {
        TransportKind::Verbs => {
            // The device's interface gives the speed; the MTU is the RDMA path MTU, which is
            // what sizes the packets (1024 on Thunderbolt whatever the IP MTU).
            let device = verbs_info.map(|v| v.device.clone()).unwrap_or_default();
            let interface = verbs_info
                .and_then(|v| v.iface.clone())
                .or_else(|| opts.iface.clone());
            let speed = interface
                .as_deref()
                .and_then(|i| netinfo::interface_by_name(i).ok())
                .and_then(|i| i.speed_gbit_per_s);
            let addresses = table
                .iter()
                .map(|i| i.data_ip.clone().unwrap_or_default())
                .collect();
            Network {
                transport: "verbs".into(),
                label: format!(
                    "verbs/{device} ({})",
                    verbs_info.map(|v| v.link_layer).unwrap_or("rdma")
                ),
                interface,
                // Never counted as RDMA: the software device's figures measure its TCP.
                link_kind: if verbs_info.is_some_and(|v| v.emulated) {
                    "rdma-emulated".into()
                } else {
                    "rdma".into()
                },
                nominal_gbit_per_s: speed,
                mtu: verbs_info.map(|v| v.mtu_bytes),
                addresses,
                streams: None,
            }
        }
        TransportKind::Shm => Network {
            transport: "shm".into(),
            link_kind: "shm".into(),
            label: "shm".into(),
            ..Default::default()
        },
        TransportKind::Tcp => {
            let iface = match &opts.iface {
                Some(name) => netinfo::interface_by_name(name).ok(),
                None => data_ip.and_then(netinfo::interface_for_addr),
            };
            let addresses = table
                .iter()
                .map(|i| i.data_ip.clone().unwrap_or_default())
                .collect();
            let base = netinfo::network_of(iface.as_ref());
            let label = format!(
                "tcp/{} ({})",
                base.interface.as_deref().unwrap_or("?"),
                base.link_kind
            );
            Network {
                transport: "tcp".into(),
                addresses,
                streams: Some(opts.streams),
                label,
                ..base
            }
        }
    }
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
