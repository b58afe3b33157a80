//! The watch feed's long polls waiting for changes, by the host they filter ports on: a
//! change wakes the polls it may concern, not every poll. With a thousand agents each on
//! its own host's feed, waking them all at every revision cost a task wake, the view's
//! read lock and a search of the feed per agent for each change, almost all of them
//! finding nothing.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// Whom a batch of changes concerns.
#[derive(Debug, Default, PartialEq)]
pub struct Touched {
    /// A change that is not a port's, which every filter passes.
    pub all: bool,
    /// The hosts the ports changed were bound to, before or after.
    pub hosts: BTreeSet<String>,
}

/// Long polls by the host they filter on (`None`: no filter, every change).
#[derive(Default)]
pub struct Wakers {
    by_host: Mutex<HashMap<Option<String>, Arc<Notify>>>,
}

/// One poll's place among the wakers, given back when it is dropped.
pub struct Waker<'a> {
    wakers: &'a Wakers,
    host: Option<String>,
    /// Taken when the poll ends.
    notify: Option<Arc<Notify>>,
}

impl Waker<'_> {
    /// What to wait on: woken by the next change the poll's host may care about.
    pub fn notify(&self) -> &Notify {
        self.notify.as_ref().expect("held until dropped")
    }
}

impl Drop for Waker<'_> {
    fn drop(&mut self) {
        let mut map = self
            .wakers
            .by_host
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        drop(self.notify.take());
        // Only the map's is left: no other poll waits on the host, which goes. (Counted
        // under the lock with this poll's given back first, so two polls ending at once
        // cannot each count the other's and both leave the entry behind.)
        if map
            .get(&self.host)
            .is_some_and(|n| Arc::strong_count(n) == 1)
        {
            map.remove(&self.host);
        }
    }
}

impl Wakers {
    /// A place for a poll filtering on `host` (or none).
    pub fn join(&self, host: Option<&str>) -> Waker<'_> {
        let host = host.map(str::to_string);
        let notify = self
            .by_host
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(host.clone())
            .or_default()
            .clone();
        Waker {
            wakers: self,
            host,
            notify: Some(notify),
        }
    }

    /// Wakes the polls `touched` may concern: the unfiltered ones, and those of its
    /// hosts (or all of them).
    pub fn wake(&self, touched: &Touched) {
        let map = self.by_host.lock().unwrap_or_else(|p| p.into_inner());
        if touched.all {
            map.values().for_each(|n| n.notify_waiters());
            return;
        }
        let hosts = touched.hosts.iter().map(|h| Some(h.clone()));
        for key in std::iter::once(None).chain(hosts) {
            if let Some(n) = map.get(&key) {
                n.notify_waiters();
            }
        }
    }

    /// Wakes every poll.
    pub fn wake_all(&self) {
        self.wake(&Touched {
            all: true,
            hosts: BTreeSet::new(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll};

    /// Whether the enabled `notified` future has been woken.
    fn woken(notified: &mut std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        matches!(notified.as_mut().poll(&mut cx), Poll::Ready(()))
    }

    fn hosts(wakers: &Wakers) -> usize {
        wakers.by_host.lock().unwrap().len()
    }

    #[test]
    fn a_change_wakes_the_polls_of_its_hosts_and_the_unfiltered_ones_alone() {
        let wakers = Wakers::default();
        let (h1, h2, any) = (
            wakers.join(Some("h1")),
            wakers.join(Some("h2")),
            wakers.join(None),
        );
        let mut n1 = pin!(h1.notify().notified());
        let mut n2 = pin!(h2.notify().notified());
        let mut na = pin!(any.notify().notified());
        for n in [&mut n1, &mut n2, &mut na] {
            n.as_mut().enable();
        }
        wakers.wake(&Touched {
            all: false,
            hosts: BTreeSet::from(["h1".to_string()]),
        });
        assert!(woken(&mut n1));
        assert!(!woken(&mut n2));
        assert!(woken(&mut na));
        let mut n2 = pin!(h2.notify().notified());
        n2.as_mut().enable();
        wakers.wake(&Touched {
            all: true,
            hosts: BTreeSet::new(),
        });
        assert!(woken(&mut n2));
    }

    #[test]
    fn a_host_goes_with_its_last_poll() {
        let wakers = Wakers::default();
        let first = wakers.join(Some("h1"));
        let second = wakers.join(Some("h1"));
        assert_eq!(hosts(&wakers), 1);
        drop(first);
        assert_eq!(hosts(&wakers), 1);
        drop(second);
        assert_eq!(hosts(&wakers), 0);
    }
}
