//! The leader loop's prompt: the system prompt (tools, the fleet as it is
//! now, the job, its tuning space and the work plan) and the task message (the goal, the
//! attached files and the machine-readable `job_spec:` line the builtin
//! policy reads).

use mtswarm_bus::v1;
use mtswarm_policy::plan::JobLine;

use crate::job::JobContext;
use crate::placement::Placement;
use crate::validate::Attachment;

pub(crate) async fn system_prompt(placement: &Placement, context: &JobContext) -> String {
    let spec = &context.spec;
    let selector = if spec.slice_selector.is_empty() {
        "*"
    } else {
        &spec.slice_selector
    };
    let parsed = crate::fleet::parse_selector(&spec.slice_selector)
        .ok()
        .flatten();
    let fleet = match placement.fleet_view(parsed.as_ref()).await {
        Ok(view) => {
            let free = view
                .slices
                .iter()
                .filter(|s| s.state() == v1::SliceState::Free)
                .count();
            format!(
                "{} worker daemon(s); {} slice(s) match the job's selector, {free} of them free right now",
                view.workers.len(),
                view.slices.len()
            )
        }
        Err(error) => format!("unknown (the fleet could not be read: {error})"),
    };
    let space = match crate::space::load(&context.kernel_dir) {
        Ok(space) => crate::space::describe(&space, &spec.kernel_dir),
        Err(error) => format!(
            "Tuning space: the kernel's tune.toml is not readable ({error}); read_file(\"tune.toml\") shows it.\n"
        ),
    };
    format!(
        "You are the leader of an mtswarm tuning job: you tune a compute kernel for MT-3000 boards \
by directing worker agents, each running on one slice of hardware. You act through tool calls; \
only your final answer is plain text.\n\n\
Tools:\n\
- list_fleet(selector?): slices matching a selector with their state (free/leased/quarantined).\n\
- spawn_agent(selector?, role?, instructions?, name?): start a worker agent on a free matching slice; \
`name` becomes its agent id.\n\
- assign_task(agent, instructions, parameters): give an agent a task. parameters is the task plan \
{{\"candidates\": [candidate, ...], \"search_budget\": n}} (a candidate maps the tuning space's parameters \
to values, passed as -D defines; search_budget: candidates the agent screens at most, its share of the job \
line's search_budget).\n\
- collect_result(agents? | tasks?, mode any|all, timeout_seconds): wait for task results.\n\
- cancel_agent(agent, reason?): stop an agent.\n\
- read_file(path): read a file of the kernel directory (kernel.c, tune.toml).\n\
- job_status(): the job's agents and tasks.\n\n\
Fleet: {fleet}.\n\
Job: kernel directory {kernel}, slice selector {selector}, agents requested: {agents}.\n\n\
{space}\n\
Work plan: 1. spawn_agent once per agent (on free slices); 2. assign_task to each agent, splitting the \
candidates among them; 3. collect_result with mode \"all\" until every task has reported; 4. answer. \
Your final answer starts with a one-line summary and \
ends with a ```json block: {{\"best\": {{\"params\": {{...}}, \"gflops\": n, \"peak_fraction\": n, \
\"agent\": id, \"slice\": id}}, \"results\": [...]}} (or {{\"best\": null, \"error\": \"why\"}} when nothing worked).",
        kernel = spec.kernel_dir,
        agents = if spec.num_agents == 0 {
            "leader decides".to_string()
        } else {
            spec.num_agents.to_string()
        },
    )
}

/// The task message: the goal, the attached files, and a machine-readable
/// `job_spec:` line (last line) the builtin policy reads.
pub(crate) fn user_input(
    default_collect_timeout: std::time::Duration,
    context: &JobContext,
    attachments: &[Attachment],
) -> String {
    let spec = &context.spec;
    let mut text = spec.goal.trim().to_string();
    for attachment in attachments {
        text.push_str(&format!(
            "\n\n--- @{} ---\n{}\n--- end of @{} ---",
            attachment.path, attachment.content, attachment.path
        ));
    }
    let collect_timeout = spec
        .budgets
        .map(|b| b.wall_time_seconds)
        .filter(|s| *s > 0)
        .unwrap_or(default_collect_timeout.as_secs());
    let line = JobLine {
        job_id: context.job_id.clone(),
        kernel_dir: spec.kernel_dir.clone(),
        slice_selector: spec.slice_selector.clone(),
        num_agents: spec.num_agents,
        collect_timeout_seconds: collect_timeout,
        search_budget: spec.budgets.map(|b| b.max_evaluations).unwrap_or(0),
    };
    // A small model answers at once unless told where to start.
    text.push_str("\n\nBegin with step 1 of the work plan: call spawn_agent.\n\n");
    text.push_str(&line.render());
    text
}
