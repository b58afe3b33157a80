//! Routers in Neutron's L3 shape: a router joins subnets through interface ports that
//! hold each subnet's gateway address (`network:router_interface`), and leaves through a
//! gateway port on an external network (`network:router_gateway`). Every change to a
//! router's ports is one transaction with the router itself, whose revision it bumps: a
//! delete racing an interface add sees the interface, and a controller killed mid-add
//! leaves either both or neither.

use std::collections::HashSet;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::put;
use axum::Router as Routes;
use corvid_api::{
    ExternalGatewayInfo, FixedIpRequest, GatewayRequest, HostRoute, Network, Port, PortCreate,
    Router, RouterCreate, RouterInterface, RouterUpdate, Status, Subnet, ROUTER_GATEWAY,
    ROUTER_INTERFACE,
};
use ipnet::IpNet;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::attributes::{
    Attribute, Attributes, Type, Write, ADMIN_STATE_UP, DESCRIPTION, NAME, NEUTRON,
};
use super::ports::{draft_port, port_removal};
use super::{
    answer, answer_as, body, if_match, list_route, lookup, project_of, request, show_route,
    to_stored, update_with, Ctl,
};
use crate::controller::Controller;
use crate::error::NeutronError;
use crate::ipam::Pending;
use crate::keys;
use crate::store::{Compare, Op, Txn};
use crate::util::{new_id, now};
use crate::view::{Entry, View};

/// What a client may send of a router. `routes` only on update, as Neutron's extraroute
/// extension takes them.
pub(super) const ROUTER: Attributes = Attributes {
    singular: "router",
    plural: "routers",
    common: &NEUTRON,
    own: &[
        Attribute::create("id", Type::Text),
        NAME,
        DESCRIPTION,
        ADMIN_STATE_UP,
        Attribute::both("external_gateway_info", Type::Object),
        Attribute::update("routes", Type::Pairs("destination", "nexthop")),
    ],
};

/// Neutron's `max_routes`: the extra routes one router may have.
const MAX_ROUTES: usize = 30;

pub fn routes() -> Routes<Arc<Controller>> {
    Routes::new()
        .route("/v2.0/routers", list_route::<Router>().post(create))
        .route(
            "/v2.0/routers/{id}",
            show_route::<Router>().put(update).delete(delete),
        )
        .route(
            "/v2.0/routers/{id}/add_router_interface",
            put(
                |State(c): Ctl, Path(id): Path<String>, b: Bytes| async move {
                    add_interface(&c, &id, &b).await
                },
            ),
        )
        .route(
            "/v2.0/routers/{id}/add_extraroutes",
            put(
                |State(c): Ctl, Path(id): Path<String>, b: Bytes| async move {
                    extra_routes(&c, &id, &b, true).await
                },
            ),
        )
        .route(
            "/v2.0/routers/{id}/remove_extraroutes",
            put(
                |State(c): Ctl, Path(id): Path<String>, b: Bytes| async move {
                    extra_routes(&c, &id, &b, false).await
                },
            ),
        )
        .route(
            "/v2.0/routers/{id}/remove_router_interface",
            put(
                |State(c): Ctl, Path(id): Path<String>, b: Bytes| async move {
                    remove_interface(&c, &id, &b).await
                },
            ),
        )
}

/// Neutron's 400 for a router request.
fn bad(msg: impl std::fmt::Display) -> NeutronError {
    NeutronError::bad_request(format!("Bad router request: {msg}."))
}

/// The router's interface ports.
fn interfaces(v: &View, router: &str) -> Vec<Entry<Port>> {
    ports_of(v, router, ROUTER_INTERFACE)
}

/// The router that takes `subnet` to `external_network`: one with an interface on the
/// subnet and its gateway on that network, as a floating IP there needs.
pub fn router_between(v: &View, subnet: &str, external_network: &str) -> Option<String> {
    v.routers
        .values()
        .filter(|r| {
            r.obj
                .external_gateway_info
                .as_ref()
                .is_some_and(|g| g.network_id == external_network)
        })
        .find(|r| {
            interfaces(v, &r.obj.id)
                .iter()
                .any(|p| p.obj.fixed_ips.iter().any(|ip| ip.subnet_id == subnet))
        })
        .map(|r| r.obj.id.clone())
}

