//! Renders the report of one job from a JSONL export of the results store
//! (`mtswarm_bus::results::to_jsonl`):
//!
//! ```text
//! cargo run -p mtswarm-report --example render_jsonl -- results.jsonl JOB_ID report.html
//! ```
//!
//! Prints the terminal tables and the JSON summary; writes the HTML report.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::io::BufReader;

use mtswarm_bus::results::read_jsonl;
use mtswarm_report::JobReport;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, job_id, output] = args.as_slice() else {
        return Err("usage: render_jsonl RESULTS.jsonl JOB_ID REPORT.html".into());
    };
    let file = std::fs::File::open(input).map_err(|e| format!("{input}: {e}"))?;
    let records: Vec<_> = read_jsonl(BufReader::new(file))?
        .into_iter()
        .filter(|r| &r.job_id == job_id)
        .collect();
    let kernel = records
        .first()
        .map(|r| r.kernel.clone())
        .unwrap_or_default();
    let report = JobReport::from_records(job_id, &kernel, &records, None, &[]);
    let path = report.write_html(output)?;
    print!("{}", report.render_terminal());
    println!(
        "{}",
        serde_json::to_string_pretty(&report.summary(Some(&path)))?
    );
    Ok(())
}
