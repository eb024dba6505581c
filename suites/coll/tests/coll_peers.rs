//! `tbbench coll --peer mlx,mpi` end to end: MLX's collectives (PyPI's mlx[cpu], its ring
//! backend, from .venv-mlx as scripts/setup.sh installs it) and OpenMPI's (built with mpicc,
//! started under mpirun) on the same ranks after tbbench's own sweep; every element of every
//! implementation checked; a missing peer named in one line with tbbench's rows kept.

#[path = "../../../runners/tests/support.rs"]
mod support;

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::*;

/// Runs `tbbench coll ARGS --out OUT` with the extra environment, to its end.
fn coll_with(env: &[(&str, &str)], args: &[&str], out: &Path) -> std::process::Output {
    let mut cmd = Command::new(bin());
    cmd.arg("coll")
        .args(args)
        .args(["--out", out.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    finish(
        cmd.spawn().expect("tbbench starts"),
        Duration::from_secs(300),
    )
    .0
}

fn checkout() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn rows_of<'a>(r: &'a Value, imp: &str) -> Vec<&'a Value> {
    r["results"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|row| row["impl"] == imp)
        .collect()
}

/// Both peers on 2 local ranks over loopback TCP: MLX runs all-reduce, all-gather and the
/// ping-pong by send/recv (its ring has no reduce-scatter and MLX no broadcast: each said
/// once), MPI all five ops; every row exact; the terminal puts the three side by side with
/// ratios; the report and compare show the peers.
#[test]
fn mlx_and_mpi_run_beside_tbbench_on_the_same_ranks() {
    assert!(
        checkout().join(".venv-mlx/bin/python").exists(),
        "MLX is not installed in .venv-mlx: scripts/setup.sh --deps installs it"
    );
    let dir = tmpdir("coll-peers");
    let out = dir.join("r.json");
    let o = coll_with(
        &[],
        &[
            "--nodes",
            "2",
            "--op",
            "all-reduce,all-gather,reduce-scatter,broadcast,ping-pong",
            "--sizes",
            "8,64k,1MiB",
            "--iters",
            "5",
            "--warmup",
            "1",
            "--peer",
            "mlx,mpi",
        ],
        &out,
    );
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{stderr}\n{stdout}");
    let r = read_json(&out);
    assert_eq!(r["verification"]["passed"], true, "{}", r["verification"]);
    let peers = r["results"]["peers"].as_array().unwrap();
    assert_eq!(peers.len(), 2, "{peers:?}");
    let mlx = &peers[0];
    assert_eq!(mlx["impl"], "mlx");
    assert_eq!(mlx["ran"], true, "{mlx}");
    assert_eq!(mlx["backend"], "ring");
    assert_eq!(mlx["version"], "0.32.4");
    let skipped = mlx["skipped"].to_string();
    assert!(skipped.contains("MLX has no broadcast"), "{skipped}");
    assert!(skipped.contains("sum_scatter"), "{skipped}");
    let mpi = &peers[1];
    assert_eq!(mpi["ran"], true, "{mpi}");
    assert!(mpi["version"].as_str().unwrap().contains("MPI"), "{mpi}");
    assert!(mpi["started"].as_str().unwrap().contains("mpirun"), "{mpi}");

    let count = |rows: &[&Value], op: &str| rows.iter().filter(|x| x["op"] == op).count();
    let mlx_rows = rows_of(&r, "mlx");
    assert_eq!(count(&mlx_rows, "all-reduce"), 3, "{mlx_rows:?}");
    assert_eq!(count(&mlx_rows, "all-gather"), 3);
    assert_eq!(count(&mlx_rows, "ping-pong"), 3);
    assert_eq!(count(&mlx_rows, "broadcast"), 0);
    let mpi_rows = rows_of(&r, "mpi");
    for op in [
        "all-reduce",
        "all-gather",
        "reduce-scatter",
        "broadcast",
        "ping-pong",
    ] {
        assert_eq!(count(&mpi_rows, op), 3, "{op}: {mpi_rows:?}");
    }
    // The same arrays as tbbench's own rows, every element right, timed per iteration.
    let ours = rows_of(&r, "tbbench");
    for row in mlx_rows.iter().chain(&mpi_rows) {
        assert_eq!(row["wrong"], 0, "{row}");
        assert_eq!(row["time_us"]["n"], 5, "{row}");
        assert!(row["busbw_gbps"].as_f64().unwrap() > 0.0, "{row}");
        assert!(
            ours.iter()
                .any(|x| x["op"] == row["op"] && x["size_bytes"] == row["size_bytes"]),
            "no tbbench row like {row}"
        );
    }
    let checks = r["verification"]["checks"].to_string();
    assert!(checks.contains("MLX ring results"), "{checks}");
    assert!(checks.contains("MPI results"), "{checks}");
    // Side by side on the terminal, with the ratio column.
    assert!(
        stdout.contains("# all-reduce, f32: tbbench (its fastest algorithm) beside MLX ring 0.32.4, MPI (Open MPI"),
        "{stdout}"
    );
    assert!(
        stderr.contains("--peer mlx: MLX has no broadcast"),
        "{stderr}"
    );

    let html = dir.join("report.html");
    let o = Command::new(bin())
        .args([
            "report",
            out.to_str().unwrap(),
            "-o",
            html.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("tbbench beside MLX and MPI"),
        "no peers table"
    );
    assert!(page.contains("MLX ring µs"));
    let o = Command::new(bin())
        .args(["compare", out.to_str().unwrap(), out.to_str().unwrap()])
        .output()
        .unwrap();
    let table = text(&o.stdout);
    assert!(
        table.contains("all-reduce 8 B, 2 ranks, MLX ring"),
        "{table}"
    );
    assert!(table.contains("all-gather 1 MiB, 2 ranks, MPI"), "{table}");
}

/// A peer that is not installed is one warning line each; tbbench's own sweep stands, the run
/// passes, and the result file says why each peer did not run.
#[test]
fn a_missing_peer_is_named_in_one_line_and_tbbench_rows_stand() {
    let dir = tmpdir("coll-peers-missing");
    let out = dir.join("r.json");
    let o = coll_with(
        &[
            ("TBBENCH_MLX_PYTHON", "/nonexistent/python3"),
            ("TBBENCH_MPIRUN", "/nonexistent/mpirun"),
        ],
        &[
            "--nodes", "2", "--sizes", "8,1k", "--iters", "3", "--peer", "mlx,mpi",
        ],
        &out,
    );
    let stderr = text(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let warned: Vec<&str> = stderr.lines().filter(|l| l.contains("--peer")).collect();
    assert_eq!(warned.len(), 2, "{stderr}");
    assert!(warned[0].contains("MLX is not installed"), "{stderr}");
    assert!(
        warned[1].contains("/nonexistent/mpirun is not installed"),
        "{stderr}"
    );
    let r = read_json(&out);
    assert_eq!(r["verification"]["passed"], true);
    assert_eq!(rows_of(&r, "tbbench").len(), 2);
    for p in r["results"]["peers"].as_array().unwrap() {
        assert_eq!(p["ran"], false, "{p}");
        assert!(p["why"].as_str().unwrap().contains("not installed"), "{p}");
    }
    assert_eq!(r["warnings"].to_string().matches("--peer").count(), 2);
}

/// Peers and backends tbbench does not know, and a backend with no peer, are refused before
/// anything runs.
#[test]
fn unknown_peers_and_backends_are_refused_in_one_line() {
    let dir = tmpdir("coll-peers-bad");
    let out = dir.join("r.json");
    for (args, want) in [
        (&["--peer", "nccl"][..], "unknown peer 'nccl'"),
        (
            &["--peer", "mlx", "--peer-backend", "nccl"][..],
            "unknown MLX backend",
        ),
        (&["--peer-backend", "ring"][..], "--peer"),
    ] {
        let o = coll_with(&[], args, &out);
        let err = text(&o.stderr);
        assert!(!o.status.success(), "{args:?}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!out.exists());
    }
}

/// A peer that fails once started (here a stand-in for MLX's Python that passes the import
/// probe, then dies as MLX does when its ring cannot connect) is one warning line quoting its
/// own last words; tbbench's rows stand and the run passes.
#[test]
fn a_peer_that_fails_is_quoted_in_one_line() {
    let dir = tmpdir("coll-peers-fail");
    let fake = dir.join("python");
    std::fs::write(
        &fake,
        "#!/bin/sh\n\
         if [ \"$1\" = -c ]; then echo '0.32.4 True'; exit 0; fi\n\
         echo 'Traceback (most recent call last):' >&2\n\
         echo 'mlx peer: RuntimeError: [ring] Couldnt connect (error: 111)' >&2\n\
         exit 1\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = dir.join("r.json");
    let o = coll_with(
        &[("TBBENCH_MLX_PYTHON", fake.to_str().unwrap())],
        &[
            "--nodes", "2", "--sizes", "8", "--iters", "3", "--peer", "mlx",
        ],
        &out,
    );
    let stderr = text(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let warned: Vec<&str> = stderr.lines().filter(|l| l.contains("--peer")).collect();
    assert_eq!(warned.len(), 1, "{stderr}");
    assert!(
        warned[0].contains(
            "MLX (ring) failed (exit status: 1): mlx peer: RuntimeError: [ring] Couldnt connect"
        ),
        "{stderr}"
    );
    let r = read_json(&out);
    assert_eq!(rows_of(&r, "tbbench").len(), 1);
    assert_eq!(r["results"]["peers"][0]["ran"], false);
}
