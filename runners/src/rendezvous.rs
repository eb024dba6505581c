//! Rendezvous and the control channel.
//!
//! Rank 0 listens; every other rank connects, presents the run's session token and what rank
//! 0 must know of it (host, data address and port), and receives the table of all ranks.
//! The connections then stay open as the control channel: heartbeats both ways, so a rank
//! that dies or stops answering is noticed within seconds even while every other rank is busy
//! computing, and an abort message that ends every rank with one error naming the culprit.
//! (Under RDMA's unreliable connections this channel is the only liveness check there is.)

use crate::transport::PeerName;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often control connections carry a heartbeat, and how long silence means a dead rank.
pub const HEARTBEAT: Duration = Duration::from_millis(500);
pub const LIVENESS: Duration = Duration::from_secs(5);

/// What to undo before a failing run exits (rank 0's shared-memory segment), set once.
static ON_ABORT: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>> = std::sync::OnceLock::new();

/// Registers the clean-up that runs before this process exits on an aborted run.
pub fn on_abort(f: impl Fn() + Send + Sync + 'static) {
    let _ = ON_ABORT.set(Box::new(f));
}

fn run_abort_hook() {
    if let Some(f) = ON_ABORT.get() {
        f();
    }
}

/// A random per-run secret, handed to each rank by the launcher.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Token(pub [u8; 16]);

impl Token {
    pub fn random() -> Result<Self> {
        let mut t = [0u8; 16];
        getrandom::getrandom(&mut t)
            .map_err(|e| anyhow!("no randomness for the session token: {e}"))?;
        Ok(Token(t))
    }
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
    pub fn from_hex(s: &str) -> Result<Self> {
        let s = s.trim();
        if s.len() != 32 || !s.is_ascii() {
            bail!("malformed session token");
        }
        let mut t = [0u8; 16];
        for (i, b) in t.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
                .map_err(|_| anyhow!("malformed session token"))?;
        }
        Ok(Token(t))
    }
}

/// What each rank tells the others at the rendezvous.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankInfo {
    pub rank: usize,
    /// The OS hostname.
    pub hostname: String,
    /// The name the launcher used (hostfile entry, namespace); "localhost" for local ranks.
    pub label: String,
    /// Where this rank's data listener is; None until rank 0 fills it from the connection.
    pub data_ip: Option<String>,
    pub data_port: u16,
    pub pid: u32,
    /// Same value on ranks that share a kernel (Linux boot_id), so shm can check it.
    pub boot_id: String,
    pub host: tbbench_reports::Host,
    /// `--transport verbs`: this rank's RDMA connection data (queue pair numbers, LID, GID),
    /// hex-encoded; None when its device did not open or another transport runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
enum Ctrl {
    Join {
        token: String,
        size: usize,
        info: Box<RankInfo>,
    },
    Table {
        ranks: Vec<RankInfo>,
    },
    Heartbeat,
    Bye,
    Abort {
        message: String,
    },
}

fn write_frame(mut s: &TcpStream, msg: &Ctrl) -> std::io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    s.write_all(&frame)
}

fn read_frame(mut s: &TcpStream) -> std::io::Result<Ctrl> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > 16 << 20 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "oversized control frame",
        ));
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)?;
    serde_json::from_slice(&body)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Rank 0's side: accepts until every rank has joined with the right token, then sends each
/// the table. Connections with a wrong or missing token are refused and logged; the wait goes
/// on for the real ranks.
pub fn gather_ranks(
    listener: &TcpListener,
    token: &Token,
    size: usize,
    me: RankInfo,
    timeout: Duration,
) -> Result<(Vec<RankInfo>, Vec<Option<TcpStream>>)> {
    let mut infos: Vec<Option<RankInfo>> = vec![None; size];
    let mut conns: Vec<Option<TcpStream>> = (0..size).map(|_| None).collect();
    infos[0] = Some(me);
    let deadline = Instant::now() + timeout;
    listener.set_nonblocking(true)?;
    while infos.iter().any(|i| i.is_none()) {
        let (stream, from) = match listener.accept() {
            Ok(x) => x,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    let missing: Vec<String> = (0..size)
                        .filter(|r| infos[*r].is_none())
                        .map(|r| r.to_string())
                        .collect();
                    bail!("timed out after {:.0} s waiting for rank(s) {} to join (did they start? is the address reachable?)", timeout.as_secs_f64(), missing.join(", "));
                }
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(e) => return Err(e).context("accepting a rendezvous connection"),
        };
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        match read_frame(&stream) {
            Ok(Ctrl::Join { token: t, size: s, info }) if t == token.hex() => {
                let mut info = *info;
                if s != size || info.rank == 0 || info.rank >= size || infos[info.rank].is_some() {
                    eprintln!("tbbench: refused a rendezvous connection from {from}: rank {} of {s} does not fit this run of {size}", info.rank);
                    continue;
                }
                if info.data_ip.is_none() {
                    info.data_ip = Some(from.ip().to_string());
                }
                // Rank 0 listens on every address when none was chosen: the one this rank
                // reached it at is the one the others can reach too.
                if let (Some(zero), Ok(local)) = (infos[0].as_mut(), stream.local_addr()) {
                    if zero.data_ip.is_none() {
                        zero.data_ip = Some(local.ip().to_string());
                    }
                }
                let r = info.rank;
                infos[r] = Some(info);
                conns[r] = Some(stream);
            }
            _ => eprintln!("tbbench: refused a rendezvous connection from {from}: wrong or missing session token"),
        }
    }
    let table: Vec<RankInfo> = infos.into_iter().flatten().collect();
    for c in conns.iter().flatten() {
        write_frame(
            c,
            &Ctrl::Table {
                ranks: table.clone(),
            },
        )
        .context("sending the rank table")?;
    }
    Ok((table, conns))
}

