//! The tools a session may call: registration (with the argument schema
//! compiled once), the allowlist, and tool groups that are switched on at run
//! time. It also turns a raw call into validated arguments, or into the
//! reason the model gets back when that fails.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use crate::model::ToolDefinition;
use crate::tool::Tool;

/// Why a tool could not be registered.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Two tools share a name.
    #[error("tool '{0}' is registered twice")]
    Duplicate(String),
    /// A tool's input schema does not compile.
    #[error("tool '{tool}' has an invalid input schema: {message}")]
    InvalidSchema {
        /// The tool.
        tool: String,
        /// The schema compiler's complaint.
        message: String,
    },
}

/// A registered tool with its compiled argument validator (shared, so a
/// registry built once per session is cloned per run without recompiling
/// schemas).
#[derive(Clone)]
pub struct RegisteredTool {
    /// The tool.
    pub tool: Arc<dyn Tool>,
    /// What the model is told about it.
    pub definition: ToolDefinition,
    /// `None`: always available; `Some(g)`: only while group `g` is active.
    pub group: Option<String>,
    validator: Arc<jsonschema::Validator>,
}

/// Why a call could not be turned into arguments the tool accepts. Each kind
/// feeds its own [`crate::RiskTracker`] counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallRejection {
    /// No tool of that name is registered.
    UnknownTool(String),
    /// The tool exists but is not in the active groups or the allowlist.
    NotAllowed(String),
    /// The arguments are not JSON (a protocol error of the model).
    Protocol(String),
    /// The tool could not repair the arguments ([`crate::Tool::normalize`]).
    Normalize(String),
    /// The arguments failed the tool's schema.
    Schema(String),
    /// The arguments failed the tool's schema only by carrying arguments
    /// the tool does not take (`fields`, top level).
    UnknownArguments {
        /// What the model is told.
        message: String,
        /// The arguments the tool does not take, sorted.
        fields: Vec<String>,
    },
}

impl CallRejection {
    /// The text the model sees as the call's result.
    pub fn observation(&self) -> String {
        match self {
            Self::UnknownTool(m)
            | Self::NotAllowed(m)
            | Self::Protocol(m)
            | Self::Normalize(m)
            | Self::Schema(m)
            | Self::UnknownArguments { message: m, .. } => format!("error: {m}"),
        }
    }
}

/// The tool table of a session.
#[derive(Default, Clone)]
pub struct ToolRegistry {
    tools: HashMap<String, RegisteredTool>,
    /// Registration order, so the model sees tools in a stable order.
    order: Vec<String>,
    allowlist: Option<HashSet<String>>,
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Register a tool that is always available.
    pub fn register(&mut self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        self.insert(tool, None)
    }

    /// Register a tool that is available only while `group` is active.
    pub fn register_in_group(
        &mut self,
        group: impl Into<String>,
        tool: Arc<dyn Tool>,
    ) -> Result<(), RegistryError> {
        self.insert(tool, Some(group.into()))
    }

    /// Builder form of [`ToolRegistry::register`].
    pub fn with(mut self, tool: Arc<dyn Tool>) -> Result<Self, RegistryError> {
        self.register(tool)?;
        Ok(self)
    }

    /// Only these tool names may be called (others are refused with
    /// `tool_not_allowed` and are not advertised). `None` allows all.
    pub fn set_allowlist(&mut self, allow: Option<impl IntoIterator<Item = impl Into<String>>>) {
        self.allowlist = allow.map(|names| names.into_iter().map(Into::into).collect());
    }

    fn insert(&mut self, tool: Arc<dyn Tool>, group: Option<String>) -> Result<(), RegistryError> {
        let name = tool.spec().name.to_string();
        if self.tools.contains_key(&name) {
            return Err(RegistryError::Duplicate(name));
        }
        let schema = tool.spec().schema();
        let validator =
            shared_validator(&schema).map_err(|message| RegistryError::InvalidSchema {
                tool: name.clone(),
                message: message.to_string(),
            })?;
        let definition = ToolDefinition {
            name: name.clone(),
            description: tool.spec().description.to_string(),
            parameters: schema,
        };
        self.order.push(name.clone());
        self.tools.insert(
            name,
            RegisteredTool {
                tool,
                definition,
                group,
                validator,
            },
        );
        Ok(())
    }

