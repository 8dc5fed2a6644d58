//! A `TaskAssignment` as a worker receives it from the bus: the codec's
//! decode (`crates/bus/src/codec.rs`), the check of its placement grant
//! against the leader's key (`crates/worker/src/provenance.rs`), then every
//! check a session applies before it runs the task
//! (`crates/worker/src/session/validate.rs`: attempt, the size caps of
//! `WorkerConfig` (`max_task_parameters_bytes`,
//! `max_task_instructions_bytes`), deadline, `parameters_json` read as a
//! task plan of `mtswarm-policy`, its candidates against the vecadd
//! example's tune.toml). The leader and worker keys are real, made once;
//! the seeds carry a grant the leader key signed, so a genuine grant is
//! accepted, and any grant the worker accepts must be exactly the one the
//! leader would sign for that task: a forged or mismatched one is refused
//! (its records would be refused by the leader; the worker logs why).

use std::cell::RefCell;
use std::path::PathBuf;

use mtswarm_auth::{DecisionSigner, WorkerKey, provenance::grant_for};
use mtswarm_bus::codec;
use mtswarm_hw::ChipSpec;
use mtswarm_proto::v1;
use mtswarm_worker::WorkerConfig;
use mtswarm_worker::fuzzing::{check_task, grant_problem};
use prost::Message;

use crate::{Checked, Outcome, Target, Violation, error_kind, refused_with};

pub(super) const TARGET: Target = Target {
    name: "task",
    about: "a TaskAssignment from the bus: decode, grant, size caps, deadline, task plan (crates/worker)",
    check,
    dictionary: &[
        b"\x0a\x06task-1",
        b"\x12\x05job-1",
        b"\x18\x01",
        b"\x18\x00",
        b"\x52\x02{}",
        b"{\"candidates\":[{\"CHUNK\":1024,\"BUF\":2}],\"search_budget\":3}",
        b"{\"params\":{\"CHUNK\":7}}",
        b"{\"noop\":true}",
        b"\"unchecked_defines\":true",
        b"\x9a\x03",
        b"\xff\xff\xff\xff\x0f",
        b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\x7f",
    ],
    seeds,
    max_len: 64 * 1024,
};

/// Longest refusal: a task's error goes into its result, which the leader
/// journals and a model may read.
const MAX_ERROR_BYTES: usize = 4096;

/// The worker the tasks are placed on.
const WORKER_ID: &str = "worker-board0";

/// What the target makes once: the leader's signing key, the worker's
/// record key, the worker's configuration and the kernel the tasks name.
struct Keys {
    leader: DecisionSigner,
    worker: WorkerKey,
    config: WorkerConfig,
    kernel_dir: PathBuf,
    spec: ChipSpec,
}

thread_local! {
    static KEYS: RefCell<Option<std::rc::Rc<Keys>>> = const { RefCell::new(None) };
}

fn keys() -> std::rc::Rc<Keys> {
    KEYS.with(|cell| {
        cell.borrow_mut()
            .get_or_insert_with(|| {
                std::rc::Rc::new(Keys {
                    leader: DecisionSigner::generate(),
                    worker: WorkerKey::generate(),
                    config: WorkerConfig::new("fleet.toml", "board0"),
                    kernel_dir: crate::workspace_dir().join("examples/kernels/vecadd"),
                    spec: ChipSpec::default(),
                })
            })
            .clone()
    })
}

/// The grant the leader signs for `task` on this worker.
fn genuine_grant(keys: &Keys, task: &v1::TaskAssignment) -> Result<v1::PlacementGrant, Violation> {
    let mut grant = grant_for(task, &keys.worker.public_key());
    grant.worker_id = WORKER_ID.into();
    keys.leader
        .sign_grant(&mut grant)
        .map_err(|e| Violation(format!("cannot sign a grant: {e}")))?;
    Ok(grant)
}

/// The grant's verdict: `None` when it places the task here, which only
/// the leader's own grant for this very task may.
fn grant(keys: &Keys, task: &v1::TaskAssignment) -> Result<Option<String>, Violation> {
    let problem = grant_problem(
        &keys.leader.verifier(),
        task,
        WORKER_ID,
        &keys.worker.public_key(),
    );
    if problem.is_none() && task.grant.as_ref() != Some(&genuine_grant(keys, task)?) {
        return Err(Violation(format!(
            "a grant the leader did not sign for this task was accepted: {:?}",
            task.grant
        )));
    }
    Ok(problem)
}

