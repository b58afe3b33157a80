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

/// The port and the revision it was read at.
fn read(client: &Client, id: &str) -> Result<(Port, i64), NotActive> {
    let (ports, revision) = client.list::<Port>(&[("id", id)]).map_err(NotActive::Api)?;
    let port = ports.into_iter().next().ok_or(NotActive::Gone)?;
    Ok((port, revision))
}

/// Waits up to `timeout` for port `id`, bound to `host_id`, to be ACTIVE.
pub fn active(
    client: &Client,
    host_id: &str,
    id: &str,
    timeout: Duration,
) -> Result<Port, NotActive> {
    let deadline = Instant::now() + timeout;
    let (mut port, mut revision) = read(client, id)?;
    let filter = WatchFilter {
        host_id: Some(host_id),
        resource: Some(Port::PLURAL),
    };
    loop {
        match port.status {
            Status::Active => return Ok(port),
            Status::Error => return Err(NotActive::Failed),
            Status::Down | Status::Build => {}
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(NotActive::Timeout);
        }
        let wait = Duration::from_secs(left.as_secs().clamp(1, 30));
        let page = match client.watch(revision, &filter, wait) {
            Ok(page) => page,
            // Fell behind the feed: read the port again and watch from there.
            Err(ApiError::Neutron { status: 410, .. }) => {
                (port, revision) = read(client, id)?;
                continue;
            }
            Err(e) => return Err(NotActive::Api(e)),
        };
        revision = page.revision;
        for e in page.events.iter().filter(|e| e.id == id) {
            if e.kind == EventKind::Delete {
                return Err(NotActive::Gone);
            }
            if let Ok(p) = e.decode::<Port>() {
                port = p;
            }
        }
    }
}

/// Waits up to `timeout` for port `id` to exist (another component makes it), on the
/// feed; none when the time is up.
pub fn exists(client: &Client, id: &str, timeout: Duration) -> Result<Option<Port>, ApiError> {
    let deadline = Instant::now() + timeout;
    let filter = WatchFilter {
        host_id: None,
        resource: Some(Port::PLURAL),
    };
    'read: loop {
        let (ports, mut revision) = client.list::<Port>(&[("id", id)])?;
        if let Some(port) = ports.into_iter().next() {
            return Ok(Some(port));
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let wait = Duration::from_secs(left.as_secs().clamp(1, 30));
            let page = match client.watch(revision, &filter, wait) {
                Ok(page) => page,
                // Fell behind the feed: look again and watch from there.
                Err(ApiError::Neutron { status: 410, .. }) => continue 'read,
                Err(e) => return Err(e),
            };
            revision = page.revision;
            let made = page
                .events
                .iter()
                .filter(|e| e.id == id && e.kind != EventKind::Delete)
                .filter_map(|e| e.decode::<Port>().ok())
                .next_back();
            if let Some(port) = made {
                return Ok(Some(port));
            }
        }
    }
}
