//! The result cache, in libcni's layout (`<dir>/<network>-<container>-<ifname>`, `kind:
//! cniCacheV1`), so CHECK and DEL get an ADD's result back after a restart.

use super::*;
use crate::config::Attachment;
use crate::conflist::NetConfList;
use crate::error::{Error, ErrorCode};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The end of a cache entry's name while it is written.
const TEMP_SUFFIX: &str = ".tmp";

/// An attachment's cache entry name, as libcni names it.
fn cache_name(network: &str, rt: &RuntimeConf) -> String {
    format!("{network}-{}-{}", rt.container_id, rt.ifname)
}

/// Removes a cache file; one already gone is fine.
pub(super) fn remove_cache_file(path: &Path) -> Result<(), Error> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::new(
            ErrorCode::Io,
            format!("result cache: remove {}: {e}", path.display()),
        )),
        _ => Ok(()),
    }
}

/// libcni's default result cache directory.
pub const DEFAULT_CACHE_DIR: &str = "/var/lib/cni/results";

/// A cached ADD, as libcni writes it (`kind: cniCacheV1`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheEntry {
    /// Always "cniCacheV1".
    pub kind: String,
    /// The container ID.
    pub container_id: String,
    /// The configuration list the ADD ran, as JSON text.
    #[serde(with = "config_bytes")]
    pub config: Vec<u8>,
    /// The interface name.
    pub if_name: String,
    /// The network name.
    pub network_name: String,
    /// The namespace path at ADD time.
    #[serde(default)]
    pub netns: String,
    /// CNI_ARGS pairs.
    #[serde(default)]
    pub cni_args: Vec<(String, String)>,
    /// Capability values.
    #[serde(default)]
    pub capability_args: Map<String, Value>,
    /// The list's final result.
    #[serde(default)]
    pub result: Option<Value>,
}

/// libcni stores `config` as a Go []byte, i.e. base64 text.
mod config_bytes {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        STANDARD
            .decode(String::deserialize(d)?)
            .map_err(|e| serde::de::Error::custom(format!("config is not base64: {e}")))
    }
}

impl Runtime {
    pub(super) fn cache_path(&self, network: &str, rt: &RuntimeConf) -> PathBuf {
        self.cache_dir.join(cache_name(network, rt))
    }

    /// Where an entry is written before its rename: named after the attachment, so a
    /// runtime killed between the two leaves a file that the attachment's DEL removes.
    pub(super) fn cache_temp_path(&self, network: &str, rt: &RuntimeConf) -> PathBuf {
        self.cache_dir
            .join(format!(".{}{TEMP_SUFFIX}", cache_name(network, rt)))
    }

    /// The cached ADD of an attachment, if any; an unreadable file counts as none.
    pub fn cached(&self, network: &str, rt: &RuntimeConf) -> Option<CacheEntry> {
        let bytes = std::fs::read(self.cache_path(network, rt)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Every cached attachment of `network`.
    pub fn cached_attachments(&self, network: &str) -> Vec<CacheEntry> {
        let Ok(dir) = std::fs::read_dir(&self.cache_dir) else {
            return Vec::new();
        };
        dir.flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{network}-"))
            })
            .filter_map(|e| {
                serde_json::from_slice::<CacheEntry>(&std::fs::read(e.path()).ok()?).ok()
            })
            .filter(|c| c.network_name == network)
            .collect()
    }

    pub(super) fn write_cache(
        &self,
        list_bytes: &[u8],
        list: &NetConfList,
        rt: &RuntimeConf,
        result: &Value,
    ) -> Result<(), Error> {
        let entry = CacheEntry {
            kind: "cniCacheV1".into(),
            container_id: rt.container_id.clone(),
            config: list_bytes.to_vec(),
            if_name: rt.ifname.clone(),
            network_name: list.name.clone(),
            netns: rt.netns.clone(),
            cni_args: rt.args.clone(),
            capability_args: rt.capability_args.clone(),
            result: Some(result.clone()),
        };
        let io = |what: &str, e: std::io::Error| {
            Error::new(ErrorCode::Io, format!("result cache: {what}: {e}"))
        };
        std::fs::create_dir_all(&self.cache_dir).map_err(|e| io("create directory", e))?;
        let path = self.cache_path(&list.name, rt);
        let tmp = self.cache_temp_path(&list.name, rt);
        let bytes =
            serde_json::to_vec(&entry).map_err(|e| io("encode", std::io::Error::other(e)))?;
        let write = || -> std::io::Result<()> {
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io("write", e)
        })
    }

    /// Removes the network's cache files that no valid attachment owns and that cannot
    /// be read (empty or torn by a killed runtime), and temporary files left by one.
    pub(super) fn sweep_unreadable(
        &self,
        network: &str,
        valid: &[Attachment],
    ) -> Result<(), Error> {
        let Ok(dir) = std::fs::read_dir(&self.cache_dir) else {
            return Ok(());
        };
        let owned: Vec<String> = valid
            .iter()
            .map(|a| {
                let rt = RuntimeConf {
                    container_id: a.container_id.clone(),
                    ifname: a.ifname.clone(),
                    ..RuntimeConf::default()
                };
                cache_name(network, &rt)
            })
            .collect();
        for e in dir.flatten() {
            let file = e.file_name().to_string_lossy().into_owned();
            let entry = file
                .strip_prefix('.')
                .and_then(|f| f.strip_suffix(TEMP_SUFFIX))
                .unwrap_or(&file);
            if !entry.starts_with(&format!("{network}-")) || owned.iter().any(|o| o == entry) {
                continue;
            }
            let readable = entry == file
                && std::fs::read(e.path())
                    .ok()
                    .and_then(|b| serde_json::from_slice::<CacheEntry>(&b).ok())
                    .is_some();
            if !readable {
                remove_cache_file(&e.path())?;
            }
        }
        Ok(())
    }
}
