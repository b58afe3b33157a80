//! What a service serves, as kube-proxy takes it: the API's endpoint objects, written by
//! the endpoint controllers (ready pods the selector picks, `publishNotReadyAddresses`,
//! named ports resolved per pod), by the API servers (the `kubernetes` service) or by
//! hand (a service without a selector, mirrored into slices). EndpointSlices where the API
//! server serves them (`discovery.k8s.io/v1`, or `v1beta1` as on 1.20), else Endpoints.
//!
//! Either kind becomes the same thing here: groups of ready addresses with the ports
//! they serve, one group per slice or per Endpoints subset.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Endpoints;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use serde::Deserialize;

use corvid_api::LbProtocol;

/// The label an EndpointSlice names its service with.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// One group of a service's endpoints: the ready addresses, and the ports they serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointGroup {
    /// The ready endpoints' addresses (an endpoint's first, as kube-proxy takes it).
    pub addresses: Vec<IpAddr>,
    /// The ports: the service port's name (empty for an unnamed one), number, protocol.
    pub ports: Vec<(String, u16, LbProtocol)>,
}

impl EndpointGroup {
    /// The port the group serves for the service port named `name` with `protocol`.
    pub fn port(&self, name: &str, protocol: LbProtocol) -> Option<u16> {
        self.ports
            .iter()
            .find(|(n, _, p)| n == name && *p == protocol)
            .map(|(_, port, _)| *port)
    }
}

/// The protocol a service, an Endpoints subset or a slice names (TCP when none).
pub fn protocol_of(name: Option<&str>) -> LbProtocol {
    match name.unwrap_or("TCP") {
        "TCP" => LbProtocol::Tcp,
        "UDP" => LbProtocol::Udp,
        "SCTP" => LbProtocol::Sctp,
        _ => LbProtocol::Other,
    }
}

/// The groups of an Endpoints object: each subset's ready addresses (`notReadyAddresses`
/// serve nothing).
pub fn of_endpoints(ep: &Endpoints) -> Vec<EndpointGroup> {
    ep.subsets
        .iter()
        .flatten()
        .map(|subset| EndpointGroup {
            addresses: subset
                .addresses
                .iter()
                .flatten()
                .filter_map(|a| a.ip.parse().ok())
                .collect(),
            ports: subset
                .ports
                .iter()
                .flatten()
                .filter_map(|p| {
                    Some((
                        p.name.clone().unwrap_or_default(),
                        u16::try_from(p.port).ok()?,
                        protocol_of(p.protocol.as_deref()),
                    ))
                })
                .collect(),
        })
        .collect()
}

/// The fields of an EndpointSlice read here, the same in `v1` and `v1beta1`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Slice {
    #[serde(default)]
    address_type: String,
    #[serde(default)]
    endpoints: Option<Vec<SliceEndpoint>>,
    #[serde(default)]
    ports: Option<Vec<SlicePort>>,
}

#[derive(Deserialize)]
struct SliceEndpoint {
    #[serde(default)]
    addresses: Vec<String>,
    #[serde(default)]
    conditions: Option<SliceConditions>,
}

#[derive(Deserialize)]
struct SliceConditions {
    ready: Option<bool>,
}

#[derive(Deserialize)]
struct SlicePort {
    name: Option<String>,
    port: Option<i32>,
    protocol: Option<String>,
}

/// The service (`namespace/name`) an EndpointSlice belongs to and its group; none for a
/// slice of no service or of FQDN addresses. An endpoint whose readiness is not known
/// counts as ready, as the API documents it.
pub fn of_slice(slice: &DynamicObject) -> Option<(String, EndpointGroup)> {
    let service = slice.labels().get(SERVICE_NAME_LABEL)?;
    let key = format!("{}/{service}", slice.namespace().unwrap_or_default());
    let s: Slice = serde_json::from_value(slice.data.clone()).ok()?;
    if s.address_type != "IPv4" && s.address_type != "IPv6" {
        return None;
    }
    let addresses = s
        .endpoints
        .into_iter()
        .flatten()
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .filter_map(|e| e.addresses.first()?.parse().ok())
        .collect();
    let ports = s
        .ports
        .into_iter()
        .flatten()
        .filter_map(|p| {
            Some((
                p.name.unwrap_or_default(),
                u16::try_from(p.port?).ok()?,
                protocol_of(p.protocol.as_deref()),
            ))
        })
        .collect();
    Some((key, EndpointGroup { addresses, ports }))
}

