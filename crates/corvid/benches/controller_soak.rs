//! Controller soak: the peak rate of a mixed load (creates, updates, deletes, lists by
//! device) from 16 clients with 50 watchers following the feed is measured first (10 s),
//! then the same mix runs at half that rate
//! for `CORVID_SOAK_SECS` (1800) with 50 watchers following the feed. Each window of
//! `CORVID_SOAK_WINDOW` seconds (60) prints the operations done, p50 and p99 latency, the
//! controller's RSS and the watchers' largest lag. At the end every watcher must have
//! seen exactly the writes the clients were told succeeded (by count, and deletes by a
//! checksum of their IDs), unless the controller told it to list again (410).
//! Run with `cargo bench -p corvid --bench controller_soak`; `CORVID_SOAK_STORE=etcd`
//! runs it on a real etcd instead of redb.

#[path = "../tests/support/controller.rs"]
mod support;

use std::hash::Hasher;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corvid_api::{ApiError, Client, EventKind, Network, Port, Subnet, WatchFilter};
use serde_json::json;
use support::{env, redb_store, rss_mib, ControllerProcess, Etcd};

const CLIENTS: usize = 16;
const WATCHERS: usize = 50;
/// Ports a client keeps at most: the store stays the same size while the soak runs.
const OWNED: usize = 200;

fn fnv(id: &str) -> u64 {
    let mut h = fnv::FnvHasher::default();
    h.write(id.as_bytes());
    h.finish()
}

/// What the clients were told succeeded, and every latency of the current window.
#[derive(Default)]
struct Tally {
    /// Port creates and updates acknowledged: each is one put in the feed.
    puts: AtomicU64,
    deletes: AtomicU64,
    /// Wrapping sum of the deleted ports' ID hashes.
    deleted_sum: AtomicU64,
    latencies: Mutex<Vec<Duration>>,
}

/// One client: a mix of 4 creates, 2 updates, 2 deletes and 2 lists in 10, each started
/// `pace` after the previous one (none when zero), until `stop`.
fn client(
    c: Client,
    net: String,
    i: usize,
    pace: Duration,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
) {
    let mut owned: Vec<String> = Vec::new();
    let mut n = 0u64;
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        if !pace.is_zero() {
            next += pace;
            if let Some(wait) = next.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        let t = Instant::now();
        let pick = (n as usize * 7919) % owned.len().max(1);
        match n % 10 {
            0..=3 if owned.len() < OWNED => {
                let p: Port = c
                    .create(json!({"network_id": net, "device_id": format!("soak-{i}-{n}")}))
                    .expect("create");
                owned.push(p.id);
                tally.puts.fetch_add(1, Ordering::Relaxed);
            }
            0..=5 if !owned.is_empty() => {
                c.update::<Port>(&owned[pick], json!({"name": format!("u{n}")}))
                    .expect("update");
                tally.puts.fetch_add(1, Ordering::Relaxed);
            }
            0..=7 if !owned.is_empty() => {
                let id = owned.swap_remove(pick);
                c.delete::<Port>(&id).expect("delete");
                tally.deletes.fetch_add(1, Ordering::Relaxed);
                tally.deleted_sum.fetch_add(fnv(&id), Ordering::Relaxed);
            }
            _ => {
                let dev = format!("soak-{i}-{}", n.saturating_sub(5));
                c.list::<Port>(&[("device_id", &dev)]).expect("list");
            }
        }
        tally.latencies.lock().unwrap().push(t.elapsed());
    }
}

/// What one watcher saw of the ports.
#[derive(Default)]
struct Seen {
    puts: u64,
    deletes: u64,
    deleted_sum: u64,
    relisted: u64,
}

/// Follows the feed from `since` until `stop` and it has caught up with `last`.
fn watcher(
    c: Client,
    mut since: i64,
    revision: Arc<AtomicI64>,
    stop: Arc<AtomicBool>,
    last: Arc<AtomicI64>,
) -> Seen {
    let mut seen = Seen::default();
    let filter = WatchFilter {
        resource: Some("ports"),
        ..WatchFilter::default()
    };
    loop {
        let done = stop.load(Ordering::Relaxed);
        if done && since >= last.load(Ordering::Relaxed) {
            return seen;
        }
        match c.watch(
            since,
            &filter,
            Duration::from_secs(if done { 0 } else { 2 }),
        ) {
            Ok(page) => {
                for e in &page.events {
                    match e.kind {
                        EventKind::Put => seen.puts += 1,
                        EventKind::Delete => {
                            seen.deletes += 1;
                            seen.deleted_sum = seen.deleted_sum.wrapping_add(fnv(&e.id));
                        }
                    }
                }
                since = page.revision;
                revision.store(since, Ordering::Relaxed);
            }
            Err(ApiError::Neutron { status: 410, .. }) => {
                seen.relisted += 1;
                since = c.list::<Network>(&[]).expect("list").1;
            }
            Err(e) => panic!("watch: {e}"),
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p) as usize].as_secs_f64() * 1e3
}

