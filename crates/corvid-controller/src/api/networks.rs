//! Networks, subnets and subnetpools.

use std::net::IpAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Router;
use corvid_api::{
    AllocationPool, Ipv6Mode, Network, NetworkCreate, Status, Subnet, SubnetCreate, SubnetPool,
    SubnetPoolCreate,
};
use ipnet::IpNet;
use serde_json::Value;

use super::attributes::{
    Attribute, Attributes, Type, Write, ADMIN_STATE_UP, DESCRIPTION, NAME, NEUTRON,
};
use super::{
    answer_as, body, if_match, item_routes, list_route, lookup, merge, project_of, request,
    show_route, to_stored, update_with, Ctl,
};
use crate::controller::Controller;
use crate::error::NeutronError;
use crate::ipam::pools;
use crate::keys;
use crate::store::{Compare, Op, Txn};
use crate::util::{new_id, now};

/// What a client may send of a network.
pub(super) const NETWORK: Attributes = Attributes {
    singular: "network",
    plural: "networks",
    common: &NEUTRON,
    own: &[
        Attribute::create("id", Type::Text),
        NAME,
        DESCRIPTION,
        ADMIN_STATE_UP,
        Attribute::both("shared", Type::Bool),
        Attribute::both("mtu", Type::Int),
        Attribute::both("port_security_enabled", Type::Bool),
        Attribute::both("router:external", Type::Bool),
        Attribute::create("provider:network_type", Type::Text),
        Attribute::create("provider:segmentation_id", Type::Int),
        Attribute::both("corvid:masquerade", Type::Bool),
    ],
};
/// What a client may send of a subnet.
pub(super) const SUBNET: Attributes = Attributes {
    singular: "subnet",
    plural: "subnets",
    common: &NEUTRON,
    own: &[
        Attribute::create("id", Type::Text),
        NAME,
        DESCRIPTION,
        Attribute::create("network_id", Type::Text),
        Attribute::create("ip_version", Type::IpVersion),
        Attribute::create("cidr", Type::Text),
        Attribute::both("gateway_ip", Type::Text),
        Attribute::both("allocation_pools", Type::Pairs("start", "end")),
        Attribute::both("host_routes", Type::Pairs("destination", "nexthop")),
        Attribute::both("dns_nameservers", Type::Texts),
        Attribute::both("enable_dhcp", Type::Bool),
        Attribute::create("subnetpool_id", Type::Text),
        Attribute::create("prefixlen", Type::Int),
        Attribute::create("ipv6_ra_mode", Type::Text),
        Attribute::create("ipv6_address_mode", Type::Text),
        Attribute::both("service_types", Type::Texts),
    ],
};
/// What a client may send of a subnet pool.
pub(super) const SUBNET_POOL: Attributes = Attributes {
    singular: "subnetpool",
    plural: "subnetpools",
    common: &NEUTRON,
    own: &[
        Attribute::create("id", Type::Text),
        NAME,
        DESCRIPTION,
        Attribute::create("prefixes", Type::Texts),
        Attribute::both("default_prefixlen", Type::Int),
        Attribute::create("min_prefixlen", Type::Int),
        Attribute::create("max_prefixlen", Type::Int),
        Attribute::both("is_default", Type::Bool),
        Attribute::create("shared", Type::Bool),
    ],
};

pub fn routes() -> Router<Arc<Controller>> {
    Router::new()
        .route(
            "/v2.0/networks",
            list_route::<Network>().post(create_networks),
        )
        .route(
            "/v2.0/networks/{id}",
            item_routes::<Network>(&NETWORK).delete(delete_network),
        )
        .route("/v2.0/subnets", list_route::<Subnet>().post(create_subnet))
        .route(
            "/v2.0/subnets/{id}",
            show_route::<Subnet>()
                .put(update_subnet)
                .delete(delete_subnet),
        )
        .route(
            "/v2.0/subnetpools",
            list_route::<SubnetPool>().post(create_subnetpool),
        )
        .route(
            "/v2.0/subnetpools/{id}",
            item_routes::<SubnetPool>(&SUBNET_POOL).delete(delete_subnetpool),
        )
}

