//! Sizes that more than one crate enforces on the same value: defined once
//! here, at the bottom of the crate graph, so the side that writes a value
//! and the side that checks it cannot drift apart.

/// Longest unified diff of edited kernel sources that travels with a
/// candidate: the tools cut a longer one at a line when they keep it with an
/// artifact, and a task that carries a longer one is refused before it runs.
pub const MAX_SOURCE_DIFF_BYTES: usize = 16 * 1024;
