//! Every bus message and KV record type (`crates/bus/src/codec.rs`,
//! `crates/proto`): the protobuf decode every subscriber and KV reader
//! runs, then the checks applied to what it gives (a task's parameters
//! read as a task plan, a result record's validation and subject). The
//! first byte of an input picks the type, the rest is the payload; a
//! decoded value must encode and decode back to itself. Payloads missing
//! fields stand for records an older layout wrote.

use mtswarm_bus::codec::{self, BusMessage};
use mtswarm_bus::results::decode_record;
use mtswarm_bus::{ResultRecord, v1};
use mtswarm_policy::plan::TaskPlan;

use crate::{Checked, Outcome, Target, Violation, refused_with};

pub(super) const TARGET: Target = Target {
    name: "bus",
    about: "bus messages and KV records: prost decode, the checks after it, round trip (crates/bus, crates/proto)",
    check,
    dictionary: &[
        b"\x0a\x02t1",
        b"\x12\x02j1",
        b"\x18\x01",
        b"\x52\x02{}",
        b"\x08\x96\x01",
        b"\xff\xff\xff\xff\x0f",
        b"\x0a\x80\x80\x80\x80\x10",
        b"{\"candidates\":[{\"N\":64}],\"search_budget\":3}",
        b"\"record_id\":\"r1\",",
        b"\"job_id\":\"j1\",",
        b"\"gflops\":1e308,",
        b"\"samples\":[0.5,1e-320],",
    ],
    seeds,
    max_len: 64 * 1024,
};

/// Longest error accepted beyond the payload's length: a refused message
/// is logged, and serde's errors quote a string value of the wrong type
/// whole (a record's error is at most as long as the record).
const MAX_ERROR_BYTES: usize = 4096;

/// Decodes `payload` as `T`, then checks that it round-trips.
fn message<T: BusMessage + PartialEq + std::fmt::Debug>(
    payload: &[u8],
) -> Result<Result<T, String>, Violation> {
    let value = match codec::decode::<T>("fuzz.subject", None, payload) {
        Ok(value) => value,
        Err(e) => return Ok(Err(e.to_string())),
    };
    let again = codec::decode::<T>("fuzz.subject", None, &codec::encode(&value)).map_err(|e| {
        Violation(format!(
            "{}: its own encoding does not decode: {e}",
            T::TYPE_NAME
        ))
    })?;
    if again != value {
        return Err(Violation(format!(
            "{}: decode(encode(x)) != x: {value:?} / {again:?}",
            T::TYPE_NAME
        )));
    }
    Ok(Ok(value))
}

fn outcome<T>(name: &str, decoded: Result<T, String>, then: impl FnOnce(T) -> Checked) -> Checked {
    match decoded {
        Ok(value) => then(value).map(|o| Outcome {
            signature: format!("{name}: {}", o.signature),
            ..o
        }),
        Err(e) => refused_with(&e, MAX_ERROR_BYTES)
            .map(|o| Outcome::refused(format!("{name}: {}", o.signature))),
    }
}

fn accepted<T>(_: T) -> Checked {
    Ok(Outcome::accepted("ok"))
}

/// A task's parameters as the worker reads them: JSON, then a task plan
/// whose JSON reads back as the same plan.
fn task(task: v1::TaskAssignment) -> Checked {
    if task.parameters_json.trim().is_empty() {
        return Ok(Outcome::accepted("no parameters"));
    }
    let value: serde_json::Value = match serde_json::from_str(&task.parameters_json) {
        Ok(value) => value,
        Err(e) => {
            return refused_with(
                &format!("parameters_json: {e}"),
                MAX_ERROR_BYTES + task.parameters_json.len(),
            );
        }
    };
    match TaskPlan::from_value(&value) {
        Ok(plan) => {
            let again = TaskPlan::from_value(&plan.to_value())
                .map_err(|e| Violation(format!("a plan's own JSON does not read: {e}")))?;
            if again != plan {
                return Err(Violation(format!("plan round trip: {plan:?} / {again:?}")));
            }
            Ok(Outcome::accepted("plan"))
        }
        Err(e) => refused_with(&e.to_string(), MAX_ERROR_BYTES + task.parameters_json.len()),
    }
}

