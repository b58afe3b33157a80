//! What a client sends to make or change a resource, one type per request, attribute for
//! attribute as the controller's attribute description accepts it (a controller test holds
//! the two equal). An absent field is not sent, so the controller's default applies; a
//! field that is `Option<Option<_>>` sends `null` as `Some(None)`, which clears it.
//!
//! Raw JSON stays a body of every request, for tools and tests that send what they like.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_with::skip_serializing_none;

use crate::model::{
    AllocationPool, Direction, Ethertype, FloatingIp, Host, HostRoute, LbProtocol, Listener,
    LoadBalancer, Member, Network, Pool, Port, Resource, Router, SecurityGroup, SecurityGroupRule,
    SessionPersistence, Status, Subnet, SubnetPool,
};

/// A body that creates one `R`.
pub trait CreateBody<R: Resource>: Serialize {}
/// A body that changes one `R`.
pub trait UpdateBody<R: Resource>: Serialize {}

impl<R: Resource> CreateBody<R> for Value {}
impl<R: Resource> UpdateBody<R> for Value {}

macro_rules! bodies {
    ($($create:ident, $update:ident => $resource:ident;)*) => {$(
        impl CreateBody<$resource> for $create {}
        impl UpdateBody<$resource> for $update {}
    )*};
}

// Rules are made and removed, never changed.
impl CreateBody<SecurityGroupRule> for SecurityGroupRuleCreate {}

bodies! {
    NetworkCreate, NetworkUpdate => Network;
    SubnetCreate, SubnetUpdate => Subnet;
    SubnetPoolCreate, SubnetPoolUpdate => SubnetPool;
    PortCreate, PortUpdate => Port;
    FloatingIpCreate, FloatingIpUpdate => FloatingIp;
    HostCreate, HostCreate => Host;
    RouterCreate, RouterUpdate => Router;
    SecurityGroupCreate, SecurityGroupUpdate => SecurityGroup;
    LoadBalancerCreate, LoadBalancerUpdate => LoadBalancer;
    ListenerCreate, ListenerUpdate => Listener;
    PoolCreate, PoolUpdate => Pool;
    MemberCreate, MemberUpdate => Member;
}

