//! Configuration files in a directory, as libcni loads them: `.conflist`, and `.conf`
//! and `.json` single configurations made lists, in lexical order.

use crate::conflist::NetConfList;
use crate::error::{Error, ErrorCode};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The networks of a configuration directory.
#[derive(Debug, Default)]
pub struct ConfDir {
    /// Per network name, the first file defining it: (file, its bytes, the list).
    pub networks: Vec<(PathBuf, Vec<u8>, NetConfList)>,
    /// Files ignored because an earlier file defines the same network: (ignored, winner).
    pub shadowed: Vec<(PathBuf, PathBuf)>,
}

/// Loads every configuration in `dir` (`.conf`, `.conflist`, `.json`, lexical order;
/// single configurations wrapped as lists; the first list with a name wins, the others
/// are reported as shadowed). A file that does not parse is reported with its path.
pub fn load_dir(dir: &Path) -> Result<ConfDir, Error> {
    let mut out = ConfDir::default();
    for path in conf_files(dir)? {
        let (bytes, list) = load_file(&path)?;
        match out.networks.iter().find(|(_, _, l)| l.name == list.name) {
            Some((winner, _, _)) => out.shadowed.push((path, winner.clone())),
            None => out.networks.push((path, bytes, list)),
        }
    }
    Ok(out)
}

/// The configuration files of `dir` (`.conf`, `.conflist`, `.json`), in lexical order.
pub fn conf_files(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::new(ErrorCode::Io, format!("read {}: {e}", dir.display())))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            matches!(
                p.extension().and_then(|x| x.to_str()),
                Some("conf" | "conflist" | "json")
            )
        })
        .collect();
    files.sort();
    Ok(files)
}

/// One configuration file as a list (a single configuration is wrapped as one), with its
/// bytes; an error names the file.
pub fn load_file(path: &Path) -> Result<(Vec<u8>, NetConfList), Error> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::new(ErrorCode::Io, format!("read {}: {e}", path.display())))?;
    let is_list = path.extension().and_then(|x| x.to_str()) == Some("conflist")
        || serde_json::from_slice::<Value>(&bytes).is_ok_and(|v| v.get("plugins").is_some());
    let list = if is_list {
        NetConfList::parse(&bytes)
    } else {
        NetConfList::from_single(&bytes)
    }
    .map_err(|e| Error {
        msg: format!("{}: {}", path.display(), e.msg),
        ..e
    })?;
    Ok((bytes, list))
}
