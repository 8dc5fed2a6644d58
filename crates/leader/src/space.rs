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

/// The kernel's tuning space, read from the tune.toml of `kernel_dir`.
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
    spread(space, allowed, EXAMPLES, &[])
}

/// Up to `count` allowed configurations none of `taken`: the default
/// first, then configurations spread evenly over the allowed list, then
/// the rest in order. The default alone when the constraints could not be
/// evaluated (and it is not taken).
fn spread(
    space: &TuneSpace,
    allowed: Option<&[Config]>,
    count: usize,
    taken: &[Value],
) -> Vec<Value> {
    let default = config_json(&space.default_config());
    let Some(allowed) = allowed.filter(|a| !a.is_empty()) else {
        return if taken.contains(&default) {
            Vec::new()
        } else {
            vec![default]
        };
    };
    let stride = (allowed.len() / count.max(1)).max(1);
    let mut picked: Vec<Value> = Vec::new();
    let spread_first = allowed.iter().step_by(stride).chain(allowed.iter());
    let in_order = std::iter::once(default.clone())
        .filter(|d| allowed.iter().any(|c| config_json(c) == *d))
        .chain(spread_first.map(config_json));
    for config in in_order {
        if picked.len() >= count {
            break;
        }
        if !picked.contains(&config) && !taken.contains(&config) {
            picked.push(config);
        }
    }
    picked
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

/// The arguments of an `assign_task` call as a small model writes them,
/// put in shape before the schema check: `name` for a missing `agent`;
/// `spawn_agent`'s arguments and the fields of earlier tool results
/// (`role`, `selector`, `slice_id`, `session_id`, ...), which it copies
/// from the step before, dropped; a plan's fields (`candidates`,
/// `search_budget`, ...) and the space's parameters written beside
/// `parameters` moved into it.
pub(crate) fn shape_assign_args(space: Option<&TuneSpace>, args: &mut Map<String, Value>) {
    if !args.contains_key("agent")
        && let Some(name) = args.remove("name")
    {
        args.insert("agent".into(), name);
    }
    for copied in [
        "name",
        "role",
        "selector",
        "slice_id",
        "session_id",
        "worker_id",
        "note",
        "next",
        "task_id",
        "attempt",
    ] {
        args.remove(copied);
    }
    let plan_fields = ["candidates", "params", "search_budget", "strategy", "cores"];
    let is_param = |key: &str| space.is_some_and(|s| s.params.iter().any(|p| p.name == key));
    let moved: Vec<String> = args
        .keys()
        .filter(|key| plan_fields.contains(&key.as_str()) || is_param(key))
        .cloned()
        .collect();
    if moved.is_empty() {
        return;
    }
    let mut parameters = match args.remove("parameters") {
        Some(Value::Object(map)) => map,
        _ => Map::new(),
    };
    for key in moved {
        if let Some(value) = args.remove(&key) {
            parameters.entry(key).or_insert(value);
        }
    }
    args.insert("parameters".into(), Value::Object(parameters));
}

/// Where an agent sits among its job's agents (by agent id): which part
/// of the spread its defaulted candidates are. Two agents assigned in one
/// reply run at once and cannot see each other's tasks; their seats keep
/// their candidates apart.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seat {
    pub(crate) index: usize,
    pub(crate) of: usize,
}

/// Whether a plan says what to run (candidates, or a noop or source-edit
/// task): then nothing is defaulted.
pub(crate) fn names_candidates(parameters: &Map<String, Value>) -> bool {
    ["candidates", "params", "noop", "source_diff"]
        .iter()
        .any(|key| parameters.contains_key(*key))
}

