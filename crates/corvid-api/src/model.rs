//! Resources as the controller stores and serves them, field for field in Neutron's v2.0
//! shape (Neutron's API reference), plus the watch feed.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What every resource kind has in common: where it lives in the API and how it is named.
pub trait Resource:
    Serialize + serde::de::DeserializeOwned + Clone + Send + Sync + 'static
{
    /// The JSON key of one object (`"port"`).
    const SINGULAR: &'static str;
    /// The JSON key of a list (`"ports"`), and the name of the collection in the store
    /// and in the watch feed.
    const PLURAL: &'static str;
    /// The collection's path segment: the JSON key, but where Neutron spells it with
    /// dashes (`"security-groups"`).
    const COLLECTION: &'static str = Self::PLURAL;
    /// The path prefix the collection lives under (`"/v2.0"`).
    const PREFIX: &'static str = "/v2.0";
    /// The resource's UUID.
    fn id(&self) -> &str;
}

/// How an IPv6 subnet's hosts get their addresses, as Neutron names the modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ipv6Mode {
    /// Stateless autoconfiguration: the prefix and the interface's EUI-64.
    Slaac,
    /// DHCPv6 assigns the address.
    #[serde(rename = "dhcpv6-stateful")]
    Dhcpv6Stateful,
    /// SLAAC's address; DHCPv6 for the other options.
    #[serde(rename = "dhcpv6-stateless")]
    Dhcpv6Stateless,
}

impl Ipv6Mode {
    /// Whether an address in this mode is computed from the MAC rather than allocated.
    pub fn is_auto_address(self) -> bool {
        matches!(self, Ipv6Mode::Slaac | Ipv6Mode::Dhcpv6Stateless)
    }
}

/// The operational status of a network, port or floating IP, as Neutron names it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    /// Working: a port plugged and checked by its host's agent. The Mizar-MP routes call
    /// it `UP`, which reads back as this.
    #[serde(alias = "UP")]
    Active,
    /// Not (yet) working: a port nobody has plugged.
    #[default]
    Down,
    /// Being set up.
    Build,
    /// Failed: the agent could not plug the port.
    Error,
}

impl Status {
    /// Every status, in the order the API documents them.
    pub const ALL: [Status; 4] = [Status::Active, Status::Down, Status::Build, Status::Error];

    /// The names of every status, as the API spells them.
    pub fn names() -> [&'static str; 4] {
        Status::ALL.map(Status::as_str)
    }

    /// The name the API uses (`ACTIVE`).
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Active => "ACTIVE",
            Status::Down => "DOWN",
            Status::Build => "BUILD",
            Status::Error => "ERROR",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A layer-2 network: the thing ports attach to and subnets are carved on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Network {
    /// UUID.
    pub id: String,
    /// Free-form name.
    pub name: String,
    /// Owning project (Neutron's older name).
    pub tenant_id: String,
    /// Owning project.
    pub project_id: String,
    /// Administrative state.
    pub admin_state_up: bool,
    /// MTU of the network's datapath.
    pub mtu: u32,
    /// Always ACTIVE: corvid networks have no provisioning step.
    pub status: Status,
    /// IDs of the subnets on this network, in creation order.
    pub subnets: Vec<String>,
    /// Visible to other projects.
    pub shared: bool,
    /// Whether floating IPs can be allocated from this network.
    #[serde(rename = "router:external")]
    pub router_external: bool,
    /// Default port security for new ports.
    pub port_security_enabled: bool,
    /// Free-form description.
    pub description: String,
    /// Tags (Kuryr keeps Docker IDs here).
    pub tags: Vec<String>,
    /// RFC 3339 creation time.
    pub created_at: String,
    /// RFC 3339 last update time.
    pub updated_at: String,
    /// Bumped on every change; `If-Match: revision_number=N` guards updates.
    pub revision_number: u64,
    /// How the network crosses hosts: always `vxlan`.
    #[serde(rename = "provider:network_type", default = "vxlan")]
    pub network_type: String,
    /// The VXLAN network identifier the controller allocated (1 to 16777215).
    #[serde(rename = "provider:segmentation_id", default)]
    pub segmentation_id: u32,
    /// Agents masquerade traffic that leaves the network's subnets from their host.
    #[serde(rename = "corvid:masquerade", default)]
    pub masquerade: bool,
}

fn vxlan() -> String {
    "vxlan".into()
}

impl Resource for Network {
    const SINGULAR: &'static str = "network";
    const PLURAL: &'static str = "networks";
    fn id(&self) -> &str {
        &self.id
    }
}

/// An inclusive range of addresses a subnet hands out.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AllocationPool {
    /// First address.
    pub start: IpAddr,
    /// Last address.
    pub end: IpAddr,
}

