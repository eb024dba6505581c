//! TCP: one connection per pair of ranks (the suite's count, two by default, where the
//! congestion control paces every segment, or `--streams K`), TCP_NODELAY, bound to the
//! chosen address so the data takes the network the user picked.
//!
//! Every piece of a message travels with a header holding the whole message's length (8
//! bytes of it, padded to a cache line, and the piece padded after its payload to one, so
//! every payload starts aligned in the stream), so a receive posted with the wrong size is
//! caught and named instead of silently desynchronising the stream. Large messages are striped over the K connections; both ends
//! derive the same striping from the message size, so each connection stays a FIFO. Where
//! the congestion control paces every segment (bbr) each write moves at most 120 KiB
//! (`PACED_SLICE_BYTES`); only the sender's side depends on it.

use super::{OpenPlan, Opened, Opening, Peers, RecvOp, SendOp, Traffic, Transport, Waiting};
use crate::gate::{same_secret, Gate, Verdict};
use crate::netinfo;
use crate::session::{PeerName, RankInfo};
use anyhow::{anyhow, bail, Context, Result};
use socket2::{Domain, Protocol, Socket, Type};
use std::collections::VecDeque;
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Messages below this size are not striped: striping only pays once a message is large
/// enough to keep several connections busy. (Predict models a pair's cables the same way.)
pub const STRIPE_MIN: usize = 256 << 10;

/// Congestion controls that pace every segment themselves. Where the interface's queue does
/// not pace for them (loopback, and any qdisc but fq), Linux holds each segment after the
/// first few for a high-resolution timer, and on a VM each such timer costs tens of
/// microseconds whatever rate bbr has estimated (`perf stat -e timer:hrtimer_expire_entry`
/// on a 1 MiB ping-pong shows the expiries). Two connections wait for their timers at once,
/// which speeds up large exchanges (all-reduce, all-gather) and slows one-way messages, so
/// one-way collectives send each message on one of the two
/// ([`TcpOptions::stripe_one_way`]); under cubic a second connection only adds work.
/// Re-measure: `scripts/bench-coll.sh 5 2 4` under bbr and with `CONGESTION=cubic`, each
/// against `--conns 1`.
const PACING_CONGESTION: &[&str] = &["bbr", "bbr2", "bbr3"];

/// `--streams` left to the run: `paced` (the suite's [`crate::suite::Suite::STREAMS_WHEN_PACED`])
/// where the connections will pace every segment (the congestion control asked for, or else
/// any host's default), else 1.
pub fn auto_streams(table: &[RankInfo], asked: Option<&str>, paced: usize) -> usize {
    auto_streams_for(
        asked,
        table
            .iter()
            .map(|i| i.host.tcp_congestion_control.as_deref()),
        paced,
    )
}

/// [`auto_streams`] from the hosts' default congestion controls alone.
pub fn auto_streams_for<'a>(
    asked: Option<&str>,
    defaults: impl IntoIterator<Item = Option<&'a str>>,
    paced: usize,
) -> usize {
    let paces = |cc: &str| PACING_CONGESTION.contains(&cc);
    let is_paced = match asked {
        Some(cc) => paces(cc),
        None => defaults.into_iter().flatten().any(paces),
    };
    if is_paced {
        paced.max(1)
    } else {
        1
    }
}

const HELLO_MAGIC: &[u8; 4] = b"TBBD";
/// Magic, token, rank, stream, streams per pair (ranks started by hand with different
/// `--streams` or `--congestion` would otherwise stripe differently).
const HELLO_LEN: usize = 4 + 16 + 4 + 4 + 4;
/// A piece's header: its 8 meaningful bytes ([`header`]) padded to a cache line, and every
/// piece padded after its payload to a whole number of cache lines, so every payload starts
/// 64-byte aligned in the stream. The kernel copies a payload between the caller's buffer and
/// its own pages at the payload's offset in the stream; with an 8-byte header the two are
/// mutually misaligned and those copies run several times slower: a plain C ping-pong of
/// 1 MiB over loopback took about 4x as long with an 8-byte header before the data as with a
/// 64-byte one or none (re-measure: `tbbench coll --op ping-pong --sizes 1MiB --peer mpi`).
const HDR: usize = 64;
/// The meaningful bytes at the start of [`HDR`].
const HDR_VALUE: usize = 8;
/// Pieces end on a cache line (see [`HDR`]).
const ALIGN: usize = 64;
/// Zeros a send's padding is taken from, and where a receive's padding is dropped.
static PAD_OUT: [u8; ALIGN] = [0; ALIGN];

#[derive(Debug, Clone)]
pub struct TcpOptions {
    pub streams: usize,
    /// Longest wait with no progress before an operation fails.
    pub timeout: Duration,
    /// SO_SNDBUF/SO_RCVBUF; None leaves the OS default, which on Linux keeps autotuning on.
    pub sockbuf: Option<usize>,
    /// TCP_CONGESTION for every data connection (Linux); None keeps the system's default.
    pub congestion: Option<String>,
    /// How long a wait retries before it sleeps ([`SPIN_BEFORE_POLL`] or
    /// [`SPIN_OVERSUBSCRIBED`]).
    pub spin: Duration,
    /// Whether a retry hands the core to another thread first: with more ranks than cores,
    /// where the rank waited for may need this core. With a core per rank the yield is only
    /// a syscall between tries that delays seeing the data (2-rank 8 B broadcast and
    /// all-reduce over loopback 5-20% faster without it).
    pub yield_while_spinning: bool,
    /// Whether one-way messages ([`Traffic::OneWay`]) are striped over the pair's connections
    /// too: where the user chose the count (`--streams`). Where tbbench chose two because
    /// the congestion control paces each, those carry a one-way message on one, as `link`
    /// opens one: see [`PACING_CONGESTION`].
    pub stripe_one_way: bool,
}

/// The data listener, bound before the rendezvous so its port can be advertised.
pub fn bind_listener(ip: IpAddr) -> Result<TcpListener> {
    let addr = SocketAddr::new(ip, 0);
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    sock.bind(&addr.into())
        .with_context(|| format!("cannot listen for data on {ip}"))?;
    sock.listen(1024)?;
    Ok(sock.into())
}

