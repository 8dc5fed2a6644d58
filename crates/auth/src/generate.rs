//! Generating a deployment's gRPC credentials: a CA, a server certificate
//! for the given host names (every daemon serves with it), and one bearer
//! token per identity with the identities file the servers verify them
//! against. `mtswarm credentials` and `mtswarm up` call this.
//!
//! The CA's private key is not kept: a local stack regenerates everything
//! on each start, and a deployment that wants to issue more certificates
//! runs its own CA.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rand::RngCore as _;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::client_config::write_secret;
use crate::{AuthError, IdentityEntry, IdentityTable, Role, token_digest};

/// Names a local stack's certificate is valid for.
pub const LOCAL_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// The identity the leader presents to worker daemons.
pub const LEADER_IDENTITY: &str = "leader";

/// What [`grpc_credentials`] wrote.
#[derive(Debug, Clone)]
pub struct GrpcCredentials {
    /// CA certificate (PEM) clients trust.
    pub ca_file: PathBuf,
    /// Server certificate (PEM) and key of every daemon.
    pub server_cert_file: PathBuf,
    /// The server certificate's private key (PEM, mode 0600).
    pub server_key_file: PathBuf,
    /// The identities file the servers load (token digests only).
    pub identities_file: PathBuf,
    /// Identity name -> file with its token (mode 0600).
    pub token_files: BTreeMap<String, PathBuf>,
}

impl GrpcCredentials {
    /// The token file of `name`.
    pub fn token_file(&self, name: &str) -> Option<&Path> {
        self.token_files.get(name).map(PathBuf::as_path)
    }
}

/// The identities of a default deployment: the leader (calls the workers),
/// `admin` (every person's role, the local user of `mtswarm up`), and one
/// identity per single role for least-privilege clients.
pub fn default_identities() -> Vec<(String, Vec<Role>)> {
    vec![
        (LEADER_IDENTITY.to_string(), vec![Role::Leader]),
        (
            "admin".to_string(),
            vec![Role::Submit, Role::Approve, Role::Admin],
        ),
        ("submitter".to_string(), vec![Role::Submit]),
        ("approver".to_string(), vec![Role::Approve]),
    ]
}

/// A fresh bearer token: 32 random bytes, hex, with a recognizable prefix.
pub fn new_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("mts_{}", hex::encode(bytes))
}

fn generation(what: &'static str) -> impl Fn(rcgen::Error) -> AuthError {
    move |e| AuthError::Generate {
        what,
        reason: e.to_string(),
    }
}

