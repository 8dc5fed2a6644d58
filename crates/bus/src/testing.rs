//! Test and benchmark support, behind the `testing` cargo feature (enabled
//! by the crates that use it in their `[dev-dependencies]`): the bench pieces
//! that measure the transport floor, a local nats-server cluster, the
//! local nats-server under the name tests have always used, and the wait
//! for a kept lease's renewal that the restart and failover tests share.

use std::time::Duration;

use tokio::sync::watch;

use crate::leases::KeptLease;

pub mod bench;
pub mod cluster;

pub use crate::local_server::NatsServer;

/// The first state of a kept lease (`state`, from
/// [`crate::LeaseKeeper::subscribe`]) that is a renewal past `revision`,
/// or a loss (which the caller then fails on); panics after `within`.
pub async fn renewed_after(
    state: &mut watch::Receiver<KeptLease>,
    revision: u64,
    within: Duration,
) -> KeptLease {
    tokio::time::timeout(
        within,
        state.wait_for(|s| match s {
            KeptLease::Held(held) => held.revision > revision,
            _ => true,
        }),
    )
    .await
    .expect("the lease was renewed (or lost) in time")
    .expect("the keeper is alive")
    .clone()
}
