//! What a tool is, as far as the engine is concerned.
//!
//! Tools live in other crates (`mtswarm-tools` for workers, `mtswarm-leader`
//! for the leader); the engine routes, approves, schedules and observes them
//! only through this trait and the [`ToolSpec`] each tool declares. The
//! spec's flags (`risk`, `read_only`, `concurrency_safe`, `needs_hardware`,
//! `effects`) are what the scheduler and the risk policy key off, so a tool
//! must declare them truthfully.

use std::borrow::Cow;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::NormalizeError;

/// How dangerous a call is; decides whether it needs approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Risk {
    /// Runs without asking under the default policy.
    Low,
    /// Asks unless the job approves up to medium risk.
    Medium,
    /// Asks unless the job approves everything.
    High,
}

/// A side effect of a successful call that the engine must know about,
/// declared by the tool rather than inferred from its name. The engine folds
/// these into the working state and the completion gate's evidence ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "effect", rename_all = "snake_case")]
pub enum Effect {
    /// Code or data the answer depends on changed (write_file, apply_patch):
    /// every piece of verification evidence taken before it is void.
    Mutation {
        /// What changed (e.g. the file's path).
        target: String,
    },
    /// Verification happened (validate, benchmark). Counts for the completion
    /// gate only if taken after the latest mutation and `passed`.
    Evidence {
        /// What was verified (e.g. `validate`, `benchmark`).
        kind: String,
        /// Whether the verification passed.
        passed: bool,
        /// The figures of the verification, for the answer and the gate.
        #[serde(default)]
        summary: serde_json::Value,
    },
    /// Set one field of the working state (e.g. `source_file`,
    /// `current_candidates`). `append` pushes onto an array field instead
    /// (e.g. `compile_results`, `benchmark_results`).
    State {
        /// The field.
        key: String,
        /// The value to set (or to append).
        value: serde_json::Value,
        /// Append to an array field instead of setting it.
        #[serde(default)]
        append: bool,
    },
}

/// The result of a successful call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolOutput {
    /// What the model sees (may be truncated by the engine for the model view;
    /// the full text stays in the event stream and history).
    pub content: String,
    /// Optional structured form of the result, for events and policies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
    /// The side effects the engine must fold in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub effects: Vec<Effect>,
}

impl ToolOutput {
    /// An output with only `content`.
    pub fn text(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            ..Self::default()
        }
    }
    /// Add structured data.
    pub fn with_data(mut self, data: serde_json::Value) -> Self {
        self.data = Some(data);
        self
    }
    /// Add a side effect.
    pub fn with_effect(mut self, effect: Effect) -> Self {
        self.effects.push(effect);
        self
    }
}

/// Why a call failed. Every variant becomes an error observation for the
/// model; none of them stops the loop.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum ToolError {
    /// The arguments were well-formed JSON matching the schema but made no
    /// sense (e.g. a path outside the workspace).
    #[error("invalid arguments: {0}")]
    InvalidArgs(String),
    /// The tool ran and failed (compile error, capacity exceeded, ...).
    #[error("{0}")]
    Failed(String),
    /// The call ran longer than the engine's tool timeout.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The call was cancelled.
    #[error("cancelled")]
    Cancelled,
}

/// A progress report from inside a long call (TOOL_STATE_UPDATE events).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolProgress {
    /// What the tool is doing.
    pub message: String,
    /// 0..1 when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<f64>,
}

/// Per-call context handed to a tool.
#[derive(Clone)]
pub struct ToolContext {
    /// The session the call belongs to.
    pub session_id: String,
    /// The call.
    pub call_id: String,
    /// The step the call was made in.
    pub step: u32,
    progress: Option<tokio::sync::mpsc::UnboundedSender<(String, ToolProgress)>>,
}

impl ToolContext {
    /// The context of one call; no progress channel until
    /// [`ToolContext::with_progress`].
    pub fn new(session_id: impl Into<String>, call_id: impl Into<String>, step: u32) -> Self {
        Self {
            session_id: session_id.into(),
            call_id: call_id.into(),
            step,
            progress: None,
        }
    }

    /// Route progress reports to the engine (it turns them into events).
    pub fn with_progress(
        mut self,
        sink: tokio::sync::mpsc::UnboundedSender<(String, ToolProgress)>,
    ) -> Self {
        self.progress = Some(sink);
        self
    }

