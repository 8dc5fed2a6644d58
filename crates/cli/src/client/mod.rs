//! The client commands that talk to the leader's Control service: `submit`,
//! `jobs`, `fleet`, `quarantine list` / `quarantine lift`, `approvals`,
//! `approve` / `deny` and `tasks`. Each prints a table for people by default
//! and JSON with `--json` (one object; `tasks` also speaks JSON lines and
//! CSV). One file per command family.

mod approvals;
mod fleet;
mod jobs;
mod output;
mod quarantine;
mod submit;
mod tasks;

pub(crate) use approvals::{ApprovalsCmd, DecideCmd, approvals, decide};
pub(crate) use fleet::{FleetCmd, fleet};
pub(crate) use jobs::{CancelCmd, JobsCmd, cancel, jobs};
pub(crate) use quarantine::{
    QuarantineLiftCmd, QuarantineListCmd, quarantine_lift, quarantine_list,
};
pub(crate) use submit::{SubmitCmd, submit};
pub(crate) use tasks::{TasksCmd, tasks};
