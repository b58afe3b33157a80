//! Load balancers in Octavia v2's shape (`/v2/lbaas/...`): the model and API; the agent
//! programs the datapath. Objects are kept as JSON; parent/child lists (`listeners`,
//! `pools`, `members`) are derived from the children when read, so no write ever has to
//! update two objects to stay consistent.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use corvid_api::{FixedIpRequest, LoadBalancerCreate, PortCreate};
use serde_json::{json, Map, Value};

use super::attributes::{
    Attribute, Attributes, Type, Write, ADMIN_STATE_UP, DESCRIPTION, NAME, PROJECT_ID, TENANT_ID,
};
use super::ports::{draft_port, port_removal};
use super::{answer, answer_as, body, project_of, read_at, request, to_stored, Ctl, Query};
use crate::controller::Controller;
use crate::error::NeutronError;
use crate::keys;
use crate::query::ListQuery;
use crate::store::{Compare, Op, Txn};
use crate::util::{new_id, now};
use crate::view::View;

/// One Octavia collection.
pub(super) struct Spec {
    title: &'static str,
    /// What a client may send; a create fills absent attributes with their defaults.
    pub(super) attributes: Attributes,
}

/// What every Octavia collection takes. `id` is corvid's: a client that names its
/// objects (the Kubernetes watcher) can repeat a create and find what it made.
const OCTAVIA: [Attribute; 7] = [
    Attribute::create("id", Type::Text).or("null"),
    NAME.or("\"\""),
    DESCRIPTION.or("\"\""),
    ADMIN_STATE_UP.or("true"),
    Attribute::both("tags", Type::Texts).or("[]"),
    PROJECT_ID,
    TENANT_ID,
];

/// The loadbalancers collection.
pub(super) const LOADBALANCER: Spec = Spec {
    title: "LoadBalancer",
    attributes: Attributes {
        singular: "loadbalancer",
        plural: "loadbalancers",
        common: &OCTAVIA,
        own: &[
            Attribute::create("vip_subnet_id", Type::Text),
            Attribute::create("vip_network_id", Type::Text),
            Attribute::create("vip_port_id", Type::Text),
            Attribute::create("vip_address", Type::Text),
            Attribute::create("provider", Type::Text).or("\"corvid\""),
            Attribute::create("flavor_id", Type::Text),
            Attribute::create("availability_zone", Type::Text),
        ],
    },
};
/// The listeners collection.
pub(super) const LISTENER: Spec = Spec {
    title: "Listener",
    attributes: Attributes {
        singular: "listener",
        plural: "listeners",
        common: &OCTAVIA,
        own: &[
            Attribute::create("loadbalancer_id", Type::Text).required(),
            Attribute::create("protocol", Type::Text).required(),
            Attribute::create("protocol_port", Type::Int).required(),
            Attribute::both("default_pool_id", Type::Text),
            Attribute::both("connection_limit", Type::Int).or("-1"),
        ],
    },
};
/// The pools collection.
pub(super) const POOL: Spec = Spec {
    title: "Pool",
    attributes: Attributes {
        singular: "pool",
        plural: "pools",
        common: &OCTAVIA,
        own: &[
            Attribute::create("loadbalancer_id", Type::Text),
            Attribute::create("listener_id", Type::Text),
            Attribute::create("protocol", Type::Text).required(),
            Attribute::both("lb_algorithm", Type::Text).required(),
            Attribute::both("session_persistence", Type::Object),
        ],
    },
};
/// The members collection.
pub(super) const MEMBER: Spec = Spec {
    title: "Member",
    attributes: Attributes {
        singular: "member",
        plural: "members",
        common: &OCTAVIA,
        own: &[
            Attribute::create("address", Type::Text).required(),
            Attribute::create("protocol_port", Type::Int).required(),
            Attribute::create("subnet_id", Type::Text),
            Attribute::both("weight", Type::Int).or("1"),
            Attribute::both("backup", Type::Bool).or("false"),
            Attribute::create("pool_id", Type::Text),
        ],
    },
};