/// TCP half open: the data listener bound, its port published at the rendezvous.
pub struct TcpOpening {
    listener: TcpListener,
}

impl TcpOpening {
    pub fn prepare(plan: &OpenPlan) -> Result<Box<dyn Opening>> {
        let ip = plan
            .data_ip
            .unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
        Ok(Box::new(TcpOpening {
            listener: bind_listener(ip)?,
        }))
    }
}

impl Opening for TcpOpening {
    fn advertise(&self, me: &mut RankInfo) {
        me.data_port = self.listener.local_addr().map(|a| a.port()).unwrap_or(0);
    }

    fn connect(self: Box<Self>, p: &Peers) -> Result<Opened> {
        let addrs = p
            .table
            .iter()
            .map(|i| {
                let ip: IpAddr = i
                    .data_ip
                    .as_deref()
                    .unwrap_or("127.0.0.1")
                    .parse()
                    .map_err(|_| anyhow!("{} advertised a bad address", p.names[i.rank]))?;
                Ok(SocketAddr::new(ip, i.data_port))
            })
            .collect::<Result<Vec<_>>>()?;
        let bind_ip = p.table[p.rank]
            .data_ip
            .as_deref()
            .and_then(|a| a.parse().ok());
        let routes = match p.cabling {
            None => one_network(p.rank, &addrs, bind_ip),
            Some(c) => links_routes(p, c, &addrs)?,
        };
        let oversubscribed = ranks_here(p) > cores(p);
        let sockbuf = sockbuf_for(p.opts.sockbuf, oversubscribed);
        // Every rank derives the same count from the same table, so both ends of each pair
        // open the same connections.
        // Over links a pair with several cables gets a connection on each at least.
        let most_cables = p.cabling.map_or(1, |c| {
            c.links.iter().map(|l| l.cable + 1).max().unwrap_or(1)
        });
        let streams = p.opts.streams.unwrap_or_else(|| {
            auto_streams(
                p.table,
                p.opts.congestion.as_deref(),
                p.opts.streams_when_paced,
            )
            .max(most_cables)
        });
        let t = connect_mesh(
            p.rank,
            self.listener,
            &routes,
            &p.token.0,
            p.names.clone(),
            TcpOptions {
                streams,
                timeout: p.opts.timeout,
                sockbuf,
                congestion: p.opts.congestion.clone(),
                spin: if oversubscribed {
                    SPIN_OVERSUBSCRIBED
                } else {
                    SPIN_BEFORE_POLL
                },
                yield_while_spinning: oversubscribed,
                // A pair with several cables stripes every message over them, one-way too.
                stripe_one_way: p.opts.streams.is_some() || most_cables > 1,
            },
        )?;
        // A pair with several cables stripes by each cable's measured rate (one slower cable,
        // a Thunderbolt 4 among 5, would otherwise hold every message to its pace).
        let mut t = t;
        if let Some(c) = p.cabling.filter(|_| most_cables > 1) {
            let mut cables = vec![0usize; p.table.len()];
            for l in &c.links {
                let other = if l.ranks[0] == p.rank {
                    l.ranks[1]
                } else if l.ranks[1] == p.rank {
                    l.ranks[0]
                } else {
                    continue;
                };
                cables[other] += 1;
            }
            t.weigh_cables(&cables)?;
        }
        // The label comes from the interface the data really left by, whatever was asked.
        let iface = match &p.opts.net.iface {
            Some(name) => netinfo::interface_by_name(name).ok(),
            None => t
                .local_ip()
                .or(bind_ip)
                .and_then(netinfo::interface_for_addr),
        };
        let base = match p.cabling {
            None => netinfo::network_of(iface.as_ref()),
            Some(c) => links_network(c),
        };
        let network = tbbench_schema::Network {
            transport: "tcp".into(),
            label: format!(
                "tcp/{} ({})",
                base.interface.as_deref().unwrap_or("?"),
                base.link_kind
            ),
            addresses: super::published_addresses(p.table),
            streams: Some(streams),
            streams_auto: p.opts.streams.is_none(),
            sockbuf_bytes: t.sockbuf_granted().map(|b| b as u64),
            sockbuf_auto: sockbuf.is_some() && p.opts.sockbuf.is_none(),
            congestion: t.congestion(),
            ..base
        };
        Ok(Opened {
            transport: Box::new(t),
            network,
        })
    }
}

/// Each peer's connections over links: from this rank's end of each cable to the far end's
/// address, at the port the peer's listener (bound to every address) published; a peer with
/// no cable over the control network (the address rank 0 saw it at).
fn links_routes(
    p: &Peers,
    c: &crate::links::Cabling,
    addrs: &[SocketAddr],
) -> Result<Vec<Vec<Route>>> {
    let parse = |a: &str| -> Result<IpAddr> {
        a.parse()
            .map_err(|_| anyhow!("a cable end's address '{a}' is not an IP address"))
    };
    (0..p.table.len())
        .map(|peer| {
            if peer == p.rank {
                return Ok(vec![]);
            }
            let cables = c.between(p.rank, peer);
            if cables.is_empty() {
                // No cable: a connection over the control network, for the suite's own small
                // exchanges (barriers, gathering results to rank 0). Suites that move data
                // between every pair are refused before they start (driver), and the link
                // suite measures only cabled pairs, so no measured data travels here.
                return Ok(vec![Route {
                    bind: None,
                    to: addrs[peer],
                }]);
            }
            cables
                .into_iter()
                .map(|l| {
                    let (mine, theirs) = crate::links::Cabling::ends(l, p.rank);
                    Ok(Route {
                        bind: Some(parse(&mine.address)?),
                        to: SocketAddr::new(parse(&theirs.address)?, addrs[peer].port()),
                    })
                })
                .collect()
        })
        .collect()
}

