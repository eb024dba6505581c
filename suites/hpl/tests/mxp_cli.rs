//! `tbbench hpl-mxp` end to end: real rank processes on several grids, HPL's lines, the
//! refinement's record, bad input, and the report and compare setting it beside hpl.

#[path = "../../../runners/tests/support.rs"]
mod support;

use std::process::Command;
use std::time::Duration;
use support::*;

fn mxp(nodes: &str, extra: &[&str], out: &std::path::Path) -> std::process::Output {
    let mut args = vec!["hpl-mxp", "--nodes", nodes];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--out", out.to_str().unwrap()]);
    run(&args, Duration::from_secs(120))
}

#[test]
fn solves_pass_on_every_grid_with_blocks_that_do_not_divide_n() {
    let dir = tmpdir("mxp-grids");
    for (nodes, n, nb, grid) in [
        ("1", "300", "64", None),
        ("2", "301", "32", None),
        ("3", "257", "16", None),
        ("4", "400", "48", None),
        ("4", "333", "40", Some(("4", "1"))),
    ] {
        let out = dir.join(format!("r{nodes}-{n}.json"));
        let mut extra = vec!["--n", n, "--nb", nb];
        if let Some((p, q)) = grid {
            extra.extend(["--p", p, "--q", q]);
        }
        let o = mxp(nodes, &extra, &out);
        assert!(o.status.success(), "{nodes} ranks: {}", text(&o.stderr));
        let stdout = text(&o.stdout);
        assert!(stdout.contains("MXP-FP32"), "{stdout}");
        assert!(stdout.contains("...... PASSED"), "{stdout}");
        assert!(stdout.contains("GMRES iteration"), "{stdout}");
        let r = read_json(&out);
        assert_eq!(r["suite"], "hpl-mxp");
        let run = &r["results"]["runs"][0];
        assert_eq!(run["passed"], true, "{run}");
        assert_eq!(run["precision"], "fp32");
        assert!(run["resid"].as_f64().unwrap() < 16.0);
        // The factors alone leave single precision's error; GMRES takes it to HPL's check in
        // a few iterations on this diagonally dominant system (a wrong factorization would
        // need many, or fail).
        let iterations = run["iterations"].as_u64().unwrap();
        assert!((1..=4).contains(&iterations), "{run}");
        assert_eq!(
            run["p"].as_u64().unwrap() * run["q"].as_u64().unwrap(),
            nodes.parse::<u64>().unwrap()
        );
        assert!(r["results"]["kernel"].as_str().unwrap().contains("sgemm"));
        assert_eq!(r["params"]["nodes"], nodes.parse::<u64>().unwrap());
        assert!(r["hosts"][0]["blas"].is_object(), "the BLAS is recorded");
        assert_eq!(r["verification"]["passed"], true);
    }
}

fn cpu_has_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// BF16 and FP16 solves pass on every grid shape (the 1×Q path with its lookahead and the
/// 2×2 one): BF16 through tbbench's AVX-512 BF16 kernel where the CPU has it (else its
/// rounded operands through sgemm, with a warning saying so), FP16 through sgemm; each result
/// names the kernel that ran.
#[test]
fn sixteen_bit_solves_pass_and_name_their_kernel() {
    let dir = tmpdir("mxp-16");
    for precision in ["bf16", "fp16"] {
        for (nodes, n, nb) in [
            ("1", "500", "64"),
            ("2", "333", "32"),
            ("3", "401", "40"),
            ("4", "500", "64"),
        ] {
            let out = dir.join(format!("{precision}-{nodes}.json"));
            let o = mxp(
                nodes,
                &["--n", n, "--nb", nb, "--precision", precision],
                &out,
            );
            assert!(
                o.status.success(),
                "{precision} {nodes} ranks: {}",
                text(&o.stderr)
            );
            let r = read_json(&out);
            let run = &r["results"]["runs"][0];
            assert_eq!(run["passed"], true, "{run}");
            assert_eq!(run["code"], format!("MXP-{}", precision.to_uppercase()));
            // A 16-bit preconditioner is rougher than FP32's: a few more iterations.
            assert!(run["iterations"].as_u64().unwrap() <= 10, "{run}");
            let kernel = r["results"]["kernel"].as_str().unwrap();
            let warned = r["warnings"].to_string().contains("no AVX-512 BF16");
            match (precision, cpu_has_bf16()) {
                ("bf16", true) => assert!(kernel.contains("vdpbf16ps") && !warned, "{kernel}"),
                ("bf16", false) => {
                    assert!(kernel.contains("BF16 operands") && warned, "{kernel}")
                }
                _ => assert!(kernel.contains("FP16 operands"), "{kernel}"),
            }
        }
    }
}

