//! Energy a host used over a suite's timed part, from its own counters: Linux RAPL through
//! powercap (`/sys/class/powercap/intel-rapl:N/energy_uj`, microjoules since some point,
//! wrapping at `max_energy_range_uj`; AMD's packages appear under the same name). The
//! package zones (`intel-rapl:N`) are read and summed; their sub-zones (`intel-rapl:N:M`,
//! cores and uncore) are parts of a package and would count twice. `TBBENCH_POWERCAP_ROOT`
//! points elsewhere than /sys/class/powercap (the tests' own counter trees).
//!
//! A counter can wrap more than once over a long run (a 262 J range wraps every 2.6 s at
//! 100 W), so a thread reads every counter every [`SAMPLE`] and adds up the steps, each step
//! taken modulo the range. On macOS the SoC's energy comes from IOReport (ioreport.rs). Where
//! no counter can be read, the result says why instead of a figure.

pub mod ioreport;

use crate::suite::Context;
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the counters are read: well inside the shortest wrap of a package counter.
pub const SAMPLE: Duration = Duration::from_millis(200);

/// One package counter.
#[derive(Debug, Clone)]
struct Counter {
    /// The zone's `name` (package-0, package-1).
    name: String,
    energy: PathBuf,
    /// Microjoules at which the counter wraps to zero.
    range_uj: u64,
}

fn root() -> PathBuf {
    std::env::var_os("TBBENCH_POWERCAP_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/sys/class/powercap"))
}

/// A counter file's number. Only a regular file (sysfs' are), and only its first 64 bytes: a
/// FIFO or a device put in a counter's place would block or never end.
fn read_u64(p: &Path) -> Result<u64, String> {
    use std::io::Read;
    let meta = std::fs::metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
    if !meta.is_file() {
        return Err(format!("{}: not a regular file", p.display()));
    }
    let mut text = String::new();
    std::fs::File::open(p)
        .and_then(|f| f.take(64).read_to_string(&mut text))
        .map_err(|e| format!("{}: {e}", p.display()))?;
    text.trim()
        .parse()
        .map_err(|_| format!("{}: not a number: {:?}", p.display(), text.trim()))
}

/// The package counters under `root`, readable now; Err says why there are none.
fn counters(root: &Path) -> Result<Vec<Counter>, String> {
    let entries = std::fs::read_dir(root)
        .map_err(|e| format!("no powercap counters ({}: {e})", root.display()))?;
    let mut found = Vec::new();
    let mut refused = None;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        // Packages only: "intel-rapl:0", not its parts "intel-rapl:0:1".
        let Some(index) = name.strip_prefix("intel-rapl:") else {
            continue;
        };
        if index.contains(':') {
            continue;
        }
        let dir = e.path();
        let energy = dir.join("energy_uj");
        match (
            read_u64(&energy),
            read_u64(&dir.join("max_energy_range_uj")),
        ) {
            (Ok(_), Ok(range_uj)) if range_uj > 0 => found.push(Counter {
                name: std::fs::read_to_string(dir.join("name"))
                    .map(|n| n.trim().to_string())
                    .unwrap_or(name),
                energy,
                range_uj,
            }),
            (Err(why), _) | (_, Err(why)) => refused = Some(why),
            _ => refused = Some(format!("{}: a zero range", dir.display())),
        }
    }
    found.sort_by(|a, b| a.name.cmp(&b.name));
    if found.is_empty() {
        return Err(match refused {
            // Since Linux 5.10 energy_uj is readable by root only.
            Some(why) if why.contains("Permission denied") => {
                format!("powercap counters unreadable ({why}; root reads them)")
            }
            Some(why) => format!("powercap counters unreadable ({why})"),
            None => format!("no RAPL package counters under {}", root.display()),
        });
    }
    Ok(found)
}

/// macOS reads IOReport, unless a powercap tree is given (the tests' own counters).
#[cfg(target_os = "macos")]
fn use_ioreport() -> bool {
    std::env::var_os("TBBENCH_POWERCAP_ROOT").is_none()
}

