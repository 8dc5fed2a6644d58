//! Test and benchmark support, behind the `testing` cargo feature (enabled
//! by the crates that use it in their `[dev-dependencies]`): the bench pieces
//! that measure the transport floor, a local nats-server cluster, the
//! local nats-server under the name tests have always used, a bus connected
//! to it with the test topology, and the wait for a kept lease's renewal
//! that the restart and failover tests share.

use std::time::Duration;

use tokio::sync::watch;

use crate::config::{BusConfig, TopologyConfig};
use crate::connection::Bus;
use crate::leases::KeptLease;

pub mod bench;
pub mod cluster;

pub use crate::local_server::NatsServer;

/// How long [`ready_bus`] waits for the connection.
const CONNECT_WAIT: Duration = Duration::from_secs(30);

/// A local nats-server started off the async runtime (it waits for the
/// server to listen); panics when it does not start.
pub async fn start_nats() -> NatsServer {
    tokio::task::spawn_blocking(NatsServer::start)
        .await
        .expect("the nats-server start task")
        .expect("nats-server starts")
}

/// A bus connected with `config` (within 30 s) and the test topology
/// created or checked through it; panics on failure.
pub async fn ready_bus(config: BusConfig) -> Bus {
    let bus = Bus::connect(config).await.expect("connect to nats-server");
    bus.wait_connected(CONNECT_WAIT)
        .await
        .expect("connected to nats-server");
    bus.ensure_topology(&TopologyConfig::small())
        .await
        .expect("the test topology");
    bus
}

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
