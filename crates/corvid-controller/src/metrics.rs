//! The controller's metrics: requests by route and code, store commits, objects by kind,
//! and the watch feed's subscribers and lag. One set per process, as a Prometheus default
//! registry is: the store's writer thread and the request handlers reach it without
//! being handed it.

use std::sync::LazyLock;

use corvid_metrics::Endpoints;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// A request as counted: its route pattern (not its path, which holds IDs), method and
/// status code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The matched route, as `/v2.0/ports/{id}`; `unmatched` for none.
    pub route: String,
    /// The HTTP method.
    pub method: String,
    /// The status code answered.
    pub code: u16,
}

/// A route and method, for the latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// The matched route.
    pub route: String,
    /// The HTTP method.
    pub method: String,
}

/// A kind of object in the view.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// The collection: networks, subnets, ports, loadbalancers...
    pub kind: String,
}

/// Every metric the controller exports.
pub struct Metrics {
    /// Requests answered.
    pub requests: Family<RequestLabels, Counter>,
    /// How long requests took.
    pub request_seconds: Family<RouteLabels, Histogram, fn() -> Histogram>,
    /// How long a store commit took (one redb group commit, or one etcd transaction).
    pub commit_seconds: Histogram,
    /// Transactions per store commit.
    pub commit_batch: Histogram,
    /// Objects in the view by kind, set at each scrape.
    pub objects: Family<KindLabels, Gauge>,
    /// Watch requests waiting for changes now, and open watch streams.
    pub watchers: Gauge,
    /// The store revision the view has applied.
    pub view_revision: Gauge,
    /// Seconds since the view was last confirmed to hold everything the store has.
    pub view_lag_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
}

/// The process's metrics.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics {
    requests: Family::default(),
    request_seconds: Family::new_with_constructor(corvid_metrics::seconds),
    commit_seconds: corvid_metrics::seconds(),
    commit_batch: corvid_metrics::sizes(),
    objects: Family::default(),
    watchers: Gauge::default(),
    view_revision: Gauge::default(),
    view_lag_seconds: Gauge::default(),
});

fn registry() -> Registry {
    let m = &*METRICS;
    let mut r = Registry::with_prefix("corvid_controller");
    r.register("requests", "API requests answered", m.requests.clone());
    r.register(
        "request_duration_seconds",
        "How long API requests took",
        m.request_seconds.clone(),
    );
    r.register(
        "store_commit_duration_seconds",
        "How long a store commit took",
        m.commit_seconds.clone(),
    );
    r.register(
        "store_commit_batch_size",
        "Transactions folded into one store commit",
        m.commit_batch.clone(),
    );
    r.register("objects", "Objects by kind", m.objects.clone());
    r.register(
        "watch_subscribers",
        "Watch requests waiting for changes",
        m.watchers.clone(),
    );
    r.register(
        "view_revision",
        "The store revision the view has applied",
        m.view_revision.clone(),
    );
    r.register(
        "view_lag_seconds",
        "Seconds since the view was last confirmed current with the store",
        m.view_lag_seconds.clone(),
    );
    r
}

/// The endpoints: ready as `ready` says; `view` says, at each scrape, how far behind the
/// store the view may be, its revision and how many objects of each kind it holds.
pub fn endpoints(
    ready: corvid_metrics::Readiness,
    view: impl Fn() -> Option<(f64, i64, Vec<(&'static str, usize)>)> + Send + Sync + 'static,
) -> Endpoints {
    Endpoints::new(registry(), ready).refreshing(move || {
        if let Some((lag, revision, counts)) = view() {
            let m = &*METRICS;
            m.view_lag_seconds.set(lag);
            m.view_revision.set(revision);
            for (kind, n) in counts {
                m.objects
                    .get_or_create(&KindLabels { kind: kind.into() })
                    .set(n as i64);
            }
        }
    })
}

/// Counts a watch request for as long as it is held.
pub struct Watching;

impl Watching {
    /// A watch request starts waiting.
    pub fn start() -> Watching {
        METRICS.watchers.inc();
        Watching
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        METRICS.watchers.dec();
    }
}
