//! The leader's Control service behind TLS and bearer tokens, over real
//! sockets: anonymous and plaintext calls are refused, each call needs its
//! role (PERMISSION_DENIED names it), `submitted_by` and `decided_by` come
//! from the credential, and only an admin cancels another identity's job.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::sync::Arc;

use common::*;
use mtswarm_auth::generate::{GrpcCredentials, default_identities, grpc_credentials};
use mtswarm_auth::{ClientAuth, Role, ServerSecurity};
use mtswarm_bus::{Approvals, v1};
use mtswarm_leader::LeaderHandle;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

type Pass = fn(Request<()>) -> Result<Request<()>, Status>;
type AuthControl = v1::control_client::ControlClient<
    InterceptedService<Channel, mtswarm_auth::BearerInterceptor<Pass>>,
>;

fn pass(request: Request<()>) -> Result<Request<()>, Status> {
    Ok(request)
}

struct Secured {
    env: Env,
    leader: LeaderHandle,
    credentials: GrpcCredentials,
    model: Arc<GatedModel>,
    _dir: tempfile::TempDir,
}

impl Secured {
    async fn start() -> Secured {
        let env = Env::start().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let mut identities = default_identities();
        identities.push(("bob".into(), vec![Role::Submit]));
        let hosts: Vec<String> = mtswarm_auth::generate::LOCAL_HOSTS
            .iter()
            .map(|h| h.to_string())
            .collect();
        let credentials =
            grpc_credentials(dir.path(), &hosts, &identities, &[]).expect("credentials");
        let security = ServerSecurity::load(
            Some(&credentials.identities_file),
            Some((&credentials.leader.cert_file, &credentials.leader.key_file)),
        )
        .expect("security");
        // The job stays RUNNING on its first model turn.
        let model = Arc::new(GatedModel::held_answer("done"));
        // Every job gets its own held model, so each stays RUNNING until
        // cancelled (the shared one only holds the first job).
        let mut config = env
            .config()
            .with_model_factory(Arc::new(move |_: &v1::JobSpec| {
                Ok(Arc::new(GatedModel::held_answer("done")) as Arc<dyn mtswarm_core::ChatModel>)
            }));
        config.security = security;
        let leader = start_leader(config).await;
        Secured {
            env,
            leader,
            credentials,
            model,
            _dir: dir,
        }
    }

    fn auth(&self, identity: Option<&str>) -> ClientAuth {
        let mut auth = ClientAuth::none()
            .with_ca_file(&self.credentials.ca_file)
            .expect("ca");
        if let Some(name) = identity {
            auth = auth
                .with_token_file(self.credentials.token_file(name).expect("token file"))
                .expect("token");
        }
        auth
    }

    async fn client(&self, identity: Option<&str>) -> AuthControl {
        let auth = self.auth(identity);
        let url = self.leader.grpc_url();
        assert!(url.starts_with("https://"), "{url}");
        let channel = within(
            "a TLS connection",
            auth.endpoint(&url, WAIT).expect("endpoint").connect(),
        )
        .await
        .expect("TLS connect");
        v1::control_client::ControlClient::with_interceptor(channel, auth.interceptor(pass as Pass))
    }

    async fn submit(&self, identity: &str) -> String {
        submit(&mut self.client(Some(identity)).await, "Tune k1.").await
    }
}

