//! The runtime side: find plugins on the plugin path, run configuration lists as the spec
//! orders (name and version injected, `prevResult` chained, capabilities passed as
//! `runtimeConfig`, DEL in reverse, a failed ADD undone), and cache each ADD's result in
//! libcni's layout so CHECK and DEL get it back after a restart.
//!
//! The parts, as libcni and its `pkg/invoke` lay them out: `invoke.rs` finds and runs one
//! plugin, `cache.rs` keeps each ADD's result, `conf_dir.rs` loads configuration files;
//! this file runs whole lists.

mod cache;
mod conf_dir;
mod invoke;

pub use cache::{CacheEntry, DEFAULT_CACHE_DIR};
pub use conf_dir::{conf_files, load_dir, load_file, ConfDir};
pub use invoke::find_plugin;

use cache::remove_cache_file;

use crate::command::Command;
use crate::config::Attachment;
use crate::conflist::NetConfList;
use crate::error::{Error, ErrorCode};
use crate::result::CniResult;
use crate::version::Version;
use serde_json::{Map, Value};
use std::path::PathBuf;
use std::time::Duration;

/// How plugins are found and run.
#[derive(Debug, Clone)]
pub struct Runtime {
    /// Directories searched for plugins, in order (CNI_PATH).
    pub plugin_dirs: Vec<PathBuf>,
    /// Where ADD results are cached.
    pub cache_dir: PathBuf,
    /// How long one plugin may run before it is killed.
    pub timeout: Duration,
}

/// What identifies one attachment of a container, and the per-call arguments.
#[derive(Debug, Clone, Default)]
pub struct RuntimeConf {
    /// CNI_CONTAINERID.
    pub container_id: String,
    /// CNI_NETNS; empty when the container is gone.
    pub netns: String,
    /// CNI_IFNAME.
    pub ifname: String,
    /// CNI_ARGS pairs.
    pub args: Vec<(String, String)>,
    /// Values for capabilities (`portMappings`, `ips`, `mac`, `bandwidth`, ...).
    pub capability_args: Map<String, Value>,
}

fn plugin_error(plugin: &str, e: Error) -> Error {
    Error {
        msg: format!("plugin {plugin}: {}", e.msg),
        ..e
    }
}

/// Why running a plugin failed.
#[derive(Debug)]
pub enum Failure {
    /// It could not be found, started or talked to, or did not finish in time.
    NotRun(Error),
    /// It ran and failed with this error.
    Failed(Error),
}

impl Runtime {
    /// A runtime searching `plugin_dirs`, caching in libcni's default place, 60 s timeout.
    pub fn new(plugin_dirs: Vec<PathBuf>) -> Runtime {
        Runtime {
            plugin_dirs,
            cache_dir: PathBuf::from(DEFAULT_CACHE_DIR),
            timeout: Duration::from_secs(60),
        }
    }

    fn plugin_config(
        &self,
        list: &NetConfList,
        i: usize,
        rt: &RuntimeConf,
        prev: Option<&Value>,
    ) -> Value {
        let mut conf = list.plugin_config(i, prev);
        let wanted: Vec<String> = conf
            .get("capabilities")
            .and_then(Value::as_object)
            .map(|caps| {
                caps.iter()
                    .filter(|(_, on)| on.as_bool() == Some(true))
                    .map(|(k, _)| k.clone())
                    .collect()
            })
            .unwrap_or_default();
        let runtime_config: Map<String, Value> = wanted
            .into_iter()
            .filter_map(|k| rt.capability_args.get(&k).map(|v| (k, v.clone())))
            .collect();
        if !runtime_config.is_empty() {
            conf["runtimeConfig"] = Value::Object(runtime_config);
        }
        conf
    }

    /// ADD: runs the list in order and caches the result; when a plugin fails, the whole
    /// list is deleted in reverse and the error returned.
    pub fn add(
        &self,
        list_bytes: &[u8],
        list: &NetConfList,
        rt: &RuntimeConf,
    ) -> Result<Value, Error> {
        let mut prev: Option<Value> = None;
        for i in 0..list.plugins.len() {
            let name = list.plugin_type(i);
            let conf = self.plugin_config(list, i, rt, prev.as_ref());
            let out = self
                .run_plugin(name, Command::Add, rt, conf.to_string().as_bytes())
                .map_err(|e| self.explain_version(name, list, e));
            let parsed = out.and_then(|out| {
                let v: Value = serde_json::from_slice(&out).map_err(|e| {
                    Error::new(
                        ErrorCode::Decoding,
                        format!("plugin {name} printed an unreadable result"),
                    )
                    .with_details(e.to_string())
                })?;
                CniResult::convert(&v, list.version, list.version)
                    .map_err(|e| plugin_error(name, e))
            });
            match parsed {
                Ok(v) => prev = Some(v),
                Err(e) => {
                    self.undo(list, rt, None);
                    return Err(e);
                }
            }
        }
        let result =
            prev.unwrap_or_else(|| serde_json::json!({"cniVersion": list.version.as_str()}));
        if let Err(e) = self.write_cache(list_bytes, list, rt, &result) {
            self.undo(list, rt, Some(&result));
            return Err(e);
        }
        Ok(result)
    }

