//! The controller's core: the store, the view that follows it, and the commit path every
//! write takes (a compare-and-swap transaction, then waiting until the view shows it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use tokio::sync::watch;

use crate::error::NeutronError;
use crate::ipam::{Allocator, Pending};
use crate::keys;
use crate::store::{Compare, Op, Store, StoreError, Txn};
use crate::view::View;
use crate::wakers::{Waker, Wakers};

/// Shared state of one controller process.
pub struct Controller {
    store: Arc<dyn Store>,
    view: RwLock<View>,
    applied: watch::Sender<i64>,
    /// Addresses and MACs picked by requests in flight, and where the next picks start.
    allocator: Allocator,
    /// The token every request must carry, if set.
    pub token: Option<String>,
    /// When the view was last known to hold everything the store had (milliseconds
    /// after `started`).
    confirmed: AtomicU64,
    started: Instant,
    /// Held shared by every create that names its own IDs until it has committed (or
    /// failed), even when its client is gone; a "not found" waits for it exclusively.
    creates: Arc<tokio::sync::RwLock<()>>,
    /// Set when the process is stopping: long polls answer at once instead of keeping
    /// the graceful shutdown waiting for their timeout.
    stopping: watch::Sender<bool>,
    /// The cluster's identity, the same for every controller on the store.
    pub cluster_id: String,
    /// The watch feed's long polls, woken by the changes they may want.
    wakers: Wakers,
}

/// How often the view is checked against the store while no change arrives.
const PROBE: Duration = Duration::from_secs(1);

/// A view not confirmed current for this long may be stale: reads say so, and a watch
/// that fell this far behind the store is opened again.
const STALE_AFTER: Duration = Duration::from_secs(3);

/// The longest a write waits for the view to show it; past it the write, which the
/// store has made durable, is answered anyway.
const VIEW_WAIT: Duration = Duration::from_secs(10);

/// The store's cluster ID, made now if no controller made it before (two controllers
/// starting at once on one etcd agree: only one create succeeds).
async fn cluster_id(store: &Arc<dyn Store>) -> Result<String, StoreError> {
    loop {
        let reading = store.clone();
        let (kvs, _) = tokio::task::spawn_blocking(move || reading.range(keys::CLUSTER_ID))
            .await
            .map_err(|e| StoreError::Backend(format!("reading the cluster ID: {e}")))??;
        if let Some(kv) = kvs.iter().find(|kv| kv.key == keys::CLUSTER_ID) {
            return Ok(String::from_utf8_lossy(&kv.value).into_owned());
        }
        let id = crate::util::new_id();
        let txn = Txn {
            compares: vec![Compare::CreateRevision(keys::CLUSTER_ID.into(), 0)],
            ops: vec![Op::Put(keys::CLUSTER_ID.into(), id.clone().into_bytes())],
        };
        let (made, _) = store
            .clone()
            .txn(txn)
            .await
            .map_err(|_| StoreError::Backend("the store dropped a transaction".into()))??;
        if made {
            return Ok(id);
        }
    }
}

impl Controller {
    /// Loads the store into a view and follows it from then on.
    pub async fn start(
        store: Arc<dyn Store>,
        token: Option<String>,
    ) -> Result<Arc<Controller>, StoreError> {
        let cluster_id = cluster_id(&store).await?;
        // Seconds of reading and parsing at scale, kept off the runtime's workers, which
        // meanwhile take the connections that wait for it.
        let reading = store.clone();
        let (view, present) = tokio::task::spawn_blocking(move || {
            let began = Instant::now();
            let (view, present) = load(reading.as_ref())?;
            tracing::info!(
                revision = view.revision,
                load_s = began.elapsed().as_secs_f64(),
                "view loaded"
            );
            Ok::<_, StoreError>((view, present))
        })
        .await
        .map_err(|e| StoreError::Backend(format!("loading the view: {e}")))??;
        let (applied, _) = watch::channel(view.revision);
        let ctl = Arc::new(Controller {
            store,
            view: RwLock::new(view),
            applied,
            allocator: Allocator::default(),
            token,
            confirmed: AtomicU64::new(0),
            started: Instant::now(),
            creates: Arc::default(),
            stopping: watch::channel(false).0,
            cluster_id,
            wakers: Wakers::default(),
        });
        let follower = Arc::downgrade(&ctl);
        std::thread::Builder::new()
            .name("corvid-view".into())
            .spawn(move || follow(follower))
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        // A view loaded in the past is brought to the present before anything is served.
        if tokio::time::timeout(CATCH_UP, ctl.wait_for(present))
            .await
            .is_err()
        {
            tracing::warn!(
                revision = ctl.view().revision,
                present,
                "the view has not caught up with the store: serving it, marked stale until it does"
            );
        }
        tracing::info!(
            revision = ctl.view().revision,
            catch_up_s = ctl.started.elapsed().as_secs_f64(),
            "view current"
        );
        Ok(ctl)
    }

