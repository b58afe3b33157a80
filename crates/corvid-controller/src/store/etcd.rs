//! The cluster store: etcd v3 through its JSON gateway (`/v3/kv/range`, `/v3/kv/txn`,
//! `/v3/watch`), which every etcd since 3.4 serves on the client port. Going through the
//! gateway keeps gRPC and protoc out of the build; etcd's own semantics (one revision per
//! transaction, compares over a key range, watch from a revision) carry over unchanged.

use std::io::{BufRead, BufReader, Read};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde::Deserialize;
use serde_aux::field_attributes::deserialize_number_from_string;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::{prefix_end, Compare, Event, KeyValue, Op, Store, StoreError, Txn, TxnOutcome};

/// The etcd-backed store; tries each endpoint in turn, starting with the last that
/// answered, so a member that is down or cut off costs one timeout, not one per request.
pub struct EtcdStore {
    endpoints: Vec<String>,
    /// How many keys one page of a snapshot carries.
    page: usize,
    agent: ureq::Agent,
    preferred: AtomicUsize,
    /// Transactions waiting on etcd at once.
    in_flight: Arc<tokio::sync::Semaphore>,
}

/// Most transactions sent to etcd at once: as many connections as the HTTP client keeps.
/// Unbounded, each waiting transaction held a blocking thread of its own and opened a
/// connection past the kept ones: 1,000 hosts reporting at once filled tokio's 512
/// blocking threads (14 MiB of stacks), for no more than etcd commits in that time.
const TXNS_IN_FLIGHT: usize = 64;

/// How long one request may take. Longer than etcd's own request timeout (5 s plus two
/// election timeouts, 7 s by default), after which a member without quorum answers with an
/// error; a member that does not answer at all is left for the next. Set per request:
/// ureq 2 clears an agent's read timeout on connections it pools, so a kept-alive
/// connection to a member that stopped answering would wait forever.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(9);

/// How long reading one page of the whole store may take (a view's first load, or a
/// reload).
const RANGE_TIMEOUT: Duration = Duration::from_secs(120);

/// How many keys one page of a whole-store read carries: one answer for the whole store
/// was hundreds of megabytes at 100,000 ports, held at once with its parsed tree.
const RANGE_PAGE: usize = 20_000;

/// How long a new watch may wait for a member to accept it.
const WATCH_CONNECT: Duration = Duration::from_secs(3);

/// etcd's answer to a read at a compacted revision, as `Compacted`.
fn compacted_at(e: StoreError, revision: i64) -> StoreError {
    match e {
        StoreError::Backend(m) if m.contains("compacted") => StoreError::Compacted(revision),
        e => e,
    }
}

fn b64(s: impl AsRef<[u8]>) -> String {
    B64.encode(s)
}

/// etcd's gateway prints int64 as strings and leaves out zero values.
fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

fn key_value(v: &Value) -> KeyValue {
    let bytes = |f: &str| B64.decode(v[f].as_str().unwrap_or("")).unwrap_or_default();
    KeyValue {
        key: String::from_utf8_lossy(&bytes("key")).into_owned(),
        value: bytes("value"),
        create_revision: int(&v["create_revision"]),
        mod_revision: int(&v["mod_revision"]),
    }
}

/// One page of a range, as the gateway answers it (int64s as strings, zeros left out),
/// read straight into these types rather than through a `Value` tree.
#[derive(Deserialize)]
struct RangePage {
    #[serde(default)]
    kvs: Vec<PageKv>,
    #[serde(default)]
    more: bool,
}

#[derive(Deserialize)]
struct PageKv {
    key: String,
    #[serde(default)]
    value: String,
    #[serde(default, deserialize_with = "deserialize_number_from_string")]
    create_revision: i64,
    #[serde(default, deserialize_with = "deserialize_number_from_string")]
    mod_revision: i64,
}

impl PageKv {
    /// The key's own bytes, which the next page starts after, and the key-value.
    fn decode(self) -> Result<(Vec<u8>, KeyValue), StoreError> {
        let bytes = |s: &str| {
            B64.decode(s)
                .map_err(|e| StoreError::Backend(format!("etcd /v3/kv/range: base64: {e}")))
        };
        let key = bytes(&self.key)?;
        let kv = KeyValue {
            key: String::from_utf8_lossy(&key).into_owned(),
            value: bytes(&self.value)?,
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
        };
        Ok((key, kv))
    }
}

