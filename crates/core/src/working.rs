//! What the session has done so far, folded from the [`Effect`]s that
//! successful tool calls declare: the working state the model is reminded of
//! every turn, and the evidence ledger the completion gate judges.
//!
//! Tools declare their effects instead of the engine guessing from tool
//! names, so a new tool needs no engine change to count as an edit or as
//! verification.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::tool::Effect;

/// The session's shared memory of what has happened (written, compiled,
/// benchmarked, ...). Known fields are typed; anything else goes to `extra`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkingState {
    /// The kernel source the session works on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_file: Option<String>,
    /// The optimization mode the task asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimization_mode: Option<String>,
    /// Every compile result, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compile_results: Vec<serde_json::Value>,
    /// Every benchmark result, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub benchmark_results: Vec<serde_json::Value>,
    /// The candidates under consideration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_candidates: Option<serde_json::Value>,
    /// Free keys set by tools.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, serde_json::Value>,
}

fn as_text(value: serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s,
        other => other.to_string(),
    }
}

impl WorkingState {
    /// Apply one `Effect::State`. `append` pushes onto list fields (and turns
    /// a free key into a list); on the text fields it simply sets the value.
    pub fn set(&mut self, key: &str, value: serde_json::Value, append: bool) {
        match key {
            "source_file" => self.source_file = Some(as_text(value)),
            "optimization_mode" => self.optimization_mode = Some(as_text(value)),
            "compile_results" => set_list(&mut self.compile_results, value, append),
            "benchmark_results" => set_list(&mut self.benchmark_results, value, append),
            "current_candidates" => self.current_candidates = Some(value),
            _ => {
                if append {
                    match self.extra.get_mut(key) {
                        Some(serde_json::Value::Array(items)) => items.push(value),
                        Some(existing) => {
                            let old = existing.take();
                            *existing = serde_json::Value::Array(vec![old, value]);
                        }
                        None => {
                            self.extra
                                .insert(key.to_owned(), serde_json::Value::Array(vec![value]));
                        }
                    }
                } else {
                    self.extra.insert(key.to_owned(), value);
                }
            }
        }
    }

    /// True when nothing has been recorded yet.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The state as the model is reminded of it: every list cut to its
    /// latest `keep` items, with how many earlier ones there were
    /// (`compile_results_earlier`), so the reminder does not grow with the
    /// session (a small model's whole context is 8k tokens). The state
    /// itself keeps every item for the task's result.
    ///
    /// Each value is shown briefly (`brief`): the reminder is re-read at every
    /// step (a CPU-served model pays for every token of it, every step),
    /// and the full values are in the tool results it summarises.
    pub fn model_view(&self, keep: usize) -> serde_json::Value {
        let mut view = serde_json::to_value(self).unwrap_or_default();
        brief(&mut view);
        if let Some(fields) = view.as_object_mut() {
            let cut: Vec<(String, usize)> = fields
                .iter_mut()
                .filter_map(|(name, value)| {
                    let items = value.as_array_mut()?;
                    let earlier = items.len().checked_sub(keep).filter(|n| *n > 0)?;
                    items.drain(..earlier);
                    Some((name.clone(), earlier))
                })
                .collect();
            for (name, earlier) in cut {
                fields.insert(format!("{name}_earlier"), serde_json::json!(earlier));
            }
        }
        view
    }
}

/// Opaque tokens (no whitespace: hashes, ids) longer than this are shown
/// by their first [`TOKEN_SHOWN`] characters, as hashes are everywhere else.
const TOKEN_LONGEST: usize = 16;
const TOKEN_SHOWN: usize = 12;
/// Text longer than this is cut to [`TEXT_SHOWN`] characters.
const TEXT_LONGEST: usize = 48;
const TEXT_SHOWN: usize = 40;
/// Significant digits a fractional number is shown with.
const DIGITS_SHOWN: i32 = 4;

