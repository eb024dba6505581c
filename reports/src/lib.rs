//! tbbench result files: the versioned schema, summaries of repetitions, atomic writing.
//! Reads and writes files only; never imports a suite or a runner.

pub mod schema;
pub mod summary;
pub mod write;

pub use schema::*;
pub use summary::Summary;
