//! One worker host taken over, abuses 2 and 7 of issue 31, on a real
//! `mtswarm up`: the attacker holds one worker's credentials (its NATS
//! nkey and its TLS key). It rewrites its own registration to send the
//! leader, and the leader's token, elsewhere; and it serves with its TLS
//! key where clients expect the leader. The leader calls a worker only
//! over `https` to a certificate naming that worker, and every process has
//! its own key: neither works.

use std::time::Duration;

use mtswarm_bus::v1;
use mtswarm_tests::jobs::{get_job, submit};
use mtswarm_tests::stack::wait_for_fleet;

use crate::secure_up::{SecureUp, Trap, WAIT, approve_until_finished, node};

/// The stack's fleet once both workers registered every slice.
async fn full_fleet(stack: &SecureUp) -> v1::ListFleetResponse {
    let mut admin = stack.control(stack.token("admin")).await;
    wait_for_fleet(
        &mut admin,
        WAIT,
        |fleet| fleet.slices.len() == 8 && fleet.workers.len() == 2,
        |fleet| format!("fleet incomplete: {fleet:?}"),
    )
    .await
}

/// Keeps worker-board1's registration pointing at `endpoint` (rewriting
/// it over the daemon's own heartbeats) until dropped.
struct Hijack(tokio::task::JoinHandle<()>);

impl Hijack {
    async fn start(stack: &SecureUp, genuine: &v1::WorkerRecord, endpoint: String) -> Hijack {
        let rogue = stack
            .nats(Some("worker-board1"))
            .await
            .expect("worker identity");
        let workers = mtswarm_bus::Workers::open(&rogue).await.expect("workers");
        let hijacked = v1::WorkerRecord {
            endpoint,
            ..genuine.clone()
        };
        let task = tokio::spawn(async move {
            loop {
                let _ = workers.kv().put(&hijacked.worker_id, &hijacked).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        Hijack(task)
    }
}

impl Drop for Hijack {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Waits until the leader's fleet shows worker-board1 at `endpoint`.
async fn leader_sees(stack: &SecureUp, endpoint: &str) {
    let mut admin = stack.control(stack.token("admin")).await;
    wait_for_fleet(
        &mut admin,
        WAIT,
        |fleet| {
            fleet
                .workers
                .iter()
                .any(|w| w.worker_id == "worker-board1" && w.endpoint == endpoint)
        },
        |fleet| format!("the hijack never showed: {fleet:?}"),
    )
    .await;
}

/// A job that wants every slice: the leader tries board1's too.
fn every_slice_job() -> v1::JobSpec {
    v1::JobSpec {
        goal: "Tune the vecadd kernel.".into(),
        kernel_dir: "vecadd".into(),
        num_agents: 8,
        ..Default::default()
    }
}

/// Abuse 2: a worker rewrites its own registration to an `http://`
/// endpoint of its choosing, then to another worker's real `https`
/// endpoint. The leader never connects to the first (its token would
/// travel in clear text) and refuses the second (the certificate there is
/// not the registering worker's); the job runs on the slices that are
/// what they claim.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_cannot_send_the_leader_and_its_token_to_another_endpoint() {
    let stack = SecureUp::start();
    let fleet = full_fleet(&stack).await;
    let genuine = fleet
        .workers
        .iter()
        .find(|w| w.worker_id == "worker-board1")
        .cloned()
        .expect("board1's worker");
    let board0 = fleet
        .workers
        .iter()
        .find(|w| w.worker_id == "worker-board0")
        .cloned()
        .expect("board0's worker");
    let mut admin = stack.control(stack.token("admin")).await;

    let trap = Trap::start().await;
    let plain = format!("http://{}", trap.addr);
    let hijack = Hijack::start(&stack, &genuine, plain.clone()).await;
    leader_sees(&stack, &plain).await;
    let job_id = submit(&mut admin, every_slice_job()).await;
    let record = approve_until_finished(&stack, &job_id).await;
    drop(hijack);
    assert_eq!(record.state(), v1::JobState::Succeeded, "{record:?}");
    assert!(
        trap.connections().is_empty(),
        "the leader connected to the hijacked endpoint: {:?}",
        trap.connections()
    );
    let log = stack.leader_log();
    assert!(
        log.lines().any(|l| l.contains("worker endpoint refused")
            && l.contains("worker-board1")
            && l.contains(&plain)),
        "the refusal was not logged:\n{log}"
    );
    let agents = get_job(&mut admin, &job_id).await.agents;
    assert!(
        agents
            .iter()
            .all(|a| a.worker_id == "worker-board0" || a.cancelled),
        "an agent runs on the hijacked worker: {agents:?}"
    );

    // Pointing at board0's genuine endpoint: TLS there presents board0's
    // certificate, not board1's, so nothing is called.
    let hijack = Hijack::start(&stack, &genuine, board0.endpoint.clone()).await;
    leader_sees(&stack, &board0.endpoint).await;
    let job_id = submit(&mut admin, every_slice_job()).await;
    let record = approve_until_finished(&stack, &job_id).await;
    drop(hijack);
    assert_eq!(record.state(), v1::JobState::Succeeded, "{record:?}");
    let job = get_job(&mut admin, &job_id).await;
    assert!(
        job.agents
            .iter()
            .all(|a| !a.slice_id.starts_with("board1") || a.cancelled),
        "a board1 slice was placed through board0's endpoint: {:?}",
        job.agents
    );
    stack.stop();
}

/// Abuse 7: every process has its own key. A worker's certificate names
/// only that worker, so a host serving with the worker's key where the
/// leader should be is refused by the CLI, which says it is a certificate
/// problem; and the leader's, the NATS server's and the workers' keys are
/// all different.
#[tokio::test(flavor = "multi_thread")]
async fn a_workers_tls_key_cannot_serve_as_the_leaders() {
    let stack = SecureUp::start();
    let tls = stack.credentials.join("tls");
    let key = |name: &str| std::fs::read(tls.join(format!("{name}.key"))).expect("key file");
    let keys = [
        key("leader"),
        key("nats"),
        key("worker-board0"),
        key("worker-board1"),
    ];
    for (i, a) in keys.iter().enumerate() {
        for b in &keys[i + 1..] {
            assert_ne!(a, b, "two processes share a TLS key");
        }
    }

    // The stolen worker key serves on a port of the attacker's.
    let security = mtswarm_auth::ServerTls::load(
        &tls.join("worker-board1.pem"),
        &tls.join("worker-board1.key"),
    )
    .expect("the worker's certificate and key");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (_health, health_service) = tonic_health::server::health_reporter();
    let server = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .tls_config(security.server_config())
            .expect("tls")
            .add_service(health_service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await;
    });

    let fake = format!("https://{addr}");
    let output = node(&stack.client_config)
        .args(["jobs", "--leader", &fake])
        .output()
        .expect("run mtswarm jobs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("TLS") && stderr.contains("certificate"),
        "the CLI did not name the certificate problem: {stderr}"
    );
    assert!(!stderr.contains("is `mtswarm up` running"), "{stderr}");
    // The same with the library client the daemons use.
    let connected = stack
        .ca()
        .endpoint(&fake, Duration::from_secs(5))
        .expect("endpoint")
        .connect()
        .await;
    let error = connected.expect_err("a worker's key served as the leader's");
    let chain = format!("{error:?}");
    assert!(chain.contains("NotValidForName"), "{chain}");
    server.abort();
    stack.stop();
}
