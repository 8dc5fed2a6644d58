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
            let seconds = times.get(i).copied().or(r.seconds).unwrap_or(fallback);
            let error = r.error.filter(|e| !e.is_empty());
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
