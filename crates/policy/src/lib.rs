//! The tuning strategy: the builtin policies that drive the leader's and the
//! workers' loops when no model is configured, and the rules both sides
//! follow to size and split a search.
//!
//! A policy is an ordinary [`mtswarm_core::ChatModel`]: it reads the
//! conversation and answers with tool calls or a final answer, so the
//! engine, the approvals, the tools and the events run exactly as with a
//! real model. That is also why this crate does no I/O, like the engine: it
//! is the strategy, and the daemons (`mtswarm-leader`, `mtswarm-worker`)
//! only host it.
//!
//! - [`leader`]: the job's plan (fleet, agents, the split of the space, the
//!   collection and the retry round, the answer).
//! - [`worker`]: a task's plan (the sequential plan and the model-guided
//!   search over the candidates it was given).
//! - [`plan`]: the leader-to-worker contract, one type at each end
//!   ([`plan::JobLine`], [`plan::TaskPlan`]).
//! - [`budget`] and [`partition`]: how many configurations a search
//!   evaluates and how a space is dealt out to agents.
//! - [`observations`]: what a job's agents tell each other, so that they
//!   search as one.
//! - [`replay`]: the whole search replayed against a recorded landscape
//!   (every figure known), to judge it and compare it with other tuners.

pub mod budget;
pub mod leader;
pub mod observations;
pub mod partition;
pub mod plan;
pub mod replay;
pub mod worker;

pub use budget::{
    MIN_AGENT_EVALUATIONS, MIN_SEARCH_EVALUATIONS, SEARCH_SHARE, search_agents, search_budget,
    split_budget,
};
pub use leader::BuiltinLeaderPolicy;
pub use partition::balanced_partitions;
pub use worker::BuiltinWorkerPolicy;
