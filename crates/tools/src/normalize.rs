//! Repairs for the argument mistakes models make most often, applied before
//! schema validation: numbers and booleans sent as strings, one string where
//! a list is expected, defines given as `["N=64"]` or `"N=64,M=8"` instead of
//! a map, common alternative key names, and the whole object sent as a JSON
//! string. Anything that cannot be repaired is left for the schema check or
//! reported with a message that names the field.

use mtswarm_core::NormalizeError;
use serde_json::{Map, Value};

/// Why arguments could not be repaired; each message names the field (it
/// becomes the [`NormalizeError`] the model sees).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
enum RepairError {
    /// The arguments were a string that is not JSON.
    #[error("arguments must be a JSON object; the string given is not JSON ({0})")]
    NotJson(String),
    /// The arguments were JSON but not an object.
    #[error("arguments must be a JSON object, got {0}")]
    NotAnObject(Value),
    /// An integer field holds text that is no whole number.
    #[error("`{field}` must be an integer, got \"{got}\"")]
    NotAnInteger { field: &'static str, got: String },
    /// A number field holds text that is no number.
    #[error("`{field}` must be a number, got \"{got}\"")]
    NotANumber { field: &'static str, got: String },
    /// A boolean field holds text that is neither true nor false.
    #[error("`{field}` must be true or false, got \"{got}\"")]
    NotABool { field: &'static str, got: String },
    /// A map entry's value is neither a string nor a number.
    #[error("`{field}.{key}` must be a string or number, got {got}")]
    MapValue {
        field: &'static str,
        key: String,
        got: Value,
    },
    /// A list given for a map has an item that is not `NAME=VALUE`.
    #[error("`{field}` items must be \"NAME=VALUE\" strings, got {got}")]
    MapItem { field: &'static str, got: Value },
    /// A map field holds something that cannot become a map.
    #[error("`{field}` must be an object of NAME: VALUE, got {got}")]
    NotAMap { field: &'static str, got: Value },
}

/// What a tool's arguments look like, for the repairs.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Shape {
    pub integers: &'static [&'static str],
    pub numbers: &'static [&'static str],
    pub bools: &'static [&'static str],
    /// Lists of strings.
    pub lists: &'static [&'static str],
    /// String -> string maps (`defines`).
    pub maps: &'static [&'static str],
    /// `(alias, canonical)` key names.
    pub aliases: &'static [(&'static str, &'static str)],
    /// Arguments of sibling tools a model copies into this call (a
    /// benchmark's `baseline_seconds` into validate, an `artifact` into
    /// compile): dropped, so the call runs with what it does take.
    pub ignored: &'static [&'static str],
}

impl Shape {
    /// No repairs: what a tool's shape leaves out (`..Shape::NONE`).
    pub(crate) const NONE: Shape = Shape {
        integers: &[],
        numbers: &[],
        bools: &[],
        lists: &[],
        maps: &[],
        aliases: &[],
        ignored: &[],
    };
}

fn parse_number(text: &str) -> Option<f64> {
    let cleaned: String = text
        .trim()
        .chars()
        .filter(|c| *c != '_' && *c != ',')
        .collect();
    cleaned.parse::<f64>().ok().filter(|v| v.is_finite())
}

fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// `N=64`, `-DN=64`, `N` (empty value).
fn define_pair(item: &str) -> Option<(String, String)> {
    let item = item.trim();
    let item = item.strip_prefix("-D").unwrap_or(item).trim();
    if item.is_empty() {
        return None;
    }
    match item.split_once('=') {
        Some((k, v)) => Some((k.trim().to_owned(), v.trim().to_owned())),
        None => Some((item.to_owned(), String::new())),
    }
}

fn repair_map(field: &'static str, value: Value) -> Result<Value, RepairError> {
    let mut out = Map::new();
    match value {
        Value::Null => return Ok(Value::Object(out)),
        Value::Object(map) => {
            for (k, v) in map {
                let text = match &v {
                    Value::Null => String::new(),
                    other => scalar_text(other).ok_or_else(|| RepairError::MapValue {
                        field,
                        key: k.clone(),
                        got: other.clone(),
                    })?,
                };
                out.insert(k, Value::String(text));
            }
        }
        Value::Array(items) => {
            for item in items {
                let text = scalar_text(&item).ok_or_else(|| RepairError::MapItem {
                    field,
                    got: item.clone(),
                })?;
                if let Some((k, v)) = define_pair(&text) {
                    out.insert(k, Value::String(v));
                }
            }
        }
        Value::String(text) => {
            for item in text
                .split([',', ' ', ';', '\n'])
                .filter(|s| !s.trim().is_empty())
            {
                if let Some((k, v)) = define_pair(item) {
                    out.insert(k, Value::String(v));
                }
            }
        }
        other => return Err(RepairError::NotAMap { field, got: other }),
    }
    Ok(Value::Object(out))
}

/// Apply the repairs of `shape` to `args`.
pub(crate) fn normalize_args(args: Value, shape: &Shape) -> Result<Value, NormalizeError> {
    repair(args, shape).map_err(|e| NormalizeError::invalid(e.to_string()))
}