/// A non-zero rank's side: connects (retrying while rank 0 comes up), joins, waits for the table.
pub fn join(
    rdv: &str,
    token: &Token,
    size: usize,
    me: RankInfo,
    timeout: Duration,
) -> Result<(Vec<RankInfo>, TcpStream)> {
    let deadline = Instant::now() + timeout;
    // `rdv` may list alternatives ("10.0.0.1:4791,192.168.1.5:4791"), tried in order.
    let mut addrs: Vec<SocketAddr> = Vec::new();
    for alt in rdv.split(',') {
        addrs.extend(
            std::net::ToSocketAddrs::to_socket_addrs(alt)
                .with_context(|| format!("cannot resolve the rendezvous address {alt}"))?,
        );
    }
    let stream = loop {
        let mut last_err = None;
        let mut found = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, Duration::from_secs(2)) {
                Ok(s) => {
                    found = Some(s);
                    break;
                }
                Err(e) => last_err = Some(e),
            }
        }
        if let Some(s) = found {
            break s;
        }
        if Instant::now() > deadline {
            let why = last_err
                .map(|e| e.to_string())
                .unwrap_or_else(|| "no address".into());
            bail!(
                "cannot reach rank 0 at {rdv}: {why} after {:.0} s",
                timeout.as_secs_f64()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    stream.set_nodelay(true)?;
    write_frame(
        &stream,
        &Ctrl::Join {
            token: token.hex(),
            size,
            info: Box::new(me),
        },
    )?;
    stream.set_read_timeout(Some(timeout))?;
    match read_frame(&stream) {
        Ok(Ctrl::Table { ranks }) => Ok((ranks, stream)),
        Ok(Ctrl::Abort { message }) => bail!("{message}"),
        Ok(other) => bail!("unexpected reply from rank 0 at {rdv}: {other:?}"),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => bail!("rank 0 at {rdv} closed the rendezvous connection (wrong session token, or a rank number it did not expect)"),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => bail!("rank 0 at {rdv} did not answer within {:.0} s", timeout.as_secs_f64()),
        Err(e) => bail!("rendezvous with rank 0 at {rdv}: {e}"),
    }
}

/// The control channel after the rendezvous. Cloneable handle; the watching runs on a thread.
#[derive(Clone)]
pub struct Control {
    rank: usize,
    names: Vec<PeerName>,
    /// Rank 0: a writer per rank (None for itself and for ranks that said goodbye). Others:
    /// one writer, to rank 0, at index 0.
    writers: Arc<Mutex<Vec<Option<TcpStream>>>>,
}

impl Control {
    /// Starts watching. On rank 0, `listener` stays open so late or stray connections are
    /// refused and logged rather than left hanging.
    pub fn start(
        rank: usize,
        names: Vec<PeerName>,
        conns: Vec<Option<TcpStream>>,
        listener: Option<TcpListener>,
        token: Token,
    ) -> Result<Control> {
        let mut writers = Vec::new();
        let mut readers = Vec::new();
        for c in conns {
            match c {
                Some(s) => {
                    s.set_read_timeout(Some(Duration::from_secs(2)))?;
                    s.set_write_timeout(Some(Duration::from_secs(2)))?;
                    writers.push(Some(s.try_clone()?));
                    readers.push(Some(s));
                }
                None => {
                    writers.push(None);
                    readers.push(None);
                }
            }
        }
        let ctl = Control {
            rank,
            names,
            writers: Arc::new(Mutex::new(writers)),
        };
        let watcher = ctl.clone();
        std::thread::Builder::new()
            .name("tbbench-control".into())
            .spawn(move || watcher.watch(readers, listener, token))?;
        Ok(ctl)
    }

    /// Ends the run everywhere: rank 0 tells every rank to stop; another rank tells rank 0,
    /// which names it in the one error line the user sees. Never returns.
    pub fn abort(&self, message: &str) -> ! {
        run_abort_hook();
        let mut w = self.writers.lock().unwrap_or_else(|p| p.into_inner());
        for s in w.iter_mut().flatten() {
            let _ = write_frame(
                s,
                &Ctrl::Abort {
                    message: message.to_string(),
                },
            );
        }
        if self.rank == 0 {
            eprintln!("tbbench: error: {message}");
            std::process::exit(1);
        }
        // Give rank 0 a moment to print it; print it here too if rank 0 is already gone.
        drop(w);
        std::thread::sleep(Duration::from_millis(1500));
        eprintln!("tbbench: error: {message}");
        std::process::exit(1);
    }

    /// A clean end: goodbye on every control connection, so closing them is not taken as death.
    pub fn finish(&self) {
        let mut w = self.writers.lock().unwrap_or_else(|p| p.into_inner());
        for s in w.iter_mut() {
            if let Some(st) = s.take() {
                let _ = write_frame(&st, &Ctrl::Bye);
            }
        }
    }

    fn watch(
        self,
        mut readers: Vec<Option<TcpStream>>,
        listener: Option<TcpListener>,
        token: Token,
    ) {
        let n = readers.len();
        let mut last_seen = vec![Instant::now(); n];
        let mut last_beat = Instant::now() - HEARTBEAT;
        if let Some(l) = &listener {
            let _ = l.set_nonblocking(true);
        }
        loop {
            if last_beat.elapsed() >= HEARTBEAT {
                let mut w = self.writers.lock().unwrap_or_else(|p| p.into_inner());
                for s in w.iter_mut().flatten() {
                    let _ = write_frame(s, &Ctrl::Heartbeat);
                }
                last_beat = Instant::now();
            }
            let mut fds: Vec<libc::pollfd> = Vec::new();
            let mut who: Vec<usize> = Vec::new();
            for (i, r) in readers.iter().enumerate() {
                if let Some(s) = r {
                    fds.push(libc::pollfd {
                        fd: s.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    });
                    who.push(i);
                }
            }
            if let Some(l) = &listener {
                fds.push(libc::pollfd {
                    fd: l.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            if who.is_empty() && listener.is_none() {
                return;
            }
            // SAFETY: fds is a valid pollfd array for the call.
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as _, 100) };
            for (k, &i) in who.iter().enumerate() {
                if fds[k].revents == 0 {
                    if last_seen[i].elapsed() > LIVENESS {
                        self.peer_failed(
                            i,
                            &format!(
                                "{} stopped answering (no heartbeat for {} s)",
                                self.peer_name(i),
                                LIVENESS.as_secs()
                            ),
                        );
                    }
                    continue;
                }
                let s = readers[i].as_ref().expect("polled reader exists");
                match read_frame(s) {
                    Ok(Ctrl::Heartbeat) => last_seen[i] = Instant::now(),
                    Ok(Ctrl::Bye) => {
                        readers[i] = None;
                        if self.rank != 0 {
                            return;
                        }
                    }
                    Ok(Ctrl::Abort { message }) => {
                        if self.rank == 0 {
                            self.abort(&message);
                        }
                        // Rank 0 printed it; this rank only stops.
                        std::process::exit(1);
                    }
                    Ok(_) => {}
                    Err(_) => self.peer_failed(
                        i,
                        &format!("{} died (control connection lost)", self.peer_name(i)),
                    ),
                }
            }
            if let Some(l) = &listener {
                if fds.last().map(|f| f.revents != 0).unwrap_or(false) {
                    if let Ok((stream, from)) = l.accept() {
                        let _ = stream.set_nonblocking(false);
                        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                        let why = match read_frame(&stream) {
                            Ok(Ctrl::Join { token: t, .. }) if t == token.hex() => {
                                "the run has already started"
                            }
                            _ => "wrong or missing session token",
                        };
                        eprintln!("tbbench: refused a rendezvous connection from {from}: {why}");
                    }
                }
            }
        }
    }

    fn peer_name(&self, i: usize) -> String {
        let rank = if self.rank == 0 { i } else { 0 };
        self.names
            .get(rank)
            .map(|n| n.to_string())
            .unwrap_or_else(|| format!("rank {rank}"))
    }

    fn peer_failed(&self, _i: usize, message: &str) -> ! {
        run_abort_hook();
        if self.rank == 0 {
            self.abort(message);
        }
        eprintln!("tbbench: error: {message}");
        std::process::exit(1);
    }
}
