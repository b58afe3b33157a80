//! What the runtime does for a pod: a network namespace bound under the volume, then
//! `/opt/network/add` in each of its networks' plugin containers at once; on teardown,
//! `del` in each, every failure reported and the teardown carried on.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::{self, Config, FailurePolicy, PodNetwork};
use crate::invoke::{self, Action, InvokeError};
use crate::runtime::container::NETNS_IN_CONTAINER;
use crate::runtime::enter::{self, CallError};
use crate::runtime::{start_time, write_json, HostState, Layout, Plugin, PluginStatus};

/// Why a pod's networks could not be set up or listed.
#[derive(Debug, thiserror::Error)]
pub enum PodError {
    /// The UUID cannot name a file.
    #[error("pod UUID {0:?}: use letters, digits and dashes (at most 64)")]
    Uuid(String),
    /// No host runs (or ran) in this directory.
    #[error("no Kurma network host in {}: start `corvid kurma run-networks` first ({source})", dir.display())]
    NoHost {
        /// The runtime's directory.
        dir: PathBuf,
        /// Why its state could not be read.
        source: std::io::Error,
    },
    /// The host's state or the configuration in it is unreadable.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// The pod is set up already.
    #[error("pod {0} already has its networks; del it first")]
    Exists(String),
    /// Under the `fail` policy, a network failed; the others were taken down again.
    #[error("pod {uuid}: {failures}")]
    Failed {
        /// The pod.
        uuid: String,
        /// Each failed network and why.
        failures: String,
    },
    /// The namespace or the record.
    #[error("pod {uuid}: {message}")]
    Io {
        /// The pod.
        uuid: String,
        /// What failed.
        message: String,
    },
}

/// Why one network's add or del did not go through; the pod's record keeps it as text.
#[derive(Debug, thiserror::Error)]
enum NetworkError {
    /// The host runs no container for the network.
    #[error("the host runs no plugin for {0}")]
    NoPlugin(String),
    /// The container's main process is gone (its PID may be another's now).
    #[error("{network}'s plugin container (pid {pid}) is no longer running")]
    Gone { network: String, pid: u32 },
    /// The container could not start, or it stopped.
    #[error("{network}'s plugin failed: {reason}")]
    PluginFailed { network: String, reason: String },
    /// The call in the container.
    #[error(transparent)]
    Call(CallError),
    /// The call failed in a container the host warned about: most likely why (EPERM on
    /// setns, say), so it comes with every failure of such a plugin.
    #[error("{source} ({warning})")]
    Warned { source: CallError, warning: String },
    /// The thread that made the call panicked.
    #[error("the call panicked")]
    Panicked,
    /// What add answered is no result.
    #[error(transparent)]
    Result(InvokeError),
}

/// How one of a pod's networks ended up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum Outcome {
    /// `add` is running (a record left so means the runtime died during it).
    Adding,
    /// `add` answered this result (the `ip4`/`ip6` form).
    Added {
        /// The result.
        result: Value,
    },
    /// `add` failed; the pod runs without this network.
    Failed {
        /// Why.
        error: String,
    },
}

/// One network of a pod.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attachment {
    /// The network.
    pub network: String,
    /// The interface given to its plugin, if the network names one.
    pub interface: Option<String>,
    /// How it went.
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// A pod and its networks, as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodRecord {
    /// The pod's UUID.
    pub uuid: String,
    /// Its network namespace on the host.
    pub netns: PathBuf,
    /// Its networks.
    pub networks: Vec<Attachment>,
}

/// A pod UUID usable as a file name.
fn check_uuid(uuid: &str) -> Result<(), PodError> {
    let ok = !uuid.is_empty()
        && uuid.len() <= 64
        && uuid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !uuid.starts_with('-');
    ok.then_some(())
        .ok_or_else(|| PodError::Uuid(uuid.to_string()))
}

