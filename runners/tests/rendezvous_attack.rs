//! Strangers on a run's ports, with real processes and sockets: no token, a wrong token,
//! garbage, a huge length prefix, a slow drip and a crowd of silent connections, on rank 0's
//! rendezvous port (while it waits for the ranks and while the run goes on) and on its tcp
//! data port. The run must finish as if nobody had knocked.

mod support;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use support::*;

/// Connections held open at once by the silent crowd: more than the listener lets wait.
const SILENT: usize = 20;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Every kind of stranger at once against `addr`, each in its own thread, until dropped.
struct Attack {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<usize>>,
}

impl Attack {
    fn start(addr: SocketAddr) -> Attack {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let mut spawn = |f: fn(SocketAddr, &AtomicBool) -> usize| {
            let stop = stop.clone();
            threads.push(std::thread::spawn(move || f(addr, &stop)));
        };
        spawn(silent_crowd);
        spawn(slow_drip);
        spawn(|addr, stop| {
            knock(addr, stop, || {
                // The control channel's old join, its token in the JSON, no magic before it.
                let body =
                    br#"{"Join":{"token":"00000000000000000000000000000000","size":2,"info":{}}}"#;
                let mut f = (body.len() as u32).to_le_bytes().to_vec();
                f.extend_from_slice(body);
                f
            })
        });
        spawn(|addr, stop| {
            knock(addr, stop, || {
                // The right shape with a wrong token, a rendezvous and a data greeting.
                let mut f = b"TBBR".to_vec();
                f.extend_from_slice(&[0x5a; 16]);
                f.extend_from_slice(&2u32.to_le_bytes());
                f.extend_from_slice(b"{}TBBD");
                f.extend_from_slice(&[0x5a; 16]);
                f.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
                f
            })
        });
        spawn(|addr, stop| {
            knock(addr, stop, || {
                let mut seed = 0x9e37_79b9_7f4a_7c15u64;
                (0..4096)
                    .map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        seed as u8
                    })
                    .collect()
            })
        });
        spawn(|addr, stop| {
            // A huge length prefix, then a little of what it announces, held open.
            knock(addr, stop, || {
                let mut f = u32::MAX.to_le_bytes().to_vec();
                f.extend_from_slice(&[b'{'; 64]);
                f
            })
        });
        Attack { stop, threads }
    }

    /// Stops every attacker; returns how many connections they made in all.
    fn end(self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        self.threads.into_iter().map(|t| t.join().unwrap()).sum()
    }
}

/// Sleeps `d` in short steps, returning early (false) once told to stop.
fn nap(d: Duration, stop: &AtomicBool) -> bool {
    let until = Instant::now() + d;
    while Instant::now() < until {
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    !stop.load(Ordering::SeqCst)
}

fn connect(addr: SocketAddr) -> Option<TcpStream> {
    TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()
}

/// SILENT connections that send nothing, opened afresh every two seconds.
fn silent_crowd(addr: SocketAddr, stop: &AtomicBool) -> usize {
    let mut made = 0;
    loop {
        let crowd: Vec<TcpStream> = (0..SILENT).filter_map(|_| connect(addr)).collect();
        made += crowd.len();
        if !nap(Duration::from_secs(2), stop) {
            return made;
        }
    }
}

/// One byte every 1.5 s, each within any per-read timeout; a new connection when dropped.
fn slow_drip(addr: SocketAddr, stop: &AtomicBool) -> usize {
    let mut made = 0;
    while !stop.load(Ordering::SeqCst) {
        let Some(mut s) = connect(addr) else {
            nap(Duration::from_millis(200), stop);
            continue;
        };
        made += 1;
        // The start of a frame with a small length, so a reader that waits for it waits long.
        for b in [64u8, 0, 0, 0].iter().cycle() {
            if s.write_all(&[*b]).is_err() || !nap(Duration::from_millis(1500), stop) {
                break;
            }
        }
    }
    made
}

/// Sends `frame` on a new connection every 100 ms, leaving each open a while.
fn knock(addr: SocketAddr, stop: &AtomicBool, frame: fn() -> Vec<u8>) -> usize {
    let mut made = 0;
    let mut open = std::collections::VecDeque::new();
    loop {
        if let Some(mut s) = connect(addr) {
            let _ = s.write_all(&frame());
            made += 1;
            open.push_back(s);
            if open.len() > 4 {
                open.pop_front();
            }
        }
        if !nap(Duration::from_millis(100), stop) {
            return made;
        }
    }
}

/// TCP ports `pid` listens on (from its socket inodes and /proc/net/tcp).
fn listening_ports(pid: u32) -> Vec<u16> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    l.strip_prefix("socket:[")
                        .and_then(|x| x.strip_suffix(']'))
                        .map(str::to_string)
                })
                .collect()
        })
        .unwrap_or_default();
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address, state (0A: LISTEN), inode.
            if f.len() > 9 && f[3] == "0A" && inodes.iter().any(|i| i == f[9]) {
                if let Some(port) = f[1]
                    .rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok())
                {
                    ports.push(port);
                }
            }
        }
    }
    ports
}

fn rank_by_hand(rank: usize, token: &str, port: u16, out: &str) -> std::process::Child {
    rank_by_hand_with(rank, token, port, out, &[])
}

