//! The door of every listener ranks connect to (rank 0's rendezvous, the tcp data listeners):
//! a connection counts only once its first frame has proved it holds the session token.
//!
//! Anyone who can reach the port can connect, so until then a connection is a stranger and
//! must cost the run nothing: its bytes are read without blocking, as they come, by the
//! thread that owns the listener between its other work; the whole first frame must arrive
//! within one deadline from the accept (a byte now and then does not extend it); at most
//! [`MAX_STRANGERS`] wait at once, the oldest dropped for a newcomer; and the frame's judge
//! sees the token before anything large is read, and every length before it is allocated.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// How long a connection has to send its whole first frame. A real rank sends it at once.
pub const FIRST_FRAME_LIMIT: Duration = Duration::from_secs(5);
/// Connections waiting for their first frame at once, at most. A real rank's frame is usually
/// read the moment it is accepted, so crowding by strangers does not push it out.
pub const MAX_STRANGERS: usize = 16;
/// Refusals reported one line each; beyond that only a count, so strangers cannot flood the
/// user's terminal.
const REPORTED_REFUSALS: usize = 8;
/// Connections accepted per [`Gate::step`], so a flood of connects cannot hold up the
/// caller's other work (heartbeats on the control thread).
const ACCEPTS_PER_STEP: usize = 64;

/// What a judge says of the bytes of a first frame received so far.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict<T> {
    /// Undecided: read on until the frame holds this many bytes in all (more than it has).
    Need(usize),
    /// A peer of this run; the frame told this.
    Admit(T),
    /// Not one of this run's peers (or not a peer that fits), for this reason.
    Refuse(String),
}

/// Compares secrets in time independent of where they differ.
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

struct Stranger {
    stream: TcpStream,
    from: SocketAddr,
    accepted: Instant,
    got: Vec<u8>,
}

/// Connections accepted on one listener that have not yet sent a complete first frame.
pub struct Gate {
    /// Starts every line this gate prints ("tbbench: ", "tbbench: rank 2: ").
    prefix: String,
    /// "rendezvous", "data": what the listener is for, in those lines.
    kind: &'static str,
    limit: Duration,
    cap: usize,
    waiting: VecDeque<Stranger>,
    refused: usize,
    /// Connections that closed before a complete greeting, held back until `flush` (see
    /// `hold_closed`).
    held: Option<Vec<SocketAddr>>,
}

/// Why a connection that ended before its greeting was refused.
const CLOSED_EARLY: &str = "closed before a complete greeting";

impl Gate {
    pub fn new(prefix: impl Into<String>, kind: &'static str) -> Gate {
        Gate::with_limits(prefix, kind, FIRST_FRAME_LIMIT, MAX_STRANGERS)
    }

    pub fn with_limits(
        prefix: impl Into<String>,
        kind: &'static str,
        limit: Duration,
        cap: usize,
    ) -> Gate {
        Gate {
            prefix: prefix.into(),
            kind,
            limit,
            cap: cap.max(1),
            waiting: VecDeque::new(),
            refused: 0,
            held: None,
        }
    }

    /// Connections refused so far (each counted once, with or without its line).
    pub fn refused(&self) -> usize {
        self.refused
    }

    /// Connections waiting for their first frame now.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// What to poll besides the listener: the waiting connections, for their next bytes.
    pub fn pollfds(&self, out: &mut Vec<libc::pollfd>) {
        out.extend(self.waiting.iter().map(|s| libc::pollfd {
            fd: s.stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }));
    }

    /// How long the caller may sleep before a waiting connection's deadline passes.
    pub fn next_deadline_in(&self) -> Option<Duration> {
        self.waiting
            .iter()
            .map(|s| self.limit.saturating_sub(s.accepted.elapsed()))
            .min()
    }