impl EtcdStore {
    /// Connects to etcd at the comma-separated client URLs and checks it answers.
    pub fn connect(urls: &str) -> Result<EtcdStore, StoreError> {
        let endpoints: Vec<String> = urls
            .split(',')
            .map(|u| u.trim().trim_end_matches('/').to_string())
            .filter(|u| !u.is_empty())
            .collect();
        if endpoints.is_empty() {
            return Err(StoreError::Backend("etcd: no endpoint given".into()));
        }
        let store = EtcdStore {
            endpoints,
            page: RANGE_PAGE,
            agent: ureq::AgentBuilder::new()
                .timeout_connect(Duration::from_secs(3))
                .max_idle_connections_per_host(TXNS_IN_FLIGHT)
                .build(),
            preferred: AtomicUsize::new(0),
            in_flight: Arc::new(tokio::sync::Semaphore::new(TXNS_IN_FLIGHT)),
        };
        store.post("/v3/kv/range", &json!({ "key": b64("/"), "limit": 1 }))?;
        Ok(store)
    }

    /// Pages of `keys` keys for snapshots instead of 20,000 (a test's pages end
    /// between the keys it wrote).
    pub fn with_range_page(mut self, keys: usize) -> EtcdStore {
        self.page = keys.max(1);
        self
    }

    /// The endpoints, the preferred one first.
    fn in_turn(&self) -> impl Iterator<Item = (usize, &String)> {
        let first = self.preferred.load(Ordering::Relaxed);
        let n = self.endpoints.len();
        (0..n)
            .map(move |k| (first + k) % n)
            .map(|i| (i, &self.endpoints[i]))
    }

    fn post(&self, path: &str, body: &Value) -> Result<Value, StoreError> {
        serde_json::from_slice(&self.post_raw(path, body, REQUEST_TIMEOUT)?)
            .map_err(|e| StoreError::Backend(format!("etcd {path}: {e}")))
    }

    /// Every key under `prefix` at `revision`, in pages all read at that one revision,
    /// handed to `each` a page at a time.
    fn range_pages(
        &self,
        prefix: &str,
        revision: i64,
        each: &mut dyn FnMut(Vec<KeyValue>),
    ) -> Result<(), StoreError> {
        let end = b64(prefix_end(prefix));
        let mut from = prefix.as_bytes().to_vec();
        loop {
            let body = json!({"key": b64(&from), "range_end": end, "limit": self.page,
                "revision": revision});
            let answer = self
                .post_raw("/v3/kv/range", &body, RANGE_TIMEOUT)
                .map_err(|e| compacted_at(e, revision))?;
            let page: RangePage = serde_json::from_slice(&answer)
                .map_err(|e| StoreError::Backend(format!("etcd /v3/kv/range: {e}")))?;
            let more = page.more;
            let mut kvs = Vec::with_capacity(page.kvs.len());
            let mut last = None;
            for kv in page.kvs {
                let (key, kv) = kv.decode()?;
                last = Some(key);
                kvs.push(kv);
            }
            each(kvs);
            match last {
                // The smallest key after the last one read: nothing skipped or read twice.
                Some(mut key) if more => {
                    key.push(0);
                    from = key;
                }
                _ => return Ok(()),
            }
        }
    }

    /// A request's answer body, from the first endpoint that answers.
    fn post_raw(&self, path: &str, body: &Value, limit: Duration) -> Result<Vec<u8>, StoreError> {
        let mut last = String::new();
        for (i, ep) in self.in_turn() {
            let request = self.agent.post(&format!("{ep}{path}")).timeout(limit);
            match request.send_json(body) {
                Ok(resp) => {
                    self.preferred.store(i, Ordering::Relaxed);
                    return Ok(read_body(resp));
                }
                Err(ureq::Error::Status(code, resp)) => {
                    let message = error_message(resp);
                    if message.contains("too many operations in txn request") {
                        return Err(StoreError::TooLarge(message));
                    }
                    return Err(StoreError::Backend(format!(
                        "etcd {path}: {code} {message}"
                    )));
                }
                Err(e) => last = format!("etcd {ep}: {e}"),
            }
        }
        Err(StoreError::Backend(last))
    }

