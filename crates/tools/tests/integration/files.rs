//! File tools: happy paths, bad inputs, traversal and symlink escapes.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use common::{
    GOOD_KERNEL, assert_refused, call, call_ok, invalid_args, scripted_tools, workspace_with,
};
use mtswarm_core::Effect;
use mtswarm_hw::BackendKind;
use serde_json::json;

fn setup() -> (tempfile::TempDir, mtswarm_tools::ToolSet) {
    let ws = workspace_with(GOOD_KERNEL);
    let tools = scripted_tools(ws.path(), BackendKind::Emulator);
    (ws, tools)
}

#[tokio::test]
async fn read_file_reads_a_window_with_line_numbers() {
    let (ws, tools) = setup();
    std::fs::write(ws.path().join("notes.txt"), "one\ntwo\nthree\nfour\n").expect("write");
    let out = call(
        &tools,
        "read_file",
        json!({"path": "notes.txt", "offset": "2", "limit": 2}),
    )
    .await
    .expect("read");
    assert_eq!(
        out.content,
        "     2\ttwo\n     3\tthree\n... (1 more lines; continue with offset=4)\n"
    );
    let data = out.data.expect("data");
    assert_eq!(data["total_lines"], 4);
    assert_eq!(data["truncated"], true);
    // A model's alias for the path works too.
    let out = call(&tools, "read_file", json!({"file": "kernel.c"}))
        .await
        .expect("alias");
    assert!(out.content.contains("__global__"));
}

#[tokio::test]
async fn read_file_rejects_bad_input() {
    let (ws, tools) = setup();
    std::fs::create_dir(ws.path().join("sub")).expect("mkdir");
    assert_refused(
        &tools,
        &[
            ("read_file", json!({"path": "missing.c"}), "does not exist"),
            (
                "read_file",
                json!({"path": "kernel.c", "offset": 999}),
                "past the end",
            ),
            ("read_file", json!({"path": "sub"}), "directory"),
            ("read_file", json!({"offset": 1}), "path"),
            (
                "read_file",
                json!({"path": "kernel.c", "limit": "lots"}),
                "`limit`",
            ),
        ],
    )
    .await;
}

#[tokio::test]
async fn list_files_lists_recursively_without_build_outputs() {
    let (ws, tools) = setup();
    std::fs::create_dir_all(ws.path().join("sub/deep")).expect("mkdir");
    std::fs::write(ws.path().join("sub/deep/x.h"), "int x;").expect("write");
    std::fs::create_dir_all(ws.path().join(".build/b1")).expect("mkdir");
    let out = call(&tools, "list_files", json!({})).await.expect("list");
    assert!(out.content.contains("kernel.c ("), "{}", out.content);
    assert!(
        out.content.contains("sub/deep/x.h (6 bytes)"),
        "{}",
        out.content
    );
    assert!(!out.content.contains(".build"), "{}", out.content);
    let out = call(
        &tools,
        "list_files",
        json!({"path": "sub", "max_depth": "1"}),
    )
    .await
    .expect("list");
    assert_eq!(out.content, "sub/deep/\n");
}

#[tokio::test]
async fn list_files_rejects_bad_input() {
    let (_ws, tools) = setup();
    assert_refused(
        &tools,
        &[
            ("list_files", json!({"path": "kernel.c"}), "not a directory"),
            ("list_files", json!({"path": "nope"}), "does not exist"),
            ("list_files", json!({"recursive": true}), "recursive"),
        ],
    )
    .await;
}

#[tokio::test]
async fn grep_finds_regex_matches_with_filters() {
    let (ws, tools) = setup();
    std::fs::write(ws.path().join("notes.md"), "vector_malloc is AM\n").expect("write");
    let out = call(
        &tools,
        "grep",
        json!({"pattern": r"vector_malloc\(", "include": ".c"}),
    )
    .await
    .expect("grep");
    assert_eq!(
        out.content,
        "kernel.c:6:   double *buf = vector_malloc(N * sizeof(double));\n"
    );
    let out = call_ok(
        &tools,
        "grep",
        json!({"pattern": "VECTOR_MALLOC", "case_insensitive": "true"}),
    )
    .await;
    assert_eq!(
        out.data.expect("data")["matches"].as_array().map(Vec::len),
        Some(2)
    );
    let out = call_ok(&tools, "grep", json!({"pattern": "no such text"})).await;
    assert!(out.content.starts_with("no matches"));
}

