//! Ports: address and MAC allocation as one compare-and-swap transaction per request (a
//! bulk request is one transaction for all its ports), on both route shapes: Neutron's
//! `/v2.0/ports` and the Mizar-MP agreement's `/project/{project}/ports`.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use corvid_api::{
    FixedIp, Network, Port, PortCreate, PortUpdate, Status, Subnet, ROUTER_GATEWAY,
    ROUTER_INTERFACE,
};
use ipnet::IpNet;
use serde_json::{json, Map, Value};

use super::attributes::{
    Attribute, Attributes, Type, Write, ADMIN_STATE_UP, DESCRIPTION, NAME, NEUTRON,
};
use super::security_groups::{ensure_default, port_groups};
use super::{
    answer, answer_as, body, if_match, list, lookup, merge, project_of, read_at, request, show,
    show_route, to_stored, update_with, Ctl, Query,
};
use crate::controller::Controller;
use crate::error::NeutronError;
use crate::ipam::fixed_ips::{
    assign_fixed_ips, change_mac, is_auto_address, mac_valid, take_mac, FixedIpRequest,
};
use crate::ipam::Pending;
use crate::keys;
use crate::query::ListQuery;
use crate::store::{Compare, Op, Txn};
use crate::util::{new_id, now};
use crate::view::{Entry, View};

/// What a client may send of a port.
pub(super) const PORT: Attributes = Attributes {
    singular: "port",
    plural: "ports",
    common: &NEUTRON,
    own: &[
        Attribute::create("id", Type::Text),
        Attribute::create("network_id", Type::Text),
        NAME,
        DESCRIPTION,
        ADMIN_STATE_UP,
        Attribute::both("mac_address", Type::Text),
        Attribute::both("fixed_ips", Type::Pairs("subnet_id", "ip_address")),
        Attribute::both("device_id", Type::Text),
        Attribute::both("device_owner", Type::Text),
        Attribute::both("binding:host_id", Type::Text),
        Attribute::both("binding:profile", Type::Object),
        Attribute::both("binding:vnic_type", Type::Text),
        Attribute::both("port_security_enabled", Type::Bool),
        Attribute::both("security_groups", Type::Texts),
        Attribute::both("allowed_address_pairs", Type::Objects),
        Attribute::both("extra_dhcp_opts", Type::Objects),
        Attribute::update("status", Type::Status),
        Attribute::both("veth_name", Type::Text),
        Attribute::both("network_ns", Type::Text),
        Attribute::create("veth_namespace", Type::Text),
        Attribute::both("fast_path", Type::Bool),
        Attribute::create("dns_name", Type::Text),
        Attribute::create("dns_domain", Type::Text),
    ],
};

pub fn routes() -> Router<Arc<Controller>> {
    Router::new()
        .route("/v2.0/ports", get(list_ports).post(create_ports))
        .route(
            "/v2.0/ports/{id}",
            show_route::<Port>().put(update_port).delete(
                |State(c): Ctl, Path(id): Path<String>| async move {
                    delete_port(&c, &id).await.map(|_| StatusCode::NO_CONTENT)
                },
            ),
        )
        .route(
            "/project/{project}/ports",
            get(
                |State(c): Ctl, Path(p): Path<String>, Query(q)| async move {
                    let q = format!("project_id={p}&{}", q.unwrap_or_default());
                    list_ports(State(c), Query(Some(q))).await
                },
            )
            .post(
                |State(c): Ctl, Path(p): Path<String>, mut h: HeaderMap, b: Bytes| async move {
                    if let Ok(v) = p.parse() {
                        h.insert("X-Project-Id", v);
                    }
                    create_ports(State(c), h, b).await
                },
            ),
        )
        .route(
            "/project/{project}/ports/{id}",
            get(
                |State(c): Ctl, Path((_, id)): Path<(String, String)>| async move {
                    let (e, revision) = {
                        let v = c.view();
                        (lookup::<Port>(&v, &id)?, v.revision)
                    };
                    Ok::<_, NeutronError>(read_at(
                        answer(StatusCode::OK, json!({"port": mizar_port(&e.obj)})),
                        revision,
                    ))
                },
            )
            .delete(
                |State(c): Ctl, Path((_, id)): Path<(String, String)>| async move {
                    delete_port(&c, &id).await.map(|_| StatusCode::OK)
                },
            ),
        )
        .route(
            "/project/{project}/subnets/{id}",
            get(
                |State(c): Ctl, Path((_, id)): Path<(String, String)>| async move {
                    show::<Subnet>(&c, &id, None)
                },
            ),
        )
}

