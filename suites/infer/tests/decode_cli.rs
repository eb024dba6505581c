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
