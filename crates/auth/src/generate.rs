//! Generating a deployment's gRPC credentials: a CA, one certificate and
//! private key per process (the leader's and the NATS server's for the
//! given host names, each worker daemon's for its identity name only,
//! [`crate::worker_tls_name`]), and one bearer token per identity with the
//! identities file the servers verify them against. `mtswarm credentials`
//! and `mtswarm up` call this.
//!
//! One key per process: a worker host that is taken over holds its own
//! key, whose certificate names only that worker, so it can serve as
//! neither the leader nor the NATS server nor another worker.
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
use crate::error::AuthError;
use crate::identity::{IdentityEntry, IdentityTable, token_digest};
use crate::role::Role;

/// Names a local stack's certificate is valid for.
pub const LOCAL_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// The identity the leader presents to worker daemons.
pub const LEADER_IDENTITY: &str = "leader";

/// A certificate (PEM) and its private key (PEM, mode 0600) as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateFiles {
    /// The certificate.
    pub cert_file: PathBuf,
    /// Its private key.
    pub key_file: PathBuf,
}

/// What [`grpc_credentials`] wrote.
#[derive(Debug, Clone)]
pub struct GrpcCredentials {
    /// CA certificate (PEM) clients trust.
    pub ca_file: PathBuf,
    /// The leader's certificate and key (the given host names).
    pub leader: CertificateFiles,
    /// The NATS server's certificate and key (the given host names).
    pub nats: CertificateFiles,
    /// Each worker daemon's certificate and key, by worker id (its
    /// identity name only).
    pub workers: BTreeMap<String, CertificateFiles>,
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

    /// The certificate and key of worker `worker_id`.
    pub fn worker_tls(&self, worker_id: &str) -> Option<&CertificateFiles> {
        self.workers.get(worker_id)
    }
}

/// The identities of a default deployment: the leader (calls the workers),
/// `admin` (every person's role, the local user of `mtswarm up`), and one
/// identity per single role for least-privilege clients (`submitter` sees
/// only its own jobs; `reader` reads every job and changes nothing).
pub fn default_identities() -> Vec<(String, Vec<Role>)> {
    vec![
        (LEADER_IDENTITY.to_string(), vec![Role::Leader]),
        (
            "admin".to_string(),
            vec![Role::Submit, Role::Approve, Role::Admin],
        ),
        ("submitter".to_string(), vec![Role::Submit]),
        ("reader".to_string(), vec![Role::Read]),
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

/// A certificate authority held in memory while a deployment's
/// certificates are issued (its key is never written).
pub struct CertificateAuthority {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CertificateAuthority(<key redacted>)")
    }
}

impl CertificateAuthority {
    /// A fresh CA.
    pub fn new() -> Result<Self, AuthError> {
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
        Ok(Self {
            pem: ca_cert.pem(),
            issuer: Issuer::new(ca, ca_key),
        })
    }

    /// The CA certificate (PEM) clients trust.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// A server certificate for `names` (DNS names or IP addresses) with a
    /// fresh key of its own, as (certificate PEM, key PEM).
    pub fn issue(
        &self,
        common_name: &str,
        names: &[String],
    ) -> Result<(String, String), AuthError> {
        let key = KeyPair::generate().map_err(generation("a server key"))?;
        let mut params =
            CertificateParams::new(names.to_vec()).map_err(generation("a server certificate"))?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(generation("a server certificate"))?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// Issues a certificate for `names` and writes it to `<dir>/<stem>.pem`
    /// and its key to `<dir>/<stem>.key` (mode 0600).
    pub fn write(
        &self,
        dir: &Path,
        stem: &str,
        common_name: &str,
        names: &[String],
    ) -> Result<CertificateFiles, AuthError> {
        let (cert, key) = self.issue(common_name, names)?;
        let files = CertificateFiles {
            cert_file: dir.join(format!("{stem}.pem")),
            key_file: dir.join(format!("{stem}.key")),
        };
        write_secret(&files.key_file, key.as_bytes())?;
        write_public(&files.cert_file, cert.as_bytes())?;
        Ok(files)
    }
}

/// A CA and a server certificate for `hosts` (DNS names or IP addresses),
/// as (CA PEM, server certificate PEM, server key PEM).
pub fn certificates(hosts: &[String]) -> Result<(String, String, String), AuthError> {
    let ca = CertificateAuthority::new()?;
    let (cert, key) = ca.issue("mtswarm daemon", hosts)?;
    Ok((ca.pem, cert, key))
}

/// Writes a CA, the leader's and the NATS server's certificates for
/// `hosts`, one certificate per worker of `worker_ids` for its identity
/// name, a token per identity and the identities file into `dir`
/// (created, mode 0700).
pub fn grpc_credentials(
    dir: &Path,
    hosts: &[String],
    identities: &[(String, Vec<Role>)],
    worker_ids: &[String],
) -> Result<GrpcCredentials, AuthError> {
    private_dir(dir)?;
    let ca = CertificateAuthority::new()?;
    let ca_file = dir.join("ca.pem");
    write_public(&ca_file, ca.pem().as_bytes())?;
    let tls = dir.join("tls");
    private_dir(&tls)?;
    let leader = ca.write(&tls, "leader", "mtswarm leader", hosts)?;
    let nats = ca.write(&tls, "nats", "mtswarm NATS server", hosts)?;
    let mut workers = BTreeMap::new();
    for worker_id in worker_ids {
        let files = ca.write(
            &tls,
            worker_id,
            &format!("mtswarm worker {worker_id}"),
            &[crate::worker_tls_name(worker_id)],
        )?;
        workers.insert(worker_id.clone(), files);
    }

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
        leader,
        nats,
        workers,
        identities_file,
        token_files,
    })
}