/// The running host's state and configuration.
fn host(layout: &Layout) -> Result<(HostState, Config), PodError> {
    let no_host = |source| PodError::NoHost {
        dir: layout.dir.clone(),
        source,
    };
    let text = std::fs::read_to_string(layout.host()).map_err(no_host)?;
    let state: HostState = serde_json::from_str(&text)
        .map_err(|e| no_host(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
    let config = Config::parse(&state.config)?;
    Ok((state, config))
}

/// The running plugin container of `network`: its main PID and the plugin as published.
fn plugin<'a>(state: &'a HostState, network: &str) -> Result<(u32, &'a Plugin), NetworkError> {
    let plugin = state
        .plugins
        .iter()
        .find(|p| p.network == network)
        .ok_or_else(|| NetworkError::NoPlugin(network.to_string()))?;
    match &plugin.status {
        PluginStatus::Running { pid, started } if start_time(*pid) == Some(*started) => {
            Ok((*pid, plugin))
        }
        PluginStatus::Running { pid, .. } => Err(NetworkError::Gone {
            network: network.to_string(),
            pid: *pid,
        }),
        PluginStatus::Failed { reason } => Err(NetworkError::PluginFailed {
            network: network.to_string(),
            reason: reason.clone(),
        }),
    }
}

/// The arguments of add and del: the namespace as the plugin sees it, the pod, the
/// interface.
fn arguments(uuid: &str, interface: &Option<String>) -> Vec<String> {
    let mut args = vec![format!("{NETNS_IN_CONTAINER}/{uuid}"), uuid.to_string()];
    args.extend(interface.clone());
    args
}

fn record_path(layout: &Layout, uuid: &str) -> PathBuf {
    layout.pods().join(format!("{uuid}.json"))
}

/// Calls `action` for each attachment in its network's plugin, all at once.
fn call_all(
    state: &HostState,
    config: &Config,
    uuid: &str,
    action: Action,
    attachments: &[(&PodNetwork, Option<String>)],
) -> Vec<Result<Vec<u8>, NetworkError>> {
    std::thread::scope(|s| {
        let calls: Vec<_> = attachments
            .iter()
            .map(|(network, interface)| {
                s.spawn(move || {
                    let (pid, plugin) = plugin(state, &network.name)?;
                    enter::call(
                        pid,
                        plugin.privileged,
                        action,
                        &arguments(uuid, interface),
                        &network.text,
                        config.settings.timeout,
                    )
                    .map_err(|source| match &plugin.warning {
                        Some(warning) => NetworkError::Warned {
                            source,
                            warning: warning.clone(),
                        },
                        None => NetworkError::Call(source),
                    })
                })
            })
            .collect();
        calls
            .into_iter()
            .map(|c| c.join().unwrap_or(Err(NetworkError::Panicked)))
            .collect()
    })
}

/// Sets up pod `uuid`'s networks: those named, or the defaults when `named` is empty.
pub fn add(layout: &Layout, uuid: &str, named: &[String]) -> Result<PodRecord, PodError> {
    check_uuid(uuid)?;
    let (state, config) = host(layout)?;
    let networks = config::networks_for(named, &config.networks)?;
    let path = record_path(layout, uuid);
    if path.exists() {
        return Err(PodError::Exists(uuid.to_string()));
    }
    let io = |message: String| PodError::Io {
        uuid: uuid.to_string(),
        message,
    };
    let mut taken = vec!["lo".to_string()];
    let mut attachments = Vec::new();
    for network in networks {
        let interface = match &network.container_interface {
            Some(template) => {
                let name = config::interface_name(template, uuid, &taken, random_hex)?;
                taken.push(name.clone());
                Some(name)
            }
            None => None,
        };
        attachments.push((network, interface));
    }
    let netns = corvid_net::Netns::create_in(&layout.netns(), uuid)
        .map_err(|e| io(format!("its network namespace: {e}")))?;
    let mut record = PodRecord {
        uuid: uuid.to_string(),
        netns: netns.clone(),
        networks: attachments
            .iter()
            .map(|(n, interface)| Attachment {
                network: n.name.clone(),
                interface: interface.clone(),
                outcome: Outcome::Adding,
            })
            .collect(),
    };
    if let Err(e) = write_json(&path, &record) {
        let _ = corvid_net::Netns::delete_path(&netns);
        return Err(io(format!("its record {}: {e}", path.display())));
    }
    let results = call_all(&state, &config, uuid, Action::Add, &attachments);
    let mut failures = Vec::new();
    for ((attachment, (network, _)), result) in
        record.networks.iter_mut().zip(&attachments).zip(results)
    {
        attachment.outcome = match result.and_then(|out| {
            invoke::kurma_result(&out, &Value::Object(network.entry.clone()))
                .map_err(NetworkError::Result)
        }) {
            Ok(result) => {
                tracing::info!(pod = uuid, network = %network.name, "network added");
                Outcome::Added { result }
            }
            Err(error) => {
                tracing::warn!(pod = uuid, network = %network.name, %error, "network add failed");
                failures.push(format!("{}: {error}", network.name));
                Outcome::Failed {
                    error: error.to_string(),
                }
            }
        };
    }
    if !failures.is_empty() && config.settings.failure == FailurePolicy::Fail {
        let _ = del(layout, uuid);
        return Err(PodError::Failed {
            uuid: uuid.to_string(),
            failures: failures.join("; "),
        });
    }
    write_json(&path, &record).map_err(|e| io(format!("its record {}: {e}", path.display())))?;
    Ok(record)
}

/// Takes pod `uuid`'s networks down; answers each network's failure (the teardown goes
/// on past them). A pod with no record has nothing to take down.
pub fn del(layout: &Layout, uuid: &str) -> Result<Vec<String>, PodError> {
    check_uuid(uuid)?;
    let path = record_path(layout, uuid);
    let netns = layout.netns().join(uuid);
    let record: Option<PodRecord> = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    let mut failures = Vec::new();
    if let Some(record) = &record {
        let (state, config) = host(layout)?;
        let mut attachments = Vec::new();
        let mut added = Vec::new();
        for a in &record.networks {
            match config.networks.iter().find(|n| n.name == a.network) {
                Some(network) => {
                    attachments.push((network, a.interface.clone()));
                    added.push(!matches!(a.outcome, Outcome::Failed { .. }));
                }
                None => failures.push(format!(
                    "{}: no longer in the host's configuration",
                    a.network
                )),
            }
        }
        let results = call_all(&state, &config, uuid, Action::Del, &attachments);
        for (((network, _), result), added) in attachments.iter().zip(results).zip(added) {
            match result {
                Ok(_) => tracing::info!(pod = uuid, network = %network.name, "network deleted"),
                // What a failed add left is undone if its plugin can; nothing else is owed.
                Err(error) if !added => {
                    tracing::info!(pod = uuid, network = %network.name, %error, "del after a failed add")
                }
                Err(error) => {
                    tracing::warn!(pod = uuid, network = %network.name, %error, "network del failed");
                    failures.push(format!("{}: {error}", network.name));
                }
            }
        }
    }
    if let Err(e) = corvid_net::Netns::delete_path(&netns) {
        failures.push(format!("its network namespace: {e}"));
    }
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            failures.push(format!("its record {}: {e}", path.display()))
        }
        _ => {}
    }
    Ok(failures)
}

/// The recorded pods, by UUID.
pub fn list(layout: &Layout) -> Result<Vec<PodRecord>, PodError> {
    let dir = layout.pods();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(PodError::Io {
                uuid: "*".into(),
                message: format!("{}: {e}", dir.display()),
            })
        }
    };
    let mut pods: Vec<PodRecord> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
        .collect();
    pods.sort_by(|a, b| a.uuid.cmp(&b.uuid));
    Ok(pods)
}

/// `n` random hex digits from the kernel.
fn random_hex(n: usize) -> String {
    let mut bytes = vec![0u8; n.div_ceil(2)];
    // Without the kernel's randomness the name is still checked against the taken ones.
    let _ = getrandom::fill(&mut bytes);
    bytes
        .iter()
        .flat_map(|b| [b >> 4, b & 15])
        .take(n)
        .map(|d| char::from_digit(d as u32, 16).unwrap_or('0'))
        .collect()
}
