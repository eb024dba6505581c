//! `tbbench coll`'s flags, its config, and its registration with the binary.

use crate::peers::{MlxBackend, Peer};
use crate::{parse_redop, CollConfig, CollSuite};
use clap::{Args, CommandFactory, FromArgMatches, Parser};
use std::path::PathBuf;
use tbbench_runners::cli::{
    parse_rate, parse_size, parse_size_list, QuickPlan, QuickRun, Registration, RunArgs, UsageError,
};
use tbbench_runners::comm::{Algo, CollOp, Dtype, ReduceOp};

/// The subcommand: its help line and flags.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "coll",
    about = "Collectives (all-reduce, all-gather, ...) per algorithm and size, nccl-tests style"
)]
pub struct CollCommand {
    #[command(flatten)]
    pub args: CollArgs,
}

#[derive(Args, Debug, Clone)]
pub struct CollArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// Collectives: all-reduce, reduce-scatter, all-gather, broadcast, reduce, all-to-all, all,
    /// or a comma list.
    #[arg(long, default_value = "all-reduce", value_parser = parse_ops)]
    pub op: Ops,
    /// Algorithms: ring, mesh, rd, tree, auto, all (every one each op has), or a comma list.
    #[arg(long, default_value = "auto", value_parser = parse_algos)]
    pub algo: Algos,
    /// Element type: f32, f64, f16, bf16.
    #[arg(long, default_value = "f32", value_parser = Dtype::parse)]
    pub dtype: Dtype,
    /// Reduction: sum, max, min.
    #[arg(long, default_value = "sum", value_parser = parse_redop)]
    pub redop: ReduceOp,
    /// Root rank of broadcast and reduce.
    #[arg(long, default_value_t = 0)]
    pub root: usize,
    /// Sizes: a range by factors of two (8B..256MiB) or a list (8,1k,1MiB). Default 8B..256MiB.
    #[arg(long, value_parser = parse_sizes, conflicts_with_all = ["minbytes", "maxbytes"], allow_hyphen_values = true)]
    pub sizes: Option<SizeList>,
    /// Smallest size, as nccl-tests' -b.
    #[arg(short = 'b', long, value_parser = parse_size)]
    pub minbytes: Option<u64>,
    /// Largest size, as nccl-tests' -e.
    #[arg(short = 'e', long, value_parser = parse_size)]
    pub maxbytes: Option<u64>,
    /// Factor between sizes from -b to -e, as nccl-tests' -f.
    #[arg(short = 'f', long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(2..=1024))]
    pub stepfactor: u64,
    /// Timed iterations per row.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub iters: u64,
    /// Untimed iterations before them.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub warmup: u64,
    /// Run in place (the output overwrites the input), as nccl-tests' in-place columns.
    #[arg(long)]
    pub in_place: bool,
    /// The link's ceiling for "% of ceiling" (e.g. 80Gbit for Thunderbolt 5); default: the
    /// interface's reported speed, where the OS reports one.
    #[arg(long, value_parser = parse_rate)]
    pub ceiling: Option<f64>,
    /// Also write the rows as CSV to this file.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// After tbbench's own sweep, run the same ops, sizes and element type through MLX's
    /// collectives (mx.distributed) and/or the MPI library's (under mpirun), on the same
    /// hosts and network: mlx, mpi, or mlx,mpi.
    #[arg(long, value_parser = parse_peers)]
    pub peer: Option<Peers>,
    /// MLX's backend for --peer mlx: ring, jaccl, jaccl-ring (default: the hostfile's, else
    /// ring).
    #[arg(long, value_parser = MlxBackend::parse, requires = "peer")]
    pub peer_backend: Option<MlxBackend>,
}

#[derive(Debug, Clone)]
pub struct Peers(pub Vec<Peer>);

fn parse_peers(s: &str) -> Result<Peers, String> {
    let mut peers = Vec::new();
    for w in s.split(',') {
        let p = Peer::parse(w)?;
        if !peers.contains(&p) {
            peers.push(p);
        }
    }
    Ok(Peers(peers))
}

