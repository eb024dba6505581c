//! What machine a rank ran on: OS, CPU, cores and memory, read from the OS so every result
//! file says where its figures came from.
//!
//! Reading never fails: a field the OS will not tell becomes "unknown" or 0, because a missing
//! detail must not cost a finished benchmark run. The parsers are pure functions over the text
//! the OS hands out, so they are tested on samples from machines we do not have at hand.

use tbbench_schema::Host;

/// Placeholder for a text field the OS did not report.
const UNKNOWN: &str = "unknown";

/// This host as a [`Host`] record, with `blas` unset and `ranks` empty (the caller fills those).
pub fn this_host() -> Host {
    // The machine's online CPUs, not this process's affinity mask: under mpirun each rank is
    // bound to one core, yet the host still has all of them.
    // SAFETY: sysconf has no preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    let cores_logical = if online > 0 {
        online as usize
    } else {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    };
    let mut host = Host {
        hostname: hostname().unwrap_or_else(|| UNKNOWN.to_string()),
        os: std::env::consts::OS.to_string(),
        os_version: UNKNOWN.to_string(),
        kernel: kernel_release().unwrap_or_else(|| UNKNOWN.to_string()),
        arch: std::env::consts::ARCH.to_string(),
        cpu_model: UNKNOWN.to_string(),
        cores_physical: 0,
        cores_logical,
        memory_total_bytes: 0,
        memory_available_bytes: 0,
        transparent_hugepages: None,
        tcp_congestion_control: None,
        blas: None,
        ranks: Vec::new(),
    };
    fill_os_specific(&mut host);
    if host.cores_physical == 0 {
        // Without topology information the logical count is the best honest figure.
        host.cores_physical = cores_logical;
    }
    host
}

#[cfg(target_os = "linux")]
fn fill_os_specific(host: &mut Host) {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    if let Some(pretty) = read("/etc/os-release")
        .or_else(|| read("/usr/lib/os-release"))
        .and_then(|text| parse_os_release(&text))
    {
        host.os_version = pretty;
    }
    if let Some(text) = read("/proc/cpuinfo") {
        let cpu = parse_cpuinfo(&text);
        if let Some(model) = cpu.model {
            host.cpu_model = model;
        }
        host.cores_physical = cpu.cores_physical.unwrap_or(0);
    }
    if let Some(text) = read("/proc/meminfo") {
        let mem = parse_meminfo(&text);
        host.memory_total_bytes = mem.total_bytes.unwrap_or(0);
        host.memory_available_bytes = mem.available_bytes.unwrap_or(0);
    }
    host.transparent_hugepages =
        read("/sys/kernel/mm/transparent_hugepage/enabled").and_then(|text| selected_option(&text));
    host.tcp_congestion_control = tcp_congestion("congestion_control");
}

/// One of Linux's TCP congestion-control settings, trimmed: "congestion_control" (the
/// default), "available_congestion_control" or "allowed_congestion_control" (lists).
pub fn tcp_congestion(setting: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/sys/net/ipv4/tcp_{setting}"))
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

/// The bracketed choice of a sysfs option list ("always [madvise] never" → "madvise").
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn selected_option(text: &str) -> Option<String> {
    let start = text.find('[')? + 1;
    let len = text[start..].find(']')?;
    Some(text[start..start + len].to_string())
}

#[cfg(target_os = "macos")]
fn fill_os_specific(host: &mut Host) {
    if let Some(version) = command_output("sw_vers", &["-productVersion"]) {
        host.os_version = format!("macOS {version}");
    }
    if let Some(model) = sysctl("machdep.cpu.brand_string") {
        host.cpu_model = model;
    }
    host.cores_physical = sysctl("hw.physicalcpu")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    host.memory_total_bytes = sysctl("hw.memsize")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if let Some(text) = command_output("vm_stat", &[]) {
        // vm_stat states its own page size; fall back to the system's when the header changes.
        let page_size = parse_vm_stat_page_size(&text)
            .or_else(|| sysctl("hw.pagesize").and_then(|s| s.parse().ok()))
            .unwrap_or(0);
        host.memory_available_bytes = parse_vm_stat(&text, page_size).unwrap_or(0);
    }
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn fill_os_specific(_host: &mut Host) {}

/// Trimmed stdout of a command that ran and succeeded; None otherwise (missing tool, sandbox).
#[cfg(target_os = "macos")]
fn command_output(program: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!text.is_empty()).then_some(text)
}

#[cfg(target_os = "macos")]
fn sysctl(name: &str) -> Option<String> {
    command_output("sysctl", &["-n", name])
}

/// The host name as the kernel knows it (what `hostname` prints).
pub fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for `buf.len()` bytes; the kernel writes at most that many.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    // POSIX does not promise a terminating NUL on truncation, so cut at the first NUL or the end.
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).trim().to_string();
    (!name.is_empty()).then_some(name)
}