/// A run over links as one network record: "links" for the interface, the cables' kind where
/// they share one ("mixed" otherwise), and their speed and MTU where every cable reports the
/// same.
fn links_network(c: &crate::links::Cabling) -> tbbench_schema::Network {
    let ends = || c.links.iter().flat_map(|l| l.ends.iter());
    let same = |v: Vec<String>| -> Option<String> {
        let first = v.first()?.clone();
        v.iter().all(|x| *x == first).then_some(first)
    };
    let kind =
        same(ends().map(|e| e.link_kind.clone()).collect()).unwrap_or_else(|| "mixed".into());
    let speed = same(
        ends()
            .map(|e| format!("{:?}", e.speed_gbit_per_s))
            .collect(),
    )
    .and_then(|_| c.links.first().and_then(|l| l.ends[0].speed_gbit_per_s));
    let mtu = same(ends().map(|e| format!("{:?}", e.mtu)).collect())
        .and_then(|_| c.links.first().and_then(|l| l.ends[0].mtu));
    tbbench_schema::Network {
        interface: Some("links".into()),
        link_kind: kind,
        nominal_gbit_per_s: speed,
        mtu,
        ..tbbench_schema::Network::default()
    }
}

/// Socket buffers with more ranks than cores on a host, where the OS's autotuning is left
/// alone otherwise. A sender whose receiver waits for a core runs ahead into buffers that
/// autotuning grows to megabytes, and the receiver then copies that data out of memory
/// rather than out of cache; fixed buffers (Linux doubles the size asked for) keep what is
/// in flight per connection near one core's L2. 512 KiB gained most of the sizes tried; with a
/// core per rank fixed buffers gain nothing, so autotuning stays. Re-measure: `tbbench coll
/// --nodes 4 --op all --sizes 1MiB,4MiB,16MiB` on a 2-core host against `--sockbuf 0`
/// (autotuning) and other sizes, medians of several launches.
const OVERSUBSCRIBED_SOCKBUF: usize = 512 << 10;

/// The socket buffer size the data connections set: what `--sockbuf` asked for (0 keeps the
/// OS's autotuning), else [`OVERSUBSCRIBED_SOCKBUF`] on a host with more ranks than cores.
/// None leaves autotuning on.
fn sockbuf_for(asked: Option<usize>, oversubscribed: bool) -> Option<usize> {
    match asked {
        Some(0) => None,
        Some(b) => Some(b),
        None => oversubscribed.then_some(OVERSUBSCRIBED_SOCKBUF),
    }
}

/// Ranks of this run on this rank's host (its kernel).
fn ranks_here(p: &Peers) -> usize {
    let me = &p.table[p.rank];
    p.table
        .iter()
        .filter(|i| i.hostname == me.hostname && i.boot_id == me.boot_id)
        .count()
}