/// This host's energy counters by name, or why none can be read (what `tbbench env` shows).
pub fn available() -> Result<Vec<String>, String> {
    #[cfg(target_os = "macos")]
    if use_ioreport() {
        return ioreport::Session::start().map(|s| s.names());
    }
    counters(&root()).map(|c| c.into_iter().map(|c| c.name).collect())
}

/// Where a host's figure comes from, as the result file names it.
const POWERCAP: &str = "powercap (RAPL package counters)";
#[cfg(target_os = "macos")]
const IOREPORT: &str = "IOReport (SoC energy: CPU, GPU, ANE, DRAM)";

/// The energy one host used over a measured span.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostEnergy {
    pub host: String,
    pub joules: f64,
    pub seconds: f64,
    /// The counters summed (package-0, ...).
    pub domains: Vec<String>,
    /// How many times a counter passed its range and started again.
    pub wraps: u64,
    /// The counters' kind: powercap's RAPL packages, or IOReport's SoC channels.
    #[serde(default)]
    pub source: String,
}

/// Reads this host's counters over a span: powercap's on a thread until stopped (they wrap),
/// IOReport's at the start and the end (they do not).
pub struct Meter {
    source: Source,
    started: Instant,
    domains: Vec<String>,
}

enum Source {
    Powercap {
        stop: Arc<AtomicBool>,
        thread: JoinHandle<Result<(f64, u64), String>>,
    },
    #[cfg(target_os = "macos")]
    IoReport(ioreport::Session),
}

impl Meter {
    /// Starts reading this host's counters; Err says why it cannot.
    pub fn start() -> Result<Meter, String> {
        #[cfg(target_os = "macos")]
        if use_ioreport() {
            let session = ioreport::Session::start()?;
            return Ok(Meter {
                domains: session.names(),
                started: session.started,
                source: Source::IoReport(session),
            });
        }
        let counters = counters(&root())?;
        let first: Vec<u64> = counters
            .iter()
            .map(|c| read_u64(&c.energy))
            .collect::<Result<_, _>>()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let domains = counters.iter().map(|c| c.name.clone()).collect();
        let thread = std::thread::Builder::new()
            .name("energy".into())
            .spawn(move || {
                let mut last = first;
                let mut at = Instant::now();
                let (mut uj, mut wraps) = (0u128, 0u64);
                loop {
                    let stopping = flag.load(Ordering::Acquire);
                    let dt = at.elapsed().as_secs_f64();
                    at = Instant::now();
                    for (c, prev) in counters.iter().zip(last.iter_mut()) {
                        let now = read_u64(&c.energy)
                            .map_err(|e| format!("{} could not be read mid-run ({e})", c.name))?;
                        let step = plausible_step(&c.name, *prev, now, c.range_uj, dt)?;
                        if now < *prev {
                            wraps += 1;
                        }
                        uj += step as u128;
                        *prev = now;
                    }
                    if stopping {
                        return Ok((uj as f64 / 1e6, wraps));
                    }
                    std::thread::park_timeout(SAMPLE);
                }
            })
            .map_err(|e| format!("cannot start the energy thread: {e}"))?;
        Ok(Meter {
            source: Source::Powercap { stop, thread },
            started: Instant::now(),
            domains,
        })
    }