/// `uname -r`: the kernel release ("6.1.0-18-amd64", "25.2.0" for Darwin).
fn kernel_release() -> Option<String> {
    // SAFETY: utsname is plain old data, all-zero is a valid value, and uname only writes it.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `uts` is a valid, writable utsname.
    if unsafe { libc::uname(&mut uts) } != 0 {
        return None;
    }
    // Read up to the NUL without trusting that one exists; to_ne_bytes avoids a cast that is
    // a no-op where c_char is u8 and a sign change where it is i8.
    let bytes: Vec<u8> = uts
        .release
        .iter()
        .map(|c| c.to_ne_bytes()[0])
        .take_while(|&b| b != 0)
        .collect();
    let release = String::from_utf8_lossy(&bytes).trim().to_string();
    (!release.is_empty()).then_some(release)
}

/// The figures `/proc/meminfo` gives that a result file records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemInfo {
    pub total_bytes: Option<u64>,
    pub available_bytes: Option<u64>,
}

/// Parses `/proc/meminfo`. MemAvailable is the kernel's own estimate of what can be allocated
/// without swapping; kernels before 3.14 lack it, so MemFree + Buffers + Cached stands in.
pub fn parse_meminfo(text: &str) -> MemInfo {
    let field = |key: &str| -> Option<u64> {
        text.lines().find_map(|line| {
            let (k, rest) = line.split_once(':')?;
            if k.trim() != key {
                return None;
            }
            let mut parts = rest.split_whitespace();
            let value: u64 = parts.next()?.parse().ok()?;
            // Values are in kibibytes ("kB"); a bare number (HugePages_Total) has no unit.
            let scale = match parts.next() {
                Some(unit) if unit.eq_ignore_ascii_case("kb") => 1024,
                Some(unit) if unit.eq_ignore_ascii_case("mb") => 1024 * 1024,
                _ => 1,
            };
            value.checked_mul(scale)
        })
    };
    let available = field("MemAvailable").or_else(|| {
        let free = field("MemFree")?;
        Some(free + field("Buffers").unwrap_or(0) + field("Cached").unwrap_or(0))
    });
    MemInfo {
        total_bytes: field("MemTotal"),
        available_bytes: available,
    }
}

/// What `/proc/cpuinfo` tells about the CPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuInfo {
    /// "model name" (x86), else "Hardware"/"cpu model"/"Model" (some ARM and other kernels).
    pub model: Option<String>,
    /// Distinct (physical id, core id) pairs; None when the kernel does not list them.
    pub cores_physical: Option<usize>,
}

/// Parses `/proc/cpuinfo`: one blank-line-separated block per logical CPU.
pub fn parse_cpuinfo(text: &str) -> CpuInfo {
    let mut model_name = None;
    let mut fallback_model = None;
    let mut cores = std::collections::BTreeSet::new();
    for block in text.split("\n\n") {
        let mut physical_id = None;
        let mut core_id = None;
        for line in block.lines() {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let (key, value) = (key.trim(), value.trim());
            if value.is_empty() {
                continue;
            }
            match key {
                "model name" if model_name.is_none() => model_name = Some(value.to_string()),
                "Hardware" | "cpu model" | "Model" if fallback_model.is_none() => {
                    fallback_model = Some(value.to_string())
                }
                "physical id" => physical_id = Some(value.to_string()),
                "core id" => core_id = Some(value.to_string()),
                _ => {}
            }
        }
        if let Some(core) = core_id {
            // A single-socket kernel may omit "physical id"; the core id alone is then unique.
            cores.insert((physical_id.unwrap_or_default(), core));
        }
    }
    CpuInfo {
        model: model_name.or(fallback_model),
        cores_physical: (!cores.is_empty()).then_some(cores.len()),
    }
}