    /// One transaction through the gateway; blocks for the HTTP round trip.
    fn txn_blocking(&self, txn: &Txn) -> TxnOutcome {
        let body = json!({
            "compare": txn.compares.iter().map(compare).collect::<Vec<_>>(),
            "success": txn.ops.iter().map(op).collect::<Vec<_>>(),
        });
        let v = self.post("/v3/kv/txn", &body)?;
        Ok((
            v["succeeded"].as_bool().unwrap_or(false),
            int(&v["header"]["revision"]),
        ))
    }
}

/// A gateway answer's body. Answers are chunked with gRPC trailers that ureq fails to
/// decode at the very end, so this keeps what was read before that; parsing the bytes
/// at once is also several times cheaper than serde_json's byte-by-byte reader.
fn read_body(resp: ureq::Response) -> Vec<u8> {
    let mut body = Vec::new();
    let mut reader = resp.into_reader();
    let mut buf = [0u8; 16 << 10];
    while let Ok(n @ 1..) = reader.read(&mut buf) {
        body.extend_from_slice(&buf[..n]);
    }
    body
}

/// The gateway's error message.
fn error_message(resp: ureq::Response) -> String {
    let body = read_body(resp);
    serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned())
}

fn compare(c: &Compare) -> Value {
    match c {
        Compare::CreateRevision(k, r) => {
            json!({"key": b64(k), "target": "CREATE", "result": "EQUAL", "create_revision": r})
        }
        Compare::ModRevision(k, r) => {
            json!({"key": b64(k), "target": "MOD", "result": "EQUAL", "mod_revision": r})
        }
        // etcd compares every key in the range; with none, it compares an empty key,
        // whose create revision is 0.
        Compare::PrefixEmpty(p) => json!({
            "key": b64(p), "range_end": b64(prefix_end(p)),
            "target": "CREATE", "result": "EQUAL", "create_revision": 0
        }),
    }
}

fn op(o: &Op) -> Value {
    match o {
        Op::Put(k, v) => json!({"request_put": {"key": b64(k), "value": b64(v)}}),
        Op::Delete(k) => json!({"request_delete_range": {"key": b64(k)}}),
    }
}

impl Store for EtcdStore {
    fn revision(&self) -> Result<i64, StoreError> {
        let v = self.post(
            "/v3/kv/range",
            &json!({ "key": b64("/"), "limit": 1, "count_only": true }),
        )?;
        Ok(int(&v["header"]["revision"]))
    }

    fn mark_progress(&self) -> Result<i64, StoreError> {
        let v = self.post(
            "/v3/kv/put",
            &json!({ "key": b64(crate::keys::PROGRESS), "value": "" }),
        )?;
        Ok(int(&v["header"]["revision"]))
    }

    fn snapshot(
        &self,
        prefixes: &[&str],
        revision: Option<i64>,
    ) -> Result<(Vec<KeyValue>, i64), StoreError> {
        let mut out = Vec::new();
        let at = self.snapshot_batches(prefixes, revision, &mut |kvs| out.extend(kvs))?;
        Ok((out, at))
    }

    fn snapshot_batches(
        &self,
        prefixes: &[&str],
        revision: Option<i64>,
        batch: &mut dyn FnMut(Vec<KeyValue>),
    ) -> Result<i64, StoreError> {
        let at = match revision {
            Some(r) => r,
            None => self.revision()?,
        };
        for prefix in prefixes {
            self.range_pages(prefix, at, batch)?;
        }
        Ok(at)
    }

