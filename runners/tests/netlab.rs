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

impl Lab {
    /// Builds the lab under `prefix`, or says why the test skips (not root, no netns support).
    pub fn up(prefix: &'static str) -> Option<Lab> {
        if !is_root() {
            skipped("needs root for network namespaces");
            return None;
        }
        let guard = ONE_LAB_AT_A_TIME
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let up = netlab(&["up", prefix]);
        if !up.status.success() {
            skipped(&format!("cannot build the lab: {}", text(&up.stderr)));
            return None;
        }
        Some(Lab(prefix, guard))
    }
}
impl Drop for Lab {
    fn drop(&mut self) {
        netlab(&["down", self.0]);
    }
}
