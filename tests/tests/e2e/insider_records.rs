//! One worker host taken over, abuses 1 and 6 of issue 31, on a real
//! `mtswarm up`: the attacker holds one worker's NATS credential (its nkey,
//! so also the record key derived from it) and nothing else. What it can
//! read (the checkpoints bucket names every session's job, task, attempt
//! and placement grant) it uses to forge what the leader and the other
//! workers would have believed: a measurement of another worker's task,
//! and a later attempt's checkpoint of another worker's session. Each is
//! refused, logged, and the job's outcome is what the genuine workers
//! measured.

use std::collections::BTreeMap;
use std::sync::Arc;

use mtswarm_auth::WorkerKey;
use mtswarm_bus::results::{
    CandidateStatus, RecordGrant, RecordSigner, ResultRecord, ResultStats, ResultsStore,
};
use mtswarm_bus::{Bus, v1};

use crate::secure_up::{
    SecureUp, approve_pending, approve_until_finished, job_checkpoint, submit_vecadd,
    wait_for_worker_log, worker_logs,
};

/// A vecadd job on a fresh stack, as the other board's worker attacks it:
/// its id; what a worker identity may read of it (the session's first
/// checkpoint and the placement grant it carries); the forger, the worker
/// the grant does not name: its identity and its NATS connection.
async fn job_under_attack() -> (
    SecureUp,
    String,
    v1::SessionCheckpoint,
    v1::PlacementGrant,
    &'static str,
    Bus,
) {
    let stack = SecureUp::start();
    let mut admin = stack.control(stack.token("admin")).await;
    let job_id = submit_vecadd(&mut admin).await;
    let reader = stack
        .nats(Some("worker-board1"))
        .await
        .expect("worker identity");
    let checkpoint = job_checkpoint(&reader, &job_id).await;
    let grant = checkpoint
        .grant
        .clone()
        .expect("the checkpoint carries its placement grant");
    let forger_id = other_worker(&grant.worker_id);
    let forger = stack.nats(Some(forger_id)).await.expect("forger identity");
    (stack, job_id, checkpoint, grant, forger_id, forger)
}

/// The forged figure: a thousand times any real vecadd.
const FORGED_GFLOPS: f64 = 987_654.0;

/// Signs records with a key of the attacker's choosing (its own record key:
/// it holds its NATS seed).
#[derive(Debug)]
struct Forger(WorkerKey);

impl RecordSigner for Forger {
    fn sign(&self, record_id: &str, payload: &[u8]) -> Option<Vec<u8>> {
        self.0
            .sign(mtswarm_auth::RecordKind::Measurement, record_id, payload)
            .ok()
    }
}

/// The identity of the other board's worker than `worker_id`.
fn other_worker(worker_id: &str) -> &'static str {
    if worker_id == "worker-board0" {
        "worker-board1"
    } else {
        "worker-board0"
    }
}

/// A benchmarked record of a fantastic figure for the task `grant` places,
/// claiming the placed worker and slice.
fn forged_record(grant: &v1::PlacementGrant, n: u32) -> ResultRecord {
    ResultRecord {
        record_id: format!(
            "{}.{}.{}.forged-{n}",
            grant.job_id, grant.task_id, grant.attempt
        ),
        job_id: grant.job_id.clone(),
        task_id: grant.task_id.clone(),
        attempt: grant.attempt,
        agent_id: grant.agent_id.clone(),
        session_id: grant.session_id.clone(),
        worker_id: grant.worker_id.clone(),
        slice_id: grant.slice_id.clone(),
        backend: "emulator".into(),
        kernel: "vecadd".into(),
        kernel_hash: "f0f0f0f0f0f0f0f0".into(),
        params: BTreeMap::from([("CHUNK".into(), "2048".into()), ("BUF".into(), "2".into())]),
        cores: 24,
        samples: vec![1e-9],
        stats: Some(ResultStats {
            count: 1,
            median: 1e-9,
            trimmed_mean: 1e-9,
            min: 1e-9,
            max: 1e-9,
            stddev: 0.0,
        }),
        flops: Some(987_654),
        gflops: Some(FORGED_GFLOPS),
        valid: true,
        status: CandidateStatus::Benchmarked,
        timestamp_ms: mtswarm_bus::results::unix_millis(std::time::SystemTime::now()),
        ..Default::default()
    }
}

