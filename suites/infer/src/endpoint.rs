//! A run against a server: find the model, probe what the server accepts, warm up (and tune
//! the prompt length), measure each level, then print the table and write the result file.
//! Mistakes in the setup (unreachable server, unknown model, bad path) end the run at the
//! probe with one line; failures while measuring are counted and the run goes on.

use crate::figures::Level;
use crate::http::{self, FailKind, Url};
use crate::openai::{self, BodyOptions};
use crate::prompt::{self, Calibration};
use crate::request::{self, Record, Target, TokenSource};
use crate::server_tokenizer::Tokenizer;
use crate::{load, table, InferConfig};
use anyhow::{anyhow, bail, Context as _, Result};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tbbench_runners::{netinfo, sysinfo};
use tbbench_schema::{Check, Network, ResultFile, RunRecord, Tool};

/// `--find-max` doubles concurrency up to this.
const MAX_FIND_CONCURRENCY: usize = 256;

fn validate(c: &InferConfig) -> Result<()> {
    if c.prompt_tokens == 0 || c.max_tokens == 0 || c.requests == 0 {
        bail!("--prompt-tokens, --max-tokens and --requests must be at least 1");
    }
    if c.rate_per_s.is_none() && c.concurrency.is_empty() {
        bail!("--concurrency needs at least one level");
    }
    if let Some(r) = c.rate_per_s {
        // Arrival times are sums of gaps of about 1/rate seconds: bounded both ways.
        if !(r.is_finite() && (0.001..=100_000.0).contains(&r)) {
            bail!("--rate must be between 0.001 and 100000 requests per second, not {r}");
        }
    }
    if c.find_max && c.slo.is_none() {
        bail!("--find-max needs --slo (the targets a level must meet)");
    }
    if !(c.timeout_s.is_finite() && c.timeout_s > 0.0) {
        bail!("--timeout must be above zero");
    }
    Ok(())
}

/// The first model GET /models lists: what to ask for when `--model` is not given.
fn first_model(url: &Url, auth: Option<&str>, timeout: Duration) -> Result<String> {
    let mut headers = vec![("Accept", "application/json")];
    if let Some(a) = auth {
        headers.push(("Authorization", a));
    }
    let mut resp = http::send(url, "GET", "/models", &headers, b"", timeout)
        .map_err(|f| anyhow!("cannot reach {}: {f}", url_text(url)))?;
    if resp.status != 200 {
        let text = resp.text(8192);
        bail!(
            "GET {}/models answered {} ({}); name the model with --model",
            url_text(url),
            resp.status_text(),
            openai::error_body_message(&text)
        );
    }
    const MOST: usize = 1 << 20;
    let Some(text) = resp.whole_text(MOST) else {
        bail!(
            "GET {}/models answered more than {} MiB, far more than a list of models; name the model with --model",
            url_text(url),
            MOST >> 20
        );
    };
    let v: Value = serde_json::from_str(&text)
        .with_context(|| format!("GET {}/models did not answer JSON", url_text(url)))?;
    v.get("data")
        .and_then(|d| d.as_array())
        .and_then(|a| a.first())
        .and_then(|m| m.get("id"))
        .and_then(|i| i.as_str())
        .map(str::to_string)
        .ok_or_else(|| {
            anyhow!(
                "GET {}/models lists no model; name one with --model",
                url_text(url)
            )
        })
}

/// One unstreamed request's whole answer (warm-up where the stream has no usage).
fn whole_answer(target: &Target, body: &[u8]) -> Result<String, http::Failure> {
    let mut resp = target.post(body, &[])?;
    let text = resp.text(4 << 20);
    if resp.status != 200 {
        return Err(http::Failure::new(
            FailKind::Http(resp.status),
            format!(
                "{}: {}",
                resp.status_text(),
                openai::error_body_message(&text)
            ),
        ));
    }
    Ok(text)
}

fn url_text(url: &Url) -> String {
    format!("http://{}{}", url.authority(), url.base_path)
}

