//! Abuse 8 of issue 31 on a real `mtswarm up`, from one stolen client
//! credential: the CLI never sends a token in clear text unless told so
//! with a flag that says what it does.

use crate::secure_up::{SecureUp, Trap, node};

/// The first bytes an HTTP/2 client sends in clear text.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0";
/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// Abuse 8: `--leader http://...` with a token is refused before any
/// connection; a bare `host:port` means TLS; only the explicit
/// `--insecure-plaintext-token` sends the token over plain HTTP/2.
#[tokio::test(flavor = "multi_thread")]
async fn the_cli_never_sends_a_token_in_clear_text_unless_told_to() {
    let stack = SecureUp::start();
    let trap = Trap::start().await;
    let plain = format!("http://{}", trap.addr);

    let refused = node(&stack.client_config)
        .args(["jobs", "--leader", &plain])
        .output()
        .expect("run mtswarm jobs");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("clear text") && stderr.contains("--insecure-plaintext-token"),
        "{stderr}"
    );
    assert!(
        trap.connections().is_empty(),
        "the CLI connected in clear text: {:?}",
        trap.connections()
    );

    // A bare address with a token configured means TLS.
    let bare = node(&stack.client_config)
        .args(["jobs", "--leader", &trap.addr.to_string()])
        .output()
        .expect("run mtswarm jobs");
    assert!(!bare.status.success());
    let seen = trap.wait_for(1).await;
    assert_eq!(seen[0].first(), Some(&TLS_HANDSHAKE), "{seen:?}");
    assert!(!seen[0].starts_with(H2_PREFACE), "{seen:?}");

    // Told explicitly, it does send in clear text.
    let insecure = node(&stack.client_config)
        .args(["jobs", "--leader", &plain, "--insecure-plaintext-token"])
        .output()
        .expect("run mtswarm jobs");
    assert!(!insecure.status.success(), "the trap answers nothing");
    let seen = trap.wait_for(2).await;
    assert!(seen[1].starts_with(H2_PREFACE), "{seen:?}");
    stack.stop();
}