/// `value` as a reminder shows it: nulls and empty lists or objects left
/// out, long strings cut (marked with `…`), fractions rounded.
fn brief(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Object(fields) => {
            fields.retain(|_, field| !is_blank(field));
            fields.values_mut().for_each(brief);
        }
        Value::Array(items) => items.iter_mut().for_each(brief),
        Value::String(text) => {
            let opaque = !text.contains(char::is_whitespace);
            let (longest, shown) = if opaque {
                (TOKEN_LONGEST, TOKEN_SHOWN)
            } else {
                (TEXT_LONGEST, TEXT_SHOWN)
            };
            if text.chars().count() > longest {
                *text = text.chars().take(shown).chain(['…']).collect();
            }
        }
        Value::Number(number) => {
            if let Some(x) = number
                .as_f64()
                .filter(|x| x.fract() != 0.0 && x.is_finite())
            {
                let scale = 10f64.powi(DIGITS_SHOWN - 1 - x.abs().log10().floor() as i32);
                if let Some(rounded) = serde_json::Number::from_f64((x * scale).round() / scale) {
                    *number = rounded;
                }
            }
        }
        Value::Null | Value::Bool(_) => {}
    }
}

fn is_blank(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::Null => true,
        serde_json::Value::Array(items) => items.is_empty(),
        serde_json::Value::Object(fields) => fields.is_empty(),
        _ => false,
    }
}

fn set_list(list: &mut Vec<serde_json::Value>, value: serde_json::Value, append: bool) {
    if append {
        list.push(value);
    } else {
        match value {
            serde_json::Value::Array(items) => *list = items,
            other => *list = vec![other],
        }
    }
}

/// One piece of verification evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvidenceRecord {
    /// What was verified (e.g. `validate`, `benchmark`).
    pub kind: String,
    /// Whether it passed.
    pub passed: bool,
    /// The step it was recorded in.
    pub step: u32,
    /// Position in the effect order of the run (mutations share it).
    pub seq: u64,
    /// The figures of the verification.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub summary: serde_json::Value,
}

/// The latest change to what the answer depends on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MutationRecord {
    /// What changed.
    pub target: String,
    /// The step it changed in.
    pub step: u32,
    /// Position in the effect order of the run.
    pub seq: u64,
}

/// Evidence and mutations in the order they happened.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EvidenceLedger {
    /// Every piece of evidence, in order.
    pub records: Vec<EvidenceRecord>,
    /// The latest mutation, which voids the evidence before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_mutation: Option<MutationRecord>,
    /// The position the next effect gets.
    pub next_seq: u64,
}

impl EvidenceLedger {
    /// Record an Evidence or Mutation effect (others are ignored here).
    pub fn record(&mut self, effect: &Effect, step: u32) {
        let seq = self.next_seq;
        match effect {
            Effect::Mutation { target } => {
                self.last_mutation = Some(MutationRecord {
                    target: target.clone(),
                    step,
                    seq,
                });
            }
            Effect::Evidence {
                kind,
                passed,
                summary,
            } => self.records.push(EvidenceRecord {
                kind: kind.clone(),
                passed: *passed,
                step,
                seq,
                summary: summary.clone(),
            }),
            Effect::State { .. } => return,
        }
        self.next_seq += 1;
    }

    /// Passed evidence of `kind` taken after the latest mutation.
    pub fn has_valid(&self, kind: &str) -> bool {
        self.records
            .iter()
            .any(|r| r.kind == kind && r.passed && self.after_last_mutation(r))
    }

    /// Passed evidence of `kind` that a later mutation voided.
    pub fn has_voided(&self, kind: &str) -> bool {
        self.records
            .iter()
            .any(|r| r.kind == kind && r.passed && !self.after_last_mutation(r))
    }

    fn after_last_mutation(&self, record: &EvidenceRecord) -> bool {
        self.last_mutation
            .as_ref()
            .is_none_or(|m| record.seq > m.seq)
    }
}

