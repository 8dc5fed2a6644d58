//! Who may call what on mtswarm's gRPC servers.
//!
//! Every server (the leader's `Control`, each worker daemon's `Worker`)
//! authenticates the caller from its credential, a bearer token sent over
//! TLS, never from request fields; the identity the token maps to carries
//! the roles that decide what the caller may do ([`Role`]). This crate owns
//! that mapping ([`IdentityTable`], loaded from the deployment's identities
//! file), the tonic interceptor that enforces it ([`Authenticator`]) on the
//! one gRPC server setup of both daemons ([`serve`]: TLS, health,
//! reflection), the client side (a token and a CA to trust, [`ClientAuth`])
//! and the
//! generation of a local deployment's credentials ([`generate`]), and the
//! leader's signature on approval decisions ([`DecisionSigner`],
//! [`DecisionVerifier`]) and on placements, with the workers' signatures on
//! what they produce for them ([`provenance`]).
//!
//! Tokens are stored on the server side only as SHA-256 digests, so the
//! identities file is not a secret in itself.

mod approved_call;
mod client;
mod client_config;
mod decision;
mod endpoints;
mod error;
pub mod generate;
mod grant_memo;
mod identity;
pub mod provenance;
mod result_token;
mod role;
mod security;
mod serve;
mod server;
mod tls;

pub use approved_call::ApprovedCall;
pub use client::{BearerInterceptor, ClientAuth, worker_tls_name};
pub use client_config::{
    CLIENT_CONFIG_ENV, CLIENT_PROFILE_ENV, ClientConfig, ClientProfile, default_client_config_path,
};
pub use decision::{DecisionSigner, DecisionVerifier, SignatureError, canonical_decision};
pub use endpoints::ModelEndpoints;
pub use error::AuthError;
pub use identity::{Identity, IdentityEntry, IdentityTable, token_digest};
pub use provenance::{
    ProvenanceError, RecordKind, WorkerKey, arguments_digest, canonical_arguments, grant_for,
};
pub use result_token::ResultKey;
pub use role::Role;
pub use security::ServerSecurity;
pub use serve::{ServeError, ServeOptions, Serving, serve};
pub use server::{Authenticator, require, require_any};
pub use tls::{ServerTls, install_crypto_provider};
