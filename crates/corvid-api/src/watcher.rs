//! Following the watch feed over one streamed answer (`stream=true`): the controller
//! writes a page a line as changes come, so a change costs neither side a request. The
//! caller asks page by page, as it would long-poll; the stream stays open while each call
//! resumes where the last page ended, with the same filter and wait, and is opened again
//! otherwise.

use std::io::{BufRead, BufReader, Read};
use std::time::Duration;

use serde_json::Value;

use crate::client::{agent_with, check, watch_query, Client, WatchFilter, TOKEN_HEADER};
use crate::{ApiError, WatchPage};

/// How much longer than the asked wait a stream may stay silent before it is given up:
/// the controller writes an empty page after the wait, so a longer silence is a
/// controller gone or cut off.
const SILENCE: Duration = Duration::from_secs(10);

/// A follower of the watch feed, for one thread.
pub struct Watcher {
    client: Client,
    open: Option<Stream>,
}

/// An open stream: where its next page resumes from, and what it was asked with.
struct Stream {
    lines: BufReader<Box<dyn Read + Send + Sync + 'static>>,
    since: i64,
    query: String,
}

impl Watcher {
    /// A follower of `client`'s controller; nothing is opened before the first call.
    pub fn new(client: Client) -> Watcher {
        Watcher { client, open: None }
    }

    /// The next page after `since` that `filter` lets through: as soon as a change
    /// comes, else an empty page about `wait` after the stream's last line. A 410 means
    /// `since` is older than the feed keeps: list again.
    pub fn next(
        &mut self,
        since: i64,
        filter: &WatchFilter,
        wait: Duration,
    ) -> Result<WatchPage, ApiError> {
        let query = watch_query(filter, wait);
        let mut stream = match self.open.take() {
            Some(s) if s.since == since && s.query == query => s,
            _ => self.open(since, query, wait)?,
        };
        let page = stream.page()?;
        stream.since = page.revision;
        self.open = Some(stream);
        Ok(page)
    }

    fn open(&self, since: i64, query: String, wait: Duration) -> Result<Stream, ApiError> {
        let agent = agent_with(
            ureq::AgentBuilder::new().timeout_read(wait + SILENCE),
            &self.client.tls,
        );
        let url = format!(
            "{}/v2.0/watch?since={since}{query}&stream=true",
            self.client.base()
        );
        let mut request = agent.get(&url);
        if let Some(t) = &self.client.token {
            request = request.set(TOKEN_HEADER, t);
        }
        match request.call() {
            Ok(answer) => Ok(Stream {
                lines: BufReader::new(answer.into_reader()),
                since,
                query,
            }),
            Err(ureq::Error::Status(status, answer)) => {
                let value = answer.into_json().unwrap_or(Value::Null);
                Err(check(status, value)
                    .err()
                    .unwrap_or_else(|| ApiError::Decode(format!("the watch answered {status}"))))
            }
            Err(e) => Err(ApiError::Transport(e.to_string())),
        }
    }
}

impl Stream {
    /// The next line's page, or the error it carries.
    fn page(&mut self) -> Result<WatchPage, ApiError> {
        let mut line = Vec::new();
        match self.lines.read_until(b'\n', &mut line) {
            Ok(0) => return Err(ApiError::Transport("the watch stream ended".into())),
            Ok(_) => {}
            Err(e) => return Err(ApiError::Transport(format!("the watch stream: {e}"))),
        }
        if let Ok(page) = serde_json::from_slice::<WatchPage>(&line) {
            return Ok(page);
        }
        let value: Value = serde_json::from_slice(&line).map_err(|e| {
            ApiError::Decode(format!("a line of the watch stream is not JSON: {e}"))
        })?;
        // The one error a stream ends with: the feed no longer holds the client's place.
        let status = match value["NeutronError"]["type"].as_str() {
            Some("WatchRevisionCompacted") => 410,
            Some(_) => 500,
            None => return Err(ApiError::Decode(format!("not a page of the feed: {value}"))),
        };
        Err(check(status, value)
            .err()
            .unwrap_or_else(|| ApiError::Decode("an error line without an error".into())))
    }
}
