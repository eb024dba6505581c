//! `tbbench doctor`: a preflight before a long run, over the same ranks and network the run
//! will use. Every rank reports its host (the interface its data uses, routes to the peers,
//! RDMA devices, build, BLAS, free memory, `tbbench env`'s problems); every pair of hosts is
//! timed briefly; rank 0 holds the figures against the interfaces' claims, the other pairs and
//! the planned run, and names each problem on one line with what to do.

pub mod cli;
pub mod facts;
pub mod judge;
pub mod timing;
pub mod view;

use anyhow::{Context as _, Result};
use judge::{Pair, Plan, Problem};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use tbbench_runners::suite::{Context, Suite, SuiteOutput};
use tbbench_schema::{Check, Tool};

#[derive(Debug, Clone, Serialize)]
pub struct DoctorConfig {
    /// The speed every link should reach, bit/s (`--ceiling`); default: what each interface
    /// reports.
    pub ceiling_bits_per_s: Option<f64>,
    /// The planned hpl run's N (`--hpl-n`): each host must hold its ranks' share of 8·N² bytes.
    pub hpl_n: Option<u64>,
    /// Free memory every host must have for the planned run (`--memory`).
    pub memory_bytes: Option<u64>,
    /// Where `--json` writes the problems and pairs.
    pub json: Option<PathBuf>,
    /// This rank's own build (each rank parses its own command line, so a host with another
    /// tbbench says so); the result file's `tool` already records rank 0's.
    #[serde(skip)]
    pub tool: Tool,
}

impl DoctorConfig {
    fn plan(&self) -> Plan {
        Plan {
            ceiling_bits_per_s: self.ceiling_bits_per_s,
            hpl_n: self.hpl_n,
            memory_bytes: self.memory_bytes,
        }
    }
}

/// The result file's `results`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DoctorResults {
    pub problems: Vec<Problem>,
    pub pairs: Vec<Pair>,
    /// What each host reported (its first rank's facts).
    pub hosts: Vec<facts::RankFacts>,
    /// How each pair was timed.
    pub timing: serde_json::Value,
    /// Why no figure says anything about a link between hosts, where none does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// What `--json` writes: the problems and the pairs, of one network or of every network of
/// `--over`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Findings {
    pub problems: Vec<Problem>,
    pub pairs: Vec<serde_json::Value>,
}

pub struct DoctorSuite;

impl Suite for DoctorSuite {
    const NAME: &'static str = "doctor";
    type Config = DoctorConfig;
    /// One connection: each pair's check is a one-way burst, which gains nothing from a second
    /// connection's pacing timers (as `tbbench link`).
    const STREAMS_WHEN_PACED: usize = 1;

    /// Runs on any cabling: it times the pairs that have a cable and names the ones the
    /// hostfile's backend needs and lacks.
    fn needs_every_pair(_config: &DoctorConfig) -> bool {
        false
    }

    fn run(config: &DoctorConfig, ctx: &mut Context) -> Result<Option<SuiteOutput>> {
        let mine = facts::gather(ctx, &config.tool);
        let gathered = ctx.comm.gather(0, &serde_json::to_vec(&mine)?)?;
        let all: Vec<facts::RankFacts> = match gathered {
            Some(parts) => parts
                .iter()
                .enumerate()
                .map(|(r, b)| {
                    serde_json::from_slice(b)
                        .with_context(|| format!("rank {r} sent facts that do not parse"))
                })
                .collect::<Result<_>>()?,
            None => vec![],
        };
        // Rank 0 knows every rank's host, so it picks the pairs and tells the others. Over
        // links, only the pairs with a cable (the others' absence is a problem of its own).
        let unlinked: Vec<[usize; 2]> = ctx
            .network
            .topology
            .as_ref()
            .map(|t| t.unlinked.clone())
            .unwrap_or_default();
        let pairs = if ctx.rank() == 0 {
            let mut p = judge::pairs_of(&judge::endpoints(&all));
            p.retain(|pair| !unlinked.contains(pair));
            p
        } else {
            vec![]
        };
        let pairs = share_pairs(ctx, &pairs)?;
        let mut timed = Vec::new();
        for &[a, b] in &pairs {
            if ctx.rank() == a {
                timed.push(timing::initiator(&mut ctx.comm, a, b)?);
            } else if ctx.rank() == b {
                timing::responder(&mut ctx.comm, a)?;
            }
            // The ranks outside this pair wait here until it is done.
            ctx.comm.barrier_patient()?;
        }
        let gathered = ctx.comm.gather(0, &serde_json::to_vec(&timed)?)?;
        let Some(parts) = gathered else {
            return Ok(None);
        };
        let mut timed: Vec<timing::Timed> = Vec::new();
        for (r, b) in parts.iter().enumerate() {
            let t: Vec<timing::Timed> = serde_json::from_slice(b)
                .with_context(|| format!("rank {r} sent timings that do not parse"))?;
            timed.extend(t);
        }
        timed.sort_by_key(|t| t.ranks);
        Ok(Some(verdict(config, ctx, &all, &timed)?))
    }
}

/// Rank 0's pair list to every rank: a count, then the ranks.
fn share_pairs(ctx: &mut Context, pairs: &[[usize; 2]]) -> Result<Vec<[usize; 2]>> {
    let mut count = (pairs.len() as u64).to_le_bytes();
    ctx.comm.bcast(0, &mut count)?;
    let n = u64::from_le_bytes(count) as usize;
    let mut flat: Vec<u8> = pairs
        .iter()
        .flat_map(|p| p.iter().flat_map(|r| (*r as u64).to_le_bytes()))
        .collect();
    flat.resize(n * 16, 0);
    if n > 0 {
        ctx.comm.bcast(0, &mut flat)?;
    }
    let rank = |c: &[u8]| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as usize;
    Ok(flat
        .chunks_exact(16)
        .map(|c| [rank(&c[..8]), rank(&c[8..])])
        .collect())
}