fn repair(args: Value, shape: &Shape) -> Result<Value, RepairError> {
    let args = match args {
        Value::Null => Value::Object(Map::new()),
        Value::String(text) if text.trim().is_empty() => Value::Object(Map::new()),
        Value::String(text) => {
            serde_json::from_str::<Value>(&text).map_err(|e| RepairError::NotJson(e.to_string()))?
        }
        other => other,
    };
    let Value::Object(mut map) = args else {
        return Err(RepairError::NotAnObject(args));
    };
    for (alias, canonical) in shape.aliases {
        if !map.contains_key(*canonical)
            && let Some(v) = map.remove(*alias)
        {
            map.insert((*canonical).to_owned(), v);
        }
    }
    for field in shape.ignored {
        map.remove(*field);
    }
    for field in shape.integers {
        if let Some(v) = map.get_mut(*field) {
            match v {
                Value::String(s) => {
                    let n = parse_number(s)
                        .filter(|n| n.fract() == 0.0)
                        .ok_or_else(|| RepairError::NotAnInteger {
                            field,
                            got: s.clone(),
                        })?;
                    *v = Value::from(n as i64);
                }
                Value::Number(n) if n.as_i64().is_none() && n.as_u64().is_none() => {
                    if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0) {
                        *v = Value::from(f as i64);
                    }
                }
                _ => {}
            }
        }
    }
    for field in shape.numbers {
        if let Some(v) = map.get_mut(*field)
            && let Value::String(s) = v
        {
            let n = parse_number(s).ok_or_else(|| RepairError::NotANumber {
                field,
                got: s.clone(),
            })?;
            *v = Value::from(n);
        }
    }
    for field in shape.bools {
        if let Some(v) = map.get_mut(*field) {
            let repaired = match v {
                Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
                    "true" | "yes" | "1" | "on" => Some(true),
                    "false" | "no" | "0" | "off" | "" => Some(false),
                    _ => {
                        return Err(RepairError::NotABool {
                            field,
                            got: s.clone(),
                        });
                    }
                },
                Value::Number(n) => Some(n.as_f64().unwrap_or(0.0) != 0.0),
                _ => None,
            };
            if let Some(b) = repaired {
                *v = Value::Bool(b);
            }
        }
    }
    for field in shape.lists {
        if let Some(v) = map.get_mut(*field) {
            match v {
                Value::String(_) | Value::Number(_) | Value::Bool(_) => {
                    let text = scalar_text(v).unwrap_or_default();
                    *v = Value::Array(vec![Value::String(text)]);
                }
                Value::Array(items) => {
                    for item in items.iter_mut() {
                        if let (Value::Number(_) | Value::Bool(_), Some(text)) =
                            (&*item, scalar_text(item))
                        {
                            *item = Value::String(text);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    for field in shape.maps {
        if let Some(v) = map.remove(*field) {
            map.insert((*field).to_owned(), repair_map(field, v)?);
        }
    }
    Ok(Value::Object(map))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SHAPE: Shape = Shape {
        integers: &["limit"],
        numbers: &["flops"],
        bools: &["recursive"],
        lists: &["args"],
        maps: &["defines"],
        aliases: &[("file", "path")],
        ignored: &["artifact"],
    };

    #[test]
    fn arguments_of_sibling_tools_are_dropped() {
        let out =
            normalize_args(json!({"path": "k.c", "artifact": "b1"}), &SHAPE).expect("repaired");
        assert_eq!(out, json!({"path": "k.c"}));
    }

    #[test]
    fn repairs_common_mistakes() {
        let out = normalize_args(
            json!({"file": "k.c", "limit": "20", "flops": "2e9", "recursive": "yes",
                   "args": "--n", "defines": ["-DN=64", "UNROLL=4"]}),
            &SHAPE,
        )
        .expect("repairs");
        assert_eq!(
            out,
            json!({"path": "k.c", "limit": 20, "flops": 2e9, "recursive": true,
                   "args": ["--n"], "defines": {"N": "64", "UNROLL": "4"}})
        );
        let out = normalize_args(json!("{\"defines\": \"N=8,M=2\", \"limit\": 3.0}"), &SHAPE)
            .expect("string object");
        assert_eq!(out, json!({"defines": {"N": "8", "M": "2"}, "limit": 3}));
        let out = normalize_args(json!({"defines": {"N": 64}}), &SHAPE).expect("numeric value");
        assert_eq!(out, json!({"defines": {"N": "64"}}));
    }

    #[test]
    fn unrepairable_arguments_name_the_field() {
        let err = normalize_args(json!({"limit": "many"}), &SHAPE).expect_err("bad int");
        assert!(err.to_string().contains("`limit`"), "{err}");
        let err = normalize_args(json!([1, 2]), &SHAPE).expect_err("not an object");
        assert!(err.to_string().contains("JSON object"), "{err}");
        let err = normalize_args(json!({"recursive": "maybe"}), &SHAPE).expect_err("bad bool");
        assert!(err.to_string().contains("`recursive`"), "{err}");
    }

    #[test]
    fn repair_messages_name_the_field_and_what_was_given() {
        let message = |args: Value| {
            normalize_args(args, &SHAPE)
                .expect_err("unrepairable")
                .to_string()
        };
        assert_eq!(
            message(json!({"limit": "2.5"})),
            "`limit` must be an integer, got \"2.5\""
        );
        assert_eq!(
            message(json!({"flops": "fast"})),
            "`flops` must be a number, got \"fast\""
        );
        assert_eq!(
            message(json!({"recursive": "maybe"})),
            "`recursive` must be true or false, got \"maybe\""
        );
        assert_eq!(message(json!(7)), "arguments must be a JSON object, got 7");
        assert!(
            message(json!("{not json"))
                .starts_with("arguments must be a JSON object; the string given is not JSON (")
        );
        assert_eq!(
            message(json!({"defines": {"N": [1]}})),
            "`defines.N` must be a string or number, got [1]"
        );
        assert_eq!(
            message(json!({"defines": [[1]]})),
            "`defines` items must be \"NAME=VALUE\" strings, got [1]"
        );
        assert_eq!(
            message(json!({"defines": true})),
            "`defines` must be an object of NAME: VALUE, got true"
        );
    }
}
