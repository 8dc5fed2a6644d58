//! `mtswarm credentials`: every credential of one deployment from one
//! command. For the fleet it is given it writes a CA and one certificate
//! and private key per process (the leader's and the NATS server's for the
//! given hosts, each worker daemon's for its own identity name, so a
//! worker's key can serve as nothing else), one bearer token per identity
//! with the identities file the daemons verify them against, one NATS nkey
//! per process role (the leader, the clients, each worker daemon) and the
//! nats-server `authorization` block with each identity's least-privilege
//! permissions, the leader's result key and its approval decision key (the
//! workers verify decisions with `decision.pub`). `mtswarm up` and
//! `mtswarm demo` call the same code for
//! their local stacks.
//!
//! Also here: the NATS connection flags every process shares (nkey, TLS).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use mtswarm_auth::generate::{
    self, GrpcCredentials, LOCAL_HOSTS, NatsCredentials, NatsWorker, default_identities,
};
use mtswarm_bus::BusConfig;
use mtswarm_hw::fleet::Fleet;

/// How a process authenticates to NATS and checks its certificate.
#[derive(Debug, Clone, Default, Args)]
pub struct NatsSecurityArgs {
    /// File holding this process's NATS nkey seed (`mtswarm credentials`
    /// writes one per role).
    #[arg(long, env = "MTSWARM_NATS_NKEY_FILE")]
    pub nats_nkey_file: Option<PathBuf>,
    /// CA certificate (PEM) of the NATS server's certificate.
    #[arg(long, env = "MTSWARM_NATS_TLS_CA")]
    pub nats_tls_ca: Option<PathBuf>,
    /// Refuse to talk to NATS without TLS.
    #[arg(long, env = "MTSWARM_NATS_REQUIRE_TLS")]
    pub nats_require_tls: bool,
    /// Client certificate (PEM) for NATS servers that verify clients.
    #[arg(long, env = "MTSWARM_NATS_TLS_CERT", requires = "nats_tls_key")]
    pub nats_tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --nats-tls-cert.
    #[arg(long, env = "MTSWARM_NATS_TLS_KEY", requires = "nats_tls_cert")]
    pub nats_tls_key: Option<PathBuf>,
}

impl NatsSecurityArgs {
    /// The TLS part of the bus settings.
    pub fn tls(&self) -> mtswarm_bus::config::TlsConfig {
        mtswarm_bus::config::TlsConfig {
            require_tls: self.nats_require_tls || self.nats_tls_ca.is_some(),
            ca_file: self.nats_tls_ca.clone(),
            client_cert: self.nats_tls_cert.clone().zip(self.nats_tls_key.clone()),
        }
    }

    /// Applies the nkey and TLS settings to `config`.
    pub fn apply(&self, config: &mut BusConfig) -> anyhow::Result<()> {
        if let Some(path) = &self.nats_nkey_file {
            config.nkey_seed = Some(generate::read_seed(path)?);
        }
        config.tls = self.tls();
        Ok(())
    }
}

/// Arguments of `mtswarm credentials`: where to write and for which fleet.
#[derive(Debug, Args)]
pub struct CredentialsCmd {
    /// Directory to write into (created).
    #[arg(long, env = "MTSWARM_CREDENTIALS_DIR")]
    pub out: PathBuf,
    /// Fleet file: one NATS identity per board's worker daemon.
    #[arg(long, env = "MTSWARM_FLEET")]
    pub fleet: PathBuf,
    /// Host names and addresses the server certificate is valid for
    /// (comma-separated; default localhost, 127.0.0.1, ::1).
    #[arg(long = "host", env = "MTSWARM_TLS_HOSTS", value_delimiter = ',')]
    pub hosts: Vec<String>,
}

/// Everything of one deployment, as written.
#[derive(Debug, Clone)]
pub struct Deployment {
    /// CA, server certificate and bearer-token identities of the gRPC services.
    pub grpc: GrpcCredentials,
    /// nats-server authorization block and the nkey seed of every NATS user.
    pub nats: NatsCredentials,
    /// The leader's result key (`--result-key-file`).
    pub result_key_file: PathBuf,
    /// The leader's approval decision key (`--decision-key-file`) and its
    /// public key (the workers' `--leader-public-key`).
    pub decision_key: generate::DecisionKeyFiles,
    /// Worker id and bus slice ids of each board, in fleet order.
    pub workers: Vec<(String, NatsWorker)>,
}

impl Deployment {
    /// The nkey seed file of the worker daemon of `board`.
    pub fn worker_seed(&self, board: &str) -> Option<&Path> {
        self.nats.seed_file(self.worker_id(board)?)
    }

    /// The worker id of the daemon of `board`.
    pub fn worker_id(&self, board: &str) -> Option<&str> {
        self.workers
            .iter()
            .find(|(b, _)| b == board)
            .map(|(_, worker)| worker.worker_id.as_str())
    }

    /// The TLS certificate and key of the worker daemon of `board`.
    pub fn worker_tls(&self, board: &str) -> Option<&generate::CertificateFiles> {
        self.grpc.worker_tls(self.worker_id(board)?)
    }