fn run_tag() -> String {
    let mut b = [0u8; 4];
    // Without randomness two runs would share prompt prefixes; the clock still differs.
    if getrandom::getrandom(&mut b).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos();
        b = t.to_le_bytes();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn describe_network(url: &Url, probe: &Record) -> Network {
    let Some((local, peer)) = probe.addrs else {
        return Network {
            transport: "http".into(),
            link_kind: "unknown".into(),
            label: format!("http {}", url.authority()),
            ..Default::default()
        };
    };
    let base = netinfo::network_of(netinfo::interface_for_addr(local.ip()).as_ref());
    Network {
        transport: "http".into(),
        label: format!(
            "http {} via {} ({})",
            url.authority(),
            base.interface.as_deref().unwrap_or("?"),
            base.link_kind
        ),
        addresses: vec![local.ip().to_string(), peer.to_string()],
        streams: None,
        congestion: None,
        ..base
    }
}

pub fn run(config: &InferConfig, tool: &Tool) -> Result<i32> {
    validate(config)?;
    if let Some(out) = &config.out {
        tbbench_schema::write::check_writable(out)?;
    } else {
        tbbench_schema::write::check_folder_writable(std::path::Path::new("results"))?;
    }
    let started = time::OffsetDateTime::now_utc();
    let url = Url::parse(&config.endpoint).map_err(|e| anyhow!(e))?;
    let auth = std::env::var(&config.api_key_env)
        .ok()
        .filter(|k| !k.is_empty())
        .map(|k| format!("Bearer {k}"));
    let timeout = Duration::from_secs_f64(config.timeout_s);
    let target = Target {
        url: &url,
        api: config.api,
        auth: auth.as_deref(),
        timeout,
        deadline: crate::request::request_deadline(timeout, config.max_tokens),
        max_tokens: config.max_tokens,
    };
    let model = match &config.model {
        Some(m) => m.clone(),
        None => first_model(&url, auth.as_deref(), timeout)?,
    };
    let tag = run_tag();
    let mut warnings: Vec<String> = Vec::new();
    let mut options = BodyOptions {
        api: config.api,
        model: &model,
        max_tokens: config.max_tokens.min(4),
        include_usage: true,
        ignore_eos: config.ignore_eos,
        temperature: config.temperature,
    };

    // The probe: is the server there, does it know the model, does it take stream_options.
    let probe_prompt = prompt::build(&format!("{tag}p"), 0, 8, config.seed);
    let mut probe = request::run(
        &target,
        &openai::body(&options, &probe_prompt),
        0,
        Instant::now(),
    );
    if matches!(probe.fail_kind, Some(FailKind::Http(400 | 422))) {
        let refusal = probe.error.clone().unwrap_or_default();
        options.include_usage = false;
        probe = request::run(
            &target,
            &openai::body(&options, &probe_prompt),
            0,
            Instant::now(),
        );
        if probe.ok {
            warnings.push(format!(
                "the server refused stream_options.include_usage ({refusal}); asked without it"
            ));
        }
    }
    if !probe.ok {
        bail!(
            "{}: the first request failed: {}",
            url_text(&url),
            probe.error.as_deref().unwrap_or("unknown failure")
        );
    }
    let network = describe_network(&url, &probe);
    // A stream that carries no count of its own: the server's tokenizer counts its text.
    let tokenizer = (probe.token_source == Some(TokenSource::Chunks))
        .then(|| Tokenizer::probe(&url, &model, auth.as_deref(), timeout))
        .flatten();

    // Warm-up: full-size requests, untimed; their prompt token counts tune the word count.
    options.max_tokens = config.max_tokens;
    let mut words = prompt::initial_words(config.prompt_tokens);
    let mut calibration = Calibration::default();
    let mut calibrated = false;
    let stream_counts_prompt = probe.prompt_tokens.is_some();
    for i in 0..config.warmup {
        let body = openai::body(
            &options,
            &prompt::build(&format!("{tag}w"), i, words, config.seed),
        );
        let counted = if stream_counts_prompt {
            let r = request::run(&target, &body, i, Instant::now());
            r.prompt_tokens.ok_or(r.error)
        } else {
            whole_answer(&target, &openai::unstreamed(&body))
                .map_err(|e| Some(e.to_string()))
                .and_then(|a| openai::answer_prompt_tokens(&a).ok_or(None))
        };
        match counted {
            Ok(p) => {
                calibration.observe(words, p);
                words = calibration.next_words(config.prompt_tokens, words);
                calibrated = true;
            }
            Err(None) => {}
            Err(Some(e)) => warnings.push(format!("warm-up request {} failed: {e}", i + 1)),
        }
    }
    if !calibrated {
        warnings.push(format!(
            "the prompt length was not measured (the server reported no prompt_tokens in \
             warm-up): {words} words sent for --prompt-tokens {}",
            config.prompt_tokens
        ));
    }

    println!(
        "infer: {} model {model}, {} API, prompt ~{} tokens ({words} words), up to {} output tokens, {} requests per level",
        url_text(&url),
        match config.api {
            openai::Api::Chat => "chat",
            openai::Api::Completions => "completions",
        },
        config.prompt_tokens,
        config.max_tokens,
        config.requests
    );
    println!("{}", table::header());
    let make_body = |i: u64| openai::body(&options, &prompt::build(&tag, i, words, config.seed));
    let mut levels = Vec::new();
    let mut first_index = 0;
    let mut measure = |conc: Option<usize>, rate: Option<f64>| -> Level {
        let (records, lags) = match (conc, rate) {
            (_, Some(r)) => load::open(
                &target,
                r,
                config.requests,
                first_index,
                config.seed,
                &make_body,
            ),
            (Some(c), None) => (
                // A level holds at least two requests per worker, so its figures are not
                // only the workers' first requests.
                load::closed(
                    &target,
                    c,
                    if config.find_max {
                        config.requests.max(2 * c as u64)
                    } else {
                        config.requests
                    },
                    first_index,
                    &make_body,
                ),
                vec![],
            ),
            (None, None) => unreachable!("a level is a concurrency or a rate"),
        };
        first_index += records.len() as u64;
        let records = match &tokenizer {
            Some(t) => recount(t, records),
            None => records,
        };
        let mut level = Level::new(conc, rate, records, lags);
        level.goodput = config.slo.as_ref().map(|s| s.goodput(&level));
        println!("{}", table::row(&level));
        if let Some(g) = &level.goodput {
            println!("{}", table::goodput_line(g));
        }
        level
    };
    if let Some(slo) = &config.slo {
        println!("SLO: {}", slo.describe());
    }
    let max_within_slo = if config.find_max {
        // From the first level given: the highest load whose level meets the SLO.
        let (integer, first, limit) = match config.rate_per_s {
            Some(r) => (false, r, 100_000.0),
            None => (
                true,
                config.concurrency[0] as f64,
                MAX_FIND_CONCURRENCY as f64,
            ),
        };
        let mut probes: Vec<(f64, bool)> = Vec::new();
        let mut load = Some(first);
        while let Some(x) = load {
            let level = if integer {
                measure(Some(x as usize), None)
            } else {
                measure(None, Some(x))
            };
            probes.push((x, level.goodput.is_some_and(|g| g.met)));
            levels.push(level);
            load = crate::slo::next_probe(&probes, integer, limit);
        }
        let best = probes
            .iter()
            .filter(|p| p.1)
            .map(|p| p.0)
            .fold(f64::NAN, f64::max);
        let what = if integer { "concurrency" } else { "rate_per_s" };
        let found = (!best.is_nan()).then_some(best);
        match found {
            Some(b) => println!(
                "find-max: the highest {} meeting the SLO is {b}{} ({} probes)",
                if integer {
                    "concurrency"
                } else {
                    "arrival rate"
                },
                if integer { "" } else { "/s" },
                probes.len()
            ),
            None => println!(
                "find-max: no load met the SLO, down to {}{}",
                probes.iter().map(|p| p.0).fold(f64::INFINITY, f64::min),
                if integer {
                    " concurrent request"
                } else {
                    " requests/s"
                }
            ),
        }
        Some(json!({
            "by": what,
            "value": found,
            "reason": if found.is_none() { Some("no load tried met the SLO") } else { None },
            "probes": probes.iter().map(|(x, met)| json!({what: x, "met": met})).collect::<Vec<_>>(),
        }))
    } else {
        let plan: Vec<(Option<usize>, Option<f64>)> = match config.rate_per_s {
            Some(r) => vec![(None, Some(r))],
            None => config
                .concurrency
                .iter()
                .map(|&c| (Some(c), None))
                .collect(),
        };
        for (conc, rate) in plan {
            levels.push(measure(conc, rate));
        }
        None
    };

    warnings.extend(level_warnings(config, &levels));
    let total: u64 = levels.iter().map(|l| l.requests).sum();
    let failed: u64 = levels.iter().map(|l| l.failed).sum();
    let mut kinds: std::collections::BTreeMap<String, u64> = Default::default();
    for l in &levels {
        for (k, n) in &l.failures {
            *kinds.entry(k.clone()).or_default() += n;
        }
    }
    let kinds_text = kinds
        .iter()
        .map(|(k, n)| format!("{n} {k}"))
        .collect::<Vec<_>>()
        .join(", ");
    let checks = vec![Check {
        name: "requests completed".into(),
        passed: failed == 0,
        detail: if failed == 0 {
            format!("{total} of {total} requests completed")
        } else {
            format!("{failed} of {total} requests failed: {kinds_text}")
        },
    }];
    let source = levels.iter().filter_map(|l| l.token_source).max();
    let results = json!({
        "endpoint": url_text(&url),
        "model": model,
        "api": config.api,
        "run_tag": tag,
        "stream_usage": options.include_usage,
        "token_source": source,
        "token_counter": tokenizer.as_ref().map(Tokenizer::name),
        "tokens_approximate": source == Some(TokenSource::Chunks),
        "prompt": {
            "target_tokens": config.prompt_tokens,
            "words": words,
            "calibrated": calibrated,
        },
        "levels": levels,
        "slo": config.slo,
        "max_within_slo": max_within_slo,
    });
    let mut params = serde_json::to_value(config)?;
    if let Some(p) = params.as_object_mut() {
        p.insert("model".into(), json!(model));
        // Whether a key was sent, never the key.
        p.insert("api_key_set".into(), json!(auth.is_some()));
    }
    let mut host = sysinfo::this_host();
    host.ranks = vec![0];
    let result = ResultFile::finished(
        tool,
        started,
        RunRecord {
            suite: "infer".into(),
            params,
            ranks: vec![host.hostname.clone()],
            hosts: vec![host],
            network,
            results,
            checks,
            warnings: warnings.clone(),
        },
    );
    for w in &warnings {
        eprintln!("tbbench: warning: {w}");
    }
    let path =
        tbbench_schema::write::write_result_out(config.out.as_deref(), "infer", started, &result)?;
    println!("result: {}", path.display());
    if failed > 0 {
        eprintln!(
            "tbbench: error: {failed} of {total} requests failed ({kinds_text}); the result file records each"
        );
        return Ok(1);
    }
    Ok(0)
}

/// Requests counted by their chunks get the server tokenizer's count of their text instead,
/// once the level is done (never while it is timed).
fn recount(t: &Tokenizer, mut records: Vec<Record>) -> Vec<Record> {
    for r in records.iter_mut() {
        if r.ok && r.token_source == Some(TokenSource::Chunks) {
            if let Some(n) = t.count(&r.text) {
                r.set_tokens(n, TokenSource::Tokenizer);
            }
        }
    }
    records
}

fn level_warnings(config: &InferConfig, levels: &[Level]) -> Vec<String> {
    let mut w = Vec::new();
    if levels.iter().any(|l| l.tokens_approximate) {
        w.push(
            "token counts are approximate: the server sent no usage and no timings, so \
             text-bearing chunks were counted (a chunk may hold several tokens)"
                .into(),
        );
    }
    let all = |f: fn(&Level) -> Option<f64>| -> Option<f64> {
        let v: Vec<f64> = levels.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    if let Some(p) = all(|l| l.prompt_tokens.map(|d| d.median)) {
        let target = config.prompt_tokens as f64;
        if (p - target).abs() > 0.1 * target {
            w.push(format!(
                "prompts were {p:.0} tokens (median), not the {target} asked for"
            ));
        }
    }
    if let Some(o) = all(|l| l.output_tokens_per_request.map(|d| d.median)) {
        if o < 0.9 * config.max_tokens as f64 {
            w.push(format!(
                "answers were {o:.0} tokens (median) of --max-tokens {}: the model stopped \
                 early, so TPOT and tokens/s cover fewer tokens{}",
                config.max_tokens,
                if config.ignore_eos {
                    ""
                } else {
                    " (--ignore-eos asks servers that know it to go on)"
                }
            ));
        }
    }
    for l in levels {
        if let Some(lag) = l.dispatch_lag_ms.filter(|d| d.p99 > 10.0) {
            w.push(format!(
                "{}: requests started up to {:.1} ms (p99) behind their Poisson schedule",
                l.name(),
                lag.p99
            ));
        }
    }
    w
}