/// Declares a Neutron resource's create request: its own fields, then the tags and
/// project every Neutron resource takes on create.
macro_rules! neutron_create {
    ($(#[$m:meta])* pub struct $name:ident { $($fields:tt)* }) => {
        #[skip_serializing_none]
        $(#[$m])*
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $($fields)*
            /// Tags.
            pub tags: Option<Vec<String>>,
            /// Owning project.
            pub project_id: Option<String>,
            /// Owning project (Neutron's older name).
            pub tenant_id: Option<String>,
        }
    };
}

/// Declares an Octavia create request: what every Octavia object takes, then its own
/// fields.
macro_rules! octavia_create {
    ($(#[$m:meta])* pub struct $name:ident { $($fields:tt)* }) => {
        #[skip_serializing_none]
        $(#[$m])*
        #[serde(deny_unknown_fields)]
        pub struct $name {
            /// Its UUID; the controller picks one when absent.
            pub id: Option<String>,
            /// Free-form name.
            pub name: Option<String>,
            /// Free-form description.
            pub description: Option<String>,
            /// Administrative state (default up).
            pub admin_state_up: Option<bool>,
            /// Tags.
            pub tags: Option<Vec<String>>,
            /// Owning project.
            pub project_id: Option<String>,
            /// Owning project (Neutron's older name).
            pub tenant_id: Option<String>,
            $($fields)*
        }
    };
}

/// Declares an Octavia update request: what every Octavia object can change, then its
/// own fields.
macro_rules! octavia_update {
    ($(#[$m:meta])* pub struct $name:ident { $($fields:tt)* }) => {
        #[skip_serializing_none]
        $(#[$m])*
        #[serde(deny_unknown_fields)]
        pub struct $name {
            /// Free-form name.
            pub name: Option<String>,
            /// Free-form description.
            pub description: Option<String>,
            /// Administrative state.
            pub admin_state_up: Option<bool>,
            /// Tags.
            pub tags: Option<Vec<String>>,
            $($fields)*
        }
    };
}

neutron_create! {
/// A network to create.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NetworkCreate {
    /// Its UUID; the controller picks one when absent.
    pub id: Option<String>,
    /// Free-form name.
    pub name: Option<String>,
    /// Free-form description.
    pub description: Option<String>,
    /// Administrative state (default up).
    pub admin_state_up: Option<bool>,
    /// Visible to other projects.
    pub shared: Option<bool>,
    /// The datapath's MTU.
    pub mtu: Option<u32>,
    /// Default port security of its ports.
    pub port_security_enabled: Option<bool>,
    /// Floating IPs can be allocated from it.
    #[serde(rename = "router:external")]
    pub router_external: Option<bool>,
    /// How it crosses hosts (only `vxlan`).
    #[serde(rename = "provider:network_type")]
    pub network_type: Option<String>,
    /// The VXLAN network identifier to use.
    #[serde(rename = "provider:segmentation_id")]
    pub segmentation_id: Option<u32>,
    /// Masquerade what leaves its subnets.
    #[serde(rename = "corvid:masquerade")]
    pub masquerade: Option<bool>,
}

}
/// A change to a network.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkUpdate {
    /// Free-form name.
    pub name: Option<String>,
    /// Free-form description.
    pub description: Option<String>,
    /// Administrative state.
    pub admin_state_up: Option<bool>,
    /// Visible to other projects.
    pub shared: Option<bool>,
    /// The datapath's MTU.
    pub mtu: Option<u32>,
    /// Default port security of its ports.
    pub port_security_enabled: Option<bool>,
    /// Floating IPs can be allocated from it.
    #[serde(rename = "router:external")]
    pub router_external: Option<bool>,
    /// Masquerade what leaves its subnets.
    #[serde(rename = "corvid:masquerade")]
    pub masquerade: Option<bool>,
}

neutron_create! {
/// A subnet to create: a `cidr`, or a `subnetpool_id` to carve one of `prefixlen` from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SubnetCreate {
    /// Its UUID; the controller picks one when absent.
    pub id: Option<String>,
    /// The network it is on.
    pub network_id: String,
    /// Free-form name.
    pub name: Option<String>,
    /// Free-form description.
    pub description: Option<String>,
    /// 4 or 6; from the CIDR when absent.
    pub ip_version: Option<u8>,
    /// Its prefix.
    pub cidr: Option<IpNet>,
    /// Its gateway; `Some(None)` for none, absent for the first address.
    #[serde(default, with = "::serde_with::rust::double_option")]
    pub gateway_ip: Option<Option<IpAddr>>,
    /// The ranges addresses come from; the whole prefix when absent.
    pub allocation_pools: Option<Vec<AllocationPool>>,
    /// Extra routes for its ports.
    pub host_routes: Option<Vec<HostRoute>>,
    /// DNS servers for its ports.
    pub dns_nameservers: Option<Vec<String>>,
    /// Kept for Neutron clients.
    pub enable_dhcp: Option<bool>,
    /// The pool to carve the prefix from.
    pub subnetpool_id: Option<String>,
    /// The length of the prefix carved from the pool.
    pub prefixlen: Option<u8>,
    /// IPv6 router advertisement mode.
    pub ipv6_ra_mode: Option<crate::model::Ipv6Mode>,
    /// IPv6 address mode: SLAAC's and stateless DHCPv6's addresses come from the MAC.
    pub ipv6_address_mode: Option<crate::model::Ipv6Mode>,
    /// Kept for Neutron clients.
    pub service_types: Option<Vec<String>>,
}

}
/// A change to a subnet.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubnetUpdate {
    /// Free-form name.
    pub name: Option<String>,
    /// Free-form description.
    pub description: Option<String>,
    /// Its gateway; `Some(None)` removes it.
    #[serde(default, with = "::serde_with::rust::double_option")]
    pub gateway_ip: Option<Option<IpAddr>>,
    /// The ranges addresses come from.
    pub allocation_pools: Option<Vec<AllocationPool>>,
    /// Extra routes for its ports.
    pub host_routes: Option<Vec<HostRoute>>,
    /// DNS servers for its ports.
    pub dns_nameservers: Option<Vec<String>>,
    /// Kept for Neutron clients.
    pub enable_dhcp: Option<bool>,
    /// Kept for Neutron clients.
    pub service_types: Option<Vec<String>>,
}

neutron_create! {
/// A subnet pool to create.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SubnetPoolCreate {
    /// Its UUID; the controller picks one when absent.
    pub id: Option<String>,
    /// Free-form name.
    pub name: Option<String>,
    /// Free-form description.
    pub description: Option<String>,
    /// The prefixes subnets are carved from.
    pub prefixes: Vec<IpNet>,
    /// The length a subnet gets when it asks for none.
    pub default_prefixlen: Option<u8>,
    /// The shortest length a subnet may ask for.
    pub min_prefixlen: Option<u8>,
    /// The longest length a subnet may ask for.
    pub max_prefixlen: Option<u8>,
    /// The default pool of its family.
    pub is_default: Option<bool>,
    /// Visible to other projects.
    pub shared: Option<bool>,
}

}
/// A change to a subnet pool.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubnetPoolUpdate {
    /// Free-form name.
    pub name: Option<String>,
    /// Free-form description.
    pub description: Option<String>,
    /// The length a subnet gets when it asks for none.
    pub default_prefixlen: Option<u8>,
    /// The default pool of its family.
    pub is_default: Option<bool>,
}

