//! A kernel's tuning space, read from its `tune.toml`: the parameters a tuner
//! may set (as `-D` defines), the constraints that rule configurations out
//! (expressions over parameters, problem sizes and chip-spec numbers, e.g.
//! what fits in AM), the problem sizes, the tolerance and the baseline
//! variant, and optionally a performance model (`[model]`: flops and DDR
//! bytes per configuration, for roofline ranking). The format is documented
//! in `examples/kernels/README.md`.
//!
//! ```toml
//! kernel = "dgemm"
//! tolerance = 1e-9
//! baseline = { VARIANT = "naive" }
//! constraints = ["BUF * (MB + KB) * NB * 8 <= am_bytes"]
//!
//! [sizes]
//! M = 512
//!
//! [[param]]
//! name = "MB"
//! values = [32, 64, 128]
//! default = 64
//!
//! [[param]]
//! name = "BUF"
//! range = { min = 1, max = 2 }   # step defaults to 1
//! default = 2
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use evalexpr::{ContextWithMutableVariables, HashMapContext, Value as ExprValue};
use serde::{Deserialize, Serialize};

use crate::error::HwError;
use crate::process::excerpt;
use crate::spec::ChipSpec;

/// Configurations enumerated at most (the cartesian product before the
/// constraints); a larger space is a mistake in the file.
pub const MAX_CARTESIAN: usize = 1_000_000;

/// Errors reading or using a tuning space. Messages name the file's problem.
/// What they quote of the file or of `-D` defines (names, values,
/// expressions: untrusted text) is shown in part ([`excerpt`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TuneError {
    /// The file cannot be read or does not parse as `tune.toml`.
    #[error("tune.toml: {}", excerpt(.0))]
    Parse(String),
    /// The file parses but breaks a rule (names, ranges, defaults, tolerance,
    /// size of the space).
    #[error("tune.toml: {}", excerpt(.0))]
    Invalid(String),
    /// A configuration fails a constraint.
    #[error("configuration violates `{}`", excerpt(.constraint))]
    Violated {
        /// The constraint as written in the file.
        constraint: String,
    },
    /// A constraint or `[model]` expression does not parse or evaluate.
    #[error("constraint `{}`: {}", excerpt(.constraint), excerpt(.reason))]
    Expression {
        /// The expression as written in the file.
        constraint: String,
        /// The evaluator's message.
        reason: String,
    },
    /// A configuration or `-D` define outside the space (unknown name, value
    /// not among its values).
    #[error("configuration: {}", excerpt(.0))]
    Config(String),
}

impl From<TuneError> for HwError {
    fn from(e: TuneError) -> Self {
        HwError::Config(e.to_string())
    }
}

/// One value of a parameter or size: a number or a word (`naive`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ParamValue {
    /// An integer, e.g. a block size.
    Int(i64),
    /// A floating-point number.
    Float(f64),
    /// A word, e.g. a variant name.
    Str(String),
}

impl fmt::Display for ParamValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Int(i) => write!(f, "{i}"),
            Self::Float(x) => write!(f, "{x:e}"),
            Self::Str(s) => f.write_str(s),
        }
    }
}

impl ParamValue {
    fn to_expr(&self) -> ExprValue {
        match self {
            Self::Int(i) => ExprValue::Int(*i),
            Self::Float(x) => ExprValue::Float(*x),
            Self::Str(s) => ExprValue::String(s.clone()),
        }
    }
}

/// A tunable parameter and the values it may take.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Param {
    /// Parameter name: a C identifier, passed as `-D NAME=VALUE`.
    pub name: String,
    /// The values a tuner may choose: `values`, or `range` expanded (never empty).
    pub values: Vec<ParamValue>,
    /// The value of a configuration that does not set it; one of `values`.
    pub default: ParamValue,
    /// What the parameter controls, free text from the file (shown in reports).
    pub description: Option<String>,
}

/// A configuration: parameter name -> value.
pub type Config = BTreeMap<String, ParamValue>;