    /// The tool registered under `name`.
    pub fn get(&self, name: &str) -> Option<&RegisteredTool> {
        self.tools.get(name)
    }

    /// Names of all registered tools, in registration order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.order.iter().map(String::as_str)
    }

    /// The tool the model may call now, or why not.
    pub fn available(
        &self,
        name: &str,
        active_groups: &[String],
    ) -> Result<&RegisteredTool, CallRejection> {
        let Some(entry) = self.tools.get(name) else {
            let known: Vec<&str> = self.visible_names(active_groups).collect();
            return Err(CallRejection::UnknownTool(format!(
                "unknown tool '{name}'; available tools: {}",
                known.join(", ")
            )));
        };
        if let Some(allow) = &self.allowlist
            && !allow.contains(name)
        {
            return Err(CallRejection::NotAllowed(format!(
                "tool '{name}' is not allowed in this session"
            )));
        }
        if let Some(group) = &entry.group
            && !active_groups.iter().any(|g| g == group)
        {
            return Err(CallRejection::NotAllowed(format!(
                "tool '{name}' belongs to group '{group}', which is not active"
            )));
        }
        Ok(entry)
    }

    fn visible_names<'a>(&'a self, active_groups: &'a [String]) -> impl Iterator<Item = &'a str> {
        self.order
            .iter()
            .filter(move |name| self.available_quiet(name, active_groups))
            .map(String::as_str)
    }

    fn available_quiet(&self, name: &str, active_groups: &[String]) -> bool {
        let Some(entry) = self.tools.get(name) else {
            return false;
        };
        let allowed = self.allowlist.as_ref().is_none_or(|a| a.contains(name));
        let in_group = entry
            .group
            .as_ref()
            .is_none_or(|g| active_groups.iter().any(|a| a == g));
        allowed && in_group
    }

    /// The tools advertised to the model right now.
    pub fn specs(&self, active_groups: &[String]) -> Vec<ToolDefinition> {
        self.visible_names(active_groups)
            .filter_map(|name| self.tools.get(name).map(|t| t.definition.clone()))
            .collect()
    }

    /// Normalize and validate the parsed arguments of a call to `entry`.
    ///
    /// `ignorable` names top-level arguments the tool does not take that
    /// may be dropped instead of refusing the call (the engine passes the
    /// ones it already refused once for this tool). The result says which
    /// were dropped, so the model can be told.
    pub fn prepare_arguments(
        entry: &RegisteredTool,
        parsed: serde_json::Value,
        ignorable: &BTreeSet<String>,
    ) -> Result<PreparedArguments, CallRejection> {
        let name = entry.definition.name.as_str();
        let mut normalized = entry.tool.normalize(parsed).map_err(|message| {
            CallRejection::Normalize(format!(
                "arguments of '{name}' could not be normalized: {}",
                excerpt(&message.to_string(), MAX_PROBLEM_CHARS * 3)
            ))
        })?;
        if entry.validator.is_valid(&normalized) {
            return Ok(PreparedArguments::taken(normalized));
        }
        let unknown = unknown_arguments(&entry.validator, &normalized);
        if let (Some(fields), Some(object)) = (&unknown, normalized.as_object_mut())
            && fields.iter().all(|f| ignorable.contains(f))
        {
            for field in fields {
                object.remove(field);
            }
            if entry.validator.is_valid(&normalized) {
                return Ok(PreparedArguments {
                    arguments: normalized,
                    ignored: fields.clone(),
                });
            }
        }
        let problems: Vec<String> = entry
            .validator
            .iter_errors(&normalized)
            .take(8)
            .map(|e| {
                let path = e.instance_path().to_string();
                let problem = if path.is_empty() {
                    e.to_string()
                } else {
                    format!("{path}: {e}")
                };
                excerpt(&problem, MAX_PROBLEM_CHARS)
            })
            .collect();
        if problems.is_empty() {
            return Ok(PreparedArguments::taken(normalized));
        }
        let message = format!(
            "arguments of '{name}' do not match its schema: {}; call '{name}' again with {}",
            problems.join("; "),
            accepted_arguments(&entry.definition.parameters)
        );
        Err(match unknown {
            Some(fields) => CallRejection::UnknownArguments { message, fields },
            None => CallRejection::Schema(message),
        })
    }
}