/// Mizar-MP agents wait for status `UP`: Neutron's ACTIVE under that name.
fn mizar_port(p: &Port) -> Value {
    let mut v = serde_json::to_value(p).unwrap_or(Value::Null);
    if p.status == Status::Active {
        v["status"] = json!("UP");
    }
    v
}

/// Lists ports, narrowing by an index first when a filter has one.
async fn list_ports(State(c): Ctl, Query(q): Query) -> Result<Response, NeutronError> {
    let parsed = ListQuery::parse(q.as_deref())?;
    let candidates = {
        let v = c.view();
        parsed
            .filters
            .iter()
            .find_map(|(attr, vals)| v.port_index.lookup(&v.ports, attr, vals))
            .map(|ids| {
                let ports = ids
                    .iter()
                    .filter_map(|id| v.ports.get(id).map(|e| e.obj.clone()))
                    .collect();
                (ports, v.revision)
            })
    };
    list::<Port>(&c, q.as_deref(), candidates)
}

/// The addresses a request asks for, in IPAM's terms.
fn fixed_ip_requests(asked: &[corvid_api::FixedIpRequest]) -> Vec<FixedIpRequest> {
    asked
        .iter()
        .map(|r| FixedIpRequest {
            subnet_id: r.subnet_id.clone(),
            ip_address: r.ip_address,
        })
        .collect()
}

/// The port attributes where Neutron takes `null` as an empty list.
const NULL_IS_EMPTY: [&str; 2] = ["security_groups", "allowed_address_pairs"];

/// `obj` with `null` as `[]` where Neutron reads it so.
fn nulls_as_empty(mut obj: Map<String, Value>) -> Map<String, Value> {
    for name in NULL_IS_EMPTY {
        if let Some(v) = obj.get_mut(name).filter(|v| v.is_null()) {
            *v = json!([]);
        }
    }
    obj
}

/// The port a create body's object asks for.
fn port_request(obj: &Map<String, Value>) -> Result<PortCreate, NeutronError> {
    if !obj.contains_key("network_id") {
        return Err(NeutronError::bad_request("Missing network_id"));
    }
    // The project and the DNS attributes (kept for Neutron's clients) take null as unset.
    request(
        &nulls_as_empty(obj.clone()),
        &["project_id", "tenant_id", "dns_name", "dns_domain"],
    )
}

/// Neutron's `max_allowed_address_pair`: the most allowed address pairs one port has.
const MAX_ADDRESS_PAIRS: usize = 10;

/// An allowed address pair as asked for: an address or a prefix in its canonical text,
/// and the MAC if one was given.
type AskedPair = (String, Option<String>);

