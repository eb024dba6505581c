//! Shared by the end-to-end tests: run the real tbbench binary with a hard time limit, so a
//! hang fails the test instead of stalling the suite.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Says why the running test skips: on stderr, and in a file every test binary appends to,
/// which `scripts/test.sh` lists when the tests end (cargo shows a passing test's output only
/// with --nocapture).
pub fn skipped(reason: &str) {
    use std::io::Write;
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    eprintln!("SKIPPED {test}: {reason}");
    let list = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("skipped-tests.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(list)
    {
        let _ = writeln!(f, "{test}: {reason}");
    }
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_tbbench")
}

pub fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tbbench-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn spawn(args: &[&str]) -> Child {
    Command::new(bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tbbench starts")
}

/// Waits for the child, killing it (and failing) after `limit`. Its output is drained while
/// it runs, so a chatty child never blocks on a full pipe.
pub fn finish(mut child: Child, limit: Duration) -> (Output, Duration) {
    use std::io::Read;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "tbbench did not finish within {limit:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.join().unwrap()),
                String::from_utf8_lossy(&err.join().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = start.elapsed();
    (
        Output {
            status,
            stdout: out.join().unwrap(),
            stderr: err.join().unwrap(),
        },
        took,
    )
}

pub fn run(args: &[&str], limit: Duration) -> Output {
    finish(spawn(args), limit).0
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Processes whose environment says they are a tbbench rank started by `launcher`'s run
/// (their parent is the launcher).
pub fn ranks_of(launcher: u32) -> Vec<(u32, usize)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let ppid: u32 = stat
            .rsplit(')')
            .next()
            .and_then(|s| s.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        if ppid != launcher {
            continue;
        }
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        for var in env.split(|b| *b == 0) {
            if let Some(r) = var.strip_prefix(b"TBBENCH_RANK=") {
                if let Ok(r) = String::from_utf8_lossy(r).parse() {
                    found.push((pid, r));
                }
            }
        }
    }
    found.sort_by_key(|x| x.1);
    found
}

pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

pub fn is_root() -> bool {
    unsafe_geteuid() == 0
}

fn unsafe_geteuid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2))
                .and_then(|u| u.parse().ok())
        })
        .unwrap_or(u32::MAX)
}

/// Waits up to `within` for every rank process to be gone, then fails naming any left.
pub fn assert_ranks_gone(ranks: &[(u32, usize)], within: Duration, after: &str) {
    let start = Instant::now();
    while ranks.iter().any(|(pid, _)| alive(*pid)) && start.elapsed() < within {
        std::thread::sleep(Duration::from_millis(50));
    }
    for (pid, r) in ranks {
        assert!(!alive(*pid), "rank {r} (pid {pid}) outlived {after}");
    }
}

/// A result file, parsed.
pub fn read_json(path: &std::path::Path) -> serde_json::Value {
    let raw = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&raw).unwrap()
}

/// The launcher's `n` rank processes once all have started, then `settle` more (so a fault
/// lands mid-run, not at start-up); fails the test if they do not start within 20 s.
pub fn wait_for_ranks(launcher: u32, n: usize, settle: Duration) -> Vec<(u32, usize)> {
    let start = Instant::now();
    loop {
        let r = ranks_of(launcher);
        if r.len() == n {
            std::thread::sleep(settle);
            return r;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "ranks did not start: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends `sig` ("-KILL", "-STOP", "-INT") to `pid`.
pub fn signal(pid: u32, sig: &str) {
    assert!(Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success());
}

/// Kills `victim` with SIGKILL and waits (at most 30 s) for the launcher `child` to end:
/// its output and how long it took after the kill.
pub fn kill_and_finish(child: Child, victim: u32) -> (Output, Duration) {
    let killed_at = Instant::now();
    signal(victim, "-KILL");
    let (o, _) = finish(child, Duration::from_secs(30));
    (o, killed_at.elapsed())
}

/// The device library: the newest of the one `cargo test` builds as this package's
/// dev-dependency (target/<profile>/deps) and the one `cargo build` puts beside the binary.
pub fn so() -> PathBuf {
    let dir = std::path::Path::new(bin()).parent().unwrap();
    let name = format!(
        "{}tbbench_softrdma{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let name = name.as_str();
    let newest = [dir.join("deps").join(name), dir.join(name)]
        .into_iter()
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max();
    match newest {
        Some((_, p)) => p,
        None => panic!(
            "{name} is missing in {}: build it with `cargo build -p tbbench-softrdma` (same profile as the tests)",
            dir.display()
        ),
    }
}
