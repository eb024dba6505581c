//! Rendezvous and the control channel.
//!
//! Rank 0 listens; every other rank connects, presents the run's session token and what rank
//! 0 must know of it (host, data address and port), and receives the table of all ranks.
//! Until a connection has shown the token it is a stranger, handled by a [`Gate`]: it can
//! neither hold up the wait for the real ranks nor, later, the control channel.
//! The connections then stay open as the control channel: heartbeats both ways, so a rank
//! that dies or stops answering is noticed within seconds even while every other rank is busy
//! computing, and an abort message that ends every rank with one error naming the culprit.
//! (Under RDMA's unreliable connections this channel is the only liveness check there is.)

use crate::abort::{exit_now, run_abort_hook, unwind_main_thread, unwound};
use crate::gate::{same_secret, say, Gate, Verdict};
use crate::session::{PeerName, RankInfo, Token, EXIT_RANK0_LOST, EXIT_RANK0_SILENT};
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

/// What a joining rank says after the token, in its first frame.
#[derive(Debug, Serialize, Deserialize)]
struct Join {
    size: usize,
    info: RankInfo,
}

/// A joining rank's first frame: this magic, the raw token, then a length-prefixed [`Join`],
/// so rank 0 checks the token before it reads or allocates anything a stranger chooses.
const JOIN_MAGIC: &[u8; 4] = b"TBBR";
const JOIN_HEAD: usize = 4 + 16 + 4;
/// A rank's [`Join`] is a few KiB; anything near this is not one.
const MAX_JOIN_BYTES: usize = 1 << 20;
/// Control frames after the rendezvous come from ranks that showed the token.
const MAX_FRAME_BYTES: usize = 16 << 20;
/// Tries of a rank whose join rank 0 closed without an answer (see [`join`]).
const JOIN_ATTEMPTS: usize = 3;