#[derive(Debug, Clone)]
pub struct Ops(pub Vec<CollOp>);
#[derive(Debug, Clone)]
pub struct Algos(pub Vec<Algo>);
#[derive(Debug, Clone)]
pub struct SizeList(pub Vec<u64>);

fn parse_ops(s: &str) -> Result<Ops, String> {
    let mut ops = Vec::new();
    for w in s.split(',') {
        let add = if w.trim() == "all" {
            CollOp::ALL.to_vec()
        } else {
            vec![CollOp::parse(w)?]
        };
        for o in add {
            if !ops.contains(&o) {
                ops.push(o);
            }
        }
    }
    Ok(Ops(ops))
}

fn parse_algos(s: &str) -> Result<Algos, String> {
    let mut algos = Vec::new();
    for w in s.split(',') {
        let add = if w.trim() == "all" {
            Algo::EXPLICIT.to_vec()
        } else {
            vec![Algo::parse(w)?]
        };
        for a in add {
            if !algos.contains(&a) {
                algos.push(a);
            }
        }
    }
    Ok(Algos(algos))
}

fn parse_sizes(s: &str) -> Result<SizeList, String> {
    parse_size_list(s).map(SizeList)
}

impl CollArgs {
    /// The config, or a usage error naming what does not fit together.
    pub fn config(&self) -> Result<CollConfig, UsageError> {
        let defaults = CollConfig::default();
        let sizes = match (&self.sizes, self.minbytes, self.maxbytes) {
            (Some(s), _, _) => s.0.clone(),
            (None, None, None) => defaults.sizes,
            (None, lo, hi) => {
                let lo = lo.unwrap_or(8);
                let hi = hi.unwrap_or(256 << 20);
                if lo > hi {
                    return Err(UsageError(format!("-b {lo} is larger than -e {hi}")));
                }
                let mut v = Vec::new();
                let mut s = lo.max(1);
                while s <= hi {
                    v.push(s);
                    s = s.saturating_mul(self.stepfactor);
                }
                v
            }
        };
        if sizes.contains(&0) {
            return Err(UsageError("a size of 0 bytes moves nothing".into()));
        }
        if let Some(path) = &self.csv {
            tbbench_schema::write::check_writable(path)
                .map_err(|e| UsageError(format!("--csv: {e}")))?;
            if let Some(out) = &self.run.out {
                tbbench_schema::write::refuse_same_output(("--csv", path), ("--out", out))
                    .map_err(|e| UsageError(e.to_string()))?;
            }
        }
        Ok(CollConfig {
            ops: self.op.0.clone(),
            algos: self.algo.0.clone(),
            dtype: self.dtype,
            redop: self.redop,
            root: self.root,
            sizes,
            iters: self.iters as usize,
            warmup: self.warmup as usize,
            in_place: self.in_place,
            ceiling_bits_per_s: self.ceiling,
            csv: self.csv.clone(),
            peers: self.peer.as_ref().map(|p| p.0.clone()).unwrap_or_default(),
            peer_backend: self.peer_backend,
        })
    }
}

/// The coll suite as the binary lists it.
pub fn registration() -> Registration {
    Registration {
        name: "coll",
        command: CollCommand::command,
        run: |m, tool| {
            let a = CollArgs::from_arg_matches(m)?;
            let config = a.config()?;
            tbbench_runners::driver::run::<CollSuite>(&config, &a.run.options(), tool)
        },
        quick: |_: &QuickPlan| {
            Ok(QuickRun {
                result: "coll",
                args: [
                    "--op",
                    "all-reduce,all-gather",
                    "--algo",
                    "all",
                    "--sizes",
                    "8,1k,64k,1MiB",
                    "--iters",
                    "10",
                    "--warmup",
                    "2",
                ]
                .map(String::from)
                .to_vec(),
            })
        },
    }
}