/// The plan of a call that gives no candidate at all: the agent's part
/// (`seat`) of allowed configurations spread over the space, screened in
/// full, as many as the prompt's examples or `share` (an agent's share of
/// the job's evaluation budget: a job of one evaluation measures one
/// candidate, not three). A part the job's tasks were given already
/// (`taken`: a second task of the agent) gives way to configurations no
/// task has; when every one is taken, the examples again.
pub(crate) fn default_candidates(
    space: &TuneSpace,
    share: Option<usize>,
    seat: Seat,
    taken: &[Value],
    parameters: &mut Map<String, Value>,
) -> bool {
    if names_candidates(parameters) {
        return false;
    }
    let allowed = space.configurations(&ChipSpec::default()).ok();
    let count = share.unwrap_or(EXAMPLES).max(1);
    let pool = spread(space, allowed.as_deref(), count * seat.of.max(1), &[]);
    let mut picked: Vec<Value> = pool
        .chunks(count)
        .nth(seat.index)
        .map(<[Value]>::to_vec)
        .unwrap_or_default();
    picked.retain(|candidate| !taken.contains(candidate));
    if picked.is_empty() {
        picked = spread(space, allowed.as_deref(), count, taken);
    }
    if picked.is_empty() {
        picked = spread(space, allowed.as_deref(), count, &[]);
    }
    parameters
        .entry("search_budget")
        .or_insert(json!(picked.len()));
    parameters.insert("candidates".into(), Value::Array(picked));
    true
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
    fn assign_arguments_copied_from_a_spawn_are_put_in_shape() {
        let mut args = json!({
            "name": "a1", "role": "tuner", "selector": "", "slice_id": "1",
            "instructions": "go", "CHUNK": 1024, "search_budget": 1,
        })
        .as_object()
        .cloned()
        .expect("an object");
        shape_assign_args(Some(&space()), &mut args);
        assert_eq!(
            Value::Object(args),
            json!({"agent": "a1", "instructions": "go",
                   "parameters": {"CHUNK": 1024, "search_budget": 1}})
        );
        let mut named = json!({"agent": "a2", "name": "other"})
            .as_object()
            .cloned()
            .expect("an object");
        shape_assign_args(None, &mut named);
        assert_eq!(Value::Object(named), json!({"agent": "a2"}));
    }

    #[test]
    fn a_plan_without_candidates_gets_the_examples_and_one_with_them_is_left_alone() {
        let mut empty = Map::new();
        assert!(default_candidates(&space(), None, ALONE, &[], &mut empty));
        let plan = plan(Value::Object(empty));
        assert_eq!(plan.candidates.as_ref().map(Vec::len), Some(3));
        assert_eq!(plan.search_budget, Some(3));
        check_plan(&space(), &plan).expect("the defaults are in the space");
        let mut given = json!({"params": {"CHUNK": 256}})
            .as_object()
            .cloned()
            .expect("an object");
        assert!(!default_candidates(&space(), None, ALONE, &[], &mut given));
        assert_eq!(Value::Object(given), json!({"params": {"CHUNK": 256}}));
    }

    #[test]
    fn defaulted_candidates_stay_within_the_agents_share_of_the_budget() {
        let mut one = Map::new();
        assert!(default_candidates(&space(), Some(1), ALONE, &[], &mut one));
        let one = plan(Value::Object(one));
        assert_eq!(one.candidates.as_ref().map(Vec::len), Some(1));
        assert_eq!(one.search_budget, Some(1));
        let mut none_left = Map::new();
        assert!(default_candidates(
            &space(),
            Some(0),
            ALONE,
            &[],
            &mut none_left
        ));
        assert_eq!(
            plan(Value::Object(none_left))
                .candidates
                .as_ref()
                .map(Vec::len),
            Some(1),
            "a task measures at least one candidate"
        );
    }

    #[test]
    fn a_second_agents_defaulted_candidates_are_not_the_firsts() {
        let mut first = Map::new();
        assert!(default_candidates(
            &space(),
            Some(2),
            ALONE,
            &[],
            &mut first
        ));
        let taken = plan_candidates(&first);
        let mut second = Map::new();
        assert!(default_candidates(
            &space(),
            Some(2),
            ALONE,
            &taken,
            &mut second
        ));
        let others = plan_candidates(&second);
        assert_eq!((taken.len(), others.len()), (2, 2));
        assert!(
            others.iter().all(|c| !taken.contains(c)),
            "{taken:?} and {others:?} overlap"
        );
        check_plan(&space(), &plan(Value::Object(second))).expect("in the space");
        let everything: Vec<Value> = space()
            .configurations(&ChipSpec::default())
            .expect("allowed")
            .iter()
            .map(config_json)
            .collect();
        let mut again = Map::new();
        assert!(default_candidates(
            &space(),
            Some(2),
            ALONE,
            &everything,
            &mut again
        ));
        assert_eq!(
            plan_candidates(&again).len(),
            2,
            "with every configuration taken, the examples again"
        );
    }

    const ALONE: Seat = Seat { index: 0, of: 1 };

    #[test]
    fn two_agents_assigned_at_once_get_different_candidates() {
        let seat = |index| Seat { index, of: 2 };
        let mut first = Map::new();
        assert!(default_candidates(
            &space(),
            Some(2),
            seat(0),
            &[],
            &mut first
        ));
        let mut second = Map::new();
        assert!(default_candidates(
            &space(),
            Some(2),
            seat(1),
            &[],
            &mut second
        ));
        let (first, second) = (plan_candidates(&first), plan_candidates(&second));
        assert_eq!((first.len(), second.len()), (2, 2));
        assert!(
            second.iter().all(|c| !first.contains(c)),
            "{first:?} and {second:?} overlap"
        );
    }

    fn plan_candidates(parameters: &Map<String, Value>) -> Vec<Value> {
        parameters["candidates"]
            .as_array()
            .cloned()
            .unwrap_or_default()
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
