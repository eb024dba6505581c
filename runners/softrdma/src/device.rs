//! One opened device: its memory regions, queue pairs and completion queues, and the threads
//! that move bytes between queue pairs.
//!
//! Wire: every device listens on a TCP port of its own (any free one). A queue pair's number
//! is that port shifted left by 8 plus an 8-bit index, so the number a peer learns at its
//! rendezvous, with the IPv4-mapped GID it learns beside it, is all it needs to reach the
//! queue pair: no file, no registry, and it works between network namespaces and hosts as it
//! does on one host. Each queue pair in RTS has a sender thread that connects to its peer's
//! device on first use and writes one frame per work request; each accepted connection has a
//! reader thread that matches the frames to posted receives (or, for RDMA WRITE, to a
//! registered region) and writes the completions. Every blocking call has a timeout of at most
//! 200 ms after which the thread checks whether it should stop, so closing a device or
//! destroying a queue pair never waits on a peer.
//!
//! Strangers: queue pair numbers follow from the port, so anyone who can reach it could
//! address a queue pair. A run's ranks share a secret (`softrdma_join_run`, which tbbench
//! calls with its session token before it opens the device) that every connection's hello
//! must carry, and the device listens on the run's address only. Until its hello is whole a
//! connection waits at the door the rendezvous uses (tbbench-gate: one deadline, a cap on
//! how many wait, no thread of its own), and frames on a connection must come from the queue
//! pair its hello named.

use crate::abi::*;
use crate::rules::{frames, Rules};
use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long a blocked thread waits before it looks at the stop flags again.
const TICK: Duration = Duration::from_millis(200);
const HELLO_MAGIC: u32 = 0x5352_4448; // "SRDH"
const FRAME_MAGIC: u32 = 0x5352_4446; // "SRDF"
/// magic, version, source qpn, destination qpn, rules, a reserved word, then the run's
/// secret ([`SECRET_LEN`] bytes, zero where no run was joined).
const HELLO_LEN: usize = 24 + SECRET_LEN;
const HELLO_VERSION: u32 = 2;
/// What a device sends back once it has admitted a connection's hello.
const WELCOME_MAGIC: u32 = 0x5352_4457; // "SRDW"
/// How long a queue pair keeps trying to be admitted by a crowded peer device.
const ADMISSION_LIMIT: Duration = Duration::from_secs(5);
/// The run's secret, as long as tbbench's session token.
pub const SECRET_LEN: usize = 16;
const HDR_LEN: usize = 40;
const KIND_SEND: u32 = 1;
const KIND_WRITE: u32 = 2;
const KIND_WRITE_IMM: u32 = 3;

/// Locks, carrying on past a poisoned lock: a panic in one thread (caught at the FFI
/// boundary) must not wedge the device for every other call.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

