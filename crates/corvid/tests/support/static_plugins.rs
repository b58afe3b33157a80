//! Where the tests find corvid's static plugin binary.

use std::path::{Path, PathBuf};

/// corvid's static plugin binary: the one CORVID_STATIC_PLUGINS names (scripts/test.sh
/// sets it), or else the test build scripts/build-static-plugins.sh leaves, musl's or,
/// where musl was missing, glibc's.
pub fn path() -> PathBuf {
    let path = std::env::var_os("CORVID_STATIC_PLUGINS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
            ["x86_64-unknown-linux-musl", "x86_64-unknown-linux-gnu"]
                .iter()
                .map(|t| target.join(t).join("image/corvid-plugins"))
                .find(|p| p.is_file())
                .unwrap_or_default()
        });
    assert!(
        path.is_file(),
        "{}: build the static plugin binary first (scripts/test.sh does: see scripts/build-static-plugins.sh)",
        path.display()
    );
    path
}