/// An address a port asks for: on a subnet, this address, or both.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixedIpRequest {
    /// The subnet to take it from.
    pub subnet_id: Option<String>,
    /// The address itself.
    pub ip_address: Option<IpAddr>,
}

neutron_create! {
/// A port to create.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PortCreate {
    /// Its UUID; the controller picks one when absent.
    pub id: Option<String>,
    /// The network it is on (or, as the Mizar-MP plugin sends it, a subnet).
    pub network_id: String,
    /// Free-form name.
    pub name: Option<String>,
    /// Free-form description.
    pub description: Option<String>,
    /// Administrative state (default up).
    pub admin_state_up: Option<bool>,
    /// Its MAC; the controller picks one when absent.
    pub mac_address: Option<String>,
    /// The addresses it asks for; one from each subnet of its family when absent.
    pub fixed_ips: Option<Vec<FixedIpRequest>>,
    /// What it is for (a container, a pod UID).
    pub device_id: Option<String>,
    /// Who made it.
    pub device_owner: Option<String>,
    /// The host whose agent plugs it.
    #[serde(rename = "binding:host_id")]
    pub host_id: Option<String>,
    /// Free-form binding details.
    #[serde(rename = "binding:profile")]
    pub profile: Option<Value>,
    /// Kept for Neutron clients.
    #[serde(rename = "binding:vnic_type")]
    pub vnic_type: Option<String>,
    /// Port security.
    pub port_security_enabled: Option<bool>,
    /// Its security groups.
    pub security_groups: Option<Vec<String>>,
    /// Other addresses it may send from.
    pub allowed_address_pairs: Option<Vec<Value>>,
    /// Kept for Neutron clients.
    pub extra_dhcp_opts: Option<Vec<Value>>,
    /// The interface's name in the container.
    pub veth_name: Option<String>,
    /// The container's network namespace.
    pub network_ns: Option<String>,
    /// The Mizar-MP name of `network_ns`.
    pub veth_namespace: Option<String>,
    /// The agent plugs it without waiting for the overlay.
    pub fast_path: Option<bool>,
    /// Kept for Neutron clients.
    pub dns_name: Option<String>,
    /// Kept for Neutron clients.
    pub dns_domain: Option<String>,
}

}
/// A change to a port.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortUpdate {
    /// Free-form name.
    pub name: Option<String>,
    /// Free-form description.
    pub description: Option<String>,
    /// Administrative state.
    pub admin_state_up: Option<bool>,
    /// Its MAC.
    pub mac_address: Option<String>,
    /// The addresses it holds.
    pub fixed_ips: Option<Vec<FixedIpRequest>>,
    /// What it is for.
    pub device_id: Option<String>,
    /// Who made it.
    pub device_owner: Option<String>,
    /// The host whose agent plugs it.
    #[serde(rename = "binding:host_id")]
    pub host_id: Option<String>,
    /// Free-form binding details.
    #[serde(rename = "binding:profile")]
    pub profile: Option<Value>,
    /// Kept for Neutron clients.
    #[serde(rename = "binding:vnic_type")]
    pub vnic_type: Option<String>,
    /// Port security.
    pub port_security_enabled: Option<bool>,
    /// Its security groups.
    pub security_groups: Option<Vec<String>>,
    /// Other addresses it may send from.
    pub allowed_address_pairs: Option<Vec<Value>>,
    /// Kept for Neutron clients.
    pub extra_dhcp_opts: Option<Vec<Value>>,
    /// Its status, as its agent reports it.
    pub status: Option<Status>,
    /// The interface's name in the container; `Some(None)` once unplugged.
    #[serde(default, with = "::serde_with::rust::double_option")]
    pub veth_name: Option<Option<String>>,
    /// The container's network namespace; `Some(None)` once unplugged.
    #[serde(default, with = "::serde_with::rust::double_option")]
    pub network_ns: Option<Option<String>>,
    /// The agent plugs it without waiting for the overlay.
    pub fast_path: Option<bool>,
}