/// This rank's host's online CPUs, as the run's oversubscription warning counts them: under
/// mpirun each rank may be bound to one core while the host still has all of them.
fn cores(p: &Peers) -> usize {
    match p.table[p.rank].host.cores_logical {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

pub struct TcpTransport {
    rank: usize,
    size: usize,
    /// conns[peer][stream]; empty for self.
    conns: Vec<Vec<TcpStream>>,
    names: Vec<PeerName>,
    opts: TcpOptions,
    /// Where the connections pace every segment: the most one send syscall moves
    /// ([`PACED_SLICE_BYTES`]).
    paced_slice: Option<usize>,
    /// Whether a wait spins for `opts.spin` first or sleeps in poll at once.
    waiting: Waiting,
    /// Whether the next exchanges' messages go one way (see `opts.stripe_one_way`).
    traffic: Traffic,
    /// shares[peer]: each stream's weight in a striped message, where the pair's cables were
    /// measured ([`TcpTransport::weigh_cables`]); empty: equal shares.
    shares: Vec<Vec<u64>>,
    /// Reused by every exchange, so the latency path allocates nothing. Empty between calls.
    scratch: Scratch,
}

#[derive(Default)]
struct Scratch {
    /// channels[peer * streams + stream]
    channels: Vec<Channel>,
    busy: Vec<usize>,
    pollfds: Vec<libc::pollfd>,
}

// The scratch pieces hold raw pointers only during an exchange (they are cleared before it
// returns); the sockets themselves are Send.
unsafe impl Send for TcpTransport {}

/// Where one data connection to a peer goes: the peer's address, and this rank's own address
/// to leave from (the cable's, over links).
#[derive(Debug, Clone, Copy)]
pub struct Route {
    pub bind: Option<IpAddr>,
    pub to: SocketAddr,
}

/// Every peer reached the same way, on one network: `addrs[peer]` from `bind`.
pub fn one_network(rank: usize, addrs: &[SocketAddr], bind: Option<IpAddr>) -> Vec<Vec<Route>> {
    addrs
        .iter()
        .enumerate()
        .map(|(p, &to)| {
            if p == rank {
                vec![]
            } else {
                vec![Route { bind, to }]
            }
        })
        .collect()
}

/// Connects every pair of ranks: each rank dials the ranks below it and accepts the ranks above
/// it (dialling first cannot deadlock: the kernel completes a connect from the listen backlog).
/// Every connection opens with the session token; one that does not, or not soon enough, is
/// refused and logged and the mesh keeps waiting for the real peer.
#[allow(clippy::too_many_arguments)]
pub fn connect_mesh(
    rank: usize,
    listener: TcpListener,
    routes: &[Vec<Route>],
    token: &[u8; 16],
    names: Vec<PeerName>,
    opts: TcpOptions,
) -> Result<TcpTransport> {
    let size = routes.len();
    let k = opts.streams.max(1);
    let linked: Vec<bool> = routes.iter().map(|r| !r.is_empty()).collect();
    let mut conns: Vec<Vec<Option<TcpStream>>> =
        (0..size).map(|_| (0..k).map(|_| None).collect()).collect();
    for (peer, cables) in routes.iter().enumerate().take(rank) {
        if cables.is_empty() {
            continue;
        }
        for (s, slot) in conns[peer].iter_mut().enumerate() {
            // Stream s rides cable s mod the pair's cables: several cables share the streams.
            let Route { bind, to: addr } = cables[s % cables.len()];
            let stream = dial(addr, bind, opts.timeout)
                .with_context(|| format!("cannot reach {} at {addr}", names[peer]))?;
            let mut hello = Vec::with_capacity(HELLO_LEN);
            hello.extend_from_slice(HELLO_MAGIC);
            hello.extend_from_slice(token);
            hello.extend_from_slice(&(rank as u32).to_le_bytes());
            hello.extend_from_slice(&(s as u32).to_le_bytes());
            hello.extend_from_slice(&(k as u32).to_le_bytes());
            (&stream)
                .write_all(&hello)
                .with_context(|| format!("cannot greet {} at {addr}", names[peer]))?;
            *slot = Some(stream);
        }
    }
    let mut expected = (rank + 1..size).filter(|p| linked[*p]).count() * k;
    let deadline = Instant::now() + opts.timeout;
    listener.set_nonblocking(true)?;
    // The port is open to anyone who finds it; strangers are read only as their bytes come.
    let mut gate = Gate::new(format!("tbbench: rank {rank}: "), "data").hold_closed();
    while expected > 0 {
        if Instant::now() > deadline {
            gate.flush();
            let missing: Vec<String> = (rank + 1..size)
                .filter(|p| linked[*p] && conns[*p].iter().any(|c| c.is_none()))
                .map(|p| names[p].to_string())
                .collect();
            bail!(
                "timed out after {:.0} s waiting for data connections from {}",
                opts.timeout.as_secs_f64(),
                missing.join(", ")
            );
        }
        gate.wait(&listener, Duration::from_millis(50));
        let judge = |got: &[u8]| judge_hello(got, token, rank, &linked, k);
        for (stream, from, (peer, s)) in gate.step(&listener, judge) {
            if conns[peer][s].is_some() {
                gate.refuse(
                    from,
                    &format!("a second connection {s} from {}", names[peer]),
                );
                continue;
            }
            conns[peer][s] = Some(stream);
            expected -= 1;
        }
    }
    gate.flush();
    let mut ready = Vec::with_capacity(size);
    for row in conns {
        let mut streams = Vec::new();
        for c in row.into_iter().flatten() {
            tune(&c, &opts)?;
            streams.push(c);
        }
        ready.push(streams);
    }
    let mut t = TcpTransport {
        rank,
        size,
        conns: ready,
        names,
        opts,
        paced_slice: None,
        waiting: Waiting::Spin,
        traffic: Traffic::Both,
        shares: vec![Vec::new(); size],
        scratch: Scratch::default(),
    };
    t.paced_slice = t.paced_slice();
    Ok(t)
}

/// Judges a data connection's hello as its bytes arrive: magic, token, then which rank and
/// which of its streams (only ranks above this one dial it).
fn judge_hello(
    got: &[u8],
    token: &[u8; 16],
    rank: usize,
    linked: &[bool],
    streams: usize,
) -> Verdict<(usize, usize)> {
    let size = linked.len();
    if got.len() < 20 {
        return Verdict::Need(20);
    }
    if &got[0..4] != HELLO_MAGIC || !same_secret(&got[4..20], token) {
        return Verdict::Refuse("wrong or missing session token".into());
    }
    if got.len() < HELLO_LEN {
        return Verdict::Need(HELLO_LEN);
    }
    let peer = u32::from_le_bytes(got[20..24].try_into().expect("4 bytes")) as usize;
    let s = u32::from_le_bytes(got[24..28].try_into().expect("4 bytes")) as usize;
    let theirs = u32::from_le_bytes(got[28..32].try_into().expect("4 bytes")) as usize;
    if peer <= rank || peer >= size || s >= streams {
        return Verdict::Refuse(format!("rank {peer}'s stream {s} does not fit this run"));
    }
    if !linked[peer] {
        return Verdict::Refuse(format!(
            "rank {peer} has no cable to rank {rank} in this run"
        ));
    }
    if theirs != streams {
        return Verdict::Refuse(format!(
            "rank {peer} opens {theirs} connection(s) per pair and rank {rank} {streams}: give every rank the same --streams and --congestion"
        ));
    }
    Verdict::Admit((peer, s))
}

fn dial(addr: SocketAddr, bind_ip: Option<IpAddr>, timeout: Duration) -> Result<TcpStream> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if let Some(ip) = bind_ip {
        sock.bind(&SocketAddr::new(ip, 0).into())
            .with_context(|| format!("cannot bind to {ip}"))?;
    }
    // Retried because a peer's listener may be a moment behind the rendezvous on a busy host.
    let deadline = Instant::now() + timeout;
    loop {
        match sock.connect_timeout(&addr.into(), timeout) {
            Ok(()) => return Ok(sock.into()),
            Err(e)
                if Instant::now() < deadline
                    && e.kind() == std::io::ErrorKind::ConnectionRefused =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(anyhow!("{e} after {:.0} s", timeout.as_secs_f64())),
        }
    }
}

fn tune(stream: &TcpStream, opts: &TcpOptions) -> Result<()> {
    stream.set_nodelay(true)?;
    stream.set_nonblocking(false)?;
    // Blocking calls time out on their own; the poll path uses the same limit.
    stream.set_read_timeout(Some(opts.timeout))?;
    stream.set_write_timeout(Some(opts.timeout))?;
    let sock = socket2::SockRef::from(stream);
    if let Some(b) = opts.sockbuf {
        sock.set_send_buffer_size(b)?;
        sock.set_recv_buffer_size(b)?;
    }
    #[cfg(target_vendor = "apple")]
    sock.set_nosigpipe(true)?;
    if let Some(name) = &opts.congestion {
        set_congestion(&sock, name)?;
    }
    Ok(())
}

/// Sets the connection's congestion control, or says in one line why it cannot be had here.
#[cfg(target_os = "linux")]
fn set_congestion(sock: &socket2::SockRef, name: &str) -> Result<()> {
    sock.set_tcp_congestion(name.as_bytes()).map_err(|e| {
        let list = |what: &str| {
            crate::sysinfo::tcp_congestion(&format!("{what}_congestion_control"))
                .unwrap_or_default()
        };
        match e.raw_os_error() {
            Some(libc::EPERM) => anyhow!(
                "--congestion {name}: not allowed for this user (allowed: {}; root may set any of: {})",
                list("allowed"),
                list("available")
            ),
            _ => anyhow!(
                "--congestion {name}: not available on this host (available: {}; others need their kernel module, e.g. modprobe tcp_{name})",
                list("available")
            ),
        }
    })
}

#[cfg(not(target_os = "linux"))]
fn set_congestion(_sock: &socket2::SockRef, name: &str) -> Result<()> {
    bail!("--congestion {name}: this OS has no per-connection congestion control (Linux has)")
}

#[cfg(target_os = "linux")]
const SEND_FLAGS: libc::c_int = libc::MSG_NOSIGNAL;
#[cfg(not(target_os = "linux"))]
const SEND_FLAGS: libc::c_int = 0;

/// One contiguous part of a message on one connection. Holds a raw pointer because one
/// syscall may fill several posted receives at once (each a distinct buffer).
struct Piece {
    data: *mut u8,
    len: usize,
    /// The header this piece carries or must arrive with ([`header`]).
    expect: u64,
    hdr: [u8; HDR],
    /// Bytes of header + payload + padding moved so far.
    done: usize,
}

/// A piece's header bytes: the header value, then zeros to a cache line.
fn header_bytes(expect: u64) -> [u8; HDR] {
    let mut h = [0u8; HDR];
    h[..HDR_VALUE].copy_from_slice(&expect.to_le_bytes());
    h
}

/// Pieces one sendmsg/recvmsg may cover. Reading across message boundaries matters: a read
/// that must stop exactly at the end of a message costs a wake-up per message (measured here:
/// about 13% of loopback bandwidth at 1 MiB).
const MAX_BATCH: usize = 16;
/// How long an exchange retries (yielding the core between tries) before it sleeps in poll,
/// when the host has a core for every rank on it: as long as the verbs transport spins.
pub const SPIN_BEFORE_POLL: Duration = Duration::from_millis(1);
/// The same with more ranks than cores, where spinning only delays the rank waited for.
pub const SPIN_OVERSUBSCRIBED: Duration = Duration::from_micros(50);
/// The most one send syscall takes: small messages are gathered up to it, and while the same
/// connection also has bytes to receive (an exchange: both ranks send at once), a large
/// message goes a slice at a time, with the receive between slices. Sent whole, each rank
/// reads nothing until its own send is done; in slices, sending and reading alternate and
/// both directions advance together. (Under BBR, whose pacing sets loopback's rate, see
/// [`PACED_SLICE_BYTES`].) Where the congestion control does not pace, a one-way stream goes
/// whole: slices cost it bandwidth. Re-measure: `CONGESTION=cubic scripts/bench-coll.sh 5 2`
/// (1 MiB all-gather and all-reduce) and `tbbench link --streams 1 --sizes 1MiB` under
/// cubic, with this constant changed.
const SLICE_BYTES: usize = 256 << 10;
/// Under a congestion control that paces every segment ([`PACING_CONGESTION`]) every send
/// syscall, one-way or in an exchange, moves at most this much. Linux holds a paced
/// connection's segments for a timer, one slot per segment however short, and a write that
/// ends a few hundred bytes past a whole number of segments leaves such a short one: loopback's
/// MSS is 65483, just under 64 KiB, so power-of-two writes do exactly that. A fixed size,
/// measured rather than derived, since the MSS cannot be asked for (TCP_MAXSEG reads 65536 on
/// a fresh loopback connection, whose segments start at 32741 and grow to 65483): 120 KiB is
/// no power of two and no small multiple of either segment size, and ran as fast as whole
/// segments (and faster than power-of-two writes or one write per message); it was not
/// measured on a NIC with fq, which paces by itself. Under cubic whole writes stay faster, so
/// other congestion controls keep [`SLICE_BYTES`] for exchanges and send one-way messages
/// whole. Re-measure under bbr: `tbbench coll --op broadcast --sizes 2MiB` (2 ranks) and
/// `tbbench link --streams 1 --sizes 1MiB` beside `iperf3`, with this constant changed.
const PACED_SLICE_BYTES: usize = 120 << 10;
/// What a reduction step receives and adds at a time ([`Transport::reduce_segment`]): a
/// segment still in cache when it is added (about one core's L2); smaller ones gained nothing
/// over whole messages. Re-measure: `tbbench coll --algo ring --sizes 16MiB,64MiB` (2 ranks
/// over loopback) with this constant changed.
const REDUCE_SEGMENT_BYTES: usize = 1 << 20;

impl Piece {
    /// Zeros after the payload that end the piece on a cache line.
    fn pad(&self) -> usize {
        (ALIGN - (HDR + self.len) % ALIGN) % ALIGN
    }
    fn remaining(&self) -> usize {
        HDR + self.len + self.pad() - self.done
    }
}

/// A piece's header: the message's length in the low 56 bits and how many pieces it was cut
/// into in the top 8, so that two ends that cut a message differently fail in one line rather
/// than read one piece's bytes as another's.
fn header(total: usize, pieces: usize) -> u64 {
    total as u64 | (pieces as u64) << 56
}
const HEADER_LEN_BITS: u64 = (1 << 56) - 1;

/// How many pieces a `len`-byte message is cut into over `k` connections.
fn pieces(len: usize, k: usize) -> usize {
    if len < STRIPE_MIN {
        1
    } else {
        k
    }
}

/// The pieces of a `len`-byte message, as (stream, offset, length); both ends compute the same.
/// Each stream's piece is its share of `weights` (one per stream, each at least 1) where they
/// are given, else an equal one.
pub(super) fn stripes(
    len: usize,
    k: usize,
    weights: &[u64],
) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    let parts = pieces(len, k);
    let weighted = parts > 1 && weights.len() == parts;
    let total: u128 = if weighted {
        weights.iter().map(|&w| u128::from(w)).sum()
    } else {
        parts as u128
    };
    let upto = move |s: usize| -> u128 {
        if weighted {
            weights[..s].iter().map(|&w| u128::from(w)).sum()
        } else {
            s as u128
        }
    };
    (0..parts).map(move |s| {
        let lo = (len as u128 * upto(s) / total) as usize;
        let hi = (len as u128 * upto(s + 1) / total) as usize;
        (s, lo, hi - lo)
    })
}

