//! Fleet inventory parsing, validation errors and slice selectors.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::path::{Path, PathBuf};

use mtswarm_hw::fleet::{Fleet, SliceSelector};
use mtswarm_hw::{BackendKind, HwError, Slice};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn parse(text: &str) -> Result<Fleet, HwError> {
    Fleet::from_toml_str(text, &fixture(""))
}

/// The fleet file `text` is refused with a message naming every one of
/// `needles`.
fn assert_refused(text: &str, needles: &[&str]) {
    let msg = error_of(text);
    for needle in needles {
        assert!(msg.contains(needle), "{needle}: {msg}");
    }
}

fn error_of(text: &str) -> String {
    match parse(text) {
        Ok(fleet) => panic!("expected an error, got {fleet:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn example_fleet_loads_with_its_slices_and_specs() {
    let fleet = Fleet::load(&fixture("fleet.example.toml")).expect("example fleet loads");
    let ids: Vec<String> = fleet.slices().iter().map(Slice::id).collect();
    assert_eq!(
        ids,
        [
            "emu0/c0", "emu0/c1", "emu0/c2", "emu0/c3", "emu1/c0", "emu1/c2", "node17", "cpu/c0",
            "cpu/c1", "cpu/c2", "cpu/c3"
        ]
    );
    let emu1 = fleet.board("emu1").expect("emu1");
    // spec_file sets 16 cores per cluster, the inline override the clock.
    assert_eq!(emu1.spec.cores_per_cluster, 16);
    assert_eq!(emu1.spec.clock_hz, 1.5e9);
    assert_eq!(emu1.spec.name, "MT-3000 (16 cores per cluster)");
    assert_eq!(emu1.slices[0].cores, 8);
    // A listed cluster without cores gets the whole cluster.
    assert_eq!(emu1.slices[1].cores, 16);
    let node = fleet.board("node17").expect("node17");
    assert_eq!(node.backend, BackendKind::Sdk);
    assert_eq!(node.slices[0].cluster, None);
    assert_eq!(node.slices[0].cores, 96);
    assert_eq!(node.launch_prefix, ["yhrun", "-p", "thcp1", "-w", "node17"]);
    assert_eq!(node.host.as_deref(), Some("node17"));
    assert!(
        fleet
            .slices()
            .iter()
            .filter(|s| s.board == "cpu")
            .all(|s| s.cores == 4)
    );
}

#[test]
fn unknown_backend_is_named() {
    assert_refused(
        "[[board]]\nid = \"b0\"\nbackend = \"fpga\"\n",
        &["board `b0`", "unknown backend `fpga`"],
    );
}

#[test]
fn cluster_out_of_range_is_rejected() {
    assert_refused(
        "[[board]]\nid = \"b0\"\nbackend = \"emulator\"\nslices = [{cluster = 4, cores = 8}]\n",
        &["cluster 4 is out of range 0..4"],
    );
}

#[test]
fn too_many_cores_are_rejected_against_the_spec() {
    assert_refused(
        "[[board]]\nid = \"b0\"\nbackend = \"emulator\"\nslices = [{cluster = 0, cores = 25}]\n",
        &["cores = 25", "1..=24"],
    );
    // The same count is fine once the spec allows it.
    let fleet = parse(
        "[[board]]\nid = \"b0\"\nbackend = \"emulator\"\nspec = { cores_per_cluster = 32 }\nslices = [{cluster = 0, cores = 25}]\n",
    )
    .expect("32-core spec");
    assert_eq!(fleet.slices()[0].cores, 25);
    assert_refused(
        "[[board]]\nid = \"b0\"\nbackend = \"emulator\"\nslicing = \"per-cluster\"\ncores = 0\n",
        &["cores = 0"],
    );
}

#[test]
fn duplicate_ids_and_clusters_are_rejected() {
    assert_refused(
        "[[board]]\nid = \"b0\"\nbackend = \"emulator\"\n[[board]]\nid = \"b0\"\nbackend = \"host\"\n",
        &["duplicate board id `b0`"],
    );
    assert_refused(
        "[[board]]\nid = \"b0\"\nbackend = \"emulator\"\nslices = [{cluster = 1}, {cluster = 1}]\n",
        &["cluster 1 is listed twice"],
    );
}

#[test]
fn structural_mistakes_are_named() {
    assert_refused(
        "[[board]]\nid = \"b0\"\nbackend = \"emulator\"\nslicing = \"per-cluster\"\nslices = [{cluster = 0}]\n",
        &["either `slicing` or `slices`"],
    );
    assert_refused(
        "[[board]]\nid = \"b0\"\nbackend = \"emulator\"\nslicing = \"per-core\"\n",
        &["unknown slicing `per-core`"],
    );
    assert_refused(
        "[[board]]\nid = \"b0\"\nbackend = \"emulator\"\nslicng = \"whole\"\n",
        &["slicng"],
    );
    assert_refused(
        "[[board]]\nid = \"b0\"\nbackend = \"emulator\"\nspec = { cores_per_clustr = 8 }\n",
        &["cores_per_clustr"],
    );
    let msg =
        error_of("[[board]]\nid = \"b0\"\nbackend = \"emulator\"\nspec = { clock_hz = 0.0 }\n");
    assert!(msg.contains("clock_hz must be positive"), "{msg}");
    assert_refused(
        "[[board]]\nid = \"a/b\"\nbackend = \"emulator\"\n",
        &["may not contain"],
    );
    assert_refused("", &["no [[board]]"]);
    let msg =
        error_of("[[board]]\nid = \"b0\"\nbackend = \"emulator\"\nspec_file = \"missing.toml\"\n");
    assert!(msg.contains("missing.toml"), "{msg}");
    let err = Fleet::load(&fixture("no-such-fleet.toml")).expect_err("missing file");
    assert!(err.to_string().contains("no-such-fleet.toml"), "{err}");
}

fn slice(board: &str, cluster: Option<u32>, cores: u32, backend: BackendKind) -> Slice {
    Slice {
        board: board.into(),
        cluster,
        cores,
        backend,
    }
}

#[test]
fn selectors_match_by_every_key() {
    let c1 = slice("board0", Some(1), 8, BackendKind::Emulator);
    let whole = slice("node17", None, 96, BackendKind::Sdk);
    let sel = |s: &str| SliceSelector::parse(s).unwrap_or_else(|e| panic!("{e}"));

    assert!(sel("*").matches(&c1) && sel("*").matches(&whole));
    assert!(sel("backend=emulator,cores>=8,board=board0").matches(&c1));
    assert!(!sel("backend=emulator,cores>8").matches(&c1));
    assert!(!sel("backend=emulator").matches(&whole));
    assert!(sel("backend!=emulator").matches(&whole));
    assert!(sel("board=board*").matches(&c1));
    assert!(!sel("board=board*").matches(&whole));
    assert!(sel("id=*/c1").matches(&c1));
    assert!(sel("id=node17").matches(&whole));
    assert!(sel("cluster=1").matches(&c1));
    assert!(sel("cluster<2").matches(&c1));
    assert!(!sel("cluster>=2").matches(&c1));
    assert!(
        !sel("cluster<2").matches(&whole),
        "a whole board has no cluster order"
    );
    assert!(sel("cluster!=1").matches(&whole));
    assert!(sel("cluster=whole").matches(&whole));
    assert!(!sel("cluster=whole").matches(&c1));
    assert!(sel(" cores <= 8 , backend = emulator ").matches(&c1));
    // Display round-trips.
    let s = sel("backend=emulator,cores>=8,board=b*");
    assert_eq!(s.to_string(), "backend=emulator,cores>=8,board=b*");
    assert_eq!(sel(&s.to_string()), s);
}

#[test]
fn selector_parse_errors_are_clear() {
    let err = |s: &str| SliceSelector::parse(s).expect_err(s).to_string();
    assert!(err("").contains("empty selector"));
    assert!(err("color=red").contains("unknown key `color`"));
    assert!(err("cores").contains("no operator"));
    assert!(err("cores>=many").contains("non-negative integer"));
    assert!(err("backend=gpu").contains("unknown backend `gpu`"));
    assert!(err("backend>=sdk").contains("only = and !="));
    assert!(err("cores>=8,,board=x").contains("empty term"));
    assert!(err("cores=").contains("no value"));
    assert!(err("=3").contains("no key"));
    assert!(err("cores=>3").contains("unexpected operator"));
}

#[test]
fn fleet_select_uses_selectors() {
    let fleet = Fleet::load(&fixture("fleet.example.toml")).expect("example fleet");
    let picked: Vec<String> = fleet
        .select(&SliceSelector::parse("backend=emulator,cores>=16").expect("selector"))
        .iter()
        .map(Slice::id)
        .collect();
    assert_eq!(
        picked,
        ["emu0/c0", "emu0/c1", "emu0/c2", "emu0/c3", "emu1/c2"]
    );
}

#[test]
fn fleet_opens_the_backend_of_each_slice() {
    let fleet = Fleet::load(&fixture("fleet.example.toml")).expect("example fleet");
    let sdk = mtswarm_hw::sdk::SdkConfig::default();
    for slice in fleet.slices().iter().filter(|s| s.cluster.is_some()) {
        let board = fleet
            .open(slice, &sdk)
            .unwrap_or_else(|e| panic!("{}: {e}", slice.id()));
        assert_eq!(board.slice().id(), slice.id());
        assert_eq!(board.backend(), slice.backend);
    }
    let node = fleet.board("node17").expect("node17").slices[0].clone();
    let board = fleet.open(&node, &sdk).expect("sdk board");
    assert_eq!(board.backend(), BackendKind::Sdk);
    let stranger = slice("nowhere", Some(0), 4, BackendKind::Emulator);
    let err = fleet.open(&stranger, &sdk).err().expect("unknown slice");
    assert!(err.to_string().contains("not in the fleet"), "{err}");
}

/// A selector or fleet file with a huge term or line is refused with an
/// error that quotes it in part (the caller of SubmitJob reads it).
#[test]
fn errors_quote_a_huge_selector_or_line_in_part() {
    let huge = "ckend".repeat(4_000);
    let err = SliceSelector::parse(&format!("backend=emulator,{huge}"))
        .unwrap_err()
        .to_string();
    assert!(err.len() < 2_500, "{} bytes", err.len());
    assert!(err.contains("backend=emulator"), "{err}");
    let err = Fleet::from_toml_str(&format!("# {huge}\n[[board]\n"), Path::new("."))
        .unwrap_err()
        .to_string();
    assert!(err.len() < 2_500, "{} bytes", err.len());
}
