//! The form a port takes in the view. A parsed `Port` is a dozen `String`s and two JSON
//! values, 608 bytes before its text: at 100,000 ports that was most of the controller's
//! memory. Here the IDs a port shares with other ports (its network, project, host,
//! subnets, groups) are shared `Arc<str>`s, short strings sit inline, and what most ports
//! leave at its default is kept apart only when set.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::{Arc, LazyLock};

use compact_str::CompactString;
use corvid_api::{FixedIp, Port, Status};
use serde::ser::{SerializeStruct, Serializer};
use serde::Serialize;
use serde_json::{json, Value};

/// A port as the view keeps it; `expand` gives the API's `Port` back, field for field.
#[derive(Debug, PartialEq)]
pub struct CompactPort {
    /// UUID (the view's table key, shared).
    pub id: Arc<str>,
    /// Free-form name.
    pub name: CompactString,
    /// The network the port is on.
    pub network_id: Arc<str>,
    /// Owning project.
    pub project_id: Arc<str>,
    /// MAC address.
    pub mac_address: CompactString,
    /// Administrative state.
    pub admin_state_up: bool,
    /// Operational status.
    pub status: Status,
    /// Anti-spoofing on or off.
    pub port_security_enabled: bool,
    /// What uses the port.
    pub device_id: CompactString,
    /// Who uses the port.
    pub device_owner: Arc<str>,
    /// The port's addresses.
    pub fixed_ips: Box<[CompactFixedIp]>,
    /// Host whose agent plugs the port.
    pub binding_host_id: Arc<str>,
    /// How the port is plugged.
    pub binding_vif_type: Arc<str>,
    /// Its security groups.
    pub security_groups: Box<[Arc<str>]>,
    /// Tags.
    pub tags: Box<[CompactString]>,
    /// RFC 3339 creation time.
    pub created_at: CompactString,
    /// RFC 3339 last update time.
    pub updated_at: CompactString,
    /// Bumped on every change.
    pub revision_number: u64,
    rest: Option<Box<Rest>>,
}

/// One address of a port, its subnet's ID shared.
#[derive(Debug, PartialEq)]
pub struct CompactFixedIp {
    /// The subnet the address is from.
    pub subnet_id: Arc<str>,
    /// The address.
    pub ip_address: IpAddr,
}

/// The attributes few ports set: `None` in a `CompactPort` stands for `Rest::common()`.
#[derive(Debug, PartialEq)]
struct Rest {
    /// `None` when it is the project's ID, as the controller writes it.
    tenant_id: Option<String>,
    binding_profile: Value,
    binding_vnic_type: String,
    binding_vif_details: Value,
    allowed_address_pairs: Vec<Value>,
    extra_dhcp_opts: Vec<Value>,
    ip_allocation: String,
    description: String,
    veth_name: Option<String>,
    network_ns: Option<String>,
    fast_path: Option<bool>,
}

impl Rest {
    fn common() -> Rest {
        Rest {
            tenant_id: None,
            binding_profile: json!({}),
            binding_vnic_type: "normal".into(),
            binding_vif_details: json!({}),
            allowed_address_pairs: Vec::new(),
            extra_dhcp_opts: Vec::new(),
            ip_allocation: "immediate".into(),
            description: String::new(),
            veth_name: None,
            network_ns: None,
            fast_path: None,
        }
    }
}

/// One copy of each string many ports share. A string no port holds any more is dropped
/// when the set has doubled since it was last swept, so churned hosts and networks do not
/// pile up.
#[derive(Debug, Default)]
pub struct Interner {
    set: HashSet<Arc<str>>,
    sweep_at: usize,
}

impl Interner {
    /// The shared copy of `s`.
    pub fn get(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.set.get(s) {
            return a.clone();
        }
        if self.set.len() >= self.sweep_at {
            self.set.retain(|a| Arc::strong_count(a) > 1);
            self.sweep_at = (self.set.len() * 2).max(1024);
        }
        let a: Arc<str> = s.into();
        self.set.insert(a.clone());
        a
    }

