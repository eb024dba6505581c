//! What happens when things go wrong, with real processes: a rank killed or frozen mid-run,
//! Ctrl-C, a stranger with the wrong token, bad hostfiles, hosts that cannot be reached.

mod support;

use std::time::{Duration, Instant};
use support::*;

/// A run long enough to interfere with: ping-pongs until told otherwise.
fn long_run(extra: &[&str]) -> std::process::Child {
    let mut args = vec![
        "link", "--nodes", "3", "--buffer", "64", "--mode", "latency", "--iters", "50000000",
    ];
    args.extend_from_slice(extra);
    spawn(&args)
}

/// A result path in a fresh folder, for runs that are ended before they write one.
/// Long enough for the rendezvous to finish, so a failure lands mid-run.
const RENDEZVOUS_SETTLE: Duration = Duration::from_millis(1500);

fn scratch_out() -> String {
    let dir = tmpdir(&format!("faults-{:?}", std::thread::current().id()).replace(['(', ')'], ""));
    dir.join("none.json").to_string_lossy().into_owned()
}

#[test]
fn killed_rank_ends_the_run_on_every_rank_within_ten_seconds() {
    let dir = tmpdir("kill");
    let out = dir.join("r.json");
    let child = long_run(&["--out", out.to_str().unwrap()]);
    let launcher = child.id();
    let ranks = wait_for_ranks(launcher, 3, RENDEZVOUS_SETTLE);
    let victim = ranks.iter().find(|r| r.1 == 2).unwrap().0;
    let (o, took) = kill_and_finish(child, victim);
    assert!(
        took < Duration::from_secs(10),
        "run took {took:?} to end after the kill"
    );
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(
        err.contains("rank 2"),
        "the error must name the dead rank: {err}"
    );
    assert!(
        err.lines().filter(|l| l.contains("error")).count() == 1,
        "one error line: {err}"
    );
    assert_ranks_gone(&ranks, Duration::from_secs(1), "the run");
    assert!(!out.exists(), "no result file from a failed run");
}

/// Freezes `rank` (SIGSTOP) in a 3-rank run once it is under way; returns the run's output,
/// how long after the freeze the run ended, and the ranks (pid, rank).
fn freeze_rank(rank: usize) -> (std::process::Output, Duration, Vec<(u32, usize)>) {
    let out = scratch_out();
    let child = long_run(&["--out", &out]);
    let ranks = wait_for_ranks(child.id(), 3, RENDEZVOUS_SETTLE);
    let victim = ranks.iter().find(|r| r.1 == rank).unwrap().0;
    let stopped_at = Instant::now();
    signal(victim, "-STOP");
    let (o, _) = finish(child, Duration::from_secs(30));
    let took = stopped_at.elapsed();
    // The launcher killed the frozen rank; resume it in case it did not, so nothing lingers.
    let _ = std::process::Command::new("kill")
        .args(["-CONT", &victim.to_string()])
        .stderr(std::process::Stdio::null())
        .status();
    (o, took, ranks)
}

#[test]
fn frozen_rank_is_noticed_and_named_within_ten_seconds() {
    let (o, took, ranks) = freeze_rank(1);
    assert!(
        took < Duration::from_secs(10),
        "run took {took:?} to end after rank 1 froze"
    );
    let err = text(&o.stderr);
    assert!(
        err.contains("rank 1") && err.contains("stopped answering"),
        "{err}"
    );
    assert_ranks_gone(&ranks, Duration::from_secs(1), "the run");
}

/// The one line a failed run printed that says "error", checked to be the only one.
fn only_error_line(err: &str) -> &str {
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(lines.len(), 1, "one error line: {err}");
    assert!(!lines[0].contains("error: tbbench"), "{err}");
    lines[0]
}

#[test]
fn frozen_rank_0_is_named_in_one_line_within_ten_seconds() {
    let (o, took, ranks) = freeze_rank(0);
    assert!(
        took < Duration::from_secs(10),
        "run took {took:?} to end after rank 0 froze"
    );
    assert!(!o.status.success());
    let err = text(&o.stderr);
    let line = only_error_line(&err);
    assert!(
        line.contains("rank 0") && line.contains("stopped answering"),
        "{err}"
    );
    assert_ranks_gone(&ranks, Duration::from_secs(1), "the run");
}

