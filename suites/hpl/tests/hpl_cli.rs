//! `tbbench hpl` end to end: real rank processes, HPL's lines on stdout, the result file.

#[path = "../../../runners/tests/support.rs"]
mod support;

use std::time::Duration;
use support::*;

fn fixture(name: &str) -> String {
    format!("{}/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// `tbbench hpl --nodes NODES [EXTRA...] --dat DAT --no-dgemm-probe --out OUT`.
fn run_dat(
    nodes: &str,
    extra: &[&str],
    dat: &str,
    out: &std::path::Path,
    limit: Duration,
) -> std::process::Output {
    let mut args = vec!["hpl", "--nodes", nodes];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[
        "--dat",
        dat,
        "--no-dgemm-probe",
        "--out",
        out.to_str().unwrap(),
    ]);
    run(&args, limit)
}

#[test]
fn small_solves_pass_on_one_two_and_four_ranks() {
    let dir = tmpdir("hpl-small");
    // Lookahead by default wherever there is a panel broadcast or (one rank) a panel
    // factorization to hide behind it; --depth sets it.
    for (nodes, extra, code) in [
        ("1", vec![], "WR10R2R4"),
        ("1", vec!["--depth", "0"], "WR00R2R4"),
        ("2", vec!["--nb", "16"], "WR10R2R4"),
        ("2", vec!["--nb", "16", "--depth", "3"], "WR30R2R4"),
        (
            "4",
            vec!["--p", "2", "--q", "2", "--transport", "shm", "--nb", "8"],
            "WR10R2R4",
        ),
    ] {
        let out = dir.join(format!("r{nodes}-{code}.json"));
        let mut args = vec![
            "hpl",
            "--nodes",
            nodes,
            "--n",
            "300",
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend(extra);
        let o = run(&args, Duration::from_secs(120));
        assert!(o.status.success(), "{nodes} ranks: {}", text(&o.stderr));
        let stdout = text(&o.stdout);
        assert!(
            stdout.contains(
                "T/V                N    NB     P     Q               Time                 Gflops"
            ),
            "{stdout}"
        );
        assert!(stdout.contains("...... PASSED"), "{stdout}");
        let r = read_json(&out);
        assert_eq!(r["suite"], "hpl");
        let run = &r["results"]["runs"][0];
        assert_eq!(run["n"], 300);
        assert_eq!(run["passed"], true);
        assert_eq!(run["code"], code);
        assert!(stdout.contains(code), "{stdout}");
        assert!(run["resid"].as_f64().unwrap() < 1.0);
        assert!(run["gflops"].as_f64().unwrap() > 0.0);
        assert_eq!(
            run["per_rank"].as_array().unwrap().len(),
            nodes.parse::<usize>().unwrap()
        );
        assert_eq!(
            run["p"].as_u64().unwrap() * run["q"].as_u64().unwrap(),
            nodes.parse::<u64>().unwrap()
        );
        let blas = &r["hosts"][0]["blas"];
        assert!(
            !blas["name"].as_str().unwrap().is_empty()
                && !blas["kernel"].as_str().unwrap().is_empty(),
            "the BLAS in use is recorded: {blas}"
        );
        assert!(r["results"]["dgemm_gflops_single_rank"].as_f64().unwrap() > 0.0);
        // Threads per rank: this host's cores over the ranks on this host.
        let cores = r["hosts"][0]["cores_logical"].as_u64().unwrap();
        let here = r["hosts"][0]["ranks"].as_array().unwrap().len() as u64;
        assert_eq!(
            r["results"]["threads_per_rank"].as_u64().unwrap(),
            (cores / here).max(1)
        );
        let u12 = r["results"]["u12_solve"].as_str().unwrap();
        assert!(
            ["tbbench tiles (swaps fused)", "BLAS dtrsm"].contains(&u12),
            "{u12}"
        );
        // Every phase is recorded for every rank (the fused one is zero where it did not run).
        for split in run["per_rank"].as_array().unwrap() {
            for phase in [
                "panel",
                "broadcast",
                "swap",
                "swap_solve",
                "update",
                "solve",
            ] {
                assert!(split[phase].as_f64().unwrap() >= 0.0, "{phase}: {split}");
            }
        }
        assert_eq!(r["verification"]["passed"], true);
    }
}

#[test]
fn netlib_sample_hpl_dat_runs_every_combination() {
    let dir = tmpdir("hpl-dat");
    let out = dir.join("r.json");
    let o = run_dat(
        "4",
        &[],
        &fixture("netlib-HPL.dat"),
        &out,
        Duration::from_secs(300),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r = read_json(&out);
    let runs = r["results"]["runs"].as_array().unwrap();
    // 3 grids x 4 N x 4 NB x 3 RFACT x 2 NBMIN x 3 PFACT, all DEPTH 0, all on 4 ranks.
    assert_eq!(runs.len(), 864);
    assert!(runs.iter().all(|x| x["passed"] == true));
    assert_eq!(runs[0]["code"], "WR00L2L2");
    // Every PFACT, RFACT and the SWAP asked for ran as HPL defines them: nothing is noted as
    // replaced.
    assert!(
        !text(&o.stderr).contains("not implemented"),
        "{}",
        text(&o.stderr)
    );
    assert!(
        r["warnings"].as_array().unwrap().iter().all(|w| {
            let w = w.as_str().unwrap();
            !w.contains("PFACT") && !w.contains("SWAP") && !w.contains("not implemented")
        }),
        "{}",
        r["warnings"]
    );
    assert!(runs
        .iter()
        .all(|x| x["swap"] == serde_json::json!({ "mix": { "threshold": 64 } })));
    // The last four lines (L1 and U forms, equilibration, alignment) change only HPL's
    // layout; what tbbench does instead is named, on the terminal and in the result.
    for line in [28, 29, 30, 31] {
        let said = format!("HPL.dat line {line} asks for");
        assert!(text(&o.stderr).contains(&said), "{}", text(&o.stderr));
        assert!(
            r["warnings"]
                .as_array()
                .unwrap()
                .iter()
                .any(|w| w.as_str().unwrap().starts_with(&said)),
            "{}",
            r["warnings"]
        );
    }
}

/// netlib's sample HPL.dat with some lines (0-based index, new text) replaced, written to
/// `dir/name`.
fn sample_dat_with(
    dir: &std::path::Path,
    name: &str,
    edits: &[(usize, &str)],
) -> std::path::PathBuf {
    let text_in = std::fs::read_to_string(fixture("netlib-HPL.dat")).unwrap();
    let mut lines: Vec<&str> = text_in.lines().collect();
    for (i, line) in edits {
        lines[*i] = line;
    }
    let dat = dir.join(name);
    std::fs::write(&dat, lines.join("\n")).unwrap();
    dat
}

/// netlib's sample HPL.dat cut to one N and NB on 2x2, with `swap` on its SWAP line.
fn two_by_two_dat(dir: &std::path::Path, swap: &str) -> std::path::PathBuf {
    sample_dat_with(
        dir,
        &format!("HPL-{}.dat", &swap[..1]),
        &[
            (4, "1            # of problems sizes (N)"),
            (5, "157          Ns"),
            (6, "1            # of NBs"),
            (7, "8            NBs"),
            (9, "1            # of process grids (P x Q)"),
            (10, "2            Ps"),
            (11, "2            Qs"),
            (25, swap),
            (26, "40           swapping threshold"),
        ],
    )
}

#[test]
fn every_pfact_rfact_and_swap_passes_on_two_by_two_over_tcp() {
    let dir = tmpdir("hpl-variants");
    for (swap, want) in [
        ("0            SWAP", serde_json::json!("binary-exchange")),
        ("1            SWAP", serde_json::json!("long")),
        (
            "2            SWAP",
            serde_json::json!({ "mix": { "threshold": 40 } }),
        ),
    ] {
        let dat = two_by_two_dat(&dir, swap);
        let out = dir.join(format!("r{}.json", &swap[..1]));
        let o = run_dat(
            "4",
            &["--transport", "tcp"],
            dat.to_str().unwrap(),
            &out,
            Duration::from_secs(120),
        );
        assert!(o.status.success(), "{swap}: {}", text(&o.stderr));
        assert!(
            !text(&o.stderr).contains("not implemented"),
            "{}",
            text(&o.stderr)
        );
        let r = read_json(&out);
        let runs = r["results"]["runs"].as_array().unwrap();
        // PFACT varies fastest, then NBMIN (2 4), then RFACT: 3 x 2 x 3 runs.
        assert_eq!(runs.len(), 18, "{swap}");
        let codes: Vec<&str> = runs.iter().map(|x| x["code"].as_str().unwrap()).collect();
        assert_eq!(
            &codes[..4],
            ["WR00L2L2", "WR00L2C2", "WR00L2R2", "WR00L2L4"]
        );
        assert_eq!(codes[17], "WR00R2R4");
        for (x, code) in runs.iter().zip(&codes) {
            assert_eq!(x["passed"], true, "{swap} {code}");
            assert!(x["resid"].as_f64().unwrap() < 1.0, "{swap} {code}");
            assert_eq!(x["swap"], want, "{swap} {code}");
            assert_eq!((x["p"].as_u64(), x["q"].as_u64()), (Some(2), Some(2)));
            let letter = |f: &serde_json::Value| match f.as_str().unwrap() {
                "left" => 'L',
                "crout" => 'C',
                _ => 'R',
            };
            // The code names what ran: W, map, depth, bcast, RFACT, NDIV, PFACT, NBMIN.
            assert_eq!(code.chars().nth(4), Some(letter(&x["rfact"])));
            assert_eq!(code.chars().nth(6), Some(letter(&x["pfact"])));
        }
        assert_eq!(r["network"]["transport"], "tcp", "{}", r["network"]);
    }
}

#[test]
fn every_lookahead_depth_runs_and_passes() {
    let dir = tmpdir("hpl-depth");
    let dat = sample_dat_with(
        &dir,
        "HPL.dat",
        &[
            (4, "1            # of problems sizes (N)"),
            (5, "211          Ns"),
            (6, "1            # of NBs"),
            (7, "16           NBs"),
            (9, "2            # of process grids (P x Q)"),
            (10, "2 1          Ps"),
            (11, "2 4          Qs"),
            (13, "1            # of panel fact"),
            (14, "2            PFACTs"),
            (15, "1            # of recursive stopping criterium"),
            (16, "4            NBMINs"),
            (19, "1            # of recursive panel fact."),
            (20, "2            RFACTs"),
            (23, "4            # of lookahead depth"),
            (24, "0 1 2 3      DEPTHs"),
        ],
    );
    let out = dir.join("r.json");
    let o = run_dat(
        "4",
        &[],
        dat.to_str().unwrap(),
        &out,
        Duration::from_secs(120),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r = read_json(&out);
    let runs = r["results"]["runs"].as_array().unwrap();
    let codes: Vec<&str> = runs.iter().map(|x| x["code"].as_str().unwrap()).collect();
    let each = ["WR00R2R4", "WR10R2R4", "WR20R2R4", "WR30R2R4"];
    assert_eq!(codes, [each, each].concat());
    assert!(runs.iter().all(|x| x["passed"] == true));
    assert_eq!(runs[3]["depth"], 3);
    assert!(
        !text(&o.stderr).contains("DEPTH"),
        "nothing is skipped: {}",
        text(&o.stderr)
    );
}

#[test]
fn threshold_zero_fails_and_exits_non_zero_with_the_file_written() {
    let dir = tmpdir("hpl-fail");
    let dat = sample_dat_with(
        &dir,
        "HPL.dat",
        &[
            (4, "1            # of problems sizes (N)"),
            (5, "64           Ns"),
            (6, "1            # of NBs"),
            (7, "8            NBs"),
            (9, "1            # of process grids (P x Q)"),
            (10, "1            Ps"),
            (11, "2            Qs"),
            (12, "0.0          threshold"),
        ],
    );
    let out = dir.join("r.json");
    let o = run_dat(
        "2",
        &[],
        dat.to_str().unwrap(),
        &out,
        Duration::from_secs(60),
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stdout).contains("...... FAILED"));
    let r = read_json(&out);
    assert_eq!(r["verification"]["passed"], false);
}

#[test]
fn deep_lookahead_counts_its_panels_in_the_memory_check() {
    // On 1x2 with NB 64 each rank's share is about 4·N² bytes, and DEPTH 64 holds 65 copies
    // of an N x 64 panel besides it (33 280·N bytes). N is chosen from this machine's free
    // memory so the budget (half of it over 2 ranks) fits the share alone with room to
    // spare but not with those panels: refused before anything is allocated, naming the
    // workspace and a smaller N.
    let avail: f64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap()
        * 1024.0;
    if avail < 1e9 {
        skipped("under 1 GB of memory available");
        return;
    }
    let budget = 0.5 * avail / 2.0;
    let half_panels = 33_280.0 / 2.0;
    let n = ((-half_panels + (half_panels * half_panels + 16.0 * budget).sqrt()) / 8.0) as usize;
    let n = n.to_string();
    let dir = tmpdir("hpl-deep");
    let out = dir.join("r.json");
    let args = [
        "hpl",
        "--nodes",
        "2",
        "--n",
        &n,
        "--nb",
        "64",
        "--depth",
        "64",
        "--mem-fraction",
        "0.5",
        "--no-dgemm-probe",
        "--out",
        out.to_str().unwrap(),
    ];
    let o = run(&args, Duration::from_secs(60));
    let err = text(&o.stderr);
    assert!(!o.status.success(), "N={n}: {err}");
    assert!(err.contains("for its share and workspace"), "{err}");
    let max_n: usize = err
        .rsplit("the largest N that fits is ")
        .next()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no largest N in: {err}"));
    assert!(max_n < n.parse().unwrap() && max_n > 0, "{err}");
    assert!(!out.exists());
}

#[test]
fn bad_input_gets_one_line_naming_the_cause() {
    let dir = tmpdir("hpl-bad");
    let dat = dir.join("broken.dat");
    std::fs::write(
        &dat,
        std::fs::read_to_string(fixture("netlib-HPL.dat"))
            .unwrap()
            .replace("29 30 34 35  Ns", "29 30        Ns"),
    )
    .unwrap();
    let out = dir.join("r.json");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["hpl", "--nodes", "4", "--dat", dat.to_str().unwrap()],
            "line 6: 4 problem sizes (N) announced, 2 given",
        ),
        (
            vec!["hpl", "--nodes", "2", "--p", "3", "--q", "1", "--n", "100"],
            "grid of 3 ranks",
        ),
        (
            vec!["hpl", "--nodes", "2", "--n", "10000000"],
            "the largest N that fits is",
        ),
        (
            vec!["hpl", "--nodes", "2", "--mem-fraction", "1.5"],
            "--mem-fraction",
        ),
    ];
    for (mut args, want) in cases {
        args.extend(["--out", out.to_str().unwrap()]);
        let o = run(&args, Duration::from_secs(60));
        assert!(!o.status.success(), "{args:?}");
        let err = text(&o.stderr);
        assert!(err.contains(want), "want '{want}' in: {err}");
        assert_eq!(
            err.lines().filter(|l| l.contains("error")).count(),
            1,
            "{err}"
        );
        assert!(!out.exists(), "no result file from {args:?}");
    }
}

#[test]
fn without_a_blas_the_rust_kernels_solve_and_say_so() {
    let dir = tmpdir("hpl-rust");
    let out = dir.join("r.json");
    let child = std::process::Command::new(bin())
        .args([
            "hpl",
            "--nodes",
            "2",
            "--n",
            "200",
            "--nb",
            "16",
            "--no-dgemm-probe",
            "--out",
            out.to_str().unwrap(),
        ])
        .env("TBBENCH_BLAS", "rust")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (o, _) = finish(child, Duration::from_secs(60));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r = read_json(&out);
    assert_eq!(r["hosts"][0]["blas"]["name"], "rust-fallback");
    assert_eq!(r["results"]["runs"][0]["passed"], true);
}

/// A run refused before any rank started: exit 1, one line on stderr naming `cause`, no
/// result file at `out`.
fn assert_refused(o: &std::process::Output, out: &std::path::Path, cause: &str) {
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(cause), "{err}");
    assert!(!out.exists(), "no result file for a refused run");
}

