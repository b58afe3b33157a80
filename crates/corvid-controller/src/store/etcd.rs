//! The cluster store: etcd v3 over its gRPC API (the `etcd-client` crate). etcd's own
//! semantics (one revision per transaction, compares over a key range, watch from a
//! revision) carry over unchanged. gRPC rather than the JSON gateway every etcd also
//! serves: the gateway costs etcd about twice the CPU per transaction (JSON and base64
//! both ways, and a second gRPC hop inside etcd), and etcd's CPU is what bounds the
//! controller's write rate (docs/scale.md).

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{
    Client, CompareOp, ConnectOptions, EventType, GetOptions, TxnOp, TxnOpResponse, TxnResponse,
    WatchOptions,
};
use tokio::runtime::{Handle, Runtime};
use tokio::sync::oneshot;

use super::{prefix_end, Compare, Event, KeyValue, Op, Store, StoreError, Txn, TxnOutcome};

/// The etcd-backed store; tries each member in turn, starting with the last that
/// answered, so a member that is down or cut off costs one timeout, not one per request.
pub struct EtcdStore {
    /// One client per member, with its URL, in the order given.
    members: Vec<(String, Client)>,
    /// How many keys one page of a snapshot carries.
    page: usize,
    preferred: AtomicUsize,
    /// Transactions not yet sent, oldest first, each with where its outcome goes.
    waiting: Mutex<VecDeque<Waiting>>,
    /// Commits waiting on etcd at once.
    in_flight: tokio::sync::Semaphore,
    /// The transactions of one commit plus the widest one's operations: etcd's default
    /// `--max-txn-ops` until a commit was refused for it.
    max_ops: AtomicUsize,
    /// The bytes one commit carries, until a commit was refused for its size.
    max_bytes: AtomicUsize,
    /// Where the clients' connections run. The store is called from plain threads (the
    /// view's reader, the watch's follower, tests) as well as from the controller's
    /// runtime, so it brings its own; `None` once dropped.
    runtime: Option<Runtime>,
    handle: Handle,
}

/// Most commits sent to etcd at once. While they wait on etcd, the transactions that
/// come meanwhile queue, and the next commit carries all of them that fit (`Batch`):
/// etcd's cost is mostly per request (gRPC, a raft entry, its apply and a revision to
/// every watcher), so at 32 writers eight ports a request commit 2.9 to 4.0 times as many
/// ports a second as one a request (docs/scale.md). A lone transaction still goes at once.
const COMMITS_IN_FLIGHT: usize = 8;

/// etcd's default `--max-txn-ops`: it bounds the transactions of one commit plus the
/// widest one's compares or writes (etcd counts a nested transaction's within what its
/// parent leaves). A commit etcd refuses as too large is sent again one transaction a
/// request, and the bound is halved, so an etcd run with a smaller limit still takes
/// every transaction, and soon in commits that fit.
const MAX_TXN_OPS: usize = 128;

/// The most bytes of keys and values one commit carries at first: well below etcd's
/// default `--max-request-bytes` (1.5 MiB), and small enough that a watch message of
/// etcd's 1,000 revisions stays within `MAX_ANSWER` (a revision is one commit). Halved
/// when etcd refuses a commit for its size.
const MAX_COMMIT_BYTES: usize = 256 << 10;

/// A transaction waiting to be sent, and where its outcome goes.
type Waiting = (Txn, oneshot::Sender<TxnOutcome>);

/// How long one request may take. Longer than etcd's own request timeout (5 s plus two
/// election timeouts, 7 s by default), after which a member without quorum answers with an
/// error; a member that does not answer at all is left for the next.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(9);

/// How long reading one page of the whole store may take (a view's first load, or a
/// reload).
const RANGE_TIMEOUT: Duration = Duration::from_secs(120);

/// How many keys one page of a whole-store read carries: one answer for the whole store
/// was hundreds of megabytes at 100,000 ports, held at once with its parsed form.
const RANGE_PAGE: usize = 20_000;