/// Allowed address pairs checked as Neutron checks them. An empty object is dropped, as
/// the Mizar-MP plugin sends `[{}]` for none.
fn address_pairs(given: &[Value]) -> Result<Vec<AskedPair>, NeutronError> {
    let given: Vec<&Value> = given
        .iter()
        .filter(|p| !p.as_object().is_some_and(Map::is_empty))
        .collect();
    if given.len() > MAX_ADDRESS_PAIRS {
        return Err(NeutronError::new(
            StatusCode::BAD_REQUEST,
            "AllowedAddressPairExhausted",
            format!("The number of allowed address pair exceeds the maximum {MAX_ADDRESS_PAIRS}."),
        ));
    }
    let text = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_string);
    let mut pairs: Vec<AskedPair> = Vec::new();
    for pair in given {
        let Some(o) = pair.as_object() else {
            return Err(NeutronError::bad_request(format!(
                "Invalid input for allowed_address_pairs. Reason: '{}' is not a dictionary.",
                text(pair)
            )));
        };
        let mac = match o.get("mac_address") {
            Some(m) => match m.as_str().map(str::to_ascii_lowercase) {
                Some(m) if mac_valid(&m) => Some(m),
                _ => {
                    return Err(NeutronError::bad_request(format!(
                        "'{}' is not a valid MAC address",
                        text(m)
                    )))
                }
            },
            None => None,
        };
        let Some(ip) = o.get("ip_address") else {
            return Err(NeutronError::new(
                StatusCode::BAD_REQUEST,
                "AllowedAddressPairsMissingIP",
                "AllowedAddressPair must contain ip_address",
            ));
        };
        let ip = text(ip);
        let unknown: Vec<&str> = o
            .keys()
            .map(String::as_str)
            .filter(|k| !["mac_address", "ip_address"].contains(k))
            .collect();
        if !unknown.is_empty() {
            return Err(NeutronError::bad_request(format!(
                "Unrecognized attribute(s) '{}'",
                unknown.join(", ")
            )));
        }
        let canonical = if ip.contains('/') {
            ip.parse::<IpNet>().map(|n| n.to_string()).map_err(|_| {
                NeutronError::bad_request(format!("'{ip}' is not a valid IP subnet"))
            })?
        } else {
            ip.parse::<IpAddr>().map(|a| a.to_string()).map_err(|_| {
                NeutronError::bad_request(format!("'{ip}' is not a valid IP address"))
            })?
        };
        let pair = (canonical, mac);
        if pairs.contains(&pair) {
            return Err(NeutronError::new(
                StatusCode::BAD_REQUEST,
                "DuplicateAddressPairInRequest",
                format!(
                    "Request contains duplicate address pair: mac_address {} ip_address {ip}.",
                    pair.1.as_deref().unwrap_or("None")
                ),
            ));
        }
        pairs.push(pair);
    }
    Ok(pairs)
}

/// The pairs as a port stores them: each with a MAC, the port's when none was given.
fn stored_pairs(pairs: &[AskedPair], port_mac: &str) -> Vec<Value> {
    pairs
        .iter()
        .map(|(ip, mac)| json!({"ip_address": ip, "mac_address": mac.as_deref().unwrap_or(port_mac)}))
        .collect()
}

/// The network's own ports (a router's, DHCP's, a floating IP's) are trusted: Neutron gives
/// them no security groups.
fn trusted(device_owner: &str) -> bool {
    device_owner.starts_with("network:")
}

/// Neutron's 409 for allowed address pairs on a port without port security.
fn pairs_need_port_security() -> NeutronError {
    NeutronError::conflict(
        "AddressPairAndPortSecurityRequired",
        "Port Security must be enabled in order to have allowed address pairs on a port.",
    )
}

/// Neutron's 400 for security groups on a port without port security.
fn groups_need_port_security() -> NeutronError {
    NeutronError::new(
        StatusCode::BAD_REQUEST,
        "PortSecurityAndIPRequiredForSecurityGroups",
        "Port security must be enabled and port must have an IP address in order to use security groups.",
    )
}

