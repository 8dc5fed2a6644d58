//! The job's tuning space as the leader's model reads it: the kernel's
//! tune.toml rendered for the system prompt (every parameter with its
//! values and default, the constraints, the fixed sizes and a ready-made
//! `assign_task` plan), so no model has to guess a parameter's name; and
//! the check `assign_task` runs on a plan's candidates, whose refusal
//! names the wrong name or value and shows the right ones.
//!
//! Constraints mention chip numbers (`am_bytes`, ...) of the slice a task
//! runs on, which a worker knows and the leader does not: the leader
//! checks names and values, the worker the constraints too.

use std::path::Path;

use mtswarm_hw::ChipSpec;
use mtswarm_hw::tune::{Config, Param, ParamValue, TuneError, TuneSpace};
use mtswarm_policy::plan::{TaskPlan, define_texts};
use serde_json::{Map, Value, json};

/// Example candidates the prompt shows at most.
const EXAMPLES: usize = 3;

/// Values of a parameter listed in full; longer lists show their ends.
const VALUES_SHOWN: usize = 12;

/// The kernel's tuning space, read from `kernel_dir/tune.toml`.
pub(crate) fn load(kernel_dir: &Path) -> Result<TuneSpace, TuneError> {
    TuneSpace::load(&kernel_dir.join("tune.toml"))
}

/// The space for the system prompt: parameters, constraints, sizes, the
/// default and an `assign_task` example over allowed configurations
/// (allowed on the MT-3000's default chip numbers).
pub(crate) fn describe(space: &TuneSpace, kernel_dir: &str) -> String {
    let allowed = space.configurations(&ChipSpec::default()).ok();
    let mut text = format!(
        "Tuning space of {kernel_dir} (its tune.toml; no need to read it): {} parameter(s), {} combination(s){}. \
A candidate maps parameter names to values; use exactly these names and values:\n",
        space.params.len(),
        space.cartesian_size(),
        allowed
            .as_ref()
            .map(|a| format!(", {} allowed by the constraints", a.len()))
            .unwrap_or_default(),
    );
    for param in &space.params {
        text.push_str(&format!("- {}\n", describe_param(param)));
    }
    if !space.constraints.is_empty() {
        text.push_str(&format!(
            "Constraints (the worker checks them): {}.\n",
            space.constraints.join("; ")
        ));
    }
    if !space.sizes.is_empty() {
        let sizes: Vec<String> = space
            .sizes
            .iter()
            .map(|(name, value)| format!("{name} = {value}"))
            .collect();
        text.push_str(&format!(
            "Fixed problem sizes (not parameters): {}.\n",
            sizes.join(", ")
        ));
    }
    text.push_str(&format!(
        "Default configuration: {}.\n",
        config_json(&space.default_config())
    ));
    let examples = examples(space, allowed.as_deref());
    text.push_str(&format!(
        "Example assign_task parameters: {}\n",
        json!({"candidates": examples, "search_budget": examples.len()})
    ));
    text
}

/// `NAME: a, b or c (default b); description`.
fn describe_param(param: &Param) -> String {
    let values: Vec<String> = param.values.iter().map(ToString::to_string).collect();
    let listed = if values.len() <= VALUES_SHOWN {
        match values.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => values.join(""),
        }
    } else {
        format!(
            "{}, ... {} ({} values)",
            values[..3].join(", "),
            values[values.len() - 3..].join(", "),
            values.len()
        )
    };
    let mut line = format!("{}: {listed} (default {})", param.name, param.default);
    if let Some(description) = param.description.as_deref().map(str::trim)
        && !description.is_empty()
    {
        line.push_str(&format!("; {description}"));
    }
    line
}

/// A configuration as the JSON object a plan carries (numbers as numbers).
fn config_json(config: &Config) -> Value {
    let map: Map<String, Value> = config
        .iter()
        .map(|(name, value)| (name.clone(), value_json(value)))
        .collect();
    Value::Object(map)
}

fn value_json(value: &ParamValue) -> Value {
    match value {
        ParamValue::Int(i) => json!(i),
        ParamValue::Float(x) => json!(x),
        ParamValue::Str(s) => json!(s),
    }
}

/// Up to [`EXAMPLES`] allowed configurations spread over the allowed list,
/// the default first when it is allowed; the default alone when the
/// constraints could not be evaluated.
fn examples(space: &TuneSpace, allowed: Option<&[Config]>) -> Vec<Value> {
    let default = space.default_config();
    let Some(allowed) = allowed.filter(|a| !a.is_empty()) else {
        return vec![config_json(&default)];
    };
    let mut picked: Vec<&Config> = Vec::new();
    if allowed.contains(&default) {
        picked.push(&default);
    }
    let stride = (allowed.len() / EXAMPLES).max(1);
    for config in allowed.iter().step_by(stride) {
        if picked.len() >= EXAMPLES.min(allowed.len()) {
            break;
        }
        if !picked.contains(&config) {
            picked.push(config);
        }
    }
    picked.into_iter().map(config_json).collect()
}

