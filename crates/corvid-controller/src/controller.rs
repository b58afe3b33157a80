//! The controller's core: the store, the view that follows it, and the commit path every
//! write takes (a compare-and-swap transaction, then waiting until the view shows it).

use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::Duration;

use tokio::sync::watch;

use crate::error::NeutronError;
use crate::ipam::{Allocator, Pending};
use crate::keys;
use crate::store::{Store, StoreError, Txn};
use crate::view::View;

/// Shared state of one controller process.
pub struct Controller {
    store: Arc<dyn Store>,
    view: RwLock<View>,
    applied: watch::Sender<i64>,
    /// Addresses and MACs picked by requests in flight, and where the next picks start.
    allocator: Allocator,
    /// The token every request must carry, if set.
    pub token: Option<String>,
}

impl Controller {
    /// Loads the store into a view and follows it from then on.
    pub fn start(
        store: Arc<dyn Store>,
        token: Option<String>,
    ) -> Result<Arc<Controller>, StoreError> {
        let (kvs, revision) = store.range(keys::ROOT)?;
        let (applied, _) = watch::channel(revision);
        let ctl = Arc::new(Controller {
            store,
            view: RwLock::new(View::load(kvs, revision)),
            applied,
            allocator: Allocator::default(),
            token,
        });
        let follower = Arc::downgrade(&ctl);
        std::thread::Builder::new()
            .name("corvid-view".into())
            .spawn(move || follow(follower))
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        Ok(ctl)
    }

    /// The current view, for reading.
    pub fn view(&self) -> RwLockReadGuard<'_, View> {
        self.view.read().unwrap_or_else(|p| p.into_inner())
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

    /// Waits up to `timeout` for the view to move past `revision`.
    pub async fn wait_past(&self, revision: i64, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.wait_for(revision + 1)).await;
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
        self.wait_for(revision).await;
        Ok(Some(revision))
    }
}

/// How often a write re-reads and retries after losing a compare-and-swap race.
const RETRIES: usize = 64;

impl Controller {
    /// The write path: `prepare` reads the view and returns a transaction and what to
    /// answer if it commits; a lost compare-and-swap race re-runs `prepare` on a fresher
    /// view.
    pub async fn transact<T>(
        &self,
        mut prepare: impl FnMut(&View) -> Result<(Txn, T), NeutronError>,
    ) -> Result<T, NeutronError> {
        for _ in 0..RETRIES {
            let (txn, out, seen) = {
                let v = self.view();
                let (txn, out) = prepare(&v)?;
                (txn, out, v.revision)
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
            Err(_) => {
                drop(c);
                std::thread::sleep(Duration::from_millis(500));
                continue;
            }
        };
        drop(c);
        for batch in rx {
            let Some(c) = ctl.upgrade() else { return };
            match batch {
                Ok(events) => {
                    let revision = {
                        let mut v = c.view.write().unwrap_or_else(|p| p.into_inner());
                        v.apply(&events);
                        v.revision
                    };
                    c.applied.send_replace(revision);
                }
                Err(StoreError::Compacted(_)) => {
                    reload(&c);
                    break;
                }
                Err(_) => break,
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn reload(c: &Controller) {
    if let Ok((kvs, revision)) = c.store.range(keys::ROOT) {
        *c.view.write().unwrap_or_else(|p| p.into_inner()) = View::load(kvs, revision);
        c.applied.send_replace(revision);
    }
}