/// The distribution's name from `/etc/os-release`: PRETTY_NAME, else NAME and VERSION_ID.
pub fn parse_os_release(text: &str) -> Option<String> {
    let field = |key: &str| -> Option<String> {
        text.lines().find_map(|line| {
            let (k, v) = line.trim().split_once('=')?;
            if k != key {
                return None;
            }
            let v = unquote(v.trim());
            (!v.is_empty()).then_some(v)
        })
    };
    field("PRETTY_NAME").or_else(|| {
        let name = field("NAME")?;
        Some(match field("VERSION_ID") {
            Some(version) => format!("{name} {version}"),
            None => name,
        })
    })
}

/// Shell-style quoting as os-release allows it: "…" or '…', with backslash escapes in "…".
fn unquote(value: &str) -> String {
    let bytes = value.as_bytes();
    if bytes.len() >= 2 && bytes[0] == b'\'' && bytes[bytes.len() - 1] == b'\'' {
        return value[1..value.len() - 1].to_string();
    }
    if bytes.len() >= 2 && bytes[0] == b'"' && bytes[bytes.len() - 1] == b'"' {
        let mut out = String::new();
        let mut chars = value[1..value.len() - 1].chars();
        while let Some(c) = chars.next() {
            if c == '\\' {
                if let Some(next) = chars.next() {
                    out.push(next);
                }
            } else {
                out.push(c);
            }
        }
        return out;
    }
    value.to_string()
}

/// The page size `vm_stat` states in its header ("(page size of 16384 bytes)").
pub fn parse_vm_stat_page_size(text: &str) -> Option<u64> {
    let after = text.split("page size of").nth(1)?;
    after.split_whitespace().next()?.parse().ok()
}

