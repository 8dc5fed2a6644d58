//! The chaos suite: the behaviour the reliability contract promises, checked
//! by breaking a real fleet (a real nats-server with a file store, the
//! leader and worker daemons as `mtswarm-node` processes) while it runs a
//! job, one numbered scenario per module:
//!
//! 1. [`worker_death`]: a worker SIGKILLed mid-task;
//! 2. [`fencing`]: a worker SIGSTOPped past its lease, then SIGCONTed;
//! 3. [`leader_death`]: the leader SIGKILLed mid-job, a new one started;
//! 4. [`nats_restart`]: the NATS server stopped and started mid-job;
//! 5. [`flaky_slices`]: a slice whose runs always crash gets quarantined;
//! 6. [`approvals`]: a session paused for approval loses its worker;
//! 7. [`burst`]: 1,000 submissions against small leader limits;
//! 8. [`lost_streams`]: the results stream deleted mid-job;
//! 9. [`nats_cluster`]: a stream leader of a 3-node NATS cluster SIGKILLed
//!    mid-job, then restarted.
//! 10. [`two_leaders`]: two leaders; the job's owner SIGKILLed, or
//!     SIGSTOPped past its lease and SIGCONTed.
//!
//! Leases last 2 s so each scenario takes tens of seconds. Scenarios run
//! one at a time (they measure recovery) and print their figures as
//! `CHAOS-FIGURES ...` lines (`-- --nocapture` shows them; `deploy/soak.sh`
//! collects them).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

mod approvals;
mod burst;
mod fencing;
mod flaky_slices;
mod leader_death;
mod lost_streams;
mod nats_cluster;
mod nats_restart;
mod support;
mod two_leaders;
mod worker_death;