    /// Undoes a failed ADD: DEL of every plugin in reverse, going on past failures (a
    /// plugin that is missing or broken must not keep the others from cleaning up).
    fn undo(&self, list: &NetConfList, rt: &RuntimeConf, prev: Option<&Value>) {
        if let Err(e) = self.del_each(list, rt, prev, true) {
            tracing::warn!(network = %list.name, container = %rt.container_id, "undoing a failed ADD: {e}");
        }
    }

    /// DEL of every plugin in reverse. The spec stops at the first failure; `best_effort`
    /// goes on and reports the first failure at the end.
    fn del_each(
        &self,
        list: &NetConfList,
        rt: &RuntimeConf,
        prev: Option<&Value>,
        best_effort: bool,
    ) -> Result<(), Error> {
        let prev = prev.filter(|_| list.version >= Version::V0_4_0);
        let mut first_failure = None;
        for i in (0..list.plugins.len()).rev() {
            let name = list.plugin_type(i);
            let conf = self.plugin_config(list, i, rt, prev);
            if let Err(e) = self.run_plugin(name, Command::Del, rt, conf.to_string().as_bytes()) {
                if !best_effort {
                    return Err(e);
                }
                first_failure.get_or_insert(e);
            }
        }
        first_failure.map_or(Ok(()), Err)
    }

    /// DEL: runs the list in reverse with the cached result as `prevResult` (0.4.0 and
    /// later), then forgets the cache entry.
    pub fn del(&self, list: &NetConfList, rt: &RuntimeConf) -> Result<(), Error> {
        let cached = self.cached(&list.name, rt).and_then(|c| c.result);
        self.del_each(list, rt, cached.as_ref(), false)?;
        remove_cache_file(&self.cache_temp_path(&list.name, rt))?;
        remove_cache_file(&self.cache_path(&list.name, rt))
    }

    /// CHECK: each plugin verifies the cached result; refused below 0.4.0.
    pub fn check(&self, list: &NetConfList, rt: &RuntimeConf) -> Result<(), Error> {
        if list.version < Version::V0_4_0 {
            return Err(Error::new(
                ErrorCode::IncompatibleVersion,
                format!(
                    "CHECK needs CNI 0.4.0 or later; network {} is {}",
                    list.name, list.version
                ),
            ));
        }
        if list.disable_check {
            return Ok(());
        }
        let cached = self
            .cached(&list.name, rt)
            .and_then(|c| c.result)
            .ok_or_else(|| {
                Error::new(
                    ErrorCode::UnknownContainer,
                    format!(
                        "no cached result for {} on {} in network {}",
                        rt.container_id, rt.ifname, list.name
                    ),
                )
            })?;
        for i in 0..list.plugins.len() {
            let name = list.plugin_type(i);
            let conf = self.plugin_config(list, i, rt, Some(&cached));
            self.run_plugin(name, Command::Check, rt, conf.to_string().as_bytes())?;
        }
        Ok(())
    }

    /// GC: deletes cached attachments of the network not in `valid`, then (1.1.0) sends
    /// GC with the valid attachments to every plugin.
    pub fn gc(&self, list: &NetConfList, valid: &[Attachment]) -> Result<(), Error> {
        for stale in self.cached_attachments(&list.name) {
            let keep = valid
                .iter()
                .any(|a| a.container_id == stale.container_id && a.ifname == stale.if_name);
            if keep {
                continue;
            }
            let rt = RuntimeConf {
                container_id: stale.container_id.clone(),
                netns: String::new(),
                ifname: stale.if_name.clone(),
                args: stale.cni_args.clone(),
                capability_args: stale.capability_args.clone(),
            };
            let stale_list = NetConfList::parse(&stale.config).unwrap_or_else(|_| list.clone());
            self.del(&stale_list, &rt)?;
        }
        self.sweep_unreadable(&list.name, valid)?;
        if list.version < Version::V1_1_0 || list.disable_gc {
            return Ok(());
        }
        let valid = serde_json::to_value(valid).unwrap_or_default();
        for i in 0..list.plugins.len() {
            let name = list.plugin_type(i);
            let mut conf = list.plugin_config(i, None);
            conf["cni.dev/valid-attachments"] = valid.clone();
            self.run_plugin(
                name,
                Command::Gc,
                &RuntimeConf::default(),
                conf.to_string().as_bytes(),
            )?;
        }
        Ok(())
    }