/// Resolves one port request against the view; picks addresses and a MAC, and gives the
/// port its security groups (the project's default group, made if need be, when it names
/// none). Writes what makes it consistent into `txn`.
pub(super) fn draft_port(
    v: &View,
    pending: &mut Pending,
    req: &PortCreate,
    headers: &HeaderMap,
    txn: &mut Txn,
) -> Result<Port, NeutronError> {
    let pairs = address_pairs(req.allowed_address_pairs.as_deref().unwrap_or_default())?;
    let mut network_id = req.network_id.clone();
    let mut requests = req.fixed_ips.as_deref().map(fixed_ip_requests);
    // The Mizar-MP plugin sends its configured subnet as network_id.
    if !v.networks.contains_key(network_id.as_str()) {
        if let Some(s) = v.subnets.get(network_id.as_str()) {
            requests.get_or_insert_with(|| {
                vec![FixedIpRequest {
                    subnet_id: Some(s.obj.id.clone()),
                    ip_address: None,
                }]
            });
            network_id = s.obj.network_id.clone();
        }
    }
    let net = lookup::<Network>(v, &network_id)?;
    let id = req.id.clone().unwrap_or_else(new_id);
    if v.ports.contains_key(id.as_str()) {
        return Err(NeutronError::conflict(
            "PortExists",
            format!("Port {id} already exists."),
        ));
    }
    let port_key = keys::resource("ports", &id);
    txn.compares.extend([
        Compare::CreateRevision(keys::resource("networks", &network_id), net.create_revision),
        Compare::CreateRevision(port_key.clone(), 0),
    ]);
    let mac = take_mac(v, pending, req.mac_address.clone(), &network_id, &id, txn)?;
    let fixed_ips = assign_fixed_ips(v, pending, &net.obj, requests, &id, &mac, &[], txn)?;
    txn.ops
        .push(Op::Put(keys::network_user(&network_id, &id), Vec::new()));
    let project = project_of(req.project_id.as_deref(), req.tenant_id.as_deref(), headers);
    let device_owner = req.device_owner.clone().unwrap_or_default();
    let port_security = req
        .port_security_enabled
        .unwrap_or(net.obj.port_security_enabled);
    if !port_security && !pairs.is_empty() {
        return Err(pairs_need_port_security());
    }
    let named = req.security_groups.as_deref();
    let security_groups = if !port_security {
        if named.is_some_and(|g| !g.is_empty()) {
            return Err(groups_need_port_security());
        }
        Vec::new()
    } else if trusted(&device_owner) {
        Vec::new()
    } else {
        let default;
        let named = match named {
            Some(g) => g,
            None => {
                default = [ensure_default(v, &project, txn)];
                &default
            }
        };
        port_groups(v, named, txn)?
    };
    for g in &security_groups {
        txn.ops.push(Op::Put(keys::group_user(g, &id), Vec::new()));
    }
    let host = req.host_id.clone().unwrap_or_default();
    let t = now();
    let port = Port {
        id: id.clone(),
        name: req.name.clone().unwrap_or_default(),
        network_id,
        tenant_id: project.clone(),
        project_id: project,
        admin_state_up: req.admin_state_up.unwrap_or(true),
        status: Status::Down,
        device_id: req.device_id.clone().unwrap_or_default(),
        device_owner,
        fixed_ips,
        binding_vif_type: vif_type(&host).into(),
        binding_host_id: host,
        binding_profile: req.profile.clone().unwrap_or_else(|| json!({})),
        binding_vnic_type: req.vnic_type.clone().unwrap_or_else(|| "normal".into()),
        binding_vif_details: json!({}),
        port_security_enabled: port_security,
        security_groups,
        allowed_address_pairs: stored_pairs(&pairs, &mac),
        mac_address: mac,
        extra_dhcp_opts: req.extra_dhcp_opts.clone().unwrap_or_default(),
        ip_allocation: "immediate".into(),
        description: req.description.clone().unwrap_or_default(),
        veth_name: req.veth_name.clone(),
        network_ns: req
            .network_ns
            .clone()
            .or_else(|| req.veth_namespace.clone()),
        fast_path: req.fast_path,
        tags: req.tags.clone().unwrap_or_default(),
        created_at: t.clone(),
        updated_at: t,
        revision_number: 1,
    };
    txn.ops.push(Op::Put(port_key, to_stored(&port)));
    Ok(port)
}

fn vif_type(host: &str) -> &'static str {
    if host.is_empty() {
        "unbound"
    } else {
        "veth"
    }
}

/// POST of one port or `{"ports": [...]}`: all ports commit together or none does.
async fn create_ports(
    State(c): Ctl,
    headers: HeaderMap,
    b: Bytes,
) -> Result<Response, NeutronError> {
    let v = body(&b)?;
    let (bulk, objs) = PORT.objects(&v)?;
    let reqs = objs
        .iter()
        .map(port_request)
        .collect::<Result<Vec<_>, _>>()?;
    let named = reqs.iter().any(|r| r.id.is_some());
    let create = {
        let c = c.clone();
        async move { create_port_objects(&c, &reqs, &headers).await }
    };
    let ports = if named {
        c.create_named(create).await?
    } else {
        create.await?
    };
    Ok(if bulk {
        answer_as(StatusCode::CREATED, "ports", &ports)
    } else {
        answer_as(StatusCode::CREATED, "port", &ports[0])
    })
}