/// The subnets of the fixed addresses the floating IPs through `router` map to.
fn floating_ips_through<'a>(v: &'a View, router: &'a str) -> impl Iterator<Item = &'a str> {
    v.floatingips
        .values()
        .filter(move |f| f.obj.router_id.as_deref() == Some(router))
        .filter_map(|f| {
            let port = v.ports.get(f.obj.port_id.as_deref()?)?;
            let ip = f.obj.fixed_ip_address?;
            port.obj
                .fixed_ips
                .iter()
                .find(|x| x.ip_address == ip)
                .map(|x| &*x.subnet_id)
        })
}

/// The router's ports with `owner`, through the device index.
fn ports_of(v: &View, router: &str, owner: &str) -> Vec<Entry<Port>> {
    v.port_index
        .lookup(&v.ports, "device_id", &[router.to_string()])
        .unwrap_or_default()
        .iter()
        .filter_map(|id| v.ports.get(&**id))
        .filter(|e| &*e.obj.device_owner == owner)
        .map(Entry::expand)
        .collect()
}

/// The subnets of the router's interfaces.
fn routed_subnets(v: &View, router: &str) -> Vec<Arc<Subnet>> {
    interfaces(v, router)
        .iter()
        .flat_map(|p| p.obj.fixed_ips.clone())
        .filter_map(|f| v.subnets.get(f.subnet_id.as_str()).map(|s| s.obj.clone()))
        .collect()
}

/// Drafts the gateway port of `router` on the external network `want` names, into `txn`;
/// returns the gateway as the router shows it.
fn draft_gateway(
    v: &View,
    pending: &mut Pending,
    router: &str,
    project: &str,
    want: &GatewayRequest,
    txn: &mut Txn,
) -> Result<ExternalGatewayInfo, NeutronError> {
    let net = lookup::<Network>(v, &want.network_id)?;
    if !net.obj.router_external {
        return Err(bad(format!(
            "Network {} is not an external network",
            want.network_id
        )));
    }
    let port = PortCreate {
        network_id: want.network_id.clone(),
        device_owner: Some(ROUTER_GATEWAY.into()),
        device_id: Some(router.into()),
        project_id: Some(project.into()),
        fixed_ips: want.external_fixed_ips.clone(),
        ..Default::default()
    };
    let port = draft_port(v, pending, &port, &HeaderMap::new(), txn)?;
    Ok(ExternalGatewayInfo {
        network_id: want.network_id.clone(),
        enable_snat: want.enable_snat.unwrap_or(true),
        external_fixed_ips: port.fixed_ips,
    })
}

/// Checks extra routes as Neutron does: each next hop on one of the router's subnets, and
/// none of the router's own addresses.
fn check_routes(v: &View, router: &str, routes: &[HostRoute]) -> Result<(), NeutronError> {
    if routes.len() > MAX_ROUTES {
        return Err(NeutronError::new(
            StatusCode::BAD_REQUEST,
            "RoutesExhausted",
            format!(
                "Unable to complete operation for {router}. The number of routes exceeds the maximum {MAX_ROUTES}."
            ),
        ));
    }
    let subnets = routed_subnets(v, router);
    let own: HashSet<_> = interfaces(v, router)
        .iter()
        .flat_map(|p| {
            p.obj
                .fixed_ips
                .iter()
                .map(|f| f.ip_address)
                .collect::<Vec<_>>()
        })
        .collect();
    for r in routes {
        let reason = if own.contains(&r.nexthop) {
            "the nexthop is used by router"
        } else if !subnets.iter().any(|s| s.cidr.contains(&r.nexthop)) {
            "the nexthop is not connected with router"
        } else {
            continue;
        };
        return Err(NeutronError::new(
            StatusCode::BAD_REQUEST,
            "InvalidRoutes",
            format!(
                "Invalid format for routes: {}, {reason}",
                json!([{"destination": r.destination, "nexthop": r.nexthop}])
            ),
        ));
    }
    Ok(())
}

/// The create or update request of a body's object. Neutron's clients remove a gateway
/// with `{}` as well as with `null`, a gateway that does not fit is refused in Neutron's
/// words for it, and a project sent as `null` is none named.
fn router_request<T: DeserializeOwned>(mut obj: Map<String, Value>) -> Result<T, NeutronError> {
    if let Some(gateway) = obj.get_mut("external_gateway_info") {
        if gateway.as_object().is_some_and(Map::is_empty) {
            *gateway = Value::Null;
        } else if !gateway.is_null() {
            GatewayRequest::deserialize(&*gateway).map_err(|e| {
                NeutronError::invalid_input(format!(
                    "Invalid input for external_gateway_info. Reason: {e}."
                ))
            })?;
        }
    }
    request(&obj, &["external_gateway_info", "project_id", "tenant_id"])
}

