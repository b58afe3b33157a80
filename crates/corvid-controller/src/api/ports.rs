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
use corvid_api::{FixedIp, Network, Port, Status, Subnet};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::attributes::{
    Attribute, Attributes, Type, Write, ADMIN_STATE_UP, DESCRIPTION, NAME, NEUTRON,
};
use super::{
    answer, answer_as, attr, body, if_match, list, lookup, merge, project_of, show, show_route,
    to_stored, update_with, Ctl, Query,
};
use crate::controller::{Controller, Pending};
use crate::error::NeutronError;
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
                    let e = lookup::<Port>(&c.view(), &id)?;
                    Ok::<_, NeutronError>(answer(
                        StatusCode::OK,
                        json!({"port": mizar_port(&e.obj)}),
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
            .find_map(|(attr, vals)| v.port_index.lookup(attr, vals))
            .map(|ids| {
                ids.iter()
                    .filter_map(|id| v.ports.get(id).map(|e| e.obj.clone()))
                    .collect()
            })
    };
    list::<Port>(&c, q.as_deref(), candidates)
}

/// One requested address: a subnet, an address, or both.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct FixedIpRequest {
    subnet_id: Option<String>,
    ip_address: Option<IpAddr>,
}

/// A port about to be written, with the compares and ops that make it consistent.
pub(super) struct PortDraft {
    pub port: Port,
    pub txn: Txn,
}

fn mac_valid(mac: &str) -> bool {
    let parts: Vec<&str> = mac.split(':').collect();
    parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
        && u8::from_str_radix(parts[0], 16).is_ok_and(|b| b & 1 == 0)
}

fn subnets_of<'v>(v: &'v View, net: &Network) -> Vec<&'v Subnet> {
    net.subnets
        .iter()
        .filter_map(|s| v.subnets.get(s.as_str()).map(|e| &*e.obj))
        .collect()
}

/// Resolves one port request against the view; picks addresses and a MAC.
pub(super) fn draft_port(
    v: &View,
    pending: &mut Pending,
    obj: &Map<String, Value>,
    headers: &HeaderMap,
) -> Result<PortDraft, NeutronError> {
    let mut network_id: String =
        attr(obj, "network_id")?.ok_or_else(|| NeutronError::bad_request("Missing network_id"))?;
    let mut requests: Option<Vec<FixedIpRequest>> = attr(obj, "fixed_ips")?;
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
    let id: String = attr(obj, "id")?.unwrap_or_else(new_id);
    if v.ports.contains_key(id.as_str()) {
        return Err(NeutronError::conflict(
            "PortExists",
            format!("Port {id} already exists."),
        ));
    }
    let port_key = keys::resource("ports", &id);
    let mut txn = Txn {
        compares: vec![
            Compare::CreateRevision(keys::resource("networks", &network_id), net.create_revision),
            Compare::CreateRevision(port_key.clone(), 0),
        ],
        ops: Vec::new(),
    };
    let fixed_ips = assign_fixed_ips(v, pending, &net.obj, requests, &id, &[], &mut txn)?;
    let mac = match attr::<String>(obj, "mac_address")? {
        Some(m) => {
            let m = m.to_ascii_lowercase();
            if !mac_valid(&m) {
                return Err(NeutronError::invalid_input(format!(
                    "'{m}' is not a valid MAC address"
                )));
            }
            if v.macs.contains(&m) || !pending.reserve(keys::mac(&m)) {
                return Err(NeutronError::conflict(
                    "MacAddressInUse",
                    format!("Unable to complete operation for network {network_id}. The mac address {m} is in use."),
                ));
            }
            m
        }
        None => pending.pick_mac(&v.macs),
    };
    txn.compares
        .push(Compare::CreateRevision(keys::mac(&mac), 0));
    txn.ops
        .push(Op::Put(keys::mac(&mac), id.clone().into_bytes()));
    txn.ops
        .push(Op::Put(keys::network_user(&network_id, &id), Vec::new()));
    let project = project_of(obj, headers);
    let host: String = attr(obj, "binding:host_id")?.unwrap_or_default();
    let t = now();
    let port = Port {
        id: id.clone(),
        name: attr(obj, "name")?.unwrap_or_default(),
        network_id,
        tenant_id: project.clone(),
        project_id: project,
        mac_address: mac,
        admin_state_up: attr(obj, "admin_state_up")?.unwrap_or(true),
        status: Status::Down,
        device_id: attr(obj, "device_id")?.unwrap_or_default(),
        device_owner: attr(obj, "device_owner")?.unwrap_or_default(),
        fixed_ips,
        binding_vif_type: vif_type(&host).into(),
        binding_host_id: host,
        binding_profile: attr::<Value>(obj, "binding:profile")?
            .filter(|p| !p.is_null())
            .unwrap_or_else(|| json!({})),
        binding_vnic_type: attr(obj, "binding:vnic_type")?.unwrap_or_else(|| "normal".into()),
        binding_vif_details: json!({}),
        port_security_enabled: attr(obj, "port_security_enabled")?
            .unwrap_or(net.obj.port_security_enabled),
        security_groups: attr(obj, "security_groups")?.unwrap_or_default(),
        allowed_address_pairs: attr::<Vec<Value>>(obj, "allowed_address_pairs")?
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p.as_object().is_some_and(|o| !o.is_empty()))
            .collect(),
        extra_dhcp_opts: attr(obj, "extra_dhcp_opts")?.unwrap_or_default(),
        ip_allocation: "immediate".into(),
        description: attr(obj, "description")?.unwrap_or_default(),
        veth_name: attr(obj, "veth_name")?,
        network_ns: attr::<String>(obj, "network_ns")?.or(attr(obj, "veth_namespace")?),
        fast_path: attr(obj, "fast_path")?,
        tags: attr(obj, "tags")?.unwrap_or_default(),
        created_at: t.clone(),
        updated_at: t,
        revision_number: 1,
    };
    txn.ops.push(Op::Put(port_key, to_stored(&port)));
    Ok(PortDraft { port, txn })
}

