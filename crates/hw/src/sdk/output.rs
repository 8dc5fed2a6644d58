//! Reading a real board's harness output: `MTSWARM_RESULT` lines, one per
//! kernel execution, and the harness's own `MTSWARM_TIME` lines (a board
//! prints no emulator lines, see the [`super`] docs).

use std::time::Duration;

use serde::Deserialize;

use crate::board::{Counters, RunSample};
use crate::harness_line::{HarnessLine, ResultLine};

#[derive(Debug, Deserialize)]
struct HarnessTime {
    seconds: f64,
}

/// Parse the harness's `MTSWARM_RESULT` / `MTSWARM_TIME` lines into samples.
/// `wall` is charged to executions that report no time.
pub fn parse_harness_output(stdout: &str, wall: Duration) -> Vec<RunSample> {
    let mut results: Vec<ResultLine> = Vec::new();
    let mut times: Vec<f64> = Vec::new();
    for line in stdout.lines() {
        match HarnessLine::of(line) {
            Some(HarnessLine::Result(json)) => results.push(ResultLine::parse(json)),
            Some(HarnessLine::Time(json)) => {
                if let Ok(t) = serde_json::from_str::<HarnessTime>(json) {
                    times.push(t.seconds);
                }
            }
            _ => {}
        }
    }
    let fallback = if results.is_empty() {
        0.0
    } else {
        wall.as_secs_f64() / results.len() as f64
    };
    results
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let reported = times.get(i).copied().or(r.seconds);
            // The harness is the kernel's: a time that is no duration makes
            // the execution invalid rather than its rate negative or infinite.
            let bad_time = reported.filter(|t| !(t.is_finite() && *t >= 0.0));
            let seconds = reported.filter(|_| bad_time.is_none()).unwrap_or(fallback);
            let error = match bad_time {
                Some(t) => Some(format!("the harness timed the execution at {t} seconds")),
                None => r.error.filter(|e| !e.is_empty()),
            };
            let valid = r.valid && error.is_none();
            let claimed = r
                .flops
                .filter(|f| f.is_finite() && *f > 0.0)
                .map(|f| f as u64)
                .unwrap_or(0);
            RunSample {
                valid,
                error: if valid {
                    None
                } else {
                    error.or(Some("output differs from the reference".into()))
                },
                modeled_cycles: None,
                seconds,
                max_abs_err: r.max_abs_err,
                counters: Counters {
                    flops: claimed,
                    ..Counters::default()
                },
                seed: r.seed,
                useful_flops: claimed,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_that_is_no_duration_makes_the_execution_invalid() {
        let stdout = "MTSWARM_TIME {\"seconds\": -2147483648}\n\
                      MTSWARM_RESULT {\"valid\": true, \"flops\": 100}\n\
                      MTSWARM_RESULT {\"valid\": true, \"seconds\": 0.5}\n";
        let samples = parse_harness_output(stdout, Duration::from_secs(2));
        assert!(!samples[0].valid);
        assert_eq!(samples[0].seconds, 1.0, "the wall time's share");
        let error = samples[0].error.as_deref().unwrap_or_default();
        assert!(error.contains("-2147483648 seconds"), "{error}");
        assert!(samples[1].valid);
        assert_eq!(samples[1].seconds, 0.5);
    }
}