pub fn routes() -> Router<Arc<Controller>> {
    let mut r = Router::new();
    // Members are also served flat (`/v2/lbaas/members`, with `pool_id`): one list for
    // an agent to load.
    for spec in [&LOADBALANCER, &LISTENER, &POOL, &MEMBER] {
        r = r
            .route(
                &format!("/v2/lbaas/{}", spec.attributes.plural),
                get(move |State(c): Ctl, Query(q)| async move { list(&c, spec, q.as_deref(), None) })
                    .post(move |State(c): Ctl, h: HeaderMap, b: Bytes| async move {
                        create(&c, spec, &h, &b, None).await
                    }),
            )
            .route(
                &format!("/v2/lbaas/{}/{{id}}", spec.attributes.plural),
                get(move |State(c): Ctl, Path(id): Path<String>| async move { show(&c, spec, &id) })
                    .put(move |State(c): Ctl, Path(id): Path<String>, b: Bytes| async move {
                        update(&c, spec, &id, &b).await
                    })
                    .delete(
                        move |State(c): Ctl, Path(id): Path<String>, Query(q)| async move {
                            delete(&c, spec, &id, cascade(q.as_deref())).await
                        },
                    ),
            );
    }
    r.route(
        "/v2/lbaas/pools/{pool}/members",
        get(|State(c): Ctl, Path(pool): Path<String>, Query(q)| async move {
            list(&c, &MEMBER, q.as_deref(), Some(&pool))
        })
        .post(|State(c): Ctl, Path(pool): Path<String>, h: HeaderMap, b: Bytes| async move {
            create(&c, &MEMBER, &h, &b, Some(&pool)).await
        }),
    )
    .route(
        "/v2/lbaas/pools/{pool}/members/{id}",
        get(|State(c): Ctl, Path((_, id)): Path<(String, String)>| async move { show(&c, &MEMBER, &id) })
            .put(|State(c): Ctl, Path((_, id)): Path<(String, String)>, b: Bytes| async move {
                update(&c, &MEMBER, &id, &b).await
            })
            .delete(|State(c): Ctl, Path((_, id)): Path<(String, String)>| async move {
                delete(&c, &MEMBER, &id, false).await
            }),
    )
}

/// `?cascade=true`: a load balancer goes with its listeners, pools and members.
fn cascade(query: Option<&str>) -> bool {
    query
        .into_iter()
        .flat_map(|q| form_urlencoded::parse(q.as_bytes()))
        .any(|(k, v)| k == "cascade" && v == "true")
}

fn table<'a>(v: &'a View, spec: &Spec) -> impl Iterator<Item = &'a Value> {
    v.lbaas
        .get(spec.attributes.plural)
        .into_iter()
        .flat_map(|t| t.values().map(|e| &*e.obj))
}

fn get_obj(v: &View, spec: &Spec, id: &str) -> Result<(Value, i64), NeutronError> {
    v.lbaas
        .get(spec.attributes.plural)
        .and_then(|t| t.get(id))
        .map(|e| ((*e.obj).clone(), e.mod_revision))
        .ok_or_else(|| NeutronError::not_found(spec.title, id))
}

/// IDs of the children of `id` in `child` linked by `field`.
fn children(v: &View, child: &Spec, field: &str, id: &str) -> Vec<Value> {
    table(v, child)
        .filter(|o| o[field] == *id)
        .map(|o| json!({"id": o["id"]}))
        .collect()
}

/// An object with its derived child lists filled in.
fn full(v: &View, spec: &Spec, mut o: Value) -> Value {
    let id = o["id"].as_str().unwrap_or("").to_string();
    match spec.attributes.plural {
        "loadbalancers" => {
            o["listeners"] = json!(children(v, &LISTENER, "loadbalancer_id", &id));
            o["pools"] = json!(children(v, &POOL, "loadbalancer_id", &id));
        }
        "pools" => o["members"] = json!(children(v, &MEMBER, "pool_id", &id)),
        _ => {}
    }
    o
}

fn show(c: &Controller, spec: &Spec, id: &str) -> Result<Response, NeutronError> {
    let v = c.view();
    let (o, _) = get_obj(&v, spec, id)?;
    Ok(read_at(
        answer(
            StatusCode::OK,
            json!({ spec.attributes.singular: full(&v, spec, o) }),
        ),
        v.revision,
    ))
}

fn list(
    c: &Controller,
    spec: &Spec,
    raw: Option<&str>,
    pool: Option<&str>,
) -> Result<Response, NeutronError> {
    let q = ListQuery::parse(raw)?;
    let v = c.view();
    let objs: Vec<Value> = table(&v, spec)
        .filter(|o| pool.is_none_or(|p| o["pool_id"] == *p))
        .map(|o| full(&v, spec, o.clone()))
        .filter(|o| q.matches(o))
        .collect();
    Ok(read_at(
        answer(
            StatusCode::OK,
            q.answer(
                objs,
                spec.attributes.plural,
                &format!("/v2/lbaas/{}", spec.attributes.plural),
            ),
        ),
        v.revision,
    ))
}

/// Checks that an object named by `field` exists in `parent`.
fn require(
    v: &View,
    o: &Map<String, Value>,
    field: &str,
    parent: &Spec,
) -> Result<(), NeutronError> {
    match o.get(field).and_then(Value::as_str) {
        Some(id) => get_obj(v, parent, id).map(drop),
        None => Ok(()),
    }
}

