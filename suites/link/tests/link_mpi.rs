//! `tbbench link` under mpirun (build feature `mpi`): MPI gives rank and size and carries the
//! rendezvous; the data still goes over tbbench's own transports.
#![cfg(feature = "mpi")]

#[path = "../../../runners/tests/support.rs"]
mod support;

use std::process::Command;
use std::time::Duration;
use support::*;

fn mpirun(np: &str, args: &[&str]) -> Option<std::process::Output> {
    if Command::new("mpirun").arg("--version").output().is_err() {
        skipped("mpirun is not installed");
        return None;
    }
    let mut cmd = Command::new("mpirun");
    if is_root() {
        cmd.arg("--allow-run-as-root");
    }
    cmd.args(["--oversubscribe", "-np", np, bin()]).args(args);
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    Some(finish(cmd.spawn().unwrap(), Duration::from_secs(120)).0)
}

#[test]
fn ranks_started_by_mpirun_meet_and_measure() {
    let dir = tmpdir("mpi");
    for (np, transport) in [("2", "tcp"), ("3", "shm")] {
        let out = dir.join(format!("{transport}.json"));
        let Some(o) = mpirun(
            np,
            &[
                "link",
                "--transport",
                transport,
                "--sizes",
                "64,1MiB",
                "--iters",
                "10",
                "--out",
                out.to_str().unwrap(),
            ],
        ) else {
            return;
        };
        assert!(o.status.success(), "{}", text(&o.stderr));
        let r: serde_json::Value = read_json(&out);
        assert_eq!(
            r["ranks"].as_array().unwrap().len(),
            np.parse::<usize>().unwrap()
        );
        assert_eq!(r["network"]["transport"], transport);
        assert_eq!(r["verification"]["passed"], true);
        // The world that ran, not the --nodes default; and who started it.
        assert_eq!(r["params"]["nodes"], np.parse::<usize>().unwrap());
        assert_eq!(r["params"]["launcher"]["kind"], "mpirun");
        // mpirun binds each rank to a core; the host record must still show all its cores.
        assert_eq!(
            r["hosts"][0]["cores_logical"].as_u64().unwrap() as usize,
            std::thread::available_parallelism().unwrap().get()
        );
    }
}
