//! Ranks started by a real Slurm: the one-node lab of scripts/slurm-lab.sh (munged, slurmctld
//! and slurmd from Debian's packages), brought up here when it is not. srun with PMI
//! (--mpi=pmi2) and without (the offer file), sbatch to completion, a rank killed, the step
//! cancelled, and the ways a Slurm start goes wrong.

mod support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use support::*;

/// The lab's slurm.conf, the lab brought up once for every test here; None (the test skips,
/// saying why) where Slurm is not installed, unless TBBENCH_REQUIRE_SLURM=1.
fn lab() -> Option<&'static Path> {
    static LAB: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let got = LAB.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/slurm-lab.sh");
        let o = Command::new(&script)
            .arg("up")
            .output()
            .map_err(|e| format!("{}: {e}", script.display()))?;
        if !o.status.success() {
            return Err(format!(
                "scripts/slurm-lab.sh up failed: {}",
                text(&o.stderr).trim()
            ));
        }
        let env = Command::new(&script).arg("env").output().unwrap();
        let line = text(&env.stdout);
        Ok(PathBuf::from(
            line.trim().trim_start_matches("export SLURM_CONF="),
        ))
    });
    match got {
        Ok(conf) => Some(conf.as_path()),
        Err(why) => {
            assert!(
                std::env::var("TBBENCH_REQUIRE_SLURM").as_deref() != Ok("1"),
                "TBBENCH_REQUIRE_SLURM=1 but {why}"
            );
            skipped(&format!("no Slurm lab: {why}"));
            None
        }
    }
}

/// srun (or sbatch, scancel) against the lab, every task marked so the test finds its own.
fn slurm(conf: &Path, tool: &str, mark: &str) -> Command {
    let mut c = Command::new(tool);
    c.env("SLURM_CONF", conf)
        .env("TBBENCH_TEST_MARK", mark)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn srun(conf: &Path, mark: &str, tasks: usize, pmi: bool, args: &[&str]) -> Child {
    let mut c = slurm(conf, "srun", mark);
    c.arg("-n").arg(tasks.to_string());
    c.arg(if pmi { "--mpi=pmi2" } else { "--mpi=none" });
    c.arg(bin()).args(args);
    c.spawn().expect("srun starts")
}

fn out_in(name: &str) -> PathBuf {
    tmpdir(&format!("slurm-{name}")).join("r.json")
}

/// The tbbench ranks of the test's own step: (pid, SLURM_PROCID, SLURM_JOB_ID).
fn tasks_of(mark: &str) -> Vec<(u32, usize, String)> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let vars: Vec<String> = env
            .split(|b| *b == 0)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect();
        let get = |k: &str| {
            vars.iter()
                .find_map(|v| v.strip_prefix(&format!("{k}=")).map(str::to_string))
        };
        let is_rank = std::fs::read_link(format!("/proc/{pid}/exe"))
            .is_ok_and(|p| p.file_name().is_some_and(|n| n == "tbbench"));
        if is_rank && get("TBBENCH_TEST_MARK").as_deref() == Some(mark) {
            if let (Some(r), Some(job)) = (get("SLURM_PROCID"), get("SLURM_JOB_ID")) {
                found.push((pid, r.parse().unwrap(), job));
            }
        }
    }
    found
}