/// With no other rank left to watch it (here a one-rank run; likewise rank 0 alone at the end
/// of a run, gathering), only the launcher can notice rank 0 frozen: by its heartbeat.
#[test]
fn frozen_rank_0_with_no_peer_watching_is_named_by_the_launcher() {
    let out = scratch_out();
    let child = spawn(&[
        "coll",
        "--nodes",
        "1",
        "--op",
        "all-reduce",
        "--sizes",
        "16MiB",
        "--iters",
        "1000000",
        "--out",
        &out,
    ]);
    let ranks = wait_for_ranks(child.id(), 1, Duration::from_millis(300));
    let victim = ranks[0].0;
    let stopped_at = Instant::now();
    signal(victim, "-STOP");
    let (o, _) = finish(child, Duration::from_secs(30));
    let took = stopped_at.elapsed();
    let _ = std::process::Command::new("kill")
        .args(["-CONT", &victim.to_string()])
        .stderr(std::process::Stdio::null())
        .status();
    assert!(
        took < Duration::from_secs(10),
        "run took {took:?} to end after rank 0 froze"
    );
    assert!(!o.status.success());
    let err = text(&o.stderr);
    let line = only_error_line(&err);
    assert!(
        line.contains("rank 0") && line.contains("stopped answering"),
        "{err}"
    );
    assert!(
        !text(&o.stdout).contains("TBBENCH"),
        "the heartbeat is the launcher's, not the user's: {}",
        text(&o.stdout)
    );
    assert_ranks_gone(&ranks, Duration::from_secs(1), "the run");
    assert!(!std::path::Path::new(&out).exists());
}

#[test]
fn killed_rank_0_is_named_in_one_line() {
    let out = scratch_out();
    let child = long_run(&["--out", &out]);
    let launcher = child.id();
    let ranks = wait_for_ranks(launcher, 3, RENDEZVOUS_SETTLE);
    let victim = ranks.iter().find(|r| r.1 == 0).unwrap().0;
    let (o, took) = kill_and_finish(child, victim);
    assert!(
        took < Duration::from_secs(10),
        "run took {took:?} to end after rank 0 died"
    );
    assert!(!o.status.success());
    let err = text(&o.stderr);
    let line = only_error_line(&err);
    assert!(line.contains("rank 0") && line.contains("died"), "{err}");
    assert_ranks_gone(&ranks, Duration::from_secs(1), "the run");
}

/// Ctrl-C, and SIGTERM (what `timeout`, systemd and Slurm send), to the launcher: one line,
/// every rank stopped.
#[test]
fn interrupt_on_the_launcher_stops_every_rank() {
    for sig in ["-INT", "-TERM"] {
        let child = long_run(&[]);
        let launcher = child.id();
        let ranks = wait_for_ranks(launcher, 3, RENDEZVOUS_SETTLE);
        signal(launcher, sig);
        let (o, took) = finish(child, Duration::from_secs(15));
        assert_eq!(o.status.code(), Some(130), "{sig}: {}", text(&o.stderr));
        assert!(took < Duration::from_secs(10));
        let err = text(&o.stderr);
        assert!(err.contains("interrupted"), "{sig}: {err}");
        let said: Vec<&str> = err.lines().filter(|l| !l.contains("warning:")).collect();
        assert_eq!(said.len(), 1, "{sig}: {err}");
        assert_ranks_gone(&ranks, Duration::from_secs(1), sig);
    }
}

/// A remote shell that fails as ssh does when it cannot reach a host (exit 255): one line
/// naming the host, and exit 1, not 255.
#[test]
fn a_remote_shell_exiting_255_gives_exit_1() {
    let o = link_through_shell(
        "ssh255",
        "#!/bin/sh\necho 'ssh: connect to host mac1 port 22: No route to host' >&2\nexit 255\n",
        "mac1\nmac2\n",
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("mac1"), "{}", text(&o.stderr));
}

/// `tbbench link --buffer 64` over `hosts` (a hostfile's text), ranks started by a remote
/// shell that is the script `shell`.
fn link_through_shell(
    name: &str,
    shell: &str,
    hosts: &str,
    extra: &[&str],
) -> std::process::Output {
    use std::os::unix::fs::PermissionsExt;
    let dir = tmpdir(name);
    let rsh = dir.join("remote-shell");
    std::fs::write(&rsh, shell).unwrap();
    std::fs::set_permissions(&rsh, std::fs::Permissions::from_mode(0o755)).unwrap();
    let hf = dir.join("hosts");
    std::fs::write(&hf, hosts).unwrap();
    let mut args = vec![
        "link",
        "--hostfile",
        hf.to_str().unwrap(),
        "--rsh",
        rsh.to_str().unwrap(),
        "--buffer",
        "64",
    ];
    args.extend_from_slice(extra);
    run(&args, Duration::from_secs(30))
}

