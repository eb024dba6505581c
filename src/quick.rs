//! `tbbench run --quick`: a short run of every suite on the local default, then a report of it.
//! Each suite runs as its own `tbbench` process, exactly as a user would start it, so its
//! output, Ctrl-C handling and result file are those of a normal run.

use crate::cli::QuickArgs;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::Command;
use tbbench_runners::cli::{QuickPlan, Registration};

/// Each registered suite's short run, in the registry's order: seconds each on a laptop, yet
/// every table and chart of the report gets data.
pub fn run(a: &QuickArgs, suites: &[Registration], generator: &str) -> Result<i32> {
    let exe = std::env::current_exe().context("cannot find the tbbench binary")?;
    let dir = a.out_dir.clone().unwrap_or_else(|| {
        let stamp = tbbench_schema::write::default_path("quick", time::OffsetDateTime::now_utc());
        PathBuf::from("results").join(stamp.file_stem().unwrap_or_default())
    });
    if a.out_dir.is_none() {
        // The default's parent is tbbench's own results folder, made on a first run.
        tbbench_schema::write::check_folder_writable(std::path::Path::new("results"))?;
    }
    tbbench_schema::write::check_folder_writable(&dir)?;
    let mut failed = Vec::new();
    let plan = QuickPlan { nodes: a.nodes };
    for suite in suites {
        let quick = match (suite.quick)(&plan) {
            Ok(q) => q,
            Err(why) => {
                println!("({why})");
                continue;
            }
        };
        println!("== tbbench {} (quick) ==", suite.name);
        let mut cmd = Command::new(&exe);
        cmd.arg(suite.name)
            .arg("--nodes")
            .arg(a.nodes.to_string())
            .arg("--transport")
            .arg(a.transport.as_str())
            .arg("--out")
            .arg(dir.join(format!("{}.json", quick.result)))
            .args(&quick.args);
        if let Some(h) = &a.hostfile {
            cmd.arg("--hostfile").arg(h);
        }
        let status = cmd
            .status()
            .with_context(|| format!("cannot start {}", exe.display()))?;
        if !status.success() {
            // A failed verification still writes its result; the report shows it.
            failed.push(suite.name);
        }
    }
    let html = dir.join("report.html");
    let code = tbbench_reports::commands::run_report(&tbbench_reports::commands::ReportOptions {
        inputs: vec![dir.clone()],
        html: html.clone(),
        json: Some(dir.join("summary.json")),
        strict: false,
        threshold_pct: 5.0,
        exports: vec![],
        export_dir: dir.clone(),
        generator: generator.into(),
    })?;
    if !failed.is_empty() {
        bail!(
            "{} did not succeed; see above (the report has what was written: {})",
            failed.join(" and "),
            html.display()
        );
    }
    println!("open {} in a browser", html.display());
    Ok(code)
}
