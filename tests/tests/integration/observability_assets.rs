//! Acceptance: the observability assets parse and fit together. The
//! Grafana dashboard queries only metrics the daemons export (the metric
//! catalog, itself checked against a real scrape in mtswarm-telemetry's
//! `metrics_catalog` test) and shows every one of them; each query is
//! valid PromQL (`promtool check rules`); the provisioning files name the
//! data sources the dashboard uses and the directory it is mounted in; the
//! compose file's services mount files that exist and its Prometheus
//! scrapes the ports `mtswarm up` serves metrics on; the Kubernetes
//! component renders (`kubectl kustomize`) with every daemon serving the
//! port its Prometheus scrapes, and carries the same dashboard.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use mtswarm_telemetry::metrics::catalog;
use mtswarm_tests::observability::{
    PROMETHEUS_HINT, dashboard_path, dashboard_queries, instant_expr, metric_names, require_tool,
};
use mtswarm_tests::repo_root;
use serde_json::Value;
use yaml_rust2::{Yaml, YamlLoader};

fn observability() -> PathBuf {
    repo_root().join("deploy/observability")
}

fn component() -> PathBuf {
    repo_root().join("k8s/components/observability")
}

fn yaml(path: &Path) -> Yaml {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let mut docs = YamlLoader::load_from_str(&text)
        .unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()));
    assert_eq!(docs.len(), 1, "{}: one YAML document", path.display());
    docs.remove(0)
}

fn dashboard() -> Value {
    serde_json::from_str(&std::fs::read_to_string(dashboard_path()).expect("dashboard"))
        .expect("the dashboard is JSON")
}

/// Every panel, rows' nested ones included.
fn panels(dashboard: &Value) -> Vec<Value> {
    let mut all = Vec::new();
    let mut stack: Vec<Value> = dashboard["panels"].as_array().cloned().unwrap_or_default();
    while let Some(panel) = stack.pop() {
        if let Some(nested) = panel["panels"].as_array() {
            stack.extend(nested.iter().cloned());
        }
        all.push(panel);
    }
    all
}

#[test]
fn the_dashboard_queries_only_exported_metrics_and_shows_every_one() {
    let exported: BTreeSet<String> = catalog::prometheus_series().into_iter().collect();
    let queries = dashboard_queries(&dashboard_path());
    let mut used = BTreeSet::new();
    for query in &queries {
        let names = metric_names(&query.expr);
        assert!(
            !names.is_empty(),
            "{}: reads no metric: {}",
            query.panel,
            query.expr
        );
        for name in names {
            assert!(
                exported.contains(&name),
                "{} ({}) queries {name}, which no daemon exports (see mtswarm_telemetry::metrics::catalog)",
                query.panel,
                query.ref_id
            );
            used.insert(name);
        }
    }
    for def in catalog::ALL {
        assert!(
            def.prometheus_series()
                .iter()
                .any(|series| used.contains(series)),
            "no panel shows {} ({})",
            def.prometheus,
            def.name
        );
    }
}

#[test]
fn every_dashboard_query_is_valid_promql() {
    let promtool = require_tool("promtool");
    let dir = tempfile::tempdir().expect("temp dir");
    let rules: Vec<String> = dashboard_queries(&dashboard_path())
        .iter()
        .enumerate()
        .map(|(index, query)| {
            format!(
                "      - record: mtswarm:panel_{index}\n        expr: {}\n",
                serde_json::to_string(&instant_expr(&query.expr, "1m")).expect("quoted")
            )
        })
        .collect();
    let file = dir.path().join("panels.rules.yml");
    std::fs::write(
        &file,
        format!("groups:\n  - name: panels\n    rules:\n{}", rules.concat()),
    )
    .expect("write rules");
    let output = Command::new(promtool)
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("promtool could not be run ({e}): {PROMETHEUS_HINT}"));
    assert!(
        output.status.success(),
        "promtool refuses a dashboard query:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_dashboard_links_jobs_to_their_traces() {
    let dashboard = dashboard();
    assert_eq!(dashboard["uid"].as_str(), Some("mtswarm"));
    let links = dashboard["links"].as_array().expect("dashboard links");
    assert!(
        links.iter().any(|link| link["url"]
            .as_str()
            .is_some_and(|url| url.contains("/trace/${trace_id}"))),
        "a dashboard link templated on the trace id: {links:?}"
    );
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("variables");
    for name in ["trace_id", "jaeger_url"] {
        assert!(
            variables.iter().any(|v| v["name"].as_str() == Some(name)),
            "variable {name}"
        );
    }
    let traces = panels(&dashboard)
        .into_iter()
        .find(|p| p["datasource"]["type"].as_str() == Some("jaeger"))
        .expect("a panel of the jobs' traces");
    assert_eq!(
        traces["targets"][0]["operation"].as_str(),
        Some("invoke_workflow mtswarm.job"),
        "the traces panel lists the jobs' workflow spans"
    );
    let data_link = traces["fieldConfig"]["overrides"][0]["properties"][0]["value"][0]["url"]
        .as_str()
        .expect("a data link on the trace id");
    assert!(data_link.contains("/trace/${__value.raw}"), "{data_link}");
    // Every panel names a data source the provisioning defines.
    for panel in panels(&dashboard).iter().filter(|p| p["type"] != "row") {
        let uid = panel["datasource"]["uid"].as_str().unwrap_or_default();
        assert!(
            ["prometheus", "jaeger"].contains(&uid),
            "{}: data source {uid:?}",
            panel["title"]
        );
    }
}