#[tokio::test]
async fn grep_rejects_bad_input() {
    let (_ws, tools) = setup();
    assert_refused(
        &tools,
        &[
            (
                "grep",
                json!({"pattern": "(unclosed"}),
                "bad regular expression",
            ),
            ("grep", json!({"path": "."}), "pattern"),
        ],
    )
    .await;
}

#[tokio::test]
async fn write_file_creates_parents_and_declares_the_edit() {
    let (ws, tools) = setup();
    let out = call(
        &tools,
        "write_file",
        json!({"path": "v2/kernel.c", "content": "int x;\n"}),
    )
    .await
    .expect("write");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("v2/kernel.c")).expect("read"),
        "int x;\n"
    );
    assert!(out.effects.contains(&Effect::Mutation {
        target: "v2/kernel.c".into()
    }));
    assert!(out.effects.contains(&Effect::State {
        key: "source_file".into(),
        value: json!("v2/kernel.c"),
        append: false
    }));
    let tool = tools.get("write_file").expect("tool");
    assert!(!tool.spec().read_only && !tool.spec().concurrency_safe);
    assert_eq!(tool.spec().risk, mtswarm_core::Risk::Medium);
}

#[tokio::test]
async fn write_file_rejects_bad_input() {
    let (ws, tools) = setup();
    std::fs::create_dir(ws.path().join("sub")).expect("mkdir");
    assert_refused(
        &tools,
        &[
            ("write_file", json!({"path": "a.c"}), "content"),
            (
                "write_file",
                json!({"path": "sub", "content": "x"}),
                "directory",
            ),
            (
                "write_file",
                json!({"path": ".", "content": "x"}),
                "file path",
            ),
        ],
    )
    .await;
}

const PATCH: &str = "--- a/kernel.c\n+++ b/kernel.c\n@@ -7,3 +7,3 @@\n   for (int i = 0; i < N; i++) {\n-    a[i] = a[i] * 2.0;\n+    a[i] = a[i] * 3.0;\n   }\n--- /dev/null\n+++ b/notes/plan.md\n@@ -0,0 +1,1 @@\n+try 3.0\n";

#[tokio::test]
async fn apply_patch_applies_a_multi_file_diff() {
    let (ws, tools) = setup();
    let out = call(&tools, "apply_patch", json!({"patch": PATCH}))
        .await
        .expect("patch");
    let kernel = std::fs::read_to_string(ws.path().join("kernel.c")).expect("read");
    assert!(kernel.contains("a[i] = a[i] * 3.0;") && !kernel.contains("* 2.0"));
    assert_eq!(
        std::fs::read_to_string(ws.path().join("notes/plan.md")).expect("read"),
        "try 3.0\n"
    );
    assert!(out.effects.contains(&Effect::Mutation {
        target: "kernel.c".into()
    }));
    assert!(out.effects.contains(&Effect::Mutation {
        target: "notes/plan.md".into()
    }));
    assert_eq!(out.content, "patched kernel.c\npatched notes/plan.md");
}

#[tokio::test]
async fn apply_patch_reports_a_hunk_that_does_not_apply_and_writes_nothing() {
    let (ws, tools) = setup();
    let before = std::fs::read_to_string(ws.path().join("kernel.c")).expect("read");
    let stale = PATCH.replace("-    a[i] = a[i] * 2.0;", "-    a[i] = a[i] * 5.0;");
    let msg = invalid_args(call(&tools, "apply_patch", json!({"patch": stale})).await);
    assert!(msg.contains("kernel.c") && msg.contains("hunk"), "{msg}");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("kernel.c")).expect("read"),
        before
    );
    assert!(!ws.path().join("notes/plan.md").exists(), "all or nothing");
    let msg = invalid_args(call(&tools, "apply_patch", json!({"patch": "just words"})).await);
    assert!(msg.contains("no file header"), "{msg}");
    let msg = invalid_args(
        call(
            &tools,
            "apply_patch",
            json!({"patch": PATCH, "path": "kernel.c"}),
        )
        .await,
    );
    assert!(msg.contains("single-file"), "{msg}");
}