async fn create(State(c): Ctl, headers: HeaderMap, b: Bytes) -> Result<Response, NeutronError> {
    let req: RouterCreate = router_request(ROUTER.object(&body(&b)?, Write::Create)?)?;
    let id = req.id.clone().unwrap_or_else(new_id);
    let gateway = &req.external_gateway_info;
    let project = project_of(
        req.project_id.as_deref(),
        req.tenant_id.as_deref(),
        &headers,
    );
    let (router, _pending) = c
        .transact(|v| {
            let mut pending = c.pending();
            if v.routers.contains_key(id.as_str()) {
                return Err(NeutronError::conflict(
                    "RouterExists",
                    format!("Router {id} already exists."),
                ));
            }
            let key = keys::resource("routers", &id);
            let mut txn = Txn {
                compares: vec![Compare::CreateRevision(key.clone(), 0)],
                ops: Vec::new(),
            };
            let external_gateway_info = match gateway {
                Some(g) => Some(draft_gateway(v, &mut pending, &id, &project, g, &mut txn)?),
                None => None,
            };
            let t = now();
            let router = Router {
                id: id.clone(),
                name: req.name.clone().unwrap_or_default(),
                tenant_id: project.clone(),
                project_id: project.clone(),
                admin_state_up: req.admin_state_up.unwrap_or(true),
                status: Status::Active,
                external_gateway_info,
                routes: Vec::new(),
                description: req.description.clone().unwrap_or_default(),
                distributed: true,
                ha: false,
                tags: req.tags.clone().unwrap_or_default(),
                created_at: t.clone(),
                updated_at: t,
                revision_number: 1,
            };
            txn.ops.push(Op::Put(key, to_stored(&router)));
            Ok((txn, (router, pending)))
        })
        .await?;
    Ok(answer_as(StatusCode::CREATED, "router", &router))
}

async fn update(
    State(c): Ctl,
    Path(id): Path<String>,
    headers: HeaderMap,
    b: Bytes,
) -> Result<Response, NeutronError> {
    let req: RouterUpdate = router_request(ROUTER.object(&body(&b)?, Write::Update)?)?;
    let router = update_with::<Router>(&c, &id, if_match(&headers), |v, r, txn| {
        if let Some(n) = &req.name {
            r.name = n.clone();
        }
        if let Some(d) = &req.description {
            r.description = d.clone();
        }
        if let Some(a) = req.admin_state_up {
            r.admin_state_up = a;
        }
        if let Some(routes) = &req.routes {
            check_routes(v, &r.id, routes)?;
            r.routes = routes.clone();
        }
        if let Some(want) = &req.external_gateway_info {
            set_gateway(v, &mut c.pending(), r, want.as_ref(), txn)?;
        }
        Ok(())
    })
    .await?;
    Ok(answer_as(StatusCode::OK, "router", &router))
}

/// Sets, changes or (with `None`) removes the router's gateway: a new external network,
/// or new addresses, replace the gateway port; the same network only changes SNAT.
fn set_gateway(
    v: &View,
    pending: &mut Pending,
    r: &mut Router,
    want: Option<&GatewayRequest>,
    txn: &mut Txn,
) -> Result<(), NeutronError> {
    let same = match (&r.external_gateway_info, want) {
        (Some(have), Some(w)) => have.network_id == w.network_id && w.external_fixed_ips.is_none(),
        _ => false,
    };
    if same {
        if let (Some(have), Some(w)) = (&mut r.external_gateway_info, want) {
            have.enable_snat = w.enable_snat.unwrap_or(true);
        }
        return Ok(());
    }
    let leaving = r
        .external_gateway_info
        .as_ref()
        .map(|g| g.network_id.clone());
    let kept = want.map(|w| w.network_id.clone());
    if let Some(net) = leaving.filter(|n| Some(n) != kept.as_ref()) {
        if floating_ips_through(v, &r.id).next().is_some() {
            return Err(NeutronError::conflict(
                "RouterExternalGatewayInUseByFloatingIp",
                format!(
                    "Gateway cannot be updated for router {}, since a gateway to external network {net} is required by one or more floating IPs.",
                    r.id
                ),
            ));
        }
    }
    for old in ports_of(v, &r.id, ROUTER_GATEWAY) {
        let removal = port_removal(&old);
        txn.compares.extend(removal.compares);
        txn.ops.extend(removal.ops);
    }
    r.external_gateway_info = match want {
        Some(w) => Some(draft_gateway(v, pending, &r.id, &r.project_id, w, txn)?),
        None => None,
    };
    Ok(())
}

