//! The per-host agent: registers its host with the controller, follows the watch feed,
//! and makes this host's datapath match the ports bound to it: plugs and unplugs them,
//! links the host to the others with a VXLAN overlay, masquerades egress, and reports
//! each plugged port ACTIVE (UP on the Mizar routes).

#![deny(missing_docs)]

pub mod cache;
pub mod datapath;
pub mod metrics;
pub mod plan;
mod presence;
pub mod security_groups;
pub mod services;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::time::{Duration, Instant};

use corvid_api::{ApiError, Client, Status, WatchFilter, Watcher};

use crate::cache::{Cache, Changed, Dirty};
use crate::datapath::{Datapath, Held};
use crate::metrics::{failed, ErrorKind, Health, Object, Pass};
use crate::presence::Presence;
use corvid_net::binding::Plugged;
use corvid_net::link::Link;
use corvid_net::names::{self, BRIDGE_PREFIX, VETH_PREFIX, VXLAN_PREFIX};
use plan::{NetworkPlan, PortPlan, PortRole};

/// How an agent is started.
#[derive(Debug, Clone)]
pub struct Config {
    /// The ID ports name in `binding:host_id`.
    pub host_id: String,
    /// The controller's base URL.
    pub controller: String,
    /// The token and TLS side the controller is reached with.
    pub credentials: corvid_api::Credentials,
    /// This host's underlay address; found from the route to the controller when none.
    pub underlay_ip: Option<IpAddr>,
    /// How often the whole host is compared with the controller even without changes.
    pub resync: Duration,
    /// The interface on the public network: floating IPs are added to it (so this host
    /// answers ARP for them) and what leaves through it from a port with a floating IP
    /// leaves from that address.
    pub public_interface: Option<String>,
    /// Whether ports are filtered by their security groups.
    pub security_groups: bool,
    /// Whether every router's networks are held here, whether or not a port of one is
    /// bound here (a Kubernetes node reaches every pod).
    pub all_routers: bool,
    /// The TCP timeouts of the host's conntrack, set once it serves services.
    pub conntrack: corvid_net::conntrack::TcpTimeouts,
    /// Whether ports on hosts of this host's underlay subnet are routed to directly,
    /// without encapsulation (VXLAN for the others).
    pub direct_routing: bool,
}

