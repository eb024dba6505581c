//! tbbench result files and what reads them: the versioned schema, summaries of repetitions,
//! atomic writing, and the report, compare and export built on them. Never imports a suite or
//! a runner: suites are read through their result files (views/).

pub mod chart;
pub mod commands;
pub mod compare;
pub mod export;
pub mod html;
pub mod load;
pub mod metrics;
pub mod report;
pub mod schema;
pub mod summary;
pub mod views;
pub mod write;

pub use schema::*;
pub use summary::Summary;
