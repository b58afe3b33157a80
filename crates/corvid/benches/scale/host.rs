//! A simulated host: the agent's conversation with the controller without its datapath.
//! It asks `/version` for the cluster, registers its host (`PUT /v2.0/hosts/<id>`),
//! lists, follows the watch feed from the lists' revision, and reports every port bound
//! to it ACTIVE, as `corvid-agent` does (`Agent::sync`, `Agent::follow`,
//! `Agent::report`); a 410 or a vanished host record lists again, a failed watch is
//! retried after the agent's backoff. Instead of devices it keeps the ports bound to it
//! with their revisions, and checks the feed as it goes: store revisions only rise,
//! and each port's `revision_number` rises by exactly one from event to event.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use corvid_api::{
    ApiError, Client, EventKind, FloatingIp, Host, Listener, LoadBalancer, Member, Network, Pool,
    Port, Resource, Router, SecurityGroup, SecurityGroupRule, Status, Subnet, WatchEvent,
    WatchFilter, Watcher,
};

/// How long one watch request waits, as the agent's `WATCH_WAIT`.
const WATCH_WAIT: Duration = Duration::from_secs(20);

/// Which feed the hosts follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feed {
    /// Only the changes of ports bound to the host (`binding:host_id=<id>`), plus every
    /// other resource: what the CNI plugin waits on, and a host that plans its own
    /// ports alone needs.
    Bound = 0,
    /// Every change, unfiltered: what `corvid-agent` follows, since remote ports feed
    /// its overlay's FDB and neighbour entries.
    Agent = 1,
}

impl Feed {
    fn from_u8(v: u8) -> Feed {
        if v == Feed::Agent as u8 {
            Feed::Agent
        } else {
            Feed::Bound
        }
    }

    /// Its name in the printed figures.
    pub fn name(self) -> &'static str {
        match self {
            Feed::Bound => "bound (binding:host_id)",
            Feed::Agent => "agent (unfiltered)",
        }
    }
}

/// Which moment of a port's creation a sample times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moment {
    /// The bound host has the create's event.
    Seen,
    /// The host's ACTIVE report is acknowledged (where a CNI ADD would return).
    Active,
}

/// One moment of one port's creation, in microseconds after its create was sent.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// The phase it was taken in.
    pub phase: u8,
    /// Which moment.
    pub moment: Moment,
    /// Microseconds after the create was sent.
    pub us: u64,
}

/// What every host and the harness share.
pub struct Shared {
    /// The origin of every timestamp below.
    pub epoch: Instant,
    /// When the create of port `seq` was sent, in nanoseconds after `epoch` (0: not yet).
    pub sent: Vec<AtomicU64>,
    /// The samples of every phase.
    pub samples: Mutex<Vec<Sample>>,
    /// The phase samples are taken in now.
    pub phase: AtomicU8,
    /// The feed the next watch request asks for.
    pub feed: AtomicU8,
    /// Set at the end: every host returns once it is caught up.
    pub stop: AtomicBool,
    /// Relists running now, and how many may run at once (see `Lists`).
    pub lists: Lists,
}

impl Shared {
    /// State for ports numbered below `ports`.
    pub fn new(ports: usize, list_slots: usize) -> Shared {
        Shared {
            epoch: Instant::now(),
            sent: (0..ports).map(|_| AtomicU64::new(0)).collect(),
            samples: Mutex::new(Vec::new()),
            phase: AtomicU8::new(0),
            feed: AtomicU8::new(Feed::Bound as u8),
            stop: AtomicBool::new(false),
            lists: Lists::new(list_slots),
        }
    }

    /// Nanoseconds since `epoch`.
    pub fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// The feed hosts follow from their next request on.
    pub fn set_feed(&self, f: Feed) {
        self.feed.store(f as u8, Ordering::SeqCst);
    }
}

/// A counting semaphore over the hosts' lists. An unfiltered list of 100,000 ports is
/// about 100 MB of JSON on each side of the connection: a thousand at once would not fit
/// this machine's memory, which a thousand real hosts would spread over a thousand
/// machines (the controller would not: see docs/scale.md).
pub struct Lists {
    running: Mutex<usize>,
    freed: Condvar,
    slots: usize,
}

