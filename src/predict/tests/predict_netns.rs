//! `tbbench predict` held to account: in the network lab (two namespaces joined by veth pairs
//! shaped with tc tbf to 2.5 and 10 Gbit/s) and over shared memory, link and coll measure each
//! network, the 2-rank tensor-parallel decode runs on each (three rounds, the lab's and shared
//! memory's in turn, so both meet the host in the same state), the fastest over shared memory
//! gives predict its computation, and predict says what the decode does on each network:
//! every prediction within ±20% of the best measured rate. Needs root for the lab (skips with the
//! reason printed). The lab's two "hosts" are namespaces of one machine, so its ranks share
//! that machine's cores and memory bandwidth: a 1-rank basis divided by two reads 15-35% above
//! what they reach (predict_cli covers that extrapolation on recorded figures).

#[path = "../../../runners/tests/netlab.rs"]
mod netlab;
#[path = "../../../runners/tests/support.rs"]
mod support;

use netlab::{netlab, Lab};
use std::path::Path;
use std::time::Duration;
use support::*;

const LIMIT: Duration = Duration::from_secs(300);
/// A synthetic shape small enough for this host: 2 of llama-3.2-3b's 28 layers.
const MODEL: [&str; 4] = ["--shape", "llama-3.2-3b", "--layers", "2"];
const OVER: &str = "tcp:10.71.0.0/24,tcp:10.72.0.0/24";

fn ok(args: &[&str]) {
    let o = run(args, LIMIT);
    assert!(o.status.success(), "{args:?}: {}", text(&o.stderr));
}

/// Every file's decode rate, by network label.
/// The "busy host" warnings (runners/src/others.rs) of every result file under `dir` (or of
/// `dir` itself, a file): other processes took a share of the cores while it ran.
fn busy(path: &Path) -> Vec<String> {
    let files: Vec<std::path::PathBuf> = if path.is_dir() {
        std::fs::read_dir(path)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension() == Some(std::ffi::OsStr::new("json")))
            .collect()
    } else {
        vec![path.to_path_buf()]
    };
    files
        .iter()
        .flat_map(|f| {
            read_json(f)["warnings"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|w| w.as_str().map(str::to_string))
        .filter(|w| w.starts_with("busy host"))
        .collect()
}

fn decode_rates(dir: &Path) -> Vec<(String, f64)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        if path.extension() != Some(std::ffi::OsStr::new("json")) {
            continue;
        }
        let r = read_json(&path);
        if r["suite"] == "decode" {
            v.push((
                r["network"]["label"].as_str().unwrap().to_string(),
                r["results"]["decode_tokens_per_s"].as_f64().unwrap(),
            ));
        }
    }
    v
}