    /// The current view, for reading.
    pub fn view(&self) -> RwLockReadGuard<'_, View> {
        self.view.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the view may be behind the store: it has not been confirmed current for a
    /// while (the store is unreachable, or the watch is behind).
    pub fn may_be_stale(&self) -> bool {
        self.unconfirmed() > STALE_AFTER
    }

    /// How long since the view was last confirmed to hold everything the store has.
    pub fn unconfirmed(&self) -> Duration {
        let confirmed = Duration::from_millis(self.confirmed.load(Ordering::Relaxed));
        self.started.elapsed().saturating_sub(confirmed)
    }

    /// Notes that the view was current just now.
    fn confirm(&self) {
        let now = self.started.elapsed().as_millis() as u64;
        self.confirmed.store(now, Ordering::Relaxed);
    }

    /// A fresh set of in-flight reservations.
    pub fn pending(&self) -> Pending<'_> {
        self.allocator.pending()
    }

    /// Waits until the view has applied `revision`.
    pub async fn wait_for(&self, revision: i64) {
        let mut rx = self.applied.subscribe();
        let _ = rx.wait_for(|r| *r >= revision).await;
    }

    /// Runs `create` (a create naming its own IDs) to its end on a task of its own, so a
    /// client that goes away cannot cut it between the store and the view, with the
    /// create fence held shared.
    pub async fn create_named<T: Send + 'static>(
        self: &Arc<Self>,
        create: impl std::future::Future<Output = Result<T, NeutronError>> + Send + 'static,
    ) -> Result<T, NeutronError> {
        let fence = self.creates.clone().read_owned().await;
        tokio::spawn(async move {
            let out = create.await;
            drop(fence);
            out
        })
        .await
        .map_err(|e| NeutronError::from(StoreError::Backend(format!("a create failed: {e}"))))?
    }

    /// Waits (at most `VIEW_WAIT`) until the view holds everything the store has now.
    async fn catch_up_with_store(&self) {
        let store = self.store.clone();
        let Ok(Ok(revision)) = tokio::task::spawn_blocking(move || store.revision()).await else {
            return;
        };
        if self.view().revision >= revision {
            return;
        }
        // The store's revision may have moved for others' keys alone, which no event
        // brings: a mark of progress is delivered after every change before it.
        let store = self.store.clone();
        let Ok(Ok(mark)) = tokio::task::spawn_blocking(move || store.mark_progress()).await else {
            return;
        };
        let _ = tokio::time::timeout(VIEW_WAIT, self.wait_for(mark)).await;
    }

    /// Waits up to `timeout` for the view to move past `revision`, or until the process
    /// stops.
    pub async fn wait_past(&self, revision: i64, timeout: Duration) {
        let mut stopping = self.stopping.subscribe();
        tokio::select! {
            _ = tokio::time::timeout(timeout, self.wait_for(revision + 1)) => {}
            _ = stopping.wait_for(|s| *s) => {}
        }
    }

    /// A place among the watch feed's long polls, for one filtering ports on `host`.
    pub fn join_watch(&self, host: Option<&str>) -> Waker<'_> {
        self.wakers.join(host)
    }

    /// Waits until `woken` fires (enabled before the caller looked at the view, so that
    /// no change in between is missed), `deadline` passes, or the process stops.
    pub async fn wait_change(
        &self,
        woken: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
        deadline: tokio::time::Instant,
    ) {
        let mut stopping = self.stopping.subscribe();
        tokio::select! {
            _ = woken => {}
            _ = tokio::time::sleep_until(deadline) => {}
            _ = stopping.wait_for(|s| *s) => {}
        }
    }

    /// The process is stopping: wakes every long poll.
    pub fn stop(&self) {
        self.stopping.send_replace(true);
    }

    /// Whether the process is stopping.
    pub fn stopping(&self) -> bool {
        *self.stopping.borrow()
    }

    /// Runs `txn` on the store. On success waits until the view shows it and returns the
    /// revision; `None` when a compare failed (the caller re-reads and decides).
    pub async fn commit(&self, txn: Txn) -> Result<Option<i64>, NeutronError> {
        let (ok, revision) = self
            .store
            .clone()
            .txn(txn)
            .await
            .map_err(|_| StoreError::Backend("the store dropped a transaction".into()))??;
        if !ok {
            return Ok(None);
        }
        if tokio::time::timeout(VIEW_WAIT, self.wait_for(revision))
            .await
            .is_err()
        {
            tracing::warn!(
                revision,
                "the view did not show a committed write in time; answering from the store"
            );
        }
        Ok(Some(revision))
    }
}