/// A change to one endpoint object: its key (`namespace/name` of the object), its
/// service's, and its groups (none: it is gone).
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The endpoint object's `namespace/name`.
    pub object: String,
    /// Its service's `namespace/name`.
    pub service: String,
    /// Its groups; none once it is deleted.
    pub groups: Option<Vec<EndpointGroup>>,
}

/// Where the endpoints come from on this API server.
#[derive(Debug, Clone)]
pub enum Source {
    /// EndpointSlices at this group version.
    Slices(ApiResource),
    /// Endpoints: no version of EndpointSlices is served.
    Endpoints,
}

impl Source {
    /// What the API server serves: EndpointSlices `v1`, else `v1beta1`, else Endpoints.
    pub async fn discover(kube: &kube::Client) -> Source {
        if let Ok(group) = kube::discovery::group(kube, "discovery.k8s.io").await {
            for version in ["v1", "v1beta1"] {
                let found = group
                    .versioned_resources(version)
                    .into_iter()
                    .find(|(ar, _)| ar.kind == "EndpointSlice");
                if let Some((ar, _)) = found {
                    return Source::Slices(ar);
                }
            }
        }
        Source::Endpoints
    }

    /// What the log and the metrics call it.
    pub fn name(&self) -> String {
        match self {
            Source::Slices(ar) => format!("EndpointSlices {}", ar.api_version),
            Source::Endpoints => "Endpoints".into(),
        }
    }

    /// The watch of every endpoint object, as changes.
    pub fn watch(
        &self,
        kube: kube::Client,
    ) -> impl Stream<Item = Result<Event<Change>, watcher::Error>> + Send + 'static {
        match self {
            Source::Slices(ar) => {
                watcher::watcher(Api::<DynamicObject>::all_with(kube, ar), Default::default())
                    .map(|e| e.map(|e| convert(e, slice_change)))
                    .boxed()
            }
            Source::Endpoints => watcher::watcher(Api::<Endpoints>::all(kube), Default::default())
                .map(|e| e.map(|e| convert(e, endpoints_change)))
                .boxed(),
        }
    }
}