    /// STATUS (1.1.0): every plugin must say it can serve ADD.
    pub fn status(&self, list: &NetConfList) -> Result<(), Error> {
        if list.version < Version::V1_1_0 {
            return Err(Error::new(
                ErrorCode::IncompatibleVersion,
                format!(
                    "STATUS needs CNI 1.1.0; network {} is {}",
                    list.name, list.version
                ),
            ));
        }
        for i in 0..list.plugins.len() {
            let name = list.plugin_type(i);
            let conf = list.plugin_config(i, None);
            self.run_plugin(
                name,
                Command::Status,
                &RuntimeConf::default(),
                conf.to_string().as_bytes(),
            )?;
        }
        Ok(())
    }

    /// Turns a plugin's "incompatible version" into a message naming the list's version
    /// and the ones the plugin supports; any other error is returned as it is.
    fn explain_version(&self, plugin: &str, list: &NetConfList, e: Error) -> Error {
        if e.code != ErrorCode::IncompatibleVersion as u32 {
            return e;
        }
        match self.plugin_versions(plugin, list.version) {
            Ok(supported) if !supported.iter().any(|v| v == list.version.as_str()) => Error::new(
                ErrorCode::IncompatibleVersion,
                format!(
                    "plugin {plugin} does not support CNI {} of network {} (it supports {})",
                    list.version,
                    list.name,
                    supported.join(", ")
                ),
            )
            .with_details(e.msg),
            _ => e,
        }
    }

    /// The versions a plugin says it supports.
    pub fn plugin_versions(&self, plugin: &str, version: Version) -> Result<Vec<String>, Error> {
        let stdin = serde_json::json!({"cniVersion": version.as_str()}).to_string();
        let out = self.run_plugin(
            plugin,
            Command::Version,
            &RuntimeConf::default(),
            stdin.as_bytes(),
        )?;
        let v: Value = serde_json::from_slice(&out).map_err(|e| {
            Error::new(
                ErrorCode::Decoding,
                format!("plugin {plugin}: unreadable VERSION answer: {e}"),
            )
        })?;
        Ok(v["supportedVersions"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Asks every plugin of the list for VERSION and refuses a list whose version one of
    /// them does not support, naming both.
    pub fn validate(&self, list: &NetConfList) -> Result<(), Error> {
        for i in 0..list.plugins.len() {
            let name = list.plugin_type(i);
            let supported = self.plugin_versions(name, list.version)?;
            if !supported.iter().any(|v| v == list.version.as_str()) {
                return Err(Error::new(
                    ErrorCode::IncompatibleVersion,
                    format!(
                        "plugin {name} does not support CNI {} of network {} (it supports {})",
                        list.version,
                        list.name,
                        supported.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cache_config_is_base64_like_libcni() {
        let e = CacheEntry {
            kind: "cniCacheV1".into(),
            container_id: "c".into(),
            config: b"{\"a\":1}".to_vec(),
            if_name: "eth0".into(),
            network_name: "n".into(),
            netns: String::new(),
            cni_args: vec![],
            capability_args: Map::new(),
            result: None,
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["config"], "eyJhIjoxfQ==");
        assert_eq!(v["ifName"], "eth0");
        let back: CacheEntry = serde_json::from_value(v).unwrap();
        assert_eq!(back.config, b"{\"a\":1}");
        for n in 0..8 {
            let bytes: Vec<u8> = (0..n).collect();
            let e2 = CacheEntry {
                config: bytes.clone(),
                ..e.clone()
            };
            let back: CacheEntry =
                serde_json::from_value(serde_json::to_value(&e2).unwrap()).unwrap();
            assert_eq!(back.config, bytes);
        }
    }

    #[test]
    fn capabilities_become_runtime_config() {
        let list = NetConfList::parse(
            json!({"cniVersion": "1.0.0", "name": "n", "plugins": [
                {"type": "portmap", "capabilities": {"portMappings": true, "bandwidth": false}}]})
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        let rt = RuntimeConf {
            capability_args:
                json!({"portMappings": [{"hostPort": 80}], "bandwidth": {}, "ips": []})
                    .as_object()
                    .unwrap()
                    .clone(),
            ..RuntimeConf::default()
        };
        let conf = Runtime::new(vec![]).plugin_config(&list, 0, &rt, None);
        assert_eq!(
            conf["runtimeConfig"],
            json!({"portMappings": [{"hostPort": 80}]})
        );
    }

    #[test]
    fn plugin_names_with_paths_are_refused() {
        let rt = Runtime::new(vec![PathBuf::from("/usr/bin")]);
        assert_eq!(rt.find("../bin/sh").unwrap_err().code, 7);
        assert!(rt
            .find("no-such-plugin-cvt")
            .unwrap_err()
            .details
            .contains("/usr/bin"));
    }
}