/// Arguments ready for a tool, and what was dropped to get there.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedArguments {
    /// What the tool is called with.
    pub arguments: serde_json::Value,
    /// Top-level arguments the tool does not take that were dropped
    /// (sorted; empty for a call that matched its schema as sent).
    pub ignored: Vec<String>,
}

impl PreparedArguments {
    fn taken(arguments: serde_json::Value) -> Self {
        Self {
            arguments,
            ignored: Vec::new(),
        }
    }
}

/// The top-level arguments `arguments` carries that the schema does not
/// allow, when they are its only problem (`None` otherwise).
fn unknown_arguments(
    validator: &jsonschema::Validator,
    arguments: &serde_json::Value,
) -> Option<Vec<String>> {
    let mut fields = BTreeSet::new();
    for error in validator.iter_errors(arguments) {
        match error.kind() {
            jsonschema::error::ValidationErrorKind::AdditionalProperties { unexpected }
                if error.instance_path().as_str().is_empty() =>
            {
                fields.extend(unexpected.iter().cloned());
            }
            _ => return None,
        }
    }
    (!fields.is_empty()).then(|| fields.into_iter().collect())
}

/// Longest problem quoted in a rejection: a problem quotes the model's
/// value (a key, a string), which may be huge, and the rejection is what
/// the model reads next.
const MAX_PROBLEM_CHARS: usize = 300;

/// The first `max` characters of `text`, and `...` when it had more.
fn excerpt(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}

/// The arguments a schema accepts, for a rejection's next step:
/// `its arguments kernel_dir, defines (required: none)`.
fn accepted_arguments(schema: &serde_json::Value) -> String {
    let names: Vec<&str> = schema
        .get("properties")
        .and_then(serde_json::Value::as_object)
        .map(|properties| properties.keys().map(String::as_str).collect())
        .unwrap_or_default();
    if names.is_empty() {
        return "no arguments: {}".into();
    }
    let required: Vec<&str> = schema
        .get("required")
        .and_then(serde_json::Value::as_array)
        .map(|list| list.iter().filter_map(serde_json::Value::as_str).collect())
        .unwrap_or_default();
    format!(
        "only its arguments {} (required: {})",
        names.join(", "),
        if required.is_empty() {
            "none".to_string()
        } else {
            required.join(", ")
        }
    )
}

/// Parse a call's raw argument text. An empty string means "no arguments",
/// which several model servers send for argument-less tools.
pub fn parse_arguments(raw: &str) -> Result<serde_json::Value, CallRejection> {
    if raw.trim().is_empty() {
        return Ok(serde_json::Value::Object(serde_json::Map::new()));
    }
    serde_json::from_str(raw).map_err(|e| {
        CallRejection::Protocol(format!(
            "protocol error: the tool call arguments are not valid JSON ({e}); \
             send the arguments as one JSON object"
        ))
    })
}

/// Distinct schemas whose compiled validators are kept for the process.
const VALIDATOR_CACHE_LIMIT: usize = 1_024;

/// The compiled validator of `schema`, shared by every registry of the
/// process. A worker daemon builds one registry per session from the same
/// tools, and compiling the schemas was most of a session's start time and
/// of its memory; schemas past the cache's limit are compiled each time.
fn shared_validator(
    schema: &serde_json::Value,
) -> Result<Arc<jsonschema::Validator>, jsonschema::ValidationError<'static>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<jsonschema::Validator>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = schema.to_string();
    if let Some(validator) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(validator.clone());
    }
    let validator = Arc::new(jsonschema::validator_for(schema)?);
    let mut cached = cache.lock().unwrap_or_else(|e| e.into_inner());
    if cached.len() < VALIDATOR_CACHE_LIMIT {
        cached.insert(key, validator.clone());
    }
    Ok(validator)
}
