//! The embedded store: one redb file. Writes go through a single writer thread that folds
//! every transaction waiting at that moment into one redb commit (group commit), so one
//! fsync covers many requests; each transaction still gets its own revision and sees the
//! writes of those before it.

// redb's own error type is large; it only travels on the rare failure path.
#![allow(clippy::result_large_err)]

use std::collections::VecDeque;
use std::path::Path;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use redb::{Database, ReadableTable, Table, TableDefinition, TableHandle, WriteTransaction};

use tokio::sync::oneshot;

use super::{Compare, Event, KeyValue, Op, Store, StoreError, Txn, TxnOutcome};

/// Keys are bytes: a `&str` key table checks UTF-8 on every comparison of every lookup,
/// which cost the writer thread an eighth of its time.
const KV: TableDefinition<&[u8], &[u8]> = TableDefinition::new("kv-bytes");
/// The key table of stores written before keys were bytes; moved into `KV` on open.
const KV_STR: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
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

type Reply = oneshot::Sender<TxnOutcome>;
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
    /// The writer thread, which holds the database too: waited for on drop.
    writer_thread: Option<JoinHandle<()>>,
    feed: Arc<Mutex<Feed>>,
}

impl Drop for RedbStore {
    /// Ends the writer thread and waits for it, so the file is free for the next opener
    /// (redb locks it whole) once the store is dropped, not some time after.
    fn drop(&mut self) {
        drop(std::mem::replace(&mut self.writer, mpsc::channel().0));
        if let Some(t) = self.writer_thread.take() {
            let _ = t.join();
        }
    }
}

fn backend<E: std::fmt::Display>(e: E) -> StoreError {
    StoreError::Backend(e.to_string())
}

/// Stored value layout: create revision, mod revision (little endian), then the value.
fn pack_record(create: i64, modified: i64, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + value.len());
    out.extend_from_slice(&create.to_le_bytes());
    out.extend_from_slice(&modified.to_le_bytes());
    out.extend_from_slice(value);
    out
}

fn revision_at(raw: &[u8], i: usize) -> i64 {
    i64::from_le_bytes(
        raw.get(i..i + 8)
            .and_then(|b| b.try_into().ok())
            .unwrap_or([0; 8]),
    )
}

fn unpack_record(key: &[u8], raw: &[u8]) -> KeyValue {
    KeyValue {
        key: String::from_utf8_lossy(key).into_owned(),
        value: raw.get(16..).unwrap_or_default().to_vec(),
        create_revision: revision_at(raw, 0),
        mod_revision: revision_at(raw, 8),
    }
}

/// Moves a store's `&str`-keyed table into the byte-keyed one.
fn migrate_str_keys(wtx: &WriteTransaction) -> Result<(), redb::Error> {
    if !wtx.list_tables()?.any(|t| t.name() == KV_STR.name()) {
        return Ok(());
    }
    {
        let old = wtx.open_table(KV_STR)?;
        let mut new = wtx.open_table(KV)?;
        for entry in old.iter()? {
            let (k, v) = entry?;
            new.insert(k.value().as_bytes(), v.value())?;
        }
    }
    wtx.delete_table(KV_STR)?;
    Ok(())
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
        migrate_str_keys(&wtx).map_err(backend)?;
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
        let writer_thread = std::thread::Builder::new()
            .name("corvid-redb-writer".into())
            .spawn(move || writer(&wdb, &wfeed, rx, revision))
            .map_err(backend)?;
        Ok(RedbStore {
            db,
            writer: tx,
            writer_thread: Some(writer_thread),
            feed,
        })
    }
}

/// The key table as the batch's write transaction sees it.
type KvTable<'t> = Table<'t, &'static [u8], &'static [u8]>;

/// Evaluates one compare against the write transaction's current state.
fn holds(table: &KvTable, c: &Compare) -> Result<bool, redb::Error> {
    let revs = |key: &str| -> Result<(i64, i64), redb::Error> {
        Ok(match table.get(key.as_bytes())? {
            Some(g) => (revision_at(g.value(), 0), revision_at(g.value(), 8)),
            None => (0, 0),
        })
    };
    Ok(match c {
        Compare::CreateRevision(k, want) => revs(k)?.0 == *want,
        Compare::ModRevision(k, want) => revs(k)?.1 == *want,
        Compare::PrefixEmpty(p) => match table.range(p.as_bytes()..)?.next() {
            Some(entry) => !entry?.0.value().starts_with(p.as_bytes()),
            None => true,
        },
    })
}