/// TBBENCH_U12_SOLVE picks U12's solver without timing both, the result names the one that
/// ran, and a value that is neither is refused in one line before any rank starts. The
/// OPENBLAS_THREAD_TIMEOUT tbbench sets for OpenBLAS is recorded, and a user's own is kept, as
/// is Accelerate's VECLIB_MAXIMUM_THREADS.
#[test]
fn the_u12_solver_can_be_chosen_and_a_bad_choice_is_refused() {
    let dir = tmpdir("hpl-u12");
    let hpl = |out: &std::path::Path, env: &[(&str, &str)]| {
        let mut cmd = std::process::Command::new(bin());
        cmd.args(["hpl", "--nodes", "1", "--n", "200", "--nb", "16"])
            .args(["--no-dgemm-probe", "--out", out.to_str().unwrap()])
            .env_remove("TBBENCH_U12_SOLVE")
            .env_remove("OPENBLAS_THREAD_TIMEOUT")
            .env_remove("VECLIB_MAXIMUM_THREADS")
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        finish(cmd.spawn().unwrap(), Duration::from_secs(60)).0
    };
    for (value, name) in [
        ("tiles", "tbbench tiles (swaps fused)"),
        ("blas", "BLAS dtrsm"),
    ] {
        let out = dir.join(format!("{value}.json"));
        let o = hpl(&out, &[("TBBENCH_U12_SOLVE", value)]);
        assert!(o.status.success(), "{value}: {}", text(&o.stderr));
        let r = read_json(&out);
        assert_eq!(r["results"]["runs"][0]["passed"], true);
        let blas = &r["hosts"][0]["blas"];
        if blas["name"] == "rust-fallback" {
            // Without a BLAS there is no dtrsm to choose.
            assert_eq!(r["results"]["u12_solve"], "tbbench tiles (swaps fused)");
            continue;
        }
        assert_eq!(r["results"]["u12_solve"], name, "{value}");
        if blas["name"] == "openblas" {
            let env: Vec<&str> = blas["env"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            assert!(env.contains(&"OPENBLAS_THREAD_TIMEOUT=18"), "{env:?}");
        }
    }
    let out = dir.join("own-timeout.json");
    let o = hpl(
        &out,
        &[
            ("OPENBLAS_THREAD_TIMEOUT", "25"),
            ("VECLIB_MAXIMUM_THREADS", "3"),
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let blas = &read_json(&out)["hosts"][0]["blas"];
    // Accelerate's thread cap is recorded whatever the library (a macOS user's only knob).
    assert!(
        blas["env"].to_string().contains("VECLIB_MAXIMUM_THREADS=3"),
        "{blas}"
    );
    if blas["name"] == "openblas" {
        assert!(
            blas["env"]
                .to_string()
                .contains("OPENBLAS_THREAD_TIMEOUT=25"),
            "{blas}"
        );
    }

    let out = dir.join("bad.json");
    let o = hpl(&out, &[("TBBENCH_U12_SOLVE", "fast")]);
    assert_refused(&o, &out, "TBBENCH_U12_SOLVE=fast: expected tiles or blas");
}

/// TBBENCH_HPL_PRODUCT picks the trailing update's product (the packed one only where the CPU
/// has AVX-512 or AVX2: elsewhere the BLAS's, and the result says so), on one rank with
/// several threads (chunks), on two ranks and at DEPTH 0 (one call per panel); without a BLAS
/// the packed one is taken unasked; TBBENCH_HPL_KERNEL holds it to the AVX2 kernel; a value
/// of either that names nothing, or a kernel the CPU lacks, is refused in one line.
#[test]
fn the_update_product_can_be_chosen_and_is_recorded() {
    let dir = tmpdir("hpl-product");
    let hpl = |out: &std::path::Path, nodes: &str, env: &[(&str, &str)]| {
        let mut cmd = std::process::Command::new(bin());
        cmd.args([
            "hpl",
            "--nodes",
            nodes,
            "--threads",
            "2",
            "--n",
            "300",
            "--nb",
            "32",
        ])
        .args(["--no-dgemm-probe", "--out", out.to_str().unwrap()])
        .env_remove("TBBENCH_HPL_PRODUCT")
        .env_remove("TBBENCH_HPL_KERNEL")
        .env_remove("TBBENCH_BLAS")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
        for &(k, v) in env {
            // DEPTH stands for the flag; the rest are environment variables.
            if k == "DEPTH" {
                cmd.args(["--depth", v]);
            } else {
                cmd.env(k, v);
            }
        }
        finish(cmd.spawn().unwrap(), Duration::from_secs(60)).0
    };
    #[cfg(target_arch = "x86_64")]
    let (avx512, avx2) = (
        std::arch::is_x86_feature_detected!("avx512f"),
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma"),
    );
    #[cfg(not(target_arch = "x86_64"))]
    let (avx512, avx2) = (false, false);
    let avx2_packed = "tbbench avx2 12x4 (L21 packed once per panel)";
    let (kernel, packed) = match (avx512, avx2) {
        (true, _) => (true, "tbbench avx512 24x8 (L21 packed once per panel)"),
        (false, true) => (true, avx2_packed),
        _ => (false, ""),
    };
    for (case, env) in [
        ("packed", vec![("TBBENCH_HPL_PRODUCT", "packed")]),
        ("blas", vec![("TBBENCH_HPL_PRODUCT", "blas")]),
        ("no-blas", vec![("TBBENCH_BLAS", "rust")]),
        (
            "avx2",
            vec![
                ("TBBENCH_HPL_PRODUCT", "packed"),
                ("TBBENCH_HPL_KERNEL", "avx2"),
            ],
        ),
    ] {
        if case == "avx2" && !avx2 {
            continue;
        }
        let out = dir.join(format!("{case}.json"));
        let o = hpl(&out, "1", &env);
        assert!(o.status.success(), "{case}: {}", text(&o.stderr));
        let r = read_json(&out);
        let run = &r["results"]["runs"][0];
        assert_eq!(run["passed"], true, "{case}");
        let without_blas = if r["hosts"][0]["blas"]["name"] == "rust-fallback" {
            "tbbench loops (no BLAS)"
        } else {
            "BLAS dgemm"
        };
        let want = match case {
            "blas" => without_blas,
            "avx2" => avx2_packed,
            _ if kernel => packed,
            _ => without_blas,
        };
        assert_eq!(run["product"], want, "{case}");
    }
    // Two ranks, or one at DEPTH 0: one call per panel, named as well.
    for (nodes, depth, told) in [
        ("2", "1", "packed"),
        ("2", "0", "blas"),
        ("1", "0", "packed"),
    ] {
        let out = dir.join(format!("{nodes}-{depth}.json"));
        let o = hpl(
            &out,
            nodes,
            &[("TBBENCH_HPL_PRODUCT", told), ("DEPTH", depth)],
        );
        assert!(o.status.success(), "{}", text(&o.stderr));
        let r = read_json(&out);
        let run = &r["results"]["runs"][0];
        assert_eq!(run["passed"], true);
        assert_eq!(run["depth"], depth.parse::<u64>().unwrap(), "{run}");
        let want = if told == "packed" && kernel {
            packed
        } else if r["hosts"][0]["blas"]["name"] == "rust-fallback" {
            "tbbench loops (no BLAS)"
        } else {
            "BLAS dgemm"
        };
        assert_eq!(run["product"], want, "{nodes} ranks depth {depth} {told}");
    }

    let out = dir.join("bad.json");
    let o = hpl(&out, "1", &[("TBBENCH_HPL_PRODUCT", "fast")]);
    assert_refused(
        &o,
        &out,
        "TBBENCH_HPL_PRODUCT=\"fast\": expected packed or blas",
    );
    let o = hpl(&out, "1", &[("TBBENCH_HPL_KERNEL", "sse2")]);
    assert_refused(
        &o,
        &out,
        "TBBENCH_HPL_KERNEL=\"sse2\": expected avx512 or avx2",
    );
    if !avx512 {
        let o = hpl(&out, "1", &[("TBBENCH_HPL_KERNEL", "avx512")]);
        assert_refused(
            &o,
            &out,
            "TBBENCH_HPL_KERNEL=avx512: this CPU lacks that kernel",
        );
    }
}

/// Without --n, the output names the limit that chose N: memory or the time budget.
#[test]
fn the_output_says_which_limit_chose_n() {
    let dir = tmpdir("hpl-n-limit");
    let out = dir.join("r.json");
    let go = |extra: &[&str]| -> String {
        let mut args = vec!["hpl", "--nodes", "1", "--out", out.to_str().unwrap()];
        args.extend(extra);
        let o = run(&args, Duration::from_secs(120));
        assert!(o.status.success(), "{}", text(&o.stderr));
        text(&o.stdout)
    };
    // A tiny memory share: N of a few thousand, well inside 5 minutes on any host.
    let o = go(&["--mem-fraction", "0.002", "--max-minutes", "5"]);
    let line = o
        .lines()
        .find(|l| l.starts_with("tbbench: N "))
        .unwrap_or_else(|| panic!("{o}"));
    assert!(
        line.contains("of the smallest host's free memory (--mem-fraction)"),
        "{line}"
    );
    assert!(line.contains("inside --max-minutes 5"), "{line}");
    // Half the memory in one second: the budget chooses.
    let o = go(&["--mem-fraction", "0.5", "--max-minutes", "0.02"]);
    let line = o
        .lines()
        .find(|l| l.starts_with("tbbench: N "))
        .unwrap_or_else(|| panic!("{o}"));
    assert!(
        line.contains("from the time budget (--max-minutes 0.02,")
            && line.contains("spent probing)"),
        "{line}"
    );
    let n: usize = line["tbbench: N ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let r = read_json(&out);
    assert_eq!(r["results"]["runs"][0]["n"], n);
    // The budget is the whole run's: recorded beside what the whole run took.
    let budget = &r["results"]["time_budget"];
    assert_eq!(budget["max_minutes"], 0.02);
    assert!(budget["whole_run_s"].as_f64().unwrap() > 0.0, "{budget}");
}

/// Without --nb, NB is the fastest of the candidates that fit, each measured on the run's
/// own grid before it; the result says which ran and how it was chosen. With --nb, that NB.
#[test]
fn nb_is_measured_when_not_given_and_the_result_says_so() {
    let dir = tmpdir("hpl-nb-choice");
    let out = dir.join("r.json");
    let args = [
        "hpl",
        "--nodes",
        "2",
        "--n",
        "1200",
        "--out",
        out.to_str().unwrap(),
    ];
    let o = run(&args, Duration::from_secs(120));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r = read_json(&out);
    let choice = &r["results"]["nb_choice"];
    assert_eq!(choice["how"], "probe", "{choice}");
    assert_eq!(choice["grid"], serde_json::json!([1, 2]));
    let probed = choice["probed"].as_array().unwrap();
    // 384 leaves a rank of the 1 x 2 grid fewer than two blocks of N = 1200.
    let tried: Vec<u64> = probed.iter().map(|p| p["nb"].as_u64().unwrap()).collect();
    assert_eq!(tried, [128, 192, 256], "{choice}");
    let best = probed
        .iter()
        .filter(|p| p["passed"] == true)
        .max_by(|a, b| {
            a["gflops"]
                .as_f64()
                .unwrap()
                .total_cmp(&b["gflops"].as_f64().unwrap())
        })
        .unwrap();
    assert_eq!(choice["nb"], best["nb"]);
    assert_eq!(r["results"]["runs"][0]["nb"], best["nb"]);
    assert!(
        text(&o.stdout).contains(&format!(
            "tbbench: NB {}, the fastest at N=1200 on 1x2",
            best["nb"]
        )),
        "{}",
        text(&o.stdout)
    );

    let o = run(
        &[
            "hpl",
            "--nodes",
            "2",
            "--n",
            "1200",
            "--nb",
            "96",
            "--out",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r = read_json(&out);
    assert_eq!(
        r["results"]["nb_choice"],
        serde_json::json!({"nb": 96, "how": "--nb"})
    );
    assert_eq!(r["results"]["runs"][0]["nb"], 96);
}

/// Where OpenBLAS, left to itself, runs a kernel older than the CPU (here the stand-in makes
/// it choose Prescott, as Debian 12's 0.3.21 does on Emerald Rapids), tbbench starts itself
/// again with OPENBLAS_CORETYPE naming the CPU's kernel: the ranks run it, the result records
/// both kernels, `tbbench env` names the gap and counts no problem (a kernel the user holds
/// back: runners/tests/env_cli.rs).
#[test]
fn an_openblas_that_falls_behind_the_cpu_is_told_the_cpus_kernel() {
    #[cfg(target_arch = "x86_64")]
    let wanted = if std::arch::is_x86_feature_detected!("avx512f") {
        Some("SkylakeX")
    } else if std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
    {
        Some("Haswell")
    } else {
        None
    };
    #[cfg(not(target_arch = "x86_64"))]
    let wanted: Option<&str> = None;
    let Some(wanted) = wanted.filter(|_| cfg!(target_os = "linux")) else {
        skipped("OpenBLAS's x86 kernels are judged on x86-64 Linux with AVX2 or AVX-512 only");
        return;
    };
    let command = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = std::process::Command::new(bin());
        cmd.args(args)
            .env_remove("OPENBLAS_CORETYPE")
            .env_remove("TBBENCH_OPENBLAS_DETECTED")
            .env_remove("TBBENCH_HPL_PRODUCT")
            .env_remove("TBBENCH_BLAS")
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        finish(cmd.spawn().unwrap(), Duration::from_secs(60)).0
    };
    let env_json = |env: &[(&str, &str)]| -> serde_json::Value {
        let o = command(&["env", "--json"], env);
        assert!(o.status.success(), "{}", text(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    if env_json(&[])["blas"]["name"] != "openblas" {
        skipped("no OpenBLAS on this host (apt install libopenblas0)");
        return;
    }
    let stand_in = [("TBBENCH_TEST_OPENBLAS_DETECTS", "Prescott")];
    let dir = tmpdir("hpl-openblas-kernel");
    let out = dir.join("told.json");
    let o = command(
        &[
            "hpl",
            "--nodes",
            "2",
            "--n",
            "300",
            "--nb",
            "32",
            "--no-dgemm-probe",
        ]
        .into_iter()
        .chain(["--out", out.to_str().unwrap()])
        .collect::<Vec<_>>(),
        &stand_in,
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r = read_json(&out);
    let blas = &r["hosts"][0]["blas"];
    assert!(
        blas["kernel"].as_str().unwrap().starts_with(wanted),
        "{blas}"
    );
    assert!(
        blas["env"]
            .as_array()
            .unwrap()
            .contains(&format!("OPENBLAS_CORETYPE={wanted}").into()),
        "{blas}"
    );
    let note = blas["note"].as_str().unwrap();
    assert!(
        note.contains("chose its Prescott kernel")
            && note.contains(&format!("tbbench set OPENBLAS_CORETYPE={wanted}")),
        "{note}"
    );
    assert_eq!(r["results"]["runs"][0]["passed"], true);
    // env: the gap named, no problem counted.
    let e = env_json(&stand_in);
    assert!(
        e["blas"]["kernel"].as_str().unwrap().starts_with(wanted),
        "{e}"
    );
    assert!(
        e["blas"]["note"].as_str().unwrap().contains("Prescott"),
        "{e}"
    );
    let blas_problem = |e: &serde_json::Value| {
        e["problems"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.as_str().unwrap().contains("OpenBLAS runs its"))
    };
    assert!(!blas_problem(&e), "{e}");
}