/// Abuse 1: measurement records forged by another worker for the job's
/// task (unsigned; with the genuine grant copied from the checkpoint; with
/// that grant and the forger's own signature) are refused, and the job's
/// best is a genuine figure.
#[tokio::test(flavor = "multi_thread")]
async fn a_measurement_forged_by_another_worker_never_becomes_the_outcome() {
    let (stack, job_id, _checkpoint, grant, forger_id, forger) = job_under_attack().await;
    let seed = mtswarm_auth::generate::read_seed(
        &stack
            .credentials
            .join("nats")
            .join(format!("{forger_id}.nk")),
    )
    .expect("the forger's seed");
    let own_key = WorkerKey::derive(&seed).expect("the forger's record key");

    let plain = ResultsStore::open(&forger).await.expect("results store");
    plain
        .record(&forged_record(&grant, 1))
        .await
        .expect("stored: NATS lets any worker publish measurements");
    let mut with_grant = forged_record(&grant, 2);
    with_grant.grant = Some(RecordGrant::of(&grant));
    plain.record(&with_grant).await.expect("stored");
    let signed = plain.clone().with_signer(Arc::new(Forger(own_key)));
    let mut signed_record = forged_record(&grant, 3);
    signed_record.grant = Some(RecordGrant::of(&grant));
    signed.record(&signed_record).await.expect("stored");

    let record = approve_until_finished(&stack, &job_id).await;
    assert_eq!(record.state(), v1::JobState::Succeeded, "{record:?}");
    let outcome = record.outcome.clone().expect("an outcome");
    let best = outcome.best.clone().expect("a genuine best");
    assert!(
        best.gflops < 1_000.0,
        "the forgery became the best: {best:?}"
    );
    assert!(
        !best.record_ids.iter().any(|id| id.contains("forged")),
        "{best:?}"
    );
    assert!(
        outcome.refused_records >= 3,
        "the forgeries were not refused: {outcome:?}"
    );
    assert!(!record.summary.contains("987654"), "{}", record.summary);
    let log = stack.leader_log();
    for n in 1..=3 {
        assert!(
            log.lines()
                .any(|l| l.contains("measurement record refused")
                    && l.contains(&format!("forged-{n}"))),
            "forgery {n} was not refused and logged:\n{log}"
        );
    }
    stack.stop();
}

/// Abuse 6: a checkpoint of another worker's session claiming a later
/// attempt (unsigned, and re-signed by the forger with the genuine grant)
/// neither fences the session off nor is resumed from: the session writes
/// over it and the job ends with its genuine result.
#[tokio::test(flavor = "multi_thread")]
async fn a_checkpoint_forged_by_another_worker_neither_fences_nor_is_resumed() {
    let (stack, job_id, genuine, _grant, forger_id, forger) = job_under_attack().await;
    let checkpoints = mtswarm_bus::Checkpoints::open(&forger)
        .await
        .expect("checkpoints");

    // A later attempt, unsigned: the old design fenced the session off.
    let mut later = genuine.clone();
    later.attempt = 99;
    later.step = 1_000;
    later.signature.clear();
    checkpoints
        .kv()
        .put(&genuine.session_id, &later)
        .await
        .expect("NATS lets any worker write any checkpoint key");
    // The session writes its next state over it once its call is decided.
    approve_pending(&stack, &job_id).await;
    wait_for_worker_log(&stack, "stored checkpoint refused", 1).await;

    // The grant's own attempt, state replaced, signed with the forger's key.
    let seed = mtswarm_auth::generate::read_seed(
        &stack
            .credentials
            .join("nats")
            .join(format!("{forger_id}.nk")),
    )
    .expect("seed");
    let mut replaced = genuine.clone();
    replaced.state_json = b"{\"forged\":true}".to_vec();
    WorkerKey::derive(&seed)
        .expect("key")
        .sign_checkpoint(&mut replaced)
        .expect("sign");
    checkpoints
        .kv()
        .put(&genuine.session_id, &replaced)
        .await
        .expect("stored");
    let record = approve_until_finished(&stack, &job_id).await;

    assert_eq!(record.state(), v1::JobState::Succeeded, "{record:?}");
    assert_eq!(record.tasks_done, record.tasks_total, "{record:?}");
    let best = record
        .outcome
        .as_ref()
        .and_then(|o| o.best.clone())
        .expect("a best");
    assert!(best.gflops > 0.0, "{best:?}");
    let log = worker_logs(&stack);
    assert!(
        !log.contains("fenced off by a later attempt"),
        "a forged checkpoint fenced the session off:\n{log}"
    );

    // A session resumed from the bucket now would not start from either
    // forgery: both fail the leader's grant and the placed worker's
    // signature (the worker's resume reads through the same check).
    let leader = mtswarm_auth::DecisionVerifier::load(&stack.credentials.join("decision.pub"))
        .expect("the leader's public key");
    assert!(leader.verify_checkpoint(&later).is_err());
    assert!(leader.verify_checkpoint(&replaced).is_err());
    stack.stop();
}
