//! What a job's other agents have measured and are measuring: the one
//! message that makes the agents of a job one search instead of several.
//!
//! Each agent of a job searches its own part of the space, but every one of
//! them fits its model to every agent's results: it asks the
//! `job_observations` tool at each screening step, and the reply carries
//! the figures the others have measured, the configurations that failed
//! and the ones still being measured (the pending points of asynchronous
//! batch Bayesian optimization: the agent's model counts them at their
//! predicted time, so two agents do not both spend a round on one region).
//!
//! The reply is text a model can read (a head line, then one line per
//! configuration), and [`Observations::parse`] reads it back exactly:
//! `measured <seconds> s <defines as JSON>`, `failed <defines>`,
//! `running <defines>`. The tool that writes it lives with the results it
//! reads (the worker daemon's results store; the replay's recorded
//! landscape); this module is the format both ends share.
//!
//! What an observation can change: only which candidate an agent of the
//! same job screens next. A figure is never taken from it: the best of a
//! job is what its own tasks measured and recorded.

use std::collections::BTreeMap;

/// The tool's name.
pub const OBSERVATIONS_TOOL: &str = "job_observations";

/// Configurations reported per kind at most: a reply stays small however
/// long the job, and the model's fit stays cheap (the best ones are kept).
pub const MAX_OBSERVATIONS: usize = 400;

/// A configuration's `-D` values, as text.
pub type Defines = BTreeMap<String, String>;

/// The other agents' results and pending points.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observations {
    /// Measured configurations and their time in seconds.
    pub measured: Vec<(Defines, f64)>,
    /// Configurations that failed to build, validate or run.
    pub failed: Vec<Defines>,
    /// Configurations being measured now.
    pub running: Vec<Defines>,
}

impl Observations {
    /// Whether there is nothing to report.
    pub fn is_empty(&self) -> bool {
        self.measured.is_empty() && self.failed.is_empty() && self.running.is_empty()
    }

    /// The reply text: a head line, then one line per configuration (the
    /// fastest measured first; each kind cut to [`MAX_OBSERVATIONS`]).
    pub fn render(&self) -> String {
        let mut measured: Vec<&(Defines, f64)> = self
            .measured
            .iter()
            .filter(|(_, s)| s.is_finite() && *s > 0.0)
            .collect();
        measured.sort_by(|a, b| a.1.total_cmp(&b.1));
        measured.truncate(MAX_OBSERVATIONS);
        let failed = &self.failed[..self.failed.len().min(MAX_OBSERVATIONS)];
        let running = &self.running[..self.running.len().min(MAX_OBSERVATIONS)];
        let mut text = format!(
            "observations of the job's other agents: {} measured, {} failed, {} running",
            measured.len(),
            failed.len(),
            running.len()
        );
        for (defines, seconds) in measured {
            text.push_str(&format!("\nmeasured {seconds:.6e} s {}", json(defines)));
        }
        for defines in failed {
            text.push_str(&format!("\nfailed {}", json(defines)));
        }
        for defines in running {
            text.push_str(&format!("\nrunning {}", json(defines)));
        }
        text
    }

    /// Reads a reply written by [`Observations::render`]; `None` for any
    /// other text (an error from the tool, a tool that is not there). A
    /// line that does not read is skipped.
    pub fn parse(content: &str) -> Option<Self> {
        let mut lines = content.lines();
        if !lines
            .next()?
            .starts_with("observations of the job's other agents:")
        {
            return None;
        }
        let mut observations = Self::default();
        for line in lines {
            let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
            match kind {
                "measured" => {
                    let Some((seconds, defines)) = rest.split_once(" s ") else {
                        continue;
                    };
                    if let (Ok(seconds), Some(defines)) = (seconds.parse::<f64>(), read(defines))
                        && seconds.is_finite()
                        && seconds > 0.0
                    {
                        observations.measured.push((defines, seconds));
                    }
                }
                "failed" => observations.failed.extend(read(rest)),
                "running" => observations.running.extend(read(rest)),
                _ => {}
            }
        }
        Some(observations)
    }
}

fn json(defines: &Defines) -> String {
    serde_json::to_string(defines).unwrap_or_else(|_| "{}".to_owned())
}

fn read(text: &str) -> Option<Defines> {
    serde_json::from_str(text.trim()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defines(mb: &str) -> Defines {
        [("MB".to_owned(), mb.to_owned())].into()
    }

    #[test]
    fn a_rendered_reply_reads_back_fastest_first() {
        let observations = Observations {
            measured: vec![(defines("64"), 2.5e-3), (defines("32"), 1.25e-3)],
            failed: vec![defines("512")],
            running: vec![defines("128"), defines("16")],
        };
        let text = observations.render();
        assert!(
            text.starts_with(
                "observations of the job's other agents: 2 measured, 1 failed, 2 running"
            ),
            "{text}"
        );
        let read = Observations::parse(&text).expect("reads");
        assert_eq!(
            read.measured,
            vec![(defines("32"), 1.25e-3), (defines("64"), 2.5e-3)]
        );
        assert_eq!(read.failed, observations.failed);
        assert_eq!(read.running, observations.running);
    }

    #[test]
    fn another_text_is_no_observation_and_a_bad_line_is_skipped() {
        assert_eq!(Observations::parse("error: unknown tool"), None);
        let text = "observations of the job's other agents: 2 measured, 0 failed, 0 running\n\
                    measured NaN s {\"MB\":\"8\"}\nmeasured 1e-3 s {not json}\n\
                    measured 2e-3 s {\"MB\":\"8\"}";
        let read = Observations::parse(text).expect("reads");
        assert_eq!(read.measured, vec![(defines("8"), 2e-3)]);
    }
}