fn new_network(req: NetworkCreate, headers: &HeaderMap) -> Network {
    let project = project_of(req.project_id.as_deref(), req.tenant_id.as_deref(), headers);
    let t = now();
    Network {
        id: req.id.unwrap_or_else(new_id),
        name: req.name.unwrap_or_default(),
        tenant_id: project.clone(),
        project_id: project,
        admin_state_up: req.admin_state_up.unwrap_or(true),
        mtu: req.mtu.unwrap_or(1450),
        status: Status::Active,
        subnets: Vec::new(),
        shared: req.shared.unwrap_or(false),
        router_external: req.router_external.unwrap_or(false),
        port_security_enabled: req.port_security_enabled.unwrap_or(true),
        description: req.description.unwrap_or_default(),
        tags: req.tags.unwrap_or_default(),
        created_at: t.clone(),
        updated_at: t,
        revision_number: 1,
        network_type: "vxlan".into(),
        segmentation_id: 0,
        masquerade: req.masquerade.unwrap_or(false),
    }
}

/// Highest VXLAN network identifier (24 bits).
const MAX_VNI: u32 = (1 << 24) - 1;

/// The segment ID a new network asks for, checked; `None` lets the controller pick.
fn requested_vni(req: &NetworkCreate) -> Result<Option<u32>, NeutronError> {
    if let Some(t) = req.network_type.as_deref().filter(|t| *t != "vxlan") {
        return Err(NeutronError::invalid_input(format!(
            "provider:network_type {t} is not supported: corvid networks are vxlan"
        )));
    }
    match req.segmentation_id {
        Some(id) if id == 0 || id > MAX_VNI => Err(NeutronError::invalid_input(format!(
            "provider:segmentation_id {id} is outside 1-{MAX_VNI}"
        ))),
        id => Ok(id),
    }
}

/// POST of one network or of `{"networks": [...]}`, all in one transaction.
async fn create_networks(
    State(c): Ctl,
    headers: HeaderMap,
    b: Bytes,
) -> Result<Response, NeutronError> {
    let v = body(&b)?;
    let (bulk, objs) = NETWORK.objects(&v)?;
    let mut asked = Vec::new();
    for o in &objs {
        // A project sent as `null` is none named.
        let req: NetworkCreate = request(o, &["project_id", "tenant_id"])?;
        let vni = requested_vni(&req)?;
        asked.push((new_network(req, &headers), vni));
    }
    let nets = c
        .transact(|v| {
            let mut used: std::collections::HashSet<u32> =
                v.networks.values().map(|n| n.obj.segmentation_id).collect();
            let mut txn = Txn::default();
            let mut nets = Vec::new();
            for (n, vni) in &asked {
                let mut n = n.clone();
                if v.networks.contains_key(n.id.as_str())
                    || nets.iter().any(|o: &Network| o.id == n.id)
                {
                    return Err(NeutronError::conflict(
                        "NetworkExists",
                        format!("A network with id {} already exists.", n.id),
                    ));
                }
                n.segmentation_id = match vni {
                    Some(id) if used.contains(id) => {
                        return Err(NeutronError::conflict(
                            "SegmentationIdInUse",
                            format!("provider:segmentation_id {id} is used by another network."),
                        ))
                    }
                    Some(id) => *id,
                    None => loop {
                        let id = 1 + crate::util::random_below(MAX_VNI as u128) as u32;
                        if !used.contains(&id) {
                            break id;
                        }
                    },
                };
                used.insert(n.segmentation_id);
                let key = keys::resource("networks", &n.id);
                let vni_key = keys::vni(n.segmentation_id);
                txn.compares.push(Compare::CreateRevision(key.clone(), 0));
                txn.compares
                    .push(Compare::CreateRevision(vni_key.clone(), 0));
                txn.ops.push(Op::Put(key, to_stored(&n)));
                txn.ops.push(Op::Put(vni_key, n.id.clone().into_bytes()));
                nets.push(n);
            }
            Ok((txn, nets))
        })
        .await?;
    Ok(if bulk {
        answer_as(StatusCode::CREATED, "networks", &nets)
    } else {
        answer_as(StatusCode::CREATED, "network", &nets[0])
    })
}

