//! The command lines of the leader and worker processes of a local stack,
//! in one place for `mtswarm up` and the tests' process stacks: what every
//! such process needs (NATS, kernel root, where to report ready), the
//! caller adds what is its own (credentials, lease TTLs, telemetry).

use std::ffi::OsString;
use std::path::PathBuf;

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
}

impl LeaderProcessArgs {
    /// The arguments after the program name.
    pub fn to_args(&self) -> Vec<OsString> {
        vec![
            "leader".into(),
            "--nats".into(),
            self.nats_url.clone().into(),
            "--listen".into(),
            self.listen.clone().into(),
            "--kernel-root".into(),
            self.kernel_root.clone().into(),
            "--ready-file".into(),
            self.ready_file.clone().into(),
        ]
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
}

impl WorkerProcessArgs {
    /// The arguments after the program name (gRPC on a free port).
    pub fn to_args(&self) -> Vec<OsString> {
        vec![
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
        ]
    }
}