/// Bytes each cable of a pair is timed with, after as many again to open TCP's window.
pub(super) const WEIGH_BYTES: usize = 4 << 20;

#[derive(Default)]
struct Channel {
    sends: std::collections::VecDeque<Piece>,
    recvs: std::collections::VecDeque<Piece>,
}

enum Io {
    Moved(usize),
    WouldBlock,
}

impl TcpTransport {
    /// Times each cable of every pair with several (`cables[peer]`, the pair's cable count;
    /// stream s rides cable s mod that) and stripes the pair's messages by the rates found:
    /// the lower rank sends [`WEIGH_BYTES`] twice down each cable's first stream, timing the
    /// second until the higher rank's one-byte answer, then tells it the weights. Pairs go in
    /// one order on every rank (lowest pair first), so no two ranks wait on each other.
    pub fn weigh_cables(&mut self, cables: &[usize]) -> Result<()> {
        use std::io::Read;
        let k = self.opts.streams.max(1);
        let me = self.rank;
        let mut order: Vec<usize> = (0..self.size)
            .filter(|&p| {
                p != me
                    && cables.get(p).copied().unwrap_or(1).min(k) > 1
                    && !self.conns[p].is_empty()
            })
            .collect();
        // The pair (min, max) order, the same on both ends of each pair.
        order.sort_by_key(|&p| (me.min(p), me.max(p)));
        let mut data = vec![0u8; WEIGH_BYTES];
        for peer in order {
            let c = cables[peer].min(k);
            let name = self.names[peer].to_string();
            let ctx = |what: &str| format!("timing the cables to {name}: {what}");
            let mut weights = vec![0u64; k];
            if me < peer {
                let mut rate = vec![0.0f64; c];
                for (cable, r) in rate.iter_mut().enumerate() {
                    let mut conn = &self.conns[peer][cable];
                    let mut ack = [0u8; 1];
                    conn.write_all(&data).with_context(|| ctx("sending"))?;
                    conn.read_exact(&mut ack).with_context(|| ctx("waiting"))?;
                    let t = Instant::now();
                    conn.write_all(&data).with_context(|| ctx("sending"))?;
                    conn.read_exact(&mut ack).with_context(|| ctx("waiting"))?;
                    *r = WEIGH_BYTES as f64 / t.elapsed().as_secs_f64().max(1e-9);
                }
                // Each stream its cable's rate over the streams on that cable, in kB/s.
                for (s, w) in weights.iter_mut().enumerate() {
                    let on_cable = (0..k).filter(|x| x % c == s % c).count() as f64;
                    *w = ((rate[s % c] / on_cable / 1e3) as u64).max(1);
                }
                let mut msg = Vec::with_capacity(8 * k);
                for w in &weights {
                    msg.extend_from_slice(&w.to_le_bytes());
                }
                (&self.conns[peer][0])
                    .write_all(&msg)
                    .with_context(|| ctx("sending the weights"))?;
            } else {
                for cable in 0..c {
                    let mut conn = &self.conns[peer][cable];
                    for _ in 0..2 {
                        conn.read_exact(&mut data)
                            .with_context(|| ctx("receiving"))?;
                        conn.write_all(&[1]).with_context(|| ctx("answering"))?;
                    }
                }
                let mut msg = vec![0u8; 8 * k];
                (&self.conns[peer][0])
                    .read_exact(&mut msg)
                    .with_context(|| ctx("receiving the weights"))?;
                for (w, b) in weights.iter_mut().zip(msg.chunks_exact(8)) {
                    *w = u64::from_le_bytes(b.try_into().expect("8 bytes")).max(1);
                }
            }
            self.shares[peer] = weights;
        }
        Ok(())
    }

