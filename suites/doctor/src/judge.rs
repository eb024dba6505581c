//! Rank 0's verdict: each pair's figures held against what its interfaces claim and against
//! the other pairs, the two ends of each pair against each other, and every host against the
//! others and the planned run. Pure functions over the ranks' facts and the timings, so every
//! rule is tested on real inputs without a cluster.

use crate::facts::RankFacts;
use crate::timing::Timed;
use serde::{Deserialize, Serialize};

/// A pair measuring below this fraction of its nominal speed is named (`link-below-speed`).
/// One TCP stream of 4 MiB messages reaches well over half the
/// nominal speed of a healthy Ethernet or Thunderbolt link up to 25 Gbit/s, and 30-40% of a
/// 100 Gbit/s one (pass `--streams 4` there); a link that fell back (1 Gbit/s on a 10 Gbit/s
/// port, a USB network link instead of Thunderbolt) lands at a tenth or less.
pub const BELOW_SPEED: f64 = 1.0 / 3.0;
/// A pair below this fraction of the median of the other pairs is named
/// (`pair-slower-than-others`); needs at least two other pairs between hosts.
pub const BELOW_OTHERS: f64 = 0.5;
/// What a Thunderbolt IP link is held against when its OS reports no speed (macOS reports
/// none for Thunderbolt ports): every Thunderbolt 3, 4 or 5 IP link carries more than this,
/// so a third of it (3.3 Gbit/s) is below any of them and above a USB network link's rate.
pub const THUNDERBOLT_ASSUMED_GBIT: f64 = 10.0;

/// One problem, as printed and as the result file holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    pub kind: String,
    /// The network's label, as result files name it ("tcp/en3 (thunderbolt-ip)").
    pub network: String,
    pub hosts: Vec<String>,
    /// What is wrong, with the figures, then (after " — ") what to do.
    pub detail: String,
}

impl Problem {
    /// "problem [kind] network hosts: detail — what to do", one line.
    pub fn line(&self) -> String {
        format!(
            "problem [{}] {} {}: {}",
            self.kind,
            self.network,
            self.hosts.join(","),
            self.detail
        )
    }
}

/// A timed pair with what it was held against: the result file's `pairs[]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Pair {
    pub ranks: [usize; 2],
    pub hosts: [String; 2],
    /// The two ends are on different hosts: only such pairs say anything about a link.
    pub cross_host: bool,
    /// Each end's interface, link kind and MTU, as its transport described them.
    pub interfaces: [Option<String>; 2],
    pub link_kinds: [String; 2],
    pub mtu: [Option<u32>; 2],
    pub one_way_us_median: f64,
    pub one_way_us_p99: f64,
    pub ping_iters: u64,
    pub gbit_per_s: f64,
    pub burst_bytes: u64,
    pub burst_seconds: f64,
    /// What the bandwidth is held against, Gbit/s, and where that figure came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nominal_gbit_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nominal_source: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub percent_of_nominal: Option<f64>,
}

/// What the run after this one will need: `--hpl-n` and `--memory`.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// The speed every link should reach (`--ceiling`), bit/s.
    pub ceiling_bits_per_s: Option<f64>,
    pub hpl_n: Option<u64>,
    /// Free memory every host needs.
    pub memory_bytes: Option<u64>,
}

/// The ranks whose pairs are timed: the first rank of each host, so each pair of hosts is
/// timed once; when every rank shares one host, every rank (no link between hosts exists,
/// but the ranks' path is still worth a figure).
pub fn endpoints(facts: &[RankFacts]) -> Vec<usize> {
    let firsts = first_of_each_host(facts);
    if firsts.len() > 1 {
        firsts
    } else {
        facts.iter().map(|f| f.rank).collect()
    }
}

pub fn pairs_of(endpoints: &[usize]) -> Vec<[usize; 2]> {
    let mut out = Vec::new();
    for (i, &a) in endpoints.iter().enumerate() {
        for &b in &endpoints[i + 1..] {
            out.push([a, b]);
        }
    }
    out
}

fn is_thunderbolt(kind: &str) -> bool {
    kind == "thunderbolt-ip" || kind == "thunderbolt-bridge"
}

