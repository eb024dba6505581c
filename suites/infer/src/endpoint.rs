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
use crate::workload::{self, Lengths, Prompts, Workload};
use crate::{load, sweep, table, InferConfig};
use anyhow::{anyhow, bail, Context as _, Result};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};
use tbbench_runners::{netinfo, sysinfo};
use tbbench_schema::{Check, Network, ResultFile, RunRecord, Tool};

/// `--find-max` doubles concurrency up to this.
const MAX_FIND_CONCURRENCY: usize = 256;

fn validate(c: &InferConfig) -> Result<()> {
    if c.requests == 0 {
        bail!("--requests must be at least 1");
    }
    // The flags refuse these combinations; a config built in code is held to them too.
    let open_loop = c.rate_per_s.is_some() || (c.sweep.is_some() && c.concurrency.len() <= 1);
    if c.multi_turn && (c.dataset.is_none() || open_loop) {
        bail!("--multi-turn replays a --dataset's conversations in a closed loop (--concurrency), not with --rate or a rate --sweep");
    }
    if !c.context.is_empty() && (c.sweep.is_some() || c.find_max || c.dataset.is_some()) {
        bail!(
            "--context sets each level's prompt length: not with --sweep, --find-max or --dataset"
        );
    }
    if c.sweep.is_some() && (c.find_max || c.rate_per_s.is_some()) {
        bail!("--sweep picks its own loads: not with --rate or --find-max");
    }
    if c.sweep.is_some() && c.requests < 2 {
        bail!("--sweep needs --requests of 2 or more: with one, one at a time and all at once are the same level");
    }
    if !c.context.is_empty() && c.shared_prefix.is_some() {
        bail!("--context sets each prompt's whole length: not with --shared-prefix");
    }
    // A level's prompts are built before it starts: bounded before any is.
    let longest = c
        .context
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
        .max(c.prompt_tokens.max() + c.shared_prefix.unwrap_or(0));
    let bytes = longest as f64 * 8.0 * c.requests as f64;
    if c.dataset.is_none() && bytes > (4u64 << 30) as f64 {
        bail!(
            "{} requests of up to {longest} prompt tokens would hold {:.0} GiB of prompts at once: ask for fewer requests or shorter prompts",
            c.requests,
            bytes / (1u64 << 30) as f64
        );
    }
    if !(c.ramp_up_s.is_finite() && (0.0..=3600.0).contains(&c.ramp_up_s)) {
        bail!("--ramp-up must be at most an hour");
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

/// The server's count of an untimed request's prompt tokens: from the stream where it carries
/// one, else from the same request unstreamed. Err(Some) names a failure; Err(None) is a
/// server that counted nothing.
fn prompt_count(target: &Target, body: &[u8], in_stream: bool) -> Result<u64, Option<String>> {
    if in_stream {
        let r = request::run(target, body, 0, Instant::now());
        r.prompt_tokens.ok_or(r.error)
    } else {
        whole_answer(target, &openai::unstreamed(body))
            .map_err(|e| Some(e.to_string()))
            .and_then(|a| openai::answer_prompt_tokens(&a).ok_or(None))
    }
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

/// One level to measure: a concurrency (closed loop) or a rate (open loop), and where it sits
/// in a sweep or a depth list.
#[derive(Debug, Clone, Copy, Default)]
struct Plan {
    concurrency: Option<usize>,
    rate: Option<f64>,
    sweep: Option<&'static str>,
    context: Option<u64>,
}

impl Plan {
    fn closed(c: usize) -> Plan {
        Plan {
            concurrency: Some(c),
            ..Default::default()
        }
    }
    fn open(r: f64) -> Plan {
        Plan {
            rate: Some(r),
            ..Default::default()
        }
    }
    fn role(self, sweep: &'static str) -> Plan {
        Plan {
            sweep: Some(sweep),
            ..self
        }
    }
}

/// Measures levels one after another against one target and workload.
struct Runner<'a> {
    config: &'a InferConfig,
    target: &'a Target<'a>,
    workload: Workload<'a>,
    tokenizer: Option<Tokenizer>,
    stream_counts_prompt: bool,
    /// The next request's index: unique over the run, so no two share a prompt.
    first_index: u64,
    warnings: Vec<String>,
}

impl Runner<'_> {
    fn measure(&mut self, plan: Plan) -> Level {
        let c = self.config;
        self.workload.context = plan.context;
        let workload = &self.workload;
        let make_body = |i: u64| workload.body(i);
        let ramp = c.ramp_up_s;
        let (records, lags, stopped) = match (plan.concurrency, plan.rate) {
            (_, Some(r)) => {
                let o = load::open(
                    self.target,
                    c.arrivals,
                    r,
                    c.requests,
                    self.first_index,
                    c.seed,
                    ramp,
                    &make_body,
                );
                (o.records, o.lags_ms, o.stopped)
            }
            (Some(conc), None) => {
                // A level holds at least two requests per worker, so its figures are not
                // only the workers' first requests.
                let n = if c.find_max {
                    c.requests.max(2 * conc as u64)
                } else {
                    c.requests
                };
                let records = if c.multi_turn {
                    load::closed_conversations(
                        self.target,
                        conc,
                        n,
                        self.first_index,
                        ramp,
                        &|k| workload.conversation_of(k),
                        &|conv| workload.turns_of(conv),
                        &|i, tag, conv, turn, answers| {
                            workload.turn_body(i, tag, conv, turn, answers)
                        },
                    )
                } else {
                    load::closed(self.target, conc, n, self.first_index, ramp, &make_body)
                };
                (records, vec![], None)
            }
            (None, None) => unreachable!("a level is a concurrency or a rate"),
        };
        self.first_index += records.len() as u64 + stopped.as_ref().map_or(0, |s| s.not_sent);
        let mut records = match &self.tokenizer {
            Some(t) => recount(t, records),
            None => records,
        };
        // A server that counts no prompt: the length its words were tuned to, marked so.
        let mut estimated = false;
        for r in records
            .iter_mut()
            .filter(|r| r.ok && r.prompt_tokens.is_none())
        {
            r.prompt_tokens = self.workload.prompt_target(r.index);
            estimated |= r.prompt_tokens.is_some();
        }
        let mut level = Level::new(plan.concurrency, plan.rate, records, lags);
        level.prompt_tokens_estimated = estimated;
        level.sweep = plan.sweep;
        level.context = plan.context;
        if plan.rate.is_some() {
            level.arrivals = Some(c.arrivals);
        }
        level.stopped = stopped;
        level.goodput = c.slo.as_ref().map(|s| s.goodput(&level));
        println!("{}", table::row(&level));
        if let Some(g) = &level.goodput {
            println!("{}", table::goodput_line(g));
        }
        if let Some(s) = &level.stopped {
            println!(
                "{:<16} stopped sending after {:.1} s with {} requests in flight ({}); {} not sent",
                "", s.at_s, s.in_flight, s.reason, s.not_sent
            );
        }
        level
    }

    /// Before the levels of one `--context` depth: an untimed request of that depth, whose
    /// prompt count tunes the words for it (and warms the server to that length).
    fn calibrate_depth(&mut self, depth: u64, options: &BodyOptions) {
        if depth == 0 {
            return;
        }
        let Prompts::Synthetic {
            calibration, words, ..
        } = &mut self.workload.prompts
        else {
            return;
        };
        let w = calibration.next_words(depth, *words);
        let o = BodyOptions {
            max_tokens: 1,
            ..*options
        };
        let body = openai::body(
            &o,
            &prompt::build(
                &format!("{}d", self.workload.tag),
                depth,
                w,
                self.config.seed,
            ),
        );
        match prompt_count(self.target, &body, self.stream_counts_prompt) {
            Ok(p) => calibration.observe(w, p),
            Err(e) => self.warnings.push(format!(
                "the untimed request of context {depth} {}: its prompts are as long as the warm-up's count of words per token makes them",
                match e {
                    Some(e) => format!("failed ({e})"),
                    None => "reported no prompt_tokens".into(),
                }
            )),
        }
    }
}

pub fn run(config: &InferConfig, tool: &Tool) -> Result<i32> {
    validate(config)?;
    if let Some(out) = &config.out {
        tbbench_schema::write::check_writable(out)?;
    } else {
        tbbench_schema::write::check_folder_writable(std::path::Path::new("results"))?;
    }
    if let Some(p) = &config.requests_out {
        crate::export::format_of(p)?;
        tbbench_schema::write::check_writable(p)?;
        if let Some(out) = &config.out {
            tbbench_schema::write::refuse_same_output(("--out", out), ("--requests-out", p))?;
        }
    }
    // A bad dataset ends the run before any request.
    let dataset = config
        .dataset
        .as_deref()
        .map(workload::read_dataset)
        .transpose()?;
    let started = time::OffsetDateTime::now_utc();
    let url = Url::parse(&config.endpoint).map_err(|e| anyhow!(e))?;
    let auth = std::env::var(&config.api_key_env)
        .ok()
        .filter(|k| !k.is_empty())
        .map(|k| format!("Bearer {k}"));
    let timeout = Duration::from_secs_f64(config.timeout_s);
    let most_tokens = config.max_tokens.max();
    let target = Target {
        url: &url,
        api: config.api,
        auth: auth.as_deref(),
        timeout,
        deadline: crate::request::request_deadline(timeout, most_tokens),
        max_tokens: most_tokens,
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
        max_tokens: most_tokens.min(4),
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

    // A prefix every prompt starts with, made once for the run.
    let shared_prefix = config.shared_prefix.map(|n| {
        (
            prompt::build(
                &format!("{tag}s"),
                0,
                prompt::initial_words(n + 12),
                config.seed,
            ),
            n,
        )
    });
    let with_prefix = |p: String| match &shared_prefix {
        Some((s, _)) => format!("{s}\n\n{p}"),
        None => p,
    };

    // Warm-up: full-size requests, untimed; their prompt token counts tune the word count.
    options.max_tokens = config.max_tokens.fixed().unwrap_or(most_tokens);
    let prompt_target =
        config.prompt_tokens.mean().round() as u64 + shared_prefix.as_ref().map_or(0, |p| p.1);
    let mut words = prompt::initial_words(prompt_target);
    let mut calibration = Calibration::default();
    let mut calibrated = false;
    let stream_counts_prompt = probe.prompt_tokens.is_some();
    for i in 0..config.warmup {
        let text = match &dataset {
            Some(d) => format!("[{tag}w-{i}] {}", d[i as usize % d.len()].turns[0].user),
            None => prompt::build(&format!("{tag}w"), i, words, config.seed),
        };
        let body = openai::body(&options, &with_prefix(text));
        match prompt_count(&target, &body, stream_counts_prompt) {
            Ok(p) => {
                if dataset.is_none() {
                    calibration.observe(words, p);
                    words = calibration.next_words(prompt_target, words);
                }
                calibrated = true;
            }
            Err(None) => {}
            Err(Some(e)) => warnings.push(format!("warm-up request {} failed: {e}", i + 1)),
        }
    }
    if !calibrated && dataset.is_none() {
        warnings.push(format!(
            "the prompt length was not measured (the server reported no prompt_tokens in \
             warm-up): {words} words sent for --prompt-tokens {}",
            prompt_target
        ));
    }

    let prompts_text = match (&dataset, config.prompt_tokens.fixed()) {
        (Some(d), _) => format!(
            "prompts from {} ({} conversations{})",
            config
                .dataset
                .as_deref()
                .unwrap_or(Path::new("?"))
                .display(),
            d.len(),
            if config.multi_turn {
                ", turn by turn"
            } else {
                ""
            }
        ),
        (None, Some(p)) if config.context.is_empty() => {
            format!(
                "prompt ~{p} tokens ({words} word{})",
                if words == 1 { "" } else { "s" }
            )
        }
        (None, Some(_)) => "prompts of each context depth".to_string(),
        (None, None) => format!(
            "prompts of {} tokens",
            serde_json::to_value(config.prompt_tokens)?
                .as_str()
                .unwrap_or("?")
        ),
    };
    println!(
        "infer: {} model {model}, {} API, {prompts_text}{}, up to {} output tokens, {} requests per level",
        url_text(&url),
        match config.api {
            openai::Api::Chat => "chat",
            openai::Api::Completions => "completions",
        },
        match &shared_prefix {
            Some((_, n)) => format!(" after a shared prefix of ~{n} tokens"),
            None => String::new(),
        },
        match config.max_tokens {
            Lengths::Fixed(n) => n.to_string(),
            other => serde_json::to_value(other)?
                .as_str()
                .unwrap_or("?")
                .to_string(),
        },
        config.requests
    );
    if let Some(slo) = &config.slo {
        println!("SLO: {}", slo.describe());
    }
    println!("{}", table::header());
    let mut runner = Runner {
        config,
        target: &target,
        workload: Workload {
            options,
            tag: tag.clone(),
            seed: config.seed,
            prompts: match dataset {
                Some(d) => Prompts::Dataset(d),
                None => Prompts::Synthetic {
                    lengths: config.prompt_tokens,
                    calibration,
                    words,
                },
            },
            output: config.max_tokens,
            shared_prefix,
            context: None,
        },
        tokenizer,
        stream_counts_prompt,
        first_index: 0,
        warnings: Vec::new(),
    };
    let mut levels: Vec<Level> = Vec::new();
    let base_plans: Vec<Plan> = match config.rate_per_s {
        Some(r) => vec![Plan::open(r)],
        None => config
            .concurrency
            .iter()
            .map(|&c| Plan::closed(c))
            .collect(),
    };
    let mut knee = None;
    let mut max_within_slo = None;
    if config.find_max {
        max_within_slo = Some(find_max(config, &mut runner, &mut levels));
    } else if let Some(n) = config.sweep {
        let k = if config.concurrency.len() > 1 {
            for p in &base_plans {
                levels.push(runner.measure(*p));
            }
            sweep::knee(&levels.iter().collect::<Vec<_>>(), "concurrency")
        } else {
            let sync = runner.measure(Plan::closed(1).role("synchronous"));
            let all_at_once = (config.requests as usize).min(crate::MAX_CONCURRENCY);
            let most = runner.measure(Plan::closed(all_at_once).role("throughput"));
            let (low, high) = (sweep::offered_rate(&sync), sweep::offered_rate(&most));
            let mut between = Vec::new();
            match sweep::rates_between(low, high, n) {
                Some(rates) => {
                    for r in rates {
                        between.push(runner.measure(Plan::open(r).role("constant")));
                    }
                }
                None if sync.ok == 0 || most.ok == 0 => runner.warnings.push(
                    "a sweep level completed no request, so the sweep has no rates between".into(),
                ),
                None => runner.warnings.push(format!(
                    "every request at once ended {high:.3} requests/s, no more than one at a time ({low:.3}/s): the server serves one request at a time, so the sweep has no rates between"
                )),
            }
            levels.push(sync);
            levels.extend(between);
            levels.push(most);
            sweep::knee(&levels.iter().collect::<Vec<_>>(), "rate_per_s")
        };
        match (&k.level, &k.broke, &k.reason) {
            (Some(l), Some(b), _) => println!("knee: {l} (then {b})"),
            (_, _, Some(r)) => println!("knee: none: {r}"),
            _ => {}
        }
        knee = Some(k);
    } else if !config.context.is_empty() {
        for &d in &config.context {
            runner.calibrate_depth(d, &options);
            for p in &base_plans {
                levels.push(runner.measure(Plan {
                    context: Some(d),
                    ..*p
                }));
            }
        }
    } else {
        for p in &base_plans {
            levels.push(runner.measure(*p));
        }
    }
    warnings.append(&mut runner.warnings);
    let Runner {
        workload,
        tokenizer,
        ..
    } = runner;

    warnings.extend(level_warnings(config, &workload, &levels));
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
    let by_context: Vec<Value> = levels
        .iter()
        .filter_map(|l| {
            let median = |d: &Option<tbbench_schema::Summary>| d.as_ref().map(|s| s.median);
            Some(json!({
                "context": l.context?,
                "level": l.name(),
                "prompt_tokens": median(&l.prompt_tokens),
                "ttft_ms": median(&l.ttft_ms),
                "prefill_tokens_per_s": median(&l.prefill_tokens_per_s),
                "tpot_ms": median(&l.tpot_ms),
                "decode_tokens_per_s": median(&l.decode_tokens_per_s),
            }))
        })
        .collect();
    let results = json!({
        "endpoint": url_text(&url),
        "model": model,
        "api": config.api,
        "run_tag": tag,
        "stream_usage": workload.options.include_usage,
        "token_source": source,
        "token_counter": tokenizer.as_ref().map(Tokenizer::name),
        "tokens_approximate": source == Some(TokenSource::Chunks),
        "prompt": {
            "target_tokens": config.prompt_tokens,
            "words": words,
            "calibrated": calibrated,
            "shared_prefix_tokens": config.shared_prefix,
            "dataset": config.dataset.as_ref().map(|p| p.display().to_string()),
            "conversations": matches!(workload.prompts, Prompts::Dataset(_)).then(|| workload.conversations()),
            "multi_turn": config.multi_turn,
        },
        "levels": levels,
        "slo": config.slo,
        "max_within_slo": max_within_slo,
        "knee": knee,
        "by_context": (!by_context.is_empty()).then_some(by_context),
    });
    let mut params = serde_json::to_value(config)?;
    if let Some(p) = params.as_object_mut() {
        p.insert("model".into(), json!(model));
        // Whether a key was sent, never the key.
        p.insert("api_key_set".into(), json!(auth.is_some()));
    }
    let mut host = sysinfo::this_host();
    host.ranks = vec![0];
    if let Some(p) = &config.requests_out {
        crate::export::write(p, &levels)?;
        println!("requests: {}", p.display());
    }
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

/// `--find-max`: from the first level given, the highest load whose level meets the SLO.
fn find_max(config: &InferConfig, runner: &mut Runner, levels: &mut Vec<Level>) -> Value {
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
            runner.measure(Plan::closed(x as usize))
        } else {
            runner.measure(Plan::open(x))
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
    json!({
        "by": what,
        "value": found,
        "reason": if found.is_none() { Some("no load tried met the SLO") } else { None },
        "probes": probes.iter().map(|(x, met)| json!({what: x, "met": met})).collect::<Vec<_>>(),
    })
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

fn level_warnings(config: &InferConfig, workload: &Workload, levels: &[Level]) -> Vec<String> {
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
    let synthetic = matches!(workload.prompts, Prompts::Synthetic { .. });
    let shared = config.shared_prefix.unwrap_or(0) as f64;
    if synthetic && config.context.is_empty() {
        if let Some(p) = all(|l| l.prompt_tokens.map(|d| d.median)) {
            let target = config.prompt_tokens.mean() + shared;
            if (p - target).abs() > 0.1 * target {
                w.push(format!(
                    "prompts were {p:.0} tokens (median), not the {target} asked for"
                ));
            }
        }
    }
    // Each depth's prompts against that depth (0 is the instruction alone).
    for l in levels {
        if let (Some(d), Some(p)) = (l.context.filter(|&d| d > 0), &l.prompt_tokens) {
            if (p.median - d as f64).abs() > 0.1 * d as f64 {
                w.push(format!(
                    "{}: prompts were {:.0} tokens (median), not the {d} asked for",
                    l.name(),
                    p.median
                ));
            }
        }
    }
    // Answers a dataset asks for are as long as its answers were: no stop to warn of.
    if let (true, Some(o)) = (
        synthetic,
        all(|l| l.output_tokens_per_request.map(|d| d.median)),
    ) {
        if o < 0.9 * config.max_tokens.mean() {
            w.push(format!(
                "answers were {o:.0} tokens (median) of --max-tokens {}: the model stopped \
                 early, so TPOT and tokens/s cover fewer tokens{}",
                serde_json::to_value(config.max_tokens).unwrap_or_default(),
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
                "{}: requests started up to {:.1} ms (p99) behind their schedule",
                l.name(),
                lag.p99
            ));
        }
    }
    w
}
