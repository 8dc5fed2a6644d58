//! Recorded tuning landscapes in the format the autotuning ecosystem
//! already shares: Kernel Tuner's JSON cache file. A landscape is every
//! measured configuration of a space with its time (or why it failed); the
//! search is judged by replaying it against one, and a user who has a
//! cache from Kernel Tuner (theirs, or one its projects publish for real
//! GPUs) can replay mtswarm's search on it, and the other way round.
//!
//! The format, as Kernel Tuner 1.x reads and writes it
//! (in its util module: `process_cache`, `store_cache`, `read_cache`):
//! an object with `device_name`, `kernel_name`, `tune_params_keys` (the
//! parameter order), `tune_params` (each parameter's values), `objective`
//! and `cache`, whose keys are the configuration's values joined with
//! commas in that order and whose entries hold the parameters, `time` in
//! milliseconds (the objective), `times` and the timing fields. A failed
//! configuration carries `__error__` (`InvalidConfig`,
//! `CompilationFailedConfig`, `RuntimeFailedConfig`), or in older files
//! that name as the value of `time`. A cache a tuner was still appending to
//! (no closing braces, a trailing comma) is read as Kernel Tuner reads it.
//!
//! The file is input from anywhere: every shape problem is a
//! [`LandscapeError`] naming the entry and field, never a panic, and sizes
//! are bounded ([`MAX_PARAMETERS`], [`MAX_ENTRIES`]).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use crate::tune::{Config, ParamValue};

/// Parameters a landscape may have.
pub const MAX_PARAMETERS: usize = 64;
/// Configurations a landscape may hold.
pub const MAX_ENTRIES: usize = 2_000_000;
/// The objective when the file does not name one.
pub const DEFAULT_OBJECTIVE: &str = "time";
/// Error names Kernel Tuner writes for a configuration that gave no time.
pub const ERROR_NAMES: [&str; 4] = [
    "InvalidConfig",
    "CompilationFailedConfig",
    "RuntimeFailedConfig",
    "ErrorConfig",
];

/// A landscape that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum LandscapeError {
    /// Not JSON, even after closing a cache left open.
    #[error("not a Kernel Tuner cache file: {reason}")]
    Json {
        /// The parser's complaint.
        reason: serde_json::Error,
    },
    /// A required field is missing or of the wrong type.
    #[error("field `{field}`: {problem}")]
    Field {
        /// The field.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// One cache entry is unusable.
    #[error("cache entry {key:?}: {problem}")]
    Entry {
        /// The entry's key (cut to 80 characters).
        key: String,
        /// What is wrong with it.
        problem: String,
    },
    /// Over one of the size bounds.
    #[error("{what}: {count} (at most {max})")]
    TooLarge {
        /// What was counted.
        what: &'static str,
        /// How many there were.
        count: usize,
        /// The bound.
        max: usize,
    },
}

/// What measuring one configuration gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A time for the objective, milliseconds (lower is better), with the
    /// single runs when the file has them.
    Measured {
        /// The objective's value, milliseconds.
        ms: f64,
        /// The runs behind it, milliseconds (may be empty).
        runs_ms: Vec<f64>,
    },
    /// No time: the configuration failed (the error's name).
    Failed {
        /// `InvalidConfig`, `CompilationFailedConfig`, `RuntimeFailedConfig`, ...
        error: String,
    },
}

impl Outcome {
    /// The objective in seconds; `None` for a failure.
    pub fn seconds(&self) -> Option<f64> {
        match self {
            Self::Measured { ms, .. } => Some(ms / 1000.0),
            Self::Failed { .. } => None,
        }
    }
}

/// One configuration of a landscape and what measuring it gave.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The configuration: parameter name to value.
    pub config: Config,
    /// Its time or failure.
    pub outcome: Outcome,
}

/// A recorded landscape (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Landscape {
    /// What it was measured on.
    pub device_name: String,
    /// The kernel.
    pub kernel_name: String,
    /// The parameters, in the order the cache keys join them.
    pub keys: Vec<String>,
    /// Each parameter's values, as the file lists them.
    pub values: BTreeMap<String, Vec<ParamValue>>,
    /// The entry field the search minimizes (`time` by default).
    pub objective: String,
    /// Every configuration, in the order of their cache keys.
    pub entries: Vec<Entry>,
}

impl Landscape {
    /// Reads a Kernel Tuner cache file's text with its own objective
    /// (`time` when it names none).
    pub fn from_kernel_tuner_json(text: &str) -> Result<Self, LandscapeError> {
        Self::from_kernel_tuner_json_with(text, None)
    }

