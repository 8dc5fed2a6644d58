//! `mtswarm fleet` and `mtswarm quarantine list|lift` against a real leader
//! (in process) on a real nats-server: a worker's registration and a
//! quarantine record are written to the buckets the way a worker daemon
//! writes them; the binary shows the slice quarantined with its reason and
//! failure count, lifts it, and shows it free again.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::process::Output;
use std::time::Duration;

use mtswarm_bus::testing::NatsServer;
use mtswarm_bus::{Bus, BusConfig, LeaseRequest, Leases, Quarantine, Workers, v1};
use mtswarm_leader::{LeaderConfig, LeaderDaemon};
use serde_json::Value;

use common::{kernels, mtswarm_command, stdout_of};

fn mtswarm(leader: &str, args: &[&str]) -> Output {
    mtswarm_command()
        .args(args)
        .env("MTSWARM_LEADER", leader)
        .output()
        .expect("run mtswarm")
}

fn json_of(output: &Output, what: &str) -> Value {
    serde_json::from_str(&stdout_of(output, what))
        .unwrap_or_else(|e| panic!("{what}: not JSON: {e}"))
}

fn slice(id: &str, cluster: i32) -> v1::SliceDescriptor {
    v1::SliceDescriptor {
        slice_id: id.to_string(),
        board: "board0".to_string(),
        cluster,
        cores: 2,
        backend: "emulator".to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quarantined_slice_is_listed_and_lifted() {
    let nats = tokio::task::spawn_blocking(NatsServer::start)
        .await
        .expect("task")
        .expect("nats-server starts (see deploy/setup.sh)");
    let kernels = kernels();
    let mut config = LeaderConfig::new(nats.url(), kernels);
    config.topology = mtswarm_bus::TopologyConfig::small();
    let leader = LeaderDaemon::start(config)
        .await
        .expect("the leader starts");
    let leader_url = format!("http://{}", leader.grpc_addr());
    let bus = Bus::connect(BusConfig::new(nats.url()))
        .await
        .expect("connect");
    let quarantine = write_worker_state(&bus).await;

    let url = leader_url.clone();
    let printed = tokio::task::spawn_blocking(move || Printed::run(&url))
        .await
        .expect("cli runs");

    assert_fleet_shows_each_state(&printed.table, &printed.fleet);
    let listed = &printed.listed;
    let entries = listed["quarantined"].as_array().expect("a list");
    assert_eq!(entries.len(), 1, "{listed}");
    assert_eq!(entries[0]["slice_id"], "board0-c0");
    assert_eq!(entries[0]["consecutive_failures"], 3);
    assert_eq!(entries[0]["by"], "worker-board0");
    let listed_table = &printed.listed_table;
    assert!(
        listed_table.contains("board0-c0") && listed_table.contains("crash"),
        "{listed_table}"
    );

    let (lifted, after, again) = (&printed.lifted, &printed.after, &printed.again);
    assert_eq!(lifted["lifted"], true, "{lifted}");
    assert_eq!(
        lifted["previous"]["reason"],
        "3 hardware runs failed in a row (crash)"
    );
    assert_eq!(state_of(after, "board0-c0"), "free", "{after}");
    assert!(again.contains("was not quarantined"), "{again}");
    assert!(quarantine.get("board0-c0").await.expect("get").is_none());
    let bad = &printed.bad;
    assert!(!bad.status.success(), "an invalid slice id is refused");
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("invalid request"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    leader.shutdown().await.expect("leader shutdown");
}

/// What a worker daemon would have written: its registration (two slices),
/// a quarantine of one of them, and a lease of a worker that is gone.
async fn write_worker_state(bus: &Bus) -> Quarantine {
    let workers = Workers::open(bus).await.expect("workers bucket");
    workers
        .register(
            &v1::WorkerRecord {
                worker_id: "worker-board0".to_string(),
                endpoint: "http://127.0.0.1:1".to_string(),
                slices: vec![slice("board0-c0", 0), slice("board0-c1", 1)],
                ..Default::default()
            },
            Duration::from_secs(60),
        )
        .await
        .expect("register a worker");
    let quarantine = Quarantine::open(bus).await.expect("quarantine bucket");
    quarantine
        .put(&v1::SliceQuarantine {
            slice_id: "board0-c0".to_string(),
            worker_id: "worker-board0".to_string(),
            reason: "3 hardware runs failed in a row (crash)".to_string(),
            consecutive_failures: 3,
            since: Some(mtswarm_proto::prost_types::Timestamp::from(
                std::time::SystemTime::now(),
            )),
            by: "worker-board0".to_string(),
        })
        .await
        .expect("quarantine a slice");

    // A lease on a slice no live worker lists: its worker is gone.
    Leases::open(bus)
        .await
        .expect("leases bucket")
        .acquire(&LeaseRequest {
            slice_id: "board9-c0".to_string(),
            worker_id: "worker-board9".to_string(),
            session_id: String::new(),
            job_id: String::new(),
            ttl: Duration::from_secs(60),
        })
        .await
        .expect("a lease of a departed worker");
    quarantine
}

/// What the binary printed, command by command, in the order they ran.
struct Printed {
    /// `fleet`
    table: String,
    /// `fleet --json`
    fleet: Value,
    /// `quarantine list --json`
    listed: Value,
    /// `quarantine list`
    listed_table: String,
    /// `quarantine lift board0-c0 --reason reseated --json`
    lifted: Value,
    /// `fleet --json`, after the lift
    after: Value,
    /// `quarantine lift board0-c0` again
    again: String,
    /// `quarantine lift` of an invalid slice id
    bad: Output,
}

impl Printed {
    fn run(url: &str) -> Self {
        Self {
            table: stdout_of(&mtswarm(url, &["fleet"]), "fleet"),
            fleet: json_of(&mtswarm(url, &["fleet", "--json"]), "fleet --json"),
            listed: json_of(
                &mtswarm(url, &["quarantine", "list", "--json"]),
                "quarantine list",
            ),
            listed_table: stdout_of(&mtswarm(url, &["quarantine", "list"]), "quarantine list"),
            lifted: json_of(
                &mtswarm(
                    url,
                    &[
                        "quarantine",
                        "lift",
                        "board0-c0",
                        "--reason",
                        "reseated",
                        "--json",
                    ],
                ),
                "quarantine lift",
            ),
            after: json_of(&mtswarm(url, &["fleet", "--json"]), "fleet --json"),
            again: stdout_of(
                &mtswarm(url, &["quarantine", "lift", "board0-c0"]),
                "second lift",
            ),
            bad: mtswarm(url, &["quarantine", "lift", "not a slice"]),
        }
    }
}

/// The fleet before the lift: one slice quarantined (with its reason and
/// failures), one offline (its worker gone), one free.
fn assert_fleet_shows_each_state(table: &str, fleet: &Value) {
    let row = table
        .lines()
        .find(|l| l.starts_with("board0-c0"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains("quarantined"), "{row}");
    assert!(
        row.contains("3 hardware runs failed") && row.contains("3 failures in a row"),
        "{row}"
    );
    assert!(table.contains("1 quarantined"), "{table}");
    let offline_row = table
        .lines()
        .find(|l| l.starts_with("board9-c0"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        offline_row.contains("offline") && offline_row.contains("worker not heartbeating"),
        "{offline_row}"
    );
    assert!(table.contains("1 offline"), "{table}");
    let free_row = table
        .lines()
        .find(|l| l.starts_with("board0-c1"))
        .expect("c1 row");
    assert!(free_row.contains("free"), "{free_row}");
    assert_eq!(state_of(fleet, "board0-c0"), "quarantined", "{fleet}");
    assert_eq!(
        fleet["slices"][0]["quarantine"]["consecutive_failures"], 3,
        "{fleet}"
    );
}

/// The state of slice `id` in `fleet --json`.
fn state_of(fleet: &Value, id: &str) -> Value {
    fleet["slices"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["slice_id"] == id))
        .map(|s| s["state"].clone())
        .unwrap_or(Value::Null)
}
