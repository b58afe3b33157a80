//! The runtime side: find plugins on the plugin path, run configuration lists as the spec
//! orders (name and version injected, `prevResult` chained, capabilities passed as
//! `runtimeConfig`, DEL in reverse, a failed ADD undone), and cache each ADD's result in
//! libcni's layout so CHECK and DEL get it back after a restart.

use crate::command::Command;
use crate::config::Attachment;
use crate::conflist::NetConfList;
use crate::error::{Error, ErrorCode};
use crate::result::CniResult;
use crate::version::Version;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

/// The end of a cache entry's name while it is written.
const TEMP_SUFFIX: &str = ".tmp";

/// An attachment's cache entry name, as libcni names it.
fn cache_name(network: &str, rt: &RuntimeConf) -> String {
    format!("{network}-{}-{}", rt.container_id, rt.ifname)
}

/// Removes a cache file; one already gone is fine.
fn remove_cache_file(path: &Path) -> Result<(), Error> {
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

    /// Finds a plugin on this runtime's plugin path.
    pub fn find(&self, plugin: &str) -> Result<PathBuf, Error> {
        find_plugin(plugin, &self.plugin_dirs)
    }

    /// Runs one plugin: the spec's environment, `stdin` as configuration; kills it past the
    /// timeout. Returns what it printed on success, its CNI error otherwise.
    pub fn run_plugin(
        &self,
        plugin: &str,
        command: Command,
        rt: &RuntimeConf,
        stdin: &[u8],
    ) -> Result<Vec<u8>, Error> {
        self.invoke(plugin, command, rt, stdin)
            .map_err(|f| match f {
                Failure::NotRun(e) => e,
                Failure::Failed(e) => plugin_error(plugin, e),
            })
    }

    /// The one way corvid execs a plugin, for the runtime side and for a plugin delegating
    /// to another (its IPAM) alike: found on the plugin path, CNI_* from `rt`, the rest of
    /// the environment inherited, killed with us and past the timeout.
    pub fn invoke(
        &self,
        plugin: &str,
        command: Command,
        rt: &RuntimeConf,
        stdin: &[u8],
    ) -> Result<Vec<u8>, Failure> {
        let exe = self.find(plugin).map_err(Failure::NotRun)?;
        let path = std::env::join_paths(&self.plugin_dirs).unwrap_or_default();
        let args: Vec<String> = rt.args.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut cmd = std::process::Command::new(&exe);
        // A plugin must not outlive its caller: orphaned, an IPAM could allocate after
        // the runtime's DEL.
        // SAFETY: the closure only makes the prctl system call, which is async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                rustix::process::set_parent_process_death_signal(Some(
                    rustix::process::Signal::KILL,
                ))
                .map_err(std::io::Error::from)
            });
        }
        let mut child = cmd
            .env("CNI_COMMAND", command.as_str())
            .env("CNI_CONTAINERID", &rt.container_id)
            .env("CNI_NETNS", &rt.netns)
            .env("CNI_IFNAME", &rt.ifname)
            .env("CNI_ARGS", args.join(";"))
            .env("CNI_PATH", path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| {
                Failure::NotRun(Error::new(
                    ErrorCode::Io,
                    format!("plugin {plugin} could not be started: {e}"),
                ))
            })?;
        let mut input = child.stdin.take().expect("piped");
        let mut output = child.stdout.take().expect("piped");
        let config = stdin.to_vec();
        let (tx, rx) = mpsc::channel();
        // A plugin that never reads or never exits must not hang us: I/O happens on a
        // helper thread and we wait for it with the timeout.
        std::thread::spawn(move || {
            let _ = input.write_all(&config);
            drop(input);
            let mut out = Vec::new();
            let read = output.read_to_end(&mut out).map(|_| out);
            let _ = tx.send(read);
        });
        let io = |e: std::io::Error| {
            Failure::NotRun(Error::new(ErrorCode::Io, format!("plugin {plugin}: {e}")))
        };
        let out = match rx.recv_timeout(self.timeout) {
            Ok(read) => read.map_err(io)?,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Failure::NotRun(Error::new(
                    ErrorCode::TryAgainLater,
                    format!(
                        "plugin {plugin} did not finish {command} within {:?}; killed",
                        self.timeout
                    ),
                )));
            }
        };
        let status = child.wait().map_err(io)?;
        if status.success() {
            return Ok(out);
        }
        Err(Failure::Failed(
            Error::from_plugin_output(&out).unwrap_or_else(|| {
                Error::new(
                    ErrorCode::Decoding,
                    format!("failed ({status}) and printed no CNI error"),
                )
                .with_details(String::from_utf8_lossy(&out).into_owned())
            }),
        ))
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

    fn cache_path(&self, network: &str, rt: &RuntimeConf) -> PathBuf {
        self.cache_dir.join(cache_name(network, rt))
    }

    /// Where an entry is written before its rename: named after the attachment, so a
    /// runtime killed between the two leaves a file that the attachment's DEL removes.
    fn cache_temp_path(&self, network: &str, rt: &RuntimeConf) -> PathBuf {
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

    fn write_cache(
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

    /// Removes the network's cache files that no valid attachment owns and that cannot
    /// be read (empty or torn by a killed runtime), and temporary files left by one.
    fn sweep_unreadable(&self, network: &str, valid: &[Attachment]) -> Result<(), Error> {
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

/// Finds a plugin in `dirs` (CNI_PATH order); its name must not hold a path separator.
pub fn find_plugin(plugin: &str, dirs: &[PathBuf]) -> Result<PathBuf, Error> {
    if plugin.is_empty() || plugin.contains('/') {
        return Err(Error::new(
            ErrorCode::InvalidNetworkConfig,
            format!("invalid plugin type \"{plugin}\""),
        ));
    }
    dirs.iter()
        .map(|d| d.join(plugin))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::new(
                ErrorCode::InvalidNetworkConfig,
                format!("failed to find plugin \"{plugin}\" in path"),
            )
            .with_details(
                dirs.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(":"),
            )
        })
}

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
