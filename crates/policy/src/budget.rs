//! How many configurations of a tuning space a search evaluates when the
//! job does not say: the one rule the leader (a job's total) and the
//! worker (a task given candidates without a budget) both follow.

/// Share of a space a search evaluates by default: the search exists to
/// find the best of a large space from a small part of it.
pub const SEARCH_SHARE: f64 = 0.1;

/// Evaluations a default budget always allows: a small space is searched
/// whole, a mid-sized one gets enough points for the search's model to
/// learn the space's shape.
pub const MIN_SEARCH_EVALUATIONS: usize = 32;

/// Evaluations below which an agent's search cannot learn its part of a
/// space: a search spread thinner than this runs on fewer agents.
pub const MIN_AGENT_EVALUATIONS: usize = 8;

/// Agents worth giving a search of `budget` evaluations over
/// `configurations`, with `available` slices: one per slice (up to one per
/// configuration) when the whole space is evaluated anyway, else no more
/// than leaves each agent [`MIN_AGENT_EVALUATIONS`] (at least one). Agents
/// searching their parts apart share nothing, so eight agents with four
/// evaluations each find less than four with eight.
pub fn search_agents(budget: usize, configurations: usize, available: usize) -> usize {
    if budget >= configurations {
        return available.min(configurations.max(1));
    }
    available.min((budget / MIN_AGENT_EVALUATIONS).max(1))
}

/// The default search budget for `configurations` candidates: a tenth of
/// them (rounded down), at least [`MIN_SEARCH_EVALUATIONS`], never more
/// than all.
pub fn search_budget(configurations: usize) -> usize {
    let share = (configurations as f64 * SEARCH_SHARE).floor() as usize;
    share.max(MIN_SEARCH_EVALUATIONS).min(configurations)
}

/// Split a job's evaluation budget over `parts` of the given sizes: as even
/// as the total allows (the first parts get one more), at least one each,
/// never more than a part's size.
pub fn split_budget(total: usize, sizes: &[usize]) -> Vec<usize> {
    let parts = sizes.iter().filter(|s| **s > 0).count().max(1);
    let (each, extra) = (total / parts, total % parts);
    let mut given = 0;
    sizes
        .iter()
        .map(|&size| {
            if size == 0 {
                return 0;
            }
            let share = each + usize::from(given < extra);
            given += 1;
            share.clamp(1, size)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_budget_is_a_tenth_with_a_floor_and_a_ceiling() {
        assert_eq!(search_budget(2205), 220);
        assert_eq!(search_budget(112), 32);
        assert_eq!(search_budget(6), 6);
        assert_eq!(search_budget(0), 0);
    }

    #[test]
    fn a_thin_search_runs_on_fewer_agents() {
        assert_eq!(search_agents(220, 2205, 8), 8);
        assert_eq!(search_agents(32, 112, 8), 4);
        assert_eq!(search_agents(3, 100, 8), 1);
        // The whole space is evaluated: every slice helps, up to one
        // configuration each.
        assert_eq!(search_agents(6, 6, 3), 3);
        assert_eq!(search_agents(3, 3, 8), 3);
    }

    #[test]
    fn a_budget_is_split_evenly_with_at_least_one_per_part() {
        assert_eq!(
            split_budget(220, &[276; 8]),
            vec![28, 28, 28, 28, 27, 27, 27, 27]
        );
        assert_eq!(split_budget(3, &[10, 10, 10, 10]), vec![1, 1, 1, 1]);
        assert_eq!(split_budget(100, &[5, 0, 50]), vec![5, 0, 50]);
    }
}