async fn delete(State(c): Ctl, Path(id): Path<String>) -> Result<StatusCode, NeutronError> {
    c.transact_named(|v| {
        let e = lookup::<Router>(v, &id)?;
        if !interfaces(v, &id).is_empty() {
            return Err(NeutronError::conflict(
                "RouterInUse",
                format!("Router {id} still has ports"),
            ));
        }
        let key = keys::resource("routers", &id);
        let mut txn = Txn {
            compares: vec![Compare::ModRevision(key.clone(), e.mod_revision)],
            ops: vec![Op::Delete(key)],
        };
        for gw in ports_of(v, &id, ROUTER_GATEWAY) {
            let removal = port_removal(&gw);
            txn.compares.extend(removal.compares);
            txn.ops.extend(removal.ops);
        }
        Ok((txn, ()))
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `add_extraroutes` and `remove_extraroutes` (Neutron's extraroute-atomic): the routes
/// given join the router's, or leave them, in one compare-and-swap.
async fn extra_routes(
    c: &Controller,
    id: &str,
    b: &Bytes,
    add: bool,
) -> Result<Response, NeutronError> {
    let v = body(b)?;
    let given: Vec<HostRoute> = v
        .get("router")
        .and_then(|r| r.get("routes"))
        .map(|r| serde_json::from_value(r.clone()))
        .transpose()
        .map_err(|e| {
            NeutronError::invalid_input(format!("Invalid input for routes. Reason: {e}."))
        })?
        .ok_or_else(|| bad("Resource body required: expected {\"router\": {\"routes\": [...]}}"))?;
    let router = update_with::<Router>(c, id, None, |v, r, _| {
        let mut routes = r.routes.clone();
        if add {
            routes.extend(given.iter().filter(|g| !r.routes.contains(g)).cloned());
        } else {
            routes.retain(|have| !given.contains(have));
        }
        check_routes(v, &r.id, &routes)?;
        r.routes = routes;
        Ok(())
    })
    .await?;
    Ok(answer_as(StatusCode::OK, "router", &router))
}

/// What an interface call names.
enum Which {
    /// A subnet: the router takes its gateway address.
    Subnet(String),
    /// A port, which becomes the router's.
    Port(String),
}

/// The body of an interface call: a subnet or a port, not both, nothing else.
fn interface_of(b: &Bytes) -> Result<Which, NeutronError> {
    let asked: RouterInterface = serde_json::from_value(body(b)?).map_err(bad)?;
    match (asked.subnet_id, asked.port_id) {
        (None, None) => Err(bad("Either subnet_id or port_id must be specified")),
        (Some(_), Some(_)) => Err(bad("Cannot specify both subnet-id and port-id")),
        (Some(s), None) => Ok(Which::Subnet(s)),
        (None, Some(p)) => Ok(Which::Port(p)),
    }
}

/// What Neutron answers an interface call with.
fn interface_info(r: &Router, port: &Port) -> Value {
    let subnets: Vec<&str> = port
        .fixed_ips
        .iter()
        .map(|f| f.subnet_id.as_str())
        .collect();
    json!({
        "id": r.id, "tenant_id": r.tenant_id, "project_id": r.project_id,
        "port_id": port.id, "network_id": port.network_id,
        "subnet_id": subnets.first(), "subnet_ids": subnets, "tags": [],
    })
}

/// Refuses a subnet the router has already, or one overlapping one of its subnets.
fn check_new_subnet(v: &View, router: &str, s: &Subnet) -> Result<(), NeutronError> {
    for have in routed_subnets(v, router) {
        if have.id == s.id {
            return Err(bad(format!("Router already has a port on subnet {}", s.id)));
        }
        if overlap(&have.cidr, &s.cidr) {
            return Err(bad(format!(
                "Cidr {} of subnet {} overlaps with cidr {} of subnet {}",
                s.cidr, s.id, have.cidr, have.id
            )));
        }
    }
    Ok(())
}

fn overlap(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

async fn add_interface(c: &Controller, id: &str, b: &Bytes) -> Result<Response, NeutronError> {
    let which = interface_of(b)?;
    let mut added = None;
    let router = update_with::<Router>(c, id, None, |v, r, txn| {
        let port = match &which {
            Which::Subnet(sid) => {
                let s = lookup::<Subnet>(v, sid)?.obj;
                let gw = s.gateway_ip.ok_or_else(|| {
                    bad("Subnet for router interface must have a gateway IP")
                })?;
                check_new_subnet(v, &r.id, &s)?;
                let interface = PortCreate {
                    network_id: s.network_id.clone(),
                    fixed_ips: Some(vec![FixedIpRequest {
                        subnet_id: Some(s.id.clone()),
                        ip_address: Some(gw),
                    }]),
                    device_owner: Some(ROUTER_INTERFACE.into()),
                    device_id: Some(r.id.clone()),
                    project_id: Some(r.project_id.clone()),
                    ..Default::default()
                };
                draft_port(v, &mut c.pending(), &interface, &HeaderMap::new(), txn)?
            }
            Which::Port(pid) => {
                let e = lookup::<Port>(v, pid)?;
                let mut port = (*e.obj).clone();
                if !port.device_id.is_empty() || !port.device_owner.is_empty() {
                    return Err(NeutronError::conflict(
                        "PortInUse",
                        format!(
                            "Unable to complete operation on port {pid} for network {}. Port already has an attached device {}.",
                            port.network_id, port.device_id
                        ),
                    ));
                }
                if port.fixed_ips.is_empty() {
                    return Err(bad("Router port must have at least one fixed IP"));
                }
                for f in &port.fixed_ips {
                    let s = lookup::<Subnet>(v, &f.subnet_id)?.obj;
                    check_new_subnet(v, &r.id, &s)?;
                }
                port.device_id = r.id.clone();
                port.device_owner = ROUTER_INTERFACE.into();
                port.revision_number += 1;
                port.updated_at = now();
                let key = keys::resource("ports", pid);
                txn.compares.push(Compare::ModRevision(key.clone(), e.mod_revision));
                txn.ops.push(Op::Put(key, to_stored(&port)));
                port
            }
        };
        added = Some(port);
        Ok(())
    })
    .await?;
    let port = added.expect("a committed change drafted its port");
    Ok(answer(StatusCode::OK, interface_info(&router, &port)))
}

async fn remove_interface(c: &Controller, id: &str, b: &Bytes) -> Result<Response, NeutronError> {
    let which = interface_of(b)?;
    let mut removed = None;
    let router = update_with::<Router>(c, id, None, |v, r, txn| {
        let ports = interfaces(v, &r.id);
        let found = match &which {
            Which::Port(pid) => ports.iter().find(|p| p.obj.id == *pid).ok_or_else(|| {
                NeutronError::new(
                    StatusCode::NOT_FOUND,
                    "RouterInterfaceNotFound",
                    format!("Router {} does not have an interface with id {pid}", r.id),
                )
            })?,
            Which::Subnet(sid) => ports
                .iter()
                .find(|p| p.obj.fixed_ips.iter().any(|f| f.subnet_id == *sid))
                .ok_or_else(|| {
                    NeutronError::new(
                        StatusCode::NOT_FOUND,
                        "RouterInterfaceNotFoundForSubnet",
                        format!("Router {} has no interface on subnet {sid}", r.id),
                    )
                })?,
        };
        let leaving: Vec<&Subnet> = found
            .obj
            .fixed_ips
            .iter()
            .filter_map(|f| v.subnets.get(f.subnet_id.as_str()).map(|s| &*s.obj))
            .collect();
        for s in &leaving {
            if r.routes.iter().any(|route| s.cidr.contains(&route.nexthop)) {
                return Err(NeutronError::conflict(
                    "RouterInterfaceInUseByRoute",
                    format!(
                        "Router interface for subnet {} on router {} cannot be deleted, as it is required by one or more routes.",
                        s.id, r.id
                    ),
                ));
            }
            if floating_ips_through(v, &r.id).any(|subnet| subnet == s.id) {
                return Err(NeutronError::conflict(
                    "RouterInterfaceInUseByFloatingIP",
                    format!(
                        "Router interface for subnet {} on router {} cannot be deleted, as it is required by one or more floating IPs.",
                        s.id, r.id
                    ),
                ));
            }
        }
        let removal = port_removal(found);
        txn.compares.extend(removal.compares);
        txn.ops.extend(removal.ops);
        removed = Some((*found.obj).clone());
        Ok(())
    })
    .await?;
    let port = removed.expect("a committed change found its port");
    Ok(answer(StatusCode::OK, interface_info(&router, &port)))
}
