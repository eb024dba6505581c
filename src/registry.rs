//! Every suite tbbench has, one line each. The list makes the subcommands, `tbbench run
//! --quick`, their order in help and the order of the report's sections; each suite's crate
//! brings its flags, config and quick settings in its `cli::registration()` and how the
//! report reads its results in its `view::views()`.

use tbbench_reports::views::SuiteView;
use tbbench_runners::cli::Registration;

/// One suite: how it runs and how the report reads the results it writes. The two halves come
/// apart here because the runners never depend on the report.
pub struct SuiteEntry {
    pub registration: Registration,
    /// One per `suite` its result files carry (infer writes `infer` and `decode`).
    pub views: Vec<Box<dyn SuiteView>>,
}

fn entry(registration: Registration, views: Vec<Box<dyn SuiteView>>) -> SuiteEntry {
    SuiteEntry {
        registration,
        views,
    }
}

// One line per suite (rustfmt would spread the longer ones over three lines).
#[rustfmt::skip]
pub fn suites() -> Vec<SuiteEntry> {
    vec![
        entry(tbbench_link::cli::registration(), tbbench_link::view::views()),
        entry(tbbench_coll::cli::registration(), tbbench_coll::view::views()),
        entry(tbbench_hpl::cli::registration(), tbbench_hpl::view::views()),
        entry(tbbench_hpl::mxp::cli::registration(), tbbench_hpl::mxp::view::views()),
        entry(tbbench_infer::cli::registration(), tbbench_infer::view::views()),
        entry(tbbench_doctor::cli::registration(), tbbench_doctor::view::views()),
    ]
}