    /// Each stream's share of a striped message to `peer`, where its cables were timed.
    pub fn stripe_shares(&self, peer: usize) -> &[u64] {
        &self.shares[peer]
    }

    /// The descriptors of the connections to `peer`, in stream order (tests read their
    /// kernel counters).
    #[cfg(all(test, target_os = "linux"))]
    pub(super) fn stream_fds(&self, peer: usize) -> Vec<i32> {
        self.conns[peer].iter().map(|c| c.as_raw_fd()).collect()
    }

    /// The local address of this rank's first data connection: the interface the data really
    /// uses, whatever was (or was not) asked for.
    pub fn local_ip(&self) -> Option<IpAddr> {
        self.conns
            .iter()
            .flatten()
            .next()
            .and_then(|c| c.local_addr().ok())
            .map(|a| a.ip())
    }

    /// The congestion control of this rank's first data connection, as the kernel reports it
    /// (Linux; None elsewhere).
    pub fn congestion(&self) -> Option<String> {
        #[cfg(target_os = "linux")]
        {
            let c = self.conns.iter().flatten().next()?;
            let name = socket2::SockRef::from(c).tcp_congestion().ok()?;
            let name = String::from_utf8_lossy(&name);
            Some(name.trim_end_matches('\0').to_string()).filter(|n| !n.is_empty())
        }
        #[cfg(not(target_os = "linux"))]
        None
    }

    /// The socket buffer size the first data connection got, where one was set: the kernel
    /// caps what is asked at its limit (Linux: net.core.wmem_max and rmem_max) and reports
    /// twice what it granted (the other half is its bookkeeping's share).
    pub(super) fn sockbuf_granted(&self) -> Option<usize> {
        self.opts.sockbuf?;
        let sock = socket2::SockRef::from(self.conns.iter().flatten().next()?);
        let granted = sock
            .send_buffer_size()
            .ok()?
            .min(sock.recv_buffer_size().ok()?);
        Some(if cfg!(target_os = "linux") {
            granted / 2
        } else {
            granted
        })
    }