/// Why the agent stopped.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The configuration cannot work.
    #[error("{0}")]
    Config(String),
    /// The host's datapath could not be opened.
    #[error("datapath: {0}")]
    Net(#[from] corvid_net::Error),
    /// The controller's TLS side or token could not be set up.
    #[error("reaching the controller: {0}")]
    Credentials(#[from] corvid_api::TlsError),
}

/// How long one watch request waits for changes.
const WATCH_WAIT: Duration = Duration::from_secs(20);

/// An agent bound to one host.
pub struct Agent {
    cfg: Config,
    client: Client,
    dp: Datapath,
    cache: Cache,
    underlay: IpAddr,
    /// Ports whose plug failed, with the revision that failed: retried once they change,
    /// or at the next full pass.
    failed: HashMap<String, u64>,
    /// Ports whose namespace side was last found complete, with the revision then: a
    /// port is checked again when it changes and at every full pass.
    checked: HashMap<String, u64>,
    /// The services and floating IPs last handed to the datapath.
    services: services::ServicePlan,
    /// The plan the datapath was last made to match, by network: a change is planned
    /// and applied against it alone.
    plans: BTreeMap<String, NetworkPlan>,
    /// The links the agent owns as last seen (a full pass lists them again).
    links: HashMap<String, Link>,
    /// Which routers are here, kept up with `plans`.
    presence: Presence,
    /// The security groups' filter as planned, kept up with `plans` and the cache.
    security: security_groups::Planner,
    /// Whether it is registered and following the controller, for `/readyz`.
    health: std::sync::Arc<Health>,
}

/// The local address this host uses to reach `url`'s host (no packet is sent); the
/// default route's source when that is loopback, so a one-host setup still has an
/// address other hosts could reach.
pub fn detect_underlay(url: &str) -> Option<IpAddr> {
    let authority = url.split("://").nth(1).unwrap_or(url).split('/').next()?;
    let with_port = if authority.contains(':') && !authority.ends_with(']') {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    let target: SocketAddr = with_port.to_socket_addrs().ok()?.next()?;
    let local = |to: SocketAddr| -> Option<IpAddr> {
        let bind = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
        let s = UdpSocket::bind(bind).ok()?;
        s.connect(to).ok()?;
        Some(s.local_addr().ok()?.ip())
    };
    let ip = local(target)?;
    if ip.is_loopback() {
        // TEST-NET-1: only the routing decision is made, nothing is sent.
        return local("192.0.2.1:4789".parse().ok()?).or(Some(ip));
    }
    Some(ip)
}

impl Agent {
    /// An agent for `cfg` on the calling thread's network namespace.
    pub fn new(cfg: Config) -> Result<Agent, AgentError> {
        if cfg.host_id.is_empty() {
            return Err(AgentError::Config("a host ID is required".into()));
        }
        let underlay = match cfg.underlay_ip {
            Some(ip) => ip,
            None => detect_underlay(&cfg.controller).ok_or_else(|| {
                AgentError::Config(format!(
                    "cannot find this host's address towards {}: pass --underlay-ip",
                    cfg.controller
                ))
            })?,
        };
        let client = cfg.credentials.client(&cfg.controller)?;
        Ok(Agent {
            dp: Datapath::open(
                underlay,
                cfg.public_interface.clone(),
                cfg.conntrack,
                cfg.direct_routing,
            )?,
            client,
            cfg,
            cache: Cache::default(),
            underlay,
            failed: HashMap::new(),
            checked: HashMap::new(),
            services: Default::default(),
            plans: BTreeMap::new(),
            links: HashMap::new(),
            presence: Presence::default(),
            security: Default::default(),
            health: Default::default(),
        })
    }

    /// What `/readyz` reads: registered with the controller and following its feed.
    pub fn health(&self) -> std::sync::Arc<Health> {
        self.health.clone()
    }

    /// Runs until the process ends: registers, lists, reconciles, then follows the
    /// watch. A lost controller is waited for; a watch that fell behind lists again.
    pub fn run(&mut self) -> ! {
        warn_of_forward_drops();
        let mut stalls = 0u32;
        loop {
            self.sync();
            match self.follow() {
                Relist::Moved => stalls = 0,
                Relist::Stalled => {
                    // A feed compacted between the list and the first watch can happen once;
                    // twice in a row, the lists' revision cannot resume the feed, and
                    // listing again at once would only repeat it, as fast as the wire allows.
                    stalls += 1;
                    if stalls >= 2 {
                        failed(ErrorKind::FeedStart);
                        let wait = Duration::from_secs(1 << (stalls - 2).min(5));
                        let why = format!(
                            "the watch feed refuses revision {} that the controller's lists were read at",
                            self.cache.revision
                        );
                        tracing::error!(
                            "{why}: a controller bug; listing again in {} s",
                            wait.as_secs()
                        );
                        self.health.stalled(why);
                        std::thread::sleep(wait);
                    }
                }
            }
        }
    }

    /// Registers the host and loads the controller's state, retrying until it answers.
    fn sync(&mut self) {
        let mut delay = Duration::from_millis(100);
        loop {
            let loaded = self
                .client
                .cluster_id()
                .and_then(|cluster| {
                    self.client
                        .register_host(&self.cfg.host_id, self.underlay)
                        .map(|_| cluster)
                })
                .and_then(|cluster| Ok((cluster, Cache::load(&self.client)?)));
            match loaded {
                Ok((cluster, cache)) => {
                    self.dp.set_cluster(cluster);
                    self.cache = cache;
                    // Ready once the host matches what was loaded, not before.
                    self.reconcile(Dirty::all());
                    self.health.synced();
                    return;
                }
                Err(e) => {
                    failed(ErrorKind::Controller);
                    tracing::warn!(controller = %self.cfg.controller, "cannot reach the controller: {e}; retrying");
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// Applies the watch feed until it must list again (410, or the host vanished).
    fn follow(&mut self) -> Relist {
        let mut moved = false;
        let mut last_full = Instant::now();
        let mut failures = 0u32;
        let mut watcher = Watcher::new(self.client.clone());
        // One wait for the whole stream (another one opens a new stream): a quiet feed
        // still brings a page, and with it the full pass's turn, within a third of the
        // resync period.
        let wait = WATCH_WAIT
            .min(self.cfg.resync / 3)
            .max(Duration::from_secs(1));
        loop {
            match watcher.next(self.cache.revision, &WatchFilter::default(), wait) {
                Ok(page) => {
                    failures = 0;
                    moved = true;
                    self.health.following();
                    let dirty = self.cache.apply(&page.events);
                    self.cache.revision = page.revision;
                    if !self.cache.hosts.contains_key(&self.cfg.host_id) {
                        return Relist::Moved;
                    }
                    if last_full.elapsed() >= self.cfg.resync {
                        last_full = Instant::now();
                        self.reconcile(Dirty::all());
                    } else if !dirty.is_empty() {
                        self.reconcile(dirty);
                    } else if self.cache.services_changed != Changed::Nothing {
                        self.sync_services(false);
                    }
                }
                Err(ApiError::Neutron { status: 410, .. }) if moved => return Relist::Moved,
                Err(ApiError::Neutron { status: 410, .. }) => return Relist::Stalled,
                Err(e) => {
                    failed(ErrorKind::Watch);
                    failures += 1;
                    if failures == 1 {
                        tracing::warn!("watch failed: {e}; retrying");
                    }
                    std::thread::sleep(Duration::from_millis(100 * u64::from(failures.min(20))));
                }
            }
        }
    }

    /// Makes the service datapath match the cache's load balancers and floating IPs:
    /// everything when `full`, else the services that changed.
    fn sync_services(&mut self, full: bool) {
        let changed = match self.cache.take_changed() {
            _ if full => Changed::All,
            c => c,
        };
        let synced = match &changed {
            Changed::Nothing => return,
            Changed::All => {
                self.services = services::plan(&self.cache);
                self.dp.sync_services(&self.services, None)
            }
            Changed::Listeners(ids) => {
                for id in ids {
                    match services::plan_listener(&self.cache, id) {
                        Some(s) => self.services.services.insert(id.clone(), s),
                        None => self.services.services.remove(id),
                    };
                }
                self.dp.sync_services(&self.services, Some(ids))
            }
        };
        match synced {
            Ok(report) => {
                if report != Default::default() {
                    tracing::info!(
                        added = report.added,
                        changed = report.changed,
                        removed = report.removed,
                        "services"
                    );
                }
            }
            Err(e) => {
                failed(ErrorKind::Services);
                tracing::error!("services: {e}");
                self.cache.services_changed = Changed::All;
            }
        }
    }

    /// Applies what the controller committed since the cache's revision, without waiting.
    fn catch_up(&mut self) -> Result<Dirty, ApiError> {
        let mut dirty = Dirty::default();
        loop {
            let page =
                self.client
                    .watch(self.cache.revision, &WatchFilter::default(), Duration::ZERO)?;
            if page.events.is_empty() {
                self.cache.revision = page.revision;
                return Ok(dirty);
            }
            dirty = dirty.merge(self.cache.apply(&page.events));
            self.cache.revision = page.revision;
        }
    }

    /// Makes the datapath match the cache for what `dirty` names: everything (a full
    /// pass, which also lists the kernel's links), or the networks and ports that
    /// changed, against the plan last applied, so a change costs the same however many
    /// ports the host holds.
    pub fn reconcile(&mut self, dirty: Dirty) {
        let started = Instant::now();
        let kind = if dirty.all { Pass::Full } else { Pass::Changes };
        let had_networks = !self.plans.is_empty();
        let mut reports = Vec::new();
        let done = if dirty.all {
            self.full_pass(&mut reports)
        } else {
            self.apply_changes(&dirty, &mut reports);
            Ok(())
        };
        if let Err(e) = done {
            failed(ErrorKind::Datapath);
            tracing::error!("reconcile: {e}");
        }
        // The allowance names every corvid bridge at once: it changes only when the first
        // comes or the last goes.
        if dirty.all || self.plans.is_empty() == had_networks {
            self.sync_forwarding();
        }
        // Which networks are here and their routers change only with routers and the
        // networks whose plans were set: a pod's own change leaves both alone.
        let changed = self.presence.take_changed();
        let routed = dirty.all
            || !dirty.routers.is_empty()
            || !changed.is_empty()
            || self.dp.direct_changed();
        if routed || !self.dp.routing_settled() {
            if let Err(e) = self.dp.sync_routing(&self.plans, &changed, dirty.all) {
                failed(ErrorKind::Routing);
                tracing::error!("routing between networks: {e}");
            }
            let routes = if self.cfg.all_routers {
                let all = self.cache.routers_with_interfaces();
                plan::extra_routes(&self.cache, &self.plans, all)
            } else {
                plan::extra_routes(&self.cache, &self.plans, self.presence.routers())
            };
            if let Err(e) = self.dp.sync_extra_routes(&routes, dirty.all) {
                failed(ErrorKind::Routing);
                tracing::error!("routers' extra routes: {e}");
            }
        }
        if let Err(e) = self.dp.sync_masquerade(&self.plans, &changed, dirty.all) {
            failed(ErrorKind::Masquerade);
            tracing::error!("masquerade: {e}");
        }
        self.sync_services(dirty.all);
        // Before the reports: a port is ACTIVE, and its CNI ADD returns, once filtered.
        let touched =
            dirty.all || dirty.security || !dirty.ports.is_empty() || !dirty.networks.is_empty();
        if touched && !self.sync_security_groups(&dirty) {
            // Not filtered as planned: a port the filter should hold is not reported
            // ACTIVE (its CNI ADD waits) until a pass gets the filter through.
            let held = &self.security.want().ports;
            reports.retain(|(id, _, status)| *status != Status::Active || !held.contains_key(id));
            for id in held.keys() {
                self.checked.remove(id);
            }
        }
        self.report(reports);
        metrics::objects(Object::Networks, self.plans.len());
        metrics::objects(
            Object::Ports,
            self.plans.values().map(|n| n.ports.len()).sum(),
        );
        metrics::objects(Object::Links, self.links.len());
        metrics::objects(Object::Services, self.services.services.len());
        metrics::pass(kind, started);
    }

    /// Makes the security groups' filter hold the ports plugged here and their groups,
    /// or, when the agent filters nothing, removes a filter an earlier agent left;
    /// false when the filter could not be made so.
    fn sync_security_groups(&mut self, dirty: &Dirty) -> bool {
        if self.cfg.security_groups {
            if dirty.all || dirty.security {
                self.security.full(&self.cache, &self.plans);
            } else {
                self.security
                    .changes(&self.cache, &self.plans, &dirty.ports, &dirty.networks);
            }
        }
        let touched = self.security.take_touched();
        match self.dp.sync_security_groups(
            self.security.want(),
            touched.as_ref(),
            self.cfg.security_groups,
            dirty.all,
        ) {
            Ok(Some(r)) if r != Default::default() => {
                tracing::info!(
                    ports = r.ports,
                    groups = r.groups,
                    members = r.members,
                    "security groups"
                );
                true
            }
            Ok(_) => true,
            Err(e) => {
                failed(ErrorKind::SecurityGroups);
                tracing::error!("security groups: {e}");
                false
            }
        }
    }

    /// Lets bridged traffic through iptables' FORWARD while any corvid bridge is here:
    /// checked at every full pass (a dockerd or firewall restart may have removed it) and
    /// whenever a network comes or goes.
    fn sync_forwarding(&mut self) {
        use corvid_net::iptables::{Change, CHAIN};
        match self.dp.sync_forwarding() {
            Ok(Change::Added) => {
                tracing::info!(
                    chain = CHAIN,
                    "iptables: corvid's bridges allowed through FORWARD"
                )
            }
            Ok(Change::Removed) => {
                tracing::info!(
                    chain = CHAIN,
                    "iptables: the last corvid bridge is gone, so is its allowance"
                )
            }
            Ok(Change::None) => {}
            Err(e) => {
                failed(ErrorKind::Forwarding);
                tracing::error!("iptables: letting corvid's bridges through FORWARD: {e}");
            }
        }
    }

    /// Unplugs what is no longer bound here, brings up every network, checks every port.
    fn full_pass(&mut self, reports: &mut Vec<Report>) -> Result<(), corvid_net::Error> {
        let mut plans = plan::plan(&self.cache, self.here(), self.cfg.all_routers);
        let mut links = self.dp.owned_links()?;
        let mut stale = stale_links(&plans, &links);
        if !stale.is_empty() {
            // A link can be younger than the cache: a Docker Join plugs a port whose
            // creation the watch has not brought yet. Only what is unknown after catching
            // up with the controller is removed; when it cannot be asked, nothing is.
            match self.catch_up() {
                Ok(_) => {
                    plans = plan::plan(&self.cache, self.here(), self.cfg.all_routers);
                    stale = stale_links(&plans, &links);
                }
                Err(e) => {
                    tracing::warn!("keeping unknown links until the controller answers: {e}");
                    stale.clear();
                }
            }
        }
        // One link that cannot go must not keep the others, or the ports, waiting.
        for name in stale {
            let Some(listed) = links.remove(&name) else {
                continue;
            };
            // Looked at again: another cluster's plug marks its device right after making
            // it, maybe since the list.
            match self.dp.link(&name) {
                Ok(Some(l)) if self.dp.owns(&l) => {
                    tracing::info!(link = %name, alias = %l.alias, "removing a link of this cluster that no port or network bound here needs");
                    if let Err(e) = self.dp.remove(&l) {
                        failed(ErrorKind::Unlink);
                        tracing::error!(link = %name, "remove a link no port or network needs: {e}");
                    }
                }
                Ok(_) => {
                    tracing::debug!(link = %listed.name, "left alone: gone, or another cluster's")
                }
                Err(e) => tracing::warn!(link = %name, "look at a link before removing it: {e}"),
            }
        }
        self.links = links;
        self.plans = plans;
        self.presence.reset(&self.plans);
        let mut entries = self.dp.overlay_entries()?;
        self.dp.begin_full_pass()?;
        let ids: Vec<String> = self.plans.keys().cloned().collect();
        for id in ids {
            self.bring_up(&id, Held::Dumped(&mut entries), true, reports);
        }
        self.dp.end_full_pass(&self.plans)?;
        self.failed
            .retain(|id, _| self.cache.ports.contains_key(id));
        self.checked
            .retain(|id, _| self.cache.ports.contains_key(id));
        Ok(())
    }

    /// Syncs network `id`'s devices and entries with its plan and plugs its ports (all
    /// of them checked again when `full`, else those not known to be in place).
    fn bring_up(&mut self, id: &str, held: Held, full: bool, reports: &mut Vec<Report>) {
        let Some(n) = self.plans.get(id) else {
            return;
        };
        let (bridge, vxlan) = match self.dp.sync_network(n, held) {
            Ok(devices) => devices,
            Err(e) => {
                failed(ErrorKind::Network);
                tracing::error!(network = %id, "bring up the network: {e}");
                return;
            }
        };
        self.links.insert(bridge.name.clone(), bridge);
        self.links.insert(vxlan.name.clone(), vxlan);
        let ports: Vec<PortPlan> = n.ports.values().cloned().collect();
        for p in &ports {
            self.plug(id, p, full, reports);
        }
    }

    /// Plugs one port of network `net` unless it is known to be in place (or to fail at
    /// this revision) and `full` is not asked.
    fn plug(&mut self, net: &str, p: &PortPlan, full: bool, reports: &mut Vec<Report>) {
        let settled = (self.links.contains_key(&p.host_veth)
            && self.checked.get(&p.id) == Some(&p.revision))
            || self.failed.get(&p.id) == Some(&p.revision);
        if settled && !full {
            return;
        }
        let Some(n) = self.plans.get(net) else {
            return;
        };
        let mtu = self.dp.mtu(n.mtu);
        let bridge = match self.links.get(&n.bridge) {
            Some(b) => b.clone(),
            // Gone since it was last seen: the network is brought up again first.
            None => match self.dp.sync_network(n, Held::Unknown) {
                Ok((bridge, vxlan)) => {
                    self.links.insert(vxlan.name.clone(), vxlan);
                    self.links.insert(bridge.name.clone(), bridge.clone());
                    bridge
                }
                Err(e) => {
                    failed(ErrorKind::Network);
                    tracing::error!(network = %net, "bring up the network: {e}");
                    return;
                }
            },
        };
        let _network = tracing::info_span!("network", id = %net).entered();
        let _port = tracing::info_span!("port", id = %p.id, netns = %p.netns).entered();
        match self.dp.ensure_port(&bridge, mtu, p) {
            Ok(plugged) => {
                if plugged != Plugged::Intact {
                    metrics::METRICS.plugs.inc();
                }
                match &plugged {
                    Plugged::Finished(steps) => {
                        tracing::warn!("finished a half-made plug: {}", steps.join(", "))
                    }
                    Plugged::New { replaced: true } => {
                        tracing::warn!("the veth pair was unusable and is made anew")
                    }
                    Plugged::New { replaced: false } => tracing::info!("plugged"),
                    Plugged::Intact => {}
                }
                if let Ok(Some(l)) = self.dp.link(&p.host_veth) {
                    self.links.insert(l.name.clone(), l);
                }
                self.failed.remove(&p.id);
                self.checked.insert(p.id.clone(), p.revision);
                if p.status != Status::Active {
                    reports.push((p.id.clone(), p.revision, Status::Active));
                }
            }
            Err(e) => {
                failed(ErrorKind::Plug);
                tracing::error!("plug: {e}");
                self.failed.insert(p.id.clone(), p.revision);
                self.checked.remove(&p.id);
                if p.status != Status::Error {
                    reports.push((p.id.clone(), p.revision, Status::Error));
                }
            }
        }
    }

    /// Whether network plan `n` has a datapath here: a port of it is bound here, or one
    /// of a network on its router is.
    fn needed(&self, n: &NetworkPlan) -> bool {
        n.is_local() || n.router.as_deref().is_some_and(|r| self.router_here(r))
    }

    /// Whether router `r`'s networks are held here: all routers' with `all_routers`,
    /// else those with a network with a port bound here.
    fn router_here(&self, r: &str) -> bool {
        self.cfg.all_routers || self.presence.is_here(r)
    }

    /// Whether network `id`'s plan is here when it should not be, or the other way
    /// round, or is on another router than the cache says.
    fn misplanned(&self, id: &str) -> bool {
        let router = self.cache.network_router(id);
        match self.plans.get(id) {
            Some(n) => n.router.as_deref() != router || !self.needed(n),
            None => {
                self.cache.networks.contains_key(id) && router.is_some_and(|r| self.router_here(r))
            }
        }
    }

    /// Brings networks here or takes them away as they are now needed: those a change
    /// touched whose plan is no longer needed, and every network of a router that came
    /// here or left, which is the one time a router's networks are all looked at. (A
    /// network's router changes only with an interface port, whose network is then
    /// planned whole, and a network with no plan here is needed only through a local
    /// port or a router that came.)
    fn replan_routers(&mut self, touched: &BTreeSet<String>, reports: &mut Vec<Report>) {
        for id in touched {
            if self.plans.get(id).is_some_and(|n| !self.needed(n)) {
                self.replan_network(id, reports);
            }
        }
        loop {
            let flips = self.presence.take_flips();
            if flips.is_empty() {
                return;
            }
            for r in flips {
                let networks: Vec<String> = self
                    .cache
                    .router_networks(&r)
                    .into_iter()
                    .map(str::to_string)
                    .collect();
                for id in networks {
                    if self.misplanned(&id) {
                        self.replan_network(&id, reports);
                    }
                }
            }
        }
    }

    /// Applies changed networks (planned whole) and changed ports (one by one), then
    /// the networks of routers those touched.
    fn apply_changes(&mut self, dirty: &Dirty, reports: &mut Vec<Report>) {
        for id in &dirty.networks {
            self.replan_network(id, reports);
        }
        let mut touched = dirty.networks.clone();
        for id in &dirty.ports {
            let now = self.cache.ports.get(id).map(|p| p.network_id.clone());
            // Where the plan holds it: the network the port was on before this change.
            let was = dirty
                .was_on
                .get(id)
                .filter(|net| self.plans.get(*net).is_some_and(|n| n.holds(id)))
                .cloned();
            touched.extend(was.iter().chain(&now).cloned());
            if let Some(was) = was.filter(|w| Some(w) != now.as_ref()) {
                self.move_port(&was, id, None, reports);
            }
            let Some(net) = now else {
                self.failed.remove(id);
                self.checked.remove(id);
                continue;
            };
            if dirty.networks.contains(&net) {
                continue;
            }
            let role = self
                .cache
                .ports
                .get(id)
                .and_then(|p| plan::port_role(&self.cache, p, self.here()));
            if self.plans.contains_key(&net) {
                self.move_port(&net, id, role, reports);
            } else if matches!(role, Some(PortRole::Local(_) | PortRole::External(_))) {
                // The network's first port here: it comes up whole.
                self.replan_network(&net, reports);
            }
        }
        self.replan_routers(&touched, reports);
    }

    /// Plans network `id` again from the cache and applies it: brought up when a port
    /// is bound here, taken down otherwise.
    fn replan_network(&mut self, id: &str, reports: &mut Vec<Report>) {
        let fresh = self
            .cache
            .networks
            .get(id)
            .map(|net| plan::network_plan(&self.cache, net, self.here()))
            .filter(|n| self.needed(n));
        let old = match fresh {
            Some(plan) => self.plans.insert(id.to_string(), plan),
            None => self.plans.remove(id),
        };
        self.presence.note(id, self.plans.get(id));
        if let Some(old) = &old {
            for p in old.ports.values() {
                if !self
                    .plans
                    .get(id)
                    .is_some_and(|n| n.ports.contains_key(&p.id))
                {
                    self.unlink(&p.host_veth);
                }
            }
            if !self.plans.contains_key(id) {
                self.take_down(old);
            }
        }
        let held = old.as_ref().map_or(Held::Unknown, Held::Planned);
        self.bring_up(id, held, false, reports);
    }

    /// Gives port `id` its new role in network `net`'s plan and applies the difference.
    fn move_port(
        &mut self,
        net: &str,
        id: &str,
        role: Option<PortRole>,
        reports: &mut Vec<Report>,
    ) {
        let Some(n) = self.plans.get_mut(net) else {
            return;
        };
        let old = n.place(id, role.clone());
        self.presence.note(net, self.plans.get(net));
        let needed = self.plans.get(net).is_some_and(|n| self.needed(n));
        if !needed {
            // The network's last port here went, and no network of its router is here:
            // its devices go too.
            let n = self.plans.remove(net).expect("the plan was just changed");
            self.presence.note(net, None);
            if let Some(PortRole::Local(p)) = &old {
                self.unlink(&p.host_veth);
            }
            self.take_down(&n);
            return;
        }
        if let Some(PortRole::Local(p)) = &old {
            let kept = matches!(&role, Some(PortRole::Local(q)) if q.host_veth == p.host_veth);
            if !kept {
                self.unlink(&p.host_veth);
            }
        }
        let remote = |r: &Option<PortRole>| match r {
            Some(PortRole::Remote(r)) => Some(r.clone()),
            _ => None,
        };
        let (was, now) = (remote(&old), remote(&role));
        if was.is_some() || now.is_some() {
            let vxlan = self.links.get(&names::vxlan(net)).cloned();
            let bridge = self.links.get(&names::bridge(net)).map(|b| b.mac.clone());
            let moved = match (vxlan, bridge) {
                (Some(v), Some(mac)) => self.dp.move_remote((&v, &mac), was.as_ref(), now.as_ref()),
                _ => Ok(()),
            };
            if let Err(e) = self.dp.move_direct(net, was.as_ref(), now.as_ref()) {
                failed(ErrorKind::Overlay);
                tracing::error!(network = %net, port = %id, "direct routes: {e}");
            }
            if let Err(e) = moved {
                failed(ErrorKind::Overlay);
                tracing::error!(network = %net, port = %id, "overlay entries: {e}");
            }
        }
        if let Some(PortRole::Local(p)) = role {
            self.plug(net, &p, false, reports);
        }
    }

    /// Takes away a network's devices and direct routes: it has no datapath here any more.
    fn take_down(&mut self, n: &NetworkPlan) {
        self.unlink(&n.vxlan);
        self.unlink(&n.bridge);
        if let Err(e) = self.dp.forget_network(&n.id) {
            failed(ErrorKind::Network);
            tracing::error!(network = %n.id, "remove its direct routes: {e}");
        }
    }

    /// This host as plans see it.
    fn here(&self) -> plan::Here<'_> {
        plan::Here {
            host: &self.cfg.host_id,
            segment: self.dp.segment(),
        }
    }

    /// Removes an owned link, if there; a failure is logged (the next full pass retries).
    fn unlink(&mut self, name: &str) {
        let link = match self.links.remove(name) {
            Some(l) => Some(l),
            None => self.dp.link(name).ok().flatten(),
        };
        if let Some(l) = link.filter(|l| self.dp.owns(l)) {
            tracing::info!(link = %name, "removing a link whose port or network left this host");
            if let Err(e) = self.dp.remove(&l) {
                failed(ErrorKind::Unlink);
                tracing::error!(link = %name, "remove a link no port or network needs: {e}");
            }
        }
    }

    /// Tells the controller each port's new status.
    fn report(&mut self, reports: Vec<Report>) {
        for (id, checked_at, status) in reports {
            match self.client.set_port_status(&id, status) {
                // Only the report itself came after the check: nothing new to check.
                Ok(port) if status == Status::Active && port.revision_number == checked_at + 1 => {
                    self.checked.insert(id, port.revision_number);
                }
                Ok(_) | Err(ApiError::Neutron { status: 404, .. }) => {}
                Err(e) => {
                    failed(ErrorKind::Report);
                    tracing::warn!(port = %id, "report {status}: {e}")
                }
            }
        }
    }
}

/// Warns of forward chains of other nftables tables whose policy drops: they drop
/// corvid's forwarded traffic whatever corvid's own table accepts, and only the host's
/// owner can change them.
fn warn_of_forward_drops() {
    let drops = corvid_net::nftables::Nftables::open().and_then(|mut n| n.forward_drops());
    match drops {
        Ok(drops) => {
            for d in drops {
                tracing::warn!(
                    "{d} drops forwarded traffic: containers on corvid's bridges cannot reach each other or leave the host until it accepts them (`nft insert rule {} {} {} iifname \"cvb*\" accept` and the same with oifname; firewalld: `firewall-cmd --zone=trusted --add-interface=<bridge>`)",
                    d.family, d.table, d.chain
                );
            }
        }
        Err(e) => tracing::warn!("cannot read the host's nftables chains: {e}"),
    }
}

/// Why the agent lists again.
enum Relist {
    /// The feed moved on past the lists, or the host was unregistered.
    Moved,
    /// The feed refused the lists' own revision before answering once.
    Stalled,
}

/// A port's status to report: its ID, the revision checked, the status.
type Report = (String, u64, Status);

/// The owned links no plan asks for, ports' ends before the devices they hang on.
fn stale_links(
    plans: &BTreeMap<String, plan::NetworkPlan>,
    links: &HashMap<String, Link>,
) -> Vec<String> {
    let wanted: HashSet<&str> = plans
        .values()
        .flat_map(|n| {
            [n.bridge.as_str(), n.vxlan.as_str()]
                .into_iter()
                .chain(n.ports.values().map(|p| p.host_veth.as_str()))
                .chain(n.external.values().map(String::as_str))
        })
        .collect();
    let mut stale: Vec<String> = links
        .keys()
        .filter(|n| !wanted.contains(n.as_str()))
        .cloned()
        .collect();
    stale.sort_by_key(|n| {
        [VETH_PREFIX, VXLAN_PREFIX, BRIDGE_PREFIX]
            .iter()
            .position(|p| n.starts_with(p))
    });
    stale
}