#[test]
fn killed_launcher_leaves_no_orphans() {
    let child = long_run(&[]);
    let launcher = child.id();
    let ranks = wait_for_ranks(launcher, 3, RENDEZVOUS_SETTLE);
    signal(launcher, "-KILL");
    let _ = finish(child, Duration::from_secs(5));
    assert_ranks_gone(&ranks, Duration::from_secs(10), "a killed launcher");
}

#[test]
fn connection_with_a_wrong_token_is_refused_while_the_run_completes() {
    use std::io::Write;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tmpdir("token");
    let out = dir.join("r.json");
    let child = spawn(&[
        "link",
        "--port",
        &port.to_string(),
        "--buffer",
        "64",
        "--mode",
        "latency",
        "--iters",
        "20000",
        "--out",
        out.to_str().unwrap(),
    ]);
    // A stranger keeps knocking with a forged join message until the run is over.
    let knocks = std::thread::spawn(move || {
        let forged = br#"{"Join":{"token":"00000000000000000000000000000000","size":2,"info":{}}}"#;
        let mut sent = 0;
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
                let mut frame = (forged.len() as u32).to_le_bytes().to_vec();
                frame.extend_from_slice(forged);
                if s.write_all(&frame).is_ok() {
                    sent += 1;
                }
            } else if sent > 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(30));
        }
        sent
    });
    let (o, _) = finish(child, Duration::from_secs(60));
    let sent = knocks.join().unwrap();
    assert!(sent > 0);
    assert!(
        o.status.success(),
        "the run must complete: {}",
        text(&o.stderr)
    );
    let err = text(&o.stderr);
    assert!(
        err.contains("refused a rendezvous connection")
            && err.contains("wrong or missing session token"),
        "{err}"
    );
    let r: serde_json::Value = read_json(&out);
    assert_eq!(r["verification"]["passed"], true);
}

#[test]
fn malformed_hostfiles_get_one_line_naming_file_and_line() {
    let dir = tmpdir("hostfile");
    let cases = [
        ("bad1", "mac1 slots=two\n", "line 1"),
        ("bad2.json", "[{\"host\": \"mac1\"}]", "mlx.launch"),
        ("bad3", "mac1 slots=1\n", "2 ranks asked for"),
    ];
    for (name, body, expect) in cases {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        let o = run(
            &[
                "link",
                "--hostfile",
                p.to_str().unwrap(),
                "--nodes",
                "2",
                "--buffer",
                "64",
            ],
            Duration::from_secs(10),
        );
        assert_eq!(o.status.code(), Some(1));
        let err = text(&o.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(name) && err.contains(expect), "{name}: {err}");
    }
    let o = run(
        &["link", "--hostfile", dir.join("missing").to_str().unwrap()],
        Duration::from_secs(10),
    );
    assert!(text(&o.stderr).contains("cannot read hostfile"));
}

#[test]
fn unreachable_host_fails_fast_with_its_name() {
    let dir = tmpdir("unreach");
    let hf = dir.join("hosts");
    std::fs::write(&hf, "no-such-host.invalid\nanother.invalid\n").unwrap();
    // `false` stands in for a remote shell that cannot reach the host: it exits at once.
    let o = run(
        &[
            "link",
            "--hostfile",
            hf.to_str().unwrap(),
            "--rsh",
            "false",
            "--buffer",
            "64",
        ],
        Duration::from_secs(20),
    );
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(
        err.contains("rank 0") && err.contains("no-such-host.invalid"),
        "{err}"
    );
}