async fn delete_network(State(c): Ctl, Path(id): Path<String>) -> Result<StatusCode, NeutronError> {
    c
        .transact(|v| {
            let net = lookup::<Network>(v, &id)?;
            let users: Vec<&str> = v
                .ports
                .values()
                .filter(|p| *p.obj.network_id == *id)
                .map(|p| &*p.obj.id)
                .chain(
                    v.floatingips
                        .values()
                        .filter(|f| f.obj.floating_network_id == id)
                        .map(|f| f.obj.id.as_str()),
                )
                .collect();
            if !users.is_empty() {
                return Err(NeutronError::conflict(
                    "NetworkInUse",
                    format!(
                        "Unable to complete operation on network {id}. There are one or more ports still in use on the network, id for these ports is: {}.",
                        users.join(",")
                    ),
                ));
            }
            let key = keys::resource("networks", &id);
            let mut txn = Txn {
                compares: vec![
                    Compare::ModRevision(key.clone(), net.mod_revision),
                    Compare::PrefixEmpty(keys::network_users(&id)),
                ],
                ops: vec![Op::Delete(key), Op::Delete(keys::vni(net.obj.segmentation_id))],
            };
            for s in &net.obj.subnets {
                txn.ops.push(Op::Delete(keys::resource("subnets", s)));
            }
            Ok((txn, ()))
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A subnet's gateway lies in its cidr and outside its pools; the pools lie inside the
/// cidr without overlapping.
fn check_addressing(
    cidr: &IpNet,
    gateway_ip: Option<IpAddr>,
    pools: &[AllocationPool],
) -> Result<(), NeutronError> {
    if let Some(g) = gateway_ip.filter(|g| !cidr.contains(g)) {
        return Err(NeutronError::invalid_input(format!(
            "Gateway IP {g} is not in subnet {cidr}"
        )));
    }
    pools::check_pools(cidr, pools)?;
    if let Some(g) = gateway_ip.filter(|g| pools::in_pools(pools, *g)) {
        return Err(NeutronError::conflict(
            "GatewayConflictWithAllocationPools",
            format!("Gateway ip {g} conflicts with allocation pool"),
        ));
    }
    Ok(())
}

/// PUT of a subnet: plain attributes, and a gateway and pools that still fit the cidr.
/// Addresses already handed out outside new pools stay with their ports, as in Neutron.
async fn update_subnet(
    State(c): Ctl,
    Path(id): Path<String>,
    headers: HeaderMap,
    b: Bytes,
) -> Result<Response, NeutronError> {
    let attrs = SUBNET.object(&body(&b)?, Write::Update)?;
    let subnet = update_with::<Subnet>(&c, &id, if_match(&headers), |_, s, _| {
        merge(s, &attrs)?;
        check_addressing(&s.cidr, s.gateway_ip, &s.allocation_pools)
    })
    .await?;
    Ok(answer_as(StatusCode::OK, "subnet", &subnet))
}

/// Neutron's rules for the IPv6 modes: IPv6 subnets only, with DHCP on; the two modes
/// the same when both are given; and an address computed from the MAC (EUI-64) needs a
/// /64.
fn check_ipv6_modes(req: &SubnetCreate, cidr: &IpNet) -> Result<(), NeutronError> {
    let (ra, address) = (req.ipv6_ra_mode, req.ipv6_address_mode);
    if ra.is_none() && address.is_none() {
        return Ok(());
    }
    if cidr.addr().is_ipv4() {
        return Err(NeutronError::invalid_input(
            "ipv6_ra_mode or ipv6_address_mode cannot be set when ip_version is 4",
        ));
    }
    if req.enable_dhcp == Some(false) {
        return Err(NeutronError::invalid_input(
            "ipv6_ra_mode or ipv6_address_mode cannot be set when enable_dhcp is set to False.",
        ));
    }
    if let (Some(r), Some(a)) = (ra, address) {
        if r != a {
            return Err(NeutronError::invalid_input(format!(
                "ipv6_ra_mode set to '{}' with ipv6_address_mode set to '{}' is not valid. If both attributes are set, they must be the same value",
                mode_name(r),
                mode_name(a)
            )));
        }
    }
    if address.is_some_and(Ipv6Mode::is_auto_address) && cidr.prefix_len() != 64 {
        return Err(NeutronError::invalid_input(format!(
            "Invalid CIDR {cidr} for IPv6 address mode. OpenStack uses the EUI-64 address format, which requires the prefix to be /64"
        )));
    }
    Ok(())
}

/// A mode as the API spells it.
fn mode_name(m: Ipv6Mode) -> String {
    serde_json::to_value(m)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Where a new subnet's prefix comes from.
fn subnet_cidr(
    req: &SubnetCreate,
    pool: Option<&SubnetPool>,
    taken: &[IpNet],
) -> Result<IpNet, NeutronError> {
    match (req.cidr, pool) {
        (Some(c), None) => Ok(c.trunc()),
        (None, None) => Err(NeutronError::bad_request(
            "A cidr must be specified in the absence of a subnet pool",
        )),
        (Some(c), Some(p)) => {
            let c = c.trunc();
            if !p.prefixes.iter().any(|pre| pre.contains(&c)) {
                return Err(NeutronError::new(
                    StatusCode::BAD_REQUEST,
                    "IllegalSubnetPoolPrefixBounds",
                    format!("Cidr {c} is not within subnetpool {} prefixes", p.id),
                ));
            }
            if taken.iter().any(|t| pools::overlaps(t, &c)) {
                return Err(NeutronError::conflict(
                    "SubnetAllocationError",
                    format!(
                        "Failed to allocate subnet: {c} overlaps a subnet of pool {}",
                        p.id
                    ),
                ));
            }
            Ok(c)
        }
        (None, Some(p)) => {
            let len = req.prefixlen.unwrap_or(p.default_prefixlen);
            if len < p.min_prefixlen || len > p.max_prefixlen {
                return Err(NeutronError::new(
                    StatusCode::BAD_REQUEST,
                    "IllegalSubnetPoolPrefixLength",
                    format!(
                        "Illegal prefix length {len} for subnetpool {}: min {}, max {}",
                        p.id, p.min_prefixlen, p.max_prefixlen
                    ),
                ));
            }
            pools::carve(&p.prefixes, taken, len).ok_or_else(|| {
                NeutronError::conflict(
                    "SubnetAllocationError",
                    format!(
                        "Failed to allocate subnet: no /{len} left in subnetpool {}",
                        p.id
                    ),
                )
            })
        }
    }
}

async fn create_subnet(
    State(c): Ctl,
    headers: HeaderMap,
    b: Bytes,
) -> Result<Response, NeutronError> {
    let obj = SUBNET.object(&body(&b)?, Write::Create)?;
    if !obj.contains_key("network_id") {
        return Err(NeutronError::bad_request("Missing network_id"));
    }
    // `gateway_ip: null` is a subnet without a gateway; the IPv6 modes and the project take
    // null as unset.
    let nullable = [
        "gateway_ip",
        "ipv6_ra_mode",
        "ipv6_address_mode",
        "project_id",
        "tenant_id",
    ];
    let req: SubnetCreate = request(&obj, &nullable)?;
    let (network_id, pool_id) = (&req.network_id, &req.subnetpool_id);
    let id = req.id.clone().unwrap_or_else(new_id);
    let subnet = c
        .transact(|v| {
            if v.subnets.contains_key(id.as_str()) {
                return Err(NeutronError::conflict(
                    "SubnetExists",
                    format!("Subnet {id} already exists."),
                ));
            }
            let net = lookup::<Network>(v, network_id)?;
            let pool = match pool_id {
                Some(p) => Some(lookup::<SubnetPool>(v, p)?),
                None => None,
            };
            let siblings: Vec<&Subnet> = net
                .obj
                .subnets
                .iter()
                .filter_map(|s| v.subnets.get(s.as_str()).map(|e| &*e.obj))
                .collect();
            let pool_taken: Vec<IpNet> = v
                .subnets
                .values()
                .filter(|s| pool_id.is_some() && s.obj.subnetpool_id == *pool_id)
                .map(|s| s.obj.cidr)
                .collect();
            let cidr = subnet_cidr(&req, pool.as_ref().map(|p| &*p.obj), &pool_taken)?;
            let cidr_version = if cidr.addr().is_ipv4() { 4 } else { 6 };
            let version = req.ip_version.unwrap_or(cidr_version);
            if version != cidr_version {
                return Err(NeutronError::invalid_input(format!(
                    "Cidr {cidr} does not match ip_version {version}"
                )));
            }
            // Per IP version, as Neutron checks it: a dual-stack network's IPv4 and IPv6
            // subnets come from pools of their own.
            if siblings
                .iter()
                .any(|s| s.ip_version == version && s.subnetpool_id != *pool_id)
            {
                return Err(NeutronError::bad_request(
                    "Subnets hosted on the same network must be allocated from the same subnet pool.",
                ));
            }
            check_ipv6_modes(&req, &cidr)?;
            if let Some(o) = siblings.iter().find(|s| pools::overlaps(&s.cidr, &cidr)) {
                return Err(NeutronError::invalid_input(format!(
                    "Requested subnet with cidr: {cidr} for network: {network_id} overlaps with another subnet ({})",
                    o.id
                )));
            }
            // Absent, the gateway is the prefix's first address; `null` is no gateway.
            let gateway_ip = req
                .gateway_ip
                .unwrap_or_else(|| Some(pools::default_gateway(&cidr)));
            let pools: Vec<AllocationPool> = match &req.allocation_pools {
                Some(p) => p.clone(),
                None => pools::default_pools(&cidr, gateway_ip),
            };
            check_addressing(&cidr, gateway_ip, &pools)?;
            let project =
                project_of(req.project_id.as_deref(), req.tenant_id.as_deref(), &headers);
            let t = now();
            let subnet = Subnet {
                id: id.clone(),
                name: req.name.clone().unwrap_or_default(),
                tenant_id: project.clone(),
                project_id: project,
                network_id: network_id.clone(),
                ip_version: version,
                subnetpool_id: pool_id.clone(),
                enable_dhcp: req.enable_dhcp.unwrap_or(true),
                ipv6_ra_mode: req.ipv6_ra_mode,
                ipv6_address_mode: req.ipv6_address_mode,
                gateway_ip,
                cidr,
                allocation_pools: pools,
                host_routes: req.host_routes.clone().unwrap_or_default(),
                dns_nameservers: req.dns_nameservers.clone().unwrap_or_default(),
                description: req.description.clone().unwrap_or_default(),
                service_types: req.service_types.clone().unwrap_or_default(),
                tags: req.tags.clone().unwrap_or_default(),
                created_at: t.clone(),
                updated_at: t,
                revision_number: 0,
            };
            let mut network = (*net.obj).clone();
            network.subnets.push(id.clone());
            network.revision_number += 1;
            let net_key = keys::resource("networks", network_id);
            let sub_key = keys::resource("subnets", &id);
            let mut txn = Txn {
                compares: vec![
                    Compare::ModRevision(net_key.clone(), net.mod_revision),
                    Compare::CreateRevision(sub_key.clone(), 0),
                ],
                ops: vec![
                    Op::Put(net_key, to_stored(&network)),
                    Op::Put(sub_key, to_stored(&subnet)),
                ],
            };
            if let Some(p) = &pool {
                // Re-writing the pool serializes carving: a concurrent carve fails its compare.
                let key = keys::resource("subnetpools", &p.obj.id);
                txn.compares
                    .push(Compare::ModRevision(key.clone(), p.mod_revision));
                txn.ops.push(Op::Put(key, to_stored(&*p.obj)));
            }
            Ok((txn, subnet))
        })
        .await?;
    Ok(answer_as(StatusCode::CREATED, "subnet", &subnet))
}

async fn delete_subnet(State(c): Ctl, Path(id): Path<String>) -> Result<StatusCode, NeutronError> {
    c
        .transact(|v| {
            let sub = lookup::<Subnet>(v, &id)?;
            if v.ips.get(id.as_str()).is_some_and(|s| !s.is_empty()) {
                return Err(NeutronError::conflict(
                    "SubnetInUse",
                    format!("Unable to complete operation on subnet {id}: One or more ports have an IP allocation from this subnet."),
                ));
            }
            let net_key = keys::resource("networks", &sub.obj.network_id);
            let mut txn = Txn {
                compares: vec![
                    Compare::PrefixEmpty(keys::ips_of(&id)),
                    Compare::ModRevision(keys::resource("subnets", &id), sub.mod_revision),
                ],
                ops: vec![Op::Delete(keys::resource("subnets", &id))],
            };
            if let Some(net) = v.networks.get(sub.obj.network_id.as_str()) {
                let mut network = (*net.obj).clone();
                network.subnets.retain(|s| *s != id);
                network.revision_number += 1;
                txn.compares
                    .push(Compare::ModRevision(net_key.clone(), net.mod_revision));
                txn.ops.push(Op::Put(net_key, to_stored(&network)));
            }
            Ok((txn, ()))
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn create_subnetpool(
    State(c): Ctl,
    headers: HeaderMap,
    b: Bytes,
) -> Result<Response, NeutronError> {
    let mut obj = SUBNET_POOL.object(&body(&b)?, Write::Create)?;
    let no_prefix = || NeutronError::bad_request("A subnetpool needs at least one prefix");
    if !obj.contains_key("prefixes") {
        return Err(no_prefix());
    }
    // Neutron's clients may send prefix lengths as strings, as Neutron shows them.
    for name in ["min_prefixlen", "max_prefixlen", "default_prefixlen"] {
        if let Some(Value::String(s)) = obj.get(name) {
            let len: u8 = s
                .parse()
                .map_err(|_| NeutronError::invalid_input(format!("{name} '{s}'")))?;
            obj.insert(name.into(), len.into());
        }
    }
    let req: SubnetPoolCreate = request(&obj, &["project_id", "tenant_id"])?;
    if req.prefixes.is_empty() {
        return Err(no_prefix());
    }
    let prefixes: Vec<IpNet> = req.prefixes.iter().map(IpNet::trunc).collect();
    let v4 = prefixes[0].addr().is_ipv4();
    if prefixes.iter().any(|p| p.addr().is_ipv4() != v4) {
        return Err(NeutronError::bad_request(
            "Cannot mix IPv4 and IPv6 prefixes in a subnet pool.",
        ));
    }
    let max_len = if v4 { 32 } else { 128 };
    let min_prefixlen = req
        .min_prefixlen
        .unwrap_or_else(|| prefixes.iter().map(IpNet::prefix_len).min().unwrap_or(8));
    let max_prefixlen = req.max_prefixlen.unwrap_or(max_len);
    let default_prefixlen = req.default_prefixlen.unwrap_or(min_prefixlen);
    if !(min_prefixlen <= default_prefixlen
        && default_prefixlen <= max_prefixlen
        && max_prefixlen <= max_len)
    {
        return Err(NeutronError::invalid_input(
            "prefix lengths must satisfy min_prefixlen <= default_prefixlen <= max_prefixlen",
        ));
    }
    let project = project_of(
        req.project_id.as_deref(),
        req.tenant_id.as_deref(),
        &headers,
    );
    let t = now();
    let pool = SubnetPool {
        id: req.id.unwrap_or_else(new_id),
        name: req.name.unwrap_or_default(),
        tenant_id: project.clone(),
        project_id: project,
        prefixes,
        default_prefixlen,
        min_prefixlen,
        max_prefixlen,
        ip_version: if v4 { 4 } else { 6 },
        is_default: req.is_default.unwrap_or(false),
        shared: req.shared.unwrap_or(false),
        description: req.description.unwrap_or_default(),
        tags: req.tags.unwrap_or_default(),
        created_at: t.clone(),
        updated_at: t,
        revision_number: 0,
    };
    let key = keys::resource("subnetpools", &pool.id);
    let txn = Txn {
        compares: vec![Compare::CreateRevision(key.clone(), 0)],
        ops: vec![Op::Put(key, to_stored(&pool))],
    };
    if c.commit(txn).await?.is_none() {
        return Err(NeutronError::conflict(
            "SubnetPoolExists",
            "A subnetpool with this id already exists.",
        ));
    }
    Ok(answer_as(StatusCode::CREATED, "subnetpool", &pool))
}

async fn delete_subnetpool(
    State(c): Ctl,
    Path(id): Path<String>,
) -> Result<StatusCode, NeutronError> {
    let entry = {
        let v = c.view();
        let entry = lookup::<SubnetPool>(&v, &id)?;
        if v.subnets
            .values()
            .any(|s| s.obj.subnetpool_id.as_deref() == Some(&id))
        {
            return Err(NeutronError::conflict(
                "SubnetPoolInUse",
                format!(
                    "Subnet pool {id} could not be deleted: subnets are still allocated from it."
                ),
            ));
        }
        entry
    };
    let key = keys::resource("subnetpools", &id);
    let txn = Txn {
        compares: vec![Compare::ModRevision(key.clone(), entry.mod_revision)],
        ops: vec![Op::Delete(key)],
    };
    match c.commit(txn).await? {
        Some(_) => Ok(StatusCode::NO_CONTENT),
        None => Err(NeutronError::busy()),
    }
}
