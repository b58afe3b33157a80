//! The embedded store: one redb file. Writes go through a single writer thread that folds
//! every transaction waiting at that moment into one redb commit (group commit), so one
//! fsync covers many requests; each transaction still gets its own revision and sees the
//! writes of those before it.

// redb's own error type is large; it only travels on the rare failure path.
#![allow(clippy::result_large_err)]

use std::collections::VecDeque;
use std::path::Path;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};

use redb::{Database, ReadableTable, TableDefinition, WriteTransaction};

use super::{Compare, Event, KeyValue, Op, Store, StoreError, Txn};

const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
const META: TableDefinition<&str, i64> = TableDefinition::new("meta");
const REVISION: &str = "revision";
/// How many recent key changes a watch can resume from. Counted in changes, not
/// revisions: a bulk create is one revision of hundreds of ports, and a revision count
/// would keep the whole store a second time in memory.
const HISTORY: usize = 10_000;
/// redb's page cache.
const CACHE: usize = 32 << 20;
/// Most transactions folded into one commit.
const MAX_BATCH: usize = 512;

type Reply = SyncSender<Result<(bool, i64), StoreError>>;
type WatchSender = Sender<Result<Vec<Event>, StoreError>>;

/// Recent history and live watchers, guarded together so a new watcher misses nothing.
struct Feed {
    revision: i64,
    history: VecDeque<(i64, Vec<Event>)>,
    /// Events in `history`.
    history_len: usize,
    watchers: Vec<(String, WatchSender)>,
}

/// The redb-backed store.
pub struct RedbStore {
    db: Arc<Database>,
    writer: Sender<(Txn, Reply)>,
    feed: Arc<Mutex<Feed>>,
}

fn backend<E: std::fmt::Display>(e: E) -> StoreError {
    StoreError::Backend(e.to_string())
}

/// Stored value layout: create revision, mod revision (little endian), then the value.
fn encode(create: i64, modified: i64, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + value.len());
    out.extend_from_slice(&create.to_le_bytes());
    out.extend_from_slice(&modified.to_le_bytes());
    out.extend_from_slice(value);
    out
}

fn decode(key: &str, raw: &[u8]) -> KeyValue {
    let rev = |i: usize| i64::from_le_bytes(raw[i..i + 8].try_into().unwrap_or([0; 8]));
    KeyValue {
        key: key.to_string(),
        value: raw.get(16..).unwrap_or_default().to_vec(),
        create_revision: rev(0),
        mod_revision: rev(8),
    }
}

impl RedbStore {
    /// Opens (or creates) the store file; only one process can hold it.
    pub fn open(path: &Path) -> Result<RedbStore, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(backend)?;
        }
        let db = Arc::new(
            // redb caches up to 1 GiB by default; the view already holds what is read often.
            Database::builder()
                .set_cache_size(CACHE)
                .create(path)
                .map_err(|e| StoreError::Backend(format!("opening {}: {e}", path.display())))?,
        );
        let wtx = db.begin_write().map_err(backend)?;
        let revision = {
            wtx.open_table(KV).map_err(backend)?;
            let meta = wtx.open_table(META).map_err(backend)?;
            let r = meta.get(REVISION).map_err(backend)?.map(|g| g.value());
            r.unwrap_or(0)
        };
        wtx.commit().map_err(backend)?;
        let feed = Arc::new(Mutex::new(Feed {
            revision,
            history: VecDeque::new(),
            history_len: 0,
            watchers: Vec::new(),
        }));
        let (tx, rx) = mpsc::channel();
        let (wdb, wfeed) = (db.clone(), feed.clone());
        std::thread::Builder::new()
            .name("corvid-redb-writer".into())
            .spawn(move || writer(&wdb, &wfeed, rx, revision))
            .map_err(backend)?;
        Ok(RedbStore {
            db,
            writer: tx,
            feed,
        })
    }
}

/// Evaluates one compare against the write transaction's current state.
fn holds(wtx: &WriteTransaction, c: &Compare) -> Result<bool, redb::Error> {
    let table = wtx.open_table(KV)?;
    let revs = |key: &str| -> Result<(i64, i64), redb::Error> {
        Ok(match table.get(key)? {
            Some(g) => {
                let kv = decode(key, g.value());
                (kv.create_revision, kv.mod_revision)
            }
            None => (0, 0),
        })
    };
    Ok(match c {
        Compare::CreateRevision(k, want) => revs(k)?.0 == *want,
        Compare::ModRevision(k, want) => revs(k)?.1 == *want,
        Compare::PrefixEmpty(p) => match table.range(p.as_str()..)?.next() {
            Some(entry) => !entry?.0.value().starts_with(p.as_str()),
            None => true,
        },
    })
}