/// The speed a pair is held against: `--ceiling`; else the slower end's reported speed; else,
/// for a Thunderbolt link whose OS reports none, [`THUNDERBOLT_ASSUMED_GBIT`].
fn nominal(a: &RankFacts, b: &RankFacts, plan: &Plan) -> Option<(f64, String)> {
    if let Some(bits) = plan.ceiling_bits_per_s {
        return Some((bits / 1e9, "--ceiling".into()));
    }
    let reported = [a, b]
        .iter()
        .filter_map(|f| f.network.nominal_gbit_per_s)
        .fold(None, |m: Option<f64>, s| Some(m.map_or(s, |m| m.min(s))));
    if let Some(s) = reported {
        return Some((s, "interface".into()));
    }
    let kinds = [&a.network.link_kind, &b.network.link_kind];
    if kinds.iter().all(|k| is_thunderbolt(k)) {
        return Some((
            THUNDERBOLT_ASSUMED_GBIT,
            "assumed for Thunderbolt, whose OS reports no speed".into(),
        ));
    }
    None
}

/// The timed pairs with the facts of both ends.
pub fn pairs(facts: &[RankFacts], timed: &[Timed], plan: &Plan) -> Vec<Pair> {
    timed
        .iter()
        .filter_map(|t| {
            let (a, b) = (facts.get(t.ranks[0])?, facts.get(t.ranks[1])?);
            let cross_host = a.host != b.host;
            let nominal = nominal(a, b, plan).filter(|_| cross_host);
            Some(Pair {
                ranks: t.ranks,
                hosts: [a.host.clone(), b.host.clone()],
                cross_host,
                interfaces: [a.network.interface.clone(), b.network.interface.clone()],
                link_kinds: [a.network.link_kind.clone(), b.network.link_kind.clone()],
                mtu: [a.network.mtu, b.network.mtu],
                one_way_us_median: t.one_way_us.median,
                one_way_us_p99: t.one_way_us.p99,
                ping_iters: t.one_way_us.n,
                gbit_per_s: t.gbit_per_s,
                burst_bytes: t.burst_bytes,
                burst_seconds: t.burst_seconds,
                percent_of_nominal: nominal.as_ref().map(|(n, _)| 100.0 * t.gbit_per_s / n),
                nominal_gbit_per_s: nominal.as_ref().map(|(n, _)| *n),
                nominal_source: nominal.map(|(_, s)| s),
            })
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn iface(f: &RankFacts) -> String {
    f.network.interface.clone().unwrap_or_else(|| "?".into())
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Every problem, pairs first, then hosts, each host's own problems last.
pub fn problems(network: &str, facts: &[RankFacts], pairs: &[Pair], plan: &Plan) -> Vec<Problem> {
    let mut out = Vec::new();
    let mut add = |kind: &str, hosts: Vec<String>, detail: String| {
        out.push(Problem {
            kind: kind.into(),
            network: network.into(),
            hosts,
            detail,
        })
    };
    let cross: Vec<&Pair> = pairs.iter().filter(|p| p.cross_host).collect();
    let mut below = Vec::new();
    for p in &cross {
        let (a, b) = (&facts[p.ranks[0]], &facts[p.ranks[1]]);
        let hosts = p.hosts.to_vec();
        if let (Some(n), Some(src)) = (p.nominal_gbit_per_s, &p.nominal_source) {
            if p.gbit_per_s < BELOW_SPEED * n {
                below.push(p.ranks);
                add("link-below-speed", hosts.clone(), format!(
                    "measured {:.2} Gbit/s from {} ({}) to {} ({}), {:.0}% of the {n} Gbit/s it should reach ({src}) — a fallback link? check the cable and ports, run `tbbench env` on both hosts and `tbbench link` on this pair",
                    p.gbit_per_s, p.hosts[0], iface(a), p.hosts[1], iface(b), 100.0 * p.gbit_per_s / n
                ));
            }
        }
        if let [Some(ma), Some(mb)] = p.mtu {
            if ma != mb {
                add("mtu-mismatch", hosts.clone(), format!(
                    "MTU {ma} on {} ({}) but {mb} on {} ({}) — set the same MTU at both ends (Linux: ip link set dev IFACE mtu N; macOS: networksetup -setMTU), or large packets are dropped or split",
                    p.hosts[0], iface(a), p.hosts[1], iface(b)
                ));
            }
        }
        let [ka, kb] = &p.link_kinds;
        let odd = |k: &str| is_thunderbolt(k) || k == "wifi";
        if ka != kb && (odd(ka) || odd(kb)) {
            add("link-kind-mismatch", hosts.clone(), format!(
                "{} sends over {} ({ka}) but {} over {} ({kb}) — the data does not travel over one cable of one kind; check which interface each host's address in this network is on (`tbbench env`)",
                p.hosts[0], iface(a), p.hosts[1], iface(b)
            ));
        }
    }
    if cross.len() >= 3 {
        for p in &cross {
            if below.contains(&p.ranks) {
                continue;
            }
            let others = median(
                cross
                    .iter()
                    .filter(|o| o.ranks != p.ranks)
                    .map(|o| o.gbit_per_s)
                    .collect(),
            );
            if let Some(m) = others {
                if p.gbit_per_s < BELOW_OTHERS * m {
                    add("pair-slower-than-others", p.hosts.to_vec(), format!(
                        "measured {:.2} Gbit/s between {} and {}, {:.0}% of the other pairs' median {m:.2} Gbit/s — check this pair's cable and ports and both hosts' interfaces (`tbbench env`), then `tbbench link` on it",
                        p.gbit_per_s, p.hosts[0], p.hosts[1], 100.0 * p.gbit_per_s / m
                    ));
                }
            }
        }
    }
    // Routes: each host's first rank, to the ranks of other hosts.
    let firsts = first_of_each_host(facts);
    for &r in &firsts {
        let f = &facts[r];
        let Some(run_iface) = &f.network.interface else {
            continue;
        };
        let mut seen: Vec<&str> = Vec::new();
        for route in &f.routes {
            let Some(peer) = facts.get(route.rank) else {
                continue;
            };
            let Some(via) = &route.interface else {
                continue;
            };
            // Over links each cable has its own interface; else the run's one.
            let want = route.expected.as_ref().unwrap_or(run_iface);
            if peer.host == f.host || via == want || seen.contains(&peer.host.as_str()) {
                continue;
            }
            seen.push(&peer.host);
            let what = if route.expected.is_some() {
                "the cable's own interface"
            } else {
                "the interface the run uses"
            };
            add("route-mismatch", vec![f.host.clone(), peer.host.clone()], format!(
                "{} would send to {} ({}) by {via} ({}), not by {want}, {what} — fix the routes (a second address in the same subnet, or a default route winning) or name the interface with --iface or --over tcp:SUBNET",
                f.host, peer.host, route.address, route.how
            ));
        }
    }
    let hosts: Vec<&RankFacts> = firsts.iter().map(|&r| &facts[r]).collect();
    let groups = |key: &dyn Fn(&RankFacts) -> String| {
        let mut g: Vec<(String, Vec<String>)> = Vec::new();
        for h in &hosts {
            let k = key(h);
            match g.iter_mut().find(|(x, _)| *x == k) {
                Some((_, names)) => names.push(h.host.clone()),
                None => g.push((k, vec![h.host.clone()])),
            }
        }
        g
    };
    let say = |g: &[(String, Vec<String>)]| {
        g.iter()
            .map(|(k, names)| format!("{k} on {}", names.join(", ")))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let all: Vec<String> = hosts.iter().map(|h| h.host.clone()).collect();
    let versions = groups(&|h| {
        format!(
            "tbbench {} ({})",
            h.tool.version,
            h.tool.git_commit.chars().take(10).collect::<String>()
        )
    });
    if versions.len() > 1 {
        add("version-mismatch", all.clone(), format!(
            "{} — install one build on every host (the same binary at --exe's path), or figures and the rank protocol may differ",
            say(&versions)
        ));
    }
    // Apple's RDMA over Thunderbolt needs one macOS build on every Mac (26.2 or later);
    // elsewhere kernels and drivers differ with the build.
    let oses = groups(&|h| h.os.clone());
    if oses.len() > 1 && oses.iter().all(|(os, _)| !os.is_empty()) {
        add("os-mismatch", all.clone(), format!(
            "{} — update every host to one OS build (RDMA over Thunderbolt needs macOS 26.2 or later on every Mac)",
            say(&oses)
        ));
    }
    let blas = groups(&|h| format!("{}: {}", h.blas.name, h.blas.kernel));
    if blas.len() > 1 {
        add("blas-mismatch", all.clone(), format!(
            "{} — hpl runs as fast as its slowest host: install the same BLAS everywhere (OPENBLAS_CORETYPE can force one kernel)",
            say(&blas)
        ));
    }
    // Each direction of a TCP connection runs its sender's congestion control, so hosts that
    // differ give a pair two different rates (BBR paces where cubic bursts).
    let congestion = groups(&|h| h.network.congestion.clone().unwrap_or_default());
    if congestion.len() > 1 && congestion.iter().all(|(cc, _)| !cc.is_empty()) {
        add("congestion-mismatch", all.clone(), format!(
            "TCP congestion control {} — each direction runs its sender's, so a pair's two directions differ: set one everywhere (Linux: sysctl -w net.ipv4.tcp_congestion_control=cubic) or pass --congestion to the run",
            say(&congestion)
        ));
    }
    let size = facts.len().max(1) as u64;
    for h in &hosts {
        let ranks_here = facts.iter().filter(|f| f.host == h.host).count() as u64;
        let have = h.memory_available_bytes;
        if have == 0 {
            continue;
        }
        if let Some(n) = plan.hpl_n {
            // The matrix, 8·N² bytes, shared evenly by the ranks.
            let need = (8u128 * u128::from(n) * u128::from(n) / u128::from(size))
                .saturating_mul(u128::from(ranks_here));
            if need > u128::from(have) {
                let fits = ((have as f64) * size as f64 / (8.0 * ranks_here as f64)).sqrt() as u64;
                add("low-memory", vec![h.host.clone()], format!(
                    "hpl --n {n} needs {} on {} for its {ranks_here} rank(s) (8·N² bytes over {size} ranks), which has {} free — use --n {fits} or less, free memory, or add hosts",
                    gib(u64::try_from(need).unwrap_or(u64::MAX)), h.host, gib(have)
                ));
            }
        }
        if let Some(need) = plan.memory_bytes {
            if need > have {
                add("low-memory", vec![h.host.clone()], format!(
                    "the planned run needs {} free on {}, which has {} — free memory (close other jobs) or plan a smaller run",
                    gib(need), h.host, gib(have)
                ));
            }
        }
    }
    for h in &hosts {
        for p in &h.problems {
            add(&p.kind, vec![h.host.clone()], p.detail.clone());
        }
    }
    out
}

/// The first rank of each host, in rank order.
/// The cabling held to what the hostfile's backend needs and to itself: a cable missing for
/// the backend's shape (`cable-missing`: MLX's jaccl runs a full mesh, so every pair of hosts
/// needs one; jaccl-ring and ring run round the hosts in the file's order, so each host needs
/// one to the next), and a cable whose two ends report different MTUs
/// (`cable-mtu-differs`). `hosts[r]` is rank r's host; the links and topology are the
/// result's `network.links` and `network.topology`.
pub fn cabling_problems(
    network: &str,
    hosts: &[String],
    links: &[tbbench_schema::Link],
    topology: Option<&tbbench_schema::Topology>,
) -> Vec<Problem> {
    let mut out = Vec::new();
    let Some(t) = topology else {
        return out;
    };
    // One rank per host, in the order the hosts first appear (the hostfile's).
    let mut firsts: Vec<usize> = Vec::new();
    for (r, h) in hosts.iter().enumerate() {
        if !firsts.iter().any(|&f| hosts[f] == *h) {
            firsts.push(r);
        }
    }
    let needed: Vec<[usize; 2]> = match t.backend.as_deref() {
        Some("jaccl") => pairs_of(&firsts),
        Some("jaccl-ring") | Some("ring") if firsts.len() > 2 => (0..firsts.len())
            .map(|i| {
                let (a, b) = (firsts[i], firsts[(i + 1) % firsts.len()]);
                [a.min(b), a.max(b)]
            })
            .collect(),
        Some("jaccl-ring") | Some("ring") => pairs_of(&firsts),
        _ => Vec::new(),
    };
    let backend = t.backend.as_deref().unwrap_or_default();
    for pair in needed.iter().filter(|p| t.unlinked.contains(p)) {
        let (a, b) = (&hosts[pair[0]], &hosts[pair[1]]);
        let what = if backend == "jaccl" {
            "runs a full mesh: every pair of hosts needs a cable of its own"
        } else {
            "runs round the hosts in the hostfile's order: each needs a cable to the next"
        };
        out.push(Problem {
            kind: "cable-missing".into(),
            network: network.into(),
            hosts: vec![a.clone(), b.clone()],
            detail: format!(
                "no cable between {a} and {b}, and the hostfile's backend {backend} {what} — cable {a} to {b}{}",
                if backend == "jaccl" {
                    ", or run jaccl-ring on a ring"
                } else {
                    ", or list the hosts in the order they are cabled"
                }
            ),
        });
    }
    for l in links {
        let (x, y) = (&l.ends[0], &l.ends[1]);
        if let (Some(mx), Some(my)) = (x.mtu, y.mtu) {
            if mx != my {
                out.push(Problem {
                    kind: "cable-mtu-differs".into(),
                    network: network.into(),
                    hosts: vec![l.hosts[0].clone(), l.hosts[1].clone()],
                    detail: format!(
                        "the cable between {} ({}, MTU {mx}) and {} ({}, MTU {my}) has a different MTU at each end: packets the larger end sends are dropped or fragmented — set one MTU on both ({} on each)",
                        l.hosts[0],
                        x.interface,
                        l.hosts[1],
                        y.interface,
                        mx.max(my)
                    ),
                });
            }
        }
    }
    out
}

pub fn first_of_each_host(facts: &[RankFacts]) -> Vec<usize> {
    let mut firsts: Vec<usize> = Vec::new();
    for f in facts {
        if !firsts.iter().any(|&r| facts[r].host == f.host) {
            firsts.push(f.rank);
        }
    }
    firsts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Route;
    use tbbench_runners::hostcheck::HostProblem;
    use tbbench_schema::{Blas, Network, Summary, Tool};

    /// One rank's facts as a Linux or macOS host reports them.
    fn rank(
        r: usize,
        host: &str,
        iface: &str,
        kind: &str,
        speed: Option<f64>,
        mtu: u32,
    ) -> RankFacts {
        RankFacts {
            rank: r,
            host: host.into(),
            hostname: host.into(),
            tool: Tool {
                name: "tbbench".into(),
                version: "0.1.0".into(),
                git_commit: "6939a57c0ffee".into(),
            },
            blas: Blas {
                name: "openblas".into(),
                kernel: "Haswell (OpenBLAS 0.3.21 DYNAMIC_ARCH)".into(),
                env: vec![],
                note: None,
            },
            memory_available_bytes: 64 << 30,
            os: "macOS 26.2".into(),
            network: Network {
                transport: "tcp".into(),
                interface: Some(iface.into()),
                link_kind: kind.into(),
                nominal_gbit_per_s: speed,
                mtu: Some(mtu),
                label: format!("tcp/{iface} ({kind})"),
                ..Default::default()
            },
            routes: vec![],
            rdma: serde_json::Value::Null,
            problems: vec![],
        }
    }

    fn timed(a: usize, b: usize, gbit: f64) -> Timed {
        Timed {
            ranks: [a, b],
            one_way_us: Summary {
                n: 200,
                median: 18.0,
                p99: 40.0,
                ..Default::default()
            },
            burst_bytes: (gbit * 1e9 / 8.0 * 0.3) as u64,
            burst_seconds: 0.3,
            gbit_per_s: gbit,
        }
    }

    fn judge(facts: &[RankFacts], t: &[Timed], plan: &Plan) -> Vec<Problem> {
        let p = pairs(facts, t, plan);
        problems("tcp/en0 (ethernet)", facts, &p, plan)
    }

    fn kinds(p: &[Problem]) -> Vec<&str> {
        p.iter().map(|x| x.kind.as_str()).collect()
    }

    /// Two Linux hosts on 10 GbE: 9.4 Gbit/s is healthy; 0.94 (the port came up at 1 Gbit/s)
    /// is named with both figures and where the 10 came from.
    #[test]
    fn a_pair_far_below_its_interfaces_speed_is_named() {
        let f = [
            rank(0, "node1", "enp1s0", "ethernet", Some(10.0), 1500),
            rank(1, "node2", "enp1s0", "ethernet", Some(10.0), 1500),
        ];
        assert!(judge(&f, &[timed(0, 1, 9.4)], &Plan::default()).is_empty());
        let p = judge(&f, &[timed(0, 1, 0.94)], &Plan::default());
        assert_eq!(kinds(&p), ["link-below-speed"]);
        assert_eq!(p[0].hosts, ["node1", "node2"]);
        assert_eq!(p[0].network, "tcp/en0 (ethernet)");
        assert!(
            p[0].detail.contains("0.94 Gbit/s")
                && p[0]
                    .detail
                    .contains("10 Gbit/s it should reach (interface)"),
            "{}",
            p[0].detail
        );
        assert!(
            p[0].detail.contains(" — "),
            "says what to do: {}",
            p[0].detail
        );
        assert!(!p[0].line().contains('\n'));
        assert!(p[0]
            .line()
            .starts_with("problem [link-below-speed] tcp/en0 (ethernet) node1,node2: "));
        // The slower end's speed is the pair's: a 10 GbE host on a 1 GbE one is not below it.
        let mixed = [
            rank(0, "node1", "enp1s0", "ethernet", Some(10.0), 1500),
            rank(1, "node2", "eno1", "ethernet", Some(1.0), 1500),
        ];
        assert!(judge(&mixed, &[timed(0, 1, 0.94)], &Plan::default()).is_empty());
    }

    /// Two Macs over Thunderbolt report no speed: held against an assumed 10 Gbit/s, a link
    /// that fell back to a USB network rate (0.3 Gbit/s) is named, 18 Gbit/s is not; --ceiling
    /// replaces what the interfaces say.
    #[test]
    fn thunderbolt_without_a_reported_speed_and_the_ceiling_flag() {
        let f = [
            rank(0, "mac1", "en3", "thunderbolt-ip", None, 1500),
            rank(1, "mac2", "en3", "thunderbolt-ip", None, 1500),
        ];
        assert!(judge(&f, &[timed(0, 1, 18.0)], &Plan::default()).is_empty());
        let p = judge(&f, &[timed(0, 1, 0.3)], &Plan::default());
        assert_eq!(kinds(&p), ["link-below-speed"]);
        assert!(
            p[0].detail.contains("assumed for Thunderbolt"),
            "{}",
            p[0].detail
        );
        let plan = Plan {
            ceiling_bits_per_s: Some(80e9),
            ..Default::default()
        };
        let p = judge(&f, &[timed(0, 1, 18.0)], &plan);
        assert_eq!(kinds(&p), ["link-below-speed"]);
        assert!(
            p[0].detail
                .contains("80 Gbit/s it should reach (--ceiling)"),
            "{}",
            p[0].detail
        );
        // Virtual links (veth, bridges, VMs) claim nothing: nothing to hold them against.
        let v = [
            rank(0, "a", "veth0", "virtual", None, 9000),
            rank(1, "b", "veth1", "virtual", None, 9000),
        ];
        assert!(judge(&v, &[timed(0, 1, 0.1)], &Plan::default()).is_empty());
    }

    #[test]
    fn ends_with_different_mtus_or_kinds_are_named_with_both_hosts() {
        let f = [
            rank(0, "mac1", "en3", "thunderbolt-ip", None, 9000),
            rank(1, "mac2", "en5", "ethernet", None, 1500),
        ];
        let p = judge(&f, &[timed(0, 1, 9.0)], &Plan::default());
        assert_eq!(kinds(&p), ["mtu-mismatch", "link-kind-mismatch"]);
        assert_eq!(p[0].hosts, ["mac1", "mac2"]);
        assert!(
            p[0].detail
                .starts_with("MTU 9000 on mac1 (en3) but 1500 on mac2 (en5)"),
            "{}",
            p[0].detail
        );
        assert!(
            p[1].detail.contains("en3 (thunderbolt-ip)") && p[1].detail.contains("en5 (ethernet)")
        );
        // An Ethernet port beside a bond or VLAN (virtual) is ordinary, not a kind mismatch.
        let g = [
            rank(0, "n1", "bond0", "virtual", None, 1500),
            rank(1, "n2", "eth0", "ethernet", None, 1500),
        ];
        assert!(judge(&g, &[timed(0, 1, 9.0)], &Plan::default()).is_empty());
    }

    /// Four hosts, six pairs: the one pair at a fifth of the others is named, alone; with
    /// only two pairs between hosts there is no "others" to speak of.
    #[test]
    fn a_pair_far_below_the_others_is_named() {
        let f: Vec<RankFacts> = (0..4)
            .map(|r| rank(r, &format!("n{r}"), "eth0", "virtual", None, 1500))
            .collect();
        let t: Vec<Timed> = pairs_of(&endpoints(&f))
            .iter()
            .map(|&[a, b]| timed(a, b, if [a, b] == [1, 3] { 1.8 } else { 9.0 }))
            .collect();
        assert_eq!(t.len(), 6);
        let p = judge(&f, &t, &Plan::default());
        assert_eq!(kinds(&p), ["pair-slower-than-others"]);
        assert_eq!(p[0].hosts, ["n1", "n3"]);
        assert!(
            p[0].detail.contains("20% of the other pairs' median 9.00"),
            "{}",
            p[0].detail
        );
        let two = judge(
            &f[..3],
            &[timed(0, 1, 9.0), timed(0, 2, 1.0)],
            &Plan::default(),
        );
        assert!(two.is_empty(), "{two:?}");
    }

    /// Ranks sharing a host: every rank is an endpoint, but nothing about a link is judged.
    #[test]
    fn ranks_on_one_host_are_timed_but_not_judged_as_a_link() {
        let f = [
            rank(0, "vm", "lo", "loopback", None, 65536),
            rank(1, "vm", "lo", "loopback", None, 1500),
            rank(2, "vm", "lo", "loopback", None, 65536),
        ];
        assert_eq!(endpoints(&f), [0, 1, 2]);
        assert_eq!(pairs_of(&endpoints(&f)), [[0, 1], [0, 2], [1, 2]]);
        let plan = Plan {
            ceiling_bits_per_s: Some(100e9),
            ..Default::default()
        };
        let t = [timed(0, 1, 1.0), timed(0, 2, 20.0), timed(1, 2, 20.0)];
        let ps = pairs(&f, &t, &plan);
        assert!(ps
            .iter()
            .all(|p| !p.cross_host && p.nominal_gbit_per_s.is_none()));
        assert!(problems("tcp/lo (loopback)", &f, &ps, &plan).is_empty());
        // Two hosts with two ranks each: one pair, between the first rank of each.
        let g = [
            rank(0, "a", "eth0", "ethernet", None, 1500),
            rank(1, "a", "eth0", "ethernet", None, 1500),
            rank(2, "b", "eth0", "ethernet", None, 1500),
            rank(3, "b", "eth0", "ethernet", None, 1500),
        ];
        assert_eq!(pairs_of(&endpoints(&g)), [[0, 2]]);
    }

    #[test]
    fn a_route_by_another_interface_is_named_once_per_peer_host() {
        let mut a = rank(0, "mac1", "en3", "thunderbolt-ip", None, 1500);
        a.routes = vec![
            Route {
                rank: 1,
                address: "10.0.1.2".into(),
                interface: Some("en0".into()),
                how: "route get".into(),
                expected: None,
            },
            Route {
                rank: 2,
                address: "10.0.1.2".into(),
                interface: Some("en0".into()),
                how: "route get".into(),
                expected: None,
            },
        ];
        let mut b = rank(1, "mac2", "en3", "thunderbolt-ip", None, 1500);
        b.routes = vec![Route {
            rank: 0,
            address: "10.0.1.1".into(),
            interface: Some("en3".into()),
            how: "route get".into(),
            expected: None,
        }];
        let c = rank(2, "mac2", "en3", "thunderbolt-ip", None, 1500);
        let p = judge(&[a, b, c], &[timed(0, 1, 18.0)], &Plan::default());
        assert_eq!(kinds(&p), ["route-mismatch"]);
        assert_eq!(p[0].hosts, ["mac1", "mac2"]);
        assert!(
            p[0].detail
                .starts_with("mac1 would send to mac2 (10.0.1.2) by en0 (route get), not by en3"),
            "{}",
            p[0].detail
        );
    }

    #[test]
    fn builds_and_blas_that_differ_between_hosts_are_named_with_each_hosts_own() {
        let a = rank(0, "n1", "eth0", "ethernet", None, 1500);
        let mut b = rank(1, "n2", "eth0", "ethernet", None, 1500);
        let mut c = rank(2, "n3", "eth0", "ethernet", None, 1500);
        b.tool.git_commit = "25b679e0000".into();
        c.blas.kernel = "Prescott (OpenBLAS 0.3.21 DYNAMIC_ARCH)".into();
        c.os = "macOS 26.1".into();
        let p = judge(&[a, b, c], &[], &Plan::default());
        assert_eq!(
            kinds(&p),
            ["version-mismatch", "os-mismatch", "blas-mismatch"]
        );
        assert!(
            p[1].detail
                .starts_with("macOS 26.2 on n1, n2; macOS 26.1 on n3 — update every host"),
            "{}",
            p[1].detail
        );
        let p = [p[0].clone(), p[2].clone()];
        assert_eq!(p[0].hosts, ["n1", "n2", "n3"]);
        assert!(
            p[0].detail.starts_with(
                "tbbench 0.1.0 (6939a57c0f) on n1, n3; tbbench 0.1.0 (25b679e000) on n2"
            ),
            "{}",
            p[0].detail
        );
        assert!(
            p[1].detail
                .contains("Prescott (OpenBLAS 0.3.21 DYNAMIC_ARCH) on n3"),
            "{}",
            p[1].detail
        );
    }

    #[test]
    fn hosts_whose_tcp_congestion_control_differs_are_named() {
        let mut f: Vec<RankFacts> = (0..3)
            .map(|r| rank(r, &format!("n{}", r + 1), "eth0", "ethernet", None, 1500))
            .collect();
        for (r, cc) in ["cubic", "bbr", "cubic"].iter().enumerate() {
            f[r].network.congestion = Some(cc.to_string());
        }
        let p = judge(&f, &[], &Plan::default());
        assert_eq!(kinds(&p), ["congestion-mismatch"]);
        assert!(
            p[0].detail
                .starts_with("TCP congestion control cubic on n1, n3; bbr on n2 — "),
            "{}",
            p[0].detail
        );
        // The same everywhere, or unknown (not Linux): nothing to say.
        f[1].network.congestion = Some("cubic".into());
        assert!(judge(&f, &[], &Plan::default()).is_empty());
        for h in &mut f {
            h.network.congestion = None;
        }
        assert!(judge(&f, &[], &Plan::default()).is_empty());
    }

    /// hpl --n 100000 on 4 ranks, 2 per host: 8·10^10 B over 4 ranks, 37.3 GiB a host.
    #[test]
    fn a_planned_run_that_does_not_fit_a_hosts_free_memory_is_named() {
        let mut f: Vec<RankFacts> = (0..4)
            .map(|r| {
                rank(
                    r,
                    if r < 2 { "a" } else { "b" },
                    "eth0",
                    "ethernet",
                    None,
                    1500,
                )
            })
            .collect();
        f[2].memory_available_bytes = 32 << 30;
        let plan = Plan {
            hpl_n: Some(100_000),
            ..Default::default()
        };
        let p = judge(&f, &[], &plan);
        assert_eq!(kinds(&p), ["low-memory"]);
        assert_eq!(p[0].hosts, ["b"]);
        assert!(
            p[0].detail
                .contains("needs 37.3 GiB on b for its 2 rank(s)"),
            "{}",
            p[0].detail
        );
        // sqrt(32 GiB · 4 / 16) = 92681: the largest N whose share fits.
        assert!(p[0].detail.contains("--n 92681 or less"), "{}", p[0].detail);
        let plan = Plan {
            memory_bytes: Some(48 << 30),
            ..Default::default()
        };
        let p = judge(&f, &[], &plan);
        assert_eq!(kinds(&p), ["low-memory"]);
        assert!(p[0]
            .detail
            .contains("needs 48.0 GiB free on b, which has 32.0 GiB"));
    }

    /// What `tbbench env` finds on a host is a problem of that host, once, however many ranks
    /// run there.
    /// A ring of four against MLX's backends: jaccl (a full mesh) misses the two diagonals,
    /// jaccl-ring misses nothing, a ring listed out of its cabled order misses the pairs it
    /// would need; a cable with two MTUs is named once, with both hosts.
    #[test]
    fn the_cabling_is_held_to_the_backend_and_each_cable_to_itself() {
        let hosts: Vec<String> = (0..4).map(|h| format!("m{h}")).collect();
        let ring = |backend: &str| tbbench_schema::Topology {
            shape: "ring".into(),
            ring: hosts.clone(),
            unlinked: vec![[0, 2], [1, 3]],
            backend: Some(backend.into()),
        };
        let found = |t: &tbbench_schema::Topology, links: &[tbbench_schema::Link]| {
            cabling_problems("tcp/links", &hosts, links, Some(t))
                .into_iter()
                .map(|p| (p.kind, p.hosts))
                .collect::<Vec<_>>()
        };
        let h = |a: &str, b: &str| vec![a.to_string(), b.to_string()];
        assert_eq!(
            found(&ring("jaccl"), &[]),
            [
                ("cable-missing".to_string(), h("m0", "m2")),
                ("cable-missing".to_string(), h("m1", "m3"))
            ]
        );
        assert!(found(&ring("jaccl-ring"), &[]).is_empty());
        // Cabled 0-2-1-3-0, listed 0 1 2 3: the ring backend needs 0-1, 1-2, 2-3, 3-0.
        let crossed = tbbench_schema::Topology {
            unlinked: vec![[0, 1], [2, 3]],
            ..ring("ring")
        };
        assert_eq!(
            found(&crossed, &[]),
            [
                ("cable-missing".to_string(), h("m0", "m1")),
                ("cable-missing".to_string(), h("m2", "m3"))
            ]
        );
        let end = |mtu: u32| tbbench_schema::LinkEnd {
            interface: "en1".into(),
            mtu: Some(mtu),
            ..Default::default()
        };
        let link = tbbench_schema::Link {
            ranks: [1, 2],
            hosts: [hosts[1].clone(), hosts[2].clone()],
            cable: 0,
            ends: [end(9000), end(1500)],
        };
        assert_eq!(
            found(&ring("jaccl-ring"), &[link]),
            [("cable-mtu-differs".to_string(), h("m1", "m2"))]
        );
        assert!(cabling_problems("tcp/en0", &hosts, &[], None).is_empty());
    }

    #[test]
    fn each_hosts_env_problems_come_through_once() {
        let mut f = vec![
            rank(0, "mac1", "en3", "thunderbolt-ip", None, 1500),
            rank(1, "mac1", "en3", "thunderbolt-ip", None, 1500),
        ];
        for r in &mut f {
            r.problems = vec![HostProblem {
                kind: "thunderbolt-bridge".into(),
                detail: "bridge0 (Thunderbolt Bridge) is on with en2, en3: RDMA over those ports needs it off".into(),
            }];
        }
        let p = judge(&f, &[], &Plan::default());
        assert_eq!(kinds(&p), ["thunderbolt-bridge"]);
        assert_eq!(p[0].hosts, ["mac1"]);
    }
}
