//! The commands that are not suites (report, compare, run --quick, env, predict), and the
//! options each builds from its flags. Each suite brings its own subcommand and flags (see
//! src/registry.rs).

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use tbbench_runners::cli::parse_transport;
use tbbench_runners::options::TransportKind;

#[derive(Parser, Debug)]
#[command(
    name = "tbbench",
    version,
    about = "Benchmarks for small HPC and local-AI clusters: link latency and bandwidth, HPL, token rates"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// One self-contained HTML report (and JSON) from result files and folders.
    Report(ReportArgs),
    /// Every key figure of BASE against NEW; exit 1 on a regression (for CI).
    Compare(CompareArgs),
    /// A short run of every suite on the local default, then a report of it.
    Run(QuickArgs),
    /// What this host offers (interfaces, RDMA devices, BLAS, cores, memory) and what is wrong.
    Env(EnvArgs),
    /// What a decode or an HPL solve would do on each measured network (and on published RDMA
    /// over Thunderbolt 5), from link, coll and decode/hpl result files.
    Predict(PredictArgs),
}

#[derive(Args, Debug, Clone)]
pub struct EnvArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    /// Result files and folders (searched recursively for *.json), in any mix.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// The HTML file to write.
    #[arg(long, short = 'o', default_value = "report.html")]
    pub out: PathBuf,
    /// Also write the report's content as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Fail (write nothing) when any input cannot be used, instead of leaving it out.
    #[arg(long)]
    pub strict: bool,
    /// A change in history charts counts as a regression beyond this (and the runs' spread).
    #[arg(long, default_value = "5%", value_parser = parse_threshold)]
    pub threshold: f64,
    /// Also write the key figures for a tracking service: github-action-benchmark, bencher.
    #[arg(long, value_parser = parse_export)]
    pub export: Vec<tbbench_reports::export::Format>,
    /// Folder for --export files.
    #[arg(long, default_value = ".")]
    pub export_dir: PathBuf,
}

#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// The baseline: a result file or a folder of them (several runs give a spread).
    pub base: PathBuf,
    /// The candidate: a result file or a folder.
    pub new: PathBuf,
    /// Smallest change that can count as a regression (it must also exceed the spread).
    #[arg(long, default_value = "5%", value_parser = parse_threshold)]
    pub threshold: f64,
    /// Also write the comparison as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Fail when any input cannot be used, instead of leaving it out.
    #[arg(long)]
    pub strict: bool,
}

#[derive(Args, Debug, Clone)]
pub struct QuickArgs {
    /// Short runs (about a minute in all): what a new user runs first.
    #[arg(long, required = true)]
    pub quick: bool,
    /// Ranks for every suite.
    #[arg(long, default_value_t = tbbench_runners::options::DEFAULT_NODES)]
    pub nodes: usize,
    /// tcp or shm.
    #[arg(long, short = 't', default_value = "tcp", value_parser = parse_transport)]
    pub transport: TransportKind,
    /// Run the ranks on these hosts instead of locally (as in link and hpl).
    #[arg(long)]
    pub hostfile: Option<PathBuf>,
    /// Where the result files and report.html go (default: results/quick-<UTC time>).
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
#[command(group(clap::ArgGroup::new("workload").required(true).args(["shape", "gguf", "hpl_n"])))]
pub struct PredictArgs {
    /// Result files and folders: the networks' link and coll results, and a decode (or hpl)
    /// result the computation is taken from.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// A decode of a published model shape, as `tbbench infer --shape` runs it.
    #[arg(long)]
    pub shape: Option<String>,
    /// With --shape: as many of its layers as the decode built (`infer --layers`).
    #[arg(long, requires = "shape", value_parser = clap::value_parser!(u64).range(1..))]
    pub layers: Option<u64>,
    /// A decode of this GGUF model (its hyper-parameters are read from the file's header; no
    /// path: the SmolLM2-135M file scripts/setup.sh installs, as `infer --gguf`).
    #[arg(long, num_args = 0..=1, default_missing_value = "", value_name = "PATH")]
    pub gguf: Option<String>,
    /// An HPL solve of this order instead of a decode.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub hpl_n: Option<u64>,
    /// With --hpl-n: the block size.
    #[arg(long, default_value_t = 192, requires = "hpl_n", value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub nb: u64,
    /// How the decode splits the model over the ranks.
    #[arg(long, default_value = "tp", value_parser = ["tp", "pp"])]
    pub parallel: String,
    /// Rank counts to predict for: 2 or 2,4,8.
    #[arg(long, required = true, value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub nodes: Vec<u64>,
    /// The decode's all-reduce algorithm (as `infer --algo`): auto takes the fastest measured.
    #[arg(long, default_value = "auto", value_parser = ["auto", "ring", "mesh", "rd", "tree"])]
    pub algo: String,
    /// Also write {workload, predictions[]} here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The result file (default: results/predict-<UTC time>.json).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

fn parse_threshold(s: &str) -> Result<f64, String> {
    tbbench_reports::commands::parse_threshold(s)
}
fn parse_export(s: &str) -> Result<tbbench_reports::export::Format, String> {
    tbbench_reports::export::Format::parse(s)
}

impl ReportArgs {
    pub fn options(&self, generator: String) -> tbbench_reports::commands::ReportOptions {
        tbbench_reports::commands::ReportOptions {
            inputs: self.inputs.clone(),
            html: self.out.clone(),
            json: self.json.clone(),
            strict: self.strict,
            threshold_pct: self.threshold,
            exports: self.export.clone(),
            export_dir: self.export_dir.clone(),
            generator,
        }
    }
}

impl CompareArgs {
    pub fn options(&self) -> tbbench_reports::commands::CompareOptions {
        tbbench_reports::commands::CompareOptions {
            base: self.base.clone(),
            new: self.new.clone(),
            threshold_pct: self.threshold,
            json: self.json.clone(),
            strict: self.strict,
        }
    }
}

impl PredictArgs {
    /// The workload from `--hpl-n`, `--gguf` or `--shape` (in that order), and the rest.
    pub fn options(&self) -> anyhow::Result<crate::predict::PredictOptions> {
        use crate::predict::WorkloadSpec;
        let workload = if let Some(n) = self.hpl_n {
            WorkloadSpec::Hpl {
                n: n as usize,
                nb: self.nb as usize,
            }
        } else if let Some(g) = &self.gguf {
            WorkloadSpec::Gguf {
                path: tbbench_infer::decode::resolve_gguf(Some(g))?,
                tensor_parallel: self.parallel == "tp",
            }
        } else {
            WorkloadSpec::Shape {
                name: self.shape.clone().unwrap_or_default(),
                layers: self.layers.map(|l| l as usize),
                tensor_parallel: self.parallel == "tp",
            }
        };
        Ok(crate::predict::PredictOptions {
            inputs: self.inputs.clone(),
            workload,
            nodes: self.nodes.iter().map(|n| *n as usize).collect(),
            algo: Some(self.algo.clone()),
            json: self.json.clone(),
            out: self.out.clone(),
        })
    }
}