fn join_greeting(token: &Token, size: usize, info: RankInfo) -> Result<Vec<u8>> {
    let body = serde_json::to_vec(&Join { size, info })?;
    let mut frame = Vec::with_capacity(JOIN_HEAD + body.len());
    frame.extend_from_slice(JOIN_MAGIC);
    frame.extend_from_slice(&token.0);
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// Judges a rendezvous connection's first frame as its bytes arrive (see [`Gate`]).
fn judge_join(token: &Token, got: &[u8]) -> Verdict<Join> {
    const WRONG_TOKEN: &str = "wrong or missing session token";
    if got.len() < 4 {
        return Verdict::Need(4);
    }
    if &got[..4] != JOIN_MAGIC {
        return Verdict::Refuse(WRONG_TOKEN.into());
    }
    if got.len() < 20 {
        return Verdict::Need(20);
    }
    if !same_secret(&got[4..20], &token.0) {
        return Verdict::Refuse(WRONG_TOKEN.into());
    }
    if got.len() < JOIN_HEAD {
        return Verdict::Need(JOIN_HEAD);
    }
    let len = u32::from_le_bytes(got[20..24].try_into().expect("4 bytes")) as usize;
    if len > MAX_JOIN_BYTES {
        return Verdict::Refuse(format!(
            "a greeting of {len} bytes (at most {MAX_JOIN_BYTES})"
        ));
    }
    if got.len() < JOIN_HEAD + len {
        return Verdict::Need(JOIN_HEAD + len);
    }
    match serde_json::from_slice(&got[JOIN_HEAD..]) {
        Ok(join) => Verdict::Admit(join),
        Err(e) => Verdict::Refuse(format!("a malformed greeting ({e})")),
    }
}

/// Frames on the control channel, after the rendezvous.
#[derive(Debug, Serialize, Deserialize)]
enum Ctrl {
    Table {
        ranks: Vec<RankInfo>,
    },
    /// A second round ([`second_round`]): one rank's word to rank 0, then every rank's.
    Word {
        text: Option<String>,
    },
    Words {
        all: Vec<Option<String>>,
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
    if len > MAX_FRAME_BYTES {
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

/// Tells a rank that showed the token why rank 0 will not have it, so its own error says so.
fn turn_away(stream: &TcpStream, why: &str) {
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    let _ = write_frame(
        stream,
        &Ctrl::Abort {
            message: format!("rank 0 refused this rank: {why}"),
        },
    );
}

/// Rank 0's side: accepts until every rank has joined with the right token, then sends each
/// the table. Connections with a wrong or missing token, or too slow to show it, are refused
/// and logged; the wait goes on for the real ranks.
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
    let mut gate = Gate::new("tbbench: ", "rendezvous");
    while infos.iter().any(|i| i.is_none()) {
        if Instant::now() > deadline {
            let missing: Vec<String> = (0..size)
                .filter(|r| infos[*r].is_none())
                .map(|r| r.to_string())
                .collect();
            bail!("timed out after {:.0} s waiting for rank(s) {} to join (did they start? is the address reachable?)", timeout.as_secs_f64(), missing.join(", "));
        }
        gate.wait(listener, Duration::from_millis(100));
        for (stream, from, join) in gate.step(listener, |got| judge_join(token, got)) {
            let Join { size: s, mut info } = join;
            if s != size || info.rank == 0 || info.rank >= size || infos[info.rank].is_some() {
                let why = format!("rank {} of {s} does not fit this run of {size}", info.rank);
                turn_away(&stream, &why);
                gate.refuse(from, &why);
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

/// A second round on the rendezvous connections, after the table, for what a rank can say only
/// once it knows the others (verbs over links: each peer's queue pairs on the device of its
/// cable). Every rank gives its word (None where it has none, e.g. its device did not open:
/// its own error comes later, on the control channel) and gets every rank's, in rank order.
/// Rank 0 holds `conns` (from [`gather_ranks`]), the others their one stream to rank 0; the
/// connections are the token-checked ones, and every wait ends after `timeout`.
pub fn second_round(
    rank: usize,
    conns: &[Option<TcpStream>],
    word: Option<String>,
    timeout: Duration,
) -> Result<Vec<Option<String>>> {
    if rank == 0 {
        let mut all: Vec<Option<String>> = vec![None; conns.len()];
        all[0] = word;
        // One deadline for every rank's word, not one each.
        let deadline = Instant::now() + timeout;
        for (r, c) in conns.iter().enumerate() {
            let Some(c) = c else { continue };
            c.set_nonblocking(false)?;
            let left = deadline.saturating_duration_since(Instant::now());
            c.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
            match read_frame(c) {
                Ok(Ctrl::Word { text }) => all[r] = text,
                Ok(Ctrl::Abort { message }) => bail!("{message}"),
                Ok(other) => bail!("rank {r} sent {other:?} in the rendezvous' second round"),
                Err(e) if timed_out(&e) => {
                    bail!(
                        "rank {r} said nothing in the rendezvous' second round within {:.0} s",
                        timeout.as_secs_f64()
                    )
                }
                Err(e) => bail!("rank {r} left the rendezvous before its second round: {e}"),
            }
        }
        for c in conns.iter().flatten() {
            c.set_write_timeout(Some(timeout))?;
            write_frame(c, &Ctrl::Words { all: all.clone() })
                .context("sending the second round's words")?;
        }
        Ok(all)
    } else {
        let c = conns
            .first()
            .and_then(|c| c.as_ref())
            .ok_or_else(|| anyhow!("no connection to rank 0"))?;
        c.set_read_timeout(Some(timeout))?;
        c.set_write_timeout(Some(timeout))?;
        write_frame(c, &Ctrl::Word { text: word })
            .context("rendezvous second round: telling rank 0")?;
        match read_frame(c) {
            Ok(Ctrl::Words { all }) => Ok(all),
            Ok(Ctrl::Abort { message }) => bail!("{message}"),
            Ok(other) => bail!("rank 0 sent {other:?} in the rendezvous' second round"),
            Err(e) => bail!("rank 0 did not finish the rendezvous' second round: {e}"),
        }
    }
}

/// A non-zero rank's side: connects (retrying while rank 0 comes up), joins, waits for the table.
/// The addresses of `rdv`, which may list alternatives ("10.0.0.1:4791,192.168.1.5:4791",
/// as the MPI bootstrap sends every address rank 0 has), in order. One that does not resolve
/// is passed over while another does; where none does, the first one's error comes back,
/// with that alternative.
pub fn resolve(rdv: &str) -> std::result::Result<Vec<SocketAddr>, (String, std::io::Error)> {
    let mut addrs: Vec<SocketAddr> = Vec::new();
    let mut first_error = None;
    for alt in rdv.split(',').filter(|a| !a.is_empty()) {
        match std::net::ToSocketAddrs::to_socket_addrs(alt) {
            Ok(found) => addrs.extend(found),
            Err(e) => {
                first_error.get_or_insert((alt.to_string(), e));
            }
        }
    }
    match (addrs.is_empty(), first_error) {
        (true, Some(e)) => Err(e),
        (true, None) => Err((
            rdv.to_string(),
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address given"),
        )),
        _ => Ok(addrs),
    }
}

/// Joins rank 0's rendezvous at `addrs` (what [`resolve`] made of `rdv`, which names it in
/// messages).
pub fn join(
    rdv: &str,
    addrs: &[SocketAddr],
    token: &Token,
    size: usize,
    me: RankInfo,
    timeout: Duration,
) -> Result<(Vec<RankInfo>, TcpStream)> {
    let deadline = Instant::now() + timeout;
    let greeting = join_greeting(token, size, me)?;
    let mut attempt = 1;
    loop {
        let stream = connect_any(addrs, rdv, deadline, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        let reply = (&stream)
            .write_all(&greeting)
            .and_then(|()| read_frame(&stream));
        match reply {
            Ok(Ctrl::Table { ranks }) => return Ok((ranks, stream)),
            Ok(Ctrl::Abort { message }) => bail!("{message}"),
            Ok(other) => bail!("unexpected reply from rank 0 at {rdv}: {other:?}"),
            // Rank 0 drops connections it could not read in time, which can befall a real
            // rank when strangers crowd its port; a wrong token closes every try.
            Err(e) if closed(&e) && attempt < JOIN_ATTEMPTS && Instant::now() < deadline => {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) if closed(&e) => {
                bail!("rank 0 at {rdv} closed the rendezvous connection (wrong session token?)")
            }
            Err(e) if timed_out(&e) => {
                bail!(
                    "rank 0 at {rdv} did not answer within {:.0} s",
                    timeout.as_secs_f64()
                )
            }
            Err(e) => bail!("rendezvous with rank 0 at {rdv}: {e}"),
        }
    }
}

/// A read that gave up at its timeout (WouldBlock on Unix sockets, TimedOut elsewhere).
fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

fn closed(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::UnexpectedEof
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::BrokenPipe
    )
}

/// The first of `addrs` that accepts a connection, retrying all of them until `deadline`.
fn connect_any(
    addrs: &[SocketAddr],
    rdv: &str,
    deadline: Instant,
    timeout: Duration,
) -> Result<TcpStream> {
    loop {
        let mut last_err = None;
        for a in addrs {
            match TcpStream::connect_timeout(a, Duration::from_secs(2)) {
                Ok(s) => return Ok(s),
                Err(e) => last_err = Some(e),
            }
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
    /// Started by tbbench's launcher, which names a lost rank 0 itself, once for all ranks.
    launched: bool,
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
        launched: bool,
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
            launched,
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
        let mut w = self.writers.lock().unwrap_or_else(|p| p.into_inner());
        for s in w.iter_mut().flatten() {
            let _ = write_frame(
                s,
                &Ctrl::Abort {
                    message: message.to_string(),
                },
            );
        }
        // The others are told; now this rank's main thread closes what it opened (at once
        // when it is the caller: it has already unwound).
        if !unwound() {
            unwind_main_thread();
        }
        run_abort_hook();
        if self.rank == 0 {
            say(&format!("tbbench: error: {message}"));
            exit_now(1);
        }
        // Give rank 0 a moment to print it; print it here too if rank 0 is already gone.
        drop(w);
        std::thread::sleep(Duration::from_millis(1500));
        say(&format!("tbbench: error: {message}"));
        exit_now(1);
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
        // Strangers on the rendezvous port wait here, read only as their bytes come, so none
        // can stall the heartbeats.
        let mut gate = Gate::new("tbbench: ", "rendezvous");
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
                gate.pollfds(&mut fds);
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
                            EXIT_RANK0_SILENT,
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
                        // Rank 0 printed it; this rank only closes what it opened and stops.
                        unwind_main_thread();
                        run_abort_hook();
                        exit_now(1);
                    }
                    Ok(_) => {}
                    // Rank 0's main thread has failed and is ending the run with its own
                    // cause (`abort`): a peer that stops as told is no death to report, and
                    // reporting it could print before, and instead of, the real cause.
                    Err(_) if self.rank == 0 && unwound() => return,
                    Err(_) => self.peer_failed(
                        i,
                        &format!("{} died (control connection lost)", self.peer_name(i)),
                        EXIT_RANK0_LOST,
                    ),
                }
            }
            if let Some(l) = &listener {
                for (stream, from, _) in gate.step(l, |got| judge_join(&token, got)) {
                    let why = "the run has already started";
                    turn_away(&stream, why);
                    gate.refuse(from, why);
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

    /// Ends this rank because a peer failed. Rank 0 ends the run with one line naming the
    /// peer; a rank that lost rank 0 under the launcher leaves the line to it (every rank
    /// notices at once) and only says, by `launched_code`, which way rank 0 was lost.
    fn peer_failed(&self, _i: usize, message: &str, launched_code: i32) -> ! {
        if self.rank == 0 {
            self.abort(message);
        }
        unwind_main_thread();
        run_abort_hook();
        if self.launched {
            exit_now(launched_code);
        }
        say(&format!("tbbench: error: {message}"));
        exit_now(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The MPI bootstrap sends every address rank 0 has: an alternative that does not
    /// resolve is passed over, and only a list with none that resolves is an error, naming
    /// its first.
    #[test]
    fn alternatives_resolve_while_one_does() {
        let addrs = resolve("no-such-host.invalid:4791,127.0.0.1:4791").unwrap();
        assert_eq!(addrs, vec!["127.0.0.1:4791".parse::<SocketAddr>().unwrap()]);
        let two = resolve("10.0.0.1:1,127.0.0.1:2").unwrap();
        assert_eq!(two.len(), 2);
        let (alt, _) = resolve("a.invalid:1,b.invalid:2").unwrap_err();
        assert_eq!(alt, "a.invalid:1");
        assert!(resolve("").is_err());
    }

    fn info(rank: usize) -> RankInfo {
        RankInfo {
            rank,
            hostname: "h".into(),
            label: "localhost".into(),
            data_ip: None,
            data_port: 0,
            pid: 1,
            boot_id: String::new(),
            host: Default::default(),
            rdma: None,
            links: None,
        }
    }

    /// Feeds `frame` to the judge as a gate would: growing to what it asks for.
    fn judge_all(token: &Token, frame: &[u8]) -> Verdict<Join> {
        let mut have = 0;
        loop {
            match judge_join(token, &frame[..have]) {
                Verdict::Need(n) if n <= frame.len() => have = n,
                other => return other,
            }
        }
    }

    #[test]
    fn the_token_is_judged_before_anything_a_stranger_sizes() {
        let token = Token([7; 16]);
        let good = join_greeting(&token, 3, info(2)).unwrap();
        match judge_all(&token, &good) {
            Verdict::Admit(j) => assert_eq!((j.size, j.info.rank), (3, 2)),
            other => panic!("{other:?}"),
        }
        // Wrong token: refused on its first 20 bytes, whatever follows.
        let forged = join_greeting(&Token([8; 16]), 3, info(2)).unwrap();
        assert!(matches!(
            judge_join(&token, &forged[..20]),
            Verdict::Refuse(_)
        ));
        assert!(matches!(
            judge_join(&token, b"GET / HTTP/1.1\r\n"),
            Verdict::Refuse(_)
        ));
        // The right token with a huge length: refused on the length, nothing allocated.
        let mut huge = good[..20].to_vec();
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(judge_join(&token, &huge), Verdict::Refuse(w) if w.contains("bytes")));
        // The right token and garbage for the body: refused, not a panic.
        let mut junk = good[..20].to_vec();
        junk.extend_from_slice(&3u32.to_le_bytes());
        junk.extend_from_slice(b"{{{");
        assert!(matches!(judge_join(&token, &junk), Verdict::Refuse(_)));
        assert!(matches!(judge_join(&token, &good[..10]), Verdict::Need(20)));
    }
}
