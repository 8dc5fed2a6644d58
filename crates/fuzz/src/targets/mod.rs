//! The fuzz targets, one module per boundary; [`all`] lists them in the
//! order the suite runs them.

mod bus;
mod configs;
mod harness;
mod mcp;
mod rpcs;
mod sse;
mod submit;
mod task;
mod text_calls;
mod tool_args;
mod tune;

use crate::Target;

/// Every target.
pub fn all() -> Vec<Target> {
    vec![
        sse::TARGET,
        text_calls::TARGET,
        harness::TARGET,
        tune::TARGET,
        bus::TARGET,
        tool_args::TARGET,
        submit::TARGET,
        rpcs::TARGET,
        mcp::TARGET,
        task::TARGET,
        configs::TARGET,
    ]
}

/// The target called `name`.
pub fn named(name: &str) -> Option<Target> {
    all().into_iter().find(|t| t.name == name)
}