/// A route pushed to ports of a subnet.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HostRoute {
    /// Destination CIDR.
    pub destination: IpNet,
    /// Next hop.
    pub nexthop: IpAddr,
}

/// An IP range on a network from which ports get addresses.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Subnet {
    /// UUID.
    pub id: String,
    /// Free-form name.
    pub name: String,
    /// Owning project (older name).
    pub tenant_id: String,
    /// Owning project.
    pub project_id: String,
    /// The network this subnet is on.
    pub network_id: String,
    /// 4 or 6.
    pub ip_version: u8,
    /// The subnetpool it was carved from, if any.
    pub subnetpool_id: Option<String>,
    /// Kept for Neutron clients; corvid runs no DHCP server.
    pub enable_dhcp: bool,
    /// How IPv6 router advertisements on the subnet say hosts get addresses.
    pub ipv6_ra_mode: Option<Ipv6Mode>,
    /// How ports get their IPv6 address on the subnet: SLAAC's and stateless DHCPv6's
    /// are computed from the port's MAC (EUI-64), as Neutron does.
    pub ipv6_address_mode: Option<Ipv6Mode>,
    /// Gateway address, or none.
    pub gateway_ip: Option<IpAddr>,
    /// The subnet's prefix.
    pub cidr: IpNet,
    /// Ranges addresses are allocated from.
    pub allocation_pools: Vec<AllocationPool>,
    /// Extra routes for ports.
    pub host_routes: Vec<HostRoute>,
    /// DNS servers for ports.
    pub dns_nameservers: Vec<String>,
    /// Free-form description.
    pub description: String,
    /// Kept for Neutron clients.
    pub service_types: Vec<String>,
    /// Tags.
    pub tags: Vec<String>,
    /// RFC 3339 creation time.
    pub created_at: String,
    /// RFC 3339 last update time.
    pub updated_at: String,
    /// Bumped on every change.
    pub revision_number: u64,
}

impl Resource for Subnet {
    const SINGULAR: &'static str = "subnet";
    const PLURAL: &'static str = "subnets";
    fn id(&self) -> &str {
        &self.id
    }
}

/// A set of prefixes that subnets can be carved from by prefix length.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SubnetPool {
    /// UUID.
    pub id: String,
    /// Free-form name.
    pub name: String,
    /// Owning project (older name).
    pub tenant_id: String,
    /// Owning project.
    pub project_id: String,
    /// Prefixes subnets are carved from.
    pub prefixes: Vec<IpNet>,
    /// Prefix length of a subnet requested without one (Neutron sends it as a string).
    #[serde(with = "number_as_string")]
    pub default_prefixlen: u8,
    /// Shortest prefix a subnet may have.
    #[serde(with = "number_as_string")]
    pub min_prefixlen: u8,
    /// Longest prefix a subnet may have.
    #[serde(with = "number_as_string")]
    pub max_prefixlen: u8,
    /// 4 or 6, from the prefixes.
    pub ip_version: u8,
    /// The project's default pool.
    pub is_default: bool,
    /// Visible to other projects.
    pub shared: bool,
    /// Free-form description.
    pub description: String,
    /// Tags.
    pub tags: Vec<String>,
    /// RFC 3339 creation time.
    pub created_at: String,
    /// RFC 3339 last update time.
    pub updated_at: String,
    /// Bumped on every change.
    pub revision_number: u64,
}

impl Resource for SubnetPool {
    const SINGULAR: &'static str = "subnetpool";
    const PLURAL: &'static str = "subnetpools";
    fn id(&self) -> &str {
        &self.id
    }
}

/// One address of a port.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FixedIp {
    /// The subnet the address is from.
    pub subnet_id: String,
    /// The address.
    pub ip_address: IpAddr,
}