#[test]
fn without_a_blas_the_rust_loops_factor_and_say_so() {
    let dir = tmpdir("mxp-rust");
    let out = dir.join("r.json");
    let child = Command::new(bin())
        .args([
            "hpl-mxp", "--nodes", "2", "--n", "200", "--nb", "24", "--out",
        ])
        .arg(&out)
        .env("TBBENCH_BLAS", "rust")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (o, _) = finish(child, Duration::from_secs(60));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r = read_json(&out);
    assert_eq!(r["results"]["runs"][0]["passed"], true);
    assert!(r["results"]["kernel"].as_str().unwrap().contains("Rust"));
}

#[test]
fn bad_input_gets_one_line_naming_the_cause() {
    let dir = tmpdir("mxp-bad");
    let out = dir.join("r.json");
    for (args, want) in [
        (
            vec!["--nodes", "2", "--p", "3", "--q", "1"],
            "grid of 3 ranks",
        ),
        (vec!["--nodes", "2", "--n", "2000000"], "does not fit"),
        (vec!["--nodes", "2", "--precision", "fp8"], "fp16"),
        (vec!["--nodes", "2", "--n", "0"], "--n"),
        (
            vec!["--nodes", "1", "--mem-fraction", "0"],
            "--mem-fraction",
        ),
    ] {
        let mut all = vec!["hpl-mxp"];
        all.extend(args.iter());
        all.extend(["--out", out.to_str().unwrap()]);
        let o = run(&all, Duration::from_secs(60));
        assert!(!o.status.success(), "{all:?}");
        let err = text(&o.stderr);
        assert!(err.contains(want), "want '{want}' in: {err}");
        assert_eq!(
            err.lines().filter(|l| l.contains("error")).count(),
            1,
            "{err}"
        );
        assert!(!out.exists(), "no result file from {all:?}");
    }
}

/// hpl and hpl-mxp of one N on the same ranks: the report sets them side by side with the
/// speed-up, and compare reads hpl-mxp's Gflops.
#[test]
fn the_report_sets_mxp_beside_hpl_and_compare_reads_it() {
    let dir = tmpdir("mxp-report");
    let (h, m) = (dir.join("hpl.json"), dir.join("mxp.json"));
    let o = run(
        &[
            "hpl",
            "--nodes",
            "2",
            "--n",
            "600",
            "--nb",
            "64",
            "--no-dgemm-probe",
            "--out",
            h.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = mxp("2", &["--n", "600", "--nb", "64"], &m);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let html = dir.join("report.html");
    let o = Command::new(bin())
        .args(["report", h.to_str().unwrap(), m.to_str().unwrap(), "-o"])
        .arg(&html)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("HPL-MxP"), "no MxP section");
    assert!(page.contains("Beside HPL"), "no beside-HPL table");
    assert!(page.contains("speed-up"));
    let o = Command::new(bin())
        .args(["compare", m.to_str().unwrap(), m.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("MXP-FP32 N=600 NB=64 1x2"),
        "{}",
        text(&o.stdout)
    );
}
