//! The operator's allowlist of model endpoints. A job (or a session the
//! leader spawns) may name an OpenAI-compatible endpoint only from this
//! list, and the daemon's API key goes only to the endpoint it was
//! configured for: a job cannot point a daemon, and its key, at a listener
//! of its choosing.

use crate::error::AuthError;

/// `https://host/v1/` and `https://host/v1` are the same endpoint.
fn normalize(url: &str) -> String {
    url.trim().trim_end_matches('/').to_string()
}

/// Endpoints jobs may name, plus the daemon's own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelEndpoints {
    allowed: Vec<String>,
    /// The endpoint the daemon's API key belongs to.
    own: Option<String>,
}

impl ModelEndpoints {
    /// `allowed` (from `--model-endpoint`) and the daemon's own endpoint
    /// (`--llm-url`), which is always allowed and the only one that gets
    /// the key.
    pub fn new(allowed: impl IntoIterator<Item = String>, own: Option<&str>) -> Self {
        Self {
            allowed: allowed
                .into_iter()
                .map(|u| normalize(&u))
                .filter(|u| !u.is_empty())
                .collect(),
            own: own.map(normalize).filter(|u| !u.is_empty()),
        }
    }

    /// Ok when a job may name `base_url`.
    pub fn check(&self, base_url: &str) -> Result<(), AuthError> {
        let url = normalize(base_url);
        if self.own.as_deref() == Some(url.as_str()) || self.allowed.contains(&url) {
            Ok(())
        } else {
            Err(AuthError::EndpointNotAllowed(base_url.trim().to_string()))
        }
    }

    /// True when the daemon's API key may be sent to `base_url`.
    pub fn key_goes_to(&self, base_url: &str) -> bool {
        self.own.as_deref() == Some(normalize(base_url).as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listed_endpoints_pass_and_only_the_own_one_gets_the_key() {
        let endpoints = ModelEndpoints::new(
            ["http://vllm:8000/v1/".to_string()],
            Some("https://api.example/v1"),
        );
        assert!(endpoints.check("http://vllm:8000/v1").is_ok());
        assert!(endpoints.check("https://api.example/v1/").is_ok());
        let refused = endpoints
            .check("http://127.0.0.1:9999/v1")
            .expect_err("not listed");
        assert!(refused.to_string().contains("127.0.0.1:9999"));
        assert!(endpoints.key_goes_to("https://api.example/v1/"));
        assert!(!endpoints.key_goes_to("http://vllm:8000/v1"));
        assert!(ModelEndpoints::default().check("http://x").is_err());
    }
}
