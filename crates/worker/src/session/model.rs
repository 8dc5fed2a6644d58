//! Model choice for a new session: which `ChatModel` drives it, and which
//! endpoints may receive the daemon's API key.

use std::sync::Arc;

use mtswarm_auth::AuthError;
use mtswarm_bus::v1;
use mtswarm_core::ChatModel;
use mtswarm_llm::{
    CassetteError, ConfigError, OpenAiClient, OpenAiConfig, ReplayModel, RequestCheck,
};

use crate::config::{SessionModelContext, WorkerModel};
use crate::host::SessionHost;
use mtswarm_policy::BuiltinWorkerPolicy;

/// Why a session's model could not be set up.
#[derive(Debug, thiserror::Error)]
pub(super) enum ModelChoiceError {
    /// The daemon's replay cassette could not be read.
    #[error("replay cassette: {0}")]
    Replay(#[source] CassetteError),
    /// The request names a model, no endpoint, and the daemon has none.
    #[error("model settings name a model but no base_url, and the daemon has no default endpoint")]
    NoBaseUrl,
    /// The requested endpoint is not on the allowlist.
    #[error(transparent)]
    Endpoint(AuthError),
    /// The client for the requested model could not be built.
    #[error("model settings: {0}")]
    Client(#[source] ConfigError),
}

/// The model a session runs on: the daemon's factory or replay cassette,
/// the endpoint the request names (checked against the allowlist), the
/// daemon's endpoint, or the builtin policy.
pub(super) fn session_model(
    shared: &SessionHost,
    request: &v1::SpawnSessionRequest,
) -> Result<Arc<dyn ChatModel>, ModelChoiceError> {
    let context = SessionModelContext {
        session_id: request.session_id.clone(),
        job_id: request.job_id.clone(),
        agent_id: request.agent_id.clone(),
        role: request.role.clone(),
    };
    match &shared.config.model {
        WorkerModel::Factory(factory) => return Ok(factory(&context)),
        WorkerModel::Replay(path) => {
            let replay = ReplayModel::from_file(path)
                .map_err(ModelChoiceError::Replay)?
                .with_request_check(RequestCheck::Ignore);
            return Ok(Arc::new(replay));
        }
        WorkerModel::Builtin | WorkerModel::OpenAi { .. } => {}
    }
    let settings = request
        .model
        .as_ref()
        .filter(|m| !m.model.trim().is_empty());
    let (base_url, model) = match (settings, &shared.config.model) {
        (Some(s), daemon) => {
            let base_url = if s.base_url.trim().is_empty() {
                match daemon {
                    WorkerModel::OpenAi { base_url, .. } => base_url.clone(),
                    _ => return Err(ModelChoiceError::NoBaseUrl),
                }
            } else {
                let url = s.base_url.trim().to_owned();
                endpoints(shared)
                    .check(&url)
                    .map_err(ModelChoiceError::Endpoint)?;
                url
            };
            (base_url, s.model.trim().to_owned())
        }
        (None, WorkerModel::OpenAi { base_url, model }) => (base_url.clone(), model.clone()),
        (None, _) => return Ok(Arc::new(BuiltinWorkerPolicy::new())),
    };
    // The key goes only to the endpoint it was configured for.
    let key_allowed = endpoints(shared).key_goes_to(&base_url);
    let mut config = OpenAiConfig::new(base_url, model);
    if let Some(key) = shared.api_key.as_ref().filter(|_| key_allowed) {
        config = config.with_api_key(key.clone());
    }
    // The tool mode, extra body fields, timeout and context window are the
    // daemon's own endpoint's.
    if key_allowed {
        config = config.with_tool_mode(shared.config.llm_tool_mode);
        config.extra_body = shared.config.llm_extra_body.clone();
        if let Some(timeout) = shared.config.llm_request_timeout {
            config = config.with_request_timeout(timeout);
        }
        config = config.with_context_tokens(shared.config.llm_context_tokens);
    }
    let client = OpenAiClient::new(config).map_err(ModelChoiceError::Client)?;
    Ok(Arc::new(client))
}

/// The operator's allowlist plus the daemon's own endpoint.
fn endpoints(shared: &SessionHost) -> mtswarm_auth::ModelEndpoints {
    let own = match &shared.config.model {
        WorkerModel::OpenAi { base_url, .. } => Some(base_url.as_str()),
        _ => None,
    };
    mtswarm_auth::ModelEndpoints::new(shared.config.model_endpoints.clone(), own)
}