    /// How many strings it holds.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// True when it holds none.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

impl CompactPort {
    /// `p` made compact, its shared strings from `strings` and its ID `id` (the table's key).
    pub fn new(p: Port, id: Arc<str>, strings: &mut Interner) -> CompactPort {
        let rest = Rest {
            tenant_id: (p.tenant_id != p.project_id).then_some(p.tenant_id),
            binding_profile: p.binding_profile,
            binding_vnic_type: p.binding_vnic_type,
            binding_vif_details: p.binding_vif_details,
            allowed_address_pairs: p.allowed_address_pairs,
            extra_dhcp_opts: p.extra_dhcp_opts,
            ip_allocation: p.ip_allocation,
            description: p.description,
            veth_name: p.veth_name,
            network_ns: p.network_ns,
            fast_path: p.fast_path,
        };
        CompactPort {
            id,
            name: p.name.into(),
            network_id: strings.get(&p.network_id),
            project_id: strings.get(&p.project_id),
            mac_address: p.mac_address.into(),
            admin_state_up: p.admin_state_up,
            status: p.status,
            port_security_enabled: p.port_security_enabled,
            device_id: p.device_id.into(),
            device_owner: strings.get(&p.device_owner),
            fixed_ips: p
                .fixed_ips
                .into_iter()
                .map(|f| CompactFixedIp {
                    subnet_id: strings.get(&f.subnet_id),
                    ip_address: f.ip_address,
                })
                .collect(),
            binding_host_id: strings.get(&p.binding_host_id),
            binding_vif_type: strings.get(&p.binding_vif_type),
            security_groups: p.security_groups.iter().map(|g| strings.get(g)).collect(),
            tags: p.tags.into_iter().map(CompactString::from).collect(),
            created_at: p.created_at.into(),
            updated_at: p.updated_at.into(),
            revision_number: p.revision_number,
            rest: (rest != *COMMON).then(|| Box::new(rest)),
        }
    }

    fn rest(&self) -> &Rest {
        self.rest.as_deref().unwrap_or(&COMMON)
    }

    /// The port as the API shows it.
    pub fn expand(&self) -> Port {
        let rest = self.rest();
        Port {
            id: self.id.to_string(),
            name: self.name.to_string(),
            network_id: self.network_id.to_string(),
            tenant_id: rest
                .tenant_id
                .clone()
                .unwrap_or_else(|| self.project_id.to_string()),
            project_id: self.project_id.to_string(),
            mac_address: self.mac_address.to_string(),
            admin_state_up: self.admin_state_up,
            status: self.status,
            device_id: self.device_id.to_string(),
            device_owner: self.device_owner.to_string(),
            fixed_ips: self
                .fixed_ips
                .iter()
                .map(|f| FixedIp {
                    subnet_id: f.subnet_id.to_string(),
                    ip_address: f.ip_address,
                })
                .collect(),
            binding_host_id: self.binding_host_id.to_string(),
            binding_profile: rest.binding_profile.clone(),
            binding_vnic_type: rest.binding_vnic_type.clone(),
            binding_vif_type: self.binding_vif_type.to_string(),
            binding_vif_details: rest.binding_vif_details.clone(),
            port_security_enabled: self.port_security_enabled,
            security_groups: self.security_groups.iter().map(|g| g.to_string()).collect(),
            allowed_address_pairs: rest.allowed_address_pairs.clone(),
            extra_dhcp_opts: rest.extra_dhcp_opts.clone(),
            ip_allocation: rest.ip_allocation.clone(),
            description: rest.description.clone(),
            veth_name: rest.veth_name.clone(),
            network_ns: rest.network_ns.clone(),
            fast_path: rest.fast_path,
            tags: self.tags.iter().map(|t| t.to_string()).collect(),
            created_at: self.created_at.to_string(),
            updated_at: self.updated_at.to_string(),
            revision_number: self.revision_number,
        }
    }
}

/// What a port without a `Rest` of its own has.
static COMMON: LazyLock<Rest> = LazyLock::new(Rest::common);

/// A port's addresses as `Port` writes them.
struct FixedIps<'a>(&'a [CompactFixedIp]);

impl Serialize for FixedIps<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|f| FixedIp {
            subnet_id: f.subnet_id.to_string(),
            ip_address: f.ip_address,
        }))
    }
}

