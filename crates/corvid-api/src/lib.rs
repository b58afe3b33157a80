//! The network controller's resource model in Neutron v2.0 JSON shape (networks, subnets,
//! subnetpools, ports, floating IPs, routers, security groups, hosts, the watch feed) and the typed HTTP client that every
//! adapter (CNI plugin, Docker driver, agent) uses to reach the controller.

#![deny(missing_docs)]

pub mod client;
pub mod model;
pub mod protocols;
pub mod requests;
pub mod tls;
pub mod watcher;

pub use client::{ApiError, Client, WatchFilter};
pub use model::{
    AllocationPool, Direction, Ethertype, EventKind, ExternalGatewayInfo, FixedIp, FloatingIp,
    Host, HostRoute, Ipv6Mode, LbProtocol, Listener, LoadBalancer, Member, Network, Pool, Port,
    PortDetails, Resource, Router, RouterInterfaceInfo, SecurityGroup, SecurityGroupRule,
    SessionPersistence, Status, Subnet, SubnetPool, WatchEvent, WatchPage, NODE_PORT_TAG,
    ROUTER_GATEWAY, ROUTER_INTERFACE,
};
pub use requests::{
    FixedIpRequest, FloatingIpCreate, FloatingIpUpdate, GatewayRequest, HostCreate, ListenerCreate,
    ListenerUpdate, LoadBalancerCreate, LoadBalancerUpdate, MemberCreate, MemberUpdate,
    NetworkCreate, NetworkUpdate, PoolCreate, PoolUpdate, PortCreate, PortUpdate, RouterCreate,
    RouterInterface, RouterUpdate, SecurityGroupCreate, SecurityGroupRuleCreate,
    SecurityGroupUpdate, SubnetCreate, SubnetPoolCreate, SubnetPoolUpdate, SubnetUpdate,
};
pub use tls::{Credentials, Tls, TlsError};
pub use watcher::Watcher;
