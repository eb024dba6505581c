//! `tbbench run --quick`: a short run of every suite on the local default, then a report of it.
//! Each suite runs as its own `tbbench` process, exactly as a user would start it, so its
//! output, Ctrl-C handling and result file are those of a normal run.

use crate::cli::QuickArgs;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::Command;

/// The suites and their short settings: seconds each on a laptop, yet every table and chart
/// of the report gets data. `infer` here is its built-in decode (no server to talk to).
fn suites(a: &QuickArgs) -> Vec<(&'static str, Vec<String>)> {
    let link = vec![
        "--sizes".into(),
        "1,4,16,64,256,1k,4k,16k,64k,256k,1MiB,4MiB".into(),
        "--iters".into(),
        "200".into(),
        "--window".into(),
        "16".into(),
    ];
    // N=3000 takes about a second with a BLAS and half a minute on the Rust fallback kernels
    // of a slow machine; the DGEMM probe gives the efficiency column its meaning.
    let n = if a.nodes > 4 { "4000" } else { "3000" };
    let hpl = vec!["--n".into(), n.into()];
    let mut all = vec![("link", link), ("hpl", hpl)];
    // The built-in decode needs a model file: the SmolLM2 one scripts/setup.sh installs.
    if tbbench_infer::decode::default_gguf().is_some() {
        let decode = vec!["--gguf".into(), "--max-tokens".into(), "16".into()];
        all.push(("infer", decode));
    } else {
        println!(
            "(infer --gguf skipped: no model installed; scripts/setup.sh installs SmolLM2-135M)"
        );
    }
    all
}

pub fn run(a: &QuickArgs, generator: &str) -> Result<i32> {
    let exe = std::env::current_exe().context("cannot find the tbbench binary")?;
    let dir = a.out_dir.clone().unwrap_or_else(|| {
        let stamp = tbbench_schema::write::default_path("quick", time::OffsetDateTime::now_utc());
        PathBuf::from("results").join(stamp.file_stem().unwrap_or_default())
    });
    tbbench_schema::write::check_folder_writable(&dir)?;
    let mut failed = Vec::new();
    for (suite, extra) in suites(a) {
        println!("== tbbench {suite} (quick) ==");
        let mut cmd = Command::new(&exe);
        cmd.arg(suite)
            .arg("--nodes")
            .arg(a.nodes.to_string())
            .arg("--transport")
            .arg(a.transport.as_str())
            .arg("--out")
            .arg(dir.join(format!(
                "{}.json",
                if suite == "infer" { "decode" } else { suite }
            )))
            .args(&extra);
        if let Some(h) = &a.hostfile {
            cmd.arg("--hostfile").arg(h);
        }
        let status = cmd
            .status()
            .with_context(|| format!("cannot start {}", exe.display()))?;
        if !status.success() {
            // A failed verification still writes its result; the report shows it.
            failed.push(suite);
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
