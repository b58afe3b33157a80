//! The agent's metrics (reconcile passes and their duration, ports plugged, errors by
//! kind, datapath objects) and its readiness: registered with the controller and following
//! its watch feed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use corvid_metrics::Endpoints;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Which reconcile pass ran.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Pass {
    /// Everything compared, the kernel's links listed.
    Full,
    /// Only what the watch feed changed.
    Changes,
}

/// What failed.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum ErrorKind {
    /// Registering or loading from the controller.
    Controller,
    /// Following the watch feed.
    Watch,
    /// The watch feed refused to resume from the revision the lists were read at.
    FeedStart,
    /// Bringing up a network's bridge and VXLAN device.
    Network,
    /// Plugging a port.
    Plug,
    /// Removing a link no port or network needs.
    Unlink,
    /// The overlay's forwarding entries.
    Overlay,
    /// The masquerade chain.
    Masquerade,
    /// Letting corvid's bridges through iptables' FORWARD.
    Forwarding,
    /// The filter of which networks route to which.
    Routing,
    /// Service VIPs and floating IPs.
    Services,
    /// The security groups' filter.
    SecurityGroups,
    /// Reporting a port's status.
    Report,
    /// Listing the host's links.
    Datapath,
}

/// A kind of datapath object the agent owns.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Object {
    /// Networks brought up on this host.
    Networks,
    /// Ports bound to this host.
    Ports,
    /// Links the agent owns (bridges, VXLAN devices, veths).
    Links,
    /// Services (listeners) programmed.
    Services,
}

/// The label set of a pass.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PassLabels {
    /// The kind of pass.
    pub kind: Pass,
}

/// The label set of an error.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// What failed.
    pub kind: ErrorKind,
}

/// The label set of a datapath object count.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectLabels {
    /// The kind of object.
    pub kind: Object,
}

/// Every metric the agent exports.
pub struct Metrics {
    /// Reconcile passes run.
    pub passes: Family<PassLabels, Counter>,
    /// How long they took.
    pub pass_seconds: Family<PassLabels, Histogram, fn() -> Histogram>,
    /// Veth pairs made (new, remade or finished) for ports.
    pub plugs: Counter,
    /// Failures by kind.
    pub errors: Family<ErrorLabels, Counter>,
    /// Datapath objects by kind, after the last pass.
    pub objects: Family<ObjectLabels, Gauge>,
}

/// The process's metrics.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics {
    passes: Family::default(),
    pass_seconds: Family::new_with_constructor(corvid_metrics::seconds),
    plugs: Counter::default(),
    errors: Family::default(),
    objects: Family::default(),
});

/// Counts one failure of `kind`.
pub fn failed(kind: ErrorKind) {
    METRICS.errors.get_or_create(&ErrorLabels { kind }).inc();
}

/// Sets the gauge of datapath objects of `kind`.
pub fn objects(kind: Object, n: usize) {
    METRICS
        .objects
        .get_or_create(&ObjectLabels { kind })
        .set(n as i64);
}

/// Records one reconcile pass of `kind` that started at `started`.
pub fn pass(kind: Pass, started: Instant) {
    let m = &*METRICS;
    m.passes
        .get_or_create(&PassLabels { kind: kind.clone() })
        .inc();
    m.pass_seconds
        .get_or_create(&PassLabels { kind })
        .observe(started.elapsed().as_secs_f64());
}

/// Whether the agent is registered and following the controller.
#[derive(Default)]
pub struct Health {
    synced: AtomicBool,
    /// Why the watch feed cannot be followed, until it answers again.
    stalled: std::sync::Mutex<Option<String>>,
    /// Milliseconds after `since` of the last answer from the controller.
    contact: AtomicU64,
    since: std::sync::OnceLock<Instant>,
}

/// The longest silence from the controller that still counts as following it: a watch
/// request waits up to 20 s, and a retry may follow.
const SILENCE: Duration = Duration::from_secs(45);

impl Health {
    fn start(&self) -> Instant {
        *self.since.get_or_init(Instant::now)
    }

    /// The host is registered and the controller's state loaded.
    pub fn synced(&self) {
        self.synced.store(true, Ordering::Relaxed);
        self.heard();
    }

    /// The watch feed answered: whatever stalled it is over.
    pub fn following(&self) {
        self.heard();
        *self.stalled.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The watch feed cannot be followed, for `why`: not ready until it answers.
    pub fn stalled(&self, why: String) {
        *self.stalled.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
    }

    /// The controller answered just now.
    pub fn heard(&self) {
        let ms = self.start().elapsed().as_millis() as u64;
        self.contact.store(ms, Ordering::Relaxed);
    }

    /// When the controller last answered (when the agent started, if it has not).
    pub fn last_contact(&self) -> std::time::SystemTime {
        let last = Duration::from_millis(self.contact.load(Ordering::Relaxed));
        std::time::SystemTime::now() - self.start().elapsed().saturating_sub(last)
    }

    /// Ready, or why not.
    pub fn ready(&self) -> Result<(), corvid_metrics::NotReady> {
        if !self.synced.load(Ordering::Relaxed) {
            return Err("not yet registered with the controller and synced".into());
        }
        if let Some(why) = &*self.stalled.lock().unwrap_or_else(|p| p.into_inner()) {
            return Err(why.as_str().into());
        }
        let last = Duration::from_millis(self.contact.load(Ordering::Relaxed));
        let silent = self.start().elapsed().saturating_sub(last);
        if silent > SILENCE {
            return Err(format!("no answer from the controller for {} s", silent.as_secs()).into());
        }
        Ok(())
    }
}

/// The endpoints of the agent whose health is `health`.
pub fn endpoints(health: Arc<Health>) -> Endpoints {
    let m = &*METRICS;
    let mut r = Registry::with_prefix("corvid_agent");
    r.register("reconcile_passes", "Reconcile passes run", m.passes.clone());
    r.register(
        "reconcile_duration_seconds",
        "How long reconcile passes took",
        m.pass_seconds.clone(),
    );
    r.register(
        "ports_plugged",
        "Veth pairs made for ports (new, remade or finished)",
        m.plugs.clone(),
    );
    r.register("errors", "Failures by kind", m.errors.clone());
    r.register(
        "datapath_objects",
        "Datapath objects by kind after the last pass",
        m.objects.clone(),
    );
    Endpoints::new(r, Box::new(move || health.ready()))
}

corvid_metrics::label_values!(Pass { Full => "full", Changes => "changes" });

corvid_metrics::label_values!(ErrorKind { Controller => "controller", Watch => "watch", FeedStart => "feed_start", Network => "network", Plug => "plug", Unlink => "unlink", Overlay => "overlay", Masquerade => "masquerade", Forwarding => "forwarding", Routing => "routing", Services => "services", SecurityGroups => "security_groups", Report => "report", Datapath => "datapath" });

corvid_metrics::label_values!(Object { Networks => "networks", Ports => "ports", Links => "links", Services => "services" });
