//! The built-in decode on synthetic models (`--shape`): real ranks and sockets, random weights
//! at published layer shapes, so it runs anywhere without a model file.

#[path = "../../../runners/tests/support.rs"]
mod support;

use std::time::Duration;
use support::*;

#[test]
fn synthetic_shapes_split_over_ranks_give_the_1_rank_tokens() {
    let dir = tmpdir("decode-shape");
    // A pipeline needs a layer per stage; tensor parallelism's all-reduce by ring here (the
    // same tokens whatever the algorithm: every one gives every rank the same sums).
    for (nodes, parallel, layers, algo) in [("2", "tp", "1", "ring"), ("2", "pp", "2", "")] {
        let out = dir.join(format!("{parallel}.json"));
        let mut args = vec![
            "infer",
            "--shape",
            "llama-3.2-3b",
            "--layers",
            layers,
            "--nodes",
            nodes,
            "--parallel",
            parallel,
            "--max-tokens",
            "4",
            "--out",
            out.to_str().unwrap(),
        ];
        if !algo.is_empty() {
            args.extend(["--algo", algo]);
        }
        let o = run(&args, Duration::from_secs(300));
        assert!(o.status.success(), "{parallel}: {}", text(&o.stderr));
        let r = read_json(&out);
        assert_eq!(r["suite"], "decode");
        let want_algo = if algo.is_empty() { "auto" } else { algo };
        assert_eq!(r["params"]["algo"], want_algo);
        assert_eq!(r["results"]["model"]["synthetic"], true);
        assert_eq!(r["results"]["model"]["layers"].to_string(), layers);
        assert_eq!(r["results"]["model"]["dim"], 3072);
        assert_eq!(r["results"]["matched"], true, "{parallel}");
        assert_eq!(r["results"]["tokens"].as_array().unwrap().len(), 4);
        assert!(r["warnings"][0]
            .as_str()
            .unwrap()
            .starts_with("synthetic model"));
        let ceiling = r["results"]["bandwidth_ceiling_tokens_per_s"]
            .as_f64()
            .unwrap();
        assert!(ceiling > 0.0);
        let comm = r["results"]["per_token_comm_ms_per_rank"]
            .as_array()
            .unwrap();
        assert_eq!(comm.len(), 2);
    }
}

#[test]
fn impossible_splits_and_sizes_are_refused_in_one_line() {
    let dir = tmpdir("decode-refuse");
    let out = dir.join("r.json");
    let cases: [(&[&str], &str); 7] = [
        // Qwen3.5-27B has 4 KV heads: 3 ranks cannot share them.
        (
            &[
                "--shape",
                "qwen3.5-27b",
                "--layers",
                "1",
                "--nodes",
                "3",
                "--parallel",
                "tp",
            ],
            "splits over 1, 2, 4 rank(s)",
        ),
        (
            &["--shape", "gpt-5", "--nodes", "1"],
            "unknown --shape 'gpt-5'",
        ),
        (
            &["--shape", "llama-3-70b", "--layers", "81", "--nodes", "1"],
            "1 to 80 layers",
        ),
        // All 80 layers of Llama 3 70B need about 76 GiB: refused with what fits.
        (&["--shape", "llama-3-70b", "--nodes", "1"], "fits"),
        (
            &["--shape", "llama-3.2-3b", "--layers", "1", "--threads", "0"],
            "0 is not in 1..=1024",
        ),
        (
            &["--endpoint", "http://127.0.0.1:9/v1", "--threads", "2"],
            "cannot be used with '--threads",
        ),
        // A synthetic model has no tokenizer: a prompt's text would be silently dropped.
        (
            &[
                "--shape",
                "llama-3.2-3b",
                "--layers",
                "1",
                "--prompt",
                "hello",
            ],
            "no tokenizer",
        ),
    ];
    for (args, want) in cases {
        let mut a = vec!["infer"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["--out", out.to_str().unwrap()]);
        let o = run(&a, Duration::from_secs(120));
        assert!(!o.status.success(), "{args:?}");
        let err = text(&o.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!out.exists(), "{args:?} wrote a result");
    }
}

/// `--context`: each depth filled, then a timed decode from there, on both splits; a depth
/// past the model's context, or with --endpoint, is refused in one line.
#[test]
fn context_depths_are_filled_then_decoded_on_both_splits() {
    let dir = tmpdir("decode-context");
    for (parallel, layers) in [("tp", "1"), ("pp", "2")] {
        let out = dir.join(format!("{parallel}.json"));
        let o = run(
            &[
                "infer",
                "--shape",
                "llama-3.2-3b",
                "--layers",
                layers,
                "--nodes",
                "2",
                "--parallel",
                parallel,
                "--max-tokens",
                "3",
                "--context",
                "0,48",
                "--no-verify",
                "--out",
                out.to_str().unwrap(),
            ],
            Duration::from_secs(300),
        );
        assert!(o.status.success(), "{parallel}: {}", text(&o.stderr));
        let stdout = text(&o.stdout);
        assert!(stdout.contains("context     48: filled in"), "{stdout}");
        let r = read_json(&out);
        let depths = r["results"]["by_context"].as_array().unwrap();
        assert_eq!(depths.len(), 2, "{depths:?}");
        assert_eq!(depths[0]["context"], 0);
        assert!(
            depths[0]["prefill_tokens_per_s"].is_null(),
            "nothing filled at 0"
        );
        assert_eq!(depths[1]["context"], 48);
        assert!(depths[1]["prefill_tokens_per_s"].as_f64().unwrap() > 0.0);
        for d in depths {
            assert!(d["decode_tokens_per_s"].as_f64().unwrap() > 0.0, "{d}");
            assert_eq!(d["generated_tokens"], 3);
        }
        let html = dir.join(format!("{parallel}.html"));
        let o = run(
            &[
                "report",
                out.to_str().unwrap(),
                "-o",
                html.to_str().unwrap(),
            ],
            Duration::from_secs(60),
        );
        assert!(o.status.success(), "{}", text(&o.stderr));
        let page = std::fs::read_to_string(&html).unwrap();
        assert!(
            page.contains("At context depth")
                && page.contains("Decode tokens/s against the context")
        );
    }
    let out = dir.join("bad.json");
    for (extra, want) in [
        (
            vec![
                "--shape",
                "llama-3.2-3b",
                "--layers",
                "1",
                "--nodes",
                "1",
                "--context",
                "200000",
            ],
            "exceed the model's context",
        ),
        (
            vec!["--shape", "llama-3.2-3b", "--context", "64", "--sweep"],
            "--sweep",
        ),
        (
            vec!["--shape", "llama-3.2-3b", "--context", "1,x"],
            "'x' is not a context depth",
        ),
    ] {
        let mut args = vec!["infer"];
        args.extend(extra.iter());
        args.extend(["--out", out.to_str().unwrap()]);
        let o = run(&args, Duration::from_secs(60));
        assert!(!o.status.success(), "{args:?}");
        let err = text(&o.stderr);
        assert!(err.contains(want), "want '{want}': {err}");
        assert!(!out.exists());
    }
}