/// Applies one transaction inside the batch's write transaction. The table is opened
/// once per batch: each open and close rewrites the table's root entry.
fn apply(table: &mut KvTable, txn: &Txn, rev: i64) -> Result<Option<Vec<Event>>, redb::Error> {
    for c in &txn.compares {
        if !holds(table, c)? {
            return Ok(None);
        }
    }
    let mut events = Vec::with_capacity(txn.ops.len());
    for op in &txn.ops {
        match op {
            Op::Put(key, value) => {
                // Most puts create their key: insert as new, and rewrite with the key's
                // own create revision only when it already existed.
                let stored = pack_record(rev, rev, value);
                let old_create = table
                    .insert(key.as_bytes(), stored.as_slice())?
                    .map(|old| revision_at(old.value(), 0));
                let create = match old_create {
                    Some(c) if c != rev => {
                        table.insert(key.as_bytes(), pack_record(c, rev, value).as_slice())?;
                        c
                    }
                    _ => rev,
                };
                events.push(Event::Put(KeyValue {
                    key: key.clone(),
                    value: value.clone(),
                    create_revision: create,
                    mod_revision: rev,
                }));
            }
            Op::Delete(key) => {
                if table.remove(key.as_bytes())?.is_some() {
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
        let started = std::time::Instant::now();
        let committed = (|| -> Result<Vec<(bool, i64, Vec<Event>)>, redb::Error> {
            let wtx = db.begin_write()?;
            let mut rev = revision;
            let mut outcomes = Vec::with_capacity(batch.len());
            let mut table = wtx.open_table(KV)?;
            for (txn, _) in &batch {
                match apply(&mut table, txn, rev + 1)? {
                    // Nothing changed (no ops, or deletes of absent keys): as in etcd, no
                    // new revision, which no watcher would ever see.
                    Some(events) if events.is_empty() => outcomes.push((true, rev, events)),
                    Some(events) => {
                        rev += 1;
                        outcomes.push((true, rev, events));
                    }
                    None => outcomes.push((false, rev, Vec::new())),
                }
            }
            drop(table);
            wtx.open_table(META)?.insert(REVISION, rev)?;
            wtx.commit()?;
            Ok(outcomes)
        })();
        let metrics = &crate::metrics::METRICS;
        metrics
            .commit_seconds
            .observe(started.elapsed().as_secs_f64());
        metrics.commit_batch.observe(batch.len() as f64);
        match committed {
            Ok(outcomes) => {
                let answers: Vec<(bool, i64)> =
                    outcomes.iter().map(|(ok, rev, _)| (*ok, *rev)).collect();
                let mut f = feed.lock().unwrap_or_else(|p| p.into_inner());
                for (ok, rev, events) in outcomes {
                    if ok {
                        publish(&mut f, rev, events);
                    }
                }
                revision = f.revision;
                drop(f);
                for ((_, reply), answer) in batch.into_iter().zip(answers) {
                    let _ = reply.send(Ok(answer));
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

impl RedbStore {
    fn revision_in(rtx: &redb::ReadTransaction) -> Result<i64, StoreError> {
        Ok(rtx
            .open_table(META)
            .map_err(backend)?
            .get(REVISION)
            .map_err(backend)?
            .map(|g| g.value())
            .unwrap_or(0))
    }
}

impl Store for RedbStore {
    fn revision(&self) -> Result<i64, StoreError> {
        RedbStore::revision_in(&self.db.begin_read().map_err(backend)?)
    }

    fn mark_progress(&self) -> Result<i64, StoreError> {
        // Every revision of the file is a change of corvid's, which the watch delivers.
        self.revision()
    }

    fn snapshot(
        &self,
        prefixes: &[&str],
        revision: Option<i64>,
    ) -> Result<(Vec<KeyValue>, i64), StoreError> {
        if let Some(r) = revision {
            // The file holds the latest value of each key alone.
            return Err(StoreError::Compacted(r));
        }
        let rtx = self.db.begin_read().map_err(backend)?;
        let table = rtx.open_table(KV).map_err(backend)?;
        let mut out = Vec::new();
        for prefix in prefixes {
            for entry in table.range(prefix.as_bytes()..).map_err(backend)? {
                let (k, v) = entry.map_err(backend)?;
                if !k.value().starts_with(prefix.as_bytes()) {
                    break;
                }
                out.push(unpack_record(k.value(), v.value()));
            }
        }
        Ok((out, RedbStore::revision_in(&rtx)?))
    }

    fn txn(self: Arc<Self>, txn: Txn) -> oneshot::Receiver<TxnOutcome> {
        let (tx, rx) = oneshot::channel();
        if let Err(mpsc::SendError((_, tx))) = self.writer.send((txn, tx)) {
            let _ = tx.send(Err(StoreError::Backend("writer thread is gone".into())));
        }
        rx
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

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, value: &str) -> Op {
        Op::Put(key.into(), value.as_bytes().to_vec())
    }

    fn run(store: &Arc<RedbStore>, txn: Txn) -> (bool, i64) {
        store.clone().txn(txn).blocking_recv().unwrap().unwrap()
    }

    #[test]
    fn a_rewritten_key_keeps_its_create_revision() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(RedbStore::open(&dir.path().join("s.redb")).unwrap());
        let first = Txn {
            compares: vec![Compare::CreateRevision("/k".into(), 0)],
            ops: vec![put("/k", "a")],
        };
        assert_eq!(run(&store, first.clone()), (true, 1));
        assert_eq!(run(&store, first), (false, 1), "the key exists now");
        let second = Txn {
            compares: vec![Compare::ModRevision("/k".into(), 1)],
            ops: vec![put("/k", "b"), put("/l", "c")],
        };
        assert_eq!(run(&store, second), (true, 2));
        let (kvs, revision) = store.range("/").unwrap();
        assert_eq!(revision, 2);
        let revs: Vec<_> = kvs
            .iter()
            .map(|kv| {
                (
                    kv.key.as_str(),
                    kv.value.as_slice(),
                    kv.create_revision,
                    kv.mod_revision,
                )
            })
            .collect();
        assert_eq!(revs, [("/k", &b"b"[..], 1, 2), ("/l", &b"c"[..], 2, 2)]);
        let nothing = Txn {
            compares: vec![Compare::ModRevision("/k".into(), 2)],
            ops: vec![Op::Delete("/gone".into())],
        };
        assert_eq!(
            run(&store, nothing),
            (true, 2),
            "a change of nothing keeps the revision"
        );
    }

    #[test]
    fn a_dropped_store_lets_the_next_opener_have_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        for _ in 0..20 {
            let store = Arc::new(RedbStore::open(&path).unwrap());
            run(&store, Txn::default());
            drop(store);
        }
    }

    #[test]
    fn a_store_with_text_keys_is_moved_to_byte_keys_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.redb");
        {
            let db = Database::create(&path).unwrap();
            let wtx = db.begin_write().unwrap();
            wtx.open_table(KV_STR)
                .unwrap()
                .insert("/corvid/r/networks/n1", pack_record(3, 5, b"{}").as_slice())
                .unwrap();
            wtx.open_table(META).unwrap().insert(REVISION, 5).unwrap();
            wtx.commit().unwrap();
        }
        let store = RedbStore::open(&path).unwrap();
        let (kvs, revision) = store.range("/corvid/").unwrap();
        assert_eq!(revision, 5);
        assert_eq!(kvs.len(), 1);
        assert_eq!(
            (
                kvs[0].key.as_str(),
                kvs[0].create_revision,
                kvs[0].mod_revision
            ),
            ("/corvid/r/networks/n1", 3, 5)
        );
        let rtx = store.db.begin_read().unwrap();
        assert!(
            !rtx.list_tables()
                .unwrap()
                .any(|t| t.name() == KV_STR.name()),
            "the text-keyed table is gone"
        );
    }
}