neutron_create! {
/// A floating IP to create.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FloatingIpCreate {
    /// Its UUID; the controller picks one when absent.
    pub id: Option<String>,
    /// The external network it comes from.
    pub floating_network_id: String,
    /// The port it forwards to.
    pub port_id: Option<String>,
    /// Which of the port's addresses.
    pub fixed_ip_address: Option<IpAddr>,
    /// The address to take; any free one when absent.
    pub floating_ip_address: Option<IpAddr>,
    /// The external subnet to take it from.
    pub subnet_id: Option<String>,
    /// Free-form description.
    pub description: Option<String>,
}

}
/// A change to a floating IP: a port to forward to, or `Some(None)` for none.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FloatingIpUpdate {
    /// The port it forwards to.
    #[serde(default, with = "::serde_with::rust::double_option")]
    pub port_id: Option<Option<String>>,
    /// Which of the port's addresses.
    #[serde(default, with = "::serde_with::rust::double_option")]
    pub fixed_ip_address: Option<Option<IpAddr>>,
    /// Free-form description.
    pub description: Option<String>,
}

neutron_create! {
    /// A router to create.
    #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
    pub struct RouterCreate {
        /// Its UUID; the controller picks one when absent.
        pub id: Option<String>,
        /// Free-form name.
        pub name: Option<String>,
        /// Free-form description.
        pub description: Option<String>,
        /// Administrative state (default up).
        pub admin_state_up: Option<bool>,
        /// Its way out.
        pub external_gateway_info: Option<GatewayRequest>,
    }
}

/// A change to a router.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterUpdate {
    /// Free-form name.
    pub name: Option<String>,
    /// Free-form description.
    pub description: Option<String>,
    /// Administrative state.
    pub admin_state_up: Option<bool>,
    /// Its way out; `Some(None)` removes it.
    #[serde(default, with = "::serde_with::rust::double_option")]
    pub external_gateway_info: Option<Option<GatewayRequest>>,
    /// Extra routes, all of them (an empty list removes every one).
    pub routes: Option<Vec<HostRoute>>,
}

/// A router's gateway as asked for: an external network, and optionally its addresses.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayRequest {
    /// The external network.
    pub network_id: String,
    /// Whether what leaves takes the gateway's address (default true).
    pub enable_snat: Option<bool>,
    /// The gateway port's addresses; one from the network when absent.
    pub external_fixed_ips: Option<Vec<FixedIpRequest>>,
}

/// The body of `add_router_interface` and `remove_router_interface`: a subnet (the router
/// takes its gateway address) or a port.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterInterface {
    /// The subnet.
    pub subnet_id: Option<String>,
    /// The port.
    pub port_id: Option<String>,
}

