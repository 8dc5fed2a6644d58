//! gRPC request validation of every RPC but SubmitJob (the `submit`
//! target): the Control service's (`crates/leader/src/requests.rs`: job
//! ids, ListJobs pages, ListFleet selectors, ListApprovals filters,
//! DecideApproval's id and verdict, LiftQuarantine's slice id) and the
//! Worker service's (`crates/worker/src/requests.rs`: SpawnSession's ids,
//! slice choice and kernel directory under a kernel root holding the
//! vecadd example; CancelSession's reason; Drain's grace). The first byte
//! of an input picks the RPC, the rest is its protobuf request; what each
//! handler checks before it reads a store is run through the crates'
//! `fuzzing` entry points. A refusal must name what is wrong in a bounded
//! message: the caller reads it.

use std::cell::RefCell;
use std::path::PathBuf;
use std::time::Duration;

use mtswarm_leader::fuzzing as leader;
use mtswarm_proto::v1;
use mtswarm_worker::fuzzing as worker;
use prost::Message;

use crate::{Checked, Outcome, Target, Violation, refused_with};

pub(super) const TARGET: Target = Target {
    name: "rpcs",
    about: "Control and Worker gRPC request validation (crates/leader/src/requests.rs, crates/worker/src/requests.rs)",
    check,
    dictionary: &[
        b"\x0a\x05job-1",
        b"\x0a\x05../..",
        b"\x0a\x00",
        b"\x10\xff\xff\xff\xff\x0f",
        b"\x1a\x03500",
        b"\x1a\x02-1",
        b"\x12\x01\x07",
        b"\x10\x01",
        b"\x10\x00",
        b"\x28\x02",
        b"\x22\x06vecadd",
        b"\x42\x06vecadd",
        b"\x42\x05../..",
        b"\x2a\x13backend=emulator,cores>=8",
        b"\x22\x06emu0-0",
        b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
        b"\xff\xff\xff\xff\x0f",
    ],
    seeds,
    max_len: 8 * 1024,
};

/// Longest refusal a caller may get.
const MAX_ERROR_BYTES: usize = 4096;

/// The daemon's drain grace when a request says 0.
const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// The RPCs, in the order the first byte picks them.
const RPCS: [&str; 12] = [
    "GetJob",
    "ListJobs",
    "WatchJob",
    "CancelJob",
    "ListFleet",
    "ListApprovals",
    "DecideApproval",
    "LiftQuarantine",
    "SpawnSession",
    "CancelSession",
    "Drain",
    "Status",
];

thread_local! {
    static ROOT: RefCell<Option<(PathBuf, tempfile::TempDir)>> = const { RefCell::new(None) };
}

/// Decodes `payload` as the request `T`, or the refusal of the decode.
fn decode<T: Message + Default>(payload: &[u8]) -> Result<T, Checked> {
    T::decode(payload).map_err(|e| {
        refused_with(&e.to_string(), MAX_ERROR_BYTES).map(|_| Outcome::refused("decode"))
    })
}

/// `refused_with` over a check's result, its accepted outcome from `then`.
fn checked<T, E: std::fmt::Display>(
    result: Result<T, E>,
    then: impl FnOnce(T) -> Checked,
) -> Checked {
    match result {
        Ok(value) => then(value),
        Err(e) => refused_with(&e.to_string(), MAX_ERROR_BYTES),
    }
}

/// An accepted id must be one the bus can carry in a subject.
fn subject_safe(what: &str, id: &str) -> Result<(), Violation> {
    if id.is_empty()
        || id.len() > 128
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(Violation(format!("{what} {id:?} accepted")));
    }
    Ok(())
}

