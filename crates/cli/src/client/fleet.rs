//! `mtswarm fleet`: the slices of the fleet and who runs on them.

use std::process::ExitCode;

use clap::Args;
use mtswarm_proto::v1;
use serde_json::json;

use super::output::print_json;
use crate::common::{LeaderArgs, rpc_error};
use crate::render;

/// Arguments of `mtswarm fleet`: which slices to list and how.
#[derive(Debug, Args)]
pub struct FleetCmd {
    /// Only slices matching this selector.
    #[arg(long, short = 's', env = "MTSWARM_SELECTOR", default_value = "")]
    pub selector: String,
    /// JSON output: `{"slices": [...], "workers": [...]}`.
    #[arg(long, env = "MTSWARM_JSON")]
    pub json: bool,
    /// Where the leader's Control service is and how to authenticate.
    #[command(flatten)]
    pub leader: LeaderArgs,
}

/// `mtswarm fleet`: prints every slice with its worker, state, lock
/// utilization and lease or quarantine, then a count per state.
pub(crate) async fn fleet(cmd: FleetCmd) -> anyhow::Result<ExitCode> {
    let mut control = cmd.leader.connect().await?;
    let fleet = control
        .list_fleet(v1::ListFleetRequest {
            slice_selector: cmd.selector.clone(),
        })
        .await
        .map_err(|status| rpc_error("listing the fleet", &cmd.leader.url(), status))?
        .into_inner();
    if cmd.json {
        print_json(&json!({
            "slices": fleet.slices.iter().map(render::fleet_slice).collect::<Vec<_>>(),
            "workers": fleet.workers.iter().map(render::worker).collect::<Vec<_>>(),
        }));
        return Ok(ExitCode::SUCCESS);
    }
    if fleet.slices.is_empty() {
        println!("no slices (is a worker daemon running? `mtswarm up` starts some)");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<14} {:<10} {:>5} {:<9} {:<18} {:<12} {:>5}  SESSION",
        "SLICE", "BOARD", "CORES", "BACKEND", "WORKER", "STATE", "LOCK"
    );
    for slice in &fleet.slices {
        let descriptor = slice.slice.clone().unwrap_or_default();
        let session = fleet_detail(slice);
        println!(
            "{:<14} {:<10} {:>5} {:<9} {:<18} {:<12} {:>4.0}%  {}",
            descriptor.slice_id,
            descriptor.board,
            descriptor.cores,
            descriptor.backend,
            slice.worker_id,
            render::slice_state(slice.state()),
            slice.lock_utilization * 100.0,
            render::truncate(&session, 100)
        );
    }
    let count = |state: v1::SliceState| fleet.slices.iter().filter(|s| s.state() == state).count();
    let mut summary = format!(
        "{} slices on {} workers",
        fleet.slices.len(),
        fleet.workers.len()
    );
    for state in [v1::SliceState::Quarantined, v1::SliceState::Offline] {
        let n = count(state);
        if n > 0 {
            summary.push_str(&format!(", {n} {}", render::slice_state(state)));
        }
    }
    println!("{summary}");
    if count(v1::SliceState::Quarantined) > 0 {
        println!("return a quarantined slice to service with: mtswarm quarantine lift SLICE");
    }
    Ok(ExitCode::SUCCESS)
}

/// The last column of `mtswarm fleet`: who runs on a leased slice, why a
/// quarantined one is out of service.
fn fleet_detail(slice: &v1::FleetSlice) -> String {
    if let Some(q) = &slice.quarantine {
        return format!(
            "{} ({} failures in a row, by {})",
            q.reason, q.consecutive_failures, q.by
        );
    }
    if slice.state() == v1::SliceState::Offline {
        return "worker not heartbeating".to_string();
    }
    slice
        .lease
        .as_ref()
        .map(|l| format!("{} ({})", l.session_id, l.job_id))
        .unwrap_or_default()
}