    fn txn(self: Arc<Self>, txn: Txn) -> oneshot::Receiver<TxnOutcome> {
        let (tx, rx) = oneshot::channel();
        tokio::spawn(async move {
            // Never closed: the store holds the semaphore.
            let Ok(permit) = self.in_flight.clone().acquire_owned().await else {
                return;
            };
            tokio::task::spawn_blocking(move || {
                let started = std::time::Instant::now();
                let outcome = self.txn_blocking(&txn);
                drop(permit);
                let metrics = &crate::metrics::METRICS;
                metrics
                    .commit_seconds
                    .observe(started.elapsed().as_secs_f64());
                metrics.commit_batch.observe(1.0);
                let _ = tx.send(outcome);
            });
        });
        rx
    }

    fn watch(
        &self,
        prefix: &str,
        from: i64,
    ) -> Result<Receiver<Result<Vec<Event>, StoreError>>, StoreError> {
        let body = json!({"create_request": {
            "key": b64(prefix), "range_end": b64(prefix_end(prefix)), "start_revision": from
        }});
        let mut last = String::new();
        let mut stream = None;
        for (i, ep) in self.in_turn() {
            // A watch is idle between changes: no read timeout on its stream. The member's
            // first answer is awaited on a thread of its own, so one that is cut off (it
            // accepts the connection and never answers) is given up after a while.
            let (sent, answer) = mpsc::channel();
            let url = format!("{ep}/v3/watch");
            let request = body.clone();
            let spawned = std::thread::Builder::new()
                .name("corvid-etcd-watch-open".into())
                .spawn(move || {
                    let agent = ureq::AgentBuilder::new()
                        .timeout_connect(WATCH_CONNECT)
                        .build();
                    let _ = sent.send(agent.post(&url).send_json(&request));
                });
            if let Err(e) = spawned {
                return Err(StoreError::Backend(e.to_string()));
            }
            match answer.recv_timeout(WATCH_CONNECT) {
                Ok(Ok(resp)) => {
                    self.preferred.store(i, Ordering::Relaxed);
                    stream = Some(resp.into_reader());
                    break;
                }
                Ok(Err(e)) => last = format!("etcd watch {ep}: {e}"),
                Err(_) => last = format!("etcd watch {ep}: no answer within {WATCH_CONNECT:?}"),
            }
            // The next attempt starts past this member.
            self.preferred
                .store((i + 1) % self.endpoints.len(), Ordering::Relaxed);
        }
        let reader = stream.ok_or(StoreError::Backend(last))?;
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("corvid-etcd-watch".into())
            .spawn(move || {
                // The gateway writes one JSON message a line.
                for line in BufReader::new(reader).split(b'\n') {
                    // An error is the stream's end: its trailer is where ureq gives up.
                    let Ok(line) = line else { break };
                    if line.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    let msg = match serde_json::from_slice::<Value>(&line) {
                        Ok(m) => m,
                        Err(e) => {
                            let _ = tx.send(Err(StoreError::Backend(format!("etcd watch: {e}"))));
                            return;
                        }
                    };
                    let r = &msg["result"];
                    let compacted = int(&r["compact_revision"]);
                    if compacted > 0 || r["canceled"].as_bool() == Some(true) {
                        let _ = tx.send(Err(StoreError::Compacted(compacted.max(from))));
                        return;
                    }
                    if msg.get("error").is_some() {
                        let _ = tx.send(Err(StoreError::Backend(msg["error"].to_string())));
                        return;
                    }
                    let events: Vec<Event> = r["events"]
                        .as_array()
                        .map(|a| a.as_slice())
                        .unwrap_or_default()
                        .iter()
                        .map(|e| match e["type"].as_str() {
                            Some("DELETE") => Event::Delete(key_value(&e["kv"])),
                            _ => Event::Put(key_value(&e["kv"])),
                        })
                        .collect();
                    // One etcd message can hold several revisions: split them.
                    let mut start = 0;
                    while start < events.len() {
                        let rev = events[start].revision();
                        let end = events[start..]
                            .iter()
                            .position(|e| e.revision() != rev)
                            .map_or(events.len(), |n| start + n);
                        if tx.send(Ok(events[start..end].to_vec())).is_err() {
                            return;
                        }
                        start = end;
                    }
                }
                let _ = tx.send(Err(StoreError::Backend("etcd watch stream ended".into())));
            })
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        Ok(rx)
    }
}