    /// The nats-server configuration of a stack with these credentials:
    /// only the generated identities connect, each with its own
    /// permissions, over TLS.
    pub fn nats_server_config(&self) -> anyhow::Result<String> {
        let authorization = std::fs::read_to_string(&self.nats.authorization_file)
            .context("reading the NATS authorization block")?;
        Ok(format!("{authorization}\n{}", nats_tls_block(&self.grpc)))
    }

    /// Bus settings of the NATS identity `identity` (e.g.
    /// [`generate::NATS_LEADER`]) over TLS, as connection `name`.
    pub fn bus_config(&self, url: &str, identity: &str, name: &str) -> anyhow::Result<BusConfig> {
        let mut config = BusConfig::new(url).with_name(name);
        config.nkey_seed = Some(generate::read_seed(
            self.nats
                .seed_file(identity)
                .with_context(|| format!("no NATS identity {identity} was generated"))?,
        )?);
        config.tls.require_tls = true;
        config.tls.ca_file = Some(self.grpc.ca_file.clone());
        Ok(config)
    }
}

/// The worker daemons of a fleet (default worker ids) with their slices.
pub(crate) fn fleet_workers(fleet_file: &Path, fleet: &Fleet) -> Vec<(String, NatsWorker)> {
    fleet
        .boards
        .iter()
        .map(|board| {
            let worker_id = mtswarm_worker::WorkerConfig::new(fleet_file, board.id.clone())
                .effective_worker_id();
            let slice_ids = board
                .slices
                .iter()
                .map(mtswarm_worker::bus_slice_id)
                .collect();
            (
                board.id.clone(),
                NatsWorker {
                    worker_id,
                    slice_ids,
                },
            )
        })
        .collect()
}

/// Writes every credential of a deployment of `fleet` into `dir`.
pub fn generate_deployment(
    dir: &Path,
    fleet_file: &Path,
    fleet: &Fleet,
    hosts: &[String],
) -> anyhow::Result<Deployment> {
    let hosts: Vec<String> = if hosts.is_empty() {
        LOCAL_HOSTS.iter().map(|h| h.to_string()).collect()
    } else {
        hosts.to_vec()
    };
    let workers = fleet_workers(fleet_file, fleet);
    let worker_ids: Vec<String> = workers.iter().map(|(_, w)| w.worker_id.clone()).collect();
    let grpc = generate::grpc_credentials(dir, &hosts, &default_identities(), &worker_ids)
        .context("generating the gRPC credentials")?;
    let nats_workers: Vec<NatsWorker> = workers.iter().map(|(_, w)| w.clone()).collect();
    let nats =
        generate::nats_credentials(dir, &nats_workers).context("generating the NATS identities")?;
    let result_key_file =
        generate::result_key_file(dir).context("generating the leader's result key")?;
    let decision_key =
        generate::decision_key_files(dir).context("generating the leader's decision key")?;
    Ok(Deployment {
        grpc,
        nats,
        result_key_file,
        decision_key,
        workers,
    })
}

/// The nats-server `tls` block serving with the NATS server's own
/// certificate.
pub(crate) fn nats_tls_block(grpc: &GrpcCredentials) -> String {
    format!(
        "tls {{\n  cert_file: {:?}\n  key_file: {:?}\n}}\n",
        grpc.nats.cert_file.display().to_string(),
        grpc.nats.key_file.display().to_string()
    )
}

/// `mtswarm credentials`: writes a deployment's credentials for the fleet
/// into `--out` and prints which daemon flag takes which file.
pub(crate) fn credentials(cmd: CredentialsCmd) -> anyhow::Result<ExitCode> {
    let fleet = Fleet::load(&cmd.fleet)
        .with_context(|| format!("loading the fleet {}", cmd.fleet.display()))?;
    let deployment = generate_deployment(&cmd.out, &cmd.fleet, &fleet, &cmd.hosts)?;
    let grpc = &deployment.grpc;
    println!("gRPC (leader and workers: --identities; each its own --tls-cert, --tls-key):");
    println!("  identities:   {}", grpc.identities_file.display());
    println!(
        "  leader:       {} {}",
        grpc.leader.cert_file.display(),
        grpc.leader.key_file.display()
    );
    for (worker_id, files) in &grpc.workers {
        println!(
            "  {worker_id:<13} {} {}",
            files.cert_file.display(),
            files.key_file.display()
        );
    }
    println!(
        "  NATS server:  {} {}",
        grpc.nats.cert_file.display(),
        grpc.nats.key_file.display()
    );
    println!("  CA (clients): {}", grpc.ca_file.display());
    for (name, path) in &grpc.token_files {
        println!("  token {name:<10} {}", path.display());
    }
    println!(
        "  result key (leader --result-key-file): {}",
        deployment.result_key_file.display()
    );
    println!(
        "  decision key (leader --decision-key-file): {}",
        deployment.decision_key.seed_file.display()
    );
    println!(
        "  leader public key (workers --leader-public-key): {} in {}",
        deployment.decision_key.public_key,
        deployment.decision_key.public_file.display()
    );
    println!("NATS (include the authorization block in nats-server.conf):");
    println!(
        "  authorization: {}",
        deployment.nats.authorization_file.display()
    );
    for (name, path) in &deployment.nats.seed_files {
        println!("  nkey {name:<16} {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