/// Runs the mix with `pace` between each client's operations for `secs`, printing a line
/// per window; returns the operations per second over the whole run.
fn run(
    ctl: &ControllerProcess,
    net: &str,
    pace: Duration,
    secs: u64,
    window: u64,
    watchers: usize,
) -> f64 {
    let c = ctl.client();
    let start_rev = c.list::<Network>(&[]).unwrap().1;
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let last = Arc::new(AtomicI64::new(i64::MAX));
    let mut revisions = Vec::new();
    let watching: Vec<_> = (0..watchers)
        .map(|_| {
            let r = Arc::new(AtomicI64::new(start_rev));
            revisions.push(r.clone());
            let (c, stop, last) = (ctl.client(), stop.clone(), last.clone());
            std::thread::spawn(move || watcher(c, start_rev, r, stop, last))
        })
        .collect();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let (c, net, tally, stop) =
                (ctl.client(), net.to_string(), tally.clone(), stop.clone());
            std::thread::spawn(move || client(c, net, i, pace, tally, stop))
        })
        .collect();
    let began = Instant::now();
    let mut total = 0;
    let mut series = Vec::new();
    while began.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_secs(window.min(secs)));
        let mut lat = std::mem::take(&mut *tally.latencies.lock().unwrap());
        lat.sort();
        total += lat.len();
        let now = c.list::<Network>(&[]).unwrap().1;
        let lag = revisions
            .iter()
            .map(|r| now - r.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0);
        let rss = rss_mib(ctl.pid());
        let (p50, p99) = (percentile(&lat, 0.5), percentile(&lat, 0.99));
        if watchers > 0 {
            println!(
                "{:>6.0} s  {:>7} ops  {:>6.0} ops/s  p50 {p50:>6.2} ms  p99 {p99:>7.2} ms  RSS {rss:>6.1} MiB  watcher lag {lag:>5} revisions",
                began.elapsed().as_secs_f64(),
                lat.len(),
                lat.len() as f64 / window as f64,
            );
        }
        series.push((p99, rss));
    }
    stop.store(true, Ordering::Relaxed);
    for t in clients {
        t.join().expect("a client failed");
    }
    let rate = total as f64 / began.elapsed().as_secs_f64();
    last.store(c.list::<Network>(&[]).unwrap().1, Ordering::Relaxed);
    let (puts, deletes, sum) = (
        tally.puts.load(Ordering::Relaxed),
        tally.deletes.load(Ordering::Relaxed),
        tally.deleted_sum.load(Ordering::Relaxed),
    );
    let mut relisted = 0;
    for (i, w) in watching.into_iter().enumerate() {
        let seen = w.join().expect("a watcher failed");
        relisted += seen.relisted;
        if seen.relisted == 0 {
            assert_eq!(
                (seen.puts, seen.deletes, seen.deleted_sum),
                (puts, deletes, sum),
                "watcher {i} saw other writes than were acknowledged"
            );
        }
    }
    if watchers > 0 {
        let (first, end) = (series[0], series[series.len() - 1]);
        println!(
            "{watchers} watchers: every one saw exactly the {puts} puts and {deletes} deletes acknowledged; {relisted} told to list again (410)"
        );
        println!(
            "flatness, last window over first: p99 x{:.2}, RSS x{:.2}",
            end.0 / first.0.max(1e-9),
            end.1 / first.1.max(1e-9)
        );
    }
    rate
}

fn main() {
    let secs = env("CORVID_SOAK_SECS", 1800);
    let window = env("CORVID_SOAK_WINDOW", 60);
    let (_dir, redb) = redb_store();
    let etcd = (std::env::var("CORVID_SOAK_STORE").as_deref() == Ok("etcd")).then(Etcd::start);
    let store = etcd.as_ref().map_or(redb, |e| format!("etcd:{}", e.url));
    let ctl = ControllerProcess::start(&store, None);
    let c = ctl.client();
    let net: Network = c.create(json!({"name": "soak"})).unwrap();
    c.create::<Subnet>(json!({"network_id": net.id, "cidr": "10.0.0.0/8"}))
        .unwrap();
    let peak = run(&ctl, &net.id, Duration::ZERO, 10, 10, WATCHERS);
    let half = peak / 2.0;
    let pace = Duration::from_secs_f64(CLIENTS as f64 / half);
    println!(
        "store {}: peak {peak:.0} ops/s (16 clients, the mix, {WATCHERS} watchers); soak at {half:.0} ops/s for {secs} s with {WATCHERS} watchers",
        store.split(':').next().unwrap_or("")
    );
    run(&ctl, &net.id, pace, secs, window, WATCHERS);
}