/// A network attachment: MAC, addresses, and where it is bound.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Port {
    /// UUID.
    pub id: String,
    /// Free-form name.
    pub name: String,
    /// The network the port is on.
    pub network_id: String,
    /// Owning project (older name).
    pub tenant_id: String,
    /// Owning project.
    pub project_id: String,
    /// Generated (fa:16:3e:..) or given MAC address, unique in the controller.
    pub mac_address: String,
    /// Administrative state.
    pub admin_state_up: bool,
    /// DOWN when created; the agent that plugs it reports ACTIVE.
    pub status: Status,
    /// What uses the port (container or pod ID).
    pub device_id: String,
    /// Who uses the port (`kuryr:container`, `compute:kuryr`, ...).
    pub device_owner: String,
    /// The port's addresses.
    pub fixed_ips: Vec<FixedIp>,
    /// Host whose agent plugs the port.
    #[serde(rename = "binding:host_id")]
    pub binding_host_id: String,
    /// Free-form binding details.
    #[serde(rename = "binding:profile")]
    pub binding_profile: Value,
    /// normal, macvtap, direct, baremetal, smart-nic.
    #[serde(rename = "binding:vnic_type")]
    pub binding_vnic_type: String,
    /// How the port is plugged: `unbound` until a host is set, then `veth`.
    #[serde(rename = "binding:vif_type")]
    pub binding_vif_type: String,
    /// Details of the plug.
    #[serde(rename = "binding:vif_details")]
    pub binding_vif_details: Value,
    /// Anti-spoofing on or off.
    pub port_security_enabled: bool,
    /// Its security groups: none when port security is off or the port is the network's
    /// own (`network:*`), the project's default group when a create names none.
    pub security_groups: Vec<String>,
    /// Other addresses it may send from, each `{"ip_address", "mac_address"}` (an address
    /// or a prefix, and the port's MAC when none was given).
    pub allowed_address_pairs: Vec<Value>,
    /// Kept for Neutron clients.
    pub extra_dhcp_opts: Vec<Value>,
    /// Always `immediate`.
    pub ip_allocation: String,
    /// Free-form description.
    pub description: String,
    /// Interface name inside the namespace (Mizar-MP agreement).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub veth_name: Option<String>,
    /// Network namespace path to plug into (Mizar-MP agreement; `veth_namespace` on input too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_ns: Option<String>,
    /// Mizar-MP's fast-path flag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fast_path: Option<bool>,
    /// Tags.
    pub tags: Vec<String>,
    /// RFC 3339 creation time.
    pub created_at: String,
    /// RFC 3339 last update time.
    pub updated_at: String,
    /// Bumped on every change.
    pub revision_number: u64,
}

impl Port {
    /// Its allowed address pairs: each prefix with its MAC (the port's own when the pair
    /// names none); a pair that does not parse is left out.
    pub fn address_pairs(&self) -> Vec<(&str, IpNet)> {
        self.allowed_address_pairs
            .iter()
            .filter_map(|pair| {
                let ip = pair.get("ip_address")?.as_str()?;
                let net = ip
                    .parse::<IpNet>()
                    .ok()
                    .or_else(|| ip.parse::<IpAddr>().ok().map(IpNet::from))?;
                let mac = pair
                    .get("mac_address")
                    .and_then(Value::as_str)
                    .unwrap_or(&self.mac_address);
                Some((mac, net))
            })
            .collect()
    }
}

impl Resource for Port {
    const SINGULAR: &'static str = "port";
    const PLURAL: &'static str = "ports";
    fn id(&self) -> &str {
        &self.id
    }
}

/// The port summary a floating IP shows.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PortDetails {
    /// Port name.
    pub name: String,
    /// Port network.
    pub network_id: String,
    /// Port MAC.
    pub mac_address: String,
    /// Port administrative state.
    pub admin_state_up: bool,
    /// Port status.
    pub status: Status,
    /// Port device.
    pub device_id: String,
    /// Port owner.
    pub device_owner: String,
}