fn rank_by_hand_with(
    rank: usize,
    token: &str,
    port: u16,
    out: &str,
    extra: &[&str],
) -> std::process::Child {
    let mut c = Command::new(bin());
    c.args([
        "link",
        "--port",
        &port.to_string(),
        "--buffer",
        "64",
        "--mode",
        "latency",
        "--iters",
        "50000",
        "--out",
        out,
    ])
    .args(extra)
    .env("TBBENCH_RANK", rank.to_string())
    .env("TBBENCH_SIZE", "2")
    .env("TBBENCH_TOKEN", token)
    .env_remove("TBBENCH_LAUNCHED")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    if rank > 0 {
        c.env("TBBENCH_RDV", format!("127.0.0.1:{port}"));
    }
    c.spawn().expect("tbbench starts")
}

#[test]
fn strangers_on_the_rendezvous_and_data_ports_of_a_waiting_rank_0_change_nothing() {
    let dir = tmpdir("attack-wait");
    let out = dir.join("r.json");
    let out_s = out.to_str().unwrap().to_string();
    let token = "0123456789abcdef0123456789abcdef";
    let port = free_port();
    let rank0 = rank_by_hand(0, token, port, &out_s);
    // Rank 0 is up once it listens on both its rendezvous port and its data port.
    let start = Instant::now();
    let data_port = loop {
        let ports = listening_ports(rank0.id());
        if ports.contains(&port) {
            if let Some(p) = ports.iter().find(|p| **p != port) {
                break *p;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "rank 0 did not start listening: {ports:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let rdv_attack = Attack::start(SocketAddr::from(([127, 0, 0, 1], port)));
    let data_attack = Attack::start(SocketAddr::from(([127, 0, 0, 1], data_port)));
    // Long enough for the crowd, the drip and every kind of knock to reach rank 0 before the
    // real rank does, and for many silent connections to pile up in the data port's backlog.
    std::thread::sleep(Duration::from_secs(4));
    let rank1 = rank_by_hand(1, token, port, &out_s);
    let waiter = std::thread::spawn(move || finish(rank1, Duration::from_secs(120)).0);
    let (o0, _) = finish(rank0, Duration::from_secs(120));
    let o1 = waiter.join().unwrap();
    let made = rdv_attack.end() + data_attack.end();
    assert!(
        made > 2 * SILENT,
        "the attack hardly ran: {made} connections"
    );
    let err0 = text(&o0.stderr);
    assert!(o0.status.success(), "rank 0 failed:\n{err0}");
    assert!(o1.status.success(), "rank 1 failed:\n{}", text(&o1.stderr));
    assert!(
        err0.contains("refused a rendezvous connection") && err0.contains("refused a data"),
        "the strangers were not refused:\n{err0}"
    );
    assert!(
        err0.lines().count() < 40,
        "the strangers flooded the output:\n{err0}"
    );
    let r = read_json(&out);
    assert_eq!(r["verification"]["passed"], true);
}

#[test]
fn strangers_on_the_rendezvous_port_during_a_run_change_nothing() {
    let dir = tmpdir("attack-run");
    let out = dir.join("r.json");
    let port = free_port();
    // Long enough (seconds) for the drip to outlast the liveness window several times over.
    let child = spawn(&[
        "link",
        "--nodes",
        "3",
        "--port",
        &port.to_string(),
        "--buffer",
        "64",
        "--mode",
        "latency",
        "--iters",
        "500000",
        "--out",
        out.to_str().unwrap(),
    ]);
    let launcher = child.id();
    let start = Instant::now();
    while ranks_of(launcher).len() < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "ranks did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let attack = Attack::start(SocketAddr::from(([127, 0, 0, 1], port)));
    let (o, took) = finish(child, Duration::from_secs(180));
    let made = attack.end();
    let err = text(&o.stderr);
    assert!(o.status.success(), "the run failed after {took:?}:\n{err}");
    assert!(made > SILENT, "the attack hardly ran: {made} connections");
    assert!(err.contains("refused a rendezvous connection"), "{err}");
    let r = read_json(&out);
    assert_eq!(r["verification"]["passed"], true);
}

/// Ranks started by hand each read their own flags: two that would open different numbers of
/// connections per pair (one given --streams, one left to choose) do not stripe past each
/// other. The lower rank refuses the other's connections, naming the flags to align, and
/// neither writes a result.
#[test]
fn ranks_by_hand_with_different_stream_counts_are_refused_by_name() {
    let dir = tmpdir("streams-mismatch");
    let out = dir.join("r.json");
    let out_s = out.to_str().unwrap().to_string();
    let token = "fedcba9876543210fedcba9876543210";
    let port = free_port();
    let rank0 = rank_by_hand_with(
        0,
        token,
        port,
        &out_s,
        &["--streams", "1", "--timeout", "4s"],
    );
    let rank1 = rank_by_hand_with(
        1,
        token,
        port,
        &out_s,
        &["--streams", "2", "--timeout", "4s"],
    );
    let waiter = std::thread::spawn(move || finish(rank1, Duration::from_secs(60)).0);
    let (o0, _) = finish(rank0, Duration::from_secs(60));
    let o1 = waiter.join().unwrap();
    let err0 = text(&o0.stderr);
    assert!(!o0.status.success(), "rank 0 ran:\n{err0}");
    assert!(!o1.status.success(), "rank 1 ran:\n{}", text(&o1.stderr));
    assert!(
        err0.contains("rank 1 opens 2 connection(s) per pair and rank 0 1")
            && err0.contains("same --streams and --congestion"),
        "{err0}"
    );
    assert!(!out.exists(), "a result was written");
}
