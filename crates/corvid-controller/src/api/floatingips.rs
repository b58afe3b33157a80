//! Floating IPs: an address on an external network, optionally mapped to a port's address.

use std::net::IpAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Router;
use corvid_api::{
    FloatingIp, FloatingIpCreate, FloatingIpUpdate, Network, Port, PortDetails, Status,
};

use super::attributes::{Attribute, Attributes, Type, Write, DESCRIPTION, NEUTRON};
use super::{
    answer_as, body, if_match, list_route, lookup, project_of, request, show_route, to_stored,
    update_with, Ctl,
};
use crate::controller::Controller;
use crate::error::NeutronError;
use crate::keys;
use crate::store::{Compare, Op, Txn};
use crate::util::{new_id, now};
use crate::view::View;

/// What a client may send of a floating IP.
pub(super) const FLOATING_IP: Attributes = Attributes {
    singular: "floatingip",
    plural: "floatingips",
    common: &NEUTRON,
    own: &[
        Attribute::create("id", Type::Text),
        Attribute::create("floating_network_id", Type::Text),
        Attribute::both("port_id", Type::Text),
        Attribute::both("fixed_ip_address", Type::Text),
        Attribute::create("floating_ip_address", Type::Text),
        Attribute::create("subnet_id", Type::Text),
        DESCRIPTION,
    ],
};

pub fn routes() -> Router<Arc<Controller>> {
    Router::new()
        .route("/v2.0/floatingips", list_route::<FloatingIp>().post(create))
        .route(
            "/v2.0/floatingips/{id}",
            show_route::<FloatingIp>().put(update).delete(delete),
        )
}

/// Maps a floating IP to `port_id` (and one of its addresses), or unmaps it with `None`.
fn associate(
    v: &View,
    f: &mut FloatingIp,
    port_id: Option<String>,
    fixed: Option<IpAddr>,
) -> Result<(), NeutronError> {
    let Some(pid) = port_id else {
        f.port_id = None;
        f.fixed_ip_address = None;
        f.port_details = None;
        f.router_id = None;
        return Ok(());
    };
    let port: Arc<Port> = lookup::<Port>(v, &pid)?.obj;
    let addr = match fixed {
        Some(a) if port.fixed_ips.iter().any(|x| x.ip_address == a) => a,
        Some(a) => {
            return Err(NeutronError::bad_request(format!(
                "Bad floatingip request: Port {pid} does not have fixed ip {a}."
            )))
        }
        None => port
            .fixed_ips
            .iter()
            .map(|x| x.ip_address)
            .find(IpAddr::is_ipv4)
            .ok_or_else(|| {
                NeutronError::bad_request(format!(
                    "Bad floatingip request: Port {pid} has no IPv4 address."
                ))
            })?,
    };
    let subnet = port
        .fixed_ips
        .iter()
        .find(|x| x.ip_address == addr)
        .map(|x| x.subnet_id.clone())
        .unwrap_or_default();
    let Some(router) = super::routers::router_between(v, &subnet, &f.floating_network_id) else {
        return Err(NeutronError::new(
            StatusCode::NOT_FOUND,
            "ExternalGatewayForFloatingIPNotFound",
            format!(
                "External network {} is not reachable from subnet {subnet}.  Therefore, cannot associate Port {pid} with a Floating IP.",
                f.floating_network_id
            ),
        ));
    };
    if let Some(other) = v.floatingips.values().find(|o| {
        o.obj.id != f.id
            && o.obj.port_id.as_deref() == Some(pid.as_str())
            && o.obj.fixed_ip_address == Some(addr)
    }) {
        return Err(NeutronError::conflict(
            "FloatingIPPortAlreadyAssociated",
            format!("Cannot associate floating IP {} with port {pid} using fixed IP {addr}: floating IP {} already has it.", f.floating_ip_address, other.obj.id),
        ));
    }
    f.port_id = Some(pid);
    f.fixed_ip_address = Some(addr);
    f.router_id = Some(router);
    f.port_details = Some(PortDetails {
        name: port.name.clone(),
        network_id: port.network_id.clone(),
        mac_address: port.mac_address.clone(),
        admin_state_up: port.admin_state_up,
        status: port.status,
        device_id: port.device_id.clone(),
        device_owner: port.device_owner.clone(),
    });
    Ok(())
}

