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
    use crate::offer::Offer;
    use crate::session::Launcher;
    use anyhow::anyhow;
    use mpi::traits::*;

    let universe = mpi::initialize().ok_or_else(|| anyhow!("MPI could not be initialized"))?;
    let world = universe.world();
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let root = world.process_at_rank(0);
    // Rank 0 binds the rendezvous first, then tells everyone where it is.
    let mut listener = None;
    let mut msg = [0u8; 1024];
    if rank == 0 {
        let (l, offer) = Offer::bind(opts)?;
        let line = offer.encode();
        let bytes = line.as_bytes();
        let n = bytes.len().min(1023);
        msg[..n].copy_from_slice(&bytes[..n]);
        listener = Some(l);
    }
    root.broadcast_into(&mut msg[..]);
    let offer = Offer::decode(String::from_utf8_lossy(&msg).trim_end_matches('\0'))?;
    Ok(Bootstrap {
        rank,
        size,
        token: offer.token,
        rdv: (rank != 0).then(|| offer.rdv()),
        listener,
        label: None,
        addr: None,
        launched: false,
        launcher: Launcher::named("mpirun"),
        keepalive: Some(Box::new(universe)),
    })
}