fn wait_for_tasks(mark: &str, n: usize) -> Vec<(u32, usize, String)> {
    let start = Instant::now();
    loop {
        let t = tasks_of(mark);
        if t.len() == n {
            return t;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the step's {n} tasks did not start: {t:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A run under srun that succeeds, and its result: params.nodes the step's size, the
/// launcher slurm with the job, verification passed.
fn run_ok(name: &str, tasks: usize, pmi: bool, args: &[&str]) -> Value {
    let Some(conf) = lab() else {
        return Value::Null;
    };
    let out = out_in(name);
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--out", out.to_str().unwrap()]);
    let (o, _) = finish(srun(conf, name, tasks, pmi, &all), Duration::from_secs(240));
    assert!(
        o.status.success(),
        "srun -n {tasks} {args:?}:\n{}\n{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    let r = read_json(&out);
    assert_eq!(r["params"]["nodes"], tasks, "{}", r["params"]);
    let l = &r["params"]["launcher"];
    assert_eq!(l["kind"], "slurm", "{l}");
    assert!(l["job_id"].as_str().is_some_and(|j| !j.is_empty()), "{l}");
    assert_eq!(l["offer_via"], if pmi { "pmi" } else { "file" }, "{l}");
    assert_eq!(r["ranks"].as_array().map(Vec::len), Some(tasks));
    assert_eq!(r["verification"]["passed"], true, "{}", r["verification"]);
    r
}

#[test]
fn link_on_2_and_4_srun_tasks() {
    for (n, pmi) in [(2, true), (4, false)] {
        run_ok(
            &format!("link{n}"),
            n,
            pmi,
            &["link", "--sizes", "1..64KiB", "--iters", "20"],
        );
    }
}

#[test]
fn coll_on_2_and_4_srun_tasks() {
    for (n, pmi) in [(2, false), (4, true)] {
        let r = run_ok(
            &format!("coll{n}"),
            n,
            pmi,
            &[
                "coll",
                "--op",
                "all-reduce",
                "--sizes",
                "1KiB..256KiB",
                "--iters",
                "10",
            ],
        );
        if r.is_null() {
            return;
        }
        assert!(r["results"]["rows"]
            .as_array()
            .is_some_and(|a| !a.is_empty()));
    }
}

#[test]
fn hpl_on_2_and_4_srun_tasks() {
    for (n, pmi) in [(2, true), (4, false)] {
        run_ok(
            &format!("hpl{n}"),
            n,
            pmi,
            &["hpl", "--n", "600", "--nb", "64", "--no-dgemm-probe"],
        );
    }
}

/// `--slurm=FILE` writes the job; sbatch runs it to its result file.
#[test]
fn an_sbatch_script_tbbench_wrote_runs_to_its_result() {
    let Some(conf) = lab() else { return };
    let dir = tmpdir("slurm-sbatch");
    let script = dir.join("job.sh");
    let out = dir.join("r.json");
    let w = run(
        &[
            "coll",
            "--nodes",
            "3",
            "--op",
            "all-gather",
            "--sizes",
            "4KiB",
            "--iters",
            "5",
            "--out",
            out.to_str().unwrap(),
            &format!("--slurm={}", script.display()),
        ],
        Duration::from_secs(30),
    );
    assert!(w.status.success(), "{}", text(&w.stderr));
    assert!(text(&w.stderr).contains("sbatch"), "{}", text(&w.stderr));
    assert!(!out.exists(), "--slurm runs nothing");
    let body = std::fs::read_to_string(&script).unwrap();
    assert!(body.contains("#SBATCH --ntasks=3"), "{body}");
    let o = slurm(conf, "sbatch", "sbatch")
        .current_dir(&dir)
        .args(["--wait", script.to_str().unwrap()])
        .output()
        .unwrap();
    let log = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().ends_with(".out"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .unwrap_or_default();
    assert!(
        o.status.success(),
        "sbatch: {}\n{}\njob log:\n{log}",
        text(&o.stdout),
        text(&o.stderr)
    );
    let r = read_json(&out);
    assert_eq!(r["params"]["nodes"], 3);
    assert_eq!(r["params"]["launcher"]["kind"], "slurm");
    assert!(log.contains("result:"), "{log}");
}

/// A long run to interfere with.
const LONG_LINK: [&str; 7] = [
    "link", "--buffer", "64", "--mode", "latency", "--iters", "1000000",
];

#[test]
fn a_killed_task_ends_every_rank_within_ten_seconds_with_one_line() {
    let Some(conf) = lab() else { return };
    let mark = "kill-task";
    let out = out_in(mark);
    let mut args = LONG_LINK.to_vec();
    args.extend(["--out", out.to_str().unwrap()]);
    let child = srun(conf, mark, 3, true, &args);
    let tasks = wait_for_tasks(mark, 3);
    std::thread::sleep(Duration::from_millis(1500));
    let victim = tasks.iter().find(|t| t.1 == 2).unwrap().0;
    let (o, took) = kill_and_finish(child, victim);
    assert!(
        took < Duration::from_secs(10),
        "srun took {took:?} after the kill"
    );
    assert!(!o.status.success());
    let err = text(&o.stderr);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("tbbench: error:"))
        .collect();
    assert_eq!(lines.len(), 1, "one tbbench error line: {err}");
    assert!(lines[0].contains("rank 2"), "{err}");
    assert!(
        tasks_of(mark).is_empty(),
        "ranks outlived the step: {:?}",
        tasks_of(mark)
    );
    assert!(!out.exists(), "no result file from a failed run");
}

#[test]
fn scancel_of_the_step_ends_every_rank_within_ten_seconds() {
    let Some(conf) = lab() else { return };
    let mark = "scancel";
    let out = out_in(mark);
    let mut args = LONG_LINK.to_vec();
    args.extend(["--out", out.to_str().unwrap()]);
    let child = srun(conf, mark, 3, false, &args);
    let tasks = wait_for_tasks(mark, 3);
    std::thread::sleep(Duration::from_millis(1500));
    let job = &tasks[0].2;
    let cancelled_at = Instant::now();
    let c = slurm(conf, "scancel", mark)
        .arg(format!("{job}.0"))
        .output()
        .unwrap();
    assert!(c.status.success(), "scancel: {}", text(&c.stderr));
    let (o, _) = finish(child, Duration::from_secs(30));
    let took = cancelled_at.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "the step took {took:?} to end"
    );
    assert!(!o.status.success());
    let err = text(&o.stderr);
    let lines = err
        .lines()
        .filter(|l| l.starts_with("tbbench: error:"))
        .count();
    assert!(lines <= 1, "at most one tbbench error line: {err}");
    assert!(!err.contains("panicked"), "{err}");
    let start = Instant::now();
    while !tasks_of(mark).is_empty() && start.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(tasks_of(mark).is_empty(), "ranks outlived the step");
    assert!(!out.exists(), "no result file from a cancelled run");
}

/// What looks like an srun task but cannot meet rank 0 (no PMI, an offer folder the nodes do
/// not share) ends in one line naming the folder, within --timeout; a folder others can read
/// is refused before the token is written into it.
#[test]
fn a_slurm_start_that_cannot_meet_is_refused_in_one_line() {
    let dir = tmpdir("slurm-refused");
    let task = |rank: &str, folder: &Path| {
        Command::new(bin())
            .args(["link", "--timeout", "2s", "--out"])
            .arg(dir.join("r.json"))
            .env("SLURM_STEP_ID", "0")
            .env("SLURM_PROCID", rank)
            .env("SLURM_STEP_NUM_TASKS", "2")
            .env("SLURM_JOB_ID", "424242")
            .env("SLURM_STEP_LAUNCHER_PORT", "1")
            .env("TBBENCH_SLURM_DIR", folder)
            .env_remove("PMI_FD")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let empty = dir.join("offers");
    let (o, took) = finish(task("1", &empty), Duration::from_secs(20));
    assert!(!o.status.success());
    assert!(took < Duration::from_secs(10), "{took:?}");
    let err = text(&o.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("TBBENCH_SLURM_DIR") && lines[0].contains("rank 1"),
        "{err}"
    );

    use std::os::unix::fs::PermissionsExt;
    let open = dir.join("open");
    std::fs::create_dir_all(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (o, _) = finish(task("0", &open), Duration::from_secs(20));
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(
        err.contains("other users") && err.contains("chmod 700"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(&open).unwrap().count(),
        0,
        "nothing written"
    );

    // --slurm and --hostfile: Slurm places the ranks.
    let o = run(
        &["link", "--slurm", "--hostfile", "h"],
        Duration::from_secs(10),
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
}