    /// Sleeps until `listener` or a waiting connection has something, a waiting connection's
    /// deadline passes, or `max` has passed.
    pub fn wait(&self, listener: &TcpListener, max: Duration) {
        let mut fds = vec![libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        self.pollfds(&mut fds);
        let wait = self.next_deadline_in().map_or(max, |d| d.min(max));
        // Rounded up: a deadline a fraction of a millisecond away must not spin at 0 ms.
        let ms = wait.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
        // SAFETY: fds is a valid pollfd array for the call.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as _, ms) };
    }

    /// Accepts what waits on `listener` (which must be non-blocking), reads whatever the
    /// waiting connections have sent, and drops those refused, past their deadline or pushed
    /// out by newer ones. Returns the connections admitted, blocking again, each with what its
    /// judge made of its frame; not a byte after the frame has been read from them. Never
    /// blocks.
    pub fn step<T>(
        &mut self,
        listener: &TcpListener,
        mut judge: impl FnMut(&[u8]) -> Verdict<T>,
    ) -> Vec<(TcpStream, SocketAddr, T)> {
        let mut admitted = Vec::new();
        let mut still = VecDeque::with_capacity(self.waiting.len());
        while let Some(mut s) = self.waiting.pop_front() {
            match read_on(&mut s, &mut judge) {
                None => still.push_back(s),
                Some(Ok(t)) => admitted.extend(ready(s, t)),
                Some(Err(why)) => self.refuse(s.from, &why),
            }
        }
        self.waiting = still;
        for _ in 0..ACCEPTS_PER_STEP {
            let Ok((stream, from)) = listener.accept() else {
                break;
            };
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let mut s = Stranger {
                stream,
                from,
                accepted: Instant::now(),
                got: Vec::new(),
            };
            // A real peer writes its frame right after connecting: mostly it is already here,
            // and then it never waits among strangers.
            match read_on(&mut s, &mut judge) {
                None => {
                    if self.waiting.len() == self.cap {
                        if let Some(old) = self.waiting.pop_front() {
                            self.refuse(old.from, "pushed out by newer connections");
                        }
                    }
                    self.waiting.push_back(s);
                }
                Some(Ok(t)) => admitted.extend(ready(s, t)),
                Some(Err(why)) => self.refuse(from, &why),
            }
        }
        let limit = self.limit;
        let (late, on_time): (Vec<_>, Vec<_>) = self
            .waiting
            .drain(..)
            .partition(|s| s.accepted.elapsed() >= limit);
        self.waiting = on_time.into();
        for s in late {
            let why = format!(
                "no complete greeting within {:.0} s",
                limit.as_secs_f64().max(1.0)
            );
            self.refuse(s.from, &why);
        }
        admitted
    }

    /// Holds back the lines of connections that closed before a complete greeting until
    /// `flush`. While ranks connect to each other, a rank that dies mid-greeting (the run
    /// aborted elsewhere) closes its half-made connections: the abort ends this process before
    /// `flush`, and its one line is not followed by one per connection the abort cut.
    pub fn hold_closed(mut self) -> Gate {
        self.held = Some(Vec::new());
        self
    }

    /// Prints the lines held back by `hold_closed`.
    pub fn flush(&mut self) {
        for from in self.held.as_mut().map(std::mem::take).unwrap_or_default() {
            self.log_refusal(from, CLOSED_EARLY);
        }
    }

    /// Logs a refusal (the connection is closed when dropped).
    pub fn refuse(&mut self, from: SocketAddr, why: &str) {
        if why == CLOSED_EARLY {
            if let Some(held) = &mut self.held {
                held.push(from);
                return;
            }
        }
        self.log_refusal(from, why);
    }

    fn log_refusal(&mut self, from: SocketAddr, why: &str) {
        self.refused += 1;
        if self.refused <= REPORTED_REFUSALS {
            say(&format!(
                "{}refused a {} connection from {from}: {why}",
                self.prefix, self.kind
            ));
        } else if self.refused == REPORTED_REFUSALS + 1 {
            say(&format!(
                "{}refusing more {} connections without a line each",
                self.prefix, self.kind
            ));
        }
    }
}

/// Reads what `s` has sent, never past what the judge asked for, until the judge decides or
/// nothing more is there yet (None).
fn read_on<T>(
    s: &mut Stranger,
    judge: &mut impl FnMut(&[u8]) -> Verdict<T>,
) -> Option<Result<T, String>> {
    loop {
        let need = match judge(&s.got) {
            Verdict::Admit(t) => return Some(Ok(t)),
            Verdict::Refuse(why) => return Some(Err(why)),
            Verdict::Need(n) if n <= s.got.len() => {
                return Some(Err("a malformed greeting".into()))
            }
            Verdict::Need(n) => n,
        };
        let have = s.got.len();
        s.got.resize(need, 0);
        match (&s.stream).read(&mut s.got[have..]) {
            Ok(0) => {
                s.got.truncate(have);
                return Some(Err(CLOSED_EARLY.into()));
            }
            Ok(n) => s.got.truncate(have + n),
            Err(e) => {
                s.got.truncate(have);
                match e.kind() {
                    std::io::ErrorKind::WouldBlock => return None,
                    std::io::ErrorKind::Interrupted => {}
                    _ => return Some(Err(e.to_string())),
                }
            }
        }
    }
}

fn ready<T>(s: Stranger, t: T) -> Option<(TcpStream, SocketAddr, T)> {
    s.stream.set_nonblocking(false).ok()?;
    Some((s.stream, s.from, t))
}

/// Writes one line to stderr in a single write, so lines from ranks that share a terminal
/// never interleave mid-line.
pub fn say(line: &str) {
    let mut l = String::with_capacity(line.len() + 1);
    l.push_str(line);
    l.push('\n');
    let _ = std::io::stderr().lock().write_all(l.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A frame of `b"HI"` then one length byte and that many bytes.
    fn judge(got: &[u8]) -> Verdict<Vec<u8>> {
        if got.len() < 2 {
            return Verdict::Need(2);
        }
        if &got[..2] != b"HI" {
            return Verdict::Refuse("wrong magic".into());
        }
        if got.len() < 3 {
            return Verdict::Need(3);
        }
        let len = got[2] as usize;
        if len > 8 {
            return Verdict::Refuse("too long".into());
        }
        if got.len() < 3 + len {
            return Verdict::Need(3 + len);
        }
        Verdict::Admit(got[3..].to_vec())
    }

    /// Whether the other end has closed `s` (as opposed to merely sending nothing).
    fn closed(mut s: &TcpStream) -> bool {
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        match s.read(&mut [0u8; 1]) {
            Ok(n) => n == 0,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        }
    }

    fn listener() -> (TcpListener, SocketAddr) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let a = l.local_addr().unwrap();
        (l, a)
    }

    /// Steps the gate until something is admitted or `within` passes.
    fn step_until(
        gate: &mut Gate,
        l: &TcpListener,
        within: Duration,
    ) -> Vec<(TcpStream, SocketAddr, Vec<u8>)> {
        let start = Instant::now();
        loop {
            let got = gate.step(l, judge);
            if !got.is_empty() || start.elapsed() > within {
                return got;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn held_closures_wait_for_flush_and_other_refusals_do_not() {
        let (l, addr) = listener();
        let mut gate = Gate::new("test: ", "test").hold_closed();
        // Half a greeting, then closed; then a wrong one.
        let mut half = TcpStream::connect(addr).unwrap();
        half.write_all(b"H").unwrap();
        drop(half);
        let mut wrong = TcpStream::connect(addr).unwrap();
        wrong.write_all(b"NO").unwrap();
        let start = Instant::now();
        while gate.refused + gate.held.as_ref().map_or(0, Vec::len) < 2
            && start.elapsed() < Duration::from_secs(5)
        {
            assert!(gate.step(&l, judge).is_empty());
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(gate.refused, 1, "the wrong greeting is logged at once");
        assert_eq!(
            gate.held.as_ref().map(Vec::len),
            Some(1),
            "the closed one waits"
        );
        gate.flush();
        assert_eq!(gate.refused, 2);
        assert_eq!(gate.held.as_ref().map(Vec::len), Some(0));
    }

    #[test]
    fn a_slow_drip_is_dropped_at_the_deadline_of_the_whole_frame() {
        let (l, addr) = listener();
        let mut gate = Gate::with_limits("test: ", "test", Duration::from_millis(600), 4);
        let dripper = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            // A valid frame, one byte every 200 ms: each byte comes well within any per-read
            // timeout, but the whole takes 1.2 s.
            let mut sent = 0;
            for b in b"HI\x04abcd" {
                if s.write_all(&[*b]).is_err() {
                    break;
                }
                sent += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            sent
        });
        let start = Instant::now();
        let mut admitted = Vec::new();
        while start.elapsed() < Duration::from_secs(3) {
            admitted.extend(gate.step(&l, judge));
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(admitted.is_empty(), "the dripper got in");
        assert_eq!(gate.waiting(), 0);
        let sent = dripper.join().unwrap();
        assert!(sent < 7, "the connection stayed open for all {sent} bytes");
    }

    #[test]
    fn strangers_beyond_the_cap_push_out_the_oldest_and_never_block_a_peer() {
        let (l, addr) = listener();
        let mut gate = Gate::with_limits("test: ", "test", Duration::from_secs(30), 4);
        let silent: Vec<TcpStream> = (0..10).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(300) {
            assert!(gate.step(&l, judge).is_empty());
            assert!(gate.waiting() <= 4);
        }
        assert_eq!(gate.waiting(), 4);
        // The six oldest were closed; the four newest still wait.
        for (i, s) in silent.iter().enumerate() {
            assert_eq!(closed(s), i < 6, "stranger {i}");
        }
        let mut peer = TcpStream::connect(addr).unwrap();
        peer.write_all(b"HI\x02ok").unwrap();
        let got = step_until(&mut gate, &l, Duration::from_secs(2));
        assert_eq!(got.len(), 1, "the peer was not admitted");
        assert_eq!(got[0].2, b"ok");
        // Admitted streams block again and nothing past the frame was read.
        peer.write_all(b"after").unwrap();
        let mut rest = [0u8; 5];
        (&got[0].0).read_exact(&mut rest).unwrap();
        assert_eq!(&rest, b"after");
        drop(silent);
    }

    #[test]
    fn judged_bytes_refuse_early_and_nothing_oversized_is_read() {
        let (l, addr) = listener();
        let mut gate = Gate::with_limits("test: ", "test", Duration::from_secs(30), 4);
        // Wrong magic: refused on its first two bytes although the connection stays open.
        let mut wrong = TcpStream::connect(addr).unwrap();
        wrong.write_all(b"XX").unwrap();
        // A length over the judge's limit: refused before any of the body is awaited.
        let mut long = TcpStream::connect(addr).unwrap();
        long.write_all(b"HI\xff").unwrap();
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(300) {
            assert!(gate.step(&l, judge).is_empty());
        }
        assert_eq!(gate.waiting(), 0);
        assert!(closed(&wrong) && closed(&long));
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abcd", b"abcd"));
        assert!(!same_secret(b"abcd", b"abce"));
        assert!(!same_secret(b"abc", b"abcd"));
    }
}