/// Memory macOS can hand out without paging, from `vm_stat`: free + inactive + speculative pages,
/// times `page_size`. None when none of those lines is present (not vm_stat output).
pub fn parse_vm_stat(text: &str, page_size: u64) -> Option<u64> {
    let mut pages: Option<u64> = None;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        if matches!(
            key.trim(),
            "Pages free" | "Pages inactive" | "Pages speculative"
        ) {
            if let Ok(n) = value.trim().trim_end_matches('.').parse::<u64>() {
                pages = Some(pages.unwrap_or(0).saturating_add(n));
            }
        }
    }
    pages.map(|p| p.saturating_mul(page_size))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str = "\
MemTotal:       131891508 kB
MemFree:        98765432 kB
MemAvailable:   120000000 kB
Buffers:          123456 kB
Cached:          9876543 kB
SwapCached:            0 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
";

    #[test]
    fn meminfo_total_and_available_in_bytes() {
        let mem = parse_meminfo(MEMINFO);
        assert_eq!(mem.total_bytes, Some(131_891_508 * 1024));
        assert_eq!(mem.available_bytes, Some(120_000_000 * 1024));
    }

    #[test]
    fn meminfo_without_memavailable_falls_back_to_free_buffers_cached() {
        let old = "MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 20 kB\nCached: 300 kB\n";
        let mem = parse_meminfo(old);
        assert_eq!(mem.total_bytes, Some(1000 * 1024));
        assert_eq!(mem.available_bytes, Some(420 * 1024));
    }

    #[test]
    fn meminfo_garbage_gives_none() {
        assert_eq!(parse_meminfo("not meminfo at all\n"), MemInfo::default());
        assert_eq!(parse_meminfo(""), MemInfo::default());
    }

    /// Two sockets, two cores each, hyperthreaded: 8 logical CPUs, 4 physical cores.
    fn x86_cpuinfo() -> String {
        let mut text = String::new();
        let mut processor = 0;
        for _thread in 0..2 {
            for socket in 0..2 {
                for core in 0..2 {
                    text.push_str(&format!(
                        "processor\t: {processor}\n\
                         vendor_id\t: GenuineIntel\n\
                         cpu family\t: 6\n\
                         model\t\t: 85\n\
                         model name\t: Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz\n\
                         physical id\t: {socket}\n\
                         siblings\t: 4\n\
                         core id\t\t: {core}\n\
                         cpu cores\t: 2\n\
                         flags\t\t: fpu vme de pse avx2 avx512f\n\n"
                    ));
                    processor += 1;
                }
            }
        }
        text
    }

    #[test]
    fn cpuinfo_x86_counts_distinct_socket_core_pairs() {
        let cpu = parse_cpuinfo(&x86_cpuinfo());
        assert_eq!(
            cpu.model.as_deref(),
            Some("Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz")
        );
        assert_eq!(cpu.cores_physical, Some(4));
    }

    #[test]
    fn cpuinfo_arm_without_topology() {
        let text = "\
processor\t: 0
BogoMIPS\t: 48.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics
CPU implementer\t: 0x41
CPU architecture: 8
CPU part\t: 0xd0c
CPU revision\t: 1

processor\t: 1
BogoMIPS\t: 48.00
CPU part\t: 0xd0c

Hardware\t: BCM2835
Model\t\t: Raspberry Pi 4 Model B Rev 1.4
";
        let cpu = parse_cpuinfo(text);
        assert_eq!(cpu.model.as_deref(), Some("BCM2835"));
        assert_eq!(cpu.cores_physical, None);
    }

    #[test]
    fn os_release_pretty_name_unquoted() {
        let text = "\
PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"
NAME=\"Debian GNU/Linux\"
VERSION_ID=\"12\"
VERSION=\"12 (bookworm)\"
ID=debian
";
        assert_eq!(
            parse_os_release(text).as_deref(),
            Some("Debian GNU/Linux 12 (bookworm)")
        );
        let single = "PRETTY_NAME='Ubuntu 24.04.1 LTS'\n";
        assert_eq!(
            parse_os_release(single).as_deref(),
            Some("Ubuntu 24.04.1 LTS")
        );
        let escaped = "PRETTY_NAME=\"Say \\\"hi\\\" OS\"\n";
        assert_eq!(parse_os_release(escaped).as_deref(), Some("Say \"hi\" OS"));
    }

    #[test]
    fn os_release_without_pretty_name_uses_name_and_version() {
        let text = "# comment\nNAME=Fedora\nVERSION_ID=41\n";
        assert_eq!(parse_os_release(text).as_deref(), Some("Fedora 41"));
        assert_eq!(parse_os_release("ID=x\n"), None);
    }

    const VM_STAT: &str = "\
Mach Virtual Memory Statistics: (page size of 16384 bytes)
Pages free:                               123456.
Pages active:                            2345678.
Pages inactive:                          2300000.
Pages speculative:                         10000.
Pages throttled:                               0.
Pages wired down:                         456789.
Pages purgeable:                           12345.
\"Translation faults\":                 987654321.
Pages copy-on-write:                    12345678.
Pages zero filled:                     876543210.
Pages reactivated:                        123456.
Pages purged:                             234567.
File-backed pages:                       1500000.
Anonymous pages:                         3100000.
Pages stored in compressor:               400000.
Pages occupied by compressor:             100000.
Decompressions:                           500000.
Compressions:                             900000.
Pageins:                                 4000000.
Pageouts:                                  10000.
Swapins:                                       0.
Swapouts:                                      0.
";

    #[test]
    fn vm_stat_free_inactive_speculative_times_page_size() {
        assert_eq!(parse_vm_stat_page_size(VM_STAT), Some(16384));
        let expected = (123_456 + 2_300_000 + 10_000) * 16384;
        assert_eq!(parse_vm_stat(VM_STAT, 16384), Some(expected));
        assert_eq!(parse_vm_stat("nothing here", 16384), None);
        assert_eq!(parse_vm_stat_page_size("nothing here"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_host_on_linux_has_cores_memory_and_name() {
        let host = this_host();
        assert!(
            !host.hostname.is_empty() && host.hostname != UNKNOWN,
            "{host:?}"
        );
        assert_eq!(host.os, "linux");
        assert!(host.cores_logical > 0, "{host:?}");
        assert!(host.cores_physical > 0, "{host:?}");
        assert!(host.memory_total_bytes > 0, "{host:?}");
        assert!(host.memory_available_bytes > 0, "{host:?}");
        assert!(
            host.memory_available_bytes <= host.memory_total_bytes,
            "{host:?}"
        );
        assert!(host.blas.is_none() && host.ranks.is_empty());
        // The kernel's own file, read back as it reads now.
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok();
        assert_eq!(
            host.transparent_hugepages,
            thp.and_then(|t| selected_option(&t))
        );
        let cc = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control").ok();
        assert_eq!(
            host.tcp_congestion_control.as_deref(),
            cc.as_deref().map(str::trim)
        );
    }

    #[test]
    fn sysfs_option_lists_give_the_bracketed_choice() {
        assert_eq!(
            selected_option("always [madvise] never\n").as_deref(),
            Some("madvise")
        );
        assert_eq!(
            selected_option("[always] madvise never").as_deref(),
            Some("always")
        );
        assert_eq!(selected_option("always madvise never"), None);
        assert_eq!(selected_option("[unterminated"), None);
    }
}
