//! The recorded landscapes the repository ships (`examples/landscapes`)
//! read as Kernel Tuner caches with the counts their README states, and
//! the emulator's sweeps are exhaustive: every configuration of the
//! kernel's tune.toml space, nothing else.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use mtswarm_hw::ChipSpec;
use mtswarm_hw::landscape::Landscape;
use mtswarm_hw::tune::TuneSpace;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(file: &str) -> Landscape {
    let text = std::fs::read_to_string(repo().join("examples/landscapes").join(file))
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    Landscape::from_kernel_tuner_json(&text).unwrap_or_else(|e| panic!("{file}: {e}"))
}

#[test]
fn the_emulator_sweeps_cover_each_kernels_space_exactly() {
    for (file, kernel, configurations) in [
        ("dgemm.json", "dgemm", 112),
        ("dgemm_gsm.json", "dgemm_gsm", 2205),
        ("spmv.json", "spmv", 16),
        ("stencil2d.json", "stencil2d", 11),
    ] {
        let landscape = read(file);
        assert_eq!(landscape.entries.len(), configurations, "{file}");
        assert_eq!(landscape.measured(), configurations, "{file}: all valid");
        let space =
            TuneSpace::load(&repo().join("examples/kernels").join(kernel)).expect("tune.toml");
        let names: Vec<String> = space.params.iter().map(|p| p.name.clone()).collect();
        let mut keys = landscape.keys.clone();
        keys.sort();
        let mut expected = names.clone();
        expected.sort();
        assert_eq!(keys, expected, "{file}: the kernel's parameters");
        let in_space: BTreeSet<String> = space
            .configurations(&ChipSpec::default())
            .expect("space")
            .iter()
            .map(|c| landscape.cache_key(c))
            .collect();
        let recorded: BTreeSet<String> = landscape
            .entries
            .iter()
            .map(|e| landscape.cache_key(&e.config))
            .collect();
        assert_eq!(recorded, in_space, "{file}: exactly the space");
    }
}

#[test]
fn the_published_gpu_caches_read_with_their_failures() {
    for (file, device, configurations, failed) in [
        (
            "kernel_tuner/pnpoly_rtx3090.json",
            "NVIDIA GeForce RTX 3090",
            4092,
            318,
        ),
        (
            "kernel_tuner/convolution_rtx3090.json",
            "NVIDIA GeForce RTX 3090",
            6768,
            1548,
        ),
    ] {
        let landscape = read(file);
        assert_eq!(landscape.device_name, device, "{file}");
        assert_eq!(landscape.entries.len(), configurations, "{file}");
        assert_eq!(
            landscape.entries.len() - landscape.measured(),
            failed,
            "{file}"
        );
        assert!(landscape.optimum().is_some(), "{file}");
    }
}