/// Resolves requested addresses (`None`: Neutron's default, one address from the first
/// subnet of each IP version) into the port's fixed IPs on `net`, adding to `txn` the
/// compares and puts that take each new one for `owner`. An address in `held` (the port's
/// own, on an update) that is asked for again stays as it is; one not asked for again is
/// freed.
fn assign_fixed_ips(
    v: &View,
    pending: &mut Pending,
    net: &Network,
    requests: Option<Vec<FixedIpRequest>>,
    owner: &str,
    held: &[FixedIp],
    txn: &mut Txn,
) -> Result<Vec<FixedIp>, NeutronError> {
    let (network_id, subnets) = (&net.id, subnets_of(v, net));
    let requests = requests.unwrap_or_else(|| {
        let mut seen = HashSet::new();
        subnets
            .iter()
            .filter(|s| seen.insert(s.ip_version))
            .map(|s| FixedIpRequest {
                subnet_id: Some(s.id.clone()),
                ip_address: None,
            })
            .collect()
    });
    let mut fixed_ips: Vec<FixedIp> = Vec::new();
    for r in requests {
        let subnet = match (&r.subnet_id, r.ip_address) {
            (Some(s), _) => subnets.iter().find(|x| x.id == *s).copied().ok_or_else(|| {
                NeutronError::invalid_input(format!("Subnet {s} is not on network {network_id}"))
            })?,
            (None, Some(ip)) => subnets.iter().find(|x| x.cidr.contains(&ip)).copied().ok_or_else(|| {
                NeutronError::new(
                    StatusCode::BAD_REQUEST,
                    "InvalidIpForNetwork",
                    format!("IP address {ip} is not a valid IP for any of the subnets on the specified network."),
                )
            })?,
            (None, None) => return Err(NeutronError::invalid_input("fixed_ips entry needs subnet_id or ip_address")),
        };
        let taken = v.ips.get(&subnet.id);
        let ip = match r.ip_address {
            Some(ip) => {
                if !subnet.cidr.contains(&ip) {
                    return Err(NeutronError::new(
                        StatusCode::BAD_REQUEST,
                        "InvalidIpForSubnet",
                        format!("IP address {ip} is not a valid IP for the specified subnet."),
                    ));
                }
                let again = fixed_ips.iter().any(|f| f.ip_address == ip);
                if !again
                    && held
                        .iter()
                        .any(|h| h.subnet_id == subnet.id && h.ip_address == ip)
                {
                    fixed_ips.push(FixedIp {
                        subnet_id: subnet.id.clone(),
                        ip_address: ip,
                    });
                    continue;
                }
                if again
                    || taken.is_some_and(|t| t.contains(&ip))
                    || !pending.reserve(keys::ip(&subnet.id, ip))
                {
                    return Err(NeutronError::conflict(
                        "IpAddressAlreadyAllocated",
                        format!("IP address {ip} already allocated in subnet {}", subnet.id),
                    ));
                }
                ip
            }
            None => pending
                .pick_ip(subnet, |ip| !taken.is_some_and(|t| t.contains(&ip)))
                .ok_or_else(|| {
                    NeutronError::conflict(
                        "IpAddressGenerationFailure",
                        format!("No more IP addresses available on network {network_id}."),
                    )
                })?,
        };
        let key = keys::ip(&subnet.id, ip);
        txn.compares.push(Compare::CreateRevision(key.clone(), 0));
        txn.compares.push(Compare::CreateRevision(
            keys::resource("subnets", &subnet.id),
            v.subnets
                .get(subnet.id.as_str())
                .map_or(0, |e| e.create_revision),
        ));
        txn.ops.push(Op::Put(key, owner.as_bytes().to_vec()));
        fixed_ips.push(FixedIp {
            subnet_id: subnet.id.clone(),
            ip_address: ip,
        });
    }
    for h in held.iter().filter(|h| !fixed_ips.contains(h)) {
        txn.ops
            .push(Op::Delete(keys::ip(&h.subnet_id, h.ip_address)));
    }
    Ok(fixed_ips)
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
    let (ports, _pending) = c
        .transact(|view| {
            let mut pending = c.pending();
            let mut ports = Vec::new();
            let mut txn = Txn::default();
            for o in &objs {
                let draft = draft_port(view, &mut pending, o, &headers)?;
                txn.compares.extend(draft.txn.compares);
                txn.ops.extend(draft.txn.ops);
                ports.push(draft.port);
            }
            // Every port of a bulk checks its network and subnet: once is enough, and
            // etcd counts compares against --max-txn-ops.
            let mut seen = HashSet::new();
            txn.compares.retain(|c| seen.insert(c.clone()));
            Ok((txn, (ports, pending)))
        })
        .await?;
    Ok(if bulk {
        answer_as(StatusCode::CREATED, "ports", &ports)
    } else {
        answer_as(StatusCode::CREATED, "port", &ports[0])
    })
}

