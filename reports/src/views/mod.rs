//! One view per suite: how the report reads that suite's `results` record, which figures are
//! its key metrics, and the section it contributes. Views read result files only, never a
//! suite's crate. A new suite adds one file here and one line in [`registry`].

pub mod decode;
pub mod hpl;
pub mod infer;
pub mod link;

use crate::load::Loaded;
use crate::metrics::Metric;
use crate::ResultFile;

pub trait SuiteView {
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
}

pub fn registry() -> Vec<Box<dyn SuiteView>> {
    vec![
        Box::new(link::LinkView),
        Box::new(hpl::HplView),
        Box::new(infer::InferView),
        Box::new(decode::DecodeView),
    ]
}

pub fn known_suites() -> Vec<&'static str> {
    registry().iter().map(|v| v.suite()).collect()
}

pub fn view_for(suite: &str) -> Option<Box<dyn SuiteView>> {
    registry().into_iter().find(|v| v.suite() == suite)
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

/// What makes two runs "the same network" for side-by-side tables: the label and the hosts.
pub fn network_id(r: &ResultFile) -> (String, Vec<String>) {
    let mut hosts: Vec<String> = r.hosts.iter().map(|h| h.hostname.clone()).collect();
    hosts.sort();
    (r.network.label.clone(), hosts)
}

/// Series names for runs shown side by side: the network label, with the hosts added only
/// where runs with one label ran on different hosts.
pub fn series_names(runs: &[&Loaded]) -> Vec<String> {
    runs.iter()
        .map(|r| {
            let label = &r.result.network.label;
            let shared = runs.iter().any(|o| {
                &o.result.network.label == label && network_id(&o.result) != network_id(&r.result)
            });
            if shared {
                format!("{label} on {}", network_id(&r.result).1.join(","))
            } else {
                label.clone()
            }
        })
        .collect()
}