fn assert_refused(result: Result<impl std::fmt::Debug, Status>, code: Code, mentions: &str) {
    let status = result.expect_err("refused");
    assert_eq!(status.code(), code, "{status:?}");
    assert!(status.message().contains(mentions), "{status:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn plaintext_and_anonymous_calls_are_refused() {
    let secured = Secured::start().await;
    // Plain HTTP/2 against the TLS port never reaches a handler.
    let plain_url = secured.leader.grpc_url().replace("https://", "http://");
    let plain = ClientAuth::none()
        .endpoint(&plain_url, WAIT)
        .expect("endpoint")
        .connect()
        .await;
    if let Ok(channel) = plain {
        let listed = v1::control_client::ControlClient::new(channel)
            .list_jobs(v1::ListJobsRequest::default())
            .await;
        assert!(listed.is_err(), "a plaintext call was answered: {listed:?}");
    }

    let mut anonymous = secured.client(None).await;
    assert_refused(
        anonymous.list_jobs(v1::ListJobsRequest::default()).await,
        Code::Unauthenticated,
        "credential",
    );
    // The abuses of an anonymous caller: deciding, cancelling, submitting.
    let job_id = secured.submit("submitter").await;
    assert_refused(
        decide(
            &mut anonymous,
            "ap1",
            v1::ApprovalVerdict::Approve,
            "",
            "alice",
        )
        .await,
        Code::Unauthenticated,
        "credential",
    );
    assert_refused(
        cancel_job(&mut anonymous, &job_id, "mine now").await,
        Code::Unauthenticated,
        "credential",
    );
    // A made-up token is no better.
    let forged = ClientAuth::none()
        .with_ca_file(&secured.credentials.ca_file)
        .expect("ca")
        .with_token("mts_0000")
        .expect("token");
    let channel = forged
        .endpoint(&secured.leader.grpc_url(), WAIT)
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut forged = v1::control_client::ControlClient::with_interceptor(
        channel,
        forged.interceptor(pass as Pass),
    );
    assert_refused(
        get_job(&mut forged, &job_id).await,
        Code::Unauthenticated,
        "unknown credential",
    );
    let record = get_job(&mut secured.client(Some("admin")).await, &job_id)
        .await
        .expect("get");
    assert_ne!(record.state(), v1::JobState::Cancelled);
    secured.model.open();
}

#[tokio::test(flavor = "multi_thread")]
async fn each_call_needs_its_role_and_names_it() {
    let secured = Secured::start().await;
    let mut submitter = secured.client(Some("submitter")).await;
    let job_id = secured.submit("submitter").await;
    let record = get_job(&mut submitter, &job_id)
        .await
        .expect("a submitter reads its job");
    assert_eq!(record.submitted_by, "submitter");
    assert_refused(
        decide(&mut submitter, "ap1", v1::ApprovalVerdict::Approve, "", "").await,
        Code::PermissionDenied,
        "`approve`",
    );
    assert_refused(
        submitter.list_fleet(v1::ListFleetRequest::default()).await,
        Code::PermissionDenied,
        "`admin`",
    );
    assert_refused(
        submitter
            .lift_quarantine(v1::LiftQuarantineRequest {
                slice_id: "board0-c0".into(),
                reason: String::new(),
            })
            .await,
        Code::PermissionDenied,
        "`admin`",
    );
    let mut approver = secured.client(Some("approver")).await;
    assert_refused(
        try_submit(&mut approver, spec("Tune k1.")).await,
        Code::PermissionDenied,
        "`submit`",
    );
    // The leader's own identity calls workers, not Control.
    let mut leader_identity = secured.client(Some("leader")).await;
    assert_refused(
        leader_identity
            .list_jobs(v1::ListJobsRequest::default())
            .await,
        Code::PermissionDenied,
        "`submit` or `read` or `admin`",
    );
    secured
        .client(Some("admin"))
        .await
        .list_fleet(v1::ListFleetRequest::default())
        .await
        .expect("an admin lists the fleet");
    secured.model.open();
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_owner_or_an_admin_cancels_a_job() {
    let secured = Secured::start().await;
    let job_id = secured.submit("submitter").await;
    let mut bob = secured.client(Some("bob")).await;
    assert_refused(
        cancel_job(&mut bob, &job_id, "not mine").await,
        Code::PermissionDenied,
        "`admin`",
    );
    let state = get_job(&mut secured.client(Some("submitter")).await, &job_id)
        .await
        .expect("get")
        .state();
    assert!(
        matches!(state, v1::JobState::Queued | v1::JobState::Running),
        "{state:?}"
    );
    // Bob cancels his own; an admin cancels anyone's.
    let own = secured.submit("bob").await;
    let cancelled = cancel_job(&mut bob, &own, "mine").await;
    assert_eq!(cancelled.expect("own job"), v1::JobState::Cancelled);
    let mut admin = secured.client(Some("admin")).await;
    let cancelled = cancel_job(&mut admin, &job_id, "admin").await;
    assert_eq!(cancelled.expect("admin cancels"), v1::JobState::Cancelled);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_decider_is_the_credential_not_the_request_field() {
    let secured = Secured::start().await;
    let job_id = secured.submit("submitter").await;
    secured
        .env
        .bus
        .publish_approval_request(&approval_request(&job_id, "ap-cred", "sess-cred"))
        .await
        .expect("publish request");
    let approvals = Approvals::open(&secured.env.bus).await.expect("bucket");
    eventually("the approval record", || {
        let approvals = approvals.clone();
        async move { approvals.get("ap-cred").await.ok().flatten() }
    })
    .await;
    let decided = decide(
        &mut secured.client(Some("approver")).await,
        "ap-cred",
        v1::ApprovalVerdict::Approve,
        "fine",
        "someone-else",
    )
    .await
    .expect("decide");
    let decision = decided.decision.expect("decision");
    assert_eq!(decision.decided_by, "approver");
    secured.model.open();
}
