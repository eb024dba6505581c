//! The tbbench result file, the contract between a run and everything that reads it later:
//! its versioned records (tool, hosts, network, verification), the one summary every suite
//! and reader uses for a spread of measurements, and writing and reading the file atomically.
//!
//! The bottom of the dependency graph: runners and suites write through it, the report layer
//! reads through it, and it depends on none of them (no charts, no HTML), so a runner that
//! writes result files never compiles the report.

pub mod result;
pub mod summary;
pub mod write;

pub use result::*;
pub use summary::{Percentiles, Summary};
