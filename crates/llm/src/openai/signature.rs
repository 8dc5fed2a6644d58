//! A tool's JSON Schema as a one-line signature, for text mode's tool list:
//! `{kernel_dir?: string (the kernel directory), defines?: {[name]: string}}`.
//!
//! Text mode describes every tool in the system message, which a model on
//! a CPU reads (and pays for) at the start of every conversation; a JSON
//! Schema spends most of its tokens on its own keywords (`"type"`,
//! `"properties"`, `["string","null"]`, `"additionalProperties"`). The
//! TypeScript-like signature keeps what a model needs to write the
//! arguments (names, types, which are optional, allowed values and the
//! descriptions) in about half the tokens. A schema using what the
//! signature cannot say (`$ref`, `allOf`, ...) is left as JSON.

use serde_json::{Map, Value};

/// `schema` as a signature, or `None` when it is not an object schema the
/// signature can state fully.
pub(crate) fn signature(schema: &Value) -> Option<String> {
    let object = schema.as_object()?;
    if object.get("type").and_then(Value::as_str) != Some("object") {
        return None;
    }
    fields(object)
}

/// Keywords a signature cannot state: a schema holding one stays JSON.
const UNSAID: [&str; 6] = ["$ref", "$defs", "definitions", "allOf", "not", "if"];

fn says_more(object: &Map<String, Value>) -> bool {
    UNSAID.iter().any(|keyword| object.contains_key(*keyword))
}

/// `{name?: type (description), ...}` of an object schema's properties.
fn fields(object: &Map<String, Value>) -> Option<String> {
    if says_more(object) {
        return None;
    }
    let Some(properties) = object.get("properties").and_then(Value::as_object) else {
        return Some("{}".into());
    };
    let required: Vec<&str> = object
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut parts = Vec::with_capacity(properties.len());
    for (name, property) in properties {
        let optional = if required.contains(&name.as_str()) {
            ""
        } else {
            "?"
        };
        let mut part = format!("{name}{optional}: {}", type_of(property)?);
        if let Some(description) = property
            .get("description")
            .and_then(Value::as_str)
            .map(|d| d.split_whitespace().collect::<Vec<_>>().join(" "))
            .filter(|d| !d.is_empty())
        {
            part.push_str(&format!(" ({description})"));
        }
        parts.push(part);
    }
    Some(format!("{{{}}}", parts.join(", ")))
}

/// The type of one property: `string`, `integer[]`, `"a" | "b"`,
/// `{[name]: string}`, a nested `{...}`; `null` alternatives are left out
/// (the field's `?` says it may be absent).
fn type_of(schema: &Value) -> Option<String> {
    let object = schema.as_object().filter(|o| !says_more(o))?;
    if let Some(values) = object.get("enum").and_then(Value::as_array) {
        let shown: Vec<String> = values
            .iter()
            .filter(|v| !v.is_null())
            .map(Value::to_string)
            .collect();
        return Some(shown.join(" | "));
    }
    if let Some(constant) = object.get("const") {
        return Some(constant.to_string());
    }
    for keyword in ["anyOf", "oneOf"] {
        if let Some(variants) = object.get(keyword).and_then(Value::as_array) {
            let shown = variants
                .iter()
                .filter(|v| v.get("type").and_then(Value::as_str) != Some("null"))
                .map(type_of)
                .collect::<Option<Vec<_>>>()?;
            return Some(shown.join(" | "));
        }
    }
    let types: Vec<&str> = match object.get("type") {
        Some(Value::String(one)) => vec![one.as_str()],
        Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).collect(),
        // No type: any JSON value.
        None => return Some("any".into()),
        Some(_) => return None,
    };
    let shown = types
        .into_iter()
        .filter(|t| *t != "null")
        .map(|t| named_type(t, object))
        .collect::<Option<Vec<_>>>()?;
    Some(shown.join(" | "))
}

fn named_type(name: &str, object: &Map<String, Value>) -> Option<String> {
    match name {
        "string" | "integer" | "number" | "boolean" => Some(name.into()),
        "array" => {
            let item = object.get("items").map_or(Some("any".into()), type_of)?;
            Some(if item.contains(' ') {
                format!("({item})[]")
            } else {
                format!("{item}[]")
            })
        }
        "object" if object.contains_key("properties") => fields(object),
        "object" => match object.get("additionalProperties") {
            Some(Value::Object(_)) => {
                let value = type_of(object.get("additionalProperties")?)?;
                Some(format!("{{[name]: {value}}}"))
            }
            _ => Some("object".into()),
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_object_schema_becomes_its_fields_with_types_and_descriptions() {
        let schema = json!({
            "type": "object",
            "properties": {
                "kernel_dir": {"type": ["string", "null"], "description": "the kernel\n directory"},
                "defines": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
                "cores": {"type": "integer"},
                "mode": {"enum": ["any", "all", null]},
                "ids": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]}},
                "plan": {"type": "object", "properties": {"n": {"type": "number"}}, "required": ["n"]}
            },
            "required": ["cores"],
            "additionalProperties": false
        });
        assert_eq!(
            signature(&schema).as_deref(),
            Some(
                "{cores: integer, defines?: {[name]: string}, ids?: (string | integer)[], \
                 kernel_dir?: string (the kernel directory), mode?: \"any\" | \"all\", plan?: {n: number}}"
            )
        );
    }

    #[test]
    fn what_a_signature_cannot_say_stays_json() {
        for schema in [
            json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}}),
            json!({"type": "object", "allOf": [{"type": "object"}]}),
            json!({"type": "string"}),
            json!({"type": "object", "properties": {"a": {"type": "tuple"}}}),
        ] {
            assert_eq!(signature(&schema), None, "{schema}");
        }
    }

    #[test]
    fn a_signature_is_shorter_than_its_schema() {
        let schema = json!({
            "type": "object",
            "properties": {
                "artifact": {"type": ["string", "null"], "description": "artifact id from compile"},
                "cores": {"type": ["integer", "null"], "description": "cores of the slice to use"},
                "runs": {"type": ["integer", "null"], "description": "executions, each checked"}
            },
            "additionalProperties": false
        });
        let shown = signature(&schema).expect("a signature");
        assert!(
            shown.len() * 3 < schema.to_string().len() * 2,
            "{shown} is not a third shorter than {schema}"
        );
    }
}