    /// Report progress; a no-op when nobody listens.
    pub fn progress(&self, message: impl Into<String>, fraction: Option<f64>) {
        if let Some(sink) = &self.progress {
            let _ = sink.send((
                self.call_id.clone(),
                ToolProgress {
                    message: message.into(),
                    fraction,
                },
            ));
        }
    }
}

/// Which kind of [`Effect`] a tool may report. A tool declares the kinds in
/// its [`ToolSpec`]; the engine drops (and logs) an effect of a kind the
/// tool did not declare, so a read-only tool cannot void evidence and a
/// file tool cannot claim a benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EffectKind {
    /// [`Effect::Mutation`].
    Mutation,
    /// [`Effect::Evidence`].
    Evidence,
    /// [`Effect::State`].
    State,
}

impl Effect {
    /// The kind of this effect.
    pub fn kind(&self) -> EffectKind {
        match self {
            Self::Mutation { .. } => EffectKind::Mutation,
            Self::Evidence { .. } => EffectKind::Evidence,
            Self::State { .. } => EffectKind::State,
        }
    }
}

/// Everything a tool declares about itself, in one value: what the model is
/// told (name, description, the schema of its argument type) and what the
/// engine routes, approves and schedules by (risk, whether it writes,
/// whether it may run beside other calls, whether it takes the hardware
/// lock, which effects it reports). Each tool has one, next to its code;
/// nothing else (no risk table, no flag list) describes a tool.
#[derive(Debug, Clone)]
pub struct ToolSpec {
    /// The name the model calls it by (unique in a registry).
    pub name: Cow<'static, str>,
    /// What it does, for the model.
    pub description: Cow<'static, str>,
    /// JSON Schema of the arguments object: [`schema_of`] its argument type.
    pub schema: ToolSchema,
    /// The risk when no policy override names the tool.
    pub risk: Risk,
    /// Changes nothing outside the tool's own process.
    pub read_only: bool,
    /// May run at the same time as other concurrency-safe calls of a step.
    pub concurrency_safe: bool,
    /// Touches the hardware slice: the engine takes the resource lock named
    /// by [`Tool::resource`] around the call (one holder at a time).
    pub needs_hardware: bool,
    /// The kinds of effect its outputs may carry.
    pub effects: &'static [EffectKind],
}

impl ToolSpec {
    /// A low-risk, read-only tool that runs alone, off the hardware, with no
    /// effects; the builder methods below say what differs.
    pub const fn new(
        name: &'static str,
        description: &'static str,
        schema: fn() -> serde_json::Value,
    ) -> Self {
        Self {
            name: Cow::Borrowed(name),
            description: Cow::Borrowed(description),
            schema: ToolSchema::Of(schema),
            risk: Risk::Low,
            read_only: true,
            concurrency_safe: false,
            needs_hardware: false,
            effects: &[],
        }
    }

    /// Judged at `risk`.
    pub const fn risk(mut self, risk: Risk) -> Self {
        self.risk = risk;
        self
    }

    /// Changes something outside its process (a file, a lease, a task).
    pub const fn writes(mut self) -> Self {
        self.read_only = false;
        self
    }

    /// May run beside other concurrency-safe calls of the same step.
    pub const fn concurrent(mut self) -> Self {
        self.concurrency_safe = true;
        self
    }

    /// Runs on the slice, under its lock.
    pub const fn hardware(mut self) -> Self {
        self.needs_hardware = true;
        self
    }

    /// Reports effects of these kinds.
    pub const fn effects(mut self, kinds: &'static [EffectKind]) -> Self {
        self.effects = kinds;
        self
    }

    /// Whether outputs may carry effects of `kind`.
    pub fn declares(&self, kind: EffectKind) -> bool {
        self.effects.contains(&kind)
    }

    /// The JSON Schema of the arguments object.
    pub fn schema(&self) -> serde_json::Value {
        match &self.schema {
            ToolSchema::Of(schema) => schema(),
            ToolSchema::Given(schema) => schema.clone(),
        }
    }
}

/// Where a tool's argument schema comes from.
#[derive(Debug, Clone)]
pub enum ToolSchema {
    /// Derived from the argument type ([`schema_of`]): every compiled tool.
    Of(fn() -> serde_json::Value),
    /// Given as JSON, for tools made at run time (tests, adapters).
    Given(serde_json::Value),
}