/// The largest answer read: a page of `RANGE_PAGE` ports is about 20 MB, and one watch
/// message up to 1,000 revisions, past gRPC's default of 4 MB.
const MAX_ANSWER: usize = 256 << 20;

/// How long a new watch may wait for a member to accept it.
const WATCH_CONNECT: Duration = Duration::from_secs(3);

/// How long a new connection to a member may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How often an idle connection to a member is pinged, and how long the ping's answer
/// may take.
const KEEPALIVE: Duration = Duration::from_secs(10);

/// How a call to one member failed: whether the next member may answer instead.
enum Failure {
    /// The member did not answer, or cannot serve (no leader, connection refused).
    Member(String),
    /// etcd answered with an error that another member would give too, or a write that
    /// may have been taken fails without being sent again.
    Store(StoreError),
}

/// Whether a call is sent again to the next member after any failure of the member's
/// (a read), or only after one that shows the member never took it (a write: sending
/// one again that was taken would apply it twice, and its compares, failing then, would
/// have the controller make the object again under new IDs).
#[derive(Clone, Copy, PartialEq)]
enum Retry {
    Read,
    Write,
}

/// The errors of a member that did not take a request: it could not be reached, or has
/// no leader to propose it to (those Kubernetes' etcd client retries writes on).
fn never_taken(message: &str) -> bool {
    ["connect", "no leader", "leader changed", "not capable"]
        .iter()
        .any(|m| message.contains(m))
}

/// Whether etcd refused a request for its size in bytes: its own check of
/// `--max-request-bytes`, or gRPC's of the message, which etcd sets a little above it.
fn too_many_bytes(message: &str) -> bool {
    message.contains("request is too large") || message.contains("larger than max")
}

/// etcd's error, and whether it is the member's rather than the request's.
fn failure(e: etcd_client::Error, retry: Retry) -> Failure {
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            let message = status.message().to_string();
            let member = match retry {
                Retry::Read => matches!(
                    status.code(),
                    tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
                ),
                Retry::Write => status.code() == tonic::Code::Unavailable && never_taken(&message),
            };
            if message.contains("too many operations in txn request") || too_many_bytes(&message) {
                Failure::Store(StoreError::TooLarge(message))
            } else if member {
                Failure::Member(message)
            } else {
                Failure::Store(StoreError::Backend(format!("etcd: {message}")))
            }
        }
        e @ (etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_)) => {
            Failure::Member(e.to_string())
        }
        e => Failure::Store(StoreError::Backend(format!("etcd: {e}"))),
    }
}

/// etcd's answer to a read at a compacted revision, as `Compacted`.
fn compacted_at(e: StoreError, revision: i64) -> StoreError {
    match e {
        StoreError::Backend(m) if m.contains("compacted") => StoreError::Compacted(revision),
        e => e,
    }
}

fn key_value(kv: etcd_client::KeyValue) -> KeyValue {
    let (create_revision, mod_revision) = (kv.create_revision(), kv.mod_revision());
    let (key, value) = kv.into_key_value();
    KeyValue {
        key: String::from_utf8(key)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
        value,
        create_revision,
        mod_revision,
    }
}

/// One page of a range.
struct RangePage {
    kvs: Vec<KeyValue>,
    /// The last key's own bytes, which the next page starts after whatever its text.
    last: Option<Vec<u8>>,
    /// Whether more keys follow.
    more: bool,
}

