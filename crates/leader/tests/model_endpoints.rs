//! A job may name a model endpoint only from the operator's allowlist, and
//! the daemon's API key goes only to the daemon's own endpoint. The abuse
//! this stops: a job whose `model.base_url` pointed at a listener of the
//! submitter's made the leader send it the daemon's key.
//!
//! One test per binary: it sets the daemon's environment (key and own
//! endpoint) before any thread starts.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

mod common;

use std::time::Duration;

use common::*;
use mtswarm_bus::v1;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;

const KEY: &str = "sk-daemon-secret-1234";

/// A local HTTP listener that reports the request head of every connection
/// and answers 500.
async fn listener() -> (String, mpsc::UnboundedReceiver<String>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/v1", listener.local_addr().expect("addr"));
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = tx.send(String::from_utf8_lossy(&head).into_owned());
                let _ = socket
                    .write_all(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
            });
        }
    });
    (url, rx)
}

#[test]
fn jobs_name_only_allowed_endpoints_and_the_key_stays_home() {
    // SAFETY: set before the runtime (and any other thread) starts; this
    // test binary has no other test.
    unsafe {
        std::env::set_var("MTSWARM_LLM_API_KEY", KEY);
        std::env::set_var("MTSWARM_LLM_URL", "http://127.0.0.1:9/own/v1");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let env = Env::start().await;
        let (evil_url, mut evil) = listener().await;
        let (allowed_url, mut allowed) = listener().await;
        let mut config = env.config();
        config.model_endpoints = vec![allowed_url.clone()];
        let leader = start_leader(config).await;
        let mut control = control(&leader).await;
        let with_model = |url: &str| v1::JobSpec {
            model: Some(v1::ModelSettings {
                base_url: url.to_string(),
                model: "m".into(),
                ..Default::default()
            }),
            ..spec("Tune k1.")
        };

        let refused = try_submit(&mut control, with_model(&evil_url))
            .await
            .expect_err("an endpoint off the allowlist");
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
        assert!(refused.message().contains("allowlist"), "{refused:?}");

        // An allowed endpoint is called, without the daemon's key.
        try_submit(&mut control, with_model(&allowed_url))
            .await
            .expect("an allowed endpoint");
        let head = within("the leader's call to the allowed endpoint", allowed.recv())
            .await
            .expect("a request");
        assert!(head.starts_with("POST "), "{head}");
        assert!(
            !head.contains(KEY),
            "the key went to a job's endpoint: {head}"
        );
        assert!(
            !head.to_ascii_lowercase().contains("authorization"),
            "{head}"
        );
        // Nothing ever reached the refused endpoint.
        assert!(
            tokio::time::timeout(Duration::from_millis(200), evil.recv())
                .await
                .is_err(),
            "the refused endpoint was called"
        );
        leader.shutdown().await.expect("shutdown");
    });
}