/// Written as the `Port` it expands to, field for field and in its order, without making
/// one: a list of 100,000 ports writes them all.
impl Serialize for CompactPort {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let rest = self.rest();
        let set = usize::from(rest.veth_name.is_some())
            + usize::from(rest.network_ns.is_some())
            + usize::from(rest.fast_path.is_some());
        let mut p = s.serialize_struct("Port", 26 + set)?;
        p.serialize_field("id", &*self.id)?;
        p.serialize_field("name", self.name.as_str())?;
        p.serialize_field("network_id", &*self.network_id)?;
        let tenant = rest.tenant_id.as_deref().unwrap_or(&self.project_id);
        p.serialize_field("tenant_id", tenant)?;
        p.serialize_field("project_id", &*self.project_id)?;
        p.serialize_field("mac_address", self.mac_address.as_str())?;
        p.serialize_field("admin_state_up", &self.admin_state_up)?;
        p.serialize_field("status", &self.status)?;
        p.serialize_field("device_id", self.device_id.as_str())?;
        p.serialize_field("device_owner", &*self.device_owner)?;
        p.serialize_field("fixed_ips", &FixedIps(&self.fixed_ips))?;
        p.serialize_field("binding:host_id", &*self.binding_host_id)?;
        p.serialize_field("binding:profile", &rest.binding_profile)?;
        p.serialize_field("binding:vnic_type", &rest.binding_vnic_type)?;
        p.serialize_field("binding:vif_type", &*self.binding_vif_type)?;
        p.serialize_field("binding:vif_details", &rest.binding_vif_details)?;
        p.serialize_field("port_security_enabled", &self.port_security_enabled)?;
        let groups: Vec<&str> = self.security_groups.iter().map(|g| &**g).collect();
        p.serialize_field("security_groups", &groups)?;
        p.serialize_field("allowed_address_pairs", &rest.allowed_address_pairs)?;
        p.serialize_field("extra_dhcp_opts", &rest.extra_dhcp_opts)?;
        p.serialize_field("ip_allocation", &rest.ip_allocation)?;
        p.serialize_field("description", &rest.description)?;
        for (name, v) in [
            ("veth_name", &rest.veth_name),
            ("network_ns", &rest.network_ns),
        ] {
            if let Some(v) = v {
                p.serialize_field(name, v)?;
            }
        }
        if let Some(f) = &rest.fast_path {
            p.serialize_field("fast_path", f)?;
        }
        let tags: Vec<&str> = self.tags.iter().map(|t| t.as_str()).collect();
        p.serialize_field("tags", &tags)?;
        p.serialize_field("created_at", self.created_at.as_str())?;
        p.serialize_field("updated_at", self.updated_at.as_str())?;
        p.serialize_field("revision_number", &self.revision_number)?;
        p.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(extra: Value) -> Port {
        let mut p = json!({
            "id": "90000000-0000-4000-8000-000000000001", "name": "shop/web-0",
            "network_id": "5e1f0000-0000-4000-8000-000000000001",
            "tenant_id": "c0ffee", "project_id": "c0ffee",
            "mac_address": "fa:16:3e:00:00:01", "admin_state_up": true, "status": "ACTIVE",
            "device_id": "3b1c7a8e-62f4-4b5e-9a0d-5d2f8c9e1a77", "device_owner": "compute:kuryr",
            "fixed_ips": [{"subnet_id": "5b00", "ip_address": "10.0.0.2"},
                          {"subnet_id": "5b06", "ip_address": "fd00::2"}],
            "binding:host_id": "node-1", "binding:profile": {}, "binding:vnic_type": "normal",
            "binding:vif_type": "veth", "binding:vif_details": {},
            "port_security_enabled": true, "security_groups": ["5ec0"],
            "allowed_address_pairs": [], "extra_dhcp_opts": [], "ip_allocation": "immediate",
            "description": "", "tags": ["k8s-namespace=shop"],
            "created_at": "2026-11-29T18:00:00Z", "updated_at": "2026-11-29T18:00:01Z",
            "revision_number": 2
        });
        for (k, v) in extra.as_object().unwrap() {
            p[k] = v.clone();
        }
        serde_json::from_value(p).unwrap()
    }

    #[test]
    fn a_port_expands_to_what_went_in() {
        let mut strings = Interner::default();
        let unusual = json!({
            "tenant_id": "other", "binding:profile": {"a": 1}, "binding:vnic_type": "direct",
            "binding:vif_details": {"port_filter": true},
            "allowed_address_pairs": [{"ip_address": "10.0.0.9", "mac_address": "fa:16:3e:00:00:01"}],
            "extra_dhcp_opts": [{"opt_name": "mtu", "opt_value": "1400"}],
            "ip_allocation": "deferred", "description": "d", "veth_name": "eth1",
            "network_ns": "/run/netns/x", "fast_path": true,
            "name": "a name longer than twenty-four bytes, kept on the heap"
        });
        for p in [port(json!({})), port(unusual)] {
            let c = CompactPort::new(p.clone(), p.id.as_str().into(), &mut strings);
            assert_eq!(c.expand(), p);
            let written = serde_json::to_string(&c).unwrap();
            assert_eq!(written, serde_json::to_string(&p).unwrap());
        }
    }

    #[test]
    fn common_ports_keep_nothing_apart_and_share_their_ids() {
        let mut strings = Interner::default();
        let p = port(json!({}));
        let a = CompactPort::new(p.clone(), "a".into(), &mut strings);
        let b = CompactPort::new(p, "b".into(), &mut strings);
        assert!(a.rest.is_none());
        assert!(Arc::ptr_eq(&a.network_id, &b.network_id));
        assert!(Arc::ptr_eq(
            &a.fixed_ips[1].subnet_id,
            &b.fixed_ips[1].subnet_id
        ));
        assert!(!a.mac_address.is_heap_allocated() && !a.created_at.is_heap_allocated());
    }

    #[test]
    fn strings_no_port_holds_are_swept() {
        let mut strings = Interner::default();
        let kept = strings.get("kept");
        for n in 0..5000 {
            strings.get(&format!("host-{n}"));
        }
        assert!(strings.len() < 2100, "{} strings held", strings.len());
        assert!(Arc::ptr_eq(&kept, &strings.get("kept")));
    }
}
