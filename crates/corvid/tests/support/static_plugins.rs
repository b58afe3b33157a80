//! Where the tests find corvid's static plugin binary.

use std::path::{Path, PathBuf};

/// corvid's static plugin binary, as scripts/test.sh builds it.
pub fn path() -> PathBuf {
    let path = std::env::var_os("CORVID_STATIC_PLUGINS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../target/x86_64-unknown-linux-gnu/image/corvid-plugins")
        });
    assert!(
        path.is_file(),
        "{}: build the static plugin binary first (scripts/test.sh does: see scripts/build-static-plugins.sh)",
        path.display()
    );
    path
}