    /// [`Landscape::from_kernel_tuner_json`] minimizing `objective`
    /// instead of the file's own.
    pub fn from_kernel_tuner_json_with(
        text: &str,
        objective: Option<&str>,
    ) -> Result<Self, LandscapeError> {
        let value = parse_closing_if_open(text)?;
        let top = value
            .as_object()
            .ok_or_else(|| field("(top level)", "not an object"))?;
        let keys: Vec<String> = match top.get("tune_params_keys") {
            Some(Value::Array(items)) => items
                .iter()
                .map(|k| k.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or_else(|| field("tune_params_keys", "not a list of names"))?,
            _ => return Err(field("tune_params_keys", "missing or not a list")),
        };
        if keys.len() > MAX_PARAMETERS {
            return Err(LandscapeError::TooLarge {
                what: "parameters",
                count: keys.len(),
                max: MAX_PARAMETERS,
            });
        }
        if keys.iter().collect::<BTreeSet<_>>().len() != keys.len() || keys.is_empty() {
            return Err(field("tune_params_keys", "empty, or a name given twice"));
        }
        let values = read_values(top, &keys)?;
        let objective = objective
            .map(str::to_owned)
            .or_else(|| {
                top.get("objective")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .unwrap_or_else(|| DEFAULT_OBJECTIVE.to_owned());
        let cache = top
            .get("cache")
            .and_then(Value::as_object)
            .ok_or_else(|| field("cache", "missing or not an object"))?;
        if cache.len() > MAX_ENTRIES {
            return Err(LandscapeError::TooLarge {
                what: "cache entries",
                count: cache.len(),
                max: MAX_ENTRIES,
            });
        }
        let mut landscape = Self {
            device_name: text_field(top, "device_name"),
            kernel_name: text_field(top, "kernel_name"),
            keys,
            values,
            objective,
            entries: Vec::with_capacity(cache.len()),
        };
        let mut seen = BTreeSet::new();
        for (key, entry) in cache {
            let entry = read_entry(key, entry, &landscape.keys, &landscape.objective)?;
            if !seen.insert(landscape.cache_key(&entry.config)) {
                return Err(entry_error(key, "the same configuration as another entry"));
            }
            landscape.entries.push(entry);
        }
        Ok(landscape)
    }

    /// The cache file's text, `cache` last as Kernel Tuner writes it (so
    /// Kernel Tuner can go on appending to it).
    pub fn to_kernel_tuner_json(&self) -> String {
        let mut cache = Map::new();
        for entry in &self.entries {
            let mut fields = Map::new();
            for key in &self.keys {
                let value = entry.config.get(key).map_or(Value::Null, param_json);
                fields.insert(key.clone(), value);
            }
            match &entry.outcome {
                Outcome::Measured { ms, runs_ms } => {
                    fields.insert(self.objective.clone(), json!(ms));
                    fields.insert("times".into(), json!(runs_ms));
                    // The timing fields Kernel Tuner's simulation mode adds
                    // up; what a recorded figure does not know is 0.
                    fields.insert("compile_time".into(), json!(0));
                    fields.insert("verification_time".into(), json!(0));
                    fields.insert("benchmark_time".into(), json!(runs_ms.iter().sum::<f64>()));
                    fields.insert("strategy_time".into(), json!(0));
                    fields.insert("framework_time".into(), json!(0));
                }
                Outcome::Failed { error } => {
                    fields.insert(self.objective.clone(), json!(error));
                    fields.insert("__error__".into(), json!(error));
                }
            }
            cache.insert(self.cache_key(&entry.config), Value::Object(fields));
        }
        let values = InKeyOrder(
            self.keys
                .iter()
                .map(|k| {
                    let list = self.values.get(k).map_or(&[][..], Vec::as_slice);
                    (k, Value::Array(list.iter().map(param_json).collect()))
                })
                .collect(),
        );
        let file = CacheFile {
            device_name: &self.device_name,
            kernel_name: &self.kernel_name,
            tune_params_keys: &self.keys,
            tune_params: values,
            objective: &self.objective,
            cache,
        };
        // Maps of JSON values and text always serialize.
        serde_json::to_string_pretty(&file).unwrap_or_default()
    }

    /// The cache key of `config`: its values in [`Landscape::keys`] order,
    /// joined with commas, each as Python's `str()` writes it (what Kernel
    /// Tuner looks configurations up by).
    pub fn cache_key(&self, config: &Config) -> String {
        self.keys
            .iter()
            .map(|k| config.get(k).map(python_str).unwrap_or_default())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The fastest measured entry.
    pub fn optimum(&self) -> Option<&Entry> {
        self.entries
            .iter()
            .filter(|e| e.outcome.seconds().is_some())
            .min_by(|a, b| {
                let (ta, tb) = (a.outcome.seconds(), b.outcome.seconds());
                ta.unwrap_or(f64::INFINITY)
                    .total_cmp(&tb.unwrap_or(f64::INFINITY))
            })
    }

    /// Entries with a time.
    pub fn measured(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| e.outcome.seconds().is_some())
            .count()
    }
}

/// The file's fields in Kernel Tuner's order: it appends to a cache by
/// reopening it before the closing braces of `cache`.
#[derive(serde::Serialize)]
struct CacheFile<'a> {
    device_name: &'a str,
    kernel_name: &'a str,
    tune_params_keys: &'a [String],
    tune_params: InKeyOrder<'a>,
    objective: &'a str,
    cache: Map<String, Value>,
}

/// Each parameter's values, in `tune_params_keys` order: Kernel Tuner
/// takes the parameters' order from `tune_params` and refuses a cache whose
/// keys are in another (a JSON map of this crate would sort them by name).
struct InKeyOrder<'a>(Vec<(&'a String, Value)>);