/// The JSON Schema of an argument type, as a [`ToolSpec`] carries it:
/// without the annotations that cost a model's context and validate
/// nothing (`$schema`, `title`, `format`, `default: null`, and the type's
/// own description, which the tool's description already is). Every tool's
/// schema reaches the model on every call, and a small model has 8k tokens.
pub fn schema_of<T: schemars::JsonSchema>() -> serde_json::Value {
    let mut schema =
        serde_json::to_value(schemars::schema_for!(T)).unwrap_or(serde_json::Value::Null);
    if let Some(root) = schema.as_object_mut() {
        root.remove("description");
    }
    strip_annotations(&mut schema);
    schema
}

/// Removes the annotation keywords of [`schema_of`] from a schema node and
/// every subschema (properties, items, definitions, combinators), leaving
/// property names alone.
fn strip_annotations(node: &mut serde_json::Value) {
    let Some(object) = node.as_object_mut() else {
        return;
    };
    for keyword in ["$schema", "title", "format"] {
        object.remove(keyword);
    }
    if object
        .get("default")
        .is_some_and(serde_json::Value::is_null)
    {
        object.remove("default");
    }
    for (keyword, value) in object.iter_mut() {
        match keyword.as_str() {
            "properties" | "$defs" | "definitions" | "patternProperties" => {
                if let Some(schemas) = value.as_object_mut() {
                    schemas.values_mut().for_each(strip_annotations);
                }
            }
            "anyOf" | "oneOf" | "allOf" | "prefixItems" => {
                if let Some(schemas) = value.as_array_mut() {
                    schemas.iter_mut().for_each(strip_annotations);
                }
            }
            "items" | "additionalProperties" | "not" => strip_annotations(value),
            _ => {}
        }
    }
}

/// A tool the engine can route, approve, schedule and call.
#[async_trait::async_trait]
pub trait Tool: Send + Sync {
    /// What the tool declares about itself.
    fn spec(&self) -> &ToolSpec;
    /// The resource a hardware call locks (e.g. the slice id).
    fn resource(&self) -> Option<String> {
        None
    }
    /// Repair what models commonly get wrong before schema validation
    /// (numbers as strings, a single item where a list is expected, ...).
    /// Returns [`NormalizeError::InvalidArguments`], naming the field, when
    /// the arguments cannot be repaired.
    fn normalize(&self, args: serde_json::Value) -> Result<serde_json::Value, NormalizeError> {
        Ok(args)
    }
    /// Run the call with arguments that passed normalization and the schema.
    async fn call(
        &self,
        args: serde_json::Value,
        ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError>;
}

#[cfg(test)]
mod schema_tests {
    use serde_json::json;

    /// Arguments of an example tool.
    #[derive(schemars::JsonSchema)]
    #[allow(dead_code)] // only its schema is read
    struct Example {
        /// a property that happens to be called title
        title: String,
        /// how many
        #[serde(default)]
        count: Option<u32>,
        /// nested
        #[serde(default)]
        items: Option<Vec<Inner>>,
    }

    #[derive(schemars::JsonSchema)]
    #[allow(dead_code)] // only its schema is read
    struct Inner {
        /// a number
        value: f64,
    }

    #[test]
    fn the_schema_keeps_what_validates_and_drops_the_annotations() {
        let schema = super::schema_of::<Example>();
        let text = schema.to_string();
        for gone in ["$schema", "\"format\"", "Arguments of", "\"default\":null"] {
            assert!(!text.contains(gone), "{gone} left in {text}");
        }
        assert!(schema["properties"]["title"].is_object(), "{text}");
        assert!(!text.contains("\"title\":\"Example\""), "{text}");
        assert_eq!(schema["properties"]["count"]["description"], "how many");
        let validator = jsonschema::validator_for(&schema).expect("a valid schema");
        assert!(validator.is_valid(&json!({"title": "t", "count": 3, "items": [{"value": 1.5}]})));
        assert!(!validator.is_valid(&json!({"title": "t", "count": "three"})));
        assert!(!validator.is_valid(&json!({"title": "t", "items": [{}]})));
        assert!(!validator.is_valid(&json!({"count": 1})));
    }
}
