//! The writers: port creates (each bound to a simulated host, on one of the networks)
//! and deletes through the controllers' API, as an orchestrator would send them, either
//! as fast as they go (the fill) or paced at a steady rate (the churn).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corvid_api::{ApiError, Client, Port};
use serde_json::json;

use crate::host::{host_id, port_id, Shared};

/// How long a write is retried while the controller is unreachable or busy.
const RETRY_FOR: Duration = Duration::from_secs(120);

/// Where ports go.
pub struct Layout {
    /// This run's tag, in every port ID.
    pub tag: u32,
    /// Network IDs.
    pub networks: Vec<String>,
    /// Number of simulated hosts.
    pub hosts: usize,
    /// The controllers' URLs; writer `w` starts on `w % len` and moves to the next one
    /// when its controller cannot be reached, as a client behind a load balancer.
    pub urls: Vec<String>,
}

impl Layout {
    /// The host port `seq` is bound to.
    pub fn host_of(&self, seq: usize) -> usize {
        seq % self.hosts
    }

    /// The network of port `seq`: every network gets one port of each round over the
    /// hosts, and a host's ports are spread over the networks.
    pub fn network_of(&self, seq: usize) -> &str {
        let n = self.networks.len();
        &self.networks[(seq + 7 * (seq / self.hosts)) % n]
    }
}

/// What the writers did.
#[derive(Default)]
pub struct Done {
    /// Creates acknowledged.
    pub creates: AtomicU64,
    /// Deletes acknowledged (or of a port already gone).
    pub deletes: AtomicU64,
    /// Writes retried after an unreachable or busy controller.
    pub retries: AtomicU64,
    /// Writes that failed for good.
    pub errors: Mutex<Vec<String>>,
    /// How late the paced writes were sent at worst, microseconds.
    pub worst_lag_us: AtomicU64,
}

/// One writer's clients, one per controller.
struct Writer {
    clients: Vec<Client>,
    at: usize,
}

impl Writer {
    fn new(layout: &Layout, w: usize) -> Writer {
        Writer {
            clients: layout.urls.iter().map(|u| Client::new(u)).collect(),
            at: w % layout.urls.len(),
        }
    }