impl Lists {
    fn new(slots: usize) -> Lists {
        Lists {
            running: Mutex::new(0),
            freed: Condvar::new(),
            slots: slots.max(1),
        }
    }

    fn run<T>(&self, f: impl FnOnce() -> T) -> T {
        let mut n = self.running.lock().unwrap();
        while *n >= self.slots {
            n = self.freed.wait(n).unwrap();
        }
        *n += 1;
        drop(n);
        let out = f();
        *self.running.lock().unwrap() -= 1;
        self.freed.notify_one();
        out
    }
}

/// A port as its host last saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    /// Its `revision_number`.
    pub revision: u64,
    /// Whether it was ACTIVE.
    pub active: bool,
}

/// One host's state, read by the harness.
#[derive(Default)]
pub struct State {
    /// The ports bound here, by ID.
    pub ports: HashMap<String, Held>,
    /// The revision the next watch resumes from.
    pub since: i64,
    /// When a watch last answered.
    pub answered: Option<Instant>,
    /// The feed the last answer came from.
    pub feed: Option<Feed>,
    /// Synced (registered and listed) at least once.
    pub synced: bool,
    /// Lists after the first (410, or the host record gone).
    pub relists: u64,
    /// Watch requests that failed (controller unreachable).
    pub failed_watches: u64,
    /// Events received, and of them the ports bound here.
    pub events: u64,
    /// Of `events`, those of ports bound here.
    pub bound_events: u64,
    /// What broke the feed's promises: an event out of order, a port's revision skipped.
    pub violations: Vec<String>,
}

/// A simulated host.
pub struct SimHost {
    /// Its host ID (`binding:host_id`).
    pub id: String,
    /// Its state.
    pub state: Arc<Mutex<State>>,
}

/// Where a port's number is in its ID: the last 12 hex digits (see `port_id`).
pub fn seq_of(id: &str) -> Option<usize> {
    usize::from_str_radix(id.rsplit('-').next()?, 16).ok()
}

/// Port number `seq`'s ID for run `tag`: a UUID the controller takes as a named ID.
pub fn port_id(tag: u32, seq: usize) -> String {
    format!("{tag:08x}-5ca1-4000-8000-{seq:012x}")
}

/// The host ID of host `i`.
pub fn host_id(i: usize) -> String {
    format!("cvt-scale-h{i:04}")
}

/// A distinct underlay address for host `i` (loopback's range: nothing is sent there).
fn underlay(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 1, (i >> 8) as u8, (i & 0xff) as u8))
}

/// Lists collection `R` whole, as `Cache::load` does, keeping only its revision.
fn list_revision<R: Resource>(c: &Client) -> Result<i64, ApiError> {
    match c.list::<R>(&[]) {
        Ok((_, r)) => Ok(r),
        Err(ApiError::Neutron { status: 404, .. }) => Ok(i64::MAX),
        Err(e) => Err(e),
    }
}

/// The agent's lists (`Cache::load`: twelve collections, the watch resuming from the
/// oldest revision) or, on the bound feed, the ports bound here alone; the ports bound
/// here and the revision.
fn load(c: &Client, id: &str, feed: Feed) -> Result<(Vec<Port>, i64), ApiError> {
    match feed {
        Feed::Bound => c.list::<Port>(&[("binding:host_id", id)]),
        Feed::Agent => {
            let mut revs = vec![list_revision::<Network>(c)?, list_revision::<Subnet>(c)?];
            let (ports, r) = c.list::<Port>(&[])?;
            revs.push(r);
            revs.extend([
                list_revision::<Host>(c)?,
                list_revision::<LoadBalancer>(c)?,
                list_revision::<Listener>(c)?,
                list_revision::<Pool>(c)?,
                list_revision::<Member>(c)?,
                list_revision::<FloatingIp>(c)?,
                list_revision::<Router>(c)?,
                list_revision::<SecurityGroup>(c)?,
                list_revision::<SecurityGroupRule>(c)?,
            ]);
            let bound = ports
                .into_iter()
                .filter(|p| p.binding_host_id == id)
                .collect();
            Ok((bound, revs.into_iter().min().unwrap_or(0)))
        }
    }
}

