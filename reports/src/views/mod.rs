//! The seam between the report and the suites: a [`SuiteView`] says how the report reads one
//! suite's `results` record, which figures are its key metrics, and the section it
//! contributes. Each suite's crate brings its own views (`suites/NAME/src/view.rs`); the
//! report never imports a suite, so the program that has both hands the views in once at start
//! ([`install`]), and [`registry`], [`view_for`] and [`known_suites`] read that set. Views read
//! result files only, and build on the helpers here and the report's `chart`, `html` and
//! `metrics`.

use crate::load::Loaded;
use crate::metrics::Metric;
use crate::ResultFile;
use std::sync::OnceLock;

/// Send + Sync: the installed views live in a static the whole program reads.
pub trait SuiteView: Send + Sync {
    /// The `suite` field of the results this view reads.
    fn suite(&self) -> &'static str;
    /// Section heading.
    fn title(&self) -> &'static str;
    /// Whether `results` has the shape this view reads; Err is one line saying what is wrong.
    fn check(&self, r: &ResultFile) -> Result<(), String>;
    /// The run's key figures, for compare, history and the exports.
    fn metrics(&self, r: &ResultFile) -> Vec<Metric>;
    /// The section over every run of this suite (oldest first), networks side by side, as
    /// HTML and as the same content in data.
    fn section(&self, runs: &[&Loaded]) -> (String, serde_json::Value);
    /// What the run chose for itself that moves its figures apart from the code's (hpl: the
    /// trailing update's product), as (what, value) pairs: compare names each one whose
    /// values differ between the baseline and the new runs. None by default.
    fn setup(&self, _r: &ResultFile) -> Vec<(String, String)> {
        Vec::new()
    }
    /// Other suites whose runs this view's section also reads (hpl-mxp sets its solves beside
    /// hpl's); they arrive with its own in `section`'s runs. None by default.
    fn companions(&self) -> &'static [&'static str] {
        &[]
    }
}

static INSTALLED: OnceLock<Vec<Box<dyn SuiteView>>> = OnceLock::new();

/// Sets the views the report, compare and exports read, in the order the report shows their
/// sections; the first call wins (the set is fixed for the program's life).
pub fn install(views: Vec<Box<dyn SuiteView>>) {
    let _ = INSTALLED.set(views);
}

/// The installed views; none before [`install`].
pub fn registry() -> &'static [Box<dyn SuiteView>] {
    INSTALLED.get().map(Vec::as_slice).unwrap_or_default()
}

/// Err (one line) when no view is installed: then no result file could be read, and every
/// input would be left out as an unknown suite.
pub fn require_installed() -> anyhow::Result<()> {
    if registry().is_empty() {
        anyhow::bail!("no suite views installed");
    }
    Ok(())
}

pub fn known_suites() -> Vec<&'static str> {
    registry().iter().map(|v| v.suite()).collect()
}

pub fn view_for(suite: &str) -> Option<&'static dyn SuiteView> {
    registry()
        .iter()
        .find(|v| v.suite() == suite)
        .map(|v| v.as_ref())
}

/// The newest run of each network (and host set), in the order networks first appear: what
/// side-by-side tables and charts show. Older runs live in the history section.
pub fn newest_per_network<'a>(runs: &[&'a Loaded]) -> Vec<&'a Loaded> {
    let mut out: Vec<&Loaded> = Vec::new();
    for r in runs {
        let id = network_id(&r.result);
        match out.iter_mut().find(|o| network_id(&o.result) == id) {
            Some(slot) => *slot = r,
            None => out.push(r),
        }
    }
    out
}

/// The network's name wherever figures show. A software stand-in for RDMA (link kind
/// `rdma-emulated`, tbbench's softrdma device) always says "(emulated)", even where a result
/// file's label does not, so its figures are never read as RDMA measurements.
pub fn network_label(n: &tbbench_schema::Network) -> String {
    if n.link_kind == "rdma-emulated" && !n.label.contains("(emulated)") {
        format!("{} (emulated)", n.label)
    } else {
        n.label.clone()
    }
}

/// What makes two runs "the same network" for side-by-side tables: the label and the hosts.
pub fn network_id(r: &ResultFile) -> (String, Vec<String>) {
    let mut hosts: Vec<String> = r.hosts.iter().map(|h| h.hostname.clone()).collect();
    hosts.sort();
    (network_label(&r.network), hosts)
}

/// Series names for runs shown side by side: the network label, with the hosts added only
/// where runs with one label ran on different hosts.
pub fn series_names(runs: &[&Loaded]) -> Vec<String> {
    runs.iter()
        .map(|r| {
            let label = &network_label(&r.result.network);
            let shared = runs.iter().any(|o| {
                &network_label(&o.result.network) == label
                    && network_id(&o.result) != network_id(&r.result)
            });
            if shared {
                format!("{label} on {}", network_id(&r.result).1.join(","))
            } else {
                label.clone()
            }
        })
        .collect()
}

/// "2026-12-02 15:21" from an RFC 3339 stamp; the stamp itself when it is not one.
pub fn short_time(rfc3339: &str) -> String {
    if rfc3339.len() >= 16 && rfc3339.as_bytes().get(10) == Some(&b'T') {
        format!("{} {}", &rfc3339[..10], &rfc3339[11..16])
    } else {
        rfc3339.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::network_label;
    use tbbench_schema::Network;

    #[test]
    fn emulated_rdma_is_always_labelled_emulated() {
        let net = |kind: &str, label: &str| Network {
            link_kind: kind.into(),
            label: label.into(),
            ..Default::default()
        };
        assert_eq!(
            network_label(&net("rdma-emulated", "verbs/softrdma_apple0 (thunderbolt)")),
            "verbs/softrdma_apple0 (thunderbolt) (emulated)"
        );
        assert_eq!(
            network_label(&net("rdma-emulated", "verbs/softrdma_apple0 (emulated)")),
            "verbs/softrdma_apple0 (emulated)",
            "said once"
        );
        assert_eq!(
            network_label(&net("rdma", "verbs/mlx5_0 (roce)")),
            "verbs/mlx5_0 (roce)"
        );
    }
}
