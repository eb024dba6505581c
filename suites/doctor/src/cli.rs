//! `tbbench doctor`'s flags, its config, and its registration with the binary; and `--json`,
//! which the process the user started writes once every network has run.

use crate::{DoctorConfig, DoctorSuite, Findings};
use anyhow::Result;
use clap::{Args, CommandFactory, FromArgMatches, Parser};
use std::path::{Path, PathBuf};
use tbbench_runners::cli::{parse_rate, parse_size, QuickPlan, Registration, RunArgs};
use tbbench_runners::options::RunOptions;
use tbbench_schema::Tool;

/// The subcommand: its help line and flags.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "doctor",
    about = "Preflight: reach and time every pair of hosts, name what is wrong (exit 1 if anything)"
)]
pub struct DoctorCommand {
    #[command(flatten)]
    pub args: DoctorArgs,
}

#[derive(Args, Debug, Clone)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// The speed every link should reach (e.g. 80gbit for Thunderbolt 5); default: the speed
    /// each interface reports, where its OS reports one.
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub ceiling: Option<f64>,
    /// The planned hpl run's N: each host must have its ranks' share of 8·N² bytes free.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub hpl_n: Option<u64>,
    /// Free memory every host must have for the planned run (e.g. 64GiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub memory: Option<u64>,
    /// Also write the problems and the pairs (of every network of --over) to FILE as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

impl DoctorArgs {
    pub fn config(&self, tool: &Tool) -> DoctorConfig {
        DoctorConfig {
            ceiling_bits_per_s: self.ceiling,
            hpl_n: self.hpl_n,
            memory_bytes: self.memory,
            json: self.json.clone(),
            tool: tool.clone(),
        }
    }
}

/// The doctor as the binary lists it.
pub fn registration() -> Registration {
    Registration {
        name: "doctor",
        command: DoctorCommand::command,
        run: |m, tool| {
            let a = DoctorArgs::from_arg_matches(m)?;
            run(&a, tool)
        },
        quick: |_: &QuickPlan| {
            Err("doctor: a preflight check, not a benchmark; run `tbbench doctor` before a long run".into())
        },
    }
}

/// Runs the doctor; in the process the user started, then writes `--json` from the result
/// files the networks wrote (rank 0 may run on another host; the files are written here).
pub fn run(a: &DoctorArgs, tool: &Tool) -> Result<i32> {
    let config = a.config(tool);
    let mut opts = a.run.options();
    let launcher = !tbbench_runners::driver::is_rank_process()
        && tbbench_runners::mpi_boot::mpirun_size().is_none();
    let json = match (&config.json, launcher) {
        (Some(j), true) => j.clone(),
        _ => return tbbench_runners::driver::run::<DoctorSuite>(&config, &opts, tool),
    };
    // Before the run, as for the result file: a finding that cannot be saved is lost.
    tbbench_schema::write::check_writable(&json)?;
    if let Some(out) = &opts.out {
        tbbench_schema::write::refuse_same_output(("--json", &json), ("--out", out))?;
    }
    let started = time::OffsetDateTime::now_utc();
    if opts.over.is_empty() && opts.out.is_none() {
        // The launcher's default name, chosen here so this process knows it.
        opts.out = Some(tbbench_schema::write::default_path("doctor", started));
        opts.out_generated = true;
    }
    let ran = tbbench_runners::driver::run::<DoctorSuite>(&config, &opts, tool);
    let findings = collect(&opts, started);
    crate::write_findings(&json, &findings)?;
    println!("findings: {}", json.display());
    ran
}

/// The problems and pairs of every network's result file; a network that wrote none is a
/// problem of its own (`run-failed`), since its links were not checked.
fn collect(opts: &RunOptions, started: time::OffsetDateTime) -> Findings {
    let mut f = Findings::default();
    let files: Vec<(String, Option<PathBuf>)> = if opts.over.is_empty() {
        // The network as the flags named it, as `--over` would spell it.
        vec![(opts.net.spec(), tbbench_runners::launch::written_path())]
    } else {
        let dir = opts.out.clone().unwrap_or_else(|| PathBuf::from("results"));
        opts.over
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                let tail = format!("-{}-{}.json", i + 1, spec.slug());
                (spec.spec.clone(), newest_since(&dir, &tail, started))
            })
            .collect()
    };
    for (spec, path) in files {
        let read = path
            .as_deref()
            .and_then(|p| tbbench_schema::write::read_result(p).ok())
            .filter(|r| r.suite == "doctor");
        let Some(r) = read else {
            f.problems.push(crate::judge::Problem {
                kind: "run-failed".into(),
                network: spec,
                hosts: vec![],
                detail: "the doctor did not finish on this network, so its links were not checked — see the error above".into(),
            });
            continue;
        };
        let problems: Vec<crate::judge::Problem> =
            serde_json::from_value(r.results["problems"].clone()).unwrap_or_default();
        f.problems.extend(problems);
        if let Some(pairs) = r.results["pairs"].as_array() {
            for p in pairs {
                let mut p = p.clone();
                if let serde_json::Value::Object(m) = &mut p {
                    m.insert("network".into(), r.network.label.clone().into());
                }
                f.pairs.push(p);
            }
        }
    }
    f
}

/// The newest `doctor-<UTC stamp><tail>` in `dir` stamped at or after `started`: the file the
/// launcher wrote for one network of `--over` (it names them `<suite>-<stamp>-<i>-<slug>`).
fn newest_since(dir: &Path, tail: &str, started: time::OffsetDateTime) -> Option<PathBuf> {
    let first = tbbench_schema::write::default_path("doctor", started);
    let first = first.file_stem()?.to_string_lossy().into_owned();
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let stem = name.strip_suffix(tail)?;
            // The stamp is fixed-width, so names order as times do.
            (stem.starts_with("doctor-") && stem.len() == first.len() && *stem >= *first)
                .then(|| (stem.to_string(), e.path()))
        })
        .max()
        .map(|(_, p)| p)
}
