//! A small HTTP/1.1 client over `std::net::TcpStream`, for one thing: POST a JSON body and
//! read the streamed answer as it arrives, with a timestamp per read. Chunked and
//! length-framed bodies and bodies ended by the close are read; one connection per request
//! (`Connection: close`), so no pool hides a connect inside some request's first token. Every
//! wait on the network (connect, sending, each read) has the run's timeout.

use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Why one request did not complete; the run counts these per kind and goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FailKind {
    /// No TCP connection (refused, unreachable, name not resolved).
    Connect,
    /// A wait on the network passed the timeout.
    Timeout,
    /// The server answered with a status other than 200.
    Http(u16),
    /// The connection ended or reset before the stream's end.
    Broken,
    /// The stream carried an error object (or an `event: error`).
    StreamError,
    /// The answer was not an event stream of completion chunks.
    BadResponse,
    /// The stream ended properly but with no token and no finish_reason: the server dropped
    /// the request (llama-cpp-python does so when a newer request interrupts it).
    Empty,
}

impl fmt::Display for FailKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailKind::Connect => write!(f, "connect"),
            FailKind::Timeout => write!(f, "timeout"),
            FailKind::Http(s) => write!(f, "http-{s}"),
            FailKind::Broken => write!(f, "broken-stream"),
            FailKind::StreamError => write!(f, "stream-error"),
            FailKind::BadResponse => write!(f, "bad-response"),
            FailKind::Empty => write!(f, "empty-stream"),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Failure {
    pub kind: FailKind,
    pub message: String,
}

impl Failure {
    pub fn new(kind: FailKind, message: impl Into<String>) -> Self {
        Failure {
            kind,
            message: message.into(),
        }
    }

    /// Sorts an I/O error into timeout, broken stream or `otherwise`.
    pub fn from_io(e: &io::Error, during: &str, otherwise: FailKind) -> Self {
        let kind = match e.kind() {
            // A read timeout shows as WouldBlock on Unix, TimedOut elsewhere.
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => FailKind::Timeout,
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => FailKind::Broken,
            _ => otherwise,
        };
        let what = match kind {
            FailKind::Timeout => "no progress within the timeout".to_string(),
            _ => e.to_string(),
        };
        Failure::new(kind, format!("{during}: {what}"))
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

/// `http://host:port/base`, split once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub host: String,
    pub port: u16,
    /// The path before the API's own (`/v1`), without a trailing slash.
    pub base_path: String,
}

impl Url {
    pub fn parse(text: &str) -> Result<Url, String> {
        let rest = if let Some(r) = text.strip_prefix("http://") {
            r
        } else if text.starts_with("https://") {
            return Err(format!(
                "{text}: https is not supported (tbbench speaks plain HTTP/1.1 so that TLS \
                 never sits in the measured path); use the server's http address"
            ));
        } else {
            return Err(format!(
                "{text}: an endpoint is an http:// URL, e.g. http://127.0.0.1:8080/v1"
            ));
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.contains('@') {
            return Err(format!(
                "{text}: credentials in the URL are not accepted (use --api-key-env)"
            ));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let close = v6
                .find(']')
                .ok_or_else(|| format!("{text}: unclosed [ in the host"))?;
            let port = v6[close + 1..].strip_prefix(':');
            (format!("[{}]", &v6[..close]), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (authority.to_string(), None),
            }
        };
        if host.is_empty() || host == "[]" {
            return Err(format!("{text}: no host"));
        }
        let port = match port {
            Some(p) => p
                .parse::<u16>()
                .map_err(|_| format!("{text}: port '{p}' is not a number from 1 to 65535"))?,
            None => 80,
        };
        if port == 0 {
            return Err(format!("{text}: port 0 cannot be connected to"));
        }
        Ok(Url {
            host,
            port,
            base_path: path.trim_end_matches('/').to_string(),
        })
    }

    pub fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    fn addrs(&self) -> io::Result<Vec<SocketAddr>> {
        let host = self.host.trim_start_matches('[').trim_end_matches(']');
        Ok((host, self.port).to_socket_addrs()?.collect())
    }
}

pub struct Response {
    pub status: u16,
    pub reason: String,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Body,
    /// Both ends of the connection, for the network record.
    pub local: SocketAddr,
    pub peer: SocketAddr,
    /// How long the TCP connect took.
    pub connect: Duration,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The whole body as text (error answers), at most `limit` bytes of it.
    pub fn text(&mut self, limit: usize) -> String {
        let mut buf = Vec::new();
        let _ = (&mut self.body).take(limit as u64).read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// The whole body as text, or None where it is longer than `limit` bytes (an answer that
    /// size is not the one asked for; a cut one would read as corrupt).
    pub fn whole_text(&mut self, limit: usize) -> Option<String> {
        let mut buf = Vec::new();
        let _ = (&mut self.body)
            .take(limit as u64 + 1)
            .read_to_end(&mut buf);
        (buf.len() <= limit).then(|| String::from_utf8_lossy(&buf).into_owned())
    }

    /// The status for a message: "404 Not Found"; a redirect names where it points, as
    /// tbbench does not follow one (a benchmark's requests go where the user said).
    pub fn status_text(&self) -> String {
        let mut t = format!("{} {}", self.status, clip(&self.reason, 80))
            .trim_end()
            .to_string();
        if (300..400).contains(&self.status) {
            match self.header("location") {
                Some(to) => t.push_str(&format!(
                    ", a redirect to {} (tbbench does not follow redirects: give that URL)",
                    clip(to, 200)
                )),
                None => t.push_str(", a redirect that names no Location"),
            }
        }
        t
    }
}

/// Sends one request and reads the status line and headers. Callers start their clock before
/// calling, so the connect counts in the request's time (and is also returned on its own).
pub fn send(
    url: &Url,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> Result<Response, Failure> {
    let addrs = url
        .addrs()
        .map_err(|e| Failure::new(FailKind::Connect, format!("{}: {e}", url.host)))?;
    let connect_start = Instant::now();
    let mut last = None;
    let mut stream = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, timeout) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some((a, e)),
        }
    }
    let stream = match (stream, last) {
        (Some(s), _) => s,
        (None, Some((a, e))) => {
            let f = Failure::from_io(&e, &format!("connect to {a}"), FailKind::Connect);
            return Err(f);
        }
        (None, None) => {
            return Err(Failure::new(
                FailKind::Connect,
                format!("{} has no address", url.host),
            ))
        }
    };
    let connect = connect_start.elapsed();
    let io = |e: io::Error, during: &str| Failure::from_io(&e, during, FailKind::Broken);
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| io(e, "socket"))?;
    stream
        .set_write_timeout(Some(timeout))
        .map_err(|e| io(e, "socket"))?;
    // The request goes out in one segment rather than waiting on Nagle for the body.
    let _ = stream.set_nodelay(true);
    let local = stream.local_addr().map_err(|e| io(e, "socket"))?;
    let peer = stream.peer_addr().map_err(|e| io(e, "socket"))?;