    /// [`PACED_SLICE_BYTES`] where the first data connection's congestion control paces every
    /// segment; None otherwise (or where the kernel does not say).
    fn paced_slice(&self) -> Option<usize> {
        let cc = self.congestion()?;
        PACING_CONGESTION
            .contains(&cc.as_str())
            .then_some(PACED_SLICE_BYTES)
    }

    fn io_error(&self, peer: usize, what: &str, err: std::io::Error) -> anyhow::Error {
        match err.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                anyhow!(
                    "timed out after {:.0} s {what} {}",
                    self.opts.timeout.as_secs_f64(),
                    self.names[peer]
                )
            }
            std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::BrokenPipe
            | std::io::ErrorKind::UnexpectedEof => {
                anyhow!(
                    "{} closed the connection (it exited or was killed)",
                    self.names[peer]
                )
            }
            _ => anyhow!("tcp {what} {}: {err}", self.names[peer]),
        }
    }

    /// Moves as many bytes of the first queued pieces as the socket takes now, in one
    /// non-blocking syscall; a send moves at most `limit` bytes.
    fn transfer(
        fd: i32,
        queue: &mut VecDeque<Piece>,
        send: bool,
        limit: usize,
    ) -> std::io::Result<Io> {
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 3 * MAX_BATCH];
        // A receive's padding lands here and is dropped (any number of pieces may share it).
        let mut pad_in = [0u8; ALIGN];
        let mut n_iov = 0;
        let mut bytes = 0;
        for piece in queue.iter_mut().take(MAX_BATCH) {
            // Small messages are gathered into one syscall; a large one goes alone (or its
            // first `limit` bytes do).
            if send && bytes >= SLICE_BYTES.min(limit) {
                break;
            }
            let room = if send { limit - bytes } else { usize::MAX };
            let moving = piece.remaining().min(room);
            bytes += moving;
            let mut left = moving;
            if piece.done < HDR && left > 0 {
                let take = (HDR - piece.done).min(left);
                iov[n_iov] = libc::iovec {
                    iov_base: piece.hdr[piece.done..].as_mut_ptr() as *mut _,
                    iov_len: take,
                };
                n_iov += 1;
                left -= take;
            }
            let pdone = piece.done.saturating_sub(HDR).min(piece.len);
            if piece.len > pdone && left > 0 {
                let take = (piece.len - pdone).min(left);
                // SAFETY: data points at len bytes of a buffer the caller of exchange lent us.
                iov[n_iov] = libc::iovec {
                    iov_base: unsafe { piece.data.add(pdone) } as *mut _,
                    iov_len: take,
                };
                n_iov += 1;
                left -= take;
            }
            if left > 0 {
                // The padding that ends the piece on a cache line.
                iov[n_iov] = libc::iovec {
                    iov_base: if send {
                        PAD_OUT.as_ptr() as *mut _
                    } else {
                        pad_in.as_mut_ptr() as *mut _
                    },
                    iov_len: left,
                };
                n_iov += 1;
            }
        }
        // SAFETY: msghdr points at iovecs that live across the call and cover valid memory;
        // receive iovecs point into distinct, exclusively borrowed buffers.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = n_iov as _;
        let n = unsafe {
            if send {
                libc::sendmsg(fd, &msg, SEND_FLAGS | libc::MSG_DONTWAIT)
            } else {
                libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT)
            }
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return match e.kind() {
                std::io::ErrorKind::WouldBlock => Ok(Io::WouldBlock),
                std::io::ErrorKind::Interrupted => Ok(Io::Moved(0)),
                _ => Err(e),
            };
        }
        if n == 0 && !send {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(Io::Moved(n as usize))
    }

    fn check_header(&self, peer: usize, piece: &Piece) -> Result<()> {
        let got = u64::from_le_bytes(piece.hdr[..HDR_VALUE].try_into().expect("8 bytes"));
        let (sent, wanted) = (got & HEADER_LEN_BITS, piece.expect & HEADER_LEN_BITS);
        if sent != wanted {
            bail!(
                "message size mismatch from {}: it sent {sent} bytes, {wanted} were expected",
                self.names[peer]
            );
        }
        if got != piece.expect {
            bail!(
                "{} cut a message of {sent} bytes into {} piece(s) over the connections, rank {} into {}: both ends must stripe alike (the same --streams, and one-way traffic set on both)",
                self.names[peer],
                got >> 56,
                self.rank,
                piece.expect >> 56
            );
        }
        Ok(())
    }
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }

    fn timeout(&self) -> Duration {
        self.opts.timeout
    }

    fn reduce_segment(&self) -> Option<usize> {
        Some(REDUCE_SEGMENT_BYTES)
    }

    fn set_timeout(&mut self, timeout: Duration) -> Result<()> {
        self.opts.timeout = timeout;
        for c in self.conns.iter().flatten() {
            c.set_read_timeout(Some(timeout))?;
            c.set_write_timeout(Some(timeout))?;
        }
        Ok(())
    }

    fn set_waiting(&mut self, waiting: Waiting) {
        self.waiting = waiting;
    }

    fn set_traffic(&mut self, traffic: Traffic) {
        self.traffic = traffic;
    }

    fn exchange(&mut self, sends: &[SendOp], recvs: &mut [RecvOp]) -> Result<()> {
        let mut scratch = std::mem::take(&mut self.scratch);
        let result = self.exchange_with(&mut scratch, sends, recvs);
        // No piece (and no pointer into the caller's buffers) outlives the call.
        for c in &mut scratch.channels {
            c.sends.clear();
            c.recvs.clear();
        }
        self.scratch = scratch;
        result
    }
}

impl TcpTransport {
    /// Over links, a pair with no cable has no connection: a suite that sends there anyway
    /// gets one line, not an index out of range.
    fn linked_to(&self, peer: usize) -> Result<()> {
        if self.conns[peer].is_empty() {
            bail!(
                "{} has no cable to {} (network.topology.unlinked)",
                self.names[self.rank],
                self.names[peer]
            );
        }
        Ok(())
    }

