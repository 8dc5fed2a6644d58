//! The command lines of the leader and worker processes of a local stack,
//! in one place for `mtswarm up` and the tests' process stacks: what every
//! such process needs (NATS, kernel root, where to report ready), the
//! caller adds what is its own (credentials, lease TTLs, telemetry).

use std::ffi::OsString;
use std::path::PathBuf;

use mtswarm_bus::TopologyConfig;

/// The stream size limits every daemon of a stack is started with
/// (`--nats-events-max-bytes`, `--nats-measurements-max-bytes`): the
/// leader creates the streams with them and the workers must agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamBytes {
    /// The events stream's and the job journal's limit, bytes.
    pub events: i64,
    /// The measurements stream's limit, bytes.
    pub measurements: i64,
}

impl StreamBytes {
    /// The limits of `topology`.
    pub fn of(topology: &TopologyConfig) -> Self {
        Self {
            events: topology.event_max_bytes,
            measurements: topology.measurements_max_bytes,
        }
    }

    /// [`TopologyConfig::small`]'s limits: for a stack that lives for a
    /// test (JetStream reserves the limits on its disk up front).
    pub fn small() -> Self {
        Self::of(&TopologyConfig::small())
    }

    fn push_args(self, args: &mut Vec<OsString>) {
        args.extend([
            "--nats-events-max-bytes".into(),
            self.events.to_string().into(),
            "--nats-measurements-max-bytes".into(),
            self.measurements.to_string().into(),
        ]);
    }
}

/// `mtswarm leader` of a local stack.
#[derive(Debug, Clone)]
pub struct LeaderProcessArgs {
    /// `--nats`.
    pub nats_url: String,
    /// `--listen` (gRPC; `127.0.0.1:0` for a free port).
    pub listen: String,
    /// `--kernel-root`.
    pub kernel_root: PathBuf,
    /// `--ready-file`: the leader writes its endpoints there once it serves.
    pub ready_file: PathBuf,
    /// The stream size limits (`None`: the daemon's defaults, GiBs).
    pub stream_bytes: Option<StreamBytes>,
}

impl LeaderProcessArgs {
    /// The arguments after the program name.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            "leader".into(),
            "--nats".into(),
            self.nats_url.clone().into(),
            "--listen".into(),
            self.listen.clone().into(),
            "--kernel-root".into(),
            self.kernel_root.clone().into(),
            "--ready-file".into(),
            self.ready_file.clone().into(),
        ];
        if let Some(bytes) = self.stream_bytes {
            bytes.push_args(&mut args);
        }
        args
    }
}

/// `mtswarm worker` for one board of a local stack's fleet.
#[derive(Debug, Clone)]
pub struct WorkerProcessArgs {
    /// `--nats`.
    pub nats_url: String,
    /// `--fleet`: the stack's fleet file.
    pub fleet: PathBuf,
    /// `--board`: the board this worker owns.
    pub board: String,
    /// `--kernel-root`.
    pub kernel_root: PathBuf,
    /// `--workspace-root`.
    pub workspace_root: PathBuf,
    /// `--ready-file`: the worker writes its endpoints there once it serves.
    pub ready_file: PathBuf,
    /// The stream size limits (`None`: the daemon's defaults); the same
    /// as the leader's.
    pub stream_bytes: Option<StreamBytes>,
}

impl WorkerProcessArgs {
    /// The arguments after the program name (gRPC on a free port).
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            "worker".into(),
            "--nats".into(),
            self.nats_url.clone().into(),
            "--fleet".into(),
            self.fleet.clone().into(),
            "--board".into(),
            self.board.clone().into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--kernel-root".into(),
            self.kernel_root.clone().into(),
            "--workspace-root".into(),
            self.workspace_root.clone().into(),
            "--ready-file".into(),
            self.ready_file.clone().into(),
        ];
        if let Some(bytes) = self.stream_bytes {
            bytes.push_args(&mut args);
        }
        args
    }
}
