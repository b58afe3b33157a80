//! The networking pod: fetches each network's plugin image, runs one container per
//! network, publishes their PIDs for `corvid kurma pod`, and watches them (restarting,
//! with backoff, when asked) until told to stop.

use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::aci::Aci;
use crate::config::{Config, ConfigError, PodNetwork};
use crate::runtime::container::{self, Spec, Volume, NETNS_IN_CONTAINER, STATE_IN_CONTAINER};
use crate::runtime::fetch::Fetcher;
use crate::runtime::metrics;
use crate::runtime::store::{Store, StoreError};
use crate::runtime::{start_time, write_json, HostState, Layout, Plugin, PluginStatus};

/// Why the host could not start.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A network's image.
    #[error("network {network}: {source}")]
    Image {
        /// Which network.
        network: String,
        /// Why.
        source: StoreError,
    },
    /// Another host runs on the same directory.
    #[error("a Kurma network host already runs on {} (plugin pid {pid})", dir.display())]
    Running {
        /// The directory.
        dir: std::path::PathBuf,
        /// One of its plugins.
        pid: u32,
    },
    /// The host's directories or state file.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why.
        source: std::io::Error,
    },
}

/// The slowest a failed plugin is restarted.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// How often the host looks at its plugins.
const POLL: Duration = Duration::from_millis(50);

/// One network's container as the host runs it.
struct Running {
    network: PodNetwork,
    image: Aci,
    child: Option<Child>,
    status: PluginStatus,
    started_at: Instant,
    backoff: Duration,
    restart_at: Option<Instant>,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> HostError {
    let what = what.into();
    move |source| HostError::Io { what, source }
}

/// The manifest's `app.environment`.
fn environment(image: &Aci) -> Vec<(String, String)> {
    image.manifest["app"]["environment"]
        .as_array()
        .map(|list| {
            list.iter()
                .filter_map(|e| Some((e["name"].as_str()?.into(), e["value"].as_str()?.into())))
                .collect()
        })
        .unwrap_or_default()
}

impl Running {
    fn start(&mut self, layout: &Layout) {
        let spec = Spec {
            rootfs: self.image.rootfs.clone(),
            exec: self.image.exec.clone(),
            env: environment(&self.image),
            volumes: vec![
                Volume {
                    host: layout.netns(),
                    inside: NETNS_IN_CONTAINER,
                },
                Volume {
                    host: layout.volume(&self.network.name),
                    inside: STATE_IN_CONTAINER,
                },
            ],
            log: layout.log(&self.network.name),
        };
        let name = &self.network.name;
        let started = std::fs::create_dir_all(layout.volume(name))
            .and_then(|()| std::fs::create_dir_all(layout.dir.join("logs")))
            .and_then(|()| container::start(&spec, &self.network.text));
        self.started_at = Instant::now();
        self.restart_at = None;
        match started {
            Ok(child) => {
                let pid = child.id();
                self.status = PluginStatus::Running {
                    pid,
                    started: start_time(pid).unwrap_or_default(),
                };
                tracing::info!(network = %name, pid, image = %self.image.id, "plugin started");
                metrics::running(name);
                self.child = Some(child);
            }
            Err(e) => {
                tracing::error!(network = %name, error = %e, "plugin could not start");
                metrics::stopped(name, &format!("could not start: {e}"));
                self.status = PluginStatus::Failed {
                    reason: format!("could not start: {e}"),
                };
            }
        }
    }

    /// Notes an exit of the main process; answers whether anything changed.
    fn check(&mut self, restart: bool) -> bool {
        let Some(child) = self.child.as_mut() else {
            return false;
        };
        let Ok(Some(status)) = child.try_wait() else {
            return false;
        };
        self.child = None;
        let reason = format!("its main process exited with {status}");
        tracing::error!(network = %self.network.name, %reason, "plugin failed");
        metrics::exited(&self.network.name);
        metrics::stopped(&self.network.name, &reason);
        self.status = PluginStatus::Failed { reason };
        if restart {
            // A plugin that ran a while is not failing in a loop: start the backoff over.
            if self.started_at.elapsed() > MAX_BACKOFF * 2 {
                self.backoff = Duration::from_secs(1);
            }
            self.restart_at = Some(Instant::now() + self.backoff);
            self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        }
        true
    }

    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let group = rustix::process::Pid::from_raw(child.id() as i32);
        if let Some(group) = group {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(POLL);
        }
        if let Some(group) = group {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
        let _ = child.wait();
    }
}

/// The state the host publishes.
fn publish(layout: &Layout, text: &str, plugins: &[Running]) -> Result<(), HostError> {
    let state = HostState {
        config: text.to_string(),
        plugins: plugins
            .iter()
            .map(|r| Plugin {
                network: r.network.name.clone(),
                image: Some(r.image.id.clone()),
                status: r.status.clone(),
            })
            .collect(),
    };
    write_json(&layout.host(), &state).map_err(io(layout.host().display().to_string()))
}

/// Refuses to start beside a host that still runs plugins on the same directory.
fn check_alone(layout: &Layout) -> Result<(), HostError> {
    let Ok(bytes) = std::fs::read(layout.host()) else {
        return Ok(());
    };
    let Ok(state) = serde_json::from_slice::<HostState>(&bytes) else {
        return Ok(());
    };
    for p in state.plugins {
        if let PluginStatus::Running { pid, started } = p.status {
            if start_time(pid) == Some(started) {
                return Err(HostError::Running {
                    dir: layout.dir.clone(),
                    pid,
                });
            }
        }
    }
    Ok(())
}

/// Runs the networking pod of configuration `text` until `stop` is set; then stops the
/// plugins and withdraws the published state (pods keep their namespaces and records).
pub fn run(layout: &Layout, text: &str, stop: &AtomicBool) -> Result<(), HostError> {
    let config = Config::parse(text)?;
    check_alone(layout)?;
    let netns = layout.netns();
    std::fs::create_dir_all(&netns).map_err(io(netns.display().to_string()))?;
    // Namespaces bound here later must reach containers started now.
    corvid_net::netns::share_mount_point(&netns)
        .map_err(io(format!("make {} a shared mount point", netns.display())))?;
    let store = Store::new(layout.images());
    let fetcher = Fetcher {
        store: &store,
        settings: &config.settings.fetch,
    };
    let mut plugins = Vec::new();
    for network in &config.networks {
        let image = fetcher
            .fetch(&network.aci)
            .map_err(|source| HostError::Image {
                network: network.name.clone(),
                source,
            })?;
        plugins.push(Running {
            network: network.clone(),
            image,
            child: None,
            status: PluginStatus::Failed {
                reason: "not started".into(),
            },
            started_at: Instant::now(),
            backoff: Duration::from_secs(1),
            restart_at: None,
        });
    }
    for p in &mut plugins {
        p.start(layout);
    }
    publish(layout, text, &plugins)?;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(POLL);
        let mut changed = false;
        for p in &mut plugins {
            changed |= p.check(config.settings.restart);
            if p.restart_at.is_some_and(|at| Instant::now() >= at) {
                tracing::info!(network = %p.network.name, "restarting the plugin");
                metrics::restarted(&p.network.name);
                p.start(layout);
                changed = true;
            }
        }
        if changed {
            publish(layout, text, &plugins)?;
        }
    }
    for p in &mut plugins {
        p.stop();
    }
    let _ = std::fs::remove_file(layout.host());
    tracing::info!("Kurma network host stopped");
    Ok(())
}