impl SimHost {
    /// Host `i` following the controller at `url` on a thread of its own.
    pub fn spawn(
        i: usize,
        url: &str,
        shared: Arc<Shared>,
    ) -> (SimHost, std::thread::JoinHandle<()>) {
        let id = host_id(i);
        let state: Arc<Mutex<State>> = Arc::default();
        let client = Client::new(url);
        let (hid, st) = (id.clone(), state.clone());
        let thread = std::thread::Builder::new()
            .name(format!("sim-{i}"))
            .stack_size(512 << 10)
            .spawn(move || Runner::new(i, hid, client, shared, st).run())
            .expect("a host thread");
        (SimHost { id, state }, thread)
    }
}

/// The loop of one host.
struct Runner {
    index: usize,
    id: String,
    client: Client,
    shared: Arc<Shared>,
    state: Arc<Mutex<State>>,
    /// The last store revision seen in the feed.
    last_revision: i64,
    /// Reports that failed, retried after the next answer (the agent retries them at
    /// its next full pass).
    unreported: Vec<String>,
}

impl Runner {
    fn new(
        index: usize,
        id: String,
        client: Client,
        shared: Arc<Shared>,
        state: Arc<Mutex<State>>,
    ) -> Runner {
        Runner {
            index,
            id,
            client,
            shared,
            state,
            last_revision: 0,
            unreported: Vec::new(),
        }
    }

    fn feed(&self) -> Feed {
        Feed::from_u8(self.shared.feed.load(Ordering::SeqCst))
    }

    fn run(mut self) {
        loop {
            self.sync();
            if self.follow() {
                return;
            }
        }
    }

