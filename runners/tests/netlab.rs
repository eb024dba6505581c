//! The network lab for end-to-end tests: two network namespaces joined by veth pairs, one
//! subnet per "network", each shaped with tc tbf (scripts/netlab.sh). Needs root; a test
//! without it skips, saying why.
#![allow(dead_code)]

use crate::support::{is_root, skipped, text};
use std::path::Path;
use std::process::Command;

pub fn netlab(args: &[&str]) -> std::process::Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/netlab.sh");
    Command::new("bash")
        .arg(script)
        .args(args)
        .output()
        .unwrap()
}

/// Removes the namespaces even when the test fails. Holds a lock for its lifetime: the tests
/// of one test binary run in parallel and measure shaped rates, and a second lab's traffic on the same two cores would
/// take the CPU time the shaped link needs.
pub struct Lab(
    &'static str,
    #[allow(dead_code)] std::sync::MutexGuard<'static, ()>,
);

static ONE_LAB_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs scripts/netlab.sh with `args` to build a lab, holding the one-lab lock; None (the test
/// skips, saying why) without root or where the lab cannot be built.
fn build(args: &[&str]) -> Option<std::sync::MutexGuard<'static, ()>> {
    if !is_root() {
        skipped("needs root for network namespaces");
        return None;
    }
    let guard = ONE_LAB_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let up = netlab(args);
    if !up.status.success() {
        skipped(&format!("cannot build the lab: {}", text(&up.stderr)));
        return None;
    }
    Some(guard)
}

impl Lab {
    /// Builds the lab under `prefix`, or says why the test skips (not root, no netns support).
    pub fn up(prefix: &'static str) -> Option<Lab> {
        let guard = build(&["up", prefix])?;
        Some(Lab(prefix, guard))
    }
}
impl Drop for Lab {
    fn drop(&mut self) {
        netlab(&["down", self.0]);
    }
}

/// A cluster cabled as Thunderbolt clusters are (scripts/netlab.sh `cabled`): hosts
/// `PREFIX0..` with a cable per linked pair (a /30 each, shaped to its rate) and a management
/// network. Removed when dropped; one lab at a time per test binary, as [`Lab`].
pub struct CabledLab {
    pub prefix: &'static str,
    pub shape: &'static str,
    _guard: std::sync::MutexGuard<'static, ()>,
}

impl CabledLab {
    /// Builds `shape` (mesh3, mesh4, ring4, ring6, pair2) with the cables shaped to `rates` in cable
    /// order (the last repeats), or says why the test skips.
    pub fn up(shape: &'static str, prefix: &'static str, rates: &[&str]) -> Option<CabledLab> {
        let mut args = vec!["cabled", "up", shape, prefix];
        args.extend_from_slice(rates);
        let guard = build(&args)?;
        Some(CabledLab {
            prefix,
            shape,
            _guard: guard,
        })
    }

    /// Writes the lab's hostfile in `form` (openmpi list jaccl jaccl-ring ring) into `dir`.
    pub fn hostfile(&self, dir: &Path, form: &str) -> std::path::PathBuf {
        let o = netlab(&["cabled", "hostfile", self.shape, self.prefix, form]);
        assert!(o.status.success(), "{}", text(&o.stderr));
        let path = dir.join(format!("{}-{form}.hosts", self.shape));
        std::fs::write(&path, o.stdout).unwrap();
        path
    }

    /// Bytes host `h` has sent on each of its interfaces, by name.
    pub fn tx_bytes(&self, h: usize) -> Vec<(String, u64)> {
        let ns = format!("{}{h}", self.prefix);
        let o = Command::new("ip")
            .args(["netns", "exec", &ns, "sh", "-c"])
            .arg("for d in /sys/class/net/*; do echo \"${d##*/} $(cat $d/statistics/tx_bytes)\"; done")
            .output()
            .unwrap();
        text(&o.stdout)
            .lines()
            .filter_map(|l| {
                let (n, b) = l.split_once(' ')?;
                Some((n.to_string(), b.trim().parse().ok()?))
            })
            .collect()
    }
}

impl Drop for CabledLab {
    fn drop(&mut self) {
        netlab(&["cabled", "down", self.prefix]);
    }
}
