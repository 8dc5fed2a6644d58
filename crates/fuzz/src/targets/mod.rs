//! The fuzz targets, one module per boundary; [`all`] lists them in the
//! order the suite runs them.

mod bus;
mod harness;
mod sse;
mod text_calls;
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
    ]
}

/// The target called `name`.
pub fn named(name: &str) -> Option<Target> {
    all().into_iter().find(|t| t.name == name)
}
