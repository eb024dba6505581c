//! The report views of the results this crate writes: `infer` against a server
//! (`--endpoint`) and `decode`, the built-in distributed decode (`--gguf`, `--shape`).

mod decode;
mod infer;

pub use decode::DecodeView;
pub use infer::InferView;
use tbbench_reports::views::SuiteView;

/// In the order the report shows their sections.
pub fn views() -> Vec<Box<dyn SuiteView>> {
    vec![Box::new(InferView), Box::new(DecodeView)]
}