/// An address on an external network mapped to a port's fixed address.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FloatingIp {
    /// UUID.
    pub id: String,
    /// Owning project (older name).
    pub tenant_id: String,
    /// Owning project.
    pub project_id: String,
    /// The public address.
    pub floating_ip_address: IpAddr,
    /// The external network it is allocated on.
    pub floating_network_id: String,
    /// The router it is reached through, once associated.
    pub router_id: Option<String>,
    /// The port it maps to, if associated.
    pub port_id: Option<String>,
    /// The port address it maps to, if associated.
    pub fixed_ip_address: Option<IpAddr>,
    /// DOWN until an agent programs it.
    pub status: Status,
    /// Free-form description.
    pub description: String,
    /// Summary of the associated port.
    pub port_details: Option<PortDetails>,
    /// Tags.
    pub tags: Vec<String>,
    /// RFC 3339 creation time.
    pub created_at: String,
    /// RFC 3339 last update time.
    pub updated_at: String,
    /// Bumped on every change.
    pub revision_number: u64,
}

impl Resource for FloatingIp {
    const SINGULAR: &'static str = "floatingip";
    const PLURAL: &'static str = "floatingips";
    fn id(&self) -> &str {
        &self.id
    }
}

/// The `device_owner` of the port a router has on each subnet it routes, holding the
/// subnet's gateway address.
pub const ROUTER_INTERFACE: &str = "network:router_interface";
/// The `device_owner` of a router's port on its external network.
pub const ROUTER_GATEWAY: &str = "network:router_gateway";

/// Where a router leaves for the outside: a port on an external network.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExternalGatewayInfo {
    /// The external network (`router:external`).
    pub network_id: String,
    /// Traffic leaving through it takes the gateway's address.
    #[serde(default = "yes")]
    pub enable_snat: bool,
    /// The gateway port's addresses.
    #[serde(default)]
    pub external_fixed_ips: Vec<FixedIp>,
}

/// A router between subnets, routed on every host that has a port on one of them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Router {
    /// UUID.
    pub id: String,
    /// Free-form name.
    pub name: String,
    /// Owning project (older name).
    pub tenant_id: String,
    /// Owning project.
    pub project_id: String,
    /// Administrative state.
    pub admin_state_up: bool,
    /// Always ACTIVE: the hosts route, there is no router to provision.
    pub status: Status,
    /// Its way out, if it has one.
    pub external_gateway_info: Option<ExternalGatewayInfo>,
    /// Extra routes: a destination and a next hop on one of its subnets.
    pub routes: Vec<HostRoute>,
    /// Free-form description.
    pub description: String,
    /// Always true: every host routes (Neutron's DVR).
    pub distributed: bool,
    /// Always false: there is no router host to fail over.
    pub ha: bool,
    /// Tags.
    pub tags: Vec<String>,
    /// RFC 3339 creation time.
    pub created_at: String,
    /// RFC 3339 last update time.
    pub updated_at: String,
    /// Bumped on every change, an interface added or removed included.
    pub revision_number: u64,
}

impl Resource for Router {
    const SINGULAR: &'static str = "router";
    const PLURAL: &'static str = "routers";
    fn id(&self) -> &str {
        &self.id
    }
}

/// Which traffic a security group rule lets through: what reaches the port, or what
/// leaves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// To the port.
    Ingress,
    /// From the port.
    Egress,
}

/// The IP version a security group rule matches, as Neutron spells it.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub enum Ethertype {
    /// IPv4 (the default).
    #[default]
    #[serde(rename = "IPv4")]
    Ipv4,
    /// IPv6.
    #[serde(rename = "IPv6")]
    Ipv6,
}

impl Ethertype {
    /// The name the API uses (`IPv4`).
    pub fn as_str(self) -> &'static str {
        match self {
            Ethertype::Ipv4 => "IPv4",
            Ethertype::Ipv6 => "IPv6",
        }
    }

    /// The version of `addr`.
    pub fn of(addr: IpAddr) -> Ethertype {
        if addr.is_ipv4() {
            Ethertype::Ipv4
        } else {
            Ethertype::Ipv6
        }
    }
}

