//! The watch feed: `GET /v2.0/watch?since=<revision>[&binding:host_id=<host>][&timeout=<s>]`
//! long-polls for changes after `since`. The answer's `revision` is where to resume: every
//! change up to it that passes the filter is in `events`, none after it, so a client that
//! reconnects with it neither misses nor repeats an event. 410 means `since` is older than
//! the feed keeps: list again (lists carry the revision in `X-Corvid-Revision`).
//!
//! With `stream=true` the answer stays open and carries one such page a line
//! (`application/x-ndjson`) as changes come, and an empty one after `timeout` seconds
//! without any (which tells the client the connection is alive, and where it stands). A
//! client that falls so far behind that the feed no longer holds its place gets a last
//! line with the 410's `NeutronError`. A thousand agents each sending a request per change
//! cost the controller about 45 us of CPU per event delivered, most of it the request's
//! own: a stream carries the same events without it.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use corvid_api::EventKind;
use serde::Serialize;

use super::Ctl;
use super::Query;
use crate::controller::Controller;
use crate::error::NeutronError;
use crate::query::pairs;
use crate::view::{FeedEntry, FeedObject, View};

/// Longest wait a client may ask for.
const MAX_WAIT: u64 = 300;
/// Most events in one answer (cut only between revisions).
const PAGE: usize = 2000;

struct Filter {
    since: i64,
    host: Option<String>,
    resources: Vec<String>,
}

/// One event as it is answered. The object is written from what the feed keeps (its
/// text, or a port's compact form): building a `Value` tree of it for each subscriber
/// cost a parse and an allocation per node, under the view's lock, for every host a
/// change goes to.
#[derive(Serialize)]
struct Event<'a> {
    revision: i64,
    #[serde(rename = "type")]
    kind: EventKind,
    resource: &'a str,
    id: &'a str,
    object: &'a FeedObject,
}

impl<'a> From<&'a FeedEntry> for Event<'a> {
    fn from(e: &'a FeedEntry) -> Self {
        Event {
            revision: e.revision,
            kind: e.kind,
            resource: &e.resource,
            id: &e.id,
            object: &e.object,
        }
    }
}

/// An answer of the feed: where to resume, and the events up to there.
#[derive(Serialize)]
struct Page<'a> {
    revision: i64,
    events: Vec<Event<'a>>,
}

/// Events after `since` passing the filter, and the revision to resume from.
fn collect<'v>(v: &'v View, f: &Filter) -> Result<(Vec<Event<'v>>, i64), NeutronError> {
    let feed_start = v.feed_start_for(f.host.as_deref());
    if f.since + 1 < feed_start {
        return Err(NeutronError::new(
            StatusCode::GONE,
            "WatchRevisionCompacted",
            format!(
                "Revision {} is older than the watch feed keeps (it starts at {feed_start}): list again and watch from the list's revision.",
                f.since
            ),
        ));
    }
    let start = v.feed.partition_point(|e| e.revision <= f.since);
    let mut events: Vec<Event> = Vec::new();
    let mut resume = v.revision.max(f.since);
    for e in v.feed.range(start..) {
        if events.len() >= PAGE && events.last().is_some_and(|l| l.revision != e.revision) {
            resume = events.last().map_or(resume, |l| l.revision);
            break;
        }
        let wanted = (f.resources.is_empty() || f.resources.iter().any(|r| **r == *e.resource))
            && match &f.host {
                Some(h) if &*e.resource == "ports" => e.hosts.iter().flatten().any(|x| **x == **h),
                _ => true,
            };
        if wanted {
            events.push(e.into());
        }
    }
    Ok((events, resume))
}

pub async fn watch(State(c): Ctl, Query(q): Query) -> Result<Response, NeutronError> {
    let mut f = Filter {
        since: 0,
        host: None,
        resources: Vec::new(),
    };
    let mut wait = 30;
    let mut stream = false;
    for (k, v) in pairs(q.as_deref()) {
        match k.as_str() {
            "stream" => {
                stream = match v.to_ascii_lowercase().as_str() {
                    "true" => true,
                    "false" => false,
                    _ => {
                        return Err(NeutronError::bad_request(format!(
                            "stream must be true or false, not '{v}'"
                        )))
                    }
                }
            }
            "since" => {
                f.since = v.parse().map_err(|_| {
                    NeutronError::bad_request(format!("since must be a revision, not '{v}'"))
                })?
            }
            "timeout" => {
                wait = v
                    .parse::<u64>()
                    .map_err(|_| {
                        NeutronError::bad_request(format!("timeout must be seconds, not '{v}'"))
                    })?
                    .min(MAX_WAIT)
            }
            "binding:host_id" => f.host = Some(v),
            "resource" => f.resources.push(v),
            other => {
                return Err(NeutronError::bad_request(format!(
                    "Unknown watch parameter '{other}'"
                )))
            }
        }
    }
    if stream {
        // A place the feed no longer holds is refused before the stream starts, as the
        // long poll refuses it.
        collect(&c.view(), &f)?;
        return Ok(streamed(c, f, Duration::from_secs(wait.max(1))));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(wait);
    let _watching = crate::metrics::Watching::start();
    let page = next_page(&c, &mut f, deadline).await?;
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        page,
    )
        .into_response())
}

/// The next page for `f`, written out: as soon as the filter lets a change through, else
/// an empty one at `deadline` or when the controller stops. `f` moves on past it.
async fn next_page(
    c: &Controller,
    f: &mut Filter,
    deadline: tokio::time::Instant,
) -> Result<Vec<u8>, NeutronError> {
    let waker = c.join_watch(f.host.as_deref());
    loop {
        // Listening before looking: a change applied in between still wakes the poll.
        let mut woken = std::pin::pin!(waker.notify().notified());
        woken.as_mut().enable();
        {
            // The page is written while the view is held: the events borrow from it.
            let view = c.view();
            let (events, resume) = collect(&view, f)?;
            f.since = resume;
            if !events.is_empty() || tokio::time::Instant::now() >= deadline || c.stopping() {
                let page = Page {
                    revision: resume,
                    events,
                };
                return Ok(serde_json::to_vec(&page).unwrap_or_default());
            }
        }
        c.wait_change(woken, deadline).await;
    }
}

/// The feed as one streamed answer: a page a line whenever the filter lets changes
/// through, an empty page after `quiet` without any; it ends when the controller stops,
/// or after the 410 of a client the feed left behind.
fn streamed(c: Arc<Controller>, f: Filter, quiet: Duration) -> Response {
    let watching = crate::metrics::Watching::start();
    let lines = futures_util::stream::unfold(Some((c, f, watching)), move |state| async move {
        let (c, mut f, watching) = state?;
        let deadline = tokio::time::Instant::now() + quiet;
        let (mut line, last) = match next_page(&c, &mut f, deadline).await {
            Ok(page) => (page, false),
            Err(e) => (serde_json::to_vec(&e.body()).unwrap_or_default(), true),
        };
        line.push(b'\n');
        let next = (!last && !c.stopping()).then_some((c, f, watching));
        Some((Ok::<_, Infallible>(Bytes::from(line)), next))
    });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response()
}
