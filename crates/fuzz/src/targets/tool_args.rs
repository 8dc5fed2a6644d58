//! Each worker tool's arguments as the engine prepares a model's call: the
//! raw argument text parsed (`mtswarm_core::registry::parse_arguments`),
//! the tool's repairs (`crates/tools/src/normalize.rs`) and its schema
//! (`ToolRegistry::prepare_arguments`), over the real tool set. The
//! input's first line names the tool, the rest is the argument text.
//! Arguments accepted must be accepted again as they are (the repairs are
//! idempotent); refused ones get an error of bounded size, which is what
//! the model reads back.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::sync::Arc;

use mtswarm_core::ToolRegistry;
use mtswarm_core::registry::{CallRejection, parse_arguments};
use mtswarm_hw::{BackendKind, ChipSpec, EmulatorBoard, Slice};
use mtswarm_tools::{InMemoryResults, QueryResultsTool, ToolSet};

use crate::{Checked, Outcome, Target, Violation, refused_with};

pub(super) const TARGET: Target = Target {
    name: "tool_args",
    about: "each tool's argument normalization and schema validation (crates/tools, core registry)",
    check,
    dictionary: &[
        b"compile\n",
        b"benchmark\n",
        b"\"defines\": {\"N\": \"64\"}",
        b"\"defines\": [\"N=64\", \"M=8\"]",
        b"\"defines\": \"N=64,M=8\"",
        b"\"kernel_dir\": \"dgemm\"",
        b"\"artifact\": \"a1\"",
        b"\"repeats\": \"3\"",
        b"\"cores\": 8.0",
        b"\"path\": \"../../etc/passwd\"",
        b"\"pattern\": \"(a+)+$\"",
        b"\"patch\": \"--- a/k.c\\n+++ b/k.c\\n@@ -1 +1 @@\\n-x\\n+y\\n\"",
        b"\"baseline_seconds\": 1.5",
        b"null",
        b"\"{\\\"defines\\\": {}}\"",
    ],
    seeds: crate::no_seeds,
    max_len: 64 * 1024,
};

/// Longest error the model may be sent back.
const MAX_ERROR_BYTES: usize = 8192;

thread_local! {
    static REGISTRY: RefCell<Option<(ToolRegistry, tempfile::TempDir)>> = const { RefCell::new(None) };
}

/// The worker's tools over an emulator slice, in a fresh workspace.
fn registry() -> Result<(ToolRegistry, tempfile::TempDir), Violation> {
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        Violation(format!("cannot set up the tools ({what}): {e}"))
    };
    let workspace = tempfile::tempdir().map_err(|e| fail("workspace", &e))?;
    let slice = Slice {
        board: "emu0".into(),
        cluster: Some(0),
        cores: 8,
        backend: BackendKind::Emulator,
    };
    let board = EmulatorBoard::new(slice, ChipSpec::default()).map_err(|e| fail("board", &e))?;
    let tools = ToolSet::builder(workspace.path(), Arc::new(board))
        .build()
        .map_err(|e| fail("tool set", &e))?;
    let mut registry = ToolRegistry::new();
    tools
        .register_all(&mut registry)
        .map_err(|e| fail("registry", &e))?;
    let results = QueryResultsTool::new(Arc::new(InMemoryResults::new(Vec::new())));
    registry
        .register(Arc::new(results))
        .map_err(|e| fail("query_results", &e))?;
    Ok((registry, workspace))
}

fn check(input: &[u8]) -> Checked {
    let text = String::from_utf8_lossy(input);
    let (name, raw) = text.split_once('\n').unwrap_or((text.as_ref(), ""));
    REGISTRY.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(registry()?);
        }
        let Some((registry, _)) = slot.as_ref() else {
            return Err(Violation("no registry".into()));
        };
        let Some(entry) = registry.get(name.trim()) else {
            return Ok(Outcome::refused("unknown tool"));
        };
        let name = entry.definition.name.clone();
        let parsed = match parse_arguments(raw) {
            Ok(parsed) => parsed,
            Err(rejection) => return rejected(&name, &rejection),
        };
        match ToolRegistry::prepare_arguments(entry, parsed.clone(), &BTreeSet::new()) {
            Ok(prepared) => {
                let prepared = prepared.arguments;
                let again = ToolRegistry::prepare_arguments(
                    entry,
                    prepared.clone(),
                    &BTreeSet::new(),
                )
                .map_err(|e| {
                    Violation(format!(
                        "{name}: accepted arguments {prepared} are refused as they are: {e:?}"
                    ))
                })?;
                if again.arguments != prepared {
                    return Err(Violation(format!(
                        "{name}: repairs are not idempotent: {prepared} / {}",
                        again.arguments
                    )));
                }
                Ok(Outcome::accepted(name))
            }
            Err(CallRejection::UnknownArguments { fields, message }) => {
                // Refused once, the same fields are dropped the next time:
                // what is left must then be taken, and say what was dropped.
                let ignorable: BTreeSet<String> = fields.iter().cloned().collect();
                match ToolRegistry::prepare_arguments(entry, parsed, &ignorable) {
                    Ok(taken) if taken.ignored == fields => {}
                    other => {
                        return Err(Violation(format!(
                            "{name}: dropping {fields:?} did not leave a call: {other:?}"
                        )));
                    }
                }
                rejected(&name, &CallRejection::UnknownArguments { message, fields })
            }
            Err(rejection) => rejected(&name, &rejection),
        }
    })
}

fn rejected(name: &str, rejection: &CallRejection) -> Checked {
    let kind = match rejection {
        CallRejection::Protocol(_) => "protocol",
        CallRejection::Normalize(_) => "normalize",
        CallRejection::Schema(_) => "schema",
        CallRejection::UnknownArguments { .. } => "unknown arguments",
        CallRejection::UnknownTool(_) | CallRejection::NotAllowed(_) => "not callable",
    };
    let refused = refused_with(&rejection.observation(), MAX_ERROR_BYTES)?;
    Ok(Outcome::refused(format!(
        "{name} {kind}: {}",
        refused.signature
    )))
}