impl std::fmt::Display for Ethertype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A named set of rules for what may reach and leave the ports that have it; traffic no
/// rule allows is dropped.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SecurityGroup {
    /// UUID; the project's `default` group has one derived from the project.
    pub id: String,
    /// Free-form name; `default` only for the group every project gets.
    pub name: String,
    /// Free-form description.
    pub description: String,
    /// Owning project (older name).
    pub tenant_id: String,
    /// Owning project.
    pub project_id: String,
    /// Connection tracking: replies to allowed traffic are allowed too (default true).
    pub stateful: bool,
    /// Its rules. The store keeps each rule under its own key; the API shows them here.
    #[serde(default)]
    pub security_group_rules: Vec<SecurityGroupRule>,
    /// Tags.
    pub tags: Vec<String>,
    /// RFC 3339 creation time.
    pub created_at: String,
    /// RFC 3339 last update time.
    pub updated_at: String,
    /// Bumped on every change, a rule added or removed included.
    pub revision_number: u64,
}

impl Resource for SecurityGroup {
    const SINGULAR: &'static str = "security_group";
    const PLURAL: &'static str = "security_groups";
    const COLLECTION: &'static str = "security-groups";
    fn id(&self) -> &str {
        &self.id
    }
}

/// One rule of a security group: traffic of a direction, version, protocol and ports,
/// from or to a prefix or the ports of a group.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SecurityGroupRule {
    /// UUID.
    pub id: String,
    /// Its group.
    pub security_group_id: String,
    /// To the port or from it.
    pub direction: Direction,
    /// IPv4 or IPv6.
    pub ethertype: Ethertype,
    /// An IP protocol name (`tcp`) or number (`6`); `None` for any.
    pub protocol: Option<String>,
    /// First port of the range (TCP, UDP, SCTP, DCCP, UDP-Lite), or the ICMP type.
    pub port_range_min: Option<u16>,
    /// Last port of the range, or the ICMP code.
    pub port_range_max: Option<u16>,
    /// The remote addresses, as given (`10.0.0.5/24` stays so); `None` for any.
    pub remote_ip_prefix: Option<IpNet>,
    /// `remote_ip_prefix` without host bits (`10.0.0.0/24`): what to match.
    pub normalized_cidr: Option<IpNet>,
    /// The remote addresses are those of this group's ports.
    pub remote_group_id: Option<String>,
    /// Free-form description.
    pub description: String,
    /// Owning project (older name).
    pub tenant_id: String,
    /// Owning project.
    pub project_id: String,
    /// RFC 3339 creation time.
    pub created_at: String,
    /// RFC 3339 last update time.
    pub updated_at: String,
    /// Revision of the rule itself (rules do not change once made).
    pub revision_number: u64,
}

impl Resource for SecurityGroupRule {
    const SINGULAR: &'static str = "security_group_rule";
    const PLURAL: &'static str = "security_group_rules";
    const COLLECTION: &'static str = "security-group-rules";
    fn id(&self) -> &str {
        &self.id
    }
}

/// What `add_router_interface` and `remove_router_interface` answer: the interface port.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RouterInterfaceInfo {
    /// The router.
    pub id: String,
    /// The interface's port.
    pub port_id: String,
    /// The port's network.
    pub network_id: String,
    /// The port's first subnet.
    pub subnet_id: Option<String>,
    /// Every subnet the port has an address on.
    pub subnet_ids: Vec<String>,
}

/// A host running an agent: where its overlay tunnels end.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Host {
    /// The host ID ports name in `binding:host_id`.
    pub id: String,
    /// The address other hosts send VXLAN traffic to.
    pub underlay_ip: IpAddr,
    /// Free-form description.
    #[serde(default)]
    pub description: String,
    /// Tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// RFC 3339 creation time.
    pub created_at: String,
    /// RFC 3339 last update time.
    pub updated_at: String,
    /// Bumped on every change.
    pub revision_number: u64,
}

impl Resource for Host {
    const SINGULAR: &'static str = "host";
    const PLURAL: &'static str = "hosts";
    fn id(&self) -> &str {
        &self.id
    }
}

/// A load balancer's listener or pool protocol, as Octavia names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum LbProtocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
    /// Anything else (HTTP, HTTPS, ...): corvid balances connections, not requests.
    #[serde(other)]
    Other,
}

/// An Octavia load balancer: a VIP, served on every host.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LoadBalancer {
    /// UUID.
    pub id: String,
    /// Name.
    #[serde(default)]
    pub name: String,
    /// The VIP.
    pub vip_address: Option<IpAddr>,
    /// The port that holds the VIP.
    pub vip_port_id: Option<String>,
    /// False: served as if it had no members.
    #[serde(default = "yes")]
    pub admin_state_up: bool,
    /// Tags.
    #[serde(default)]
    pub tags: Vec<String>,
}