    /// Stops, reads the counters a last time, and gives what was used since the start; Err
    /// says why the last reading failed.
    pub fn finish(self, host: &str) -> Result<HostEnergy, String> {
        let seconds = self.started.elapsed().as_secs_f64();
        let (joules, wraps, domains, source) = match self.source {
            Source::Powercap { stop, thread } => {
                stop.store(true, Ordering::Release);
                thread.thread().unpark();
                let (joules, wraps) = thread
                    .join()
                    .map_err(|_| "the energy thread failed".to_string())??;
                // RAPL counters move every millisecond or so: ones that did not move over a
                // span of tens of milliseconds measured nothing.
                if joules == 0.0 && seconds >= 0.05 {
                    return Err(format!(
                        "the counters ({}) did not move over {seconds:.1} s: not a reading to trust",
                        self.domains.join(", ")
                    ));
                }
                (joules, wraps, self.domains, POWERCAP)
            }
            #[cfg(target_os = "macos")]
            Source::IoReport(session) => {
                let (joules, names) = session.finish()?;
                (joules, 0, names, IOREPORT)
            }
        };
        Ok(HostEnergy {
            host: host.to_string(),
            joules,
            seconds,
            domains,
            wraps,
            source: source.to_string(),
        })
    }
}

/// The most a package draws, in watts: a step beyond it over the time between two readings is
/// no energy used but a counter that was reset or misread.
const MAX_PACKAGE_WATTS: f64 = 2000.0;

/// The energy between two readings of a counter that wraps at `range` (microjoules), `dt`
/// seconds apart; Err where it cannot be energy: a reading above the range, or a step (a wrap
/// included) more than [`MAX_PACKAGE_WATTS`] could use, which a reset or a misread makes.
fn plausible_step(name: &str, prev: u64, now: u64, range: u64, dt: f64) -> Result<u64, String> {
    if now > range {
        return Err(format!(
            "{name} read {now} µJ, above its range of {range}: not a reading to trust"
        ));
    }
    let step = if now >= prev {
        now - prev
    } else {
        range.saturating_sub(prev).saturating_add(now)
    };
    // A sampling interval is never shorter than the thread's own; the bound allows for that.
    let most = MAX_PACKAGE_WATTS * dt.max(SAMPLE.as_secs_f64()) * 1e6;
    if step as f64 > most {
        return Err(format!(
            "{name} stepped {:.1} J in {dt:.2} s (more than {MAX_PACKAGE_WATTS:.0} W{}): a reset or a misread, not a reading to trust",
            step as f64 / 1e6,
            if now < prev { ", across a wrap" } else { "" }
        ));
    }
    Ok(step)
}

/// A suite's timed part, metered on each host by the host's first rank.
pub struct Span {
    meter: Option<Result<Meter, String>>,
}

impl Span {
    /// Starts metering on this host if this rank is the host's first; call on every rank,
    /// just before the timed part.
    pub fn begin(ctx: &Context) -> Span {
        Span {
            meter: ctx.first_on_my_host().then(Meter::start),
        }
    }

    /// Stops metering and gathers every host's figure to rank 0, which gets the run's
    /// `energy` record (None elsewhere). A collective: every rank calls it, after the
    /// timed part.
    pub fn end(self, ctx: &mut Context) -> Result<Option<serde_json::Value>> {
        let host = ctx.rank_hosts[ctx.rank()].clone();
        let mine: Option<Result<HostEnergy, String>> =
            self.meter.map(|m| m.and_then(|m| m.finish(&host)));
        let all = ctx.comm.gather(0, &serde_json::to_vec(&mine)?)?;
        let Some(all) = all else { return Ok(None) };
        let mut hosts = Vec::new();
        let mut missing = Vec::new();
        for bytes in all {
            match serde_json::from_slice::<Option<Result<HostEnergy, String>>>(&bytes)? {
                Some(Ok(h)) => hosts.push(h),
                Some(Err(why)) => missing.push(why),
                None => {}
            }
        }
        Ok(Some(record(&hosts, &missing)))
    }
}