/// The uids of a Grafana data source provisioning file.
fn datasource_uids(path: &Path) -> BTreeSet<String> {
    yaml(path)["datasources"]
        .as_vec()
        .expect("datasources")
        .iter()
        .map(|d| d["uid"].as_str().expect("uid").to_string())
        .collect()
}

#[test]
fn provisioning_names_the_dashboards_sources_and_directory() {
    let want: BTreeSet<String> = ["jaeger", "prometheus"].map(String::from).into();
    let compose_sources = observability().join("grafana/provisioning/datasources/mtswarm.yaml");
    let k8s_sources = component().join("grafana/datasources.yaml");
    assert_eq!(datasource_uids(&compose_sources), want);
    assert_eq!(datasource_uids(&k8s_sources), want);

    let provider = observability().join("grafana/provisioning/dashboards/mtswarm.yaml");
    let path = yaml(&provider)["providers"][0]["options"]["path"]
        .as_str()
        .expect("the provider's path")
        .to_string();
    // The same provider and dashboard in the Kubernetes component.
    for (ours, theirs) in [
        (
            provider.clone(),
            component().join("grafana/dashboards.yaml"),
        ),
        (dashboard_path(), component().join("grafana/mtswarm.json")),
    ] {
        assert_eq!(
            std::fs::read_to_string(&ours).expect("read"),
            std::fs::read_to_string(&theirs).expect("read"),
            "{} and {} differ",
            ours.display(),
            theirs.display()
        );
    }

    // compose.yaml mounts the dashboards where the provider reads them,
    // and every file it mounts exists.
    let compose = yaml(&observability().join("compose.yaml"));
    let services = compose["services"].as_hash().expect("services");
    let names: BTreeSet<&str> = services.keys().filter_map(Yaml::as_str).collect();
    assert_eq!(names, ["grafana", "jaeger", "prometheus"].into());
    let mut mounts = Vec::new();
    for (name, service) in services {
        assert!(
            service["image"].as_str().is_some_and(|i| i.contains(':')),
            "{name:?}: a pinned image"
        );
        for volume in service["volumes"].as_vec().into_iter().flatten() {
            let spec = volume.as_str().expect("short volume syntax");
            let mut parts = spec.split(':');
            let (source, target) = (parts.next().unwrap(), parts.next().expect("a target"));
            if source.starts_with('.') {
                let host = observability().join(source);
                assert!(
                    host.exists(),
                    "{name:?} mounts {}, which is missing",
                    host.display()
                );
                mounts.push((source.to_string(), target.to_string()));
            }
        }
    }
    assert!(
        mounts
            .iter()
            .any(|(source, target)| source == "./grafana/dashboards" && *target == path),
        "compose mounts grafana/dashboards at {path}: {mounts:?}"
    );
}