neutron_create! {
    /// A security group to create; it comes with rules letting everything out.
    #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
    pub struct SecurityGroupCreate {
        /// Its UUID; the controller picks one when absent.
        pub id: Option<String>,
        /// Free-form name; not `default`, the name of the group every project gets.
        pub name: Option<String>,
        /// Free-form description.
        pub description: Option<String>,
        /// Connection tracking (default true).
        pub stateful: Option<bool>,
    }
}

/// A change to a security group.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecurityGroupUpdate {
    /// Free-form name; the `default` group keeps its own.
    pub name: Option<String>,
    /// Free-form description.
    pub description: Option<String>,
    /// Connection tracking; unchangeable while a port has the group.
    pub stateful: Option<bool>,
}

/// A rule to add to a security group. Rules take no tags, unlike other Neutron resources.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecurityGroupRuleCreate {
    /// Its group.
    pub security_group_id: String,
    /// To the port or from it.
    pub direction: Direction,
    /// IPv4 or IPv6 (default IPv4).
    pub ethertype: Option<Ethertype>,
    /// An IP protocol name (`tcp`) or number (`6`); any when absent.
    pub protocol: Option<String>,
    /// First port of the range, or the ICMP type.
    pub port_range_min: Option<u16>,
    /// Last port of the range, or the ICMP code.
    pub port_range_max: Option<u16>,
    /// The remote addresses; any when absent.
    pub remote_ip_prefix: Option<IpNet>,
    /// The remote addresses are those of this group's ports.
    pub remote_group_id: Option<String>,
    /// Free-form description.
    pub description: Option<String>,
    /// Owning project.
    pub project_id: Option<String>,
    /// Owning project (Neutron's older name).
    pub tenant_id: Option<String>,
}

impl SecurityGroupRuleCreate {
    /// A rule of `security_group_id` for `direction`, of any IPv4 traffic until narrowed.
    pub fn new(security_group_id: &str, direction: Direction) -> Self {
        SecurityGroupRuleCreate {
            security_group_id: security_group_id.to_string(),
            direction,
            ethertype: None,
            protocol: None,
            port_range_min: None,
            port_range_max: None,
            remote_ip_prefix: None,
            remote_group_id: None,
            description: None,
            project_id: None,
            tenant_id: None,
        }
    }
}

/// A host as its agent registers it (a PUT that creates or replaces).
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostCreate {
    /// The address other hosts' tunnels reach it on.
    pub underlay_ip: Option<IpAddr>,
    /// Free-form description.
    pub description: Option<String>,
    /// Tags.
    pub tags: Option<Vec<String>>,
}

octavia_create! {
/// A load balancer to create.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadBalancerCreate {
    /// The subnet its VIP is on.
    pub vip_subnet_id: Option<String>,
    /// The network its VIP is on.
    pub vip_network_id: Option<String>,
    /// An existing port to be its VIP.
    pub vip_port_id: Option<String>,
    /// The VIP's address; any free one when absent.
    pub vip_address: Option<IpAddr>,
    /// Only `corvid`.
    pub provider: Option<String>,
    /// Kept for Octavia clients.
    pub flavor_id: Option<String>,
    /// Kept for Octavia clients.
    pub availability_zone: Option<String>,
}

}
octavia_update! {
/// A change to a load balancer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadBalancerUpdate {
}

}
octavia_create! {
    /// A listener to create.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct ListenerCreate {
        /// Its load balancer.
        pub loadbalancer_id: String,
        /// TCP, UDP or SCTP.
        pub protocol: LbProtocol,
        /// The port on the VIP.
        pub protocol_port: u16,
        /// The pool it sends to.
        pub default_pool_id: Option<String>,
        /// Kept for Octavia clients.
        pub connection_limit: Option<i64>,
    }
}

impl ListenerCreate {
    /// A listener on `port` of load balancer `loadbalancer_id`, everything else default.
    pub fn new(loadbalancer_id: &str, protocol: LbProtocol, port: u16) -> Self {
        ListenerCreate {
            id: None,
            name: None,
            description: None,
            admin_state_up: None,
            tags: None,
            loadbalancer_id: loadbalancer_id.to_string(),
            protocol,
            protocol_port: port,
            default_pool_id: None,
            connection_limit: None,
            project_id: None,
            tenant_id: None,
        }
    }
}