/// Refuses a plan whose candidates name a parameter the space does not
/// have or a value outside a parameter's values, saying which and what
/// the space holds. Constraints are left to the worker (see the module docs).
pub(crate) fn check_plan(space: &TuneSpace, plan: &TaskPlan) -> Result<(), String> {
    if plan.unchecked_defines == Some(true) {
        return Ok(());
    }
    let named = plan.params.iter().map(|c| ("params".to_string(), c)).chain(
        plan.candidates
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, c)| (format!("candidates[{i}]"), c)),
    );
    for (path, candidate) in named {
        if let Err(TuneError::Config(problem)) =
            space.check_defines(&define_texts(candidate), &ChipSpec::default())
        {
            let names: Vec<String> = space.params.iter().map(describe_param).collect();
            let example = examples(space, None);
            return Err(format!(
                "{path}: {problem}. Nothing was assigned: call assign_task again with candidates over \
{}'s parameters, {}; e.g. parameters {}",
                space.kernel,
                names.join("; "),
                json!({"candidates": example, "search_budget": example.len()}),
            ));
        }
    }
    Ok(())
}

/// Parameters a model wrote as one candidate at the top level
/// (`{"CHUNK": 1024, "BUF": 2}`) moved into the plan's `params`, when the
/// object has neither `candidates` nor `params` and each of those keys is
/// a parameter of the space.
pub(crate) fn lift_bare_candidate(space: &TuneSpace, parameters: &mut Map<String, Value>) {
    if parameters.contains_key("candidates") || parameters.contains_key("params") {
        return;
    }
    let is_param = |key: &String| space.params.iter().any(|p| &p.name == key);
    if !parameters.keys().any(is_param) {
        return;
    }
    let candidate: Map<String, Value> = parameters
        .iter()
        .filter(|(key, _)| is_param(key))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    parameters.retain(|key, _| !is_param(key));
    parameters.insert("params".into(), Value::Object(candidate));
}

#[cfg(test)]
mod tests {
    use super::*;

    const VECADD: &str = r#"
kernel = "vecadd"
constraints = ["CHUNK % vector_lanes == 0", "2 * BUF * CHUNK * 8 <= am_bytes"]

[sizes]
N = 1048576

[[param]]
name = "CHUNK"
values = [256, 1024, 2048, 8192, 16384]
default = 2048
description = "doubles per DMA transfer"

[[param]]
name = "BUF"
values = [1, 2]
default = 2
"#;

    fn space() -> TuneSpace {
        TuneSpace::from_toml_str(VECADD).expect("a valid space")
    }

    fn plan(value: Value) -> TaskPlan {
        TaskPlan::from_value(&value).expect("a plan")
    }

    #[test]
    fn the_description_names_every_parameter_with_its_values_and_a_usable_example() {
        let text = describe(&space(), "vecadd");
        for wanted in [
            "CHUNK: 256, 1024, 2048, 8192 or 16384 (default 2048); doubles per DMA transfer",
            "BUF: 1 or 2 (default 2)",
            "2 * BUF * CHUNK * 8 <= am_bytes",
            "N = 1048576",
            r#"Default configuration: {"BUF":2,"CHUNK":2048}"#,
        ] {
            assert!(text.contains(wanted), "missing {wanted:?} in:\n{text}");
        }
        let example = text
            .lines()
            .find_map(|l| l.strip_prefix("Example assign_task parameters: "))
            .expect("an example line");
        let example: Value = serde_json::from_str(example).expect("the example is JSON");
        let example = plan(example);
        assert_eq!(example.candidates.as_ref().map(Vec::len), Some(3));
        check_plan(&space(), &example).expect("the example passes the check");
    }

    #[test]
    fn a_candidate_with_a_name_the_kernel_lacks_is_refused_with_the_right_names() {
        let refused = check_plan(
            &space(),
            &plan(json!({"candidates": [{"CHUNK": 1024, "BUF": 2}, {"MB": 64}]})),
        )
        .expect_err("MB is not a vecadd parameter");
        assert!(refused.starts_with("candidates[1]: "), "{refused}");
        assert!(refused.contains("-D MB"), "{refused}");
        assert!(refused.contains("call assign_task again"), "{refused}");
        assert!(refused.contains("CHUNK: 256, 1024"), "{refused}");
        let refused = check_plan(&space(), &plan(json!({"params": {"CHUNK": 1000}})))
            .expect_err("1000 is not a value of CHUNK");
        assert!(
            refused.starts_with("params: ") && refused.contains("CHUNK=1000"),
            "{refused}"
        );
        check_plan(
            &space(),
            &plan(json!({"params": {"MB": 1}, "unchecked_defines": true})),
        )
        .expect("unchecked plans pass");
    }

    #[test]
    fn a_candidate_written_at_the_top_level_becomes_the_plans_params() {
        let mut parameters = json!({"CHUNK": 1024, "BUF": 2, "cores": 2})
            .as_object()
            .cloned()
            .expect("an object");
        lift_bare_candidate(&space(), &mut parameters);
        assert_eq!(
            Value::Object(parameters),
            json!({"params": {"CHUNK": 1024, "BUF": 2}, "cores": 2})
        );
        let mut untouched = json!({"candidates": [], "CHUNK": 1})
            .as_object()
            .cloned()
            .expect("an object");
        let before = untouched.clone();
        lift_bare_candidate(&space(), &mut untouched);
        assert_eq!(untouched, before);
    }
}