async fn create(
    c: &Controller,
    spec: &Spec,
    headers: &HeaderMap,
    b: &Bytes,
    pool: Option<&str>,
) -> Result<Response, NeutronError> {
    let given = spec.attributes.object(&body(b)?, Write::Create)?;
    // A load balancer's VIP port is made from what it asks for. Octavia's objects keep
    // what they are given, null included: for the VIP, null is as absent.
    let load_balancer = (spec.attributes.plural == "loadbalancers")
        .then(|| {
            let all: Vec<&str> = spec.attributes.all().map(|a| a.name).collect();
            request::<LoadBalancerCreate>(&given, &all)
        })
        .transpose()?;
    let mut o = Map::new();
    for a in spec.attributes.accepted(Write::Create) {
        match (given.get(a.name), a.default) {
            (Some(v), _) => o.insert(a.name.to_string(), v.clone()),
            (None, Some(d)) => o.insert(
                a.name.to_string(),
                serde_json::from_str(d).unwrap_or(Value::Null),
            ),
            (None, None) => {
                return Err(NeutronError::bad_request(format!(
                    "Missing mandatory attribute {} of {}",
                    a.name, spec.attributes.singular
                )))
            }
        };
    }
    if let Some(p) = pool {
        o.insert("pool_id".into(), json!(p));
    }
    if let Some(port) = o.get("protocol_port") {
        if !port.as_u64().is_some_and(|p| (1..=65535).contains(&p)) {
            return Err(NeutronError::invalid_input(format!(
                "protocol_port {port} is not in 1..65535"
            )));
        }
    }
    let named = |key| given.get(key).and_then(Value::as_str);
    let project = project_of(named("project_id"), named("tenant_id"), headers);
    let id = match o.remove("id") {
        Some(Value::String(id)) => id,
        _ => new_id(),
    };
    let t = now();
    o.insert("id".into(), json!(id));
    o.insert("project_id".into(), json!(project));
    o.insert("tenant_id".into(), json!(project));
    o.insert("provisioning_status".into(), json!("ACTIVE"));
    o.insert(
        "operating_status".into(),
        json!(if spec.attributes.plural == "members" {
            "NO_MONITOR"
        } else {
            "ONLINE"
        }),
    );
    o.insert("created_at".into(), json!(t));
    o.insert("updated_at".into(), json!(t));
    let (o, _pending) = c
        .transact(|v| {
            let mut pending = c.pending();
            let mut o = o.clone();
            if v.lbaas
                .get(spec.attributes.plural)
                .is_some_and(|t| t.contains_key(id.as_str()))
            {
                return Err(NeutronError::conflict(
                    &format!("{}Exists", spec.title),
                    format!("{} {id} already exists.", spec.title),
                ));
            }
            if spec.attributes.plural == "members" && o["pool_id"].is_null() {
                return Err(NeutronError::bad_request("A member needs a pool_id"));
            }
            require(v, &o, "loadbalancer_id", &LOADBALANCER)?;
            require(v, &o, "listener_id", &LISTENER)?;
            require(v, &o, "default_pool_id", &POOL)?;
            require(v, &o, "pool_id", &POOL)?;
            let key = keys::resource(spec.attributes.plural, &id);
            let mut txn = Txn {
                compares: vec![Compare::CreateRevision(key.clone(), 0)],
                ops: Vec::new(),
            };
            if spec.attributes.plural == "pools"
                && o["loadbalancer_id"].is_null()
                && o["listener_id"].is_null()
            {
                return Err(NeutronError::bad_request(
                    "A pool needs a loadbalancer_id or a listener_id",
                ));
            }
            if let Some(asked) = &load_balancer {
                vip(v, &mut pending, asked, &mut o, &mut txn, headers, &id)?;
            }
            txn.ops.push(Op::Put(key, to_stored(&o)));
            Ok((txn, (o, pending)))
        })
        .await?;
    let v = c.view();
    Ok(answer(
        StatusCode::CREATED,
        json!({ spec.attributes.singular: full(&v, spec, Value::Object(o)) }),
    ))
}