octavia_update! {
/// A change to a listener.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ListenerUpdate {
    /// The pool it sends to; `Some(None)` for none.
    #[serde(default, with = "::serde_with::rust::double_option")]
    pub default_pool_id: Option<Option<String>>,
    /// Kept for Octavia clients.
    pub connection_limit: Option<i64>,
}

}
octavia_create! {
    /// A pool to create.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct PoolCreate {
        /// Its load balancer.
        pub loadbalancer_id: Option<String>,
        /// The listener whose default pool it is.
        pub listener_id: Option<String>,
        /// TCP, UDP or SCTP.
        pub protocol: LbProtocol,
        /// How members are picked (`ROUND_ROBIN`).
        pub lb_algorithm: String,
        /// Client affinity; none when absent.
        #[serde(default, with = "::serde_with::rust::double_option")]
        pub session_persistence: Option<Option<SessionPersistence>>,
    }
}

impl PoolCreate {
    /// A pool of `protocol` picking members by `lb_algorithm`, everything else default.
    pub fn new(protocol: LbProtocol, lb_algorithm: &str) -> Self {
        PoolCreate {
            id: None,
            name: None,
            description: None,
            admin_state_up: None,
            tags: None,
            loadbalancer_id: None,
            listener_id: None,
            protocol,
            lb_algorithm: lb_algorithm.to_string(),
            session_persistence: None,
            project_id: None,
            tenant_id: None,
        }
    }
}

octavia_update! {
/// A change to a pool.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolUpdate {
    /// How members are picked.
    pub lb_algorithm: Option<String>,
    /// Client affinity; `Some(None)` for none.
    #[serde(default, with = "::serde_with::rust::double_option")]
    pub session_persistence: Option<Option<SessionPersistence>>,
}

}
octavia_create! {
    /// A member to create.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct MemberCreate {
        /// The address traffic goes to.
        pub address: IpAddr,
        /// The port traffic goes to.
        pub protocol_port: u16,
        /// The subnet the address is on.
        pub subnet_id: Option<String>,
        /// Its share of new connections.
        pub weight: Option<u32>,
        /// Used only when no other member is up.
        pub backup: Option<bool>,
        /// Its pool (the flat `/v2/lbaas/members` route).
        pub pool_id: Option<String>,
    }
}

impl MemberCreate {
    /// A member sending to `address`:`port`, everything else default.
    pub fn new(address: IpAddr, port: u16) -> Self {
        MemberCreate {
            id: None,
            name: None,
            description: None,
            admin_state_up: None,
            tags: None,
            address,
            protocol_port: port,
            subnet_id: None,
            weight: None,
            backup: None,
            pool_id: None,
            project_id: None,
            tenant_id: None,
        }
    }
}

octavia_update! {
    /// A change to a member.
    #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
    pub struct MemberUpdate {
        /// Its share of new connections.
        pub weight: Option<u32>,
        /// Used only when no other member is up.
        pub backup: Option<bool>,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn absent_fields_are_not_sent_and_some_none_sends_null() {
        let unplug = PortUpdate {
            network_ns: Some(None),
            veth_name: Some(None),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&unplug).unwrap(),
            json!({"network_ns": null, "veth_name": null})
        );
        let back: PortUpdate =
            serde_json::from_value(json!({"network_ns": null, "fast_path": true})).unwrap();
        assert_eq!(back.network_ns, Some(None));
        assert_eq!(back.veth_name, None);
        let net = NetworkCreate {
            masquerade: Some(true),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&net).unwrap(),
            json!({"corvid:masquerade": true})
        );
    }

    #[test]
    fn an_attribute_no_request_takes_is_refused() {
        let e = serde_json::from_value::<NetworkUpdate>(json!({"id": "x"})).unwrap_err();
        assert!(e.to_string().contains("unknown field `id`"), "{e}");
    }
}