/// How often a write re-reads and retries after losing a compare-and-swap race.
const RETRIES: usize = 64;

impl Controller {
    /// The write path: `prepare` reads the view and returns a transaction and what to
    /// answer if it commits; a lost compare-and-swap race re-runs `prepare` on a fresher
    /// view. "Not found" is answered only once the view has caught up with the store: an
    /// object another controller just made (a network made on one, its subnet asked of
    /// another) may not have reached this one's view yet.
    pub async fn transact<T>(
        &self,
        prepare: impl FnMut(&View) -> Result<(Txn, T), NeutronError>,
    ) -> Result<T, NeutronError> {
        self.transact_with(prepare, false).await
    }

    /// `transact` for a change to an object named by its client (a DELETE): "not found"
    /// is answered only once the creates naming their own IDs that were under way have
    /// ended and the view has caught up with the store. A plugin killed mid-ADD leaves
    /// its create running, and the DEL sent next must find what it makes.
    pub async fn transact_named<T>(
        &self,
        prepare: impl FnMut(&View) -> Result<(Txn, T), NeutronError>,
    ) -> Result<T, NeutronError> {
        self.transact_with(prepare, true).await
    }

    async fn transact_with<T>(
        &self,
        mut prepare: impl FnMut(&View) -> Result<(Txn, T), NeutronError>,
        named: bool,
    ) -> Result<T, NeutronError> {
        let mut synced = false;
        for _ in 0..RETRIES {
            let prepared = {
                let v = self.view();
                prepare(&v).map(|(txn, out)| (txn, out, v.revision))
            };
            let (txn, out, seen) = match prepared {
                Err(e) if e.status == StatusCode::NOT_FOUND && !synced => {
                    synced = true;
                    if named {
                        drop(self.creates.write().await);
                    }
                    self.catch_up_with_store().await;
                    continue;
                }
                r => r?,
            };
            if self.commit(txn).await?.is_some() {
                return Ok(out);
            }
            drop(out);
            self.allocator.scatter();
            self.wait_past(seen, Duration::from_millis(20)).await;
        }
        Err(NeutronError::busy())
    }
}

/// How many revisions before the store's present the view is loaded at, when the store
/// still holds them: the follower then applies them, so the watch feed holds the changes
/// of before a restart and a host that had not seen them all resumes instead of listing
/// everything again.
const FEED_HISTORY: i64 = crate::view::FEED_LEN as i64;

/// How long a starting controller waits for a view loaded in the past to reach the
/// store's present.
const CATCH_UP: Duration = Duration::from_secs(60);