macro_rules! counters {
    ($($(#[$doc:meta])* $f:ident),* $(,)?) => {
        /// What the device did, dropped and refused; read by tests (the stats file written at
        /// close, or `softrdma_counters_json`).
        #[derive(Default)]
        pub struct Counters { $($(#[$doc])* pub $f: AtomicU64,)* }
        impl Counters {
            pub fn json(&self) -> String {
                let fields: Vec<String> = vec![$(format!("\"{}\": {}", stringify!($f), self.$f.load(Ordering::Relaxed))),*];
                fields.join(", ")
            }
        }
    };
}

counters! {
    /// SEND work requests posted.
    sends_posted,
    /// RDMA WRITE (with or without immediate) work requests posted.
    writes_posted,
    recvs_posted,
    /// Payload bytes written to peers.
    bytes_sent,
    /// Frames that landed (a receive or a written region).
    delivered,
    /// Control and data messages the device moved, per kind of frame: what a test counts to
    /// see how many operations a message costs.
    frames_sent,
    /// A SEND (or a WRITE's immediate) on UC that found no posted receive: dropped, no error.
    dropped_no_recv,
    /// Frames for a queue pair that is not in RTR/RTS or not connected to the sender.
    dropped_not_ready,
    /// UC sends to a peer that is gone: completed as sent, never delivered (no error, as UC).
    dropped_peer_gone,
    /// Connections refused at the door: a wrong secret or hello, or no whole hello in time.
    refused_connections,
    /// Frames whose source was not the queue pair the connection's hello named.
    dropped_wrong_source,
    /// Receives posted before RTS where the rules lose them.
    recvs_lost_before_rts,
    /// Receives completed with an error because the SEND's size did not fit (length or, on
    /// Apple's rules, the count of 4 KiB frames).
    frame_mismatch,
    /// Completions with an error status of any kind.
    error_completions,
    refused_rc_qp,
    refused_write,
    refused_mr_limit,
    refused_qp_limit,
    /// Posts beyond the granted depth (outstanding work requests, or frames on Apple's rules).
    refused_over_depth,
    /// Posts in a queue-pair state that does not allow them.
    refused_bad_state,
    /// ibv_modify_qp calls refused (a wrong transition, a missing or extra attribute).
    refused_modify,
    /// WRITEs naming memory the target did not register for remote writing.
    refused_remote_access,
    /// Work requests naming memory this device did not register.
    refused_bad_lkey,
    cq_overflows,
    /// Memory regions and queue pairs still alive when the device was closed.
    mrs_left_at_close,
    qps_left_at_close,
}

pub struct MrInfo {
    pub addr: u64,
    pub len: u64,
    pub access: i32,
}

pub struct Cq {
    pub q: Mutex<VecDeque<IbvWc>>,
    pub cqe: usize,
    pub users: AtomicUsize,
    pub dev: Arc<Dev>,
}

impl Cq {
    pub fn push(&self, wc: IbvWc) {
        if wc.status != IBV_WC_SUCCESS {
            self.dev.c.error_completions.fetch_add(1, Ordering::Relaxed);
        }
        let mut q = lock(&self.q);
        if q.len() >= self.cqe {
            // A real CQ overruns into an async error; this one keeps the entry and counts it.
            self.dev.c.cq_overflows.fetch_add(1, Ordering::Relaxed);
        }
        q.push_back(wc);
    }
}

pub struct Recv {
    pub wr_id: u64,
    pub sges: Vec<(u64, u32)>,
    pub total: u64,
    pub cost: u32,
}

pub struct QpState {
    pub attr: IbvQpAttr,
    pub recvs: VecDeque<Recv>,
    pub send_out: u32,
    pub recv_out: u32,
}

pub struct Job {
    pub wr_id: u64,
    pub signaled: bool,
    pub kind: u32,
    pub sges: Vec<(u64, u32)>,
    pub len: u64,
    pub imm: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    pub cost: u32,
    /// Set when the request was bad from the start: it completes with this status.
    pub error: Option<u32>,
}

pub struct Qp {
    pub dev: Arc<Dev>,
    pub qpn: u32,
    pub qp_type: u32,
    pub send_cq: Arc<Cq>,
    pub recv_cq: Arc<Cq>,
    pub sig_all: bool,
    pub cap: IbvQpCap,
    pub st: Mutex<QpState>,
    /// Signalled when a receive is posted or the state changes.
    pub cv: Condvar,
    pub destroyed: AtomicBool,
    /// Held while the reader writes (`rx`) or the sender reads (`tx`) the application's
    /// memory for this queue pair, so destroying it waits until neither does. Two locks: a
    /// queue pair sends and receives at once, and with one lock two peers each writing a
    /// large message to the other would each wait for the other's reader.
    pub io_rx: Mutex<()>,
    pub io_tx: Mutex<()>,
    pub sender: Mutex<Option<(mpsc::Sender<Job>, JoinHandle<()>)>>,
}

pub struct Dev {
    /// As listed: `softrdma_apple0`, `rdma_en3`.
    pub name: String,
    pub rules: &'static Rules,
    pub gids: Vec<[u8; 16]>,
    /// The run's secret when the device was opened: every hello carries it.
    pub secret: [u8; SECRET_LEN],
    pub port: u16,
    pub stop: AtomicBool,
    pub mrs: Mutex<HashMap<u32, MrInfo>>,
    pub qps: Mutex<HashMap<u32, Arc<Qp>>>,
    pub next_key: AtomicU32,
    pub c: Counters,
    pub threads: Mutex<Vec<JoinHandle<()>>>,
    /// Fault injection for tests (`TBBENCH_SOFTRDMA_FAIL_RECV=N`): the Nth receive this
    /// device completes gets an error status instead of its data.
    pub fail_recv: Option<u64>,
    pub recvs_done: AtomicU64,
}

/// What `softrdma_join_run` set: the run's secret and the address its devices listen on.
#[derive(Clone, Copy)]
pub struct Run {
    pub secret: [u8; SECRET_LEN],
    pub addr: Option<Ipv4Addr>,
}

static RUN: Mutex<Run> = Mutex::new(Run {
    secret: [0; SECRET_LEN],
    addr: None,
});

/// Joins a run: devices opened from now on listen on `addr` alone (every address when None)
/// and hold `secret`, which every hello to them must carry and theirs carry.
pub fn join_run(run: Run) {
    *lock(&RUN) = run;
}

/// Every IPv4 address of an interface that is up, with the interface's name, in the order
/// the system lists them (loopback included).
fn up_ipv4s() -> Vec<(String, Ipv4Addr)> {
    let mut out: Vec<(String, Ipv4Addr)> = Vec::new();
    // SAFETY: getifaddrs fills a list freed with freeifaddrs; each entry is read while alive.
    unsafe {
        let mut ifa: *mut libc::ifaddrs = std::ptr::null_mut();
        if libc::getifaddrs(&mut ifa) == 0 {
            let mut p = ifa;
            while !p.is_null() {
                let e = &*p;
                if !e.ifa_addr.is_null()
                    && !e.ifa_name.is_null()
                    && (*e.ifa_addr).sa_family as i32 == libc::AF_INET
                    && e.ifa_flags as u64 & libc::IFF_UP as u64 != 0
                {
                    let sin = &*(e.ifa_addr as *const libc::sockaddr_in);
                    let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                    let name = std::ffi::CStr::from_ptr(e.ifa_name)
                        .to_string_lossy()
                        .into_owned();
                    out.push((name, ip));
                }
                p = e.ifa_next;
            }
            libc::freeifaddrs(ifa);
        }
    }
    out
}

/// Every interface that is up and not loopback, with its first IPv4 address, in the order
/// the system lists them.
pub fn interface_ipv4s() -> Vec<(String, Ipv4Addr)> {
    let mut out: Vec<(String, Ipv4Addr)> = Vec::new();
    for (name, ip) in up_ipv4s() {
        if !ip.is_loopback() && !out.iter().any(|(n, _)| *n == name) {
            out.push((name, ip));
        }
    }
    out
}

/// The host's IPv4 addresses, the one to put first at GID index 1 leading: a chosen one
/// (`TBBENCH_SOFTRDMA_ADDR`), else the first address of an interface that is up and not
/// loopback, else 127.0.0.1. Loopback comes last so a rank bound to 127.0.0.1 finds it too.
fn host_ipv4s() -> Vec<Ipv4Addr> {
    let (lo, up): (Vec<Ipv4Addr>, Vec<Ipv4Addr>) = up_ipv4s()
        .into_iter()
        .map(|(_, ip)| ip)
        .partition(|ip| ip.is_loopback());
    let mut all: Vec<Ipv4Addr> = Vec::new();
    if let Some(ip) = std::env::var("TBBENCH_SOFTRDMA_ADDR")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        all.push(ip);
    }
    for ip in up.into_iter().chain(lo) {
        if !all.contains(&ip) {
            all.push(ip);
        }
    }
    if all.is_empty() {
        all.push(Ipv4Addr::LOCALHOST);
    }
    all.truncate(15);
    all
}

pub fn ipv4_mapped(ip: Ipv4Addr) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip.octets());
    g
}

fn as_ipv4(g: &[u8; 16]) -> Option<Ipv4Addr> {
    (g[..10].iter().all(|b| *b == 0) && g[10] == 0xff && g[11] == 0xff)
        .then(|| Ipv4Addr::new(g[12], g[13], g[14], g[15]))
}

/// The GID table: index 0 a link-local address (as real ports have), then one IPv4-mapped
/// entry per host address, the chosen one at index 1.
/// A device that listens on one address lists that one alone.
fn gid_table(bound: Option<Ipv4Addr>) -> Vec<[u8; 16]> {
    let mut link_local = [0u8; 16];
    link_local[0] = 0xfe;
    link_local[1] = 0x80;
    link_local[8..].copy_from_slice(&[0x02, 0x50, 0x5e, 0xff, 0xfe, 0xd0, 0x00, 0x01]);
    let mut t = vec![link_local];
    match bound {
        Some(ip) => t.push(ipv4_mapped(ip)),
        None => t.extend(host_ipv4s().into_iter().map(ipv4_mapped)),
    }
    t
}

impl Dev {
    pub fn open(spec: &crate::DevSpec) -> io::Result<Arc<Dev>> {
        let rules = spec.rules;
        let run = *lock(&RUN);
        // A device that stands for one interface's cable listens there, whatever the run's
        // address (which may be the management network's).
        let addr = spec.bound.or(run.addr);
        let listener = TcpListener::bind((addr.unwrap_or(Ipv4Addr::UNSPECIFIED), 0))?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        // Keys start at a point that differs per process and device, so a stale key from
        // another run rarely matches (no randomness needed beyond that).
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
            ^ (std::process::id() << 8)
            ^ port as u32;
        let dev = Arc::new(Dev {
            rules,
            name: spec.name.clone(),
            gids: gid_table(addr),
            secret: run.secret,
            port,
            stop: AtomicBool::new(false),
            mrs: Mutex::new(HashMap::new()),
            qps: Mutex::new(HashMap::new()),
            next_key: AtomicU32::new(seed | 1),
            c: Counters::default(),
            threads: Mutex::new(Vec::new()),
            fail_recv: std::env::var("TBBENCH_SOFTRDMA_FAIL_RECV")
                .ok()
                .and_then(|v| v.parse().ok()),
            recvs_done: AtomicU64::new(0),
        });
        let d = dev.clone();
        let h = std::thread::Builder::new()
            .name(format!("{}-accept", spec.name))
            .spawn(move || quiet(|| accept_loop(d, listener)))?;
        lock(&dev.threads).push(h);
        Ok(dev)
    }

    pub fn new_key(&self) -> u32 {
        loop {
            let k = self.next_key.fetch_add(1, Ordering::Relaxed);
            if k != 0 && !lock(&self.mrs).contains_key(&k) {
                return k;
            }
        }
    }

    /// Whether `addr..addr+len` lies in the region `key` with `access`.
    pub fn mr_covers(&self, key: u32, addr: u64, len: u64, access: i32) -> bool {
        let mrs = lock(&self.mrs);
        match mrs.get(&key) {
            Some(m) => {
                (m.access & access) == access
                    && addr >= m.addr
                    && addr
                        .checked_add(len)
                        .is_some_and(|end| end <= m.addr + m.len)
            }
            None => false,
        }
    }

    /// Stops every thread and waits for them, then writes the counters where
    /// `TBBENCH_SOFTRDMA_STATS` says.
    pub fn close(&self) {
        let qps: Vec<Arc<Qp>> = lock(&self.qps).values().cloned().collect();
        self.c
            .qps_left_at_close
            .store(qps.len() as u64, Ordering::Relaxed);
        self.c
            .mrs_left_at_close
            .store(lock(&self.mrs).len() as u64, Ordering::Relaxed);
        self.stop.store(true, Ordering::SeqCst);
        for q in qps {
            q.shut();
        }
        let threads: Vec<JoinHandle<()>> = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            let _ = t.join();
        }
        // Queue pairs hold the device; dropping them here lets it go once the caller's
        // last handle does.
        lock(&self.qps).clear();
        lock(&self.mrs).clear();
        if let Some(dir) = std::env::var_os("TBBENCH_SOFTRDMA_STATS") {
            let dir = std::path::PathBuf::from(dir);
            let _ = std::fs::create_dir_all(&dir);
            static SEQ: AtomicU32 = AtomicU32::new(0);
            let path = dir.join(format!(
                "{}-{}-{}.json",
                self.name,
                std::process::id(),
                SEQ.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::write(&path, self.stats_json());
        }
    }

    pub fn stats_json(&self) -> String {
        format!(
            "{{\"device\": \"{}\", \"pid\": {}, {}}}\n",
            self.name,
            std::process::id(),
            self.c.json()
        )
    }
}

/// Runs a thread's body, keeping a panic (a bug here) from printing over the program's
/// output more than one line.
fn quiet(f: impl FnOnce()) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
        eprintln!("softrdma: a device thread failed (a bug in the software device)");
    }
}

fn accept_loop(dev: Arc<Dev>, listener: TcpListener) {
    let mut door = tbbench_gate::Gate::new(format!("tbbench: {}: ", dev.name), "device");
    while !dev.stop.load(Ordering::SeqCst) {
        door.wait(&listener, TICK);
        let before = door.refused();
        for (s, _, hello) in door.step(&listener, |got| judge_hello(&dev, got)) {
            let d = dev.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("{}-rx", dev.name))
                .spawn(move || quiet(|| reader(d, s, hello)));
            if let Ok(h) = spawned {
                let mut t = lock(&dev.threads);
                // Keep the list from growing with finished readers.
                t.retain(|h| !h.is_finished());
                t.push(h);
            }
        }
        dev.c
            .refused_connections
            .fetch_add((door.refused() - before) as u64, Ordering::Relaxed);
    }
}