    /// Registers and lists until the controller answers, with the agent's backoff.
    fn sync(&mut self) {
        let mut delay = Duration::from_millis(100);
        loop {
            let feed = self.feed();
            let loaded = self
                .client
                .cluster_id()
                .and_then(|_| self.client.register_host(&self.id, underlay(self.index)))
                .and_then(|_| self.shared.lists.run(|| load(&self.client, &self.id, feed)));
            match loaded {
                Ok((ports, revision)) => {
                    let mut st = self.state.lock().unwrap();
                    if st.synced {
                        st.relists += 1;
                    }
                    st.synced = true;
                    st.since = revision;
                    st.ports = ports
                        .iter()
                        .map(|p| {
                            let held = Held {
                                revision: p.revision_number,
                                active: p.status == Status::Active,
                            };
                            (p.id.clone(), held)
                        })
                        .collect();
                    drop(st);
                    self.last_revision = revision;
                    let down: Vec<String> = ports
                        .iter()
                        .filter(|p| p.status != Status::Active)
                        .map(|p| p.id.clone())
                        .collect();
                    self.report(down, false);
                    return;
                }
                Err(_) => {
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// Follows the feed; false when it must list again, true when told to stop and
    /// caught up.
    fn follow(&mut self) -> bool {
        let mut failures = 0u32;
        let mut watcher = Watcher::new(self.client.clone());
        loop {
            let feed = self.feed();
            let since = self.state.lock().unwrap().since;
            let stopping = self.shared.stop.load(Ordering::SeqCst);
            let wait = if stopping {
                Duration::from_secs(1)
            } else {
                WATCH_WAIT
            };
            let filter = WatchFilter {
                host_id: (feed == Feed::Bound).then_some(self.id.as_str()),
                resource: None,
            };
            match watcher.next(since, &filter, wait) {
                Ok(page) => {
                    failures = 0;
                    let empty = page.events.is_empty();
                    let mut vanished = false;
                    let fresh = self.apply(&page.events, feed, &mut vanished);
                    {
                        let mut st = self.state.lock().unwrap();
                        st.since = page.revision;
                        st.answered = Some(Instant::now());
                        st.feed = Some(feed);
                    }
                    let mut retry = std::mem::take(&mut self.unreported);
                    retry.extend(fresh);
                    self.report(retry, true);
                    if vanished {
                        return false;
                    }
                    if stopping && empty {
                        return true;
                    }
                }
                Err(ApiError::Neutron { status: 410, .. }) => return false,
                Err(ApiError::Neutron { status: 404, .. }) => return false,
                Err(_) => {
                    failures += 1;
                    self.state.lock().unwrap().failed_watches += 1;
                    std::thread::sleep(Duration::from_millis(100 * u64::from(failures.min(20))));
                }
            }
        }
    }

    /// Applies a page: the ports bound here that want an ACTIVE report. Sets `vanished`
    /// when the host's own record was deleted (the agent then lists again).
    fn apply(&mut self, events: &[WatchEvent], feed: Feed, vanished: &mut bool) -> Vec<String> {
        let now = self.shared.now_ns();
        let phase = self.shared.phase.load(Ordering::Relaxed);
        let mut fresh = Vec::new();
        let mut seen = Vec::new();
        let mut st = self.state.lock().unwrap();
        st.events += events.len() as u64;
        for (i, e) in events.iter().enumerate() {
            // One transaction is one revision with several keys (a port's first create
            // also makes its project's default security group): equal revisions follow
            // each other within a page, never across pages.
            if e.revision < self.last_revision || (i == 0 && e.revision == self.last_revision) {
                st.violations.push(format!(
                    "event at revision {} after revision {} ({feed:?} feed)",
                    e.revision, self.last_revision
                ));
            }
            self.last_revision = self.last_revision.max(e.revision);
            if e.resource == "hosts" && e.id == self.id && e.kind == EventKind::Delete {
                *vanished = true;
            }
            if e.resource != "ports" {
                continue;
            }
            let o = &e.object;
            let bound = o["binding:host_id"].as_str() == Some(self.id.as_str());
            let revision = o["revision_number"].as_u64().unwrap_or(0);
            let held = st.ports.get(&e.id).copied();
            if !bound && held.is_none() {
                continue;
            }
            st.bound_events += 1;
            match (e.kind, held) {
                (EventKind::Delete, Some(h)) => {
                    if h.revision != revision {
                        st.violations.push(format!(
                            "port {} deleted at revision_number {revision}, last seen at {}",
                            e.id, h.revision
                        ));
                    }
                    st.ports.remove(&e.id);
                }
                (EventKind::Delete, None) => st
                    .violations
                    .push(format!("delete of port {} never seen", e.id)),
                (EventKind::Put, held) => {
                    let expected = held.map_or(1, |h| h.revision + 1);
                    if revision != expected {
                        st.violations.push(format!(
                            "port {} at revision_number {revision}, expected {expected}",
                            e.id
                        ));
                    }
                    if !bound {
                        st.ports.remove(&e.id);
                        continue;
                    }
                    let active = o["status"].as_str() == Some("ACTIVE");
                    st.ports.insert(e.id.clone(), Held { revision, active });
                    if held.is_none() {
                        seen.push((e.id.clone(), now));
                    }
                    if !active {
                        fresh.push(e.id.clone());
                    }
                }
            }
        }
        drop(st);
        let mut samples = Vec::new();
        for (id, at) in seen {
            if let Some(sent) = seq_of(&id).and_then(|s| self.shared.sent.get(s)) {
                let sent = sent.load(Ordering::Relaxed);
                if sent > 0 {
                    samples.push(Sample {
                        phase,
                        moment: Moment::Seen,
                        us: at.saturating_sub(sent) / 1000,
                    });
                }
            }
        }
        if !samples.is_empty() {
            self.shared.samples.lock().unwrap().extend(samples);
        }
        fresh
    }

    /// Reports ports ACTIVE, as `Agent::report`; `timed` records the acknowledgement's
    /// moment against the create's.
    fn report(&mut self, ids: Vec<String>, timed: bool) {
        let phase = self.shared.phase.load(Ordering::Relaxed);
        for id in ids {
            match self.client.set_port_status(&id, Status::Active) {
                Ok(_) if timed => {
                    let now = self.shared.now_ns();
                    let sent = seq_of(&id)
                        .and_then(|s| self.shared.sent.get(s))
                        .map_or(0, |s| s.load(Ordering::Relaxed));
                    if sent > 0 {
                        self.shared.samples.lock().unwrap().push(Sample {
                            phase,
                            moment: Moment::Active,
                            us: now.saturating_sub(sent) / 1000,
                        });
                    }
                }
                Ok(_) | Err(ApiError::Neutron { status: 404, .. }) => {}
                Err(_) => self.unreported.push(id),
            }
        }
    }
}