/// Gives a new load balancer its VIP: the port named by `vip_port_id`, or a new port on
/// `vip_subnet_id`/`vip_network_id` created in the same transaction.
fn vip(
    v: &View,
    pending: &mut crate::ipam::Pending,
    asked: &LoadBalancerCreate,
    o: &mut Map<String, Value>,
    txn: &mut Txn,
    headers: &HeaderMap,
    lb_id: &str,
) -> Result<(), NeutronError> {
    let port = match &asked.vip_port_id {
        Some(pid) => super::lookup::<corvid_api::Port>(v, pid)?
            .obj
            .as_ref()
            .clone(),
        None => {
            let subnet = &asked.vip_subnet_id;
            let network = match (subnet, &asked.vip_network_id) {
                (_, Some(n)) => n.clone(),
                (Some(s), None) => super::lookup::<corvid_api::Subnet>(v, s)?
                    .obj
                    .network_id
                    .clone(),
                (None, None) => {
                    return Err(NeutronError::bad_request(
                        "A load balancer needs vip_subnet_id, vip_network_id or vip_port_id",
                    ))
                }
            };
            let fixed_ips = (subnet.is_some() || asked.vip_address.is_some()).then(|| {
                vec![FixedIpRequest {
                    subnet_id: subnet.clone(),
                    ip_address: asked.vip_address,
                }]
            });
            let req = PortCreate {
                network_id: network,
                name: Some(format!("octavia-lb-{lb_id}")),
                device_owner: Some("Octavia".into()),
                device_id: Some(format!("lb-{lb_id}")),
                fixed_ips,
                ..Default::default()
            };
            draft_port(v, pending, &req, headers, txn)?
        }
    };
    let first = port.fixed_ips.first();
    o.insert("vip_port_id".into(), json!(port.id));
    o.insert("vip_network_id".into(), json!(port.network_id));
    o.insert("vip_subnet_id".into(), json!(first.map(|f| &f.subnet_id)));
    o.insert("vip_address".into(), json!(first.map(|f| f.ip_address)));
    Ok(())
}

async fn update(
    c: &Controller,
    spec: &Spec,
    id: &str,
    b: &Bytes,
) -> Result<Response, NeutronError> {
    let attrs = spec.attributes.object(&body(b)?, Write::Update)?;
    let o = c
        .transact(|v| {
            let (mut o, modrev) = get_obj(v, spec, id)?;
            for (k, val) in &attrs {
                o[k.as_str()] = val.clone();
            }
            o["updated_at"] = json!(now());
            let key = keys::resource(spec.attributes.plural, id);
            let txn = Txn {
                compares: vec![Compare::ModRevision(key.clone(), modrev)],
                ops: vec![Op::Put(key, to_stored(&o))],
            };
            Ok((txn, full(v, spec, o)))
        })
        .await?;
    Ok(answer_as(StatusCode::OK, spec.attributes.singular, &o))
}

async fn delete(
    c: &Controller,
    spec: &Spec,
    id: &str,
    cascade: bool,
) -> Result<StatusCode, NeutronError> {
    c.transact(|v| {
        let (o, modrev) = get_obj(v, spec, id)?;
        let key = keys::resource(spec.attributes.plural, id);
        let mut txn = Txn {
            compares: vec![Compare::ModRevision(key.clone(), modrev)],
            ops: vec![Op::Delete(key)],
        };
        match spec.attributes.plural {
            "loadbalancers" => {
                let listeners: Vec<&Value> = table(v, &LISTENER)
                    .filter(|l| l["loadbalancer_id"] == *id)
                    .collect();
                let pools: Vec<&Value> = table(v, &POOL)
                    .filter(|p| {
                        p["loadbalancer_id"] == *id
                            || listeners.iter().any(|l| l["id"] == p["listener_id"])
                    })
                    .collect();
                if cascade {
                    let members =
                        table(v, &MEMBER).filter(|m| pools.iter().any(|p| p["id"] == m["pool_id"]));
                    for (plural, child) in listeners
                        .iter()
                        .map(|o| ("listeners", *o))
                        .chain(pools.iter().map(|o| ("pools", *o)))
                        .chain(members.map(|o| ("members", o)))
                    {
                        let cid = child["id"].as_str().unwrap_or("");
                        txn.ops.push(Op::Delete(keys::resource(plural, cid)));
                    }
                } else if !listeners.is_empty() || !pools.is_empty() {
                    return Err(NeutronError::conflict(
                        "LoadBalancerInUse",
                        format!("Load balancer {id} still has listeners or pools."),
                    ));
                }
                if let Some(p) = o["vip_port_id"].as_str().and_then(|p| v.ports.get(p)) {
                    if &*p.obj.device_owner == "Octavia" {
                        let removal = port_removal(&p.expand());
                        txn.compares.extend(removal.compares);
                        txn.ops.extend(removal.ops);
                    }
                }
            }
            "pools" => {
                for m in table(v, &MEMBER).filter(|m| m["pool_id"] == *id) {
                    let mid = m["id"].as_str().unwrap_or("");
                    txn.ops.push(Op::Delete(keys::resource("members", mid)));
                }
            }
            _ => {}
        }
        Ok((txn, ()))
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}
