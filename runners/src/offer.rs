//! Rank 0's offer to ranks that another launcher started (mpirun, srun): the session token, the
//! rendezvous port and every address rank 0 may be reached at, as one short line that any
//! channel the launcher provides carries (an MPI broadcast, PMI's key-value store, a file only
//! the user can read). The token is drawn at random by rank 0: never derived from anything
//! the launcher shows other users (a job id, a port).

use crate::options::RunOptions;
use crate::session::Token;
use anyhow::{anyhow, Context, Result};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};

/// What the other ranks need to join rank 0.
#[derive(Debug, Clone, PartialEq)]
pub struct Offer {
    pub token: Token,
    pub port: u16,
    /// Addresses to try in turn (the --iface or --addr one alone when given).
    pub addrs: Vec<String>,
}

impl Offer {
    /// Rank 0 binds its rendezvous listener (on the --iface or --addr address when given, else
    /// every address) and draws the token.
    pub fn bind(opts: &RunOptions) -> Result<(TcpListener, Offer)> {
        let ip = match (&opts.net.iface, opts.net.addr) {
            (Some(i), _) => Some(IpAddr::V4(crate::netinfo::ipv4_of(i)?)),
            (None, a) => a,
        };
        let listener = TcpListener::bind(SocketAddr::new(
            ip.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
            opts.port,
        ))
        .with_context(|| format!("cannot listen for the rendezvous on port {}", opts.port))?;
        let port = listener.local_addr()?.port();
        let addrs: Vec<String> = match ip {
            Some(ip) => vec![ip.to_string()],
            None => {
                let mut all: Vec<String> = crate::netinfo::interfaces()?
                    .into_iter()
                    .filter(|i| i.up)
                    .flat_map(|i| i.ipv4)
                    .filter(|a| !a.is_loopback())
                    .map(|a| a.to_string())
                    .collect();
                all.push("127.0.0.1".into());
                all
            }
        };
        let offer = Offer {
            token: Token::random()?,
            port,
            addrs,
        };
        Ok((listener, offer))
    }

    /// One line without spaces or `=` (PMI's values allow neither): `TOKEN-PORT-ADDR,ADDR`.
    pub fn encode(&self) -> String {
        format!(
            "{}-{}-{}",
            self.token.hex(),
            self.port,
            self.addrs.join(",")
        )
    }

    pub fn decode(text: &str) -> Result<Offer> {
        let bad = || anyhow!("rank 0's rendezvous offer is malformed ('{}')", text.trim());
        let mut parts = text.trim().splitn(3, '-');
        let token = Token::from_hex(parts.next().ok_or_else(bad)?).map_err(|_| bad())?;
        let port = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let addrs: Vec<String> = parts
            .next()
            .ok_or_else(bad)?
            .split(',')
            .filter(|a| !a.is_empty())
            .map(str::to_string)
            .collect();
        if addrs.is_empty() {
            return Err(bad());
        }
        Ok(Offer { token, port, addrs })
    }

    /// The rendezvous address list the other ranks join (`ADDR:PORT,...`); the token guards
    /// against reaching some other listener on one of them.
    pub fn rdv(&self) -> String {
        self.addrs
            .iter()
            .map(|a| {
                if a.contains(':') {
                    format!("[{a}]:{}", self.port)
                } else {
                    format!("{a}:{}", self.port)
                }
            })
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offer_survives_its_line_and_bad_lines_are_named() {
        let o = Offer {
            token: Token([7; 16]),
            port: 40123,
            addrs: vec!["10.0.0.1".into(), "127.0.0.1".into()],
        };
        let line = o.encode();
        assert!(!line.contains(' ') && !line.contains('='), "{line}");
        assert_eq!(Offer::decode(&line).unwrap(), o);
        assert_eq!(o.rdv(), "10.0.0.1:40123,127.0.0.1:40123");
        for bad in [
            "",
            "abc",
            "0707-1-1.2.3.4",
            &format!("{}-x-1.2.3.4", o.token.hex()),
        ] {
            let e = Offer::decode(bad).unwrap_err().to_string();
            assert!(e.contains("malformed"), "{e}");
        }
        let e = Offer::decode(&format!("{}-5-", o.token.hex())).unwrap_err();
        assert!(e.to_string().contains("malformed"));
    }
}