/// The `energy` record: the hosts' joules summed over the longest span, or why there is
/// none. A run where some hosts could not be read has no total (it would be a part).
pub fn record(hosts: &[HostEnergy], missing: &[String]) -> serde_json::Value {
    if let Some(why) = missing.first() {
        return serde_json::json!({ "unavailable": why });
    }
    if hosts.is_empty() {
        return serde_json::json!({ "unavailable": "no host was metered" });
    }
    let joules: f64 = hosts.iter().map(|h| h.joules).sum();
    let seconds = hosts.iter().map(|h| h.seconds).fold(0.0, f64::max);
    // Hosts of one kind name it once; a mix (Macs and Linux boxes) names both.
    let mut sources: Vec<&str> = hosts
        .iter()
        .map(|h| {
            if h.source.is_empty() {
                POWERCAP
            } else {
                h.source.as_str()
            }
        })
        .collect();
    sources.dedup();
    sources.sort_unstable();
    sources.dedup();
    serde_json::json!({
        "joules": joules,
        "avg_watts": if seconds > 0.0 { joules / seconds } else { 0.0 },
        "seconds": seconds,
        "source": sources.join(" + "),
        "hosts": hosts,
    })
}

#[cfg(test)]
mod tests {
    use super::plausible_step;

    /// A step is energy where the counter stays in its range and the step (a wrap included)
    /// is one a package could use; a reading above the range, or a reset that looks like a
    /// wrap, is refused with the counter named.
    #[test]
    fn only_steps_a_package_could_use_count() {
        let range = 262_143_328_850u64;
        assert_eq!(plausible_step("package-0", 100, 150, range, 0.2), Ok(50));
        // A real wrap: 20 J across the range's end in 0.2 s (100 W).
        assert_eq!(
            plausible_step("package-0", range - 10_000_000, 10_000_000, range, 0.2),
            Ok(20_000_000)
        );
        let above = plausible_step("package-0", 100, range + 1, range, 0.2).unwrap_err();
        assert!(
            above.contains("package-0") && above.contains("above its range"),
            "{above}"
        );
        // A reset: the counter fell from mid-range to near zero, which as a wrap would be
        // 131 kJ in 0.2 s.
        let reset = plausible_step("package-0", range / 2, 5, range, 0.2).unwrap_err();
        assert!(reset.contains("a reset or a misread"), "{reset}");
    }
    use super::*;

    fn zone(root: &Path, name: &str, label: &str, uj: u64, range: u64) {
        let d = root.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("name"), format!("{label}\n")).unwrap();
        std::fs::write(d.join("energy_uj"), format!("{uj}\n")).unwrap();
        std::fs::write(d.join("max_energy_range_uj"), format!("{range}\n")).unwrap();
    }

    #[test]
    fn packages_are_read_and_their_parts_left_out() {
        let root = std::env::temp_dir().join(format!("tbbench-powercap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        zone(&root, "intel-rapl:0", "package-0", 5, 100);
        zone(&root, "intel-rapl:0:0", "core", 3, 100);
        zone(&root, "intel-rapl:1", "package-1", 7, 100);
        std::fs::create_dir_all(root.join("dtpm")).unwrap();
        let c = counters(&root).unwrap();
        let names: Vec<&str> = c.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["package-0", "package-1"]);
        // Nothing readable: one line saying why.
        let empty = root.join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        assert!(counters(&empty)
            .unwrap_err()
            .contains("no RAPL package counters"));
        std::fs::write(root.join("intel-rapl:1/energy_uj"), "garbage").unwrap();
        std::fs::remove_dir_all(root.join("intel-rapl:0")).unwrap();
        assert!(counters(&root).unwrap_err().contains("not a number"));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_record_without_every_host_has_no_total() {
        let h = HostEnergy {
            host: "a".into(),
            joules: 10.0,
            seconds: 2.0,
            domains: vec!["package-0".into()],
            wraps: 0,
            source: POWERCAP.into(),
        };
        let r = record(std::slice::from_ref(&h), &[]);
        assert_eq!(r["joules"], 10.0);
        assert_eq!(r["avg_watts"], 5.0);
        let r = record(&[h], &["powercap counters unreadable".into()]);
        assert!(r.get("joules").is_none());
        assert_eq!(r["unavailable"], "powercap counters unreadable");
    }
}