/// Creates `dir` (and its parents) with mode 0700, and sets 0700 on it when
/// it exists: the file names in a credentials directory are nobody else's
/// business either.
pub fn private_dir(dir: &Path) -> Result<(), AuthError> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    let failed = |source| AuthError::Write {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(failed)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(failed)
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

    /// One key per process: the worker's certificate names only its
    /// identity, so it serves neither as the leader (the stack's host
    /// names) nor as another worker; the leader's names no worker.
    #[test]
    fn each_process_has_its_own_key_and_a_workers_names_only_that_worker() {
        crate::install_crypto_provider();
        let dir = tempfile::tempdir().expect("dir");
        let hosts = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let workers = vec!["worker-b0".to_string(), "worker-b1".to_string()];
        let written =
            super::grpc_credentials(dir.path(), &hosts, &super::default_identities(), &workers)
                .expect("credentials");
        let ca = std::fs::read(&written.ca_file).expect("ca");
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(&ca).expect("CA PEM"))
            .expect("CA");
        let verifier = rustls::client::WebPkiServerVerifier::builder(Arc::new(roots))
            .build()
            .expect("verifier");
        let valid = |files: &super::CertificateFiles, name: &str| {
            let pem = std::fs::read(&files.cert_file).expect("cert");
            let cert = CertificateDer::from_pem_slice(&pem).expect("cert PEM");
            verifier
                .verify_server_cert(
                    &cert,
                    &[],
                    &ServerName::try_from(name.to_string()).expect("name"),
                    &[],
                    UnixTime::now(),
                )
                .is_ok()
        };
        let b0 = written.worker_tls("worker-b0").expect("worker-b0");
        let b1 = written.worker_tls("worker-b1").expect("worker-b1");
        assert!(valid(b0, &crate::worker_tls_name("worker-b0")));
        assert!(!valid(b0, &crate::worker_tls_name("worker-b1")));
        assert!(!valid(b0, "127.0.0.1") && !valid(b0, "localhost"));
        assert!(valid(&written.leader, "127.0.0.1"));
        assert!(!valid(
            &written.leader,
            &crate::worker_tls_name("worker-b0")
        ));
        let keys: Vec<Vec<u8>> = [&written.leader, &written.nats, b0, b1]
            .iter()
            .map(|f| std::fs::read(&f.key_file).expect("key"))
            .collect();
        for (i, a) in keys.iter().enumerate() {
            assert!(keys[i + 1..].iter().all(|b| a != b), "a key is shared");
        }
        use std::os::unix::fs::PermissionsExt as _;
        for private in [dir.path().to_path_buf(), dir.path().join("tls")] {
            let mode = std::fs::metadata(&private)
                .expect("dir")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o700, "{}", private.display());
        }
    }

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