    /// Runs `f` against the current controller until it answers for good.
    fn retry<T>(
        &mut self,
        done: &Done,
        mut f: impl FnMut(&Client) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        let start = Instant::now();
        loop {
            match f(&self.clients[self.at]) {
                Err(e @ ApiError::Transport(_))
                | Err(e @ ApiError::Neutron { status: 503, .. })
                    if start.elapsed() < RETRY_FOR =>
                {
                    if matches!(e, ApiError::Transport(_)) {
                        self.at = (self.at + 1) % self.clients.len();
                    }
                    done.retries.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(50));
                }
                r => return r,
            }
        }
    }

    fn create(&mut self, layout: &Layout, shared: &Shared, done: &Done, seq: usize) {
        let id = port_id(layout.tag, seq);
        let body = json!({"id": id, "network_id": layout.network_of(seq),
            "binding:host_id": host_id(layout.host_of(seq))});
        shared.sent[seq].store(shared.now_ns(), Ordering::Relaxed);
        match self.retry(done, |c| c.create_or_get::<Port>(&id, body.clone())) {
            Ok(_) => {
                done.creates.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => done
                .errors
                .lock()
                .unwrap()
                .push(format!("create {id}: {e}")),
        }
    }

    fn delete(&mut self, layout: &Layout, done: &Done, seq: usize) {
        let id = port_id(layout.tag, seq);
        match self.retry(done, |c| c.delete_if_present::<Port>(&id)) {
            Ok(_) => {
                done.deletes.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => done
                .errors
                .lock()
                .unwrap()
                .push(format!("delete {id}: {e}")),
        }
    }
}

/// Creates ports `from..to` with `writers` writers as fast as they go; the main thread
/// calls `progress` with the creates so far every 100 ms until they are done.
pub fn fill(
    layout: &Arc<Layout>,
    shared: &Arc<Shared>,
    (from, to): (usize, usize),
    writers: usize,
    mut progress: impl FnMut(u64),
) -> Arc<Done> {
    let done = Arc::new(Done::default());
    let next = Arc::new(AtomicUsize::new(from));
    let threads: Vec<_> = (0..writers)
        .map(|w| {
            let (layout, shared, done, next) =
                (layout.clone(), shared.clone(), done.clone(), next.clone());
            std::thread::spawn(move || {
                let mut writer = Writer::new(&layout, w);
                loop {
                    let seq = next.fetch_add(1, Ordering::Relaxed);
                    if seq >= to {
                        return;
                    }
                    writer.create(&layout, &shared, &done, seq);
                }
            })
        })
        .collect();
    while !threads.iter().all(|t| t.is_finished()) {
        progress(done.creates.load(Ordering::Relaxed));
        std::thread::sleep(Duration::from_millis(100));
    }
    for t in threads {
        t.join().expect("a writer panicked");
    }
    progress(done.creates.load(Ordering::Relaxed));
    done
}

/// A paced churn: slot `k` is due `k / rate` seconds after the start and creates port
/// `first + k`, then deletes the oldest live one (`first + k - live`), so the number of
/// ports stays `live`. Runs for `secs` (slots not begun by then are dropped) or until
/// `stop`.
pub struct Churn {
    /// The first port number it creates.
    pub first: usize,
    /// Ports alive before it starts.
    pub live: usize,
    /// Creates per second.
    pub rate: f64,
    /// How long it runs.
    pub secs: f64,
    /// Writers (each runs one slot at a time).
    pub writers: usize,
}

/// What a churn ran: its result and the slots it used (the next churn starts after).
pub struct Ran {
    /// What the writers did.
    pub done: Arc<Done>,
    /// Slots run: ports `first..first + slots` were created.
    pub slots: usize,
    /// How long it took.
    pub elapsed: Duration,
}

impl Churn {
    /// Runs it to its end (or `stop`).
    pub fn run(&self, layout: &Arc<Layout>, shared: &Arc<Shared>, stop: &Arc<AtomicBool>) -> Ran {
        let done = Arc::new(Done::default());
        let total = ((self.rate * self.secs) as usize).min(shared.sent.len() - self.first);
        let slot = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        let threads: Vec<_> = (0..self.writers)
            .map(|w| {
                let (layout, shared, done, slot, stop) = (
                    layout.clone(),
                    shared.clone(),
                    done.clone(),
                    slot.clone(),
                    stop.clone(),
                );
                let (first, live, rate, secs) = (self.first, self.live, self.rate, self.secs);
                std::thread::spawn(move || {
                    let mut writer = Writer::new(&layout, w);
                    let end = start + Duration::from_secs_f64(secs);
                    loop {
                        // Slots not begun by the end are dropped: a rate the writers
                        // cannot keep shows as a lower rate, not as a longer run.
                        if stop.load(Ordering::Relaxed) || Instant::now() >= end {
                            return;
                        }
                        let k = slot.fetch_add(1, Ordering::Relaxed);
                        if k >= total {
                            return;
                        }
                        let due = start + Duration::from_secs_f64(k as f64 / rate);
                        match due.checked_duration_since(Instant::now()) {
                            Some(wait) => std::thread::sleep(wait),
                            None => {
                                let late = due.elapsed().as_micros() as u64;
                                done.worst_lag_us.fetch_max(late, Ordering::Relaxed);
                            }
                        }
                        writer.create(&layout, &shared, &done, first + k);
                        if let Some(old) = (first + k).checked_sub(live) {
                            writer.delete(&layout, &done, old);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("a writer panicked");
        }
        let slots = slot.load(Ordering::Relaxed).min(total);
        Ran {
            done,
            slots,
            elapsed: start.elapsed(),
        }
    }
}