/// A result record as the results store reads it: JSON, validated, with a
/// subject; it must read back from its own JSON.
fn record(payload: &[u8]) -> Checked {
    let record: ResultRecord = match decode_record("fuzz.subject", None, payload) {
        Ok(record) => record,
        Err(e) => return refused_with(&e.to_string(), MAX_ERROR_BYTES),
    };
    let json = serde_json::to_vec(&record)
        .map_err(|e| Violation(format!("a record does not encode: {e}")))?;
    let again: ResultRecord = serde_json::from_slice(&json)
        .map_err(|e| Violation(format!("a record's own JSON does not read: {e}")))?;
    if again != record {
        return Err(Violation(format!(
            "record round trip: {record:?} / {again:?}"
        )));
    }
    if let Err(e) = record.validate() {
        return refused_with(&e.to_string(), MAX_ERROR_BYTES);
    }
    match record.subject() {
        Ok(_) => Ok(Outcome::accepted(format!("record {:?}", record.status()))),
        Err(e) => refused_with(&e.to_string(), MAX_ERROR_BYTES),
    }
}

fn check(input: &[u8]) -> Checked {
    let Some((&kind, payload)) = input.split_first() else {
        return Ok(Outcome::refused("empty"));
    };
    macro_rules! each {
        ($($i:literal => $t:ident $(=> $then:ident)?),* $(,)?) => {
            match kind % 17 {
                $($i => outcome(stringify!($t), message::<v1::$t>(payload)?, each!(@then $($then)?)),)*
                _ => record(payload),
            }
        };
        (@then) => { accepted };
        (@then $then:ident) => { $then };
    }
    each!(
        0 => TaskAssignment => task,
        1 => TaskResult,
        2 => AgentEvent,
        3 => AgentEventBatch,
        4 => ApprovalRequest,
        5 => ApprovalDecision,
        6 => ApprovalRecord,
        7 => SliceLease,
        8 => JobOwner,
        9 => SliceQuarantine,
        10 => WorkerRecord,
        11 => SessionCheckpoint,
        12 => JobRecord,
        13 => AgentPlacement,
        14 => TaskRecord,
        15 => LeaderCheckpoint,
    )
}

/// Inputs built from real values of each type, to start the corpus.
pub(crate) fn seeds() -> Vec<Vec<u8>> {
    let plan = serde_json::json!({"candidates": [{"MB": 64, "NB": 256}], "search_budget": 4, "repeats": 3});
    let task = v1::TaskAssignment {
        task_id: "task-1".into(),
        job_id: "job-1".into(),
        attempt: 1,
        agent_id: "agent-1".into(),
        kernel_dir: "dgemm".into(),
        parameters_json: plan.to_string(),
        budgets: Some(v1::Budgets::default()),
        deadline: Some(prost_types_timestamp()),
        ..Default::default()
    };
    let mut seeds = vec![with_kind(0, &task)];
    let result = v1::TaskResult {
        task_id: "task-1".into(),
        job_id: "job-1".into(),
        attempt: 1,
        ..Default::default()
    };
    seeds.push(with_kind(1, &result));
    for kind in 2..16u8 {
        seeds.push(vec![kind]);
    }
    seeds.push(b"\x10{\"record_id\":\"r1\",\"job_id\":\"job-1\"}".to_vec());
    let record = ResultRecord {
        record_id: "job-1.task-1.1.call-1".into(),
        job_id: "job-1".into(),
        samples: vec![0.25, 0.5],
        gflops: Some(12.5),
        ..Default::default()
    };
    if let Ok(json) = serde_json::to_vec(&record) {
        seeds.push([vec![16], json].concat());
    }
    seeds
}

fn with_kind<T: prost::Message>(kind: u8, message: &T) -> Vec<u8> {
    [vec![kind], message.encode_to_vec()].concat()
}

fn prost_types_timestamp() -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: 1_800_000_000,
        nanos: 5,
    }
}
