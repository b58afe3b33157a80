//! The controller's core: the store, the view that follows it, and the commit path every
//! write takes (a compare-and-swap transaction, then waiting until the view shows it).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::time::Duration;

use tokio::sync::watch;

use corvid_api::Subnet;

use crate::error::NeutronError;
use crate::ipam;
use crate::keys;
use crate::store::{Store, StoreError, Txn};
use crate::util::{mac_at, random_below};
use crate::view::View;

/// Shared state of one controller process.
pub struct Controller {
    store: Arc<dyn Store>,
    view: RwLock<View>,
    applied: watch::Sender<i64>,
    /// Addresses and MACs picked by requests in flight, so concurrent requests of this
    /// controller pick different ones instead of colliding in the store.
    pending: Mutex<HashSet<String>>,
    /// Where this controller's next address and MAC searches start.
    cursors: Mutex<Cursors>,
    /// The token every request must carry, if set.
    pub token: Option<String>,
}

/// The address picked last in each subnet and the MAC picked last. Picking on from them
/// puts consecutive ports' keys next to each other in the store, so a commit of many new
/// ports rewrites a few pages instead of one per key.
#[derive(Default)]
struct Cursors {
    ips: HashMap<String, IpAddr>,
    mac: Option<u32>,
}

/// Reservations of keys in flight, released when dropped.
pub struct Pending<'a> {
    ctl: &'a Controller,
    keys: Vec<String>,
}

impl Pending<'_> {
    /// Reserves `key` unless another request of this controller holds it.
    pub fn reserve(&mut self, key: String) -> bool {
        let mut set = self.ctl.pending.lock().unwrap_or_else(|p| p.into_inner());
        if set.insert(key.clone()) {
            self.keys.push(key);
            true
        } else {
            false
        }
    }

    /// Picks and reserves an address of `subnet` that `free` allows, on from this
    /// controller's last pick there.
    pub fn pick_ip(&mut self, subnet: &Subnet, free: impl Fn(IpAddr) -> bool) -> Option<IpAddr> {
        let after = self.ctl.cursors().ips.get(&subnet.id).copied();
        let ip = ipam::pick(&subnet.allocation_pools, after, |ip| {
            free(ip) && self.reserve(keys::ip(&subnet.id, ip))
        })?;
        self.ctl.cursors().ips.insert(subnet.id.clone(), ip);
        Some(ip)
    }

    /// Picks and reserves a MAC in Neutron's `fa:16:3e` range that no port has, on from
    /// this controller's last pick.
    pub fn pick_mac(&mut self, in_use: &HashSet<String>) -> String {
        let mut n = self
            .ctl
            .cursors()
            .mac
            .map_or_else(|| random_below(1 << 24) as u32, |m| m + 1);
        let mac = loop {
            let m = mac_at(n);
            if !in_use.contains(&m) && self.reserve(keys::mac(&m)) {
                break m;
            }
            n = n.wrapping_add(1);
        };
        self.ctl.cursors().mac = Some(n);
        mac
    }

    /// Whether a request of this controller holds `key`.
    pub fn held_elsewhere(&self, key: &str) -> bool {
        !self.keys.iter().any(|k| k == key)
            && self
                .ctl
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(key)
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let mut set = self.ctl.pending.lock().unwrap_or_else(|p| p.into_inner());
        for k in &self.keys {
            set.remove(k);
        }
    }
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
            pending: Mutex::new(HashSet::new()),
            cursors: Mutex::default(),
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

    fn cursors(&self) -> std::sync::MutexGuard<'_, Cursors> {
        self.cursors.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fresh set of in-flight reservations.
    pub fn pending(&self) -> Pending<'_> {
        Pending {
            ctl: self,
            keys: Vec::new(),
        }
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
    /// The write path: `plan` reads the view and returns a transaction and what to answer
    /// if it commits; a lost compare-and-swap race re-runs `plan` on a fresher view.
    pub async fn transact<T>(
        &self,
        mut plan: impl FnMut(&View) -> Result<(Txn, T), NeutronError>,
    ) -> Result<T, NeutronError> {
        for _ in 0..RETRIES {
            let (txn, out, seen) = {
                let v = self.view();
                let (txn, out) = plan(&v)?;
                (txn, out, v.revision)
            };
            if self.commit(txn).await?.is_some() {
                return Ok(out);
            }
            drop(out);
            // Another controller picks where this one does: search from random points
            // until the two are apart again.
            *self.cursors() = Cursors::default();
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