    let mut head = format!(
        "{method} {}{path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: tbbench/{}\r\nConnection: close\r\nContent-Length: {}\r\n",
        url.base_path,
        url.authority(),
        env!("CARGO_PKG_VERSION"),
        body.len()
    );
    for (k, v) in headers {
        head.push_str(k);
        head.push_str(": ");
        head.push_str(v);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    let mut request = head.into_bytes();
    request.extend_from_slice(body);
    (&stream)
        .write_all(&request)
        .map_err(|e| io(e, "sending the request"))?;

    let mut reader = BufReader::with_capacity(64 * 1024, stream);
    loop {
        let status_line = read_line(&mut reader, "the status line")?;
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or("");
        let status: u16 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .filter(|_| version.starts_with("HTTP/1."))
            .ok_or_else(|| {
                Failure::new(
                    FailKind::BadResponse,
                    format!("not an HTTP/1.x status line: {:?}", clip(&status_line, 80)),
                )
            })?;
        let reason = parts.next().unwrap_or("").to_string();
        let mut headers = Vec::new();
        let mut total = 0usize;
        loop {
            let line = read_line(&mut reader, "the headers")?;
            if line.is_empty() {
                break;
            }
            total += line.len();
            if total > 64 * 1024 {
                return Err(Failure::new(
                    FailKind::BadResponse,
                    "headers longer than 64 KiB",
                ));
            }
            if let Some((k, v)) = line.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        // Interim answers (100 Continue) precede the real one.
        if (100..200).contains(&status) {
            continue;
        }
        let find = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        let framing = if method == "HEAD" || status == 204 || status == 304 {
            Framing::Length(0)
        } else if find("transfer-encoding")
            .is_some_and(|t| t.to_ascii_lowercase().contains("chunked"))
        {
            Framing::Chunked {
                left: 0,
                done: false,
            }
        } else if let Some(n) = find("content-length") {
            Framing::Length(n.parse().map_err(|_| {
                Failure::new(FailKind::BadResponse, format!("bad Content-Length {n:?}"))
            })?)
        } else {
            Framing::Close
        };
        return Ok(Response {
            status,
            reason,
            headers,
            body: Body { reader, framing },
            local,
            peer,
            connect,
        });
    }
}

fn clip(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// The longest status or header line read.
const MAX_LINE: usize = 16 * 1024;

fn read_line(reader: &mut BufReader<TcpStream>, what: &str) -> Result<String, Failure> {
    let mut buf = Vec::new();
    let n = (&mut *reader)
        .take(MAX_LINE as u64)
        .read_until(b'\n', &mut buf)
        .map_err(|e| Failure::from_io(&e, &format!("reading {what}"), FailKind::Broken))?;
    if n == MAX_LINE && buf.last() != Some(&b'\n') {
        return Err(Failure::new(
            FailKind::BadResponse,
            format!(
                "a line of {what} longer than {} KiB: not an HTTP answer tbbench reads",
                MAX_LINE >> 10
            ),
        ));
    }
    if n == 0 || buf.last() != Some(&b'\n') {
        return Err(Failure::new(
            FailKind::Broken,
            format!("the connection ended while reading {what}"),
        ));
    }
    buf.pop();
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

enum Framing {
    /// `left` bytes remain in the current chunk; `done` once the last chunk and trailers
    /// were read.
    Chunked {
        left: u64,
        done: bool,
    },
    Length(u64),
    /// The body ends when the server closes.
    Close,
}

/// The decoded body. Each `read` returns what the network delivered (at least one byte
/// unless the body is over), waiting at most the timeout for it.
pub struct Body {
    reader: BufReader<TcpStream>,
    framing: Framing,
}

impl Read for Body {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.framing {
            Framing::Length(0) => Ok(0),
            Framing::Length(left) => {
                let want = buf.len().min(*left as usize);
                let n = self.reader.read(&mut buf[..want])?;
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("the connection ended {left} bytes short of Content-Length"),
                    ));
                }
                *left -= n as u64;
                Ok(n)
            }
            Framing::Close => self.reader.read(buf),
            Framing::Chunked { left, done } => {
                if *done {
                    return Ok(0);
                }
                if *left == 0 {
                    let size = chunk_size_line(&mut self.reader)?;
                    if size == 0 {
                        // Trailers, then the blank line that ends the message.
                        loop {
                            if chunk_line(&mut self.reader)?.is_empty() {
                                break;
                            }
                        }
                        *done = true;
                        return Ok(0);
                    }
                    *left = size;
                }
                let want = buf.len().min(*left as usize);
                let n = self.reader.read(&mut buf[..want])?;
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the connection ended inside a chunk",
                    ));
                }
                *left -= n as u64;
                if *left == 0 {
                    let end = chunk_line(&mut self.reader)?;
                    if !end.is_empty() {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "chunk data longer than its size",
                        ));
                    }
                }
                Ok(n)
            }
        }
    }
}