#[cfg(not(feature = "mpi"))]
#[test]
fn under_mpirun_without_mpi_support_says_how_to_build_it() {
    let o = std::process::Command::new(bin())
        .args(["link", "--buffer", "64"])
        .env("OMPI_COMM_WORLD_SIZE", "2")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(
        err.contains("built without MPI support") && err.contains("--features mpi"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

#[test]
fn idle_ranks_outlast_another_pairs_long_sweep() {
    // With 3 ranks, rank 2 idles while 0 and 1 measure for longer than --timeout; only the
    // measuring ranks' waits are bounded by it (heartbeats guard the idle ones).
    let dir = tmpdir("idle");
    let out = dir.join("r.json");
    let o = run(
        &[
            "link",
            "--nodes",
            "3",
            "--timeout",
            "2s",
            "--buffer",
            "32MiB",
            "--mode",
            "bw",
            "--iters",
            "60",
            "--out",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
}

#[test]
fn failed_shm_start_leaves_no_segment_behind() {
    let dir = tmpdir("shmleak");
    let hf = dir.join("hosts");
    std::fs::write(&hf, "localhost slots=1\nunreachable.invalid slots=1\n").unwrap();
    let before: Vec<_> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    let o = run(
        &[
            "link",
            "--hostfile",
            hf.to_str().unwrap(),
            "--rsh",
            "false",
            "--transport",
            "shm",
            "--timeout",
            "2s",
            "--buffer",
            "64",
        ],
        Duration::from_secs(30),
    );
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(err.contains("rank(s) 1") || err.contains("rank 1"), "{err}");
    let after: Vec<_> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with("tbbench-") && !before.contains(n))
        .collect();
    assert!(after.is_empty(), "left behind: {after:?}");
}

#[test]
fn verbs_without_an_rdma_device_fails_fast_in_one_line() {
    // Meaningful where no RDMA device exists (this project's build machines).
    let has_devices = std::fs::read_dir("/sys/class/infiniband")
        .map(|d| d.count() > 0)
        .unwrap_or(false);
    if has_devices {
        skipped("this host has RDMA devices");
        return;
    }
    let dir = tmpdir("noverbs");
    let out = dir.join("r.json");
    let child = spawn(&[
        "link",
        "--nodes",
        "2",
        "--transport",
        "verbs",
        "--buffer",
        "64",
        "--out",
        out.to_str().unwrap(),
    ]);
    let launcher = child.id();
    let watcher = std::thread::spawn(move || {
        // Every rank process seen while the run lasts, to check none outlives it.
        let mut seen: Vec<(u32, usize)> = Vec::new();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) && alive(launcher) {
            for r in ranks_of(launcher) {
                if !seen.contains(&r) {
                    seen.push(r);
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        seen
    });
    let (o, took) = finish(child, Duration::from_secs(20));
    let ranks = watcher.join().unwrap();
    assert!(!o.status.success());
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let err = text(&o.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(
        err.contains("transport verbs: no RDMA device on this host ("),
        "{err}"
    );
    assert_ranks_gone(&ranks, Duration::from_secs(5), "the failed verbs start");
    assert!(!out.exists(), "no result file from a failed run");
}

/// `tbbench coll | head -1`: once what reads the output is gone, the launcher ends quietly
/// with SIGPIPE's status (no panic, no error line) and its ranks go with it. The rows come a
/// fraction of a second apart, the first well after the header is read.
#[test]
fn closed_stdout_ends_the_run_quietly() {
    use std::io::BufRead;
    let mut child = spawn(&[
        "coll",
        "--algo",
        "ring",
        "--sizes",
        "8,16,32,64,128,256,512,1k",
        "--iters",
        "20000",
        "--out",
        &scratch_out(),
    ]);
    let launcher = child.id();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert!(first.starts_with("# all-reduce"), "{first}");
    let ranks = wait_for_ranks(launcher, 2, Duration::ZERO);
    drop(out);
    let (o, _) = finish(child, Duration::from_secs(120));
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(141), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_ranks_gone(
        &ranks,
        Duration::from_secs(10),
        "the launcher's closed stdout",
    );
}

/// A host only ssh can resolve (an alias, no `ips`): the rank that cannot resolve rank 0's
/// host says so, naming it, instead of the run blaming rank 0's connections.
#[test]
fn a_host_name_only_ssh_resolves_is_named_by_the_rank_that_cannot() {
    // A remote shell that runs the command here, as ssh with an alias would there.
    let o = link_through_shell(
        "alias",
        "#!/bin/sh\nshift\nexec \"$@\"\n",
        "mac-alias.invalid slots=2\n",
        &["--timeout", "3"],
    );
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(
        err.contains("cannot resolve rank 0's host mac-alias.invalid"),
        "{err}"
    );
}

/// A host given by its IPv6 address (OpenMPI's bracketed form): rank 0 listens there, not on
/// IPv4's any-address, and the others reach it. `[0:0:0:0:0:0:0:1]` is loopback spelled so
/// the launcher takes it for another host and starts its ranks through the remote shell.
#[test]
fn a_host_given_by_its_ipv6_address_runs() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        skipped("this host has no IPv6 loopback");
        return;
    }
    let dir = tmpdir("ipv6-host");
    let out = dir.join("r.json");
    let o = link_through_shell(
        "ipv6",
        "#!/bin/sh\nshift\nexec \"$@\"\n",
        "[0:0:0:0:0:0:0:1] slots=2\n",
        &[
            "--iters",
            "3",
            "--timeout",
            "10",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r: serde_json::Value = read_json(&out);
    assert_eq!(r["verification"]["passed"], true);
    assert_eq!(r["ranks"].as_array().unwrap().len(), 2);
}