fn write_public(path: &Path, contents: &[u8]) -> Result<(), AuthError> {
    std::fs::write(path, contents).map_err(|source| AuthError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// A CA and a server certificate for `hosts` (DNS names or IP addresses),
/// as (CA PEM, server certificate PEM, server key PEM).
pub fn certificates(hosts: &[String]) -> Result<(String, String, String), AuthError> {
    let ca_key = KeyPair::generate().map_err(generation("the CA key"))?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(generation("the CA"))?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name
        .push(DnType::CommonName, "mtswarm deployment CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).map_err(generation("the CA"))?;
    let issuer = Issuer::new(ca, ca_key);

    let server_key = KeyPair::generate().map_err(generation("the server key"))?;
    let mut server =
        CertificateParams::new(hosts.to_vec()).map_err(generation("the server certificate"))?;
    server
        .distinguished_name
        .push(DnType::CommonName, "mtswarm daemon");
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    server.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    let server_cert = server
        .signed_by(&server_key, &issuer)
        .map_err(generation("the server certificate"))?;
    Ok((ca_cert.pem(), server_cert.pem(), server_key.serialize_pem()))
}

/// Writes a CA, a server certificate for `hosts`, a token per identity and
/// the identities file into `dir` (created).
pub fn grpc_credentials(
    dir: &Path,
    hosts: &[String],
    identities: &[(String, Vec<Role>)],
) -> Result<GrpcCredentials, AuthError> {
    std::fs::create_dir_all(dir).map_err(|source| AuthError::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    let (ca_pem, cert_pem, key_pem) = certificates(hosts)?;
    let ca_file = dir.join("ca.pem");
    let server_cert_file = dir.join("server.pem");
    let server_key_file = dir.join("server.key");
    write_public(&ca_file, ca_pem.as_bytes())?;
    write_public(&server_cert_file, cert_pem.as_bytes())?;
    write_secret(&server_key_file, key_pem.as_bytes())?;

    let mut entries = Vec::new();
    let mut token_files = BTreeMap::new();
    for (name, roles) in identities {
        let token = new_token();
        let path = dir.join("tokens").join(format!("{name}.token"));
        write_secret(&path, token.as_bytes())?;
        entries.push(IdentityEntry {
            name: name.clone(),
            roles: roles.iter().map(|r| r.as_str().to_string()).collect(),
            token_sha256: token_digest(&token),
        });
        token_files.insert(name.clone(), path);
    }
    // Refuse what the servers would refuse, before anything uses it.
    IdentityTable::from_entries(&entries)?;
    let identities_file = dir.join("identities.toml");
    write_public(
        &identities_file,
        IdentityTable::to_toml(&entries).as_bytes(),
    )?;
    Ok(GrpcCredentials {
        ca_file,
        server_cert_file,
        server_key_file,
        identities_file,
        token_files,
    })
}

/// A worker daemon of the deployment, for its NATS permissions.
#[derive(Debug, Clone)]
pub struct NatsWorker {
    /// The worker daemon's id; also its NATS identity name.
    pub worker_id: String,
    /// Bus slice ids of its board (lease and quarantine keys).
    pub slice_ids: Vec<String>,
}

/// The NATS identity of the leader's connection.
pub const NATS_LEADER: &str = "leader";
/// The NATS identity of client commands (`mtswarm results`).
pub const NATS_CLIENT: &str = "client";

/// What [`nats_credentials`] wrote.
#[derive(Debug, Clone)]
pub struct NatsCredentials {
    /// The `authorization { users = [...] }` block to include in the
    /// nats-server configuration.
    pub authorization_file: PathBuf,
    /// Identity (`leader`, `client`, a worker id) -> file with its nkey
    /// seed (mode 0600).
    pub seed_files: BTreeMap<String, PathBuf>,
}

impl NatsCredentials {
    /// The seed file of `identity`; `None` when none was written for it.
    pub fn seed_file(&self, identity: &str) -> Option<&Path> {
        self.seed_files.get(identity).map(PathBuf::as_path)
    }
}

/// One nkey user per process role (the leader, the clients, each worker
/// daemon) with its least-privilege permissions, written into `dir`.
pub fn nats_credentials(dir: &Path, workers: &[NatsWorker]) -> Result<NatsCredentials, AuthError> {
    use mtswarm_bus::permissions::{self, NkeyUser};
    let mut identities = vec![
        (NATS_LEADER.to_string(), permissions::leader()),
        (NATS_CLIENT.to_string(), permissions::client()),
    ];
    for worker in workers {
        mtswarm_bus::subjects::validate_id("worker id", &worker.worker_id).map_err(|e| {
            AuthError::InvalidIdentity {
                name: worker.worker_id.clone(),
                reason: e.to_string(),
            }
        })?;
        if worker.worker_id == NATS_LEADER || worker.worker_id == NATS_CLIENT {
            return Err(AuthError::InvalidIdentity {
                name: worker.worker_id.clone(),
                reason: "a worker id may not be a reserved identity name".into(),
            });
        }
        identities.push((
            worker.worker_id.clone(),
            permissions::worker(&worker.worker_id, &worker.slice_ids),
        ));
    }
    let mut users = Vec::new();
    let mut seed_files = BTreeMap::new();
    for (name, permissions) in identities {
        let pair = nkeys::KeyPair::new_user();
        let seed = pair.seed().map_err(|e| AuthError::Generate {
            what: "an nkey seed",
            reason: e.to_string(),
        })?;
        let path = dir.join("nats").join(format!("{name}.nk"));
        write_secret(&path, seed.as_bytes())?;
        users.push(NkeyUser {
            public_key: pair.public_key(),
            permissions,
        });
        seed_files.insert(name, path);
    }
    let authorization_file = dir.join("nats").join("authorization.conf");
    write_public(
        &authorization_file,
        permissions::authorization_block(&users).as_bytes(),
    )?;
    Ok(NatsCredentials {
        authorization_file,
        seed_files,
    })
}

/// Reads an nkey seed file (its whole content, trimmed).
pub fn read_seed(path: &Path) -> Result<String, AuthError> {
    let text = std::fs::read_to_string(path).map_err(|source| AuthError::Read {
        what: "nkey seed file",
        path: path.to_path_buf(),
        source,
    })?;
    let seed = text.trim().to_string();
    if !seed.starts_with('S') || nkeys::KeyPair::from_seed(&seed).is_err() {
        return Err(AuthError::Parse {
            what: "nkey seed file",
            path: path.to_path_buf(),
            reason: "not an nkey seed".into(),
        });
    }
    Ok(seed)
}

/// Writes a fresh result key ([`crate::ResultKey`]) to `dir/result.key`
/// (mode 0600) for the leader's `--result-key-file`.
pub fn result_key_file(dir: &Path) -> Result<PathBuf, AuthError> {
    let path = dir.join("result.key");
    write_secret(&path, crate::ResultKey::generate().to_hex().as_bytes())?;
    Ok(path)
}

/// What [`decision_key_files`] wrote.
#[derive(Debug, Clone)]
pub struct DecisionKeyFiles {
    /// The leader's signing key (nkey seed, mode 0600) for its
    /// `--decision-key-file`.
    pub seed_file: PathBuf,
    /// Its public key (one line) for the workers' `--leader-public-key`.
    pub public_file: PathBuf,
    /// The public key itself (`N...`), as written to `public_file`.
    pub public_key: String,
}

/// Writes a fresh decision key ([`crate::DecisionSigner`]) to
/// `dir/decision.nk` (mode 0600) and its public key to `dir/decision.pub`.
pub fn decision_key_files(dir: &Path) -> Result<DecisionKeyFiles, AuthError> {
    let signer = crate::DecisionSigner::generate();
    let seed_file = dir.join("decision.nk");
    write_secret(&seed_file, signer.seed()?.as_bytes())?;
    let public_key = signer.public_key();
    let public_file = dir.join("decision.pub");
    write_public(&public_file, format!("{public_key}\n").as_bytes())?;
    Ok(DecisionKeyFiles {
        seed_file,
        public_file,
        public_key,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rustls::client::danger::ServerCertVerifier as _;
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

    /// The Kubernetes layout: one certificate for the leader's Service and,
    /// through a wildcard, every worker pod under the headless Service.
    #[test]
    fn a_wildcard_host_covers_every_worker_pod_and_nothing_else() {
        crate::install_crypto_provider();
        let hosts = vec![
            "mtswarm-leader.mtswarm.svc".to_string(),
            "*.mtswarm-worker.mtswarm.svc".to_string(),
        ];
        let (ca, cert, _key) = super::certificates(&hosts).expect("certificates");
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca.as_bytes()).expect("CA PEM"))
            .expect("CA");
        let verifier = rustls::client::WebPkiServerVerifier::builder(Arc::new(roots))
            .build()
            .expect("verifier");
        let cert = CertificateDer::from_pem_slice(cert.as_bytes()).expect("cert PEM");
        let check = |name: &str| {
            verifier.verify_server_cert(
                &cert,
                &[],
                &ServerName::try_from(name.to_string()).expect("name"),
                &[],
                UnixTime::now(),
            )
        };
        for name in [
            "mtswarm-leader.mtswarm.svc",
            "mtswarm-worker-0.mtswarm-worker.mtswarm.svc",
            "mtswarm-worker-17.mtswarm-worker.mtswarm.svc",
        ] {
            check(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        for name in ["a.b.mtswarm-worker.mtswarm.svc", "mtswarm-nats.mtswarm.svc"] {
            assert!(check(name).is_err(), "{name} accepted");
        }
    }
}