/// `(tool, args)` for every file tool aimed at `target`.
fn aimed_at(target: &str) -> Vec<(&'static str, serde_json::Value)> {
    let patch = format!("--- a/{target}\n+++ b/{target}\n@@ -1,1 +1,1 @@\n-root:x\n+owned\n");
    vec![
        ("read_file", json!({"path": target})),
        ("write_file", json!({"path": target, "content": "owned"})),
        ("list_files", json!({"path": target})),
        ("grep", json!({"pattern": "root", "path": target})),
        ("apply_patch", json!({"patch": patch})),
    ]
}

#[tokio::test]
async fn traversal_and_absolute_paths_are_refused_by_every_file_tool() {
    let (ws, tools) = setup();
    let outside = tempfile::tempdir().expect("outside");
    std::fs::write(outside.path().join("secret"), "root:x\n").expect("secret");
    let escape = format!(
        "../{}/secret",
        outside.path().file_name().expect("name").to_string_lossy()
    );
    for target in ["../x", "sub/../../x", "/etc/passwd", escape.as_str()] {
        for (tool, args) in aimed_at(target) {
            let msg = invalid_args(call(&tools, tool, args).await);
            assert!(
                msg.contains("absolute path") || msg.contains("`..`"),
                "{tool} on {target}: {msg}"
            );
        }
    }
    assert_eq!(
        std::fs::read_to_string(outside.path().join("secret")).expect("read"),
        "root:x\n"
    );
    drop(ws);
}

#[tokio::test]
async fn symlink_escapes_are_refused_by_every_file_tool() {
    let (ws, tools) = setup();
    let outside = tempfile::tempdir().expect("outside");
    std::fs::write(outside.path().join("secret"), "root:x\n").expect("secret");
    std::os::unix::fs::symlink(outside.path(), ws.path().join("out")).expect("dir link");
    std::os::unix::fs::symlink(outside.path().join("secret"), ws.path().join("secret"))
        .expect("file link");
    std::os::unix::fs::symlink(outside.path().join("later"), ws.path().join("dangling"))
        .expect("dangling");
    for target in [
        "out",
        "out/secret",
        "secret",
        "out/new/deeper.c",
        "dangling",
    ] {
        for (tool, args) in aimed_at(target) {
            let msg = invalid_args(call(&tools, tool, args).await);
            assert!(
                msg.contains("outside the workspace") || msg.contains("missing target"),
                "{tool} on {target}: {msg}"
            );
        }
    }
    // A workspace-wide grep or listing does not follow the links out.
    let out = call_ok(&tools, "grep", json!({"pattern": "root:x"})).await;
    assert!(out.content.starts_with("no matches"), "{}", out.content);
    let out = call(&tools, "list_files", json!({})).await.expect("list");
    assert!(
        out.content.contains("out (symlink)") && !out.content.contains("out/secret"),
        "{}",
        out.content
    );
    assert_eq!(
        std::fs::read_to_string(outside.path().join("secret")).expect("read"),
        "root:x\n"
    );
    assert!(!outside.path().join("new").exists() && !outside.path().join("later").exists());

    // A link that stays inside the workspace is fine.
    std::os::unix::fs::symlink(ws.path().join("kernel.c"), ws.path().join("alias.c"))
        .expect("inner link");
    let out = call(&tools, "read_file", json!({"path": "alias.c", "limit": 1}))
        .await
        .expect("inner");
    assert!(out.content.contains("hthread_device"));
}
