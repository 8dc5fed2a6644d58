//! One local stack for `mtswarm up`, `mtswarm demo` and the tests: a
//! nats-server from [`mtswarm_bus::local_server`], the leader and the
//! worker daemons, in-process or as child processes, stopped in one order
//! (workers first: they checkpoint and release their leases over NATS; then
//! the leader; NATS last, so both can finish talking to it). The command
//! lines of leader and worker processes are built in [`process_args`], the
//! credentials of a secured stack come from
//! [`crate::credentials::generate_deployment`].

mod child;
pub(crate) mod process_args;

pub(crate) use child::{ChildProcess, child_command, wait_ready_file};
pub use process_args::{LeaderProcessArgs, StreamBytes, WorkerProcessArgs};

use mtswarm_bus::local_server::NatsServer;
use mtswarm_leader::LeaderHandle;
use mtswarm_worker::WorkerHandle;

/// The leader of a stack.
pub(crate) enum StackLeader {
    /// Started with `LeaderDaemon::start` in this process.
    InProcess(LeaderHandle),
    /// A child process running `mtswarm leader`.
    Process(ChildProcess),
}

/// One worker daemon of a stack.
pub(crate) enum StackWorker {
    /// Started with `WorkerDaemon::start` in this process.
    InProcess(WorkerHandle),
    /// A child process running `mtswarm worker`.
    Process(ChildProcess),
}

/// Everything a local stack started, in start order; [`LocalStack::stop`]
/// stops it in reverse.
pub(crate) struct LocalStack {
    /// Who runs the stack, the prefix of its messages (`mtswarm up`).
    who: &'static str,
    /// The stack's own nats-server (none when it uses a running one).
    pub nats: Option<NatsServer>,
    /// The leader, once started.
    pub leader: Option<StackLeader>,
    /// The worker daemons started so far.
    pub workers: Vec<StackWorker>,
}

impl LocalStack {
    /// An empty stack whose messages start with `who`.
    pub(crate) fn new(who: &'static str) -> Self {
        Self {
            who,
            nats: None,
            leader: None,
            workers: Vec::new(),
        }
    }

    /// Stops the workers (together), then the leader, then nats-server.
    /// What does not stop cleanly is reported on stderr, not returned: the
    /// rest is stopped all the same.
    pub(crate) async fn stop(&mut self) {
        let who = self.who;
        let workers = std::mem::take(&mut self.workers);
        let stops = workers.into_iter().map(|worker| async move {
            match worker {
                StackWorker::InProcess(worker) => {
                    let id = worker.worker_id().to_string();
                    if let Err(error) = worker.shutdown().await {
                        eprintln!("{who}: worker {id} did not stop cleanly: {error}");
                    }
                }
                StackWorker::Process(mut process) => process.stop(who).await,
            }
        });
        futures::future::join_all(stops).await;
        match self.leader.take() {
            Some(StackLeader::InProcess(leader)) => {
                if let Err(error) = leader.shutdown().await {
                    eprintln!("{who}: the leader did not stop cleanly: {error}");
                }
            }
            Some(StackLeader::Process(mut process)) => process.stop(who).await,
            None => {}
        }
        // nats-server has nothing to flush that JetStream has not synced.
        if let Some(mut nats) = self.nats.take()
            && let Err(error) = nats.stop()
        {
            eprintln!("{who}: stopping nats-server: {error}");
        }
    }

    /// The `index`th worker, when it runs as a child process.
    pub(crate) fn worker_process(&mut self, index: usize) -> Option<&mut ChildProcess> {
        match self.workers.get_mut(index) {
            Some(StackWorker::Process(process)) => Some(process),
            _ => None,
        }
    }

    /// The first part that exited by itself, if any (in-process parts end
    /// only when stopped).
    pub(crate) fn exited(&mut self) -> Option<String> {
        if let Some(nats) = &mut self.nats
            && !nats.is_running()
        {
            return Some("nats-server exited".into());
        }
        let processes = self
            .leader
            .iter_mut()
            .filter_map(|leader| match leader {
                StackLeader::Process(process) => Some(process),
                StackLeader::InProcess(_) => None,
            })
            .chain(self.workers.iter_mut().filter_map(|worker| match worker {
                StackWorker::Process(process) => Some(process),
                StackWorker::InProcess(_) => None,
            }));
        for process in processes {
            if let Some(status) = process.exit_status() {
                return Some(format!("{} exited ({status})", process.name()));
            }
        }
        None
    }
}
