//! The runtime side: the networking pod (one plugin container per network) and the pods
//! whose networks it sets up, all kept under one directory.

pub mod caps;
pub mod container;
pub mod enter;
pub mod fetch;
pub mod host;
pub mod metrics;
pub mod pod;
pub mod registry;
pub mod store;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The default directory of the runtime's state.
pub const DEFAULT_DIR: &str = "/var/lib/corvid/kurma";

/// Where the runtime keeps what it knows, under one directory.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The directory.
    pub dir: PathBuf,
}

impl Layout {
    /// The layout under `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Layout {
        Layout { dir: dir.into() }
    }

    /// Unpacked images, by ID.
    pub fn images(&self) -> PathBuf {
        self.dir.join("images")
    }

    /// The network-namespace volume: one bind-mounted namespace per pod, by UUID.
    pub fn netns(&self) -> PathBuf {
        self.dir.join("netns")
    }

    /// A network's lasting plugin state, mounted at [`container::STATE_IN_CONTAINER`].
    pub fn volume(&self, network: &str) -> PathBuf {
        self.dir.join("volumes").join(network)
    }

    /// A running plugin container's own directory: its overlay's upper and work
    /// directories (or its copy of the image's root), removed with the container.
    pub fn container(&self, network: &str) -> PathBuf {
        self.dir.join("containers").join(network)
    }

    /// A network's plugin log (its main process's output, after the runtime's notes on
    /// how it was started).
    pub fn log(&self, network: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{network}.log"))
    }

    /// The pods' records.
    pub fn pods(&self) -> PathBuf {
        self.dir.join("pods")
    }

    /// What the running host publishes for `corvid kurma pod`.
    pub fn host(&self) -> PathBuf {
        self.dir.join("host.json")
    }
}

/// How a network's plugin container is doing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum PluginStatus {
    /// Its main process runs.
    Running {
        /// The main process.
        pid: u32,
        /// Its start time (clock ticks after boot), so a reused PID is never taken for it.
        started: u64,
    },
    /// Its main process exited, or it never started.
    Failed {
        /// Why.
        reason: String,
    },
}

/// A network's plugin, as the host publishes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plugin {
    /// The network.
    pub network: String,
    /// The image it runs (`sha512-...`); none when the image could not be had.
    pub image: Option<String>,
    /// Its image carries the `os/linux/privileged` isolator: all capabilities, where
    /// without it the plugin gets Kurma's default ones.
    #[serde(default)]
    pub privileged: bool,
    /// What the plugin lacks, in words, when its image has no privileged isolator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// How it is doing.
    #[serde(flatten)]
    pub status: PluginStatus,
}

/// What a running host publishes: its configuration as given, and its plugins.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostState {
    /// The configuration's text.
    pub config: String,
    /// One per network, in the configuration's order.
    pub plugins: Vec<Plugin>,
}

/// Writes `value` as JSON to `path` through a temporary file, so readers never see half.
pub fn write_json(path: &Path, value: &impl Serialize) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, serde_json::to_vec_pretty(value)?)?;
    std::fs::rename(&tmp, path)
}

/// The start time of process `pid` (field 22 of `/proc/PID/stat`), if it runs.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count after its end.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}