fn check(input: &[u8]) -> Checked {
    let task: v1::TaskAssignment = match codec::decode("mtswarm.task.worker-board0.s0", None, input)
    {
        Ok(task) => task,
        Err(e) => {
            return refused_with(&e.to_string(), MAX_ERROR_BYTES)
                .map(|_| Outcome::refused("decode"));
        }
    };
    let keys = keys();
    let grant = match grant(&keys, &task)? {
        None => "granted".to_string(),
        Some(problem) => {
            refused_with(&problem, MAX_ERROR_BYTES)?;
            format!("grant refused ({})", error_kind(&problem))
        }
    };
    match check_task(&task, &keys.config, &keys.kernel_dir, &keys.spec) {
        Ok(candidates) => {
            if task.attempt == 0
                || task.parameters_json.len() > keys.config.max_task_parameters_bytes
                || task.instructions.len() > keys.config.max_task_instructions_bytes
            {
                return Err(Violation(format!(
                    "a task of attempt {} with {} bytes of parameters and {} of instructions accepted",
                    task.attempt,
                    task.parameters_json.len(),
                    task.instructions.len()
                )));
            }
            Ok(Outcome::accepted(format!(
                "{grant}, {} candidates",
                candidates.min(3)
            )))
        }
        Err(e) => refused_with(&e.to_string(), MAX_ERROR_BYTES)
            .map(|o| Outcome::refused(format!("{grant}, {}", o.signature))),
    }
}

/// Tasks the leader sends, signed with the target's leader key, and near
/// misses: a grant for another task, another worker, a forged signature,
/// no grant; attempt 0, a past deadline, oversize parameters, a plan
/// outside the tune space, parameters that are not a plan.
fn seeds() -> Vec<Vec<u8>> {
    let keys = keys();
    let task = |parameters: serde_json::Value| v1::TaskAssignment {
        task_id: "task-1".into(),
        job_id: "job-1".into(),
        attempt: 1,
        agent_id: "agent-1".into(),
        session_id: "session-1".into(),
        worker_id: WORKER_ID.into(),
        slice_id: "board0-c0".into(),
        kernel_dir: "vecadd".into(),
        parameters_json: parameters.to_string(),
        budgets: Some(v1::Budgets::default()),
        deadline: Some(prost_types::Timestamp {
            seconds: 4_000_000_000,
            nanos: 0,
        }),
        ..Default::default()
    };
    let signed = |mut task: v1::TaskAssignment| {
        task.grant = genuine_grant(&keys, &task).ok();
        task
    };
    let plan = serde_json::json!({"candidates": [{"CHUNK": 1024, "BUF": 2}], "search_budget": 3});
    let genuine = signed(task(plan.clone()));
    let mut tasks = vec![
        genuine.clone(),
        signed(task(serde_json::json!({"noop": true}))),
    ];
    let mut other_task = genuine.clone();
    other_task.task_id = "task-2".into();
    let mut forged = genuine.clone();
    if let Some(grant) = forged.grant.as_mut() {
        grant.signature[0] ^= 1;
    }
    let mut other_worker = task(plan.clone());
    other_worker.worker_id = "worker-board1".into();
    let other_worker = signed(other_worker);
    let mut no_grant = genuine.clone();
    no_grant.grant = None;
    let mut attempt_zero = signed(task(plan.clone()));
    attempt_zero.attempt = 0;
    let mut past = genuine.clone();
    past.deadline = Some(prost_types::Timestamp {
        seconds: 1,
        nanos: 0,
    });
    let mut huge = genuine.clone();
    huge.instructions = "x".repeat(64 * 1024 + 1);
    tasks.extend([
        other_task,
        forged,
        other_worker,
        no_grant,
        attempt_zero,
        past,
        huge,
        signed(task(serde_json::json!({"params": {"CHUNK": 7}}))),
        signed(task(serde_json::json!({"candidates": "all"}))),
        signed(task(serde_json::json!([1, 2]))),
    ]);
    tasks.iter().map(Message::encode_to_vec).collect()
}