impl EtcdStore {
    /// Connects to etcd at the comma-separated client URLs and checks it answers.
    pub fn connect(urls: &str) -> Result<EtcdStore, StoreError> {
        let urls: Vec<String> = urls
            .split(',')
            .map(|u| u.trim().trim_end_matches('/').to_string())
            .filter(|u| !u.is_empty())
            .collect();
        if urls.is_empty() {
            return Err(StoreError::Backend("etcd: no endpoint given".into()));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("corvid-etcd")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Backend(format!("etcd: starting its runtime: {e}")))?;
        let handle = runtime.handle().clone();
        let members = urls
            .into_iter()
            .map(|url| {
                let client = runtime.block_on(member(&url))?;
                Ok((url, client))
            })
            .collect::<Result<_, StoreError>>()?;
        let store = EtcdStore {
            members,
            page: RANGE_PAGE,
            preferred: AtomicUsize::new(0),
            waiting: Mutex::new(VecDeque::new()),
            in_flight: tokio::sync::Semaphore::new(COMMITS_IN_FLIGHT),
            max_ops: AtomicUsize::new(MAX_TXN_OPS),
            max_bytes: AtomicUsize::new(MAX_COMMIT_BYTES),
            runtime: Some(runtime),
            handle,
        };
        store.revision()?;
        Ok(store)
    }

    /// Pages of `keys` keys for snapshots instead of 20,000 (a test's pages end
    /// between the keys it wrote).
    pub fn with_range_page(mut self, keys: usize) -> EtcdStore {
        self.page = keys.max(1);
        self
    }

