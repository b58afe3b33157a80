//! The Docker driver's metrics: calls by method and outcome, and their latency.

use std::sync::LazyLock;

use corvid_metrics::Endpoints;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Every method of Docker's network and IPAM driver protocols the driver answers.
pub const METHODS: &[&str] = &[
    "Plugin.Activate",
    "NetworkDriver.GetCapabilities",
    "NetworkDriver.CreateNetwork",
    "NetworkDriver.DeleteNetwork",
    "NetworkDriver.CreateEndpoint",
    "NetworkDriver.DeleteEndpoint",
    "NetworkDriver.EndpointOperInfo",
    "NetworkDriver.Join",
    "NetworkDriver.Leave",
    "NetworkDriver.AllocateNetwork",
    "NetworkDriver.FreeNetwork",
    "NetworkDriver.DiscoverNew",
    "NetworkDriver.DiscoverDelete",
    "NetworkDriver.ProgramExternalConnectivity",
    "NetworkDriver.RevokeExternalConnectivity",
    "IpamDriver.GetCapabilities",
    "IpamDriver.GetDefaultAddressSpaces",
    "IpamDriver.RequestPool",
    "IpamDriver.ReleasePool",
    "IpamDriver.RequestAddress",
    "IpamDriver.ReleaseAddress",
];

/// How a call ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Outcome {
    /// Answered with a result.
    Ok,
    /// Answered with `{"Err": ...}`.
    Error,
}

/// A call as counted.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// The method, or `unknown` for one the driver does not answer (so a client cannot
    /// make series without end).
    pub method: &'static str,
    /// How it ended.
    pub outcome: Outcome,
}

/// The method label of a timed call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    /// The method, or `unknown`.
    pub method: &'static str,
}

/// Every metric the driver exports.
pub struct Metrics {
    /// Calls answered.
    pub calls: Family<CallLabels, Counter>,
    /// How long calls took.
    pub call_seconds: Family<MethodLabels, Histogram, fn() -> Histogram>,
}

/// The process's metrics.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics {
    calls: Family::default(),
    call_seconds: Family::new_with_constructor(corvid_metrics::seconds),
});

/// The label of `method`.
pub fn method_label(method: &str) -> &'static str {
    METHODS
        .iter()
        .find(|m| **m == method)
        .copied()
        .unwrap_or("unknown")
}

/// Records one call of `method` that took `seconds`.
pub fn called(method: &str, ok: bool, seconds: f64) {
    let method = method_label(method);
    let outcome = if ok { Outcome::Ok } else { Outcome::Error };
    METRICS
        .calls
        .get_or_create(&CallLabels { method, outcome })
        .inc();
    METRICS
        .call_seconds
        .get_or_create(&MethodLabels { method })
        .observe(seconds);
}

/// The endpoints of the driver: ready when the controller answers.
pub fn endpoints(controller: corvid_api::Client) -> Endpoints {
    let m = &*METRICS;
    let mut r = Registry::with_prefix("corvid_docker");
    r.register("calls", "Plugin calls answered", m.calls.clone());
    r.register(
        "call_duration_seconds",
        "How long plugin calls took",
        m.call_seconds.clone(),
    );
    Endpoints::new(
        r,
        Box::new(move || {
            controller
                .version()
                .map(|_| ())
                .map_err(|e| format!("the controller does not answer: {e}").into())
        }),
    )
}

corvid_metrics::label_values!(Outcome { Ok => "ok", Error => "error" });