async fn create(State(c): Ctl, headers: HeaderMap, b: Bytes) -> Result<Response, NeutronError> {
    let obj = FLOATING_IP.object(&body(&b)?, Write::Create)?;
    if !obj.contains_key("floating_network_id") {
        return Err(NeutronError::bad_request("Missing floating_network_id"));
    }
    let req: FloatingIpCreate = request(&obj, &["project_id", "tenant_id", "subnet_id"])?;
    let (net_id, want) = (&req.floating_network_id, req.floating_ip_address);
    let id = req.id.clone().unwrap_or_else(new_id);
    let (fip, _pending) = c
        .transact(|v| {
            let mut pending = c.pending();
            if v.floatingips.contains_key(id.as_str()) {
                return Err(NeutronError::conflict(
                    "FloatingIPExists",
                    format!("Floating IP {id} already exists."),
                ));
            }
            let net = lookup::<Network>(v, net_id)?;
            if !net.obj.router_external {
                return Err(NeutronError::bad_request(format!(
                    "Bad floatingip request: Network {net_id} is not a valid external network."
                )));
            }
            let mut found = None;
            for s in net
                .obj
                .subnets
                .iter()
                .filter_map(|s| v.subnets.get(s.as_str()))
            {
                let taken = v.ips.get(s.obj.id.as_str());
                let free = |ip: IpAddr| !taken.is_some_and(|t| t.contains(&ip));
                let ip = match want {
                    Some(ip) if s.obj.cidr.contains(&ip) => {
                        if !free(ip) || !pending.reserve(keys::ip(&s.obj.id, ip)) {
                            return Err(NeutronError::conflict(
                                "IpAddressAlreadyAllocated",
                                format!("IP address {ip} already allocated in subnet {}", s.obj.id),
                            ));
                        }
                        Some(ip)
                    }
                    Some(_) => None,
                    None if s.obj.ip_version == 4 => pending.pick_ip(&s.obj, free),
                    None => None,
                };
                if let Some(ip) = ip {
                    found = Some((s.obj.id.clone(), s.create_revision, ip));
                    break;
                }
            }
            let (subnet_id, subnet_revision, ip) = found.ok_or_else(|| {
                NeutronError::conflict(
                    "IpAddressGenerationFailure",
                    format!("No more IP addresses available on network {net_id}."),
                )
            })?;
            let project = project_of(
                req.project_id.as_deref(),
                req.tenant_id.as_deref(),
                &headers,
            );
            let t = now();
            let mut fip = FloatingIp {
                id: id.clone(),
                tenant_id: project.clone(),
                project_id: project,
                floating_ip_address: ip,
                floating_network_id: net_id.clone(),
                router_id: None,
                port_id: None,
                fixed_ip_address: None,
                status: Status::Down,
                description: req.description.clone().unwrap_or_default(),
                port_details: None,
                tags: req.tags.clone().unwrap_or_default(),
                created_at: t.clone(),
                updated_at: t,
                revision_number: 0,
            };
            associate(v, &mut fip, req.port_id.clone(), req.fixed_ip_address)?;
            let ip_key = keys::ip(&subnet_id, ip);
            let txn = Txn {
                compares: vec![
                    Compare::CreateRevision(
                        keys::resource("networks", net_id),
                        net.create_revision,
                    ),
                    Compare::CreateRevision(ip_key.clone(), 0),
                    // As a port's address does: a subnet deleted meanwhile takes the
                    // address's home with it, and the view would count it nowhere.
                    Compare::CreateRevision(keys::resource("subnets", &subnet_id), subnet_revision),
                ],
                ops: vec![
                    Op::Put(ip_key, id.clone().into_bytes()),
                    Op::Put(keys::network_user(net_id, &id), Vec::new()),
                    Op::Put(keys::resource("floatingips", &id), to_stored(&fip)),
                ],
            };
            Ok((txn, (fip, pending)))
        })
        .await?;
    Ok(answer_as(StatusCode::CREATED, "floatingip", &fip))
}

async fn update(
    State(c): Ctl,
    Path(id): Path<String>,
    headers: HeaderMap,
    b: Bytes,
) -> Result<Response, NeutronError> {
    let attrs = FLOATING_IP.object(&body(&b)?, Write::Update)?;
    // `port_id: null` unmaps the floating IP.
    let req: FloatingIpUpdate = request(&attrs, &["port_id", "fixed_ip_address"])?;
    let fip = update_with::<FloatingIp>(&c, &id, if_match(&headers), |v, f, _| {
        if let Some(port_id) = &req.port_id {
            associate(v, f, port_id.clone(), req.fixed_ip_address.flatten())?;
        }
        if let Some(d) = &req.description {
            f.description = d.clone();
        }
        Ok(())
    })
    .await?;
    Ok(answer_as(StatusCode::OK, "floatingip", &fip))
}

async fn delete(State(c): Ctl, Path(id): Path<String>) -> Result<StatusCode, NeutronError> {
    c.transact(|v| {
        let e = lookup::<FloatingIp>(v, &id)?;
        let f = &e.obj;
        let subnet = v
            .subnets
            .values()
            .find(|s| {
                s.obj.network_id == f.floating_network_id
                    && s.obj.cidr.contains(&f.floating_ip_address)
            })
            .map(|s| s.obj.id.clone())
            .unwrap_or_default();
        let key = keys::resource("floatingips", &id);
        let txn = Txn {
            compares: vec![Compare::ModRevision(key.clone(), e.mod_revision)],
            ops: vec![
                Op::Delete(key),
                Op::Delete(keys::ip(&subnet, f.floating_ip_address)),
                Op::Delete(keys::network_user(&f.floating_network_id, &id)),
            ],
        };
        Ok((txn, ()))
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}