/// Fold one effect into the working state and the ledger.
pub(crate) fn apply_effect(
    working: &mut WorkingState,
    ledger: &mut EvidenceLedger,
    effect: &Effect,
    step: u32,
) {
    match effect {
        Effect::State { key, value, append } => working.set(key, value.clone(), *append),
        other => ledger.record(other, step),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_model_view_keeps_the_latest_items_of_each_list_and_counts_the_rest() {
        let mut state = WorkingState::default();
        for n in 0..5 {
            state.set(
                "compile_results",
                json!({"artifact": format!("b{n}")}),
                true,
            );
        }
        state.set("benchmark_results", json!({"artifact": "b4"}), true);
        let view = state.model_view(3);
        assert_eq!(
            view["compile_results"],
            json!([{"artifact": "b2"}, {"artifact": "b3"}, {"artifact": "b4"}])
        );
        assert_eq!(view["compile_results_earlier"], json!(2));
        assert_eq!(view["benchmark_results"], json!([{"artifact": "b4"}]));
        assert!(view.get("benchmark_results_earlier").is_none(), "{view}");
        assert_eq!(state.compile_results.len(), 5, "the state keeps every item");
    }

    #[test]
    fn the_model_view_shows_each_value_briefly() {
        let mut state = WorkingState::default();
        let hash = "0c44d28e7679a3fd308b94e703c1c39438a72f28738dba1f5d4449cd7db9a6a4";
        let toolchain =
            "clang 14.0.6 --target=wasm32 -O2 -msimd128 -fno-vectorize -fno-slp-vectorize";
        state.set(
            "benchmark_results",
            json!({"artifact": "b1", "kernel_hash": hash, "toolchain": toolchain,
                   "gflops": 1.234740985189481, "peak_fraction": 0.0013397797148323363,
                   "cores": 8, "error": null, "flags": [], "defines": {"BUF": "2"}}),
            true,
        );
        let view = state.model_view(3);
        assert_eq!(
            view["benchmark_results"],
            json!([{"artifact": "b1", "kernel_hash": "0c44d28e7679…",
                    "toolchain": "clang 14.0.6 --target=wasm32 -O2 -msimd1…",
                    "gflops": 1.235, "peak_fraction": 0.00134, "cores": 8,
                    "defines": {"BUF": "2"}}])
        );
        assert_eq!(
            state.benchmark_results[0]["kernel_hash"], hash,
            "the state keeps the whole value"
        );
    }

    #[test]
    fn state_effects_set_and_append() {
        let mut state = WorkingState::default();
        state.set("benchmark_results", json!({"ms": 2}), true);
        state.set("benchmark_results", json!({"ms": 1}), true);
        state.set("optimization_mode", json!("vectorize"), false);
        state.set("notes", json!("a"), true);
        state.set("notes", json!("b"), true);
        state.set("best", json!(1), false);
        state.set("best", json!(2), true);
        assert_eq!(
            state.benchmark_results,
            vec![json!({"ms": 2}), json!({"ms": 1})]
        );
        assert_eq!(state.optimization_mode.as_deref(), Some("vectorize"));
        assert_eq!(state.extra["notes"], json!(["a", "b"]));
        assert_eq!(state.extra["best"], json!([1, 2]));
        state.set("compile_results", json!([{"ok": true}]), false);
        assert_eq!(state.compile_results, vec![json!({"ok": true})]);
    }

    #[test]
    fn evidence_counts_only_after_the_latest_mutation() {
        let mut ledger = EvidenceLedger::default();
        let validate = Effect::Evidence {
            kind: "validate".into(),
            passed: true,
            summary: serde_json::Value::Null,
        };
        ledger.record(&validate, 1);
        assert!(ledger.has_valid("validate"));
        ledger.record(
            &Effect::Mutation {
                target: "k.c".into(),
            },
            2,
        );
        assert!(!ledger.has_valid("validate"));
        assert!(ledger.has_voided("validate"));
        ledger.record(&validate, 3);
        assert!(ledger.has_valid("validate"));
        assert!(!ledger.has_valid("benchmark"));
    }
}
