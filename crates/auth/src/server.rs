//! The server side: a tonic interceptor that turns the `authorization:
//! Bearer <token>` metadata of every call into an [`Identity`] in the
//! request's extensions (or refuses the call UNAUTHENTICATED), and the
//! checks handlers use to demand a role (PERMISSION_DENIED naming it).

use std::sync::Arc;

use tonic::{Request, Status};

use crate::identity::{Identity, IdentityTable};

use crate::role::Role;

/// Metadata key of the bearer token.
pub(crate) const AUTHORIZATION: &str = "authorization";

/// Authenticates every call of the service it wraps.
#[derive(Debug, Clone)]
pub struct Authenticator {
    /// `None`: authentication is off and every caller is
    /// [`Identity::anonymous`] (library tests and explicitly insecure
    /// deployments only).
    table: Option<Arc<IdentityTable>>,
    /// A role every call of the wrapped service needs (the worker
    /// daemon's service: the leader's role).
    required: Option<Role>,
}

impl Authenticator {
    /// Accepts the callers whose bearer token is in `table`.
    pub fn new(table: Arc<IdentityTable>) -> Self {
        Self {
            table: Some(table),
            required: None,
        }
    }

    /// No authentication: every caller is anonymous with every role.
    pub fn disabled() -> Self {
        Self {
            table: None,
            required: None,
        }
    }

    /// `table` when given, else [`Authenticator::disabled`].
    pub fn from_table(table: Option<Arc<IdentityTable>>) -> Self {
        Self {
            table,
            required: None,
        }
    }

    /// Every call also needs `role`.
    pub fn requiring(mut self, role: Role) -> Self {
        self.required = Some(role);
        self
    }

    /// Tokens are checked (false: every caller is anonymous).
    pub fn is_enabled(&self) -> bool {
        self.table.is_some()
    }

    /// The identity of a call's metadata.
    pub fn authenticate(
        &self,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<Identity, Status> {
        let Some(table) = &self.table else {
            return Ok(Identity::anonymous());
        };
        let header = metadata.get(AUTHORIZATION).ok_or_else(|| {
            Status::unauthenticated("no credential: send `authorization: Bearer <token>`")
        })?;
        let token = header
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                Status::unauthenticated("the authorization metadata is not `Bearer <token>`")
            })?;
        match table.verify(token) {
            Some(identity) => Ok(identity.clone()),
            None => {
                tracing::warn!("call refused: unknown bearer token");
                Err(Status::unauthenticated("unknown credential"))
            }
        }
    }
}

impl tonic::service::Interceptor for Authenticator {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let identity = self.authenticate(request.metadata())?;
        if let Some(role) = self.required
            && !identity.has(role)
        {
            tracing::warn!(identity = %identity.name, %role, "call refused: role missing");
            return Err(denied(&identity, &[role]));
        }
        request.extensions_mut().insert(identity);
        Ok(request)
    }
}

fn denied(identity: &Identity, roles: &[Role]) -> Status {
    let needed = roles
        .iter()
        .map(|r| format!("`{r}`"))
        .collect::<Vec<_>>()
        .join(" or ");
    Status::permission_denied(format!(
        "this call needs the {needed} role; identity {:?} does not have it",
        identity.name
    ))
}

/// The caller's identity when it holds `role`; UNAUTHENTICATED when the
/// call did not pass an [`Authenticator`], PERMISSION_DENIED naming the
/// role otherwise.
pub fn require<T>(request: &Request<T>, role: Role) -> Result<Identity, Status> {
    require_any(request, &[role])
}

/// Like [`require`], for calls that any of `roles` may make.
pub fn require_any<T>(request: &Request<T>, roles: &[Role]) -> Result<Identity, Status> {
    let identity = request
        .extensions()
        .get::<Identity>()
        .ok_or_else(|| Status::unauthenticated("the call was not authenticated"))?;
    if roles.iter().any(|role| identity.has(*role)) {
        Ok(identity.clone())
    } else {
        tracing::warn!(identity = %identity.name, ?roles, "call refused: role missing");
        Err(denied(identity, roles))
    }
}

#[cfg(test)]
mod tests {
    use tonic::service::Interceptor as _;

    use super::*;
    use crate::identity::{IdentityEntry, token_digest};

    fn authenticator() -> Authenticator {
        let table = IdentityTable::from_entries(&[IdentityEntry {
            name: "alice".into(),
            roles: vec!["submit".into()],
            token_sha256: token_digest("secret"),
        }])
        .expect("valid");
        Authenticator::new(Arc::new(table))
    }

    fn with_header(value: &str) -> Request<()> {
        let mut request = Request::new(());
        request
            .metadata_mut()
            .insert(AUTHORIZATION, value.parse().expect("ascii"));
        request
    }

    #[test]
    fn missing_or_wrong_tokens_are_unauthenticated() {
        let mut auth = authenticator();
        for request in [
            Request::new(()),
            with_header("Bearer nope"),
            with_header("secret"),
        ] {
            let status = auth.call(request).expect_err("refused");
            assert_eq!(status.code(), tonic::Code::Unauthenticated);
        }
    }

    #[test]
    fn a_known_token_gives_its_identity_and_roles_are_checked() {
        let mut auth = authenticator();
        let request = auth.call(with_header("Bearer secret")).expect("accepted");
        assert_eq!(
            require(&request, Role::Submit).expect("has submit").name,
            "alice"
        );
        let status = require(&request, Role::Approve).expect_err("no approve");
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert!(
            status.message().contains("`approve`"),
            "{}",
            status.message()
        );
        let status = authenticator()
            .requiring(Role::Leader)
            .call(with_header("Bearer secret"))
            .expect_err("not the leader");
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert!(status.message().contains("`leader`"));
    }
}
