//! Confined launches: a kernel that tries to read the host's files and the
//! daemon's environment, reach a listening 127.0.0.1 port, write outside its
//! directory, fork 10,000 processes and leave a `setsid` process behind.
//! Each attempt must be observed to fail, and the board must keep working.
//! The host backend runs plain C (the emulator refuses these calls at build
//! time already, see `emulator_loopholes.rs`), so the launch's confinement is
//! what stops them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::emulator_support;

use std::collections::BTreeMap;
use std::time::Duration;

use emulator_support::*;
use mtswarm_hw::host::HostBoard;
use mtswarm_hw::{Board, BuildRequest, ChipSpec, RunRequest};

const PROBE_KERNEL: &str = r#"
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <hthread_device.h>

extern char **environ;

static void probes(void) {
    FILE *f = fopen("/etc/passwd", "r");
    char line[256] = "";
    if (f && fgets(line, sizeof line, f)) printf("PROBE passwd ok %.8s\n", line);
    else printf("PROBE passwd fail %d\n", errno);
    if (f) fclose(f);

    const char *secret = getenv("SANDBOX_TEST_API_KEY");
    printf("PROBE secret %s\n", secret ? "ok" : "fail");
    for (char **e = environ; *e; e++) printf("PROBE envvar %.*s\n", (int)strcspn(*e, "="), *e);

    int s = socket(AF_INET, SOCK_STREAM, 0);
    int connected = -1;
    if (s >= 0) {
        struct sockaddr_in a = {0};
        a.sin_family = AF_INET;
        a.sin_port = htons(PORT);
        a.sin_addr.s_addr = htonl(0x7f000001);
        connected = connect(s, (struct sockaddr *)&a, sizeof a);
    }
    printf("PROBE connect %s %d\n", connected == 0 ? "ok" : "fail", errno);

    FILE *out = fopen(OUTSIDE, "w");
    printf("PROBE outside %s %d\n", out ? "ok" : "fail", errno);
    if (out) fclose(out);

    int forked = 0;
    for (int i = 0; i < 10000; i++) {
        pid_t p = fork();
        if (p == 0) _exit(0);
        if (p < 0) break;
        forked++;
    }
    printf("PROBE fork %d\n", forked);

    pid_t p = fork();
    if (p == 0) {
        setsid();
        sleep(600);
        _exit(0);
    }
    printf("PROBE setsid %s\n", p > 0 ? "ok" : "fail");
    fflush(stdout);
}

__global__ void vecadd_kernel(uint64_t n, uint64_t e, double *a, double *b, double *c) {
    (void)e;
    if (get_thread_id() == 0) probes();
    int tid = get_thread_id(), nt = get_group_size();
    for (uint64_t i = tid; i < n; i += nt) c[i] = a[i] + b[i];
}
"#;

fn probe<'a>(tail: &'a str, name: &str) -> Vec<&'a str> {
    let prefix = format!("PROBE {name} ");
    tail.lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_launched_kernel_cannot_reach_files_env_network_or_processes() {
    // SAFETY: set before any launch; no other test of this binary reads it.
    unsafe { std::env::set_var("SANDBOX_TEST_API_KEY", "sk-not-for-kernels") };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    let outside_dir = tempfile::tempdir().expect("tempdir");
    let outside = outside_dir.path().join("answer.txt");

    let dir = fixture(PROBE_KERNEL);
    let board = HostBoard::new(slice(2), ChipSpec::default())
        .expect("slice")
        .with_cache_dir(cache_dir());
    let out = tempfile::tempdir().expect("tempdir");
    let mut d = BTreeMap::from([("N".to_owned(), "4096".to_owned())]);
    d.insert("PORT".into(), port.to_string());
    d.insert("OUTSIDE".into(), format!("\"{}\"", outside.display()));
    let artifact = board
        .build(&BuildRequest {
            kernel_dir: dir.path().to_path_buf(),
            defines: d,
            out_dir: out.path().to_path_buf(),
        })
        .await
        .expect("the host backend builds plain C");
    let request = RunRequest::new(2, 1, Duration::from_secs(60));
    let outcome = board.run(&artifact, &request).await.expect("runs");
    let tail = &outcome.output_tail;
    eprintln!("{tail}");

    assert_eq!(probe(tail, "passwd").len(), 1, "{tail}");
    assert!(probe(tail, "passwd")[0].starts_with("fail"), "{tail}");
    assert!(!tail.contains("root:x"), "{tail}");
    assert_eq!(probe(tail, "secret"), vec!["fail"], "{tail}");
    let allowed = ["PATH", "LANG", "LC_ALL", "TZ", "HOME", "TMPDIR"];
    for var in probe(tail, "envvar") {
        assert!(
            allowed.contains(&var) || var.starts_with("MTSWARM_"),
            "the launch sees `{var}`: {tail}"
        );
    }
    assert!(probe(tail, "connect")[0].starts_with("fail"), "{tail}");
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "nothing may have connected"
    );
    assert!(probe(tail, "outside")[0].starts_with("fail"), "{tail}");
    assert!(!outside.exists(), "the kernel wrote outside its directory");
    assert_eq!(probe(tail, "fork"), vec!["0"], "{tail}");
    assert_eq!(probe(tail, "setsid"), vec!["fail"], "{tail}");
    // The kernel's own work is unaffected and checked.
    assert!(outcome.valid, "{:?} {tail}", outcome.error);

    // The board stays healthy: the next launch runs normally.
    let again = board.run(&artifact, &request).await.expect("runs again");
    assert!(again.valid, "{:?}", again.error);
}
