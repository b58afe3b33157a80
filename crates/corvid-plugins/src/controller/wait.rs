//! Waiting for a port's agent to report it, on the controller's watch feed: ACTIVE is seen
//! the moment the agent reports it, without polling.

use std::time::{Duration, Instant};

use corvid_api::{ApiError, Client, EventKind, Port, Resource, Status, WatchFilter};

/// How long a plugin waits, in seconds, unless its configuration says `timeout`.
pub fn default_timeout() -> u64 {
    60
}

/// Why a port did not become ACTIVE.
#[derive(Debug)]
pub enum NotActive {
    /// The agent reported ERROR.
    Failed,
    /// Still DOWN or BUILD when the time was up.
    Timeout,
    /// The port was deleted meanwhile.
    Gone,
    /// The controller failed.
    Api(ApiError),
}

/// Follows port `id` on the feed (the events of `host_id`, or all), from what a read
/// finds (none: absent), until `decide` makes something of what it is; `Ok(None)` when
/// `timeout` passes first.
fn follow<R>(
    client: &Client,
    id: &str,
    host_id: Option<&str>,
    timeout: Duration,
    mut decide: impl FnMut(Option<&Port>) -> Option<R>,
) -> Result<Option<R>, ApiError> {
    let deadline = Instant::now() + timeout;
    let filter = WatchFilter {
        host_id,
        resource: Some(Port::PLURAL),
    };
    'read: loop {
        let (ports, mut revision) = client.list::<Port>(&[("id", id)])?;
        let mut port = ports.into_iter().next();
        loop {
            if let Some(r) = decide(port.as_ref()) {
                return Ok(Some(r));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let wait = Duration::from_secs(left.as_secs().clamp(1, 30));
            let page = match client.watch(revision, &filter, wait) {
                Ok(page) => page,
                // Fell behind the feed: read the port again and watch from there.
                Err(ApiError::Neutron { status: 410, .. }) => continue 'read,
                Err(e) => return Err(e),
            };
            revision = page.revision;
            for e in page.events.iter().filter(|e| e.id == id) {
                if e.kind == EventKind::Delete {
                    port = None;
                } else if let Ok(p) = e.decode::<Port>() {
                    port = Some(p);
                }
            }
        }
    }
}

/// Waits up to `timeout` for port `id`, bound to `host_id`, to be ACTIVE.
pub fn active(
    client: &Client,
    host_id: &str,
    id: &str,
    timeout: Duration,
) -> Result<Port, NotActive> {
    let outcome = follow(client, id, Some(host_id), timeout, |port| match port {
        None => Some(Err(NotActive::Gone)),
        Some(p) => match p.status {
            Status::Active => Some(Ok(p.clone())),
            Status::Error => Some(Err(NotActive::Failed)),
            Status::Down | Status::Build => None,
        },
    });
    match outcome {
        Ok(Some(r)) => r,
        Ok(None) => Err(NotActive::Timeout),
        Err(e) => Err(NotActive::Api(e)),
    }
}

/// Waits up to `timeout` for port `id` to exist (another component makes it); none when
/// the time is up.
pub fn exists(client: &Client, id: &str, timeout: Duration) -> Result<Option<Port>, ApiError> {
    follow(client, id, None, timeout, |port| port.cloned())
}