/// Drafts and commits the ports of one request, all or none.
async fn create_port_objects(
    c: &Controller,
    reqs: &[PortCreate],
    headers: &HeaderMap,
) -> Result<Vec<Port>, NeutronError> {
    let (ports, _pending) = c
        .transact(|view| {
            let mut pending = c.pending();
            let mut ports = Vec::new();
            let mut txn = Txn::default();
            for req in reqs {
                ports.push(draft_port(view, &mut pending, req, headers, &mut txn)?);
            }
            // Every port of a bulk checks its network and subnet: once is enough, and
            // etcd counts compares against --max-txn-ops.
            let mut seen = HashSet::new();
            txn.compares.retain(|c| seen.insert(c.clone()));
            Ok((txn, (ports, pending)))
        })
        .await?;
    Ok(ports)
}

async fn update_port(
    State(c): Ctl,
    Path(id): Path<String>,
    headers: HeaderMap,
    b: Bytes,
) -> Result<Response, NeutronError> {
    let mut attrs = PORT.object(&body(&b)?, Write::Update)?;
    // The addresses, security groups and address pairs are assigned rather than merged
    // into the port, which checks the rest of the attributes as they merge.
    let assigned: Map<String, Value> = ["fixed_ips", NULL_IS_EMPTY[0], NULL_IS_EMPTY[1]]
        .iter()
        .filter_map(|name| attrs.remove_entry(*name))
        .collect();
    let assigned = request::<PortUpdate>(&nulls_as_empty(assigned), &[])?;
    let requests = assigned.fixed_ips.as_deref().map(fixed_ip_requests);
    let pairs = assigned
        .allowed_address_pairs
        .as_deref()
        .map(address_pairs)
        .transpose()?;
    let groups = assigned.security_groups;
    if let Some(s) = attrs.get("status") {
        let all = Status::names();
        if !s.as_str().is_some_and(|s| all.contains(&s)) {
            return Err(NeutronError::invalid_input(format!(
                "'{s}' is not a port status ({})",
                all.join(", ")
            )));
        }
    }
    let port = update_with::<Port>(&c, &id, if_match(&headers), |v, p, txn| {
        let old_host = p.binding_host_id.clone();
        let was_secure = p.port_security_enabled;
        let old_mac = p.mac_address.clone();
        merge(p, &attrs)?;
        p.mac_address = p.mac_address.to_ascii_lowercase();
        let mut requests = requests.clone();
        if p.mac_address != old_mac {
            change_mac(v, p, &old_mac, &old_host, txn)?;
            // The addresses computed from the MAC follow it, as in Neutron.
            requests.get_or_insert_with(|| {
                p.fixed_ips
                    .iter()
                    .map(|f| FixedIpRequest {
                        subnet_id: Some(f.subnet_id.clone()),
                        ip_address: v
                            .subnets
                            .get(f.subnet_id.as_str())
                            .is_none_or(|s| !is_auto_address(&s.obj))
                            .then_some(f.ip_address),
                    })
                    .collect()
            });
        }
        if let Some(r) = &requests {
            let net = lookup::<Network>(v, &p.network_id)?;
            let mut pending = c.pending();
            let fixed_ips = assign_fixed_ips(
                v,
                &mut pending,
                &net.obj,
                Some(r.clone()),
                &p.id,
                &p.mac_address,
                &p.fixed_ips,
                txn,
            )?;
            check_floating_ips_kept(v, p, &fixed_ips)?;
            p.fixed_ips = fixed_ips;
        }
        if p.binding_host_id != old_host {
            p.binding_vif_type = vif_type(&p.binding_host_id).into();
            if !attrs.contains_key("status") {
                p.status = Status::Down;
            }
        }
        if p.binding_profile.is_null() {
            p.binding_profile = json!({});
        }
        secure(v, p, was_secure, groups.as_deref(), pairs.as_deref(), txn)
    })
    .await?;
    Ok(answer_as(StatusCode::OK, "port", &port))
}