#[test]
fn tensor_parallel_decode_predictions_hold_on_each_network() {
    let Some(_lab) = Lab::up("tbp") else {
        return;
    };
    let dir = tmpdir("predict-netns");
    let hosts = dir.join("hosts.json");
    std::fs::write(&hosts, netlab(&["hostfile", "tbp", "0"]).stdout).unwrap();
    let h = hosts.to_str().unwrap();
    let lab: [&str; 6] = ["--hostfile", h, "--rsh", "ip netns exec", "--over", OVER];
    let mut off = Vec::new();
    let mut quiet_attempts = 0;
    // Rates on two vCPUs shift with a neighbour's burst (the 1-rank basis and the 2-rank runs
    // are minutes apart, and an EPYC VM's 2-rank decodes read 15-25% below the basis in some
    // hours): retries absorb it; a model that is wrong fails every time. An attempt whose
    // runs record a busy host (other processes took a share of the cores: a build or another
    // test beside this one) tells nothing about the model and is not held to it.
    for attempt in 1..=3 {
        let figures = dir.join(format!("figures-{attempt}"));
        let measured = dir.join(format!("measured-{attempt}"));
        let (f, m) = (figures.to_str().unwrap(), measured.to_str().unwrap());
        std::fs::create_dir_all(&figures).unwrap();
        std::fs::create_dir_all(&measured).unwrap();
        // The networks: link and coll on each (the decode's all-reduce is 24 KiB of f64).
        let link = ["link", "--sizes", "8,16KiB,32KiB,1MiB", "--iters", "100"];
        let coll = [
            "coll",
            "--dtype",
            "f64",
            "--sizes",
            "16,16KiB,32KiB",
            "--iters",
            "30",
        ];
        ok(&[&link[..], &lab, &["--out", &format!("{f}/link")]].concat());
        ok(&[&coll[..], &lab, &["--out", &format!("{f}/coll")]].concat());
        let shm = ["--transport", "shm", "--nodes", "2"];
        ok(&[&link[..], &shm, &["--out", &format!("{f}/link-shm.json")]].concat());
        ok(&[&coll[..], &shm, &["--out", &format!("{f}/coll-shm.json")]].concat());
        // The computation: the 2-rank split on this machine, with the thread each lab rank
        // has, as the lab's ranks will share it.
        // The best of three, as the measured rates below are: one run on a shared host may
        // be slowed by a neighbour (a basis 40% slow put every prediction 40% low).
        let decode = ["infer", "--threads", "1", "--max-tokens", "24"];
        let tp = ["--parallel", "tp", "--no-verify"];
        let mut rates: Vec<(String, f64)> = Vec::new();
        for r in 1..=3 {
            std::fs::create_dir_all(measured.join(format!("shm-{r}"))).unwrap();
            ok(&[
                &decode[..],
                &MODEL,
                &tp,
                &lab,
                &["--out", &format!("{m}/lab-{r}")],
            ]
            .concat());
            ok(&[
                &decode[..],
                &MODEL,
                &tp,
                &shm,
                &["--out", &format!("{m}/shm-{r}/decode.json")],
            ]
            .concat());
            let mut this = decode_rates(&measured.join(format!("lab-{r}")));
            this.extend(decode_rates(&measured.join(format!("shm-{r}"))));
            assert_eq!(this.len(), 3, "{this:?}");
            for (label, rate) in this {
                match rates.iter_mut().find(|(l, _)| *l == label) {
                    Some(best) => best.1 = best.1.max(rate),
                    None => rates.push((label, rate)),
                }
            }
        }
        // The computation basis: the fastest decode over shared memory, measured in turn
        // with the lab's (back to back, three shared-memory decodes ran up to 20% faster than
        // the same three between the lab's).
        let basis = (1..=3)
            .map(|r| measured.join(format!("shm-{r}/decode.json")))
            .max_by(|a, b| {
                let rate = |p: &std::path::PathBuf| {
                    read_json(p)["results"]["decode_tokens_per_s"]
                        .as_f64()
                        .unwrap()
                };
                rate(a).total_cmp(&rate(b))
            })
            .unwrap();
        std::fs::copy(&basis, figures.join("decode-2.json")).unwrap();
        let json = dir.join(format!("predicted-{attempt}.json"));
        ok(&[
            &["predict", f][..],
            &MODEL,
            &[
                "--nodes",
                "2",
                "--json",
                json.to_str().unwrap(),
                "--out",
                &format!("{m}-predict.json"),
            ],
        ]
        .concat());
        let predicted = read_json(&json);
        let mut crowded = busy(&figures.join("decode-2.json"));
        for r in 1..=3 {
            crowded.extend(busy(&measured.join(format!("lab-{r}"))));
            crowded.extend(busy(&measured.join(format!("shm-{r}"))));
        }
        off.clear();
        for (label, rate) in &rates {
            let p = predicted["predictions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["label"] == label.as_str() && p["ranks"] == 2)
                .unwrap_or_else(|| panic!("no prediction for {label}: {predicted}"));
            let want = p["tokens_per_s"].as_f64().unwrap();
            eprintln!("{label}: predicted {want:.2} tokens/s, measured {rate:.2} (best of 3)");
            if (want - rate).abs() > 0.2 * rate {
                off.push(format!(
                    "{label}: predicted {want:.2} tokens/s, measured {rate:.2} ({p})"
                ));
            }
        }
        if off.is_empty() {
            // With the decodes among the inputs, each prediction stands beside its rate.
            let o = run(
                &[
                    &["predict", f, m][..],
                    &MODEL,
                    &["--nodes", "2", "--out", &format!("{m}-both.json")],
                ]
                .concat(),
                LIMIT,
            );
            assert!(o.status.success(), "{}", text(&o.stderr));
            let both = read_json(Path::new(&format!("{m}-both.json")));
            let beside = both["results"]["predictions"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|p| p["measured_tokens_per_s"].is_number())
                .count();
            assert_eq!(beside, 3, "{both}");
            return;
        }
        if !crowded.is_empty() {
            eprintln!("attempt {attempt}: not held to the model, the host was busy: {crowded:?}");
            continue;
        }
        quiet_attempts += 1;
        eprintln!("attempt {attempt}: {off:?}");
    }
    if quiet_attempts == 0 {
        skipped("every attempt ran on a busy host (other processes took a share of its cores): the predictions could not be held to the measured rates");
        return;
    }
    panic!("{off:#?}");
}
