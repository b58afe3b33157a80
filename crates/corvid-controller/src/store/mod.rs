//! The controller's state store, shaped like etcd: keys with create and mod revisions, one
//! global revision bumped per commit (one transaction, or on etcd several that queued
//! together), compare-and-swap transactions, and a prefix watch that resumes from a
//! revision. Two backends: `redb` (embedded, default) and `etcd`.

pub mod etcd;
pub mod redb;

use std::sync::mpsc::Receiver;
use std::sync::Arc;

use tokio::sync::oneshot;

/// One stored key.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyValue {
    /// The key.
    pub key: String,
    /// The value (empty for a delete event).
    pub value: Vec<u8>,
    /// Revision that created the key.
    pub create_revision: i64,
    /// Revision of the key's last change (of the delete, for a delete event).
    pub mod_revision: i64,
}

/// A condition a transaction checks before writing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Compare {
    /// The key's create revision is this (0: the key does not exist).
    CreateRevision(String, i64),
    /// The key's mod revision is this (0: the key does not exist).
    ModRevision(String, i64),
    /// No key starts with this prefix.
    PrefixEmpty(String),
}

/// A write in a transaction.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Set a key.
    Put(String, Vec<u8>),
    /// Remove a key (no error if absent).
    Delete(String),
}

/// All-or-nothing: every compare holds, then every op applies at one new revision (which
/// other transactions committed with it may share).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Txn {
    /// Conditions.
    pub compares: Vec<Compare>,
    /// Writes applied if all conditions hold.
    pub ops: Vec<Op>,
}

/// A change seen by a watch.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A key was set.
    Put(KeyValue),
    /// A key was removed.
    Delete(KeyValue),
}

impl Event {
    /// The revision of the change.
    pub fn revision(&self) -> i64 {
        match self {
            Event::Put(kv) | Event::Delete(kv) => kv.mod_revision,
        }
    }
}

/// What a store operation can fail with.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The backend could not do the operation.
    #[error("store: {0}")]
    Backend(String),
    /// A watch asked for history the store no longer has.
    #[error("store: revision {0} is compacted")]
    Compacted(i64),
    /// The store refuses a transaction with this many compares or writes.
    #[error("store: {0}")]
    TooLarge(String),
}

/// What a transaction came to: whether its compares held, and the store revision.
pub type TxnOutcome = Result<(bool, i64), StoreError>;

/// A revisioned key-value store. `range` and `watch` block; `txn` answers on a channel, so
/// a request waiting for its commit holds no thread. The blocking methods must not be
/// called on an async task (the etcd store drives its own runtime from them, which panics
/// there): use `spawn_blocking`.
pub trait Store: Send + Sync {
    /// Every key under `prefix`, and the revision they were read at.
    fn range(&self, prefix: &str) -> Result<(Vec<KeyValue>, i64), StoreError> {
        self.snapshot(&[prefix], None)
    }
    /// Every key under each of `prefixes`, all read at one revision: `revision`, or the
    /// present when none; with that revision. `Compacted` when the store no longer holds
    /// `revision` (or keeps no history across restarts).
    fn snapshot(
        &self,
        prefixes: &[&str],
        revision: Option<i64>,
    ) -> Result<(Vec<KeyValue>, i64), StoreError>;
    /// `snapshot`, handing the keys to `batch` as they are read (a page at a time on
    /// etcd), so that the caller parses one batch while the store reads the next; the
    /// revision read at. The keys handed over before an error are not all there are.
    fn snapshot_batches(
        &self,
        prefixes: &[&str],
        revision: Option<i64>,
        batch: &mut dyn FnMut(Vec<KeyValue>),
    ) -> Result<i64, StoreError> {
        let (kvs, at) = self.snapshot(prefixes, revision)?;
        batch(kvs);
        Ok(at)
    }
    /// The store's current revision, read cheaply. Writes of others under other
    /// prefixes (an etcd shared with other users) move it without an event for the view.
    fn revision(&self) -> Result<i64, StoreError>;
    /// A revision at or past the store's present at which the watch under the root is
    /// sure to deliver an event: once the view has applied it, it holds every change of
    /// the root up to the present.
    fn mark_progress(&self) -> Result<i64, StoreError>;
    /// Applies `txn` if its compares hold. The outcome arrives once a success is durable.
    /// Call it within the tokio runtime.
    fn txn(self: Arc<Self>, txn: Txn) -> oneshot::Receiver<TxnOutcome>;
    /// Changes under `prefix` from revision `from` on, in revision order, grouped by
    /// revision. The channel closes (after an error item) if the watch breaks.
    fn watch(
        &self,
        prefix: &str,
        from: i64,
    ) -> Result<Receiver<Result<Vec<Event>, StoreError>>, StoreError>;
}

/// Opens the store a `--store` argument names: `redb:<path>` or `etcd:<url>[,<url>...]`.
pub fn open(spec: &str) -> Result<Arc<dyn Store>, StoreError> {
    match spec.split_once(':') {
        Some(("redb", path)) => Ok(Arc::new(redb::RedbStore::open(path.as_ref())?)),
        Some(("etcd", urls)) => Ok(Arc::new(etcd::EtcdStore::connect(urls)?)),
        _ => Err(StoreError::Backend(format!(
            "unknown store {spec:?}: use redb:<path> or etcd:<url>"
        ))),
    }
}

/// The first key after every key starting with `prefix` (etcd's range_end).
pub fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}