fn control(rpc: usize, payload: &[u8]) -> Result<Checked, Checked> {
    Ok(match rpc {
        0 | 2 | 3 => {
            let job_id = match rpc {
                0 => decode::<v1::GetJobRequest>(payload)?.job_id,
                2 => decode::<v1::WatchJobRequest>(payload)?.job_id,
                _ => decode::<v1::CancelJobRequest>(payload)?.job_id,
            };
            checked(leader::check_job_id(&job_id), |()| {
                subject_safe("job id", &job_id)?;
                Ok(Outcome::accepted("job id"))
            })
        }
        1 => checked(
            leader::list_jobs(&decode::<v1::ListJobsRequest>(payload)?),
            |(_, size)| {
                if !(1..=500).contains(&size) {
                    return Err(Violation(format!("a page of {size} jobs")));
                }
                Ok(Outcome::accepted(format!("page of {}", size.min(101))))
            },
        ),
        4 => checked(
            leader::list_fleet(&decode::<v1::ListFleetRequest>(payload)?),
            |some| Ok(Outcome::accepted(format!("selector {some}"))),
        ),
        5 => checked(
            leader::list_approvals(&decode::<v1::ListApprovalsRequest>(payload)?),
            |(job, states)| {
                Ok(Outcome::accepted(format!(
                    "job {job}, {} states",
                    states.len().min(3)
                )))
            },
        ),
        6 => {
            let request = decode::<v1::DecideApprovalRequest>(payload)?;
            checked(leader::decide_approval(&request), |()| {
                subject_safe("approval id", &request.approval_id)?;
                if !matches!(
                    request.verdict(),
                    v1::ApprovalVerdict::Approve | v1::ApprovalVerdict::Deny
                ) {
                    return Err(Violation(format!("verdict {} accepted", request.verdict)));
                }
                Ok(Outcome::accepted(format!(
                    "decision {}",
                    request.verdict().as_str_name()
                )))
            })
        }
        _ => checked(
            leader::lift_quarantine(&decode::<v1::LiftQuarantineRequest>(payload)?),
            |slice_id| {
                subject_safe("slice id", &slice_id)?;
                Ok(Outcome::accepted("slice id"))
            },
        ),
    })
}

fn spawn(request: &v1::SpawnSessionRequest) -> Checked {
    ROOT.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(super::submit::kernel_root()?);
        }
        let Some((root, _)) = slot.as_ref() else {
            return Err(Violation("no kernel root".into()));
        };
        checked(worker::spawn_session(request, root), |choice| {
            for (what, id) in [
                ("session id", &request.session_id),
                ("job id", &request.job_id),
                ("agent id", &request.agent_id),
            ] {
                subject_safe(what, id)?;
            }
            Ok(Outcome::accepted(choice))
        })
    })
}

fn worker_rpc(rpc: usize, payload: &[u8]) -> Result<Checked, Checked> {
    Ok(match rpc {
        8 => spawn(&decode::<v1::SpawnSessionRequest>(payload)?),
        9 => {
            let reason = worker::cancel_reason(&decode::<v1::CancelSessionRequest>(payload)?);
            if reason.trim().is_empty() {
                return Err(Err(Violation(
                    "a session cancelled without a reason".into(),
                )));
            }
            Ok(Outcome::accepted("cancel"))
        }
        10 => {
            let grace = worker::drain_grace(&decode::<v1::DrainRequest>(payload)?, DEFAULT_GRACE);
            if grace.is_zero() {
                return Err(Err(Violation("a drain without grace".into())));
            }
            Ok(Outcome::accepted("drain"))
        }
        _ => decode::<v1::StatusRequest>(payload).map(|_| Ok(Outcome::accepted("status")))?,
    })
}

fn check(input: &[u8]) -> Checked {
    let Some((&kind, payload)) = input.split_first() else {
        return Ok(Outcome::refused("empty"));
    };
    let rpc = usize::from(kind) % RPCS.len();
    let result = if rpc < 8 {
        control(rpc, payload)
    } else {
        worker_rpc(rpc, payload)
    };
    result.unwrap_or_else(|refused| refused).map(|o| Outcome {
        signature: format!("{}: {}", RPCS[rpc], o.signature),
        ..o
    })
}

fn with_kind<T: Message>(kind: u8, request: &T) -> Vec<u8> {
    [vec![kind], request.encode_to_vec()].concat()
}

