//! The networking pod: fetches each network's plugin image, runs one container per
//! network, publishes their PIDs for `corvid kurma pod`, and watches them (restarting,
//! with backoff, when asked) until told to stop. A network whose image cannot be had is
//! reported and left out, as Kurma logged and skipped it; the others run.

use std::io::Write;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::aci::Aci;
use crate::config::{Config, ConfigError, PodNetwork};
use crate::runtime::caps;
use crate::runtime::container::{
    self, ContainerError, Root, Spec, Volume, NETNS_IN_CONTAINER, STATE_IN_CONTAINER,
};
use crate::runtime::fetch::Fetcher;
use crate::runtime::metrics;
use crate::runtime::store::Store;
use crate::runtime::{start_time, write_json, HostState, Layout, Plugin, PluginStatus};

/// Why the host could not start.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
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
    /// None when the image could not be had: the plugin never starts.
    image: Option<Aci>,
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
        let Some(image) = &self.image else {
            return;
        };
        let name = &self.network.name;
        let spec = Spec {
            rootfs: image.rootfs.clone(),
            dir: layout.container(name),
            privileged: image.privileged,
            exec: image.exec.clone(),
            env: environment(image),
            volumes: vec![
                Volume {
                    host: layout.netns(),
                    inside: NETNS_IN_CONTAINER,
                },
                Volume {
                    host: layout.volume(name),
                    inside: STATE_IN_CONTAINER,
                },
            ],
            log: layout.log(name),
        };
        self.started_at = Instant::now();
        self.restart_at = None;
        let started = (|| -> Result<(Child, Root), ContainerError> {
            let volume = layout.volume(name);
            std::fs::create_dir_all(&volume)
                .map_err(container::step(format!("making {}", volume.display())))?;
            let logs = layout.dir.join("logs");
            std::fs::create_dir_all(&logs)
                .map_err(container::step(format!("making {}", logs.display())))?;
            let root = container::prepare(&spec)?;
            note(name, &spec, image, &root);
            let child = container::start(&spec, &root, &self.network.text)?;
            Ok((child, root))
        })();
        match started {
            Ok((child, root)) => {
                let pid = child.id();
                self.status = PluginStatus::Running {
                    pid,
                    started: start_time(pid).unwrap_or_default(),
                };
                let root = match root {
                    Root::Overlay => "overlay",
                    Root::Copy { .. } => "private copy",
                };
                tracing::info!(network = %name, pid, image = %image.id, root,
                    privileged = image.privileged, "plugin started");
                metrics::running(name);
                self.child = Some(child);
            }
            Err(e) => {
                tracing::error!(network = %name, error = %e, "plugin could not start");
                metrics::stopped(name, &format!("could not start: {e}"));
                self.status = PluginStatus::Failed {
                    reason: format!("could not start: {e}"),
                };
                self.remove_container(layout);
            }
        }
    }

    /// Removes the container's directory once its main process is gone.
    fn remove_container(&self, layout: &Layout) {
        let dir = layout.container(&self.network.name);
        if let Err(e) = container::remove(&dir) {
            tracing::warn!(network = %self.network.name, error = %e,
                "could not remove the container's directory {}", dir.display());
        }
    }

    /// Notes an exit of the main process; answers whether anything changed.
    fn check(&mut self, layout: &Layout, restart: bool) -> bool {
        let Some(child) = self.child.as_mut() else {
            return false;
        };
        let Ok(Some(status)) = child.try_wait() else {
            return false;
        };
        self.child = None;
        self.remove_container(layout);
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

    fn stop(&mut self, layout: &Layout) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let group = rustix::process::Pid::from_raw(child.id() as i32);
        if let Some(group) = group {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && !matches!(child.try_wait(), Ok(Some(_))) {
            std::thread::sleep(POLL);
        }
        if let (Ok(None), Some(group)) = (child.try_wait(), group) {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
        let _ = child.wait();
        self.remove_container(layout);
    }
}

/// Tells how the container was started, in the host's log and at the head of what the
/// plugin writes to its own: its root, and the capabilities it lacks.
fn note(network: &str, spec: &Spec, image: &Aci, root: &Root) {
    let mut lines = Vec::new();
    match root {
        Root::Overlay => lines.push(format!(
            "root: an overlay over {} (read-only), its writes in {}",
            spec.rootfs.display(),
            spec.dir.join("upper").display()
        )),
        Root::Copy { why } => {
            tracing::warn!(%network, %why, "overlayfs unavailable: the plugin's root is a private copy of its image's");
            lines.push(format!(
                "root: a private copy of {} in {} (overlayfs unavailable: {why})",
                spec.rootfs.display(),
                spec.dir.join("root").display()
            ));
        }
    }
    if image.privileged {
        lines.push(format!("capabilities: all ({})", crate::aci::PRIVILEGED));
    } else {
        let warning = caps::unprivileged_note();
        tracing::warn!(%network, image = %image.id, "{warning}");
        lines.push(format!("capabilities: {warning}"));
    }
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&spec.log)
        .and_then(|mut log| {
            let text: String = lines
                .iter()
                .map(|l| format!("corvid kurma: {network}: {l}\n"))
                .collect();
            log.write_all(text.as_bytes())
        });
    if let Err(e) = written {
        tracing::warn!(%network, error = %e, "could not write to {}", spec.log.display());
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
                image: r.image.as_ref().map(|i| i.id.clone()),
                privileged: r.image.as_ref().is_some_and(|i| i.privileged),
                warning: r
                    .image
                    .as_ref()
                    .filter(|i| !i.privileged)
                    .map(|_| caps::unprivileged_note()),
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
        let (image, status) = match fetcher.fetch(&network.aci) {
            Ok(image) => (
                Some(image),
                PluginStatus::Failed {
                    reason: "not started".into(),
                },
            ),
            Err(e) => {
                let reason = format!("its image: {e}");
                tracing::error!(network = %network.name, %reason, "network left out");
                metrics::stopped(&network.name, &reason);
                (None, PluginStatus::Failed { reason })
            }
        };
        plugins.push(Running {
            network: network.clone(),
            image,
            child: None,
            status,
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
            changed |= p.check(layout, config.settings.restart);
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
        p.stop(layout);
    }
    let _ = std::fs::remove_file(layout.host());
    tracing::info!("Kurma network host stopped");
    Ok(())
}
