//! Pod Security "restricted" on every pod of every overlay, checked rule by
//! rule (the admission controller would refuse the pod otherwise), plus the
//! namespace labels that enforce it and the probes and resources each
//! container needs.

use yaml_rust2::Yaml;

use crate::render::{find, objects, overlay_names, pod};

/// Volume types the restricted profile allows.
const ALLOWED_VOLUMES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

const WORKLOADS: [&str; 5] = ["StatefulSet", "Deployment", "DaemonSet", "Job", "CronJob"];

#[test]
fn the_namespace_enforces_pod_security_restricted() {
    for overlay in overlay_names() {
        let objects = objects(&overlay);
        let labels = &find(&objects, "Namespace", "mtswarm")["metadata"]["labels"];
        for mode in ["enforce", "warn", "audit"] {
            assert_eq!(
                labels[format!("pod-security.kubernetes.io/{mode}").as_str()].as_str(),
                Some("restricted"),
                "{overlay}: {mode}"
            );
        }
        for object in &objects {
            if let Some(namespace) = object["metadata"]["namespace"].as_str() {
                assert_eq!(namespace, "mtswarm", "{overlay}: {:?}", object["metadata"]);
            }
        }
    }
}

#[test]
fn every_pod_meets_pod_security_restricted() {
    let mut pods = 0;
    for overlay in overlay_names() {
        let objects = objects(&overlay);
        for object in objects
            .iter()
            .filter(|o| o["kind"].as_str().is_some_and(|k| WORKLOADS.contains(&k)))
        {
            let name = format!(
                "{overlay}: {} {}",
                object["kind"].as_str().unwrap_or("?"),
                object["metadata"]["name"].as_str().unwrap_or("?")
            );
            check_pod(&name, pod(object));
            pods += 1;
        }
    }
    assert!(pods >= 6, "only {pods} pod templates checked");
}

fn check_pod(name: &str, spec: &Yaml) {
    let security = &spec["securityContext"];
    assert_eq!(
        security["runAsNonRoot"].as_bool(),
        Some(true),
        "{name}: runAsNonRoot"
    );
    assert!(
        security["runAsUser"].as_i64().is_some_and(|uid| uid > 0),
        "{name}: a non-zero runAsUser"
    );
    assert_eq!(
        security["seccompProfile"]["type"].as_str(),
        Some("RuntimeDefault"),
        "{name}: seccompProfile"
    );
    for field in ["hostNetwork", "hostPID", "hostIPC"] {
        assert_ne!(spec[field].as_bool(), Some(true), "{name}: {field}");
    }
    assert_eq!(
        spec["automountServiceAccountToken"].as_bool(),
        Some(false),
        "{name}: no service-account token"
    );
    for volume in spec["volumes"].as_vec().into_iter().flatten() {
        let hash = volume.as_hash().expect("volume");
        for (key, _) in hash {
            let key = key.as_str().expect("key");
            assert!(
                key == "name" || ALLOWED_VOLUMES.contains(&key),
                "{name}: volume type {key} is not allowed by the restricted profile"
            );
        }
    }
    let containers = spec["containers"].as_vec().expect("containers");
    let init = spec["initContainers"].as_vec().cloned().unwrap_or_default();
    for container in containers.iter().chain(init.iter()) {
        let cname = format!("{name} container {:?}", container["name"].as_str());
        let security = &container["securityContext"];
        assert_eq!(
            security["allowPrivilegeEscalation"].as_bool(),
            Some(false),
            "{cname}: allowPrivilegeEscalation"
        );
        assert_ne!(security["privileged"].as_bool(), Some(true), "{cname}");
        assert_ne!(security["runAsUser"].as_i64(), Some(0), "{cname}");
        assert_ne!(security["runAsNonRoot"].as_bool(), Some(false), "{cname}");
        assert!(
            security["capabilities"]["drop"]
                .as_vec()
                .is_some_and(|d| d.iter().any(|c| c.as_str() == Some("ALL"))),
            "{cname}: capabilities drop ALL"
        );
        for added in security["capabilities"]["add"]
            .as_vec()
            .into_iter()
            .flatten()
        {
            assert_eq!(added.as_str(), Some("NET_BIND_SERVICE"), "{cname}");
        }
        if let Some(profile) = security["seccompProfile"]["type"].as_str() {
            assert!(profile == "RuntimeDefault" || profile == "Localhost");
        }
        for port in container["ports"].as_vec().into_iter().flatten() {
            assert!(port["hostPort"].is_badvalue(), "{cname}: hostPort");
        }
        assert_eq!(
            security["readOnlyRootFilesystem"].as_bool(),
            Some(true),
            "{cname}: read-only root file system"
        );
        let resources = &container["resources"];
        assert!(
            resources["requests"]["cpu"].as_str().is_some()
                && resources["requests"]["memory"].as_str().is_some()
                && resources["limits"]["memory"].as_str().is_some(),
            "{cname}: cpu and memory requests and a memory limit: {resources:?}"
        );
        for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
            assert!(!container[probe].is_badvalue(), "{cname}: {probe}");
        }
    }
}
