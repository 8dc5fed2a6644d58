//! `mtswarm quarantine list` and `mtswarm quarantine lift`: slices taken out
//! of service and putting them back.

use std::process::ExitCode;

use anyhow::bail;
use clap::Args;
use mtswarm_proto::v1;
use serde_json::{Value, json};

use super::output::{Listing, print_json};
use crate::common::{LeaderArgs, OperatorAction, rpc_error};
use crate::render;

/// Arguments of `mtswarm quarantine list`.
#[derive(Debug, Args)]
pub struct QuarantineListCmd {
    /// JSON output: `{"quarantined": [...]}`.
    #[arg(long, env = "MTSWARM_JSON")]
    pub json: bool,
    /// Where the leader's Control service is and how to authenticate.
    #[command(flatten)]
    pub leader: LeaderArgs,
}

/// Arguments of `mtswarm quarantine lift`: the slice to return to service.
/// With `--json` it prints `{"slice_id", "lifted", "previous"}`.
#[derive(Debug, Args)]
pub struct QuarantineLiftCmd {
    /// The slice, as `mtswarm fleet` shows it (board0-c1; board0/c1 is read the same).
    pub slice_id: String,
    #[command(flatten)]
    pub action: OperatorAction,
}

/// One quarantined slice as `quarantine list --json` prints it.
fn quarantine_entry(slice: &v1::FleetSlice, q: &v1::SliceQuarantine) -> Value {
    let descriptor = slice.slice.clone().unwrap_or_default();
    json!({
        "slice_id": q.slice_id,
        "board": descriptor.board,
        "worker_id": if q.worker_id.is_empty() { slice.worker_id.clone() } else { q.worker_id.clone() },
        "reason": q.reason,
        "consecutive_failures": q.consecutive_failures,
        "since": render::timestamp(q.since.as_ref()),
        "by": q.by,
    })
}

/// `mtswarm quarantine list`: every quarantined slice with its failure
/// count, since when, by whom and why.
pub(crate) async fn quarantine_list(cmd: QuarantineListCmd) -> anyhow::Result<ExitCode> {
    let mut control = cmd.leader.connect().await?;
    let fleet = control
        .list_fleet(v1::ListFleetRequest::default())
        .await
        .map_err(|status| rpc_error("listing the fleet", &cmd.leader.url(), status))?
        .into_inner();
    let quarantined: Vec<(&v1::FleetSlice, &v1::SliceQuarantine)> = fleet
        .slices
        .iter()
        .filter_map(|s| s.quarantine.as_ref().map(|q| (s, q)))
        .collect();
    let listing = Listing {
        items: &quarantined,
        json_key: "quarantined",
        entry: &|(slice, q)| quarantine_entry(slice, q),
        empty: "no quarantined slices",
        header: format!(
            "{:<14} {:<18} {:>8} {:<24} {:<18} REASON",
            "SLICE", "WORKER", "FAILURES", "SINCE", "BY"
        ),
        row: &|(slice, q)| {
            let entry = quarantine_entry(slice, q);
            format!(
                "{:<14} {:<18} {:>8} {:<24} {:<18} {}",
                q.slice_id,
                render::compact(&entry["worker_id"], 18),
                q.consecutive_failures,
                render::compact(&entry["since"], 24),
                render::truncate(&q.by, 18),
                render::truncate(&q.reason, 70)
            )
        },
        footer: Some("return one to service with: mtswarm quarantine lift SLICE --reason \"...\""),
    };
    Ok(listing.print(cmd.json))
}

/// `mtswarm quarantine lift SLICE`: returns the slice to service. Exit 0
/// also when it was not quarantined (the output says so).
pub(crate) async fn quarantine_lift(cmd: QuarantineLiftCmd) -> anyhow::Result<ExitCode> {
    // `board0/c1` and `board0-c1` name the same slice; anything else that
    // is not an id is left for the leader to refuse.
    let slice_id = cmd.slice_id.trim().replace('/', "-");
    if slice_id.is_empty() {
        bail!("name the slice to return to service (see `mtswarm quarantine list`)");
    }
    let reason = cmd.action.reason.signed("lifted");
    let mut control = cmd.action.leader.connect().await?;
    let response = control
        .lift_quarantine(v1::LiftQuarantineRequest {
            slice_id: slice_id.clone(),
            reason,
        })
        .await
        .map_err(|status| {
            rpc_error(
                &format!("lifting the quarantine of {slice_id}"),
                &cmd.action.leader.url(),
                status,
            )
        })?
        .into_inner();
    if cmd.action.json {
        print_json(&json!({
            "slice_id": slice_id,
            "lifted": response.lifted,
            "previous": response.previous.as_ref().map(|q| json!({
                "slice_id": q.slice_id,
                "worker_id": q.worker_id,
                "reason": q.reason,
                "consecutive_failures": q.consecutive_failures,
                "since": render::timestamp(q.since.as_ref()),
                "by": q.by,
            })),
        }));
    } else if let Some(previous) = &response.previous {
        println!(
            "{slice_id} is back in service (was quarantined: {}, {} failures in a row)",
            previous.reason, previous.consecutive_failures
        );
    } else {
        println!("{slice_id} was not quarantined; nothing to do");
    }
    Ok(ExitCode::SUCCESS)
}