/// `host:port` targets of a Prometheus configuration's static configs.
fn static_ports(config: &Yaml) -> BTreeSet<u16> {
    config["scrape_configs"]
        .as_vec()
        .expect("scrape_configs")
        .iter()
        .flat_map(|job| job["static_configs"].as_vec().cloned().unwrap_or_default())
        .flat_map(|sc| sc["targets"].as_vec().cloned().unwrap_or_default())
        .map(|t| {
            t.as_str()
                .unwrap()
                .rsplit(':')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect()
}

#[test]
fn prometheus_configurations_are_valid_and_scrape_the_daemons_ports() {
    let promtool = require_tool("promtool");
    let compose_config = observability().join("prometheus/prometheus.yml");
    let k8s_config = component().join("prometheus.yml");
    for config in [&compose_config, &k8s_config] {
        let output = Command::new(&promtool)
            .args(["check", "config"])
            .arg(config)
            .output()
            .expect("run promtool");
        assert!(
            output.status.success(),
            "{}:\n{}{}",
            config.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    // `mtswarm up` on its built-in fleet: the leader and one worker per board.
    let fleet =
        mtswarm_hw::fleet::Fleet::from_toml_str(mtswarm_cli::DEFAULT_FLEET_TOML, Path::new("."))
            .expect("the built-in fleet");
    let want: BTreeSet<u16> = (0..=fleet.boards.len())
        .map(|i| mtswarm_cli::DEFAULT_METRICS_PORT + u16::try_from(i).unwrap())
        .collect();
    assert_eq!(static_ports(&yaml(&compose_config)), want);

    // Kubernetes: every leader and worker pod serves the port Prometheus
    // finds them on, and sends its spans to the component's Jaeger.
    let k8s_port: BTreeSet<i64> = yaml(&k8s_config)["scrape_configs"]
        .as_vec()
        .unwrap()
        .iter()
        .map(|job| job["dns_sd_configs"][0]["port"].as_i64().expect("port"))
        .collect();
    assert_eq!(k8s_port.len(), 1, "one metrics port: {k8s_port:?}");
    let port = *k8s_port.first().unwrap();
    let overlay = repo_root().join("k8s/overlays/observability");
    let output = Command::new("kubectl")
        .arg("kustomize")
        .arg(&overlay)
        .output()
        .unwrap_or_else(|e| panic!("kubectl could not be run ({e}): run `bash deploy/setup.sh`"));
    assert!(
        output.status.success(),
        "kubectl kustomize {}: {}",
        overlay.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let objects =
        YamlLoader::load_from_str(&String::from_utf8_lossy(&output.stdout)).expect("rendered YAML");
    let daemons: Vec<&Yaml> = objects
        .iter()
        .filter(|o| o["kind"].as_str() == Some("StatefulSet"))
        .filter(|o| {
            matches!(
                o["metadata"]["labels"]["app.kubernetes.io/name"].as_str(),
                Some("mtswarm-leader" | "mtswarm-worker")
            )
        })
        .collect();
    assert!(daemons.len() >= 2, "leaders and workers rendered");
    for daemon in &daemons {
        let name = daemon["metadata"]["name"].as_str().unwrap_or("?");
        let container = &daemon["spec"]["template"]["spec"]["containers"][0];
        let env = |key: &str| {
            container["env"]
                .as_vec()
                .unwrap()
                .iter()
                .find(|e| e["name"].as_str() == Some(key))
                .and_then(|e| e["value"].as_str().map(str::to_string))
        };
        assert_eq!(
            env("MTSWARM_METRICS_ADDR"),
            Some(format!("0.0.0.0:{port}")),
            "{name} serves metrics on the scraped port"
        );
        assert_eq!(
            env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").as_deref(),
            Some("http://mtswarm-jaeger:4317"),
            "{name} sends its spans to Jaeger"
        );
        assert!(
            container["ports"]
                .as_vec()
                .unwrap()
                .iter()
                .any(|p| p["containerPort"].as_i64() == Some(port)),
            "{name} declares the metrics port"
        );
    }
    for app in ["mtswarm-prometheus", "mtswarm-grafana", "mtswarm-jaeger"] {
        assert!(
            objects
                .iter()
                .any(|o| o["kind"].as_str() == Some("Deployment")
                    && o["metadata"]["name"].as_str() == Some(app)),
            "{app} rendered"
        );
    }
    // The rendered dashboard is the provisioned one.
    let dashboards = objects
        .iter()
        .find(|o| {
            o["kind"].as_str() == Some("ConfigMap")
                && o["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("mtswarm-grafana-dashboards-"))
        })
        .expect("the dashboards ConfigMap");
    let rendered: Value = serde_json::from_str(
        dashboards["data"]["mtswarm.json"]
            .as_str()
            .expect("mtswarm.json"),
    )
    .expect("JSON");
    assert_eq!(rendered, dashboard());
}
