//! Where tbbench ranks run and how they talk: launch (local processes, ssh/rsh hostfiles),
//! rendezvous, transports (tcp, shm, verbs) and the collectives suites use.
//! Never imports a suite: suites implement [`suite::Suite`] and the driver runs them.

pub mod abort;
pub mod cli;
pub mod comm;
pub mod driver;
pub mod energy;
/// The door of every listener (its own crate, as the software RDMA device uses it too).
pub use tbbench_gate as gate;
pub mod hostcheck;
pub mod hostfile;
pub mod launch;
pub mod links;
pub mod mpi_boot;
pub mod netinfo;
pub mod offer;
pub mod options;
pub mod others;
pub mod pinning;
pub mod rendezvous;
pub mod session;
pub mod slurm;
pub mod suite;
pub mod sysinfo;
pub mod transport;
pub mod units;