/// The tag of a listener whose port every host also forwards from its own addresses
/// (`node-port:30061`, a Kubernetes NodePort), corvid's addition to Octavia.
pub const NODE_PORT_TAG: &str = "node-port:";

/// A port a load balancer listens on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Listener {
    /// UUID.
    pub id: String,
    /// Its load balancer.
    pub loadbalancer_id: String,
    /// TCP, UDP or SCTP.
    pub protocol: LbProtocol,
    /// The port on the VIP.
    pub protocol_port: u16,
    /// The pool it sends connections to.
    pub default_pool_id: Option<String>,
    /// False: not served.
    #[serde(default = "yes")]
    pub admin_state_up: bool,
    /// Tags.
    #[serde(default)]
    pub tags: Vec<String>,
}

/// How a pool keeps a client with one member.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SessionPersistence {
    /// `SOURCE_IP` is what corvid does; cookies need a proxy.
    #[serde(rename = "type")]
    pub kind: String,
    /// Seconds a client stays with its member after its last connection.
    pub persistence_timeout: Option<u64>,
}

/// A group of members a listener spreads connections over.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Pool {
    /// UUID.
    pub id: String,
    /// Its listener, if made with one.
    pub listener_id: Option<String>,
    /// Its load balancer, if made with one.
    pub loadbalancer_id: Option<String>,
    /// `ROUND_ROBIN`, `LEAST_CONNECTIONS`, `SOURCE_IP`: corvid picks at random, by client
    /// with `SOURCE_IP` or session persistence.
    pub lb_algorithm: String,
    /// Client affinity.
    pub session_persistence: Option<SessionPersistence>,
    /// False: served as if it had no members.
    #[serde(default = "yes")]
    pub admin_state_up: bool,
}

/// An address and port a pool sends connections to.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Member {
    /// UUID.
    pub id: String,
    /// Its pool.
    pub pool_id: String,
    /// Where connections go.
    pub address: IpAddr,
    /// The port they go to.
    pub protocol_port: u16,
    /// False: not chosen.
    #[serde(default = "yes")]
    pub admin_state_up: bool,
    /// A backup member is chosen only when no other is: corvid does not choose it.
    #[serde(default)]
    pub backup: bool,
    /// Tags.
    #[serde(default)]
    pub tags: Vec<String>,
}

fn yes() -> bool {
    true
}

macro_rules! octavia {
    ($t:ty, $one:literal, $many:literal) => {
        impl Resource for $t {
            const SINGULAR: &'static str = $one;
            const PLURAL: &'static str = $many;
            const PREFIX: &'static str = "/v2/lbaas";
            fn id(&self) -> &str {
                &self.id
            }
        }
    };
}
octavia!(LoadBalancer, "loadbalancer", "loadbalancers");
octavia!(Listener, "listener", "listeners");
octavia!(Pool, "pool", "pools");
octavia!(Member, "member", "members");

/// What a change in the watch feed did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    /// Created or updated.
    Put,
    /// Deleted.
    Delete,
}

/// One change in the watch feed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WatchEvent {
    /// Store revision of the change; the feed is ordered by it.
    pub revision: i64,
    /// Created or updated, or deleted.
    #[serde(rename = "type")]
    pub kind: EventKind,
    /// Collection name (`ports`, `networks`, `loadbalancers`, ...).
    pub resource: String,
    /// The resource's ID.
    pub id: String,
    /// The object after a put, the last state before a delete.
    pub object: Value,
}

impl WatchEvent {
    /// The object, read as the resource it is.
    pub fn decode<R: Resource>(&self) -> Result<R, serde_json::Error> {
        R::deserialize(&self.object)
    }
}

/// A page of the watch feed: events after the asked revision, and where to resume.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WatchPage {
    /// Ask again with `since=<revision>` to get the next changes.
    pub revision: i64,
    /// The changes, oldest first.
    pub events: Vec<WatchEvent>,
}

/// Neutron sends some integers as JSON strings ("24"); accept either, send strings.
mod number_as_string {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(n: &u8, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&n.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u8, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            N(u8),
            S(String),
        }
        match Either::deserialize(d)? {
            Either::N(n) => Ok(n),
            Either::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}
