//! Work that failed, tried again after a backoff that grows with each failure of the same
//! object, as kube-runtime's controllers requeue: a controller that stays down, or keeps
//! refusing a pod its port, is asked less and less often rather than every second.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::ResourceExt;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

/// Work that failed and is tried again.
pub enum Retry {
    /// A pod's port and annotation.
    Pod(Box<Pod>),
    /// A namespace's network.
    Namespace(Box<Namespace>),
    /// A service, by UID.
    Service(String),
    /// The port of a gone pod, by the pod's UID.
    PortDelete(String),
    /// The network of a gone namespace, by the namespace's UID.
    NetworkDelete(String),
    /// The NetworkPolicies' groups and ports' groups still to bring over.
    Policies,
}

impl Retry {
    /// What the backoff of this retry is counted by.
    pub fn key(&self) -> String {
        match self {
            Retry::Pod(p) => pod_key(&p.uid().unwrap_or_default()),
            Retry::Namespace(n) => namespace_key(&n.uid().unwrap_or_default()),
            Retry::Service(uid) => format!("service/{uid}"),
            Retry::PortDelete(uid) => format!("port/{uid}"),
            Retry::NetworkDelete(uid) => format!("network/{uid}"),
            Retry::Policies => "policies".to_string(),
        }
    }
}

/// The backoff key of a pod's work, by its UID.
pub fn pod_key(uid: &str) -> String {
    format!("pod/{uid}")
}

/// The backoff key of a namespace's network, by the namespace's UID.
pub fn namespace_key(uid: &str) -> String {
    format!("namespace/{uid}")
}

/// How long failed work waits before it is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// The longest wait between tries of failed work.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// The wait before the next try of work that has failed `failures` times in a row: one
/// second after the first failure, doubling to half a minute.
pub fn delay(failures: u32) -> Duration {
    (RETRY_AFTER * 2u32.pow(failures.saturating_sub(1).min(5))).min(MAX_RETRY_AFTER)
}

/// The queue failed work goes back to the watcher through, with each object's failures
/// counted for its backoff.
#[derive(Clone)]
pub struct Queue {
    tx: UnboundedSender<Retry>,
    failures: Arc<Mutex<HashMap<String, u32>>>,
}

impl Queue {
    /// A queue and the receiving end the watcher reads retries from.
    pub fn new() -> (Queue, UnboundedReceiver<Retry>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let q = Queue {
            tx,
            failures: Arc::default(),
        };
        (q, rx)
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.failures.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a failure of `r`'s object and sends `r` back after its backoff; returns the
    /// wait.
    pub fn retry(&self, r: Retry) -> Duration {
        let wait = {
            let mut failures = self.failures();
            let n = failures.entry(r.key()).or_insert(0);
            *n += 1;
            delay(*n)
        };
        let tx = self.tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let _ = tx.send(r);
        });
        wait
    }

    /// The work of `key` succeeded: its next failure waits one second again.
    pub fn done(&self, key: &str) {
        self.failures().remove(key);
    }

    /// Whether the work of `key` failed before (so its trouble was reported already).
    pub fn failed_before(&self, key: &str) -> bool {
        self.failures().contains_key(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_from_a_second_to_half_a_minute() {
        let waits: Vec<u64> = (1..=8).map(|n| delay(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(delay(u32::MAX), MAX_RETRY_AFTER);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_object_waits_longer_each_time_and_success_starts_it_over() {
        let (q, mut rx) = Queue::new();
        let again = || Retry::Service("s1".into());
        assert_eq!(q.retry(again()), Duration::from_secs(1));
        assert_eq!(q.retry(again()), Duration::from_secs(2));
        assert!(q.failed_before("service/s1"));
        // Another object's backoff is its own.
        assert_eq!(
            q.retry(Retry::PortDelete("p".into())),
            Duration::from_secs(1)
        );
        q.done("service/s1");
        assert!(!q.failed_before("service/s1"));
        assert_eq!(q.retry(again()), Duration::from_secs(1));
        // Each retry comes back once its wait is over, and not before.
        assert!(rx.try_recv().is_err());
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let mut back = Vec::new();
        while let Ok(r) = rx.try_recv() {
            back.push(r.key());
        }
        back.sort();
        assert_eq!(back, ["port/p", "service/s1", "service/s1"]);
    }
}
