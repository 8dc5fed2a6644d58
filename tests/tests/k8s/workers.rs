//! The worker StatefulSets are the fleet: each overlay's workers.yaml is
//! what k8s/generate-workers.py makes of its fleet.toml, and the rendered
//! StatefulSets match the fleet as the real parser reads it, board for
//! board: one pod per board serving it, pinned to the board's host, seeing
//! only its own NATS key, with the same fleet file mounted.

use std::collections::BTreeSet;
use std::process::Command;

use mtswarm_hw::fleet::Fleet;
use mtswarm_tests::repo_root;

use crate::objects::assert_flags_exist;
use crate::render::{args, config_map, container, env_value, objects, of_app, overlays, pod};

#[test]
fn generated_workers_are_up_to_date() {
    let output = Command::new("python3")
        .arg(repo_root().join("k8s").join("generate-workers.py"))
        .arg("--check")
        .output()
        .expect("python3 on PATH (deploy/setup.sh installs it)");
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn generator_refuses_board_ids_that_cannot_name_pods() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("fleet.toml"),
        "[[board]]\nid = \"Board_0\"\nbackend = \"emulator\"\nslicing = \"per-cluster\"\n",
    )
    .expect("fleet");
    let output = Command::new("python3")
        .arg(repo_root().join("k8s").join("generate-workers.py"))
        .arg(dir.path())
        .output()
        .expect("python3");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("'Board_0'") && stderr.contains("lowercase"),
        "{stderr}"
    );
    assert!(!dir.path().join("workers.yaml").exists());
}

#[test]
fn worker_statefulsets_are_the_fleet() {
    let worker_help = String::from_utf8_lossy(
        &Command::new(env!("CARGO_BIN_EXE_mtswarm-node"))
            .args(["worker", "--help"])
            .output()
            .expect("mtswarm worker --help")
            .stdout,
    )
    .into_owned();
    for dir in overlays() {
        let overlay = crate::render::name_of(&dir);
        let fleet_file = dir.join("fleet.toml");
        let fleet = Fleet::load(&fleet_file)
            .unwrap_or_else(|e| panic!("{overlay}: fleet.toml does not load: {e}"));
        let objects = objects(&overlay);
        let workers = of_app(&objects, "StatefulSet", "mtswarm-worker");
        assert_eq!(
            workers.len(),
            fleet.boards.len(),
            "{overlay}: one worker StatefulSet per board"
        );
        let mounted = config_map(&objects, "mtswarm-fleet")["data"]["fleet.toml"]
            .as_str()
            .expect("fleet.toml in the ConfigMap")
            .to_string();
        assert_eq!(
            mounted,
            std::fs::read_to_string(&fleet_file).expect("fleet"),
            "{overlay}: the pods mount the fleet the StatefulSets come from"
        );
        let mut selectors = BTreeSet::new();
        for board in &fleet.boards {
            let name = format!("mtswarm-worker-{}", board.id);
            let worker = workers
                .iter()
                .find(|w| w["metadata"]["name"].as_str() == Some(name.as_str()))
                .unwrap_or_else(|| panic!("{overlay}: no StatefulSet {name}"));
            assert_eq!(worker["spec"]["replicas"].as_i64(), Some(1), "{name}");
            assert_eq!(
                env_value(worker, "MTSWARM_BOARD").as_deref(),
                Some(board.id.as_str())
            );
            assert!(worker_help.contains("[env: MTSWARM_BOARD="));
            // Its own NATS identity, named as `mtswarm credentials` names it.
            let worker_id = mtswarm_worker::WorkerConfig::new(&fleet_file, board.id.clone())
                .effective_worker_id();
            let nkey = format!("{worker_id}.nk");
            assert_eq!(
                env_value(worker, "MTSWARM_NATS_NKEY_FILE"),
                Some(format!("/etc/mtswarm/credentials/{nkey}"))
            );
            let keys: Vec<String> = pod(worker)["volumes"]
                .as_vec()
                .expect("volumes")
                .iter()
                .filter(|v| v["name"].as_str() == Some("credentials"))
                .flat_map(|v| v["secret"]["items"].as_vec().cloned().unwrap_or_default())
                .filter_map(|item| item["key"].as_str().map(str::to_string))
                .collect();
            assert!(keys.contains(&nkey), "{name}: {keys:?}");
            assert_eq!(
                keys.iter().filter(|k| k.ends_with(".nk")).count(),
                1,
                "{name} sees no other board's key: {keys:?}"
            );
            // Its own TLS key, issued for its identity only, and no other.
            assert!(
                keys.contains(&format!("{worker_id}.key")),
                "{name}: {keys:?}"
            );
            assert_eq!(
                keys.iter().filter(|k| k.ends_with(".key")).count(),
                1,
                "{name} sees no other process's TLS key: {keys:?}"
            );
            // On the node its board is attached to.
            let node = pod(worker)["nodeSelector"]["kubernetes.io/hostname"].as_str();
            assert_eq!(node, board.host.as_deref(), "{name}");
            let selector = format!("{:?}", worker["spec"]["selector"]);
            assert!(selectors.insert(selector), "{name}: selector shared");
            assert_eq!(
                env_value(worker, "MTSWARM_FLEET").as_deref(),
                Some("/etc/mtswarm/fleet/fleet.toml")
            );
            let mounts = container(worker)["volumeMounts"].as_vec().expect("mounts");
            assert!(mounts.iter().any(|m| m["name"].as_str() == Some("fleet")
                && m["mountPath"].as_str() == Some("/etc/mtswarm/fleet")));
            assert_eq!(args(worker).first().map(String::as_str), Some("worker"));
            assert_flags_exist("worker", &args(worker), &worker_help);
        }
        if overlay == "production" {
            assert!(
                fleet.boards.iter().all(|b| b.host.is_some()),
                "production boards are real and pinned to their hosts"
            );
        }
    }
}
