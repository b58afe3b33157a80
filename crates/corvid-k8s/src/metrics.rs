//! The watcher's metrics (events handled, how long a pod waits for its annotation,
//! sweeps, leadership) and its readiness.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::LazyLock;

use corvid_metrics::Endpoints;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The kind of object an event was about.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Kind {
    /// A namespace.
    Namespace,
    /// A pod.
    Pod,
    /// A service.
    Service,
    /// A NetworkPolicy.
    NetworkPolicy,
}

/// The label set of events and sweeps.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// What the event or sweep was about.
    pub kind: Kind,
}

/// Every metric the watcher exports.
pub struct Metrics {
    /// Watch events handled.
    pub events: Family<KindLabels, Counter>,
    /// From taking up a pod to its annotation written.
    pub annotation_seconds: Histogram,
    /// Sweeps of what missed deletions left (namespaces' ports and networks; services).
    pub sweeps: Family<KindLabels, Counter>,
    /// 1 while this instance holds the lease.
    pub leader: Gauge,
}

/// The process's metrics.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics {
    events: Family::default(),
    annotation_seconds: corvid_metrics::seconds(),
    sweeps: Family::default(),
    leader: Gauge::default(),
});

/// Counts one event about `kind`.
pub fn event(kind: Kind) {
    METRICS.events.get_or_create(&KindLabels { kind }).inc();
}

/// Counts one sweep of `kind`.
pub fn sweep(kind: Kind) {
    METRICS.sweeps.get_or_create(&KindLabels { kind }).inc();
}

/// Where the watcher is in its life, for `/readyz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Reaching the API server.
    Connecting = 0,
    /// Another instance leads; this one waits to take over.
    Standby = 1,
    /// Leading, making the pod pool and the default networks.
    SettingUp = 2,
    /// Leading and following the watches.
    Watching = 3,
}

static PHASE: AtomicU8 = AtomicU8::new(Phase::Connecting as u8);

/// The watcher is now in `phase`.
pub fn phase(phase: Phase) {
    PHASE.store(phase as u8, Ordering::Relaxed);
    METRICS.leader.set(i64::from(matches!(
        phase,
        Phase::SettingUp | Phase::Watching
    )));
}

/// Ready while watching or standing by, which is what a Deployment of several watchers
/// needs to roll: a standby can take over.
fn ready() -> Result<(), corvid_metrics::NotReady> {
    match PHASE.load(Ordering::Relaxed) {
        0 => Err("connecting to the API server".into()),
        2 => Err("setting up the pod network".into()),
        _ => Ok(()),
    }
}

/// The watcher's endpoints.
pub fn endpoints() -> Endpoints {
    let m = &*METRICS;
    let mut r = Registry::with_prefix("corvid_kube");
    r.register("events", "Watch events handled", m.events.clone());
    r.register(
        "annotation_duration_seconds",
        "From taking up a pod to its corvid.io/port annotation written",
        m.annotation_seconds.clone(),
    );
    r.register(
        "sweeps",
        "Sweeps of what missed deletions left",
        m.sweeps.clone(),
    );
    r.register(
        "leader",
        "1 while this instance holds the lease",
        m.leader.clone(),
    );
    Endpoints::new(r, Box::new(ready))
}

corvid_metrics::label_values!(Kind { Namespace => "namespace", Pod => "pod", Service => "service", NetworkPolicy => "networkpolicy" });
