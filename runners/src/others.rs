//! CPU time other processes took on a host while a suite ran: a figure measured beside a
//! compiler or another benchmark says so. Each rank reads its host's busy CPU time
//! (`/proc/stat`: user, nice, system, irq, softirq; steal is the hypervisor's, not a
//! neighbour's) and its own process's (`/proc/self/stat`) at the start and end of the suite;
//! the host's first rank also reads every process's, to name the busiest other one. Rank 0
//! takes the ranks' own time off each host's busy time: what is left, over the host's cores
//! and the span, is the share others took. On macOS, without /proc, the one-minute load
//! average at the end, less the ranks on the host, stands in.

use crate::suite::Context;
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// Others' share of a host's CPU above which a result warns.
pub const BUSY_SHARE: f64 = 0.10;

/// Clock ticks per second of /proc's CPU times.
fn ticks_per_s() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// Busy ticks of the whole host (the first line of /proc/stat).
fn host_busy() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let f: Vec<u64> = text
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...
    Some(f.first()? + f.get(1)? + f.get(2)? + f.get(5)? + f.get(6)?)
}

/// A process's name and its user + system ticks (all its threads), from /proc/PID/stat.
fn process_ticks(stat: &str) -> Option<(String, u64)> {
    // The name is in parentheses and may hold spaces or parentheses itself.
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_string();
    let rest: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    // After the name: state ppid ... utime is field 14 of the line, the 12th after it.
    let utime: u64 = rest.get(11)?.parse().ok()?;
    let stime: u64 = rest.get(12)?.parse().ok()?;
    Some((name, utime + stime))
}

fn every_process() -> Vec<(u32, String, u64)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let (name, ticks) = process_ticks(&stat)?;
            Some((pid, name, ticks))
        })
        .collect()
}

/// What one rank saw of its host over the span.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RankView {
    host: String,
    cores: usize,
    pid: u32,
    seconds: f64,
    /// The host's busy CPU seconds; None where /proc/stat cannot be read.
    host_busy_s: Option<f64>,
    own_s: f64,
    /// The host's first rank: the processes that took the most CPU, (pid, name, seconds).
    top: Vec<(u32, String, f64)>,
    /// Without /proc: the one-minute load average at the end.
    load: Option<f64>,
}

/// The readings at the start of a suite.
pub struct Watch {
    at: Instant,
    host_busy: Option<u64>,
    own: u64,
    every: Option<Vec<(u32, String, u64)>>,
}

impl Watch {
    /// Takes the first readings; call on every rank right before the suite runs.
    pub fn begin(ctx: &Context) -> Watch {
        Watch {
            at: Instant::now(),
            host_busy: host_busy(),
            own: own_ticks(),
            every: ctx.first_on_my_host().then(every_process),
        }
    }

    /// Gathers every rank's view to rank 0 and returns, there, one warning per host where
    /// other processes took more than [`BUSY_SHARE`] of its CPU. A collective: every rank
    /// calls it, right after the suite.
    pub fn end(self, ctx: &mut Context) -> Result<Vec<String>> {
        let hz = ticks_per_s();
        let top = match self.every {
            Some(before) => {
                let mut grew: Vec<(u32, String, f64)> = every_process()
                    .into_iter()
                    .filter_map(|(pid, name, t)| {
                        let was = before.iter().find(|b| b.0 == pid).map_or(0, |b| b.2);
                        (t > was).then(|| (pid, name, (t - was) as f64 / hz))
                    })
                    .collect();
                grew.sort_by(|a, b| b.2.total_cmp(&a.2));
                grew.truncate(8);
                grew
            }
            None => vec![],
        };
        let me = RankView {
            host: ctx.rank_hosts[ctx.rank()].clone(),
            cores: ctx.my_host().map_or(1, |h| h.cores_logical.max(1)),
            pid: std::process::id(),
            seconds: self.at.elapsed().as_secs_f64(),
            host_busy_s: match (self.host_busy, host_busy()) {
                (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / hz),
                _ => None,
            },
            own_s: own_ticks().saturating_sub(self.own) as f64 / hz,
            top,
            load: load_average(),
        };
        let Some(all) = ctx.comm.gather(0, &serde_json::to_vec(&me)?)? else {
            return Ok(vec![]);
        };
        let views: Vec<RankView> = all
            .iter()
            .filter_map(|b| serde_json::from_slice(b).ok())
            .collect();
        Ok(warnings(&views))
    }
}

