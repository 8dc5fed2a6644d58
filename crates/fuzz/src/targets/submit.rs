//! gRPC SubmitJob request validation (`crates/leader/src/validate.rs`):
//! the request's protobuf decode, then every check the Control service
//! applies before it stores a job, against a kernel root holding a copy
//! of an example kernel (so `kernel_dir` and `@path` attachments resolve
//! to real files, and paths that escape the root are tried). A refusal
//! must name what is wrong in a bounded message: the caller reads it.

use std::cell::RefCell;
use std::path::PathBuf;

use mtswarm_leader::SubmitLimits;
use mtswarm_leader::fuzzing::validate_submit;
use mtswarm_proto::v1;
use prost::Message;

use crate::{Checked, Outcome, Target, Violation, refused_with};

pub(super) const TARGET: Target = Target {
    name: "submit",
    about: "gRPC SubmitJob request validation (crates/leader/src/validate.rs)",
    check,
    dictionary: &[
        b"\x12\x06vecadd",
        b"\x12\x05../..",
        b"\x12\x04/etc",
        b"@kernel.c",
        b"@../../etc/passwd",
        b"@tune.toml",
        b"board=emu0,cluster=1",
        b"backend=emulator",
        b"https://",
        b"\x1d\x00\x00\x00\x40",
        b"\xff\xff\xff\xff\x0f",
    ],
    seeds,
    max_len: 16 * 1024,
};

/// Longest refusal a caller may get.
const MAX_ERROR_BYTES: usize = 4096;

thread_local! {
    static ROOT: RefCell<Option<(PathBuf, tempfile::TempDir)>> = const { RefCell::new(None) };
}

/// A kernel root holding a copy of the vecadd example (canonical path).
pub(super) fn kernel_root() -> Result<(PathBuf, tempfile::TempDir), Violation> {
    let fail = |e: std::io::Error| Violation(format!("cannot set up the kernel root: {e}"));
    let dir = tempfile::tempdir().map_err(fail)?;
    let example = crate::workspace_dir().join("examples/kernels/vecadd");
    let copy = dir.path().join("vecadd");
    std::fs::create_dir_all(&copy).map_err(fail)?;
    for entry in std::fs::read_dir(&example).map_err(fail)? {
        let entry = entry.map_err(fail)?;
        if entry.file_type().map_err(fail)?.is_file() {
            std::fs::copy(entry.path(), copy.join(entry.file_name())).map_err(fail)?;
        }
    }
    let root = dir.path().canonicalize().map_err(fail)?;
    Ok((root, dir))
}

fn check(input: &[u8]) -> Checked {
    let request = match v1::SubmitJobRequest::decode(input) {
        Ok(request) => request,
        Err(e) => {
            return refused_with(&e.to_string(), MAX_ERROR_BYTES)
                .map(|_| Outcome::refused("decode"));
        }
    };
    ROOT.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(kernel_root()?);
        }
        let Some((root, _)) = slot.as_ref() else {
            return Err(Violation("no kernel root".into()));
        };
        match validate_submit(request.spec.as_ref(), root, &SubmitLimits::default()) {
            Ok(attachments) => Ok(Outcome::accepted(format!(
                "{} attachments",
                attachments.min(3)
            ))),
            Err(e) => refused_with(&e.to_string(), MAX_ERROR_BYTES),
        }
    })
}

/// Requests a client sends, to start the corpus.
fn seeds() -> Vec<Vec<u8>> {
    let spec = |goal: &str, kernel_dir: &str, selector: &str| v1::JobSpec {
        goal: goal.into(),
        kernel_dir: kernel_dir.into(),
        slice_selector: selector.into(),
        budgets: Some(v1::Budgets {
            max_steps: 40,
            max_tokens: 100_000,
            device_seconds: 60.0,
            wall_time_seconds: 600,
            max_evaluations: 12,
        }),
        num_agents: 2,
        model: Some(v1::ModelSettings {
            base_url: "https://models.example/v1".into(),
            temperature: Some(0.2),
            ..Default::default()
        }),
        approval_rules: vec![v1::ApprovalRule {
            tool: "benchmark".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    [
        spec(
            "tune vecadd for GFLOPS, see @kernel.c and @tune.toml",
            "vecadd",
            "",
        ),
        spec("tune", "vecadd", "board=emu0"),
        spec("tune", "../vecadd", "backend=emulator"),
        spec("read @../../../etc/passwd", "vecadd", ""),
        spec("", "vecadd", ""),
    ]
    .into_iter()
    .map(|spec| {
        v1::SubmitJobRequest {
            spec: Some(spec),
            ..Default::default()
        }
        .encode_to_vec()
    })
    .chain([Vec::new()])
    .collect()
}
