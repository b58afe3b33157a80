//! Requests that arrive while the controller loads its view. The port is bound before the
//! load, so a client that connects during it (an agent whose controller restarted, a CNI
//! ADD) waits for the view instead of being refused and backing off: at 100,000 ports the
//! load takes seconds, and a thousand agents each sleeping their backoff after it ended
//! would add up to two more.

use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tokio::sync::watch;
use tower::ServiceExt;

use crate::controller::Controller;
use crate::error::NeutronError;

/// How long a request waits for the view before it is answered 503. Longer than a load
/// of 100,000 ports through etcd's gateway on a busy machine; a client that gave up
/// earlier simply asks again.
const WAIT: Duration = Duration::from_secs(30);

/// Where the controller is in its life, as the requests waiting on it see it.
#[derive(Clone)]
enum Phase {
    /// The store is being read.
    Loading,
    /// The view is loaded; the API is served by this router.
    Serving(Router),
    /// The process is stopping before the load ended.
    Stopping,
}

/// The controller as the serving side holds it from before the load to the end.
#[derive(Clone)]
pub(crate) struct Loading {
    phase: watch::Sender<Phase>,
    controller: Arc<OnceLock<Weak<Controller>>>,
}

impl Loading {
    /// A controller not loaded yet.
    pub(crate) fn new() -> Loading {
        Loading {
            phase: watch::channel(Phase::Loading).0,
            controller: Arc::default(),
        }
    }

    /// The view is loaded: `api` answers from now on, the requests waiting first. A
    /// controller loaded after the stop began is stopped at once. (The phase's lock
    /// orders this against `stop`, so neither misses the other.)
    pub(crate) fn loaded(&self, ctl: &Arc<Controller>, api: Router) {
        let _ = self.controller.set(Arc::downgrade(ctl));
        let mut stopping = false;
        self.phase.send_modify(|p| match p {
            Phase::Stopping => stopping = true,
            _ => *p = Phase::Serving(api),
        });
        if stopping {
            ctl.stop();
        }
    }

    /// The controller, once loaded and while it lives.
    pub(crate) fn controller(&self) -> Option<Arc<Controller>> {
        self.controller.get()?.upgrade()
    }

    /// The process is stopping: the controller's long polls end, and requests still
    /// waiting for a view that will not come are answered.
    pub(crate) fn stop(&self) {
        let mut serving = None;
        self.phase.send_modify(|p| match p {
            Phase::Serving(_) => serving = self.controller(),
            _ => *p = Phase::Stopping,
        });
        if let Some(ctl) = serving {
            ctl.stop();
        }
    }

    /// Answers `req` from the API once the view is loaded.
    pub(crate) async fn serve(self, req: Request) -> Response {
        let mut phase = self.phase.subscribe();
        let waited = tokio::time::timeout(WAIT, phase.wait_for(|p| !matches!(p, Phase::Loading)));
        let api = match waited.await {
            Ok(Ok(p)) => match &*p {
                Phase::Serving(api) => api.clone(),
                _ => return unavailable("the controller is stopping"),
            },
            Ok(Err(_)) => return unavailable("the controller is stopping"),
            Err(_) => {
                return unavailable(&format!(
                    "the controller is still loading its view from the store after {} s; retry",
                    WAIT.as_secs()
                ))
            }
        };
        match api.oneshot(req).await {
            Ok(response) => response,
            Err(never) => match never {},
        }
    }
}

/// 503 in Neutron's shape, with the second `Retry-After` HTTP gives a client.
fn unavailable(why: &str) -> Response {
    let mut response =
        NeutronError::new(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", why)
            .into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    response
}