fn own_ticks() -> u64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| process_ticks(&s))
        .map_or(0, |(_, t)| t)
}

fn load_average() -> Option<f64> {
    if std::path::Path::new("/proc/stat").exists() {
        return None;
    }
    let mut l = [0f64; 1];
    // SAFETY: getloadavg writes at most one value into the array it is given.
    (unsafe { libc::getloadavg(l.as_mut_ptr(), 1) } == 1).then_some(l[0])
}

/// One line per host whose other processes took more than [`BUSY_SHARE`] of its CPU.
fn warnings(views: &[RankView]) -> Vec<String> {
    let mut hosts: Vec<&str> = Vec::new();
    for v in views {
        if !hosts.contains(&v.host.as_str()) {
            hosts.push(&v.host);
        }
    }
    let mut out = Vec::new();
    for host in hosts {
        let here: Vec<&RankView> = views.iter().filter(|v| v.host == host).collect();
        let first = here[0];
        let span = here.iter().map(|v| v.seconds).fold(0.0, f64::max).max(1e-3);
        let capacity = first.cores as f64 * span;
        let ours: Vec<u32> = here.iter().map(|v| v.pid).collect();
        let (others_share, how) = match first.host_busy_s {
            Some(busy) => {
                let own: f64 = here.iter().map(|v| v.own_s).sum();
                ((busy - own).max(0.0) / capacity, "CPU time")
            }
            None => match first.load {
                Some(load) => (
                    ((load - here.len() as f64).max(0.0) / first.cores as f64).min(1.0),
                    "load average",
                ),
                None => continue,
            },
        };
        if others_share <= BUSY_SHARE {
            continue;
        }
        let busiest = here
            .iter()
            .flat_map(|v| v.top.iter())
            .find(|(pid, name, _)| !ours.contains(pid) && name != "tbbench");
        out.push(format!(
            "busy host: other processes took {:.0}% of {host}'s {} cores while the suite ran (by {how}){}: its figures may be lower and noisier than on a quiet host",
            100.0 * others_share,
            first.cores,
            busiest
                .map(|(pid, name, s)| format!(", the busiest {name} (pid {pid}, {s:.1} CPU s)"))
                .unwrap_or_default()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_line_gives_its_name_and_cpu_ticks() {
        let line =
            "1234 (cc1plus (x)) R 1 1234 1234 0 -1 4194304 100 0 0 0 250 50 0 0 20 0 1 0 5 0 0";
        assert_eq!(process_ticks(line), Some(("cc1plus (x)".into(), 300)));
        assert_eq!(process_ticks("garbage"), None);
    }

    fn view(host: &str, pid: u32, busy: Option<f64>, own: f64) -> RankView {
        RankView {
            host: host.into(),
            cores: 2,
            pid,
            seconds: 10.0,
            host_busy_s: busy,
            own_s: own,
            top: vec![(pid, "tbbench".into(), own), (77, "cc1plus".into(), 9.0)],
            load: None,
        }
    }

    /// Others' share is the host's busy time less the ranks' own, over cores × span; the
    /// busiest process not a rank is named; a quiet host gets no line.
    #[test]
    fn a_busy_host_is_named_with_its_busiest_other_process() {
        let busy = warnings(&[view("a", 1, Some(19.0), 9.5), view("a", 2, None, 0.0)]);
        assert_eq!(busy.len(), 1, "{busy:?}");
        assert!(
            busy[0].contains("took 48% of a's 2 cores") && busy[0].contains("cc1plus (pid 77"),
            "{busy:?}"
        );
        let quiet = warnings(&[view("a", 1, Some(10.0), 9.5)]);
        assert!(quiet.is_empty(), "{quiet:?}");
    }
}