/// `namespace/name` of an object: how a service and its endpoint objects find each other.
pub(crate) fn object_key<K: kube::Resource>(object: &K) -> String {
    format!(
        "{}/{}",
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}

fn slice_change(slice: &DynamicObject, gone: bool) -> Change {
    let (service, groups) = match of_slice(slice) {
        Some((service, group)) => (service, vec![group]),
        // A slice of no service serves nothing: the same as none.
        None => (String::new(), Vec::new()),
    };
    Change {
        object: object_key(slice),
        service,
        groups: (!gone).then_some(groups),
    }
}

fn endpoints_change(ep: &Endpoints, gone: bool) -> Change {
    Change {
        object: object_key(ep),
        service: object_key(ep),
        groups: (!gone).then(|| of_endpoints(ep)),
    }
}

fn convert<K>(e: Event<K>, change: fn(&K, bool) -> Change) -> Event<Change> {
    match e {
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(change(&o, false)),
        Event::InitDone => Event::InitDone,
        Event::Apply(o) => Event::Apply(change(&o, false)),
        Event::Delete(o) => Event::Delete(change(&o, true)),
    }
}

/// Every endpoint object the watch brought, indexed by service: which services a change
/// touches, and each service's groups. Pure: the watcher feeds it the watch's events.
#[derive(Debug, Default)]
pub struct Index {
    /// Each object's service and groups, by the object's `namespace/name`.
    objects: HashMap<String, (String, Vec<EndpointGroup>)>,
    /// The objects of each service, by its `namespace/name`.
    of_service: HashMap<String, BTreeSet<String>>,
    /// A list in progress (between `Init` and `InitDone`).
    listing: Option<HashMap<String, (String, Vec<EndpointGroup>)>>,
    /// A whole list came in once.
    listed: bool,
}

impl Index {
    /// Takes one event of the watch; returns the services (`namespace/name`) whose
    /// members may have changed. The first whole list returns none: until then, no
    /// service's members are known, and the caller reconciles all of them.
    pub fn apply(&mut self, e: Event<Change>) -> BTreeSet<String> {
        match e {
            Event::Init => {
                self.listing = Some(HashMap::new());
                BTreeSet::new()
            }
            Event::InitApply(c) => {
                if let (Some(l), Some(groups)) = (&mut self.listing, c.groups) {
                    l.insert(c.object, (c.service, groups));
                }
                BTreeSet::new()
            }
            Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                let mut changed = BTreeSet::new();
                for (object, before) in &self.objects {
                    if listed.get(object) != Some(before) {
                        changed.insert(before.0.clone());
                    }
                }
                for (object, now) in &listed {
                    if self.objects.get(object) != Some(now) {
                        changed.insert(now.0.clone());
                    }
                }
                self.of_service.clear();
                for (object, (service, _)) in &listed {
                    self.of_service
                        .entry(service.clone())
                        .or_default()
                        .insert(object.clone());
                }
                self.objects = listed;
                if std::mem::replace(&mut self.listed, true) {
                    changed
                } else {
                    BTreeSet::new()
                }
            }
            Event::Apply(c) | Event::Delete(c) => self.change(c),
        }
    }

    fn change(&mut self, c: Change) -> BTreeSet<String> {
        let now = c.groups.map(|g| (c.service, g));
        let before = match &now {
            Some(n) => self.objects.insert(c.object.clone(), n.clone()),
            None => self.objects.remove(&c.object),
        };
        let mut changed = BTreeSet::new();
        if before == now {
            return changed;
        }
        if let Some((service, _)) = before {
            if let Some(objects) = self.of_service.get_mut(&service) {
                objects.remove(&c.object);
                if objects.is_empty() {
                    self.of_service.remove(&service);
                }
            }
            changed.insert(service);
        }
        if let Some((service, _)) = now {
            self.of_service
                .entry(service.clone())
                .or_default()
                .insert(c.object);
            changed.insert(service);
        }
        changed
    }

    /// A whole list came in once: services' members are known.
    pub fn listed(&self) -> bool {
        self.listed
    }

    /// The groups of the service `namespace/name`.
    pub fn groups_of<'a>(
        &'a self,
        service: &str,
    ) -> impl Iterator<Item = &'a EndpointGroup> + Clone + 'a {
        self.of_service
            .get(service)
            .into_iter()
            .flatten()
            .filter_map(|o| self.objects.get(o))
            .flat_map(|(_, g)| g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_slice_gives_its_ready_endpoints_and_ports_in_either_version() {
        for version in ["discovery.k8s.io/v1beta1", "discovery.k8s.io/v1"] {
            let slice: DynamicObject = serde_json::from_value(json!({
                "apiVersion": version, "kind": "EndpointSlice",
                "metadata": {"name": "web-abc", "namespace": "shop",
                    "labels": {"kubernetes.io/service-name": "web"}},
                "addressType": "IPv4",
                "endpoints": [
                    {"addresses": ["10.1.0.5"], "conditions": {"ready": true}},
                    {"addresses": ["10.1.0.6"], "conditions": {"ready": false}},
                    {"addresses": ["10.1.0.7"], "conditions": {}},
                    {"addresses": ["10.1.0.8"]},
                ],
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"},
                    {"port": 53, "protocol": "UDP"}],
            }))
            .unwrap();
            let (service, group) = of_slice(&slice).unwrap();
            assert_eq!(service, "shop/web");
            let ips: Vec<String> = group.addresses.iter().map(|a| a.to_string()).collect();
            assert_eq!(ips, ["10.1.0.5", "10.1.0.7", "10.1.0.8"]);
            assert_eq!(group.port("http", LbProtocol::Tcp), Some(8080));
            assert_eq!(group.port("", LbProtocol::Udp), Some(53));
            assert_eq!(group.port("http", LbProtocol::Udp), None);
        }
    }

    #[test]
    fn slices_of_no_service_or_of_names_serve_nothing() {
        let of = |labels: serde_json::Value, kind: &str| {
            let slice: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": "x", "namespace": "shop", "labels": labels},
                "addressType": kind, "endpoints": [{"addresses": ["example.org"]}],
            }))
            .unwrap();
            of_slice(&slice)
        };
        assert_eq!(of(json!({}), "IPv4"), None);
        assert_eq!(
            of(json!({"kubernetes.io/service-name": "web"}), "FQDN"),
            None
        );
    }

    #[test]
    fn endpoints_give_each_subsets_ready_addresses() {
        let ep: Endpoints = serde_json::from_value(json!({
            "metadata": {"name": "manual", "namespace": "x"},
            "subsets": [{"addresses": [{"ip": "10.1.0.5"}],
                "notReadyAddresses": [{"ip": "10.1.0.6"}],
                "ports": [{"name": "http", "port": 8080}]}],
        }))
        .unwrap();
        let groups = of_endpoints(&ep);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].addresses, ["10.1.0.5".parse::<IpAddr>().unwrap()]);
        assert_eq!(groups[0].port("http", LbProtocol::Tcp), Some(8080));
    }

    fn change(object: &str, service: &str, ips: &[&str]) -> Change {
        Change {
            object: object.into(),
            service: service.into(),
            groups: Some(vec![EndpointGroup {
                addresses: ips.iter().map(|ip| ip.parse().unwrap()).collect(),
                ports: vec![(String::new(), 80, LbProtocol::Tcp)],
            }]),
        }
    }

    fn ips(index: &Index, service: &str) -> Vec<String> {
        let mut out: Vec<String> = index
            .groups_of(service)
            .flat_map(|g| &g.addresses)
            .map(|a| a.to_string())
            .collect();
        out.sort();
        out
    }

    #[test]
    fn the_index_says_which_services_changed_and_keeps_their_groups() {
        let mut index = Index::default();
        // The first list: nothing reported (the caller reconciles every service).
        index.apply(Event::Init);
        index.apply(Event::InitApply(change("x/web-1", "x/web", &["10.1.0.5"])));
        index.apply(Event::InitApply(change("x/web-2", "x/web", &["10.1.0.6"])));
        assert!(!index.listed());
        assert!(index.apply(Event::InitDone).is_empty());
        assert!(index.listed());
        assert_eq!(ips(&index, "x/web"), ["10.1.0.5", "10.1.0.6"]);
        // A slice changes: its service; the same again: none.
        let moved = change("x/web-2", "x/web", &["10.1.0.7"]);
        assert_eq!(
            index.apply(Event::Apply(moved.clone())),
            BTreeSet::from(["x/web".into()])
        );
        assert!(index.apply(Event::Apply(moved)).is_empty());
        assert_eq!(ips(&index, "x/web"), ["10.1.0.5", "10.1.0.7"]);
        // A slice relabelled to another service: both.
        let relabelled = change("x/web-2", "x/api", &["10.1.0.7"]);
        assert_eq!(
            index.apply(Event::Apply(relabelled)),
            BTreeSet::from(["x/api".into(), "x/web".into()])
        );
        assert_eq!(ips(&index, "x/web"), ["10.1.0.5"]);
        // Deleted: its service, and no group left for it.
        let gone = Change {
            groups: None,
            ..change("x/web-2", "x/api", &[])
        };
        assert_eq!(
            index.apply(Event::Delete(gone)),
            BTreeSet::from(["x/api".into()])
        );
        assert!(ips(&index, "x/api").is_empty());
        // A relist that misses a slice (deleted while the watch was down) and changes
        // another reports both services; an unchanged one is left out.
        index.apply(Event::Apply(change("x/db-1", "x/db", &["10.1.0.9"])));
        index.apply(Event::Apply(change("x/cache-1", "x/cache", &["10.1.0.8"])));
        index.apply(Event::Init);
        index.apply(Event::InitApply(change("x/web-1", "x/web", &["10.1.0.4"])));
        index.apply(Event::InitApply(change(
            "x/cache-1",
            "x/cache",
            &["10.1.0.8"],
        )));
        assert_eq!(
            index.apply(Event::InitDone),
            BTreeSet::from(["x/db".into(), "x/web".into()])
        );
        assert_eq!(ips(&index, "x/web"), ["10.1.0.4"]);
        assert!(ips(&index, "x/db").is_empty());
    }
}
