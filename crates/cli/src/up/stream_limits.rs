//! The size limits of the stack's streams. JetStream reserves each
//! stream's `max_bytes` on its store disk up front and refuses a stream it
//! cannot reserve, so the daemons' production defaults (GiBs) would stop a
//! stack on a laptop with a few GB free before it served anything. A stack
//! whose nats-server is started here sizes the limits to that server's
//! store disk instead; limits given on the command line are used as given.

use std::path::Path;

use anyhow::Context as _;
use mtswarm_bus::TopologyConfig;

use super::UpCmd;
use crate::local_stack::StreamBytes;

/// The limits the leader and the workers are started with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct StreamLimits {
    /// The limits.
    pub(super) bytes: StreamBytes,
    /// Whether they were shrunk to fit the store disk.
    pub(super) fitted: bool,
}

/// The limits for `cmd`'s stack whose nats-server stores under `store`
/// (`None` when the server is not started here: the daemons' own defaults,
/// or what the command line says, apply and the server's operator sized
/// its store).
pub(super) fn stream_limits(cmd: &UpCmd, store: Option<&Path>) -> anyhow::Result<StreamLimits> {
    let defaults = TopologyConfig::default();
    let given = StreamBytes {
        events: cmd
            .nats_events_max_bytes
            .unwrap_or(defaults.event_max_bytes),
        measurements: cmd
            .nats_measurements_max_bytes
            .unwrap_or(defaults.measurements_max_bytes),
    };
    let both_given =
        cmd.nats_events_max_bytes.is_some() && cmd.nats_measurements_max_bytes.is_some();
    let Some(store) = store.filter(|_| !both_given) else {
        return Ok(StreamLimits {
            bytes: given,
            fitted: false,
        });
    };
    let free = free_bytes(store)?;
    Ok(fit(cmd, given, free))
}

/// `given` fitted to a store with `free` bytes of free disk; a limit the
/// command line gave is kept as it is.
fn fit(cmd: &UpCmd, given: StreamBytes, free: u64) -> StreamLimits {
    let fitted = TopologyConfig {
        event_max_bytes: given.events,
        measurements_max_bytes: given.measurements,
        ..TopologyConfig::default()
    }
    .fitted_to_store(free);
    let bytes = StreamBytes {
        events: cmd.nats_events_max_bytes.unwrap_or(fitted.event_max_bytes),
        measurements: cmd
            .nats_measurements_max_bytes
            .unwrap_or(fitted.measurements_max_bytes),
    };
    StreamLimits {
        bytes,
        fitted: bytes != given,
    }
}

/// Free disk, bytes, for an unprivileged writer of the file system that
/// holds `path`.
fn free_bytes(path: &Path) -> anyhow::Result<u64> {
    let stats = rustix::fs::statvfs(path)
        .with_context(|| format!("reading the free disk space under {}", path.display()))?;
    Ok(stats.f_bavail.saturating_mul(stats.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        up: UpCmd,
    }

    fn up(args: &[&str]) -> UpCmd {
        Cli::try_parse_from(std::iter::once("up").chain(args.iter().copied()))
            .expect("parses")
            .up
    }

    #[test]
    fn a_small_disk_shrinks_the_defaults_and_a_large_one_keeps_them() {
        let cmd = up(&[]);
        let given = StreamBytes::of(&TopologyConfig::default());
        let large = fit(&cmd, given, 1 << 40);
        assert_eq!(large.bytes, given);
        assert!(!large.fitted);
        let small = fit(&cmd, given, 4 << 30);
        assert!(small.fitted);
        assert_eq!(small.bytes.events, 256 << 20);
        assert_eq!(small.bytes.measurements, 1 << 30);
    }

    #[test]
    fn a_limit_given_on_the_command_line_is_kept() {
        let cmd = up(&["--nats-events-max-bytes", "1048576"]);
        let given = StreamBytes {
            events: 1 << 20,
            measurements: TopologyConfig::default().measurements_max_bytes,
        };
        let small = fit(&cmd, given, 4 << 30);
        assert_eq!(small.bytes.events, 1 << 20);
        assert!(small.bytes.measurements < given.measurements);
    }

    #[test]
    fn the_free_space_of_a_real_directory_is_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(free_bytes(dir.path()).expect("statvfs") > 0);
        let missing = dir.path().join("missing");
        let error = free_bytes(&missing).expect_err("no such directory");
        assert!(format!("{error:#}").contains("missing"), "{error:#}");
    }
}
