//! The Kurma host's metrics (plugins running, exits and restarts by network) and its
//! readiness: every network's plugin is running.

use std::collections::BTreeMap;
use std::sync::{LazyLock, Mutex};

use corvid_metrics::Endpoints;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// A network's plugin.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NetworkLabels {
    /// The network's name.
    pub network: String,
}

/// Every metric the host exports.
pub struct Metrics {
    /// 1 while the network's plugin runs.
    pub running: Family<NetworkLabels, Gauge>,
    /// Exits of plugins' main processes.
    pub exits: Family<NetworkLabels, Counter>,
    /// Plugins started again after an exit.
    pub restarts: Family<NetworkLabels, Counter>,
}

/// The process's metrics.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics {
    running: Family::default(),
    exits: Family::default(),
    restarts: Family::default(),
});

/// Why each network's plugin is not running, by network (empty reason: running).
static STATE: Mutex<BTreeMap<String, String>> = Mutex::new(BTreeMap::new());

fn labels(network: &str) -> NetworkLabels {
    NetworkLabels {
        network: network.to_string(),
    }
}

/// `network`'s plugin runs.
pub fn running(network: &str) {
    METRICS.running.get_or_create(&labels(network)).set(1);
    let mut state = STATE.lock().unwrap_or_else(|p| p.into_inner());
    state.insert(network.to_string(), String::new());
}

/// `network`'s plugin does not run, for `reason`.
pub fn stopped(network: &str, reason: &str) {
    METRICS.running.get_or_create(&labels(network)).set(0);
    let mut state = STATE.lock().unwrap_or_else(|p| p.into_inner());
    state.insert(network.to_string(), reason.to_string());
}

/// Counts an exit of `network`'s plugin.
pub fn exited(network: &str) {
    METRICS.exits.get_or_create(&labels(network)).inc();
}

/// Counts a restart of `network`'s plugin.
pub fn restarted(network: &str) {
    METRICS.restarts.get_or_create(&labels(network)).inc();
}

fn ready() -> Result<(), corvid_metrics::NotReady> {
    let state = STATE.lock().unwrap_or_else(|p| p.into_inner());
    if state.is_empty() {
        return Err("no plugin started yet".into());
    }
    let down: Vec<String> = state
        .iter()
        .filter(|(_, why)| !why.is_empty())
        .map(|(network, why)| format!("{network}: {why}"))
        .collect();
    if down.is_empty() {
        Ok(())
    } else {
        Err(down.join("; ").into())
    }
}

/// The host's endpoints.
pub fn endpoints() -> Endpoints {
    let m = &*METRICS;
    let mut r = Registry::with_prefix("corvid_kurma");
    r.register(
        "plugin_running",
        "1 while the network's plugin runs",
        m.running.clone(),
    );
    r.register(
        "plugin_exits",
        "Exits of plugins' main processes",
        m.exits.clone(),
    );
    r.register(
        "plugin_restarts",
        "Plugins started again after an exit",
        m.restarts.clone(),
    );
    Endpoints::new(r, Box::new(ready))
}