/// A connection's hello, once whole and proved to come from this run.
struct Hello {
    /// The queue pair that sends on this connection.
    src: u32,
}

/// What the door makes of a hello's bytes so far: the secret is checked before anything
/// else is believed.
fn judge_hello(dev: &Dev, got: &[u8]) -> tbbench_gate::Verdict<Hello> {
    use tbbench_gate::Verdict;
    if got.len() < HELLO_LEN {
        return Verdict::Need(HELLO_LEN);
    }
    if u32_at(got, 0) != HELLO_MAGIC || u32_at(got, 4) != HELLO_VERSION {
        return Verdict::Refuse("not a software RDMA hello of this version".into());
    }
    if !tbbench_gate::same_secret(&got[24..HELLO_LEN], &dev.secret) {
        return Verdict::Refuse("not this run's secret".into());
    }
    // Apple's stack and a ConnectX do not talk to each other; neither do these two.
    if u32_at(got, 16) != rules_id(dev.rules) {
        dev.c.dropped_not_ready.fetch_add(1, Ordering::Relaxed);
        return Verdict::Refuse("the other platform's device".into());
    }
    Verdict::Admit(Hello {
        src: u32_at(got, 8),
    })
}

/// Reads exactly `buf.len()` bytes, giving up when `stop` says so.
fn read_full(s: &mut impl Read, buf: &mut [u8], stop: &dyn Fn() -> bool) -> io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        match s.read(&mut buf[at..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => at += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                if stop() {
                    return Err(io::ErrorKind::Interrupted.into());
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn write_full(s: &mut TcpStream, buf: &[u8], stop: &dyn Fn() -> bool) -> io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        match s.write(&buf[at..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => at += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                if stop() {
                    return Err(io::ErrorKind::Interrupted.into());
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

struct Header {
    kind: u32,
    dst: u32,
    src: u32,
    len: u64,
    imm: u32,
    rkey: u32,
    remote_addr: u64,
}

fn rules_id(r: &Rules) -> u32 {
    if r.allow_rc {
        1
    } else {
        0
    }
}

/// One admitted connection: a peer queue pair's frames, in order.
fn reader(dev: Arc<Dev>, mut s: TcpStream, hello: Hello) {
    let _ = s.set_read_timeout(Some(TICK));
    let _ = s.set_write_timeout(Some(TICK));
    let _ = s.set_nodelay(true);
    let stop = || dev.stop.load(Ordering::SeqCst);
    if write_full(&mut s, &WELCOME_MAGIC.to_le_bytes(), &stop).is_err() {
        return;
    }
    let mut s = io::BufReader::with_capacity(1 << 16, s);
    let stop = || dev.stop.load(Ordering::SeqCst);
    let mut scratch = vec![0u8; 1 << 16];
    loop {
        let mut h = [0u8; HDR_LEN];
        if read_full(&mut s, &mut h, &stop).is_err() || u32_at(&h, 0) != FRAME_MAGIC {
            return;
        }
        let hdr = Header {
            kind: u32_at(&h, 4),
            dst: u32_at(&h, 8),
            src: u32_at(&h, 12),
            len: u64_at(&h, 16),
            imm: u32_at(&h, 24),
            rkey: u32_at(&h, 28),
            remote_addr: u64_at(&h, 32),
        };
        // A connection carries one queue pair's frames: a frame naming another source is
        // not believed (as a UC queue pair takes packets only from the one it is connected
        // to), and the connection is not either.
        if hdr.src != hello.src {
            dev.c.dropped_wrong_source.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if on_frame(&dev, &mut s, &hdr, &mut scratch).is_err() {
            return;
        }
    }
}

fn drain(
    s: &mut impl Read,
    mut len: u64,
    scratch: &mut [u8],
    stop: &dyn Fn() -> bool,
) -> io::Result<()> {
    while len > 0 {
        let n = len.min(scratch.len() as u64) as usize;
        read_full(s, &mut scratch[..n], stop)?;
        len -= n as u64;
    }
    Ok(())
}

fn ready(st: &QpState, src: u32) -> bool {
    matches!(st.attr.qp_state, IBV_QPS_RTR | IBV_QPS_RTS) && st.attr.dest_qp_num == src
}

/// The next posted receive: on RC it waits for one (the sender's receiver-not-ready retries,
/// which a retry count of 7 makes endless); on UC there is none to wait for and the frame is
/// dropped.
fn take_recv(qp: &Qp) -> Option<Recv> {
    let mut st = lock(&qp.st);
    loop {
        if let Some(r) = st.recvs.pop_front() {
            return Some(r);
        }
        if qp.qp_type != IBV_QPT_RC
            || qp.destroyed.load(Ordering::SeqCst)
            || qp.dev.stop.load(Ordering::SeqCst)
            || !matches!(st.attr.qp_state, IBV_QPS_RTR | IBV_QPS_RTS)
        {
            return None;
        }
        st = qp
            .cv
            .wait_timeout(st, TICK)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

fn on_frame(dev: &Arc<Dev>, s: &mut impl Read, h: &Header, scratch: &mut [u8]) -> io::Result<()> {
    let qp = lock(&dev.qps).get(&h.dst).cloned();
    let stop_dev = || dev.stop.load(Ordering::SeqCst);
    let Some(qp) = qp.filter(|q| ready(&lock(&q.st), h.src)) else {
        dev.c.dropped_not_ready.fetch_add(1, Ordering::Relaxed);
        return drain(s, h.len, scratch, &stop_dev);
    };
    let stop = || qp.destroyed.load(Ordering::SeqCst) || dev.stop.load(Ordering::SeqCst);
    match h.kind {
        KIND_SEND => {
            let Some(r) = take_recv(&qp) else {
                dev.c.dropped_no_recv.fetch_add(1, Ordering::Relaxed);
                return drain(s, h.len, scratch, &stop);
            };
            let fits =
                h.len <= r.total && (!dev.rules.frame_rule || frames(h.len) == frames(r.total));
            let nth = dev.recvs_done.fetch_add(1, Ordering::Relaxed) + 1;
            let status = if dev.fail_recv == Some(nth) {
                drain(s, h.len, scratch, &stop)?;
                IBV_WC_LOC_LEN_ERR
            } else if fits {
                let _io = lock(&qp.io_rx);
                if qp.destroyed.load(Ordering::SeqCst) {
                    return drain(s, h.len, scratch, &stop);
                }
                let mut left = h.len;
                for &(addr, len) in &r.sges {
                    let n = left.min(len as u64);
                    if n == 0 {
                        break;
                    }
                    // SAFETY: the receive's memory was checked against a registered region
                    // when it was posted, and the application keeps it until the completion.
                    let dst =
                        unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, n as usize) };
                    read_full(s, dst, &stop)?;
                    left -= n;
                }
                dev.c.delivered.fetch_add(1, Ordering::Relaxed);
                IBV_WC_SUCCESS
            } else {
                dev.c.frame_mismatch.fetch_add(1, Ordering::Relaxed);
                drain(s, h.len, scratch, &stop)?;
                IBV_WC_LOC_LEN_ERR
            };
            complete_recv(&qp, &r, h, status, IBV_WC_RECV, 0);
            Ok(())
        }
        KIND_WRITE | KIND_WRITE_IMM => {
            if !dev.mr_covers(h.rkey, h.remote_addr, h.len, IBV_ACCESS_REMOTE_WRITE) {
                dev.c.refused_remote_access.fetch_add(1, Ordering::Relaxed);
                return drain(s, h.len, scratch, &stop);
            }
            {
                let _io = lock(&qp.io_rx);
                if qp.destroyed.load(Ordering::SeqCst) {
                    return drain(s, h.len, scratch, &stop);
                }
                if h.len > 0 {
                    // SAFETY: the range lies in a region registered for remote writes.
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(h.remote_addr as *mut u8, h.len as usize)
                    };
                    read_full(s, dst, &stop)?;
                }
            }
            dev.c.delivered.fetch_add(1, Ordering::Relaxed);
            if h.kind == KIND_WRITE_IMM {
                match take_recv(&qp) {
                    Some(r) => complete_recv(
                        &qp,
                        &r,
                        h,
                        IBV_WC_SUCCESS,
                        IBV_WC_RECV_RDMA_WITH_IMM,
                        IBV_WC_WITH_IMM,
                    ),
                    None => {
                        dev.c.dropped_no_recv.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            Ok(())
        }
        _ => Err(io::ErrorKind::InvalidData.into()),
    }
}

fn complete_recv(qp: &Qp, r: &Recv, h: &Header, status: u32, opcode: u32, flags: u32) {
    {
        let mut st = lock(&qp.st);
        st.recv_out = st.recv_out.saturating_sub(r.cost);
    }
    qp.recv_cq.push(IbvWc {
        wr_id: r.wr_id,
        status,
        opcode,
        byte_len: h.len as u32,
        imm_data: if flags & IBV_WC_WITH_IMM != 0 {
            h.imm
        } else {
            0
        },
        qp_num: qp.qpn,
        src_qp: h.src,
        wc_flags: flags,
        ..Default::default()
    });
}

impl Qp {
    /// Ends the sender thread (it finishes the frame it is writing, or gives up within a tick)
    /// and waits until no thread touches the application's memory for this queue pair.
    pub fn shut(&self) {
        self.destroyed.store(true, Ordering::SeqCst);
        self.cv.notify_all();
        let sender = lock(&self.sender).take();
        if let Some((tx, h)) = sender {
            drop(tx);
            let _ = h.join();
        }
        drop(lock(&self.io_tx));
        drop(lock(&self.io_rx));
    }

    pub fn start_sender(self: &Arc<Self>) -> io::Result<()> {
        let mut slot = lock(&self.sender);
        if slot.is_some() {
            return Ok(());
        }
        let (tx, rx) = mpsc::channel();
        let q = self.clone();
        let h = std::thread::Builder::new()
            .name(format!("{}-tx", self.dev.name))
            .spawn(move || quiet(|| sender(q, rx)))?;
        *slot = Some((tx, h));
        Ok(())
    }

    fn fail(&self) {
        lock(&self.st).attr.qp_state = IBV_QPS_ERR;
        self.cv.notify_all();
    }
}

/// Connects to the peer queue pair's device and is admitted there. A device that drops the
/// connection before its welcome had it pushed out of its door by a crowd of strangers (a
/// connection accepted before its hello arrived waits among them): that is tried again, for
/// a few seconds, where a peer that refuses the connection (no device there) fails at once.
fn connect(qp: &Qp) -> io::Result<TcpStream> {
    let (dgid, dqpn) = {
        let st = lock(&qp.st);
        (st.attr.ah_attr.grh.dgid.0, st.attr.dest_qp_num)
    };
    let ip = as_ipv4(&dgid).ok_or(io::ErrorKind::AddrNotAvailable)?;
    let port = (dqpn >> 8) as u16;
    let mut hello = [0u8; HELLO_LEN];
    hello[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
    hello[4..8].copy_from_slice(&HELLO_VERSION.to_le_bytes());
    hello[8..12].copy_from_slice(&qp.qpn.to_le_bytes());
    hello[12..16].copy_from_slice(&dqpn.to_le_bytes());
    hello[16..20].copy_from_slice(&rules_id(qp.dev.rules).to_le_bytes());
    hello[24..].copy_from_slice(&qp.dev.secret);
    let stop = || qp.destroyed.load(Ordering::SeqCst) || qp.dev.stop.load(Ordering::SeqCst);
    let give_up = std::time::Instant::now() + ADMISSION_LIMIT;
    loop {
        // A full accept queue drops the handshake (the kernel's, before the door sees it):
        // that is tried again too, as is a timeout; only a refusal (no device there) is final.
        let mut s = match TcpStream::connect_timeout(
            &SocketAddr::new(IpAddr::V4(ip), port),
            Duration::from_secs(1),
        ) {
            Ok(s) => s,
            Err(e)
                if e.kind() == io::ErrorKind::ConnectionRefused
                    || stop()
                    || std::time::Instant::now() >= give_up =>
            {
                return Err(e)
            }
            Err(_) => continue,
        };
        s.set_nodelay(true)?;
        s.set_write_timeout(Some(TICK))?;
        s.set_read_timeout(Some(TICK))?;
        let mut welcome = [0u8; 4];
        let admitted =
            write_full(&mut s, &hello, &stop).and_then(|()| read_full(&mut s, &mut welcome, &stop));

        match admitted {
            Ok(()) if u32::from_le_bytes(welcome) == WELCOME_MAGIC => return Ok(s),
            Ok(()) => return Err(io::ErrorKind::InvalidData.into()),
            Err(e) if stop() || std::time::Instant::now() >= give_up => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn send_frame(qp: &Qp, conn: &mut Option<TcpStream>, job: &Job) -> io::Result<()> {
    if conn.is_none() {
        *conn = Some(connect(qp)?);
    }
    let s = conn.as_mut().expect("connected above");
    let dqpn = lock(&qp.st).attr.dest_qp_num;
    let mut h = Vec::with_capacity(HDR_LEN + (job.len.min(1 << 16) as usize));
    h.extend_from_slice(&FRAME_MAGIC.to_le_bytes());
    h.extend_from_slice(&job.kind.to_le_bytes());
    h.extend_from_slice(&dqpn.to_le_bytes());
    h.extend_from_slice(&qp.qpn.to_le_bytes());
    h.extend_from_slice(&job.len.to_le_bytes());
    h.extend_from_slice(&job.imm.to_le_bytes());
    h.extend_from_slice(&job.rkey.to_le_bytes());
    h.extend_from_slice(&job.remote_addr.to_le_bytes());
    let stop = || qp.destroyed.load(Ordering::SeqCst) || qp.dev.stop.load(Ordering::SeqCst);
    // SAFETY (both branches): every gather entry was checked against a registered region
    // when posted, and the application keeps the memory until the completion.
    if job.len <= 1 << 16 {
        // Small frames go out in one write: header and payload in one segment.
        for &(addr, len) in &job.sges {
            h.extend_from_slice(unsafe {
                std::slice::from_raw_parts(addr as *const u8, len as usize)
            });
        }
        write_full(s, &h, &stop)?;
    } else {
        write_full(s, &h, &stop)?;
        for &(addr, len) in &job.sges {
            write_full(
                s,
                unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) },
                &stop,
            )?;
        }
    }
    qp.dev.c.bytes_sent.fetch_add(job.len, Ordering::Relaxed);
    qp.dev.c.frames_sent.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

fn sender(qp: Arc<Qp>, rx: mpsc::Receiver<Job>) {
    let mut conn: Option<TcpStream> = None;
    loop {
        let job = match rx.recv_timeout(TICK) {
            Ok(j) => j,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if qp.destroyed.load(Ordering::SeqCst) || qp.dev.stop.load(Ordering::SeqCst) {
                    return;
                }
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        if qp.destroyed.load(Ordering::SeqCst) {
            return;
        }
        let in_error = lock(&qp.st).attr.qp_state == IBV_QPS_ERR;
        let status = if let Some(e) = job.error {
            if qp.qp_type == IBV_QPT_RC {
                qp.fail();
            }
            e
        } else if in_error {
            IBV_WC_WR_FLUSH_ERR
        } else {
            let sent = {
                let _io = lock(&qp.io_tx);
                send_frame(&qp, &mut conn, &job)
            };
            match sent {
                Ok(()) => IBV_WC_SUCCESS,
                Err(_) if qp.destroyed.load(Ordering::SeqCst) => return,
                Err(_) => {
                    conn = None;
                    if qp.qp_type == IBV_QPT_RC {
                        // RC notices the lost peer: the retries run out.
                        qp.fail();
                        IBV_WC_RETRY_EXC_ERR
                    } else {
                        // UC does not: the send completes as if it went out.
                        qp.dev.c.dropped_peer_gone.fetch_add(1, Ordering::Relaxed);
                        IBV_WC_SUCCESS
                    }
                }
            }
        };
        {
            let mut st = lock(&qp.st);
            st.send_out = st.send_out.saturating_sub(job.cost);
        }
        if job.signaled || qp.sig_all || status != IBV_WC_SUCCESS {
            qp.send_cq.push(IbvWc {
                wr_id: job.wr_id,
                status,
                opcode: if job.kind == KIND_SEND {
                    IBV_WC_SEND
                } else {
                    IBV_WC_RDMA_WRITE
                },
                byte_len: job.len as u32,
                qp_num: qp.qpn,
                ..Default::default()
            });
        }
    }
}

pub const WIRE_SEND: u32 = KIND_SEND;
pub const WIRE_WRITE: u32 = KIND_WRITE;
pub const WIRE_WRITE_IMM: u32 = KIND_WRITE_IMM;
