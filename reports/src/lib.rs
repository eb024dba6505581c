//! What reads tbbench result files: the report, compare and export, built on the schema
//! (`tbbench-schema`, re-exported here). Never imports a suite or a runner: suites are read
//! through their result files, by the views each suite's crate brings and the program
//! installs (views/).

pub mod chart;
pub mod commands;
pub mod compare;
pub mod export;
pub mod html;
pub mod load;
pub mod metrics;
pub mod report;
pub mod topology;
pub mod views;

pub use tbbench_schema::*;