fn chunk_line(reader: &mut BufReader<TcpStream>) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    reader.take(4096).read_until(b'\n', &mut buf)?;
    if buf.last() != Some(&b'\n') {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the connection ended inside the chunked framing",
        ));
    }
    buf.pop();
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    Ok(buf)
}

fn chunk_size_line(reader: &mut BufReader<TcpStream>) -> io::Result<u64> {
    let line = chunk_line(reader)?;
    let text = String::from_utf8_lossy(&line);
    // Chunk extensions (`;name=value`) carry nothing tbbench uses.
    let hex = text.split(';').next().unwrap_or("").trim();
    u64::from_str_radix(hex, 16).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad chunk size line {:?}", clip(&text, 40)),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn urls_split_into_host_port_and_base() {
        let u = Url::parse("http://127.0.0.1:8080/v1/").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.base_path.as_str()),
            ("127.0.0.1", 8080, "/v1")
        );
        let u = Url::parse("http://[::1]:9000/v1").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("[::1]", 9000));
        assert_eq!(Url::parse("http://mac1").unwrap().port, 80);
        for bad in [
            "https://x/v1",
            "ftp://x",
            "127.0.0.1:8080",
            "http://:80/v1",
            "http://h:99999/v1",
            "http://u:p@h/v1",
        ] {
            assert!(Url::parse(bad).is_err(), "{bad}");
        }
    }

    /// Serves one connection with `answer` (raw bytes, written in the pieces given).
    fn serve(pieces: Vec<Vec<u8>>) -> Url {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut req = [0u8; 4096];
            let _ = s.read(&mut req);
            for p in pieces {
                s.write_all(&p).unwrap();
                s.flush().unwrap();
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Url::parse(&format!("http://127.0.0.1:{port}/v1")).unwrap()
    }

    #[test]
    fn chunked_bodies_are_decoded_across_pieces() {
        let url = serve(vec![
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhel".to_vec(),
            b"lo\r\n6\r\n world\r".to_vec(),
            b"\n0\r\nX-Trailer: 1\r\n\r\n".to_vec(),
        ]);
        let mut r = send(&url, "POST", "/x", &[], b"{}", Duration::from_secs(5)).unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.text(1 << 20), "hello world");
    }

    #[test]
    fn a_body_cut_inside_a_chunk_is_a_broken_stream() {
        let url = serve(vec![
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nshort".to_vec(),
        ]);
        let mut r = send(&url, "POST", "/x", &[], b"", Duration::from_secs(5)).unwrap();
        let mut buf = [0u8; 64];
        let mut err = None;
        for _ in 0..10 {
            match r.body.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        let e = err.expect("a cut chunk is an error, not the end");
        assert_eq!(
            Failure::from_io(&e, "reading", FailKind::Broken).kind,
            FailKind::Broken
        );
    }

    #[test]
    fn length_and_close_framing() {
        let url = serve(vec![
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 Not Found\r\nContent-Length: 4\r\n\r\nnope-extra".to_vec(),
        ]);
        let mut r = send(&url, "GET", "/models", &[], b"", Duration::from_secs(5)).unwrap();
        assert_eq!((r.status, r.reason.as_str()), (404, "Not Found"));
        assert_eq!(r.text(100), "nope");
        let url = serve(vec![b"HTTP/1.0 200 OK\r\n\r\nuntil close".to_vec()]);
        let mut r = send(&url, "GET", "/", &[], b"", Duration::from_secs(5)).unwrap();
        assert_eq!(r.text(100), "until close");
    }

    /// Serves one connection with `answer`, ignoring a client that stops reading.
    fn serve_loose(answer: Vec<u8>) -> Url {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut req = [0u8; 4096];
            let _ = s.read(&mut req);
            let _ = s.write_all(&answer);
        });
        Url::parse(&format!("http://127.0.0.1:{port}/v1")).unwrap()
    }

    /// A redirect is named with where it points; a header line past the cap is called that
    /// (not a connection that ended); a body past what the caller takes is told apart from a
    /// short one.
    #[test]
    fn redirects_long_lines_and_long_bodies_are_named() {
        let url = serve(vec![
            b"HTTP/1.1 301 Moved Permanently\r\nLocation: http://10.0.0.9:8080/v1/models\r\nContent-Length: 0\r\n\r\n".to_vec(),
        ]);
        let r = send(&url, "GET", "/models", &[], b"", Duration::from_secs(5)).unwrap();
        let t = r.status_text();
        assert!(
            t.starts_with("301 Moved Permanently, a redirect to http://10.0.0.9:8080/v1/models"),
            "{t}"
        );
        let mut long = b"HTTP/1.1 200 OK\r\nX-Big: ".to_vec();
        long.extend(std::iter::repeat_n(b'a', 1 << 20));
        long.extend_from_slice(b"\r\n\r\n");
        let e = send(
            &serve_loose(long),
            "GET",
            "/",
            &[],
            b"",
            Duration::from_secs(5),
        )
        .err()
        .expect("a 1 MiB header line is refused");
        assert_eq!(e.kind, FailKind::BadResponse, "{e}");
        assert!(e.message.contains("longer than 16 KiB"), "{e}");
        let mut body = b"HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n".to_vec();
        body.extend(std::iter::repeat_n(b'{', 2000));
        let mut r = send(
            &serve_loose(body.clone()),
            "GET",
            "/",
            &[],
            b"",
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(r.whole_text(1999), None);
        let mut r = send(
            &serve_loose(body),
            "GET",
            "/",
            &[],
            b"",
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(r.whole_text(2000).map(|t| t.len()), Some(2000));
    }

    #[test]
    fn a_silent_server_times_out() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = Url::parse(&format!("http://{}/v1", l.local_addr().unwrap())).unwrap();
        let t = Instant::now();
        let e = send(&url, "GET", "/", &[], b"", Duration::from_millis(300))
            .err()
            .expect("no answer is a failure");
        assert_eq!(e.kind, FailKind::Timeout, "{e}");
        assert!(t.elapsed() < Duration::from_secs(3));
        drop(l);
    }

    #[test]
    fn a_closed_port_is_a_connect_failure() {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let url = Url::parse(&format!("http://127.0.0.1:{port}/v1")).unwrap();
        let e = send(&url, "GET", "/", &[], b"", Duration::from_secs(2))
            .err()
            .unwrap();
        assert_eq!(e.kind, FailKind::Connect, "{e}");
    }
}