    /// Sends `batch` as one etcd transaction, each of its own a nested transaction with
    /// its own compares, and hands each its outcome; a batch etcd refuses as too large is
    /// sent again a transaction at a time.
    async fn commit(&self, batch: Vec<Waiting>) {
        let started = std::time::Instant::now();
        let metrics = &crate::metrics::METRICS;
        let answered = |n: usize| {
            metrics.commit_batch.observe(n as f64);
            metrics
                .commit_seconds
                .observe(started.elapsed().as_secs_f64());
        };
        if let [(txn, _)] = batch.as_slice() {
            let outcome = self.send(request(txn)).await.map(|answer| {
                let revision = answer.header().map_or(0, |h| h.revision());
                (answer.succeeded(), revision)
            });
            answered(1);
            let (_, reply) = batch.into_iter().next().expect("one transaction");
            let _ = reply.send(outcome);
            return;
        }
        let request = etcd_client::Txn::new().and_then(
            batch
                .iter()
                .map(|(txn, _)| TxnOp::txn(request(txn)))
                .collect::<Vec<_>>(),
        );
        match self.send(request).await {
            Ok(answer) => {
                answered(batch.len());
                let revision = answer.header().map_or(0, |h| h.revision());
                let nested = answer.op_responses();
                for (i, (_, reply)) in batch.into_iter().enumerate() {
                    let outcome = match nested.get(i) {
                        Some(TxnOpResponse::Txn(t)) => Ok((t.succeeded(), revision)),
                        _ => Err(StoreError::Backend(format!(
                            "etcd: no answer for transaction {i} of a commit of {}",
                            nested.len()
                        ))),
                    };
                    let _ = reply.send(outcome);
                }
            }
            Err(StoreError::TooLarge(why)) => {
                // The bound etcd refused is halved, so that an etcd with a much smaller
                // limit is found in a few commits.
                let (bound, fits, what) = if too_many_bytes(&why) {
                    let bytes: usize = batch.iter().map(|(t, _)| size(t)).sum();
                    (&self.max_bytes, bytes / 2, "bytes")
                } else {
                    let widest = batch.iter().map(|(t, _)| width(t)).max().unwrap_or(0);
                    let ops = (batch.len() + widest) / 2;
                    (&self.max_ops, ops, "transactions and operations")
                };
                if bound.fetch_min(fits, Ordering::Relaxed) > fits {
                    tracing::info!(
                        "etcd refused a commit of {} transactions ({why}): commits now carry at most {fits} {what}",
                        batch.len()
                    );
                }
                for one in batch {
                    Box::pin(self.commit(vec![one])).await;
                }
            }
            Err(e) => {
                answered(batch.len());
                for (_, reply) in batch {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }

    /// One transaction request to the members in turn, as a write.
    async fn send(&self, request: etcd_client::Txn) -> Result<TxnResponse, StoreError> {
        self.each(Retry::Write, REQUEST_TIMEOUT, |mut c| {
            let request = request.clone();
            async move { c.txn(request).await }
        })
        .await
    }

    /// The members, the preferred one first.
    fn in_turn(&self) -> impl Iterator<Item = usize> {
        let first = self.preferred.load(Ordering::Relaxed);
        let n = self.members.len();
        (0..n).map(move |k| (first + k) % n)
    }

    /// `call`'s answer from the first member that gives one within `limit`; a write
    /// goes on to the next member only when the last one surely did not take it.
    async fn each<T, F, Fut>(&self, retry: Retry, limit: Duration, call: F) -> Result<T, StoreError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut last = String::new();
        for i in self.in_turn() {
            let (url, client) = &self.members[i];
            match tokio::time::timeout(limit, call(client.clone())).await {
                Ok(Ok(answer)) => {
                    self.preferred.store(i, Ordering::Relaxed);
                    return Ok(answer);
                }
                Ok(Err(e)) => match failure(e, retry) {
                    Failure::Store(e) => return Err(e),
                    Failure::Member(m) => last = format!("etcd {url}: {m}"),
                },
                Err(_) => {
                    last = format!("etcd {url}: no answer within {limit:?}");
                    if retry == Retry::Write {
                        // It may commit yet: the next request starts past this member.
                        self.preferred
                            .store((i + 1) % self.members.len(), Ordering::Relaxed);
                        return Err(StoreError::Backend(last));
                    }
                }
            }
            // The next request starts past this member.
            self.preferred
                .store((i + 1) % self.members.len(), Ordering::Relaxed);
        }
        Err(StoreError::Backend(last))
    }

    /// One page of keys from `from` to `end` at `revision`.
    fn range_page(&self, from: &[u8], end: &[u8], revision: i64) -> Result<RangePage, StoreError> {
        let options = GetOptions::new()
            .with_range(end)
            .with_limit(self.page as i64)
            .with_revision(revision);
        let mut answer = self
            .handle
            .block_on(self.each(Retry::Read, RANGE_TIMEOUT, |c| {
                let options = options.clone();
                async move {
                    c.kv_client()
                        .max_decoding_message_size(MAX_ANSWER)
                        .get(from, Some(options))
                        .await
                }
            }))
            .map_err(|e| compacted_at(e, revision))?;
        let more = answer.more();
        let last = answer.kvs().last().map(|kv| kv.key().to_vec());
        Ok(RangePage {
            kvs: answer.take_kvs().into_iter().map(key_value).collect(),
            last,
            more,
        })
    }

    /// Every key under `prefix` at `revision`, in pages all read at that one revision,
    /// handed to `each` a page at a time.
    fn range_pages(
        &self,
        prefix: &str,
        revision: i64,
        each: &mut dyn FnMut(Vec<KeyValue>),
    ) -> Result<(), StoreError> {
        let end = prefix_end(prefix);
        let mut from = prefix.as_bytes().to_vec();
        loop {
            let RangePage { kvs, last, more } = self.range_page(&from, &end, revision)?;
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
}

/// A client of one member. The connection is made at the first request and made again
/// after it breaks, so a member that is down now is not given up for good.
async fn member(url: &str) -> Result<Client, StoreError> {
    let bad = |e: &dyn std::fmt::Display| StoreError::Backend(format!("etcd {url}: {e}"));
    let address = if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    };
    let channel = tonic::transport::Endpoint::from_shared(address)
        .map_err(|e| bad(&e))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        // A member gone silent (cut off, or its host gone) is noticed on an idle
        // connection too: a watch waiting on it would otherwise wait forever. 10 s is
        // past etcd's least allowed interval (5 s).
        .http2_keep_alive_interval(KEEPALIVE)
        .keep_alive_timeout(KEEPALIVE)
        .keep_alive_while_idle(true)
        .connect_lazy();
    // A member cut off from its cluster's leader answers "no leader" at once, and ends
    // its watches, rather than serving what it last knew.
    let options = ConnectOptions::new().with_require_leader(true);
    Client::from_channel(etcd_client::Channel::Tonic(channel), Some(options))
        .await
        .map_err(|e| bad(&e))
}

/// The queue, whatever a panicking holder left (it only pushes and drains).
fn lock(waiting: &Mutex<VecDeque<Waiting>>) -> MutexGuard<'_, VecDeque<Waiting>> {
    waiting.lock().unwrap_or_else(|e| e.into_inner())
}

/// A transaction's compares or writes, whichever are more: what etcd counts of it.
fn width(txn: &Txn) -> usize {
    txn.compares.len().max(txn.ops.len())
}

/// The bytes of a transaction's keys and values written.
fn size(txn: &Txn) -> usize {
    txn.ops
        .iter()
        .map(|o| match o {
            Op::Put(k, v) => k.len() + v.len(),
            Op::Delete(k) => k.len(),
        })
        .sum()
}

/// `txn` as etcd's request.
fn request(txn: &Txn) -> etcd_client::Txn {
    etcd_client::Txn::new()
        .when(txn.compares.iter().map(compare).collect::<Vec<_>>())
        .and_then(txn.ops.iter().map(op).collect::<Vec<_>>())
}

/// The waiting transactions one commit carries: the oldest ones, while none writes a key
/// another of them compares or writes (nested transactions all compare the state before
/// the commit, and etcd refuses a key written twice; keys only compared, such as the
/// network every port create checks, are shared), and they fit etcd's limits. A
/// transaction that compares a prefix, or is too wide to nest, goes alone.
struct Batch;

impl Batch {
    fn take(waiting: &mut VecDeque<Waiting>, max_ops: usize, max_bytes: usize) -> Vec<Waiting> {
        let n = {
            let (mut read, mut written) = (HashSet::<&str>::new(), HashSet::<&str>::new());
            let (mut n, mut widest, mut bytes) = (0, 0, 0);
            for (txn, _) in waiting.iter() {
                let (width, size) = (width(txn), size(txn));
                let alone = 1 + width > max_ops
                    || txn
                        .compares
                        .iter()
                        .any(|c| matches!(c, Compare::PrefixEmpty(_)));
                if n > 0
                    && (alone || n + 1 + widest.max(width) > max_ops || bytes + size > max_bytes)
                {
                    break;
                }
                let mut reads = txn.compares.iter().map(|c| match c {
                    Compare::CreateRevision(k, _)
                    | Compare::ModRevision(k, _)
                    | Compare::PrefixEmpty(k) => k.as_str(),
                });
                let mut writes = txn.ops.iter().map(|o| match o {
                    Op::Put(k, _) | Op::Delete(k) => k.as_str(),
                });
                if n > 0
                    && (reads.clone().any(|k| written.contains(k))
                        || writes
                            .clone()
                            .any(|k| written.contains(k) || read.contains(k)))
                {
                    break;
                }
                n += 1;
                if alone {
                    break;
                }
                read.extend(&mut reads);
                written.extend(&mut writes);
                (widest, bytes) = (widest.max(width), bytes + size);
            }
            n
        };
        waiting.drain(..n).collect()
    }
}

fn compare(c: &Compare) -> etcd_client::Compare {
    match c {
        Compare::CreateRevision(k, r) => {
            etcd_client::Compare::create_revision(k.as_str(), CompareOp::Equal, *r)
        }
        Compare::ModRevision(k, r) => {
            etcd_client::Compare::mod_revision(k.as_str(), CompareOp::Equal, *r)
        }
        // etcd compares every key in the range; with none, it compares an empty key,
        // whose create revision is 0.
        Compare::PrefixEmpty(p) => {
            etcd_client::Compare::create_revision(p.as_str(), CompareOp::Equal, 0)
                .with_range(prefix_end(p))
        }
    }
}

fn op(o: &Op) -> TxnOp {
    match o {
        Op::Put(k, v) => TxnOp::put(k.as_str(), v.as_slice(), None),
        Op::Delete(k) => TxnOp::delete(k.as_str(), None),
    }
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        // The store may be dropped on the controller's runtime, where waiting for another
        // runtime's threads is not allowed; its connections end with the process.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Store for EtcdStore {
    fn revision(&self) -> Result<i64, StoreError> {
        let options = GetOptions::new().with_limit(1).with_count_only();
        let answer = self
            .handle
            .block_on(self.each(Retry::Read, REQUEST_TIMEOUT, |mut c| {
                let options = options.clone();
                async move { c.get("/", Some(options)).await }
            }))?;
        Ok(answer.header().map_or(0, |h| h.revision()))
    }

    fn mark_progress(&self) -> Result<i64, StoreError> {
        let answer = self
            .handle
            // Made again on another member, a mark is only a later revision.
            .block_on(self.each(Retry::Read, REQUEST_TIMEOUT, |mut c| async move {
                c.put(crate::keys::PROGRESS, "", None).await
            }))?;
        Ok(answer.header().map_or(0, |h| h.revision()))
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
        lock(&self.waiting).push_back((txn, tx));
        let handle = self.handle.clone();
        // One task per transaction, each taking the waiting ones that fit one commit when
        // its turn comes: there are never fewer tasks to come than transactions waiting,
        // so none is left behind, and a task that finds the queue empty ends.
        handle.spawn(async move {
            // Never closed: the store holds the semaphore.
            let Ok(_permit) = self.in_flight.acquire().await else {
                return;
            };
            let max_ops = self.max_ops.load(Ordering::Relaxed);
            let max_bytes = self.max_bytes.load(Ordering::Relaxed);
            let batch = Batch::take(&mut lock(&self.waiting), max_ops, max_bytes);
            if !batch.is_empty() {
                self.commit(batch).await;
            }
        });
        rx
    }

    fn watch(
        &self,
        prefix: &str,
        from: i64,
    ) -> Result<Receiver<Result<Vec<Event>, StoreError>>, StoreError> {
        let options = WatchOptions::new()
            .with_range(prefix_end(prefix))
            .with_start_revision(from);
        let mut stream = self
            .handle
            .block_on(self.each(Retry::Read, WATCH_CONNECT, |c| {
                let options = options.clone();
                async move {
                    // One message of history can hold 1,000 revisions of bulk creates: past
                    // gRPC's default 4 MB, and refused again at every reopen.
                    c.watch_client()
                        .max_decoding_message_size(MAX_ANSWER)
                        .watch(prefix, Some(options))
                        .await
                }
            }))?;
        let (tx, rx) = mpsc::channel();
        self.handle.spawn(async move {
            loop {
                let answer = match stream.message().await {
                    Ok(Some(answer)) => answer,
                    Ok(None) => break,
                    Err(e) => {
                        let _ = tx.send(Err(StoreError::Backend(format!("etcd watch: {e}"))));
                        return;
                    }
                };
                let compacted = answer.compact_revision();
                if compacted > 0 {
                    let _ = tx.send(Err(StoreError::Compacted(compacted.max(from))));
                    return;
                }
                if answer.canceled() {
                    let reason = answer.cancel_reason();
                    let _ = tx.send(Err(StoreError::Backend(format!(
                        "etcd watch canceled: {reason}"
                    ))));
                    return;
                }
                let events: Vec<Event> = answer
                    .events()
                    .iter()
                    .filter_map(|e| {
                        let kv = key_value(e.kv()?.clone());
                        Some(match e.event_type() {
                            EventType::Delete => Event::Delete(kv),
                            EventType::Put => Event::Put(kv),
                        })
                    })
                    .collect();
                // One etcd message can hold several revisions: split them.
                let mut events = events.into_iter().peekable();
                while let Some(first) = events.next() {
                    let revision = first.revision();
                    let mut group = vec![first];
                    while let Some(e) = events.next_if(|e| e.revision() == revision) {
                        group.push(e);
                    }
                    if tx.send(Ok(group)).is_err() {
                        return;
                    }
                }
            }
            let _ = tx.send(Err(StoreError::Backend("etcd watch stream ended".into())));
        });
        Ok(rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A create of `n` keys under `tag`: compares that each is absent, and puts.
    fn create(tag: &str, n: usize, bytes: usize) -> Txn {
        let keys: Vec<String> = (0..n).map(|i| format!("/t/{tag}/{i}")).collect();
        Txn {
            compares: keys
                .iter()
                .map(|k| Compare::CreateRevision(k.clone(), 0))
                .collect(),
            ops: keys
                .iter()
                .map(|k| Op::Put(k.clone(), vec![b'x'; bytes]))
                .collect(),
        }
    }

    fn queue(txns: Vec<Txn>) -> VecDeque<Waiting> {
        txns.into_iter()
            .map(|t| (t, oneshot::channel().0))
            .collect()
    }

    fn sizes(mut waiting: VecDeque<Waiting>) -> Vec<usize> {
        let mut taken = Vec::new();
        while !waiting.is_empty() {
            taken.push(Batch::take(&mut waiting, MAX_TXN_OPS, MAX_COMMIT_BYTES).len());
        }
        taken
    }

    #[test]
    fn disjoint_transactions_share_a_commit_within_etcds_limits() {
        let small = (0..50).map(|i| create(&i.to_string(), 4, 10)).collect();
        assert_eq!(sizes(queue(small)), [50]);
        // Each 30 wide: 98 of them and the widest make 128.
        let wide = (0..120).map(|i| create(&i.to_string(), 30, 1)).collect();
        assert_eq!(sizes(queue(wide)), [98, 22]);
        // 100 KB each: two fit in 256 KiB.
        let big = (0..5).map(|i| create(&i.to_string(), 1, 100_000)).collect();
        assert_eq!(sizes(queue(big)), [2, 2, 1]);
        // Too wide to nest: sent alone, as it came.
        let widest = vec![create("a", 1, 1), create("b", 128, 1), create("c", 1, 1)];
        assert_eq!(sizes(queue(widest)), [1, 1, 1]);
    }

    #[test]
    fn a_transaction_on_a_key_of_the_commit_waits_for_the_next() {
        let mut update = create("a", 1, 1);
        update.compares = vec![Compare::ModRevision("/t/a/0".into(), 5)];
        let mut reads = create("z", 1, 1);
        reads
            .compares
            .push(Compare::ModRevision("/t/b/0".into(), 7));
        let txns = vec![create("a", 1, 1), create("b", 1, 1), update, reads];
        let mut waiting = queue(txns);
        let first = Batch::take(&mut waiting, MAX_TXN_OPS, MAX_COMMIT_BYTES);
        assert_eq!(first.len(), 2);
        // The update of a's key goes next, with what follows it.
        assert_eq!(
            waiting.front().unwrap().0.compares,
            [Compare::ModRevision("/t/a/0".into(), 5)]
        );
        assert_eq!(sizes(waiting), [2]);
    }

    #[test]
    fn transactions_that_only_compare_one_key_share_a_commit() {
        let port = |tag: &str| {
            let mut t = create(tag, 2, 1);
            t.compares
                .push(Compare::ModRevision("/t/network".into(), 3));
            t
        };
        let mut network_update = create("n", 1, 1);
        network_update
            .ops
            .push(Op::Put("/t/network".into(), vec![1]));
        let txns = vec![port("a"), port("b"), port("c"), network_update, port("d")];
        assert_eq!(sizes(queue(txns)), [3, 1, 1]);
    }

    #[test]
    fn a_prefix_compare_goes_alone() {
        let mut empty = create("p", 1, 1);
        empty.compares.push(Compare::PrefixEmpty("/t/q/".into()));
        let txns = vec![
            create("a", 1, 1),
            empty,
            create("b", 1, 1),
            create("c", 1, 1),
        ];
        assert_eq!(sizes(queue(txns)), [1, 1, 2]);
    }
}
