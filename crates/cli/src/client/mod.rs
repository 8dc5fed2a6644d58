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

pub use crate::decision::decide_approval;
pub use approvals::{ApprovalsCmd, DecideCmd, approvals, decide};
pub use fleet::{FleetCmd, fleet};
pub use jobs::{CancelCmd, JobsCmd, cancel, jobs};
pub use quarantine::{QuarantineLiftCmd, QuarantineListCmd, quarantine_lift, quarantine_list};
pub use submit::{SubmitCmd, submit};
pub use tasks::{ResultsFormat, StatusFilter, TasksCmd, tasks};
