//! Every suite tbbench has, one line each. The list makes the subcommands, `tbbench run
//! --quick` and their order in help; each suite's crate brings its flags, config and quick
//! settings in its `cli::registration()`.

use tbbench_runners::cli::Registration;

pub fn suites() -> Vec<Registration> {
    vec![
        tbbench_link::cli::registration(),
        tbbench_coll::cli::registration(),
        tbbench_hpl::cli::registration(),
        tbbench_infer::cli::registration(),
    ]
}
