//! Test support shared by every crate's `tests/fuzz.rs` (included with `#[path]`): the
//! proptest configuration.

use proptest::test_runner::{Config, FileFailurePersistence};

/// `default` cases per property, or `CORVID_FUZZ_CASES`; failing inputs saved in (and
/// replayed first from) the including crate's `tests/regressions/fuzz.txt`.
#[macro_export]
macro_rules! fuzz_config {
    ($default:expr) => {
        $crate::fuzz::config(
            $default,
            concat!(env!("CARGO_MANIFEST_DIR"), "/tests/regressions/fuzz.txt"),
        )
    };
}

/// The configuration `fuzz_config!` builds.
pub fn config(default: u32, regressions: &'static str) -> Config {
    let cases = std::env::var("CORVID_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(regressions))),
        ..Config::default()
    }
}