    fn exchange_with(
        &mut self,
        scratch: &mut Scratch,
        sends: &[SendOp],
        recvs: &mut [RecvOp],
    ) -> Result<()> {
        let k = self.opts.streams.max(1);
        // The connections a message is striped over; both ends compute the same.
        let parts = match self.traffic {
            Traffic::OneWay if !self.opts.stripe_one_way => 1,
            _ => k,
        };
        let Scratch {
            channels,
            busy,
            pollfds,
        } = scratch;
        channels.resize_with(self.size * k, Channel::default);
        for op in sends.iter() {
            if op.peer >= self.size || op.peer == self.rank {
                bail!("rank {} cannot send to rank {}", self.rank, op.peer);
            }
            self.linked_to(op.peer)?;
            let expect = header(op.buf.len(), pieces(op.buf.len(), parts));
            for (s, off, len) in stripes(op.buf.len(), parts, &self.shares[op.peer]) {
                channels[op.peer * k + s].sends.push_back(Piece {
                    data: op.buf[off..].as_ptr() as *mut u8,
                    len,
                    expect,
                    hdr: header_bytes(expect),
                    done: 0,
                });
            }
        }
        for op in recvs.iter_mut() {
            if op.peer >= self.size || op.peer == self.rank {
                bail!("rank {} cannot receive from rank {}", self.rank, op.peer);
            }
            self.linked_to(op.peer)?;
            let expect = header(op.buf.len(), pieces(op.buf.len(), parts));
            for (s, off, len) in stripes(op.buf.len(), parts, &self.shares[op.peer]) {
                channels[op.peer * k + s].recvs.push_back(Piece {
                    data: op.buf[off..].as_mut_ptr(),
                    len,
                    expect,
                    hdr: [0; HDR],
                    done: 0,
                });
            }
        }
        // The answer to a message, the next piece of a large one, a collective's next step
        // all come within microseconds, and a sleeping thread takes far longer than that to
        // wake (tens of microseconds on a VM whose idle vCPUs halt): so the exchange retries
        // non-blocking calls for a while before it sleeps in poll, as MPI libraries' progress
        // loops do. Beside a computation the spin would take its core: sleep at once.
        let spin_for = match self.waiting {
            Waiting::Spin => self.opts.spin,
            Waiting::Beside => Duration::ZERO,
        };
        let mut last_progress = Instant::now();
        loop {
            busy.clear();
            busy.extend(
                (0..channels.len())
                    .filter(|c| !channels[*c].sends.is_empty() || !channels[*c].recvs.is_empty()),
            );
            if busy.is_empty() {
                return Ok(());
            }
            let mut progressed = false;
            for &c in busy.iter() {
                let (peer, s) = (c / k, c % k);
                let fd = self.conns[peer][s].as_raw_fd();
                // An exchange on this connection: one slice, then what has come in.
                let two_way = !channels[c].recvs.is_empty();
                let limit = match (self.paced_slice, two_way) {
                    (Some(slice), _) => slice,
                    (None, true) => SLICE_BYTES,
                    (None, false) => usize::MAX,
                };
                while !channels[c].sends.is_empty() {
                    match Self::transfer(fd, &mut channels[c].sends, true, limit)
                        .map_err(|e| self.io_error(peer, "sending to", e))?
                    {
                        Io::Moved(mut n) => {
                            progressed |= n > 0;
                            while n > 0 {
                                let Some(piece) = channels[c].sends.front_mut() else {
                                    break;
                                };
                                let take = n.min(piece.remaining());
                                piece.done += take;
                                n -= take;
                                if piece.remaining() == 0 {
                                    channels[c].sends.pop_front();
                                }
                            }
                        }
                        Io::WouldBlock => break,
                    }
                    if two_way {
                        break;
                    }
                }
                while !channels[c].recvs.is_empty() {
                    match Self::transfer(fd, &mut channels[c].recvs, false, usize::MAX)
                        .map_err(|e| self.io_error(peer, "waiting for", e))?
                    {
                        Io::Moved(mut n) => {
                            progressed |= n > 0;
                            while n > 0 {
                                let Some(piece) = channels[c].recvs.front_mut() else {
                                    break;
                                };
                                let take = n.min(piece.remaining());
                                let before = piece.done;
                                piece.done += take;
                                n -= take;
                                if before < HDR && piece.done >= HDR {
                                    self.check_header(peer, piece)?;
                                }
                                if piece.remaining() == 0 {
                                    channels[c].recvs.pop_front();
                                }
                            }
                        }
                        Io::WouldBlock => break,
                    }
                }
            }
            if progressed {
                last_progress = Instant::now();
                continue;
            }
            let waited = last_progress.elapsed();
            if waited < spin_for {
                if self.opts.yield_while_spinning {
                    // SAFETY: plain syscall.
                    unsafe { libc::sched_yield() };
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            crate::abort::check_abort()?;
            if waited >= self.opts.timeout {
                let who: Vec<String> = busy.iter().map(|c| self.names[c / k].to_string()).collect();
                bail!(
                    "timed out after {:.0} s waiting for {}",
                    self.opts.timeout.as_secs_f64(),
                    who.join(", ")
                );
            }
            pollfds.clear();
            for &c in busy.iter() {
                let (peer, s) = (c / k, c % k);
                let mut events = 0;
                if !channels[c].sends.is_empty() {
                    events |= libc::POLLOUT;
                }
                if !channels[c].recvs.is_empty() {
                    events |= libc::POLLIN;
                }
                pollfds.push(libc::pollfd {
                    fd: self.conns[peer][s].as_raw_fd(),
                    events,
                    revents: 0,
                });
            }
            // At most 100 ms per poll, so an abort is seen while the peers are silent.
            let left = (self.opts.timeout - waited).as_millis().clamp(1, 100) as i32;
            // SAFETY: pollfds is a valid array of pollfd for the call.
            let rc = unsafe { libc::poll(pollfds.as_mut_ptr(), pollfds.len() as _, left) };
            if rc < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e).context("poll");
                }
            }
        }
    }
}