/// The view of the store, at `FEED_HISTORY` revisions back where it can, and the
/// store's present then (a revision the watch delivers, so that the view can be seen to
/// reach it).
fn load(store: &dyn Store) -> Result<(View, i64), StoreError> {
    let now = store.mark_progress()?;
    let from = (now - FEED_HISTORY).max(1);
    if from < now {
        match read_view(store, Some(from)) {
            Ok(view) => return Ok((view, now)),
            Err(StoreError::Compacted(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok((read_view(store, None)?, now))
}

/// The viewed keys read at `revision` (the present when none) into a view. The objects
/// are parsed on this thread while another reads the next page: at 100,000 ports that
/// takes the parse (a fifth of the load) off the time to the first answer.
fn read_view(store: &dyn Store, revision: Option<i64>) -> Result<View, StoreError> {
    let (batches, read) = std::sync::mpsc::sync_channel(2);
    std::thread::scope(|s| {
        let reader = std::thread::Builder::new()
            .name("corvid-view-read".into())
            .spawn_scoped(s, move || {
                store.snapshot_batches(&keys::VIEWED, revision, &mut |kvs| {
                    let _ = batches.send(kvs);
                })
            })
            .map_err(|e| StoreError::Backend(format!("starting the view's reader: {e}")))?;
        let view = View::from_objects(read.into_iter().flatten());
        let at = reader
            .join()
            .unwrap_or_else(|_| Err(StoreError::Backend("the view's reader panicked".into())))?;
        Ok(view.at(at))
    })
}

/// Applies store changes to the view for as long as the controller lives; reloads the
/// whole view if the store no longer has the history to resume from.
fn follow(ctl: std::sync::Weak<Controller>) {
    loop {
        let Some(c) = ctl.upgrade() else { return };
        let from = c.view().revision + 1;
        let rx = match c.store.watch(keys::ROOT, from) {
            Ok(rx) => rx,
            Err(StoreError::Compacted(_)) => {
                reload(&c);
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "the store's watch cannot be opened; retrying");
                drop(c);
                std::thread::sleep(Duration::from_millis(500));
                continue;
            }
        };
        drop(c);
        // Changes as they come; while none does, the store's revision is read to learn
        // whether the view is current, and a watch that fell behind (its member cut off,
        // which a silent stream cannot tell) is given up for a new one.
        let mut target: Option<(i64, Instant)> = None;
        let mut probed = Instant::now();
        loop {
            let batch = rx.recv_timeout(PROBE);
            let Some(c) = ctl.upgrade() else { return };
            match batch {
                Ok(Ok(events)) => {
                    let (revision, touched) = {
                        let mut v = c.view.write().unwrap_or_else(|p| p.into_inner());
                        let before = v.revision;
                        v.apply(&events);
                        (v.revision, v.touched_since(before))
                    };
                    c.applied.send_replace(revision);
                    c.wakers.wake(&touched);
                }
                Ok(Err(StoreError::Compacted(_))) => {
                    reload(&c);
                    break;
                }
                Ok(Err(_)) | Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {}
            }
            if probed.elapsed() < PROBE {
                continue;
            }
            probed = Instant::now();
            // Under load the view trails the store by the changes in flight, and others'
            // writes (an etcd shared with other users) move the store's revision with no
            // event for the view: it is behind only when a mark of progress, which the
            // watch delivers after every change before it, has not arrived in time.
            let Ok(store) = c.store.revision() else {
                continue;
            };
            let view = c.view().revision;
            match target {
                _ if view >= store => {
                    c.confirm();
                    target = None;
                    continue;
                }
                Some((mark, _)) if view >= mark => {
                    c.confirm();
                    target = None;
                }
                Some((_, since)) if since.elapsed() > STALE_AFTER => {
                    tracing::warn!("the store's watch fell behind; opening it again");
                    break;
                }
                Some(_) | None => {}
            }
            if target.is_none() {
                if let Ok(mark) = c.store.mark_progress() {
                    target = Some((mark, Instant::now()));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn reload(c: &Controller) {
    match read_view(c.store.as_ref(), None) {
        Ok(view) => {
            let revision = view.revision;
            *c.view.write().unwrap_or_else(|p| p.into_inner()) = view;
            c.applied.send_replace(revision);
            c.wakers.wake_all();
            c.confirm();
        }
        Err(e) => {
            // The watch is opened again from the old view, which fails as compacted
            // again: without a pause that is one whole-store read after another.
            tracing::warn!(error = %e, "the view could not be loaded again; retrying");
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}
