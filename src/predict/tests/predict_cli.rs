//! `tbbench predict` on recorded results (fixtures/results): the figures it writes, the rank
//! counts and workloads it refuses, and its section in the report.

#[path = "../../../runners/tests/support.rs"]
mod support;

use serde_json::Value;
use std::path::Path;
use std::time::Duration;
use support::*;

const LIMIT: Duration = Duration::from_secs(60);

fn fixtures(sub: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/results")
        .join(sub)
        .display()
        .to_string()
}

fn predict(args: &[&str]) -> (std::process::Output, Option<Value>) {
    // Tests run in parallel: each call its own folder.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = tmpdir(&format!("predict-{n}"));
    let json = dir.join("predictions.json");
    let out = dir.join("result.json");
    let mut all = vec!["predict"];
    all.extend(args);
    all.extend([
        "--json",
        json.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let o = run(&all, LIMIT);
    let doc = json.exists().then(|| read_json(&json));
    if let Some(d) = &doc {
        let r = read_json(&out);
        assert_eq!(r["suite"], "predict");
        assert_eq!(r["results"]["predictions"], d["predictions"]);
    }
    (o, doc)
}

/// Every measured network and the published RDMA figures get a prediction per rank count,
/// computation plus communication; the 2-rank loopback prediction stands beside the 2-rank
/// loopback decode the fixtures hold.
#[test]
fn a_decode_is_predicted_for_every_network_and_rank_count() {
    let (o, doc) = predict(&[
        &fixtures("network"),
        &fixtures("coll"),
        &fixtures("decode"),
        "--shape",
        "llama-3.2-3b",
        "--layers",
        "1",
        "--nodes",
        "2,4",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let doc = doc.unwrap();
    let p = doc["predictions"].as_array().unwrap();
    let labels: Vec<&str> = p.iter().map(|x| x["label"].as_str().unwrap()).collect();
    for want in [
        "tcp/lo (loopback)",
        "shm",
        "RDMA over Thunderbolt 5 (published, not measured)",
    ] {
        assert!(labels.contains(&want), "{want} missing from {labels:?}");
    }
    for x in p {
        let (tps, compute, comm) = (
            x["tokens_per_s"].as_f64().unwrap(),
            x["compute_ms_per_token"].as_f64().unwrap(),
            x["comm_ms_per_token"].as_f64().unwrap(),
        );
        assert!(compute > 0.0 && comm > 0.0, "{x}");
        assert!((tps - 1e3 / (compute + comm)).abs() < 1e-6 * tps, "{x}");
        let published = x["label"].as_str().unwrap().contains("published");
        assert_eq!(
            x["source"],
            if published { "published" } else { "measured" },
            "{x}"
        );
    }
    // Two ranks: the computation of the fixtures' 2-rank decode (its slowest rank's), beside
    // its measured rate on the network it ran over.
    let lo2 = p
        .iter()
        .find(|x| x["label"] == "tcp/lo (loopback)" && x["ranks"] == 2)
        .unwrap();
    assert!((lo2["compute_ms_per_token"].as_f64().unwrap() - 17.989325666666666).abs() < 1e-9);
    assert!(lo2["compute_from"]
        .as_str()
        .unwrap()
        .contains("2-rank decode"));
    let measured = lo2["measured_tokens_per_s"].as_f64().unwrap();
    assert!((measured - 54.73646190771933).abs() < 1e-9);
    let ratio = lo2["measured_over_predicted"].as_f64().unwrap();
    assert!((ratio - measured / lo2["tokens_per_s"].as_f64().unwrap()).abs() < 1e-9);
    // Four ranks: no 4-rank decode of this model, no 1-rank one: the weaker estimate, named.
    let lo4 = p
        .iter()
        .find(|x| x["label"] == "tcp/lo (loopback)" && x["ranks"] == 4)
        .unwrap();
    assert!(
        lo4["compute_from"]
            .as_str()
            .unwrap()
            .starts_with("weaker estimate"),
        "{lo4}"
    );
    // The 4-rank loopback all-reduces come from the 4-rank coll run's rows; shm has no 4-rank
    // rows, so its are modelled from its link rows.
    assert!(
        lo4["comm_from"]
            .as_str()
            .unwrap()
            .contains("rows at 4 ranks"),
        "{lo4}"
    );
    let shm4 = p
        .iter()
        .find(|x| x["label"] == "shm" && x["ranks"] == 4)
        .unwrap();
    assert!(
        shm4["comm_from"].as_str().unwrap().contains("modelled"),
        "{shm4}"
    );
    let text_out = text(&o.stdout);
    assert!(text_out.contains("published, not measured"), "{text_out}");
}

#[test]
fn hpl_is_predicted_from_the_dgemm_rate_and_the_networks() {
    let (o, doc) = predict(&[
        &fixtures("network"),
        &fixtures("hpl"),
        "--hpl-n",
        "20000",
        "--nodes",
        "4",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let doc = doc.unwrap();
    for x in doc["predictions"].as_array().unwrap() {
        assert_eq!(
            (x["p"].as_u64(), x["q"].as_u64()),
            (Some(2), Some(2)),
            "{x}"
        );
        let (g, c, m) = (
            x["gflops"].as_f64().unwrap(),
            x["compute_s"].as_f64().unwrap(),
            x["comm_s"].as_f64().unwrap(),
        );
        let flops = 2.0 / 3.0 * 2e4f64.powi(3) + 1.5 * 2e4f64.powi(2);
        assert!((g - flops / (c + m) / 1e9).abs() < 1e-6 * g, "{x}");
        assert!(m > 0.0, "{x}");
    }
}

/// Configurations no run can have are not predicted: shared memory past the ranks one
/// segment joins (named, the other networks predicted), more ranks than tbbench starts
/// (refused in one line).
#[test]
fn impossible_rank_counts_are_not_predicted() {
    let (o, doc) = predict(&[
        &fixtures("network"),
        &fixtures("hpl"),
        "--hpl-n",
        "20000",
        "--nodes",
        "4,100",
    ]);
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    let p = doc.unwrap()["predictions"].as_array().unwrap().clone();
    let at = |label: &str, ranks: u64| {
        p.iter()
            .any(|x| x["label"] == label && x["ranks"].as_u64() == Some(ranks))
    };
    assert!(at("shm", 4) && !at("shm", 100), "{p:?}");
    assert!(at("tcp/lo (loopback)", 100), "{p:?}");
    assert!(
        err.contains(
            "shared memory joins at most 64 ranks on one host: no prediction for 100 ranks"
        ),
        "{err}"
    );
    let (o, doc) = predict(&[&fixtures("network"), "--hpl-n", "100000", "--nodes", "2000"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--nodes 2000: tbbench runs at most 1024 ranks"),
        "{err}"
    );
    assert!(doc.is_none());
}

/// Pipeline stages run one after another: a 2-stage decode's computation is its stages'
/// summed, taken from the fixtures' 2-stage SmolLM2 decode (whose rate stands beside it).
/// Needs the model scripts/setup.sh installs (its header gives the shape); without it the
/// test says why, unless TBBENCH_REQUIRE_INFER_SERVER is set (CI).
#[test]
fn a_pipeline_decode_adds_up_its_stages() {
    let (o, doc) = predict(&[
        &fixtures("network"),
        &fixtures("decode"),
        "--gguf",
        "--parallel",
        "pp",
        "--nodes",
        "2",
    ]);
    if text(&o.stderr).contains("which is not installed") {
        assert!(
            std::env::var_os("TBBENCH_REQUIRE_INFER_SERVER").is_none(),
            "TBBENCH_REQUIRE_INFER_SERVER is set but {}",
            text(&o.stderr)
        );
        skipped("SmolLM2-135M is not installed (scripts/setup.sh builds .venv-infer)");
        return;
    }
    assert!(o.status.success(), "{}", text(&o.stderr));
    let doc = doc.unwrap();
    let lo = doc["predictions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["label"] == "tcp/lo (loopback)")
        .unwrap()
        .clone();
    // The fixture's stages computed 4.035 and 6.069 ms per token.
    let compute = lo["compute_ms_per_token"].as_f64().unwrap();
    assert!(
        (compute - (4.035497142857141 + 6.068874857142856)).abs() < 1e-9,
        "{lo}"
    );
    assert!(
        lo["compute_from"]
            .as_str()
            .unwrap()
            .contains("stages' summed"),
        "{lo}"
    );
    assert!(
        (lo["measured_tokens_per_s"].as_f64().unwrap() - 97.44).abs() < 0.01,
        "{lo}"
    );
    assert_eq!(doc["workload"]["parallel"], "pp");
    assert_eq!(doc["workload"]["layers"], 30);
}

/// What the user can get wrong gets one line naming it, and no result file.
#[test]
fn wrong_inputs_are_named() {
    let cases: [(&[&str], &str); 5] = [
        // Only a decode: no network measured.
        (
            &[
                &fixtures("decode"),
                "--shape",
                "llama-3.2-3b",
                "--nodes",
                "2",
            ],
            "no link or coll results",
        ),
        // Networks, but no decode at all to take the computation from.
        (
            &[
                &fixtures("network"),
                "--shape",
                "llama-3.2-3b",
                "--nodes",
                "2",
            ],
            "no decode result",
        ),
        // Tensor parallelism cannot split 8 KV heads over 3 ranks.
        (
            &[
                &fixtures("network"),
                &fixtures("decode"),
                "--shape",
                "llama-3.2-3b",
                "--nodes",
                "3",
            ],
            "--nodes 3",
        ),
        (
            &[&fixtures("network"), "--shape", "gpt-9", "--nodes", "2"],
            "unknown --shape 'gpt-9'",
        ),
        (
            &[&fixtures("network"), "--hpl-n", "1000", "--nodes", "2"],
            "no hpl result",
        ),
    ];
    for (args, want) in cases {
        let (o, doc) = predict(args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains(want) && err.trim().lines().count() == 1,
            "{args:?}: {err}"
        );
        assert!(doc.is_none(), "{args:?} wrote a prediction");
    }
    let o = run(&["predict", &fixtures("network"), "--nodes", "2"], LIMIT);
    assert_eq!(o.status.code(), Some(2), "no workload is a usage error");
}

/// The report puts a prediction in its own section, the published row labelled as such and
/// the measured rate beside the predicted one.
#[test]
fn the_report_shows_predictions_beside_measurements() {
    let dir = tmpdir("predict-report");
    let out = dir.join("predict.json");
    let o = run(
        &[
            "predict",
            &fixtures("network"),
            &fixtures("decode"),
            "--shape",
            "llama-3.2-3b",
            "--layers",
            "1",
            "--nodes",
            "2",
            "--out",
            out.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let html = dir.join("report.html");
    let o = run(
        &[
            "report",
            out.to_str().unwrap(),
            "-o",
            html.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("Predictions: what another network would buy"),
        "no section"
    );
    assert!(page.contains("RDMA over Thunderbolt 5 (published, not measured)"));
    assert!(
        page.contains("measured tokens/s") && page.contains("54.74"),
        "measured rate missing"
    );
}

/// Inputs that cannot be measurements are left out with a line each, never dropped unsaid or
/// turned into NaN: a link file with a negative latency, one with a size of 2^70; of two link
/// files of one network the older is named as replaced; an hpl N smaller than the ranks is
/// refused.
#[test]
fn bad_rows_and_replaced_files_are_named() {
    let dir = tmpdir("predict-bad-rows");
    let net = Path::new(&fixtures("network")).to_path_buf();
    let link = std::fs::read_dir(&net)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| read_json(p)["suite"] == "link")
        .unwrap();
    let original = read_json(&link);
    let mut bad = original.clone();
    bad["results"]["latency"][0]["one_way_us"]["median"] = serde_json::json!(-3.0);
    std::fs::write(dir.join("negative.json"), bad.to_string()).unwrap();
    let mut huge = original.clone();
    huge["results"]["latency"][0]["size_bytes"] = serde_json::json!(1.180591620717411e21);
    std::fs::write(dir.join("huge.json"), huge.to_string()).unwrap();
    let mut later = original.clone();
    later["started_at"] = serde_json::json!("2099-01-01T00:00:00Z");
    std::fs::write(dir.join("later.json"), later.to_string()).unwrap();
    let (o, doc) = predict(&[
        dir.to_str().unwrap(),
        &net.display().to_string(),
        &fixtures("decode"),
        "--shape",
        "llama-3.2-3b",
        "--layers",
        "1",
        "--nodes",
        "2",
    ]);
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(doc.is_some());
    assert!(
        err.contains("negative.json: a row of -3 us") && err.contains("huge.json: a row of"),
        "{err}"
    );
    assert!(
        err.contains("later.json measured the same network later and replaces it"),
        "{err}"
    );
    assert!(!err.contains("NaN"), "{err}");
    let (o, _) = predict(&[
        &net.display().to_string(),
        "--hpl-n",
        "1",
        "--nodes",
        "1000",
    ]);
    assert!(
        text(&o.stderr).contains("every rank needs at least one row"),
        "{}",
        text(&o.stderr)
    );
}

/// With a link run over a cluster's cables among the inputs (the lab's 4-ring, recorded), the
/// decode is also predicted per cabling: as cabled (for as many ranks as the run had), a full
/// mesh, a ring with one and two cables per neighbour, on the measured cables and on
/// published RDMA over Thunderbolt 5. A decode's all-reduce of a few KiB keeps to one cable
/// (tbbench stripes only large messages), so a second cable buys it nothing; a mesh lets it
/// take recursive doubling's two steps instead of the ring's six.
#[test]
fn a_decode_is_predicted_on_each_cabling_of_the_measured_cables() {
    let cabled = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/cabled/link-ring4-tcp-links.json")
        .display()
        .to_string();
    let (o, doc) = predict(&[
        &cabled,
        &fixtures("decode"),
        "--shape",
        "llama-3.2-3b",
        "--layers",
        "1",
        "--nodes",
        "2,4",
    ]);
    let stdout = text(&o.stdout);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        stdout.contains("# by cabling: one cable as tcp/links (virtual) measured it"),
        "{stdout}"
    );
    let doc = doc.unwrap();
    let rows = doc["by_cabling"].as_array().unwrap();
    let names = |source: &str, ranks: u64| -> Vec<String> {
        rows.iter()
            .filter(|r| r["source"] == source && r["ranks"] == ranks)
            .map(|r| r["cabling"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        names("measured", 4),
        [
            "as cabled (ring)",
            "full mesh",
            "ring, 2 cables per neighbour"
        ]
    );
    assert_eq!(
        names("published", 4),
        ["full mesh", "ring", "ring, 2 cables per neighbour"]
    );
    assert_eq!(
        names("measured", 2),
        ["full mesh", "full mesh, 2 cables per pair"]
    );
    for r in rows {
        let (tps, compute, comm) = (
            r["tokens_per_s"].as_f64().unwrap(),
            r["compute_ms_per_token"].as_f64().unwrap(),
            r["comm_ms_per_token"].as_f64().unwrap(),
        );
        assert!(compute > 0.0 && comm > 0.0, "{r}");
        assert!((tps - 1e3 / (compute + comm)).abs() < 1e-6 * tps, "{r}");
        assert!(r["measured_tokens_per_s"].is_null(), "{r}");
    }
    let comm = |source: &str, ranks: u64, name: &str| -> f64 {
        rows.iter()
            .find(|r| r["source"] == source && r["ranks"] == ranks && r["cabling"] == name)
            .and_then(|r| r["comm_ms_per_token"].as_f64())
            .unwrap()
    };
    let ring = comm("measured", 4, "as cabled (ring)");
    assert!(comm("measured", 4, "full mesh") < ring);
    assert_eq!(comm("measured", 4, "ring, 2 cables per neighbour"), ring);
    assert!(comm("published", 4, "ring") < ring);
}

/// A 1-rank decode taken with two threads, divided among two ranks that would share a
/// two-core machine (the recorded networks ran both ranks on one 2-core VM): each rank gets
/// one core, so the computation is the basis's whole step, not half of it, and a warning says
/// why; published RDMA's ranks are on machines of their own and keep half.
#[test]
fn ranks_that_share_a_machine_share_its_cores() {
    let dir = tmpdir("predict-cores");
    let basis = dir.join("decode-1.json");
    let o = run(
        &[
            "infer",
            "--nodes",
            "1",
            "--shape",
            "llama-3.2-3b",
            "--layers",
            "1",
            "--threads",
            "2",
            "--max-tokens",
            "4",
            "--out",
            basis.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let step = read_json(&basis)["results"]["per_token_ms"]["mean"]
        .as_f64()
        .unwrap();
    let (o, doc) = predict(&[
        &fixtures("network"),
        basis.to_str().unwrap(),
        "--shape",
        "llama-3.2-3b",
        "--layers",
        "1",
        "--nodes",
        "2",
    ]);
    let stderr = text(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains("get 1.00 core(s) each, against the 2 threads of the 1-rank decode"),
        "{stderr}"
    );
    let doc = doc.unwrap();
    for p in doc["predictions"].as_array().unwrap() {
        let compute = p["compute_ms_per_token"].as_f64().unwrap();
        let want = if p["source"] == "published" {
            step / 2.0
        } else {
            step
        };
        assert!(
            (compute - want).abs() < 1e-9 * want,
            "{p} against a step of {step} ms"
        );
    }
}
