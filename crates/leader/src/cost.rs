//! Tokens and their estimated cost per agent and per job, for the job's
//! outcome: each agent's tokens are those of its tasks' accepted results
//! (the worker names the model that produced them), the leader's those of
//! its own loop; the price table ([`crate::prices`]) turns them into money
//! where it knows the model.

use std::collections::BTreeMap;

use mtswarm_bus::v1;

use crate::ids::LEADER_AGENT_ID;
use crate::prices::PriceTable;
use crate::results::TaskView;

/// The cost entries of a job: one per agent and model (the leader first,
/// then agents by id), and their total.
pub(crate) fn job_costs(
    tasks: &[TaskView],
    leader: &v1::Usage,
    prices: &PriceTable,
) -> (Vec<v1::TokenCost>, v1::TokenCost) {
    let mut by_agent: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    for task in tasks {
        let Some(usage) = task.result.as_ref().and_then(|r| r.usage.as_ref()) else {
            continue;
        };
        let entry = by_agent
            .entry((task.agent_id.clone(), usage.model.clone()))
            .or_default();
        entry.0 = entry.0.saturating_add(usage.prompt_tokens);
        entry.1 = entry.1.saturating_add(usage.completion_tokens);
    }
    let mut costs = vec![entry(
        LEADER_AGENT_ID,
        &leader.model,
        leader.prompt_tokens,
        leader.completion_tokens,
        prices,
    )];
    costs.extend(
        by_agent
            .into_iter()
            .map(|((agent, model), (prompt, completion))| {
                entry(&agent, &model, prompt, completion, prices)
            }),
    );
    let mut total = v1::TokenCost {
        priced: true,
        currency: prices.currency.clone(),
        ..Default::default()
    };
    let models: std::collections::BTreeSet<&str> = costs.iter().map(|c| c.model.as_str()).collect();
    if models.len() == 1 {
        total.model = costs[0].model.clone();
    }
    for cost in &costs {
        total.prompt_tokens = total.prompt_tokens.saturating_add(cost.prompt_tokens);
        total.completion_tokens = total
            .completion_tokens
            .saturating_add(cost.completion_tokens);
        total.estimated_cost += cost.estimated_cost;
        total.priced &= cost.priced;
    }
    (costs, total)
}

/// One agent's entry: tokens without any are trivially priced (they cost
/// nothing, whatever the model).
fn entry(
    agent: &str,
    model: &str,
    prompt: u64,
    completion: u64,
    prices: &PriceTable,
) -> v1::TokenCost {
    let cost = prices.cost(model, prompt, completion);
    let free = prompt == 0 && completion == 0;
    v1::TokenCost {
        agent_id: agent.to_string(),
        model: model.to_string(),
        prompt_tokens: prompt,
        completion_tokens: completion,
        estimated_cost: cost.unwrap_or(0.0),
        priced: cost.is_some() || free,
        currency: prices.currency.clone(),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn task(agent: &str, model: &str, prompt: u64, completion: u64) -> TaskView {
        TaskView {
            task_id: format!("t-{agent}-{prompt}"),
            agent_id: agent.to_string(),
            attempt: 1,
            result: Some(v1::TaskResult {
                usage: Some(v1::Usage {
                    prompt_tokens: prompt,
                    completion_tokens: completion,
                    model: model.to_string(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            delivered: false,
        }
    }

    #[test]
    fn each_agent_pays_for_its_tokens_at_its_models_price() {
        let prices = PriceTable::parse(
            "currency = \"EUR\"\n[prices.big]\nprompt_per_million = 2.0\ncompletion_per_million = 8.0\n",
            Path::new("p.toml"),
        )
        .expect("table");
        let tasks = [
            task("a1", "big", 1_000_000, 100_000),
            task("a1", "big", 500_000, 0),
            task("a2", "small", 10, 10),
            TaskView {
                result: None,
                ..task("a3", "big", 0, 0)
            },
        ];
        let leader = v1::Usage {
            prompt_tokens: 250_000,
            completion_tokens: 1_000,
            model: "big".into(),
            ..Default::default()
        };
        let (costs, total) = job_costs(&tasks, &leader, &prices);
        let ids: Vec<&str> = costs.iter().map(|c| c.agent_id.as_str()).collect();
        assert_eq!(ids, ["leader", "a1", "a2"]);
        assert_eq!(costs[1].prompt_tokens, 1_500_000);
        assert!((costs[1].estimated_cost - (3.0 + 0.8)).abs() < 1e-9);
        assert!((costs[0].estimated_cost - (0.5 + 0.008)).abs() < 1e-9);
        assert!(!costs[2].priced, "no price for `small`");
        assert_eq!(costs[2].estimated_cost, 0.0);
        assert_eq!(total.prompt_tokens, 1_750_010);
        assert_eq!(total.completion_tokens, 101_010);
        assert!((total.estimated_cost - 4.308).abs() < 1e-9);
        assert!(!total.priced, "a2's tokens are left out of the cost");
        assert_eq!(total.currency, "EUR");
        assert!(total.model.is_empty(), "several models");
    }
}
