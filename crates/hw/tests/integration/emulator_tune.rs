//! The example kernels' tune.toml files: they parse, their defaults satisfy
//! their own constraints, and their spaces are a sensible size.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::emulator_support;

use emulator_support::kernels_dir;
use mtswarm_hw::ChipSpec;
use mtswarm_hw::tune::{TuneError, TuneSpace};

#[test]
fn every_example_space_is_valid_at_its_defaults() {
    let spec = ChipSpec::default();
    for kernel in ["vecadd", "dgemm", "spmv", "stencil2d"] {
        let space = TuneSpace::load(&kernels_dir().join(kernel)).expect(kernel);
        assert_eq!(space.kernel, kernel);
        space
            .check(&space.default_config(), &spec)
            .unwrap_or_else(|e| panic!("{kernel} defaults: {e}"));
        let configs = space.configurations(&spec).expect(kernel);
        assert!(!configs.is_empty(), "{kernel} has no valid configuration");
        assert!(configs.contains(&space.default_config()), "{kernel}");
    }
}

#[test]
fn dgemm_space_shrinks_with_the_chip_and_names_the_broken_constraint() {
    let dir = kernels_dir().join("dgemm");
    let space = TuneSpace::load(&dir).expect("dgemm");
    let full = space
        .configurations(&ChipSpec::default())
        .expect("space")
        .len();
    let small = ChipSpec {
        am_bytes: 256 * 1024,
        ..ChipSpec::default()
    };
    let fewer = space.configurations(&small).expect("space").len();
    assert!(fewer < full, "{fewer} vs {full}");
    match space.check(&space.default_config(), &small) {
        Err(TuneError::Violated { constraint }) => {
            assert!(constraint.contains("am_bytes"), "{constraint}")
        }
        other => panic!("expected the AM constraint to fail, got {other:?}"),
    }
    // The baseline is selectable even though it is not a tuning value.
    assert!(
        space
            .check(&space.baseline_config(), &ChipSpec::default())
            .is_ok()
    );
}