/// Applies one transaction inside the batch's write transaction.
fn apply(wtx: &WriteTransaction, txn: &Txn, rev: i64) -> Result<Option<Vec<Event>>, redb::Error> {
    for c in &txn.compares {
        if !holds(wtx, c)? {
            return Ok(None);
        }
    }
    let mut table = wtx.open_table(KV)?;
    let mut events = Vec::with_capacity(txn.ops.len());
    for op in &txn.ops {
        match op {
            Op::Put(key, value) => {
                let create = match table.get(key.as_str())? {
                    Some(g) => decode(key, g.value()).create_revision,
                    None => rev,
                };
                table.insert(key.as_str(), encode(create, rev, value).as_slice())?;
                events.push(Event::Put(KeyValue {
                    key: key.clone(),
                    value: value.clone(),
                    create_revision: create,
                    mod_revision: rev,
                }));
            }
            Op::Delete(key) => {
                if table.remove(key.as_str())?.is_some() {
                    events.push(Event::Delete(KeyValue {
                        key: key.clone(),
                        value: Vec::new(),
                        create_revision: 0,
                        mod_revision: rev,
                    }));
                }
            }
        }
    }
    Ok(Some(events))
}

fn writer(db: &Database, feed: &Mutex<Feed>, rx: Receiver<(Txn, Reply)>, mut revision: i64) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(more) => batch.push(more),
                Err(_) => break,
            }
        }
        let committed = (|| -> Result<Vec<(bool, i64, Vec<Event>)>, redb::Error> {
            let wtx = db.begin_write()?;
            let mut rev = revision;
            let mut outcomes = Vec::with_capacity(batch.len());
            for (txn, _) in &batch {
                match apply(&wtx, txn, rev + 1)? {
                    Some(events) => {
                        rev += 1;
                        outcomes.push((true, rev, events));
                    }
                    None => outcomes.push((false, rev, Vec::new())),
                }
            }
            wtx.open_table(META)?.insert(REVISION, rev)?;
            wtx.commit()?;
            Ok(outcomes)
        })();
        match committed {
            Ok(outcomes) => {
                let mut f = feed.lock().unwrap_or_else(|p| p.into_inner());
                for (ok, rev, events) in &outcomes {
                    if *ok {
                        publish(&mut f, *rev, events.clone());
                    }
                }
                revision = f.revision;
                drop(f);
                for ((_, reply), (ok, rev, _)) in batch.into_iter().zip(outcomes) {
                    let _ = reply.send(Ok((ok, rev)));
                }
            }
            Err(e) => {
                for (_, reply) in batch {
                    let _ = reply.send(Err(backend(&e)));
                }
            }
        }
    }
}

fn publish(f: &mut Feed, rev: i64, events: Vec<Event>) {
    f.revision = rev;
    f.watchers.retain(|(prefix, tx)| {
        let mine: Vec<Event> = events
            .iter()
            .filter(|e| key_of(e).starts_with(prefix.as_str()))
            .cloned()
            .collect();
        mine.is_empty() || tx.send(Ok(mine)).is_ok()
    });
    f.history_len += events.len();
    f.history.push_back((rev, events));
    while f.history_len > HISTORY && f.history.len() > 1 {
        if let Some((_, old)) = f.history.pop_front() {
            f.history_len -= old.len();
        }
    }
}

fn key_of(e: &Event) -> &str {
    match e {
        Event::Put(kv) | Event::Delete(kv) => &kv.key,
    }
}

impl Store for RedbStore {
    fn range(&self, prefix: &str) -> Result<(Vec<KeyValue>, i64), StoreError> {
        let rtx = self.db.begin_read().map_err(backend)?;
        let table = rtx.open_table(KV).map_err(backend)?;
        let revision = rtx
            .open_table(META)
            .map_err(backend)?
            .get(REVISION)
            .map_err(backend)?
            .map(|g| g.value())
            .unwrap_or(0);
        let mut out = Vec::new();
        for entry in table.range(prefix..).map_err(backend)? {
            let (k, v) = entry.map_err(backend)?;
            if !k.value().starts_with(prefix) {
                break;
            }
            out.push(decode(k.value(), v.value()));
        }
        Ok((out, revision))
    }

    fn txn(&self, txn: Txn) -> Result<(bool, i64), StoreError> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.writer
            .send((txn, tx))
            .map_err(|_| StoreError::Backend("writer thread is gone".into()))?;
        rx.recv()
            .map_err(|_| StoreError::Backend("writer thread is gone".into()))?
    }

    fn watch(
        &self,
        prefix: &str,
        from: i64,
    ) -> Result<Receiver<Result<Vec<Event>, StoreError>>, StoreError> {
        let mut f = self.feed.lock().unwrap_or_else(|p| p.into_inner());
        let oldest = f.history.front().map(|(r, _)| *r).unwrap_or(f.revision + 1);
        if from <= f.revision && from < oldest {
            return Err(StoreError::Compacted(from));
        }
        let (tx, rx) = mpsc::channel();
        for (rev, events) in &f.history {
            if *rev < from {
                continue;
            }
            let mine: Vec<Event> = events
                .iter()
                .filter(|e| key_of(e).starts_with(prefix))
                .cloned()
                .collect();
            if !mine.is_empty() {
                let _ = tx.send(Ok(mine));
            }
        }
        f.watchers.push((prefix.to_string(), tx));
        Ok(rx)
    }
}