impl serde::Serialize for InKeyOrder<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, values) in &self.0 {
            map.serialize_entry(key, values)?;
        }
        map.end()
    }
}

/// The JSON text, or the text of a cache left open by a tuner that was
/// still appending (closed as Kernel Tuner's `correct_open_cache` does).
fn parse_closing_if_open(text: &str) -> Result<Value, LandscapeError> {
    match serde_json::from_str(text) {
        Ok(value) => Ok(value),
        Err(first) => {
            let trimmed = text.trim_end();
            let open = trimmed.strip_suffix(',').unwrap_or(trimmed);
            serde_json::from_str(&format!("{open}}}\n}}"))
                .map_err(|_| LandscapeError::Json { reason: first })
        }
    }
}

fn read_values(
    top: &Map<String, Value>,
    keys: &[String],
) -> Result<BTreeMap<String, Vec<ParamValue>>, LandscapeError> {
    let params = top
        .get("tune_params")
        .and_then(Value::as_object)
        .ok_or_else(|| field("tune_params", "missing or not an object"))?;
    keys.iter()
        .map(|key| {
            let list = params
                .get(key)
                .and_then(Value::as_array)
                .ok_or_else(|| field(&format!("tune_params.{key}"), "missing or not a list"))?;
            let values = list
                .iter()
                .map(param_value)
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    field(
                        &format!("tune_params.{key}"),
                        "a value that is not a number, text or flag",
                    )
                })?;
            Ok((key.clone(), values))
        })
        .collect()
}

fn read_entry(
    key: &str,
    entry: &Value,
    keys: &[String],
    objective: &str,
) -> Result<Entry, LandscapeError> {
    let fields = entry
        .as_object()
        .ok_or_else(|| entry_error(key, "not an object"))?;
    let mut config = Config::new();
    for name in keys {
        let value = fields
            .get(name)
            .ok_or_else(|| entry_error(key, &format!("no value for parameter `{name}`")))?;
        let value = param_value(value).ok_or_else(|| {
            entry_error(
                key,
                &format!("parameter `{name}` is not a number, text or flag"),
            )
        })?;
        config.insert(name.clone(), value);
    }
    let error = fields.get("__error__").and_then(Value::as_str).or_else(|| {
        fields
            .get(objective)
            .and_then(Value::as_str)
            .filter(|s| ERROR_NAMES.contains(s))
    });
    let outcome = match (error, fields.get(objective)) {
        (Some(error), _) => Outcome::Failed {
            error: error.chars().take(64).collect(),
        },
        (None, Some(Value::Number(n))) => match n.as_f64().filter(|t| t.is_finite() && *t > 0.0) {
            Some(ms) => Outcome::Measured {
                ms,
                runs_ms: fields
                    .get("times")
                    .and_then(Value::as_array)
                    .map(|runs| runs.iter().filter_map(Value::as_f64).collect())
                    .unwrap_or_default(),
            },
            None => Outcome::Failed {
                error: "InvalidConfig".to_owned(),
            },
        },
        (None, _) => {
            return Err(entry_error(
                key,
                &format!("no `{objective}` figure and no `__error__`"),
            ));
        }
    };
    Ok(Entry { config, outcome })
}

/// A JSON value as a tuning value: integers stay integers, flags are 1 and
/// 0 (what a `-D` of a C kernel takes), text stays text.
fn param_value(value: &Value) -> Option<ParamValue> {
    match value {
        Value::Number(n) => n
            .as_i64()
            .map(ParamValue::Int)
            .or_else(|| n.as_f64().map(ParamValue::Float)),
        Value::String(s) => Some(ParamValue::Str(s.clone())),
        Value::Bool(b) => Some(ParamValue::Int(i64::from(*b))),
        _ => None,
    }
}

fn param_json(value: &ParamValue) -> Value {
    match value {
        ParamValue::Int(i) => json!(i),
        ParamValue::Float(x) => json!(x),
        ParamValue::Str(s) => json!(s),
    }
}

/// A value as Python's `str()` writes it (integers and text as they are, a
/// float with its shortest round-trip digits and at least one decimal).
fn python_str(value: &ParamValue) -> String {
    match value {
        ParamValue::Int(i) => i.to_string(),
        ParamValue::Float(x) if x.fract() == 0.0 && x.abs() < 1e16 => format!("{x:.1}"),
        ParamValue::Float(x) => x.to_string(),
        ParamValue::Str(s) => s.clone(),
    }
}

fn text_field(top: &Map<String, Value>, name: &str) -> String {
    top.get(name)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .chars()
        .take(256)
        .collect()
}

fn field(name: &str, problem: &str) -> LandscapeError {
    LandscapeError::Field {
        field: name.chars().take(80).collect(),
        problem: problem.to_owned(),
    }
}

fn entry_error(key: &str, problem: &str) -> LandscapeError {
    LandscapeError::Entry {
        key: key.chars().take(80).collect(),
        problem: problem.to_owned(),
    }
}

#[cfg(test)]
mod tests;