async fn update_port(
    State(c): Ctl,
    Path(id): Path<String>,
    headers: HeaderMap,
    b: Bytes,
) -> Result<Response, NeutronError> {
    let mut attrs = PORT.object(&body(&b)?, Write::Update)?;
    let requests: Option<Vec<FixedIpRequest>> = attr(&attrs, "fixed_ips")?;
    attrs.remove("fixed_ips");
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
        let old_mac = p.mac_address.clone();
        merge(p, &attrs)?;
        p.mac_address = p.mac_address.to_ascii_lowercase();
        if p.mac_address != old_mac {
            change_mac(v, p, &old_mac, &old_host, txn)?;
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
        Ok(())
    })
    .await?;
    Ok(answer_as(StatusCode::OK, "port", &port))
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

/// A new MAC, as Neutron allows it: valid, free, and only while the port is unbound
/// (a bound port's MAC is already in a datapath).
fn change_mac(
    v: &View,
    p: &Port,
    old_mac: &str,
    old_host: &str,
    txn: &mut Txn,
) -> Result<(), NeutronError> {
    let m = &p.mac_address;
    if !mac_valid(m) {
        return Err(NeutronError::invalid_input(format!(
            "'{m}' is not a valid MAC address"
        )));
    }
    if !old_host.is_empty() {
        return Err(NeutronError::conflict(
            "PortBound",
            format!("Unable to complete operation on port {}: the MAC address of a port bound to host {old_host} cannot change.", p.id),
        ));
    }
    if v.macs.contains(m) {
        return Err(NeutronError::conflict(
            "MacAddressInUse",
            format!(
                "Unable to complete operation for network {}. The mac address {m} is in use.",
                p.network_id
            ),
        ));
    }
    txn.compares.push(Compare::CreateRevision(keys::mac(m), 0));
    txn.ops
        .push(Op::Put(keys::mac(m), p.id.clone().into_bytes()));
    txn.ops.push(Op::Delete(keys::mac(old_mac)));
    Ok(())
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
    txn
}

/// Deletes a port with its addresses and MAC; floating IPs on it are disassociated.
pub async fn delete_port(c: &Controller, id: &str) -> Result<(), NeutronError> {
    c.transact(|v| {
        let e = lookup::<Port>(v, id)?;
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

#[cfg(test)]
mod tests {
    use super::mac_valid;

    #[test]
    fn macs_are_checked() {
        assert!(mac_valid("fa:16:3e:11:22:33"));
        assert!(!mac_valid("fa:16:3e:11:22"));
        assert!(!mac_valid("01:16:3e:11:22:33"), "multicast");
        assert!(!mac_valid("zz:16:3e:11:22:33"));
    }
}
