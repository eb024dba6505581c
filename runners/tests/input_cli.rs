//! Bad input at the command line, end to end: the real binary refuses each one in one line,
//! before any rank starts or anything is allocated, and leaves no file behind.

mod support;

use std::time::Duration;
use support::*;

/// Runs tbbench and returns (exit code, stderr); fails the test if it takes over 20 s.
fn refuse(args: &[&str]) -> (Option<i32>, String) {
    let o = run(args, Duration::from_secs(20));
    let err = text(&o.stderr);
    assert!(!o.status.success(), "{args:?} succeeded: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{args:?}: not one line: {err}"
    );
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    (o.status.code(), err)
}

#[test]
fn overflowing_numbers_are_refused_in_one_line() {
    for (args, want) in [
        (&["link", "--timeout", "1e19"][..], "at most 7 days"),
        (&["link", "--timeout", "1e20"], "at most 7 days"),
        (
            &["hpl", "--n", "2305843009213693951", "--no-dgemm-probe"],
            "--n",
        ),
        (
            &[
                "hpl",
                "--nodes",
                "2",
                "--p",
                "2",
                "--q",
                "9223372036854775809",
            ],
            "--q",
        ),
        (
            &[
                "hpl",
                "--nodes",
                "2",
                "--p",
                "4294967296",
                "--q",
                "4294967296",
            ],
            "--p",
        ),
        (&["link", "--nodes", "18446744073709551615"], "at most 1024"),
        (&["link", "--nodes", "100000"], "at most 1024"),
        (&["hpl", "--max-minutes", "NaN"], "--max-minutes"),
        (
            &[
                "infer",
                "--endpoint",
                "http://127.0.0.1:9/v1",
                "--concurrency",
                "1-9223372036854775808",
            ],
            "at most 4096",
        ),
        // A value with a line break is still reported on one line.
        (&["link", "--buffer", "10M\nB"], "bad size"),
    ] {
        let (_, err) = refuse(args);
        assert!(err.contains(want), "{args:?}: want '{want}' in: {err}");
    }
}

#[test]
fn far_more_local_ranks_than_cores_need_oversubscribe() {
    let cores = std::thread::available_parallelism().unwrap().get();
    let many = (cores * 4 + 1).to_string();
    let (_, err) = refuse(&["hpl", "--nodes", &many, "--n", "1000"]);
    assert!(err.contains("--oversubscribe"), "{err}");
}

#[test]
fn output_onto_anything_but_a_regular_file_is_refused_before_the_run() {
    let dir = tmpdir("outkinds");
    let fifo = dir.join("pipe");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let folder = dir.join("folder.json");
    std::fs::create_dir(&folder).unwrap();
    for target in [&fifo, &folder] {
        let t = target.to_str().unwrap();
        let (_, err) = refuse(&["link", "--sizes", "1k", "--out", t]);
        assert!(err.contains("not a regular file"), "{t}: {err}");
        let (_, err) = refuse(&["report", "fixtures/results", "-o", t]);
        assert!(err.contains("not a regular file"), "{t}: {err}");
    }
    // Both are still what they were.
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    assert!(std::fs::metadata(&folder).unwrap().is_dir());
    let (_, err) = refuse(&["link", "--out", "/dev/null"]);
    assert!(err.contains("a device"), "{err}");
    // A folder that cannot be made is named before the run, not after it.
    let file = dir.join("plain");
    std::fs::write(&file, "x").unwrap();
    let inside = file.join("r.json");
    let (_, err) = refuse(&["link", "--sizes", "1k", "--out", inside.to_str().unwrap()]);
    assert!(err.contains("plain"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_message_larger_than_memory_is_refused_before_allocating() {
    let dir = tmpdir("hugebuf");
    let out = dir.join("r.json");
    let (_, err) = refuse(&["link", "--buffer", "1TiB", "--out", out.to_str().unwrap()]);
    assert!(err.contains("largest power of two that fits"), "{err}");
    assert!(!out.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn hpl_dat_with_n_zero_or_endless_lists_is_refused_naming_the_line() {
    let dir = tmpdir("badhpldat");
    let sample = std::fs::read_to_string("fixtures/netlib-HPL.dat").unwrap();
    let with = |line: usize, text: &str| {
        let mut l: Vec<&str> = sample.lines().collect();
        l[line - 1] = text;
        l.join("\n")
    };
    let cases = [
        (with(6, "0 30 34 35 Ns"), "line 6"),
        (with(12, "4611686018427387905 4 1 Qs"), "line 12"),
    ];
    for (text, want) in cases {
        let dat = dir.join("HPL.dat");
        std::fs::write(&dat, text).unwrap();
        let (_, err) = refuse(&["hpl", "--nodes", "4", "--dat", dat.to_str().unwrap()]);
        assert!(err.contains(want), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn flags_a_mode_does_not_use_are_refused_naming_them() {
    let (code, err) = refuse(&[
        "infer",
        "--endpoint",
        "http://127.0.0.1:9/v1",
        "--nodes",
        "4",
        "--hostfile",
        "hosts",
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--nodes, --hostfile"), "{err}");
    let (_, err) = refuse(&["infer", "--shape", "llama-3.2-3b", "--concurrency", "4"]);
    assert!(err.contains("does not use --concurrency"), "{err}");
}

#[test]
fn no_short_flag_for_nodes_collides_with_hpls_n() {
    // `-n` once meant --nodes next to hpl's --n (the matrix order): 500 ranks were started.
    let (code, err) = refuse(&["hpl", "-n", "500", "--n", "1000"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("'-n'"), "{err}");
}

/// Two output flags naming one file would let the second write replace the first: refused
/// in one line, naming both flags, before anything runs; nothing is written.
#[test]
fn two_outputs_naming_one_file_are_refused() {
    let dir = tmpdir("same-output");
    let same = dir.join("same.json");
    let s = same.to_str().unwrap();
    let results = format!("{}/fixtures/results", env!("CARGO_MANIFEST_DIR"));
    // The same file spelt another way counts too.
    let other = format!(
        "{}/../{}/same.json",
        dir.display(),
        dir.file_name().unwrap().to_str().unwrap()
    );
    for (args, flags) in [
        (
            vec!["coll", "--sizes", "8", "--csv", s, "--out", &other],
            "--csv and --out",
        ),
        (
            vec!["doctor", "--nodes", "2", "--json", s, "--out", s],
            "--json and --out",
        ),
        (
            vec!["report", &results, "-o", s, "--json", s],
            "-o and --json",
        ),
        (
            vec![
                "predict",
                &results,
                "--shape",
                "llama-3.2-3b",
                "--layers",
                "1",
                "--nodes",
                "2",
                "--json",
                s,
                "--out",
                s,
            ],
            "--json and --out",
        ),
    ] {
        let (_, err) = refuse(&args);
        assert!(
            err.contains(&format!("{flags} both name")),
            "{args:?}: {err}"
        );
        assert!(!same.exists(), "{args:?} wrote {}", same.display());
    }
}

/// An empty interface or device name (a shell variable that was not set) is refused as such.
#[test]
fn empty_interface_and_device_names_are_refused() {
    for flag in ["--rdma-device", "--iface"] {
        let (code, err) = refuse(&["link", flag, ""]);
        assert_eq!(code, Some(2), "{flag}: {err}");
        assert!(err.contains("an empty name"), "{flag}: {err}");
    }
}