/// Applies an update's security groups and address pairs (`None`: not in the update) to a
/// port whose port security the update has set, as Neutron does: a port without port
/// security can neither keep nor get either. What it keeps is checked only when the update
/// turns port security off, so that a port stored before these checks (off, and with
/// groups) still takes its agent's status reports.
fn secure(
    v: &View,
    p: &mut Port,
    was_secure: bool,
    groups: Option<&[String]>,
    pairs: Option<&[AskedPair]>,
    txn: &mut Txn,
) -> Result<(), NeutronError> {
    if !p.port_security_enabled {
        match pairs {
            Some(asked) if !asked.is_empty() => return Err(pairs_need_port_security()),
            None if was_secure && !p.allowed_address_pairs.is_empty() => {
                return Err(pairs_need_port_security())
            }
            _ => {}
        }
        match groups {
            Some(asked) if !asked.is_empty() => return Err(groups_need_port_security()),
            None if was_secure && !p.security_groups.is_empty() => {
                return Err(NeutronError::conflict(
                    "PortSecurityPortHasSecurityGroup",
                    "Port has security group associated. Cannot disable port security or IP address until security group is removed.",
                ))
            }
            _ => {}
        }
    }
    if let Some(pairs) = pairs {
        p.allowed_address_pairs = stored_pairs(pairs, &p.mac_address);
    }
    if let Some(asked) = groups {
        let now = if trusted(&p.device_owner) {
            Vec::new()
        } else {
            port_groups(v, asked, txn)?
        };
        for g in p.security_groups.iter().filter(|g| !now.contains(g)) {
            txn.ops.push(Op::Delete(keys::group_user(g, &p.id)));
        }
        for g in now.iter().filter(|g| !p.security_groups.contains(g)) {
            txn.ops
                .push(Op::Put(keys::group_user(g, &p.id), Vec::new()));
        }
        p.security_groups = now;
    }
    Ok(())
}

/// A port's address that a floating IP points at cannot go away under it.
fn check_floating_ips_kept(v: &View, p: &Port, kept: &[FixedIp]) -> Result<(), NeutronError> {
    let lost = v.floatingips.values().find_map(|f| {
        let ip = f.obj.fixed_ip_address?;
        (f.obj.port_id.as_deref() == Some(p.id.as_str())
            && !kept.iter().any(|k| k.ip_address == ip))
        .then(|| (f.obj.id.clone(), ip))
    });
    match lost {
        Some((fip, ip)) => Err(NeutronError::conflict(
            "IpAddressInUse",
            format!("Unable to complete operation for network {}. The IP address {ip} is in use by floating IP {fip}: disassociate it first.", p.network_id),
        )),
        None => Ok(()),
    }
}

/// The transaction removing a port with its addresses, MAC and network use.
pub(super) fn port_removal(e: &Entry<Port>) -> Txn {
    let p = &e.obj;
    let key = keys::resource("ports", &p.id);
    let mut txn = Txn {
        compares: vec![Compare::ModRevision(key.clone(), e.mod_revision)],
        ops: vec![
            Op::Delete(key),
            Op::Delete(keys::mac(&p.mac_address)),
            Op::Delete(keys::network_user(&p.network_id, &p.id)),
        ],
    };
    for f in &p.fixed_ips {
        txn.ops
            .push(Op::Delete(keys::ip(&f.subnet_id, f.ip_address)));
    }
    for g in &p.security_groups {
        txn.ops.push(Op::Delete(keys::group_user(g, &p.id)));
    }
    txn
}

/// Deletes a port with its addresses and MAC; floating IPs on it are disassociated.
pub async fn delete_port(c: &Controller, id: &str) -> Result<(), NeutronError> {
    c.transact_named(|v| {
        let e = lookup::<Port>(v, id)?;
        // A router's port goes with its interface or gateway, which the router changes.
        let owner = &e.obj.device_owner;
        if owner == ROUTER_INTERFACE || owner == ROUTER_GATEWAY {
            return Err(NeutronError::conflict(
                "L3PortInUse",
                format!("Port {id} cannot be deleted directly via the port API: has device owner {owner}."),
            ));
        }
        let mut txn = port_removal(&e);
        for fip in v
            .floatingips
            .values()
            .filter(|f| f.obj.port_id.as_deref() == Some(id))
        {
            let mut f = (*fip.obj).clone();
            f.port_id = None;
            f.fixed_ip_address = None;
            f.port_details = None;
            f.router_id = None;
            f.revision_number += 1;
            f.updated_at = now();
            let k = keys::resource("floatingips", &f.id);
            txn.compares
                .push(Compare::ModRevision(k.clone(), fip.mod_revision));
            txn.ops.push(Op::Put(k, to_stored(&f)));
        }
        Ok((txn, ()))
    })
    .await?;
    Ok(())
}