fn verdict(
    config: &DoctorConfig,
    ctx: &Context,
    facts: &[facts::RankFacts],
    timed: &[timing::Timed],
) -> Result<SuiteOutput> {
    let plan = config.plan();
    let pairs = judge::pairs(facts, timed, &plan);
    let network = ctx.network.label.clone();
    let mut problems = judge::problems(&network, facts, &pairs, &plan);
    problems.extend(judge::cabling_problems(
        &network,
        &ctx.rank_names,
        &ctx.network.links,
        ctx.network.topology.as_ref(),
    ));
    let hosts: Vec<facts::RankFacts> = judge::first_of_each_host(facts)
        .into_iter()
        .filter_map(|r| facts.get(r).cloned())
        .collect();
    let note = match (hosts.len(), pairs.len()) {
        (1, 0) => Some(format!(
            "one rank on {}: no pair was timed and no link between hosts was checked",
            hosts[0].host
        )),
        (1, _) => Some(format!(
            "every rank runs on {}: the pairs were timed, but no link between hosts was checked",
            hosts[0].host
        )),
        _ => None,
    };
    print(&network, &pairs, &problems, note.as_deref());
    let results = DoctorResults {
        problems: problems.clone(),
        pairs: pairs.clone(),
        hosts,
        timing: serde_json::json!({
            "ping_bytes": timing::PING_BYTES,
            "ping_iters": timing::PING_ITERS,
            "ping_warmup": timing::PING_WARMUP,
            "burst_message_bytes": timing::BURST_BYTES,
            "burst_window": timing::BURST_WINDOW,
            "burst_seconds": timing::BURST_SECONDS,
            "below_speed_fraction": judge::BELOW_SPEED,
            "below_others_fraction": judge::BELOW_OTHERS,
        }),
        note: note.clone(),
    };
    // A rank 0 the launcher did not start (mpirun, by hand) is where the user looks: it
    // writes --json itself. Under the launcher, the launcher writes it, on the user's machine.
    let launched = std::env::var(tbbench_runners::launch::ENV_LAUNCHED).as_deref() == Ok("1");
    if let (Some(path), false) = (&config.json, launched) {
        write_findings(
            path,
            &Findings {
                problems: problems.clone(),
                pairs: pairs
                    .iter()
                    .map(|p| with_network(p, &network))
                    .collect::<Result<_>>()?,
            },
        )?;
    }
    Ok(SuiteOutput {
        results: serde_json::to_value(&results)?,
        checks: checks(&problems, &pairs, facts.len(), results.hosts.len()),
        warnings: note.into_iter().collect(),
    })
}

/// One failed check per kind of problem found (so the driver's "verification FAILED" line
/// names the kinds and the run exits 1), or one passed check when there is none.
fn checks(problems: &[Problem], pairs: &[Pair], ranks: usize, hosts: usize) -> Vec<Check> {
    let mut kinds: Vec<&str> = Vec::new();
    for p in problems {
        if !kinds.contains(&p.kind.as_str()) {
            kinds.push(&p.kind);
        }
    }
    if kinds.is_empty() {
        return vec![Check {
            name: "doctor".into(),
            passed: true,
            detail: format!(
                "no problems found: {ranks} rank(s) on {hosts} host(s), {} pair(s) timed",
                pairs.len()
            ),
        }];
    }
    kinds
        .into_iter()
        .map(|k| {
            let n = problems.iter().filter(|p| p.kind == k).count();
            Check {
                name: k.to_string(),
                passed: false,
                detail: format!("{n} problem(s): see results.problems"),
            }
        })
        .collect()
}

/// A pair's record with its network's label, for a `--json` file that may hold several.
pub fn with_network(p: &Pair, network: &str) -> Result<serde_json::Value> {
    let mut v = serde_json::to_value(p)?;
    if let serde_json::Value::Object(m) = &mut v {
        m.insert("network".into(), network.into());
    }
    Ok(v)
}

pub fn write_findings(path: &std::path::Path, f: &Findings) -> Result<()> {
    let mut bytes = serde_json::to_vec_pretty(f)?;
    bytes.push(b'\n');
    tbbench_schema::write::write_atomic(path, &bytes)
        .with_context(|| format!("cannot write --json {}", path.display()))
}

fn print(network: &str, pairs: &[Pair], problems: &[Problem], note: Option<&str>) {
    println!("# doctor: {network}");
    if !pairs.is_empty() {
        println!(
            "{:<28} {:>12} {:>10} {:>10} {:>8}  MTU",
            "pair", "latency µs", "Gbit/s", "nominal", "% nom."
        );
    }
    for p in pairs {
        let mtu = |m: Option<u32>| m.map(|m| m.to_string()).unwrap_or_else(|| "–".into());
        println!(
            "{:<28} {:>12.2} {:>10.2} {:>10} {:>8}  {}/{}",
            format!(
                "{}-{} ({}-{})",
                p.hosts[0], p.hosts[1], p.ranks[0], p.ranks[1]
            ),
            p.one_way_us_median,
            p.gbit_per_s,
            p.nominal_gbit_per_s
                .map(|n| format!("{n}"))
                .unwrap_or_else(|| "–".into()),
            p.percent_of_nominal
                .map(|x| format!("{x:.0}%"))
                .unwrap_or_else(|| "–".into()),
            mtu(p.mtu[0]),
            mtu(p.mtu[1])
        );
    }
    if let Some(n) = note {
        println!("note: {n}");
    }
    if problems.is_empty() {
        println!("no problems found");
    }
    for p in problems {
        println!("{}", p.line());
    }
}