/// One valid request per RPC, then near misses: bad and `../` ids, huge
/// page sizes, bad page tokens, unknown enum values, empty fields.
fn seeds() -> Vec<Vec<u8>> {
    let job = |job_id: &str| v1::GetJobRequest {
        job_id: job_id.into(),
    };
    let spawn = |session: &str, selector: &str, kernel: &str| v1::SpawnSessionRequest {
        job_id: "job-1".into(),
        agent_id: "agent-1".into(),
        session_id: session.into(),
        slice_selector: selector.into(),
        kernel_dir: kernel.into(),
        budgets: Some(v1::Budgets {
            max_steps: 20,
            ..Default::default()
        }),
        ..Default::default()
    };
    let decide = |approval_id: &str, verdict: i32, scope: i32| v1::DecideApprovalRequest {
        approval_id: approval_id.into(),
        verdict,
        reason: "looks fine".into(),
        decided_by: "alice".into(),
        scope,
    };
    let list = |states: Vec<i32>, page_size: u32, page_token: &str| v1::ListJobsRequest {
        states,
        page_size,
        page_token: page_token.into(),
    };
    let approvals = |job_id: &str, states: Vec<i32>| v1::ListApprovalsRequest {
        job_id: job_id.into(),
        states,
    };
    vec![
        with_kind(0, &job("job-1")),
        with_kind(0, &job("../../etc")),
        with_kind(0, &job("")),
        with_kind(0, &job(&"j".repeat(129))),
        with_kind(1, &list(vec![1, 2], 50, "")),
        with_kind(1, &list(vec![], u32::MAX, "100")),
        with_kind(1, &list(vec![99], 0, "-1")),
        with_kind(1, &list(vec![], 10, "18446744073709551616")),
        with_kind(
            2,
            &v1::WatchJobRequest {
                job_id: "job-1".into(),
                from_sequence: u64::MAX,
            },
        ),
        with_kind(
            3,
            &v1::CancelJobRequest {
                job_id: "job 1".into(),
                reason: "no longer needed".into(),
            },
        ),
        with_kind(
            4,
            &v1::ListFleetRequest {
                slice_selector: "backend=emulator,cores>=8".into(),
            },
        ),
        with_kind(
            4,
            &v1::ListFleetRequest {
                slice_selector: "cores>=,,=".into(),
            },
        ),
        with_kind(5, &approvals("job-1", vec![1])),
        with_kind(5, &approvals("", vec![42])),
        with_kind(5, &approvals("../job", vec![])),
        with_kind(6, &decide("approval-1", 1, 1)),
        with_kind(6, &decide("approval-1", 0, 1)),
        with_kind(6, &decide("approval-1", 7, 9)),
        with_kind(6, &decide("../approval", 2, 0)),
        with_kind(
            7,
            &v1::LiftQuarantineRequest {
                slice_id: " emu0-0 ".into(),
                reason: "fixed".into(),
            },
        ),
        with_kind(
            7,
            &v1::LiftQuarantineRequest {
                slice_id: "emu0/0".into(),
                reason: String::new(),
            },
        ),
        with_kind(8, &spawn("session-1", "", "vecadd")),
        with_kind(8, &spawn("session-1", "backend=emulator", "")),
        with_kind(8, &spawn("session-1", "", "../vecadd")),
        with_kind(8, &spawn("session-1", "", "/etc")),
        with_kind(8, &spawn("", "", "vecadd")),
        with_kind(8, &spawn("session-1", "cores>>8", "missing")),
        with_kind(
            9,
            &v1::CancelSessionRequest {
                session_id: "session-1".into(),
                reason: " ".into(),
            },
        ),
        with_kind(
            10,
            &v1::DrainRequest {
                grace_seconds: u64::MAX,
                reason: "maintenance".into(),
            },
        ),
        with_kind(11, &v1::StatusRequest {}),
        vec![1, 0x10, 0xff],
    ]
}
