//! Installing the plugins into a CNI bin directory: the binary copied in as
//! `corvid-plugins`, and one link per plugin name pointing at it. Every file appears
//! atomically, so a runtime never runs a half-copied plugin.

use std::io;
use std::path::{Path, PathBuf};

/// Where runtimes look for plugins by default.
pub const DEFAULT_BIN_DIR: &str = "/opt/cni/bin";

/// The installed binary's name.
pub const BINARY_NAME: &str = "corvid-plugins";

fn ctx(what: String) -> impl FnOnce(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Copies `binary` into `dir` and links every plugin name to it; returns the paths made.
/// The plugin binary beside the running program: where `corvid` finds it by default.
pub fn sibling_binary() -> io::Result<PathBuf> {
    Ok(std::env::current_exe()?.with_file_name(BINARY_NAME))
}

/// Installs the plugin binary at `binary` into `dir`.
pub fn install(binary: &Path, dir: &Path) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(ctx(format!("create {}", dir.display())))?;
    let target = dir.join(BINARY_NAME);
    let tmp = dir.join(format!(".{BINARY_NAME}.tmp.{}", std::process::id()));
    std::fs::copy(binary, &tmp).map_err(ctx(format!(
        "copy {} to {}",
        binary.display(),
        tmp.display()
    )))?;
    std::fs::rename(&tmp, &target).map_err(ctx(format!("install {}", target.display())))?;
    let mut made = vec![target];
    for name in crate::PLUGIN_NAMES {
        let link = dir.join(name);
        let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(BINARY_NAME, &tmp)
            .map_err(ctx(format!("link {}", tmp.display())))?;
        std::fs::rename(&tmp, &link).map_err(ctx(format!("install {}", link.display())))?;
        made.push(link);
    }
    Ok(made)
}
