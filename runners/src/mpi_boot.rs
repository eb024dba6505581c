//! Starting under `mpirun` (build feature `mpi`): MPI says which rank this is and how many
//! there are, and carries rank 0's rendezvous address and the session token to every rank, as
//! nccl-tests bootstrap NCCL. MPI is used for nothing else: the suites' traffic still goes
//! over the chosen transport. This is the path for clusters larger than a handful of hosts.

use crate::options::RunOptions;
use crate::session::Bootstrap;
use anyhow::Result;

/// The world size when this process was started by mpirun/mpiexec (OpenMPI, MPICH, PMIx).
pub fn mpirun_size() -> Option<usize> {
    [
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_SIZE",
        "MPI_LOCALNRANKS",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok())
    .and_then(|s| s.parse().ok())
}

#[cfg(not(feature = "mpi"))]
pub fn bootstrap(_opts: &RunOptions, size: usize) -> Result<Bootstrap> {
    anyhow::bail!(
        "started by mpirun ({size} ranks), but this tbbench was built without MPI support: rebuild with `cargo build --release --features mpi`, or run without mpirun (tbbench starts its own ranks)"
    )
}

#[cfg(feature = "mpi")]
pub fn bootstrap(opts: &RunOptions, _size: usize) -> Result<Bootstrap> {
    use crate::session::Token;
    use anyhow::{anyhow, Context};
    use mpi::traits::*;
    use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};

    let universe = mpi::initialize().ok_or_else(|| anyhow!("MPI could not be initialized"))?;
    let world = universe.world();
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let root = world.process_at_rank(0);
    // Rank 0 binds the rendezvous first, then tells everyone where it is: every address it
    // has (the --iface or --addr one alone when given), so each rank can try them in turn.
    let mut listener = None;
    let mut msg = [0u8; 1024];
    if rank == 0 {
        let ip = match (&opts.net.iface, opts.net.addr) {
            (Some(i), _) => Some(IpAddr::V4(crate::netinfo::ipv4_of(i)?)),
            (None, a) => a,
        };
        let l = TcpListener::bind(SocketAddr::new(
            ip.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
            opts.port,
        ))
        .context("cannot listen for the rendezvous")?;
        let port = l.local_addr()?.port();
        let candidates: Vec<String> = match ip {
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
        let token = Token::random()?;
        let text = format!("{} {} {}", token.hex(), port, candidates.join(","));
        let bytes = text.as_bytes();
        msg[..bytes.len().min(1023)].copy_from_slice(&bytes[..bytes.len().min(1023)]);
        listener = Some(l);
    }
    root.broadcast_into(&mut msg[..]);
    let text = String::from_utf8_lossy(&msg)
        .trim_end_matches('\0')
        .to_string();
    let mut words = text.split(' ');
    let token = Token::from_hex(words.next().unwrap_or(""))?;
    let port: u16 = words
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| anyhow!("bad rendezvous message from rank 0"))?;
    let candidates: Vec<&str> = words.next().unwrap_or("").split(',').collect();
    // Every candidate goes to the rendezvous, which tries them in turn; the token guards
    // against reaching some other listener.
    let rdv = (rank != 0).then(|| {
        candidates
            .iter()
            .map(|c| format!("{c}:{port}"))
            .collect::<Vec<_>>()
            .join(",")
    });
    Ok(Bootstrap {
        rank,
        size,
        token,
        rdv,
        listener,
        label: None,
        addr: None,
        launched: false,
        keepalive: Some(Box::new(universe)),
    })
}