/// A parsed `tune.toml`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TuneSpace {
    /// Kernel name, the file's `kernel` key (non-empty).
    pub kernel: String,
    /// The tunable parameters, in file order (the first varies slowest in
    /// [`TuneSpace::configurations`]).
    pub params: Vec<Param>,
    /// Boolean expressions every configuration must satisfy.
    pub constraints: Vec<String>,
    /// Problem sizes, passed as `-D` defines and visible to constraints.
    pub sizes: BTreeMap<String, ParamValue>,
    /// Largest accepted absolute error (passed as `-D TOLERANCE=`).
    pub tolerance: f64,
    /// Parameter overrides that select the baseline (naive) variant.
    pub baseline: Config,
    /// Work and DDR traffic of one execution per configuration, for
    /// roofline estimates (the optional `[model]` table).
    pub model: Option<PerfModel>,
    /// Further files of the kernel directory that judge the kernel (inputs,
    /// references), protected like host.c and tune.toml (see `harness`).
    pub harness: Vec<String>,
}

/// Expressions (same syntax and variables as the constraints) giving the
/// floating-point operations and the DDR bytes of one execution of a
/// configuration, so a tuner can rank configurations by their roofline
/// bound before running any of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerfModel {
    /// Expression for the floating-point operations of one execution.
    pub flops: String,
    /// Expression for the DDR bytes of one execution.
    pub bytes: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpace {
    kernel: String,
    #[serde(default)]
    tolerance: Option<f64>,
    #[serde(default)]
    baseline: BTreeMap<String, ParamValue>,
    #[serde(default)]
    constraints: Vec<String>,
    #[serde(default)]
    sizes: BTreeMap<String, ParamValue>,
    #[serde(default, rename = "param")]
    params: Vec<RawParam>,
    #[serde(default)]
    model: Option<PerfModel>,
    #[serde(default)]
    harness: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawParam {
    name: String,
    #[serde(default)]
    values: Option<Vec<ParamValue>>,
    #[serde(default)]
    range: Option<RawRange>,
    default: ParamValue,
    #[serde(default)]
    description: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRange {
    min: i64,
    max: i64,
    #[serde(default = "one")]
    step: i64,
}

fn one() -> i64 {
    1
}

fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Spec numbers constraints may use, by name.
fn spec_variables(spec: &ChipSpec) -> Vec<(&'static str, ExprValue)> {
    let int = |v: u64| ExprValue::Int(i64::try_from(v).unwrap_or(i64::MAX));
    vec![
        ("am_bytes", int(spec.am_bytes)),
        ("sm_bytes", int(spec.sm_bytes)),
        ("gsm_bytes", int(spec.gsm_bytes)),
        ("am_max_buffers", int(u64::from(spec.am_max_buffers))),
        ("sm_max_buffers", int(u64::from(spec.sm_max_buffers))),
        ("cores_per_cluster", int(u64::from(spec.cores_per_cluster))),
        ("vector_lanes", int(u64::from(spec.vector_lanes))),
        ("fma_per_lane", int(u64::from(spec.fma_per_lane))),
        ("vector_registers", int(u64::from(spec.vector_registers))),
        ("clusters", int(u64::from(spec.clusters))),
    ]
}

/// Longest constraint or `[model]` expression: the evaluator parses and
/// evaluates by recursion, so a long or deeply nested expression (the
/// file is the kernel author's, not trusted) would overflow the stack.
pub const MAX_EXPRESSION_CHARS: usize = 512;
/// Deepest nesting of brackets in an expression.
pub const MAX_EXPRESSION_DEPTH: usize = 16;

/// Refuses an expression over the size or nesting bound, quoting its start.
fn check_expression_size(expression: &str) -> Result<(), TuneError> {
    let refuse = |reason: String| TuneError::Expression {
        constraint: expression.chars().take(80).collect(),
        reason,
    };
    let chars = expression.chars().count();
    if chars > MAX_EXPRESSION_CHARS {
        return Err(refuse(format!(
            "the expression is {chars} characters long (at most {MAX_EXPRESSION_CHARS})"
        )));
    }
    let mut depth = 0usize;
    for c in expression.chars() {
        match c {
            '(' | '{' | '[' => depth += 1,
            ')' | '}' | ']' => depth = depth.saturating_sub(1),
            _ => continue,
        }
        if depth > MAX_EXPRESSION_DEPTH {
            return Err(refuse(format!(
                "brackets nest deeper than {MAX_EXPRESSION_DEPTH}"
            )));
        }
    }
    Ok(())
}

impl TuneSpace {
    /// Read `<dir>/tune.toml` (or the file itself when `path` is a file).
    pub fn load(path: &Path) -> Result<Self, TuneError> {
        let file = if path.is_dir() {
            path.join("tune.toml")
        } else {
            path.to_path_buf()
        };
        let text = std::fs::read_to_string(&file)
            .map_err(|e| TuneError::Parse(format!("{}: {e}", file.display())))?;
        Self::from_toml_str(&text)
    }

    /// Parse and validate `tune.toml` text; constraint and `[model]`
    /// expressions are checked for syntax here.
    pub fn from_toml_str(text: &str) -> Result<Self, TuneError> {
        let raw: RawSpace = toml::from_str(text).map_err(|e| TuneError::Parse(e.to_string()))?;
        if raw.kernel.trim().is_empty() {
            return Err(TuneError::Invalid("`kernel` is empty".into()));
        }
        let mut params = Vec::with_capacity(raw.params.len());
        for p in raw.params {
            if !is_identifier(&p.name) {
                return Err(TuneError::Invalid(format!(
                    "parameter name `{}` is not a C identifier",
                    p.name
                )));
            }
            if params.iter().any(|q: &Param| q.name == p.name) || raw.sizes.contains_key(&p.name) {
                return Err(TuneError::Invalid(format!(
                    "`{}` is declared twice",
                    p.name
                )));
            }
            let values = match (p.values, p.range) {
                (Some(v), None) => v,
                (None, Some(r)) => {
                    if r.step <= 0 || r.min > r.max {
                        return Err(TuneError::Invalid(format!(
                            "parameter `{}`: range needs min <= max and step > 0",
                            p.name
                        )));
                    }
                    let count = (r.max - r.min) / r.step + 1;
                    if count > MAX_CARTESIAN as i64 {
                        return Err(TuneError::Invalid(format!(
                            "parameter `{}`: range has {count} values",
                            p.name
                        )));
                    }
                    (0..count)
                        .map(|i| ParamValue::Int(r.min + i * r.step))
                        .collect()
                }
                _ => {
                    return Err(TuneError::Invalid(format!(
                        "parameter `{}` needs exactly one of `values` or `range`",
                        p.name
                    )));
                }
            };
            if values.is_empty() {
                return Err(TuneError::Invalid(format!(
                    "parameter `{}` has no values",
                    p.name
                )));
            }
            if !values.contains(&p.default) {
                return Err(TuneError::Invalid(format!(
                    "parameter `{}`: default {} is not among its values",
                    p.name, p.default
                )));
            }
            params.push(Param {
                name: p.name,
                values,
                default: p.default,
                description: p.description,
            });
        }
        for name in raw.sizes.keys() {
            if !is_identifier(name) {
                return Err(TuneError::Invalid(format!(
                    "size name `{name}` is not a C identifier"
                )));
            }
        }
        for name in raw.baseline.keys() {
            if !is_identifier(name) {
                return Err(TuneError::Invalid(format!(
                    "baseline define `{name}` is not a C identifier"
                )));
            }
        }
        let tolerance = raw.tolerance.unwrap_or(0.0);
        if !(tolerance.is_finite() && tolerance >= 0.0) {
            return Err(TuneError::Invalid(format!(
                "tolerance must be a non-negative number, got {tolerance}"
            )));
        }
        let space = Self {
            kernel: raw.kernel,
            params,
            constraints: raw.constraints,
            sizes: raw.sizes,
            tolerance,
            baseline: raw.baseline,
            model: raw.model,
            harness: raw.harness,
        };
        // Catch malformed expressions now rather than at enumeration time.
        let model_exprs = space.model.iter().flat_map(|m| [&m.flops, &m.bytes]);
        for c in space.constraints.iter().chain(model_exprs) {
            check_expression_size(c)?;
            evalexpr::build_operator_tree(c).map_err(|e| TuneError::Expression {
                constraint: c.clone(),
                reason: e.to_string(),
            })?;
        }
        Ok(space)
    }

    /// Every parameter at its default.
    pub fn default_config(&self) -> Config {
        self.params
            .iter()
            .map(|p| (p.name.clone(), p.default.clone()))
            .collect()
    }

    /// The default configuration with the baseline overrides applied.
    pub fn baseline_config(&self) -> Config {
        let mut config = self.default_config();
        config.extend(self.baseline.clone());
        config
    }

    /// Number of configurations before constraints.
    pub fn cartesian_size(&self) -> usize {
        self.params
            .iter()
            .map(|p| p.values.len())
            .try_fold(1usize, |acc, n| acc.checked_mul(n))
            .unwrap_or(usize::MAX)
    }

    /// Is `config` inside the space and does it satisfy every constraint?
    /// The error names the first violated constraint.
    pub fn check(&self, config: &Config, spec: &ChipSpec) -> Result<(), TuneError> {
        for (name, value) in config {
            if self.baseline.get(name) == Some(value) {
                continue;
            }
            match self.params.iter().find(|p| &p.name == name) {
                Some(p) if p.values.contains(value) => {}
                Some(p) => {
                    return Err(TuneError::Config(format!(
                        "{name} = {value} is not one of its values ({})",
                        p.values
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
                None => {
                    return Err(TuneError::Config(format!(
                        "{name} is not a parameter of {}",
                        self.kernel
                    )));
                }
            }
        }
        self.satisfies(config, spec)
    }

    fn context(&self, config: &Config, spec: &ChipSpec) -> Result<HashMapContext, TuneError> {
        let mut ctx = HashMapContext::new();
        let set = |ctx: &mut HashMapContext, name: &str, value: ExprValue| {
            ctx.set_value(name.to_owned(), value)
                .map_err(|e| TuneError::Config(format!("{name}: {e}")))
        };
        for (name, value) in spec_variables(spec) {
            set(&mut ctx, name, value)?;
        }
        for (name, value) in &self.sizes {
            set(&mut ctx, name, value.to_expr())?;
        }
        for p in &self.params {
            let value = config.get(&p.name).unwrap_or(&p.default);
            set(&mut ctx, &p.name, value.to_expr())?;
        }
        Ok(ctx)
    }

    /// Flops and DDR bytes of one execution of the build with these `-D`
    /// defines, from the `[model]` table (`None` when the file has none).
    /// Defines override sizes and parameters; numbers are read as numbers,
    /// anything else as a word.
    pub fn model_figures(
        &self,
        defines: &BTreeMap<String, String>,
        spec: &ChipSpec,
    ) -> Result<Option<(f64, f64)>, TuneError> {
        let Some(model) = &self.model else {
            return Ok(None);
        };
        let mut ctx = self.context(&Config::new(), spec)?;
        for (name, text) in defines {
            let value = if let Ok(i) = text.trim().parse::<i64>() {
                ExprValue::Int(i)
            } else if let Ok(x) = text.trim().parse::<f64>() {
                ExprValue::Float(x)
            } else {
                ExprValue::String(text.clone())
            };
            ctx.set_value(name.clone(), value)
                .map_err(|e| TuneError::Config(format!("{name}: {e}")))?;
        }
        let eval = |expr: &String| -> Result<f64, TuneError> {
            let value = evalexpr::eval_number_with_context(expr, &ctx).map_err(|e| {
                TuneError::Expression {
                    constraint: expr.clone(),
                    reason: e.to_string(),
                }
            })?;
            if value.is_finite() && value >= 0.0 {
                Ok(value)
            } else {
                Err(TuneError::Expression {
                    constraint: expr.clone(),
                    reason: format!("evaluates to {value}, not a non-negative number"),
                })
            }
        };
        Ok(Some((eval(&model.flops)?, eval(&model.bytes)?)))
    }

    fn satisfies(&self, config: &Config, spec: &ChipSpec) -> Result<(), TuneError> {
        let ctx = self.context(config, spec)?;
        for c in &self.constraints {
            match evalexpr::eval_boolean_with_context(c, &ctx) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(TuneError::Violated {
                        constraint: c.clone(),
                    });
                }
                Err(e) => {
                    return Err(TuneError::Expression {
                        constraint: c.clone(),
                        reason: e.to_string(),
                    });
                }
            }
        }
        Ok(())
    }

    /// All configurations that satisfy the constraints, in a stable order
    /// (the first parameter varies slowest). An expression that cannot be
    /// evaluated is an error, not a silently excluded configuration.
    pub fn configurations(&self, spec: &ChipSpec) -> Result<Vec<Config>, TuneError> {
        let total = self.cartesian_size();
        if total > MAX_CARTESIAN {
            return Err(TuneError::Invalid(format!(
                "the space has {total} configurations before constraints (at most {MAX_CARTESIAN})"
            )));
        }
        let mut valid = Vec::new();
        let mut index = vec![0usize; self.params.len()];
        for _ in 0..total {
            let config: Config = self
                .params
                .iter()
                .zip(&index)
                .map(|(p, &i)| (p.name.clone(), p.values[i].clone()))
                .collect();
            match self.satisfies(&config, spec) {
                Ok(()) => valid.push(config),
                Err(TuneError::Violated { .. }) => {}
                Err(e) => return Err(e),
            }
            for pos in (0..index.len()).rev() {
                index[pos] += 1;
                if index[pos] < self.params[pos].values.len() {
                    break;
                }
                index[pos] = 0;
            }
        }
        Ok(valid)
    }

    /// Checks `-D` defines as they enter a build (emu run, the compile
    /// tool, task parameters): every name must be a parameter, a size or
    /// `TOLERANCE` (an unknown name is an error listing the known ones,
    /// which catches typos such as `MBB=64`); a parameter's value must be
    /// one of its values (or its baseline override) and the configuration
    /// with the given sizes must satisfy every constraint (the error names
    /// the value or the constraint).
    pub fn check_defines(
        &self,
        defines: &BTreeMap<String, String>,
        spec: &ChipSpec,
    ) -> Result<(), TuneError> {
        let mut space = self.clone();
        let mut config = Config::new();
        for (name, text) in defines {
            if name == "TOLERANCE" {
                continue;
            }
            if let Some(size) = space.sizes.get_mut(name) {
                *size = parse_value(text);
                continue;
            }
            let Some(param) = self.params.iter().find(|p| &p.name == name) else {
                let mut known: Vec<&str> = self.params.iter().map(|p| p.name.as_str()).collect();
                known.extend(self.sizes.keys().map(String::as_str));
                known.push("TOLERANCE");
                return Err(TuneError::Config(format!(
                    "-D {name} is not a parameter or size of {} (known: {})",
                    self.kernel,
                    known.join(", ")
                )));
            };
            let allowed = param
                .values
                .iter()
                .chain(self.baseline.get(name))
                .find(|v| same_value(v, text));
            match allowed {
                Some(value) => {
                    config.insert(name.clone(), value.clone());
                }
                None => {
                    return Err(TuneError::Config(format!(
                        "-D {name}={text} is not one of its values ({})",
                        param
                            .values
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
            }
        }
        space.check(&config, spec)
    }

    /// The `-D` defines of a build: sizes, `TOLERANCE`, then the
    /// configuration (parameters missing from it take their defaults).
    pub fn defines(&self, config: &Config) -> BTreeMap<String, String> {
        let mut defines: BTreeMap<String, String> = self
            .sizes
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect();
        defines.insert("TOLERANCE".into(), format!("{:e}", self.tolerance));
        for p in &self.params {
            let value = config.get(&p.name).unwrap_or(&p.default);
            defines.insert(p.name.clone(), value.to_string());
        }
        for (k, v) in config {
            defines.entry(k.clone()).or_insert_with(|| v.to_string());
        }
        defines
    }
}

/// A define's text as a value: a whole number, a number, else a word.
fn parse_value(text: &str) -> ParamValue {
    let text = text.trim();
    if let Ok(i) = text.parse::<i64>() {
        return ParamValue::Int(i);
    }
    if let Ok(x) = text.parse::<f64>() {
        return ParamValue::Float(x);
    }
    ParamValue::Str(text.to_string())
}

/// Whether a define's text names `value` (`64` and `64.0` are the same
/// number; words compare exactly).
fn same_value(value: &ParamValue, text: &str) -> bool {
    let text = text.trim();
    match value {
        ParamValue::Str(s) => s == text,
        ParamValue::Int(i) => text.parse::<f64>().is_ok_and(|x| x == *i as f64),
        ParamValue::Float(f) => text.parse::<f64>().is_ok_and(|x| x == *f),
    }
}

#[cfg(test)]
mod tests;
