//! The REST API: routes, authentication, and what every collection shares (show, list,
//! update, tags). Each resource's own rules live in its module.

mod attributes;
mod extensions;
mod floatingips;
mod hosts;
mod lbaas;
mod networks;
mod openapi;
mod ports;
mod routers;
mod security_groups;
mod watch;

use std::sync::Arc;

use axum::body::Bytes;
pub use axum::extract::RawQuery as Query;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, MethodRouter};
use axum::{Json, Router};
use corvid_api::client::{REVISION_HEADER, TOKEN_HEADER};
use corvid_api::{FloatingIp, Host, Network, Port, Resource, Subnet, SubnetPool};
use serde::de::value::MapDeserializer;
use serde::de::{DeserializeOwned, Deserializer, IntoDeserializer, Visitor};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use serde_path_to_error::Segment;

use self::attributes::{Attributes, Write};
use crate::compact_port::CompactPort;
use crate::controller::Controller;
use crate::error::NeutronError;
use crate::keys;
use crate::query::{fields_of, project, ListQuery};
use crate::store::{Compare, Op, Txn};
use crate::util::now;
use crate::view::{Entry, Table, View};

/// Shared state of the handlers.
pub type Ctl = State<Arc<Controller>>;

/// Project used when a request names none (no Keystone here).
const DEFAULT_PROJECT: &str = "corvid";

/// A resource kind served by the generic handlers.
pub trait Kind: Resource {
    /// Name in error types and messages (`Port` in `PortNotFound`).
    const TITLE: &'static str;
    /// What the view holds of one object: the object, or a compact form of it that is
    /// written as the object is.
    type Stored: serde::Serialize;
    /// Its table in the view.
    fn table(v: &View) -> &Table<Self::Stored>;
    /// The object of what the view holds.
    fn expand(stored: &Arc<Self::Stored>) -> Arc<Self>;
    /// Its revision number and update time.
    fn stamps(&mut self) -> (&mut u64, &mut String);
    /// The 404 of an ID no object has, in Neutron's words for the kind.
    fn missing(id: &str) -> NeutronError {
        NeutronError::not_found(Self::TITLE, id)
    }
    /// The object as the API shows it, from what the view holds of it: a security group
    /// shows its rules, which the store keeps apart.
    fn shown(_v: &View, obj: &Arc<Self::Stored>) -> Arc<Self::Stored> {
        obj.clone()
    }
}

/// A kind whose objects take tags (`/tags` routes, `tags` filters).
pub trait Tagged: Kind {
    /// Its tags.
    fn tags_mut(&mut self) -> &mut Vec<String>;
}

macro_rules! kind {
    ($t:ty, $title:literal, $field:ident) => {
        kind!($t, $title, $field, $t, |s: &Arc<$t>| s.clone());
    };
    ($t:ty, $title:literal, $field:ident, $stored:ty, $expand:expr) => {
        impl Kind for $t {
            const TITLE: &'static str = $title;
            type Stored = $stored;
            fn table(v: &View) -> &Table<$stored> {
                &v.$field
            }
            fn expand(stored: &Arc<$stored>) -> Arc<Self> {
                $expand(stored)
            }
            fn stamps(&mut self) -> (&mut u64, &mut String) {
                (&mut self.revision_number, &mut self.updated_at)
            }
        }
        impl Tagged for $t {
            fn tags_mut(&mut self) -> &mut Vec<String> {
                &mut self.tags
            }
        }
    };
}
kind!(Network, "Network", networks);
kind!(Subnet, "Subnet", subnets);
kind!(SubnetPool, "SubnetPool", subnetpools);
kind!(Port, "Port", ports, CompactPort, |s: &Arc<CompactPort>| {
    Arc::new(s.expand())
});
kind!(FloatingIp, "FloatingIP", floatingips);
kind!(Host, "Host", hosts);
kind!(corvid_api::Router, "Router", routers);

/// The API's router over one controller.
pub fn router(ctl: Arc<Controller>) -> Router {
    let api = Router::new()
        .route("/", get(versions))
        .route("/v2.0", get(resources))
        .route("/v2.0/", get(resources))
        .route("/v2", get(lbaas_version))
        .route("/v2/", get(lbaas_version))
        .route("/openapi.json", get(openapi::document))
        .route("/v2.0/watch", get(watch::watch))
        .merge(extensions::routes())
        .merge(networks::routes())
        .merge(ports::routes())
        .merge(floatingips::routes())
        .merge(routers::routes())
        .merge(security_groups::routes())
        .merge(hosts::routes())
        .merge(lbaas::routes())
        .merge(tag_routes::<Network>())
        .merge(tag_routes::<Subnet>())
        .merge(tag_routes::<SubnetPool>())
        .merge(tag_routes::<Port>())
        .merge(tag_routes::<FloatingIp>())
        .merge(tag_routes::<corvid_api::Router>())
        .merge(tag_routes::<corvid_api::SecurityGroup>())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed);
    let api = api
        .layer(middleware::map_response(too_large))
        .layer(middleware::from_fn_with_state(ctl.clone(), mark_staleness))
        .layer(middleware::from_fn_with_state(ctl.clone(), authenticate))
        .layer(middleware::from_fn(measure))
        .with_state(ctl);
    // The rewrite has to come before routing, so the API sits behind a router of its own.
    Router::new().fallback_service(
        tower::ServiceBuilder::new()
            .map_request(strip_format_suffix)
            .service(api),
    )
}

/// python-neutronclient, which kuryr-libnetwork and many scripts use, asks for
/// `/v2.0/ports.json` and `/v2.0/ports/<id>.json`; Neutron takes the suffix as the answer's
/// format. JSON is the only one here, so the suffix is dropped.
fn strip_format_suffix(mut req: Request) -> Request {
    let uri = req.uri();
    let path = uri.path();
    if let Some(stripped) = path
        .strip_prefix("/v2.0/")
        .and_then(|p| p.strip_suffix(".json"))
    {
        let rewritten = match uri.query() {
            Some(q) => format!("/v2.0/{stripped}?{q}"),
            None => format!("/v2.0/{stripped}"),
        };
        if let Ok(u) = rewritten.parse() {
            *req.uri_mut() = u;
        }
    }
    req
}

/// Counts and times each request by its route pattern (IDs would make a series per
/// object).
async fn measure(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_string();
    let method = req.method().to_string();
    let started = std::time::Instant::now();
    let response = next.run(req).await;
    // A write that took effect is a state change: one line each. Reads are not logged.
    let code = response.status();
    if is_write(&method) && code.is_success() {
        tracing::info!(%method, %route, code = code.as_u16(), ms = started.elapsed().as_millis() as u64, "changed");
    }
    let m = &crate::metrics::METRICS;
    m.request_seconds
        .get_or_create(&crate::metrics::RouteLabels {
            route: route.clone(),
            method: method.clone(),
        })
        .observe(started.elapsed().as_secs_f64());
    m.requests
        .get_or_create(&crate::metrics::RequestLabels {
            route,
            method,
            code: response.status().as_u16(),
        })
        .inc();
    response
}

/// A body over the limit is refused by axum before any handler, in plain text: Neutron's
/// clients read the error from the JSON body, so it is given one.
async fn too_large(response: Response) -> Response {
    if response.status() != StatusCode::PAYLOAD_TOO_LARGE {
        return response;
    }
    NeutronError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "HTTPRequestEntityTooLarge",
        "The request body is larger than the controller takes (--max-body).",
    )
    .into_response()
}

/// Whether a request of `method` asks for a change.
fn is_write(method: &str) -> bool {
    matches!(method, "POST" | "PUT" | "DELETE" | "PATCH")
}

async fn authenticate(State(ctl): Ctl, req: Request, next: Next) -> Response {
    if let Some(token) = &ctl.token {
        let given = req
            .headers()
            .get(TOKEN_HEADER)
            .and_then(|v| v.to_str().ok());
        // Compared in constant time, so the answer's timing tells nothing of the token.
        let matches = given.is_some_and(|g| {
            bool::from(subtle::ConstantTimeEq::ct_eq(
                g.as_bytes(),
                token.as_bytes(),
            ))
        });
        if !matches {
            return NeutronError::new(
                StatusCode::UNAUTHORIZED,
                "HTTPUnauthorized",
                "Authentication required: send the controller's token in X-Auth-Token.",
            )
            .into_response();
        }
    }
    next.run(req).await
}

/// Reads are served from the view: each answer says whether it may be stale (the view has
/// not been confirmed current for a few seconds, as when the store has lost quorum).
const STALE_HEADER: &str = "x-corvid-stale";

async fn mark_staleness(State(ctl): Ctl, req: Request, next: Next) -> Response {
    let read = req.method() == axum::http::Method::GET;
    let mut response = next.run(req).await;
    if read {
        let stale = if ctl.may_be_stale() { "true" } else { "false" };
        response
            .headers_mut()
            .insert(STALE_HEADER, axum::http::HeaderValue::from_static(stale));
    }
    response
}

async fn not_found() -> NeutronError {
    NeutronError::new(
        StatusCode::NOT_FOUND,
        "HTTPNotFound",
        "The resource could not be found.",
    )
}

/// Neutron answers a method a resource does not take with 405 and its error body; axum's
/// own 405 has none.
async fn method_not_allowed() -> NeutronError {
    NeutronError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "HTTPMethodNotAllowed",
        "The method is not allowed for this resource.",
    )
}

/// This server's base URL as the client reached it: version documents carry absolute
/// links, and keystoneauth (openstacksdk's discovery) follows only those.
fn base_url(headers: &HeaderMap) -> String {
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1:9696");
    format!("http://{host}")
}

/// `GET /`: Neutron's version list.
async fn versions(headers: HeaderMap) -> Json<Value> {
    let href = format!("{}/v2.0/", base_url(&headers));
    Json(json!({"versions": [{"id": "v2.0", "status": "CURRENT",
        "links": [{"rel": "self", "href": href}]}]}))
}

/// `GET /v2.0/`: Neutron's list of collections.
async fn resources(headers: HeaderMap) -> Json<Value> {
    let base = base_url(&headers);
    fn entry<R: Resource>(base: &str) -> Value {
        json!({"name": R::SINGULAR, "collection": R::PLURAL,
            "links": [{"rel": "self", "href": format!("{base}/v2.0/{}", R::COLLECTION)}]})
    }
    Json(json!({"resources": [
        entry::<Network>(&base),
        entry::<Subnet>(&base),
        entry::<SubnetPool>(&base),
        entry::<Port>(&base),
        entry::<FloatingIp>(&base),
        entry::<corvid_api::Router>(&base),
        entry::<corvid_api::SecurityGroup>(&base),
        entry::<corvid_api::SecurityGroupRule>(&base),
    ]}))
}

/// `GET /v2`: the load-balancer API's version, where Octavia clients discover it.
async fn lbaas_version(headers: HeaderMap) -> Json<Value> {
    let href = format!("{}/v2", base_url(&headers));
    Json(json!({"version": {"id": "v2.0", "status": "CURRENT",
        "links": [{"rel": "self", "href": href}]}}))
}

/// Parses a JSON request body.
pub fn body(bytes: &Bytes) -> Result<Value, NeutronError> {
    serde_json::from_slice(bytes)
        .map_err(|e| NeutronError::bad_request(format!("Malformed request body: {e}")))
}

/// The typed request (corvid-api's `requests`) a body's object holds, once its attributes
/// have passed the allow-list. A value that does not fit is refused as Neutron refuses it,
/// naming the attribute and quoting its whole value, however deep the fault lies in it.
/// So is `null`, which serde would read as absent, but for a free-form object and for the
/// attributes in `nullable`, whose request gives null a meaning (`gateway_ip: null` is no
/// gateway) or takes it as unset.
pub fn request<T: DeserializeOwned>(
    obj: &Map<String, Value>,
    nullable: &[&str],
) -> Result<T, NeutronError> {
    let unfit = |name: &str, v: &Value, reason: &dyn std::fmt::Display| {
        NeutronError::invalid_input(format!("'{v}' is not valid for {name}: {reason}"))
    };
    for (name, v) in obj
        .iter()
        .filter(|(name, v)| v.is_null() && !nullable.contains(&name.as_str()))
    {
        let alone = MapDeserializer::new(std::iter::once((name.as_str(), Null)));
        let refused = serde_path_to_error::deserialize::<_, T>(alone).err();
        // Otherwise the attribute's own type takes null, as a free-form object does.
        if let Some(e) = refused.filter(|e| first_key(e.path()) == Some(name)) {
            return Err(unfit(name, v, e.inner()));
        }
    }
    serde_path_to_error::deserialize(obj).map_err(|e| {
        match first_key(e.path()).and_then(|name| obj.get_key_value(name)) {
            Some((name, v)) => unfit(name, v, e.inner()),
            // Only a required attribute that is absent faults the object itself; callers
            // refuse those first, in Neutron's words (`Missing network_id`).
            None => NeutronError::invalid_input(e.inner().to_string()),
        }
    })
}

/// The attribute a deserialization error lies in.
fn first_key(path: &serde_path_to_error::Path) -> Option<&str> {
    match path.iter().next() {
        Some(Segment::Map { key }) => Some(key),
        _ => None,
    }
}

/// `null` handed to an attribute's own type (the `T` of its `Option<T>`) instead of being
/// read as absent: what that type answers is serde's reason for refusing it (`invalid
/// type: null, expected a string`).
struct Null;

impl<'de> Deserializer<'de> for Null {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_unit()
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_some(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier
        ignored_any
    }
}

impl IntoDeserializer<'_, serde_json::Error> for Null {
    type Deserializer = Null;

    fn into_deserializer(self) -> Null {
        self
    }
}

/// The project of a request: the one it names (`project_id`, else Neutron's older
/// `tenant_id`), then `X-Project-Id`, then the default.
pub fn project_of(
    project_id: Option<&str>,
    tenant_id: Option<&str>,
    headers: &HeaderMap,
) -> String {
    named_project(project_id, tenant_id, headers).unwrap_or_else(|| DEFAULT_PROJECT.into())
}

/// The project a request names, in the body or in `X-Project-Id`, if it names one.
pub fn named_project(
    project_id: Option<&str>,
    tenant_id: Option<&str>,
    headers: &HeaderMap,
) -> Option<String> {
    project_id
        .or(tenant_id)
        .or_else(|| headers.get("X-Project-Id").and_then(|v| v.to_str().ok()))
        .map(str::to_string)
}

/// Serializes a resource for the store.
pub fn to_stored<T: serde::Serialize>(obj: &T) -> Vec<u8> {
    serde_json::to_vec(obj).unwrap_or_default()
}

/// A JSON answer with a status.
pub fn answer(status: StatusCode, v: Value) -> Response {
    (status, Json(v)).into_response()
}

/// `{"<key>": obj}` as a JSON answer, serialized straight from `obj`: building a `Value`
/// tree of a port first cost more than the rest of writing the answer.
pub fn answer_as<T: serde::Serialize + ?Sized>(status: StatusCode, key: &str, obj: &T) -> Response {
    (status, Json(std::collections::BTreeMap::from([(key, obj)]))).into_response()
}

/// `resp` marked with the view revision it was read at: a client resumes the watch feed
/// from there, so every read of objects carries it (one without it would resume from 0).
pub fn read_at(mut resp: Response, revision: i64) -> Response {
    resp.headers_mut()
        .insert(REVISION_HEADER, HeaderValue::from(revision));
    resp
}

/// The entry of `id`, or the kind's 404.
pub fn lookup<K: Kind>(v: &View, id: &str) -> Result<Entry<K>, NeutronError> {
    let e = K::table(v).get(id).ok_or_else(|| K::missing(id))?;
    Ok(Entry {
        obj: K::expand(&e.obj),
        create_revision: e.create_revision,
        mod_revision: e.mod_revision,
    })
}

/// GET of one object, with `fields=`.
pub fn show<K: Kind>(
    ctl: &Controller,
    id: &str,
    query: Option<&str>,
) -> Result<Response, NeutronError> {
    let (obj, revision) = {
        let v = ctl.view();
        let e = K::table(&v).get(id).ok_or_else(|| K::missing(id))?;
        (K::shown(&v, &e.obj), v.revision)
    };
    let mut v = serde_json::to_value(&*obj).unwrap_or(Value::Null);
    let fields = fields_of(query);
    if !fields.is_empty() {
        v = project(v, &fields);
    }
    Ok(read_at(
        answer_as(StatusCode::OK, K::SINGULAR, &v),
        revision,
    ))
}

/// GET of a collection with Neutron's filters; carries the view's revision in a header.
/// `candidates` narrows the objects looked at, with the revision they were read at.
pub fn list<K: Kind>(
    ctl: &Controller,
    raw: Option<&str>,
    candidates: Option<(Vec<Arc<K::Stored>>, i64)>,
) -> Result<Response, NeutronError> {
    let q = ListQuery::parse(raw)?;
    let (objs, revision) = candidates.unwrap_or_else(|| {
        let v = ctl.view();
        (
            K::table(&v)
                .values()
                .map(|e| K::shown(&v, &e.obj))
                .collect(),
            v.revision,
        )
    });
    let kept: Vec<Value> = objs
        .iter()
        .filter_map(|o| serde_json::to_value(&**o).ok())
        .filter(|o| q.matches(o))
        .collect();
    let path = format!("{}/{}", K::PREFIX, K::COLLECTION);
    Ok(read_at(
        answer(StatusCode::OK, q.answer(kept, K::PLURAL, &path)),
        revision,
    ))
}

/// `If-Match: revision_number=N`, if sent.
pub fn if_match(headers: &HeaderMap) -> Option<u64> {
    headers
        .get("If-Match")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().strip_prefix("revision_number="))
        .and_then(|n| n.parse().ok())
}

/// Read, change, compare-and-swap, retried on races; `change` may add compares and ops.
pub async fn update_with<K: Kind>(
    ctl: &Controller,
    id: &str,
    expected: Option<u64>,
    mut change: impl FnMut(&View, &mut K, &mut Txn) -> Result<(), NeutronError>,
) -> Result<K, NeutronError> {
    ctl.transact(|v| {
        let entry = lookup::<K>(v, id)?;
        let mut obj = (*entry.obj).clone();
        if let Some(want) = expected {
            let current = *obj.stamps().0;
            if want != current {
                return Err(NeutronError::new(
                    StatusCode::PRECONDITION_FAILED,
                    "RevisionNumberConstraintFailed",
                    format!("Constrained to {want}, but current revision is {current}"),
                ));
            }
        }
        let mut txn = Txn::default();
        change(v, &mut obj, &mut txn)?;
        let (rev, updated) = obj.stamps();
        *rev += 1;
        *updated = now();
        let key = keys::resource(K::PLURAL, id);
        txn.compares
            .push(Compare::ModRevision(key.clone(), entry.mod_revision));
        txn.ops.push(Op::Put(key, to_stored(&obj)));
        Ok((txn, obj))
    })
    .await
}

/// Merges `attrs` into an object through its JSON form, so each kind's field types validate.
pub fn merge<K: Kind>(obj: &mut K, attrs: &Map<String, Value>) -> Result<(), NeutronError> {
    let mut v = serde_json::to_value(&*obj).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut v {
        for (k, val) in attrs {
            m.insert(k.clone(), val.clone());
        }
    }
    *obj = serde_json::from_value(v).map_err(|e| NeutronError::invalid_input(format!("{e}")))?;
    Ok(())
}

/// Generic PUT of plain attributes.
pub async fn update_attrs<K: Kind>(
    ctl: &Controller,
    id: &str,
    headers: &HeaderMap,
    bytes: &Bytes,
    attributes: &Attributes,
) -> Result<Response, NeutronError> {
    let attrs = attributes.object(&body(bytes)?, Write::Update)?;
    let obj = update_with::<K>(ctl, id, if_match(headers), |_, o, _| merge(o, &attrs)).await?;
    Ok(answer_as(StatusCode::OK, K::SINGULAR, &obj))
}

/// GET of a collection with Neutron's filters.
pub fn list_route<K: Kind>() -> MethodRouter<Arc<Controller>> {
    get(|State(c): Ctl, Query(q): Query| async move { list::<K>(&c, q.as_deref(), None) })
}

/// GET of one object.
pub fn show_route<K: Kind>() -> MethodRouter<Arc<Controller>> {
    get(
        |State(c): Ctl, Path(id): Path<String>, Query(q): Query| async move {
            show::<K>(&c, &id, q.as_deref())
        },
    )
}

/// GET of one object and PUT of its plain attributes.
pub fn item_routes<K: Kind>(attributes: &'static Attributes) -> MethodRouter<Arc<Controller>> {
    show_route::<K>().put(
        move |State(c): Ctl, Path(id): Path<String>, h: HeaderMap, b: Bytes| async move {
            update_attrs::<K>(&c, &id, &h, &b, attributes).await
        },
    )
}

fn tag_routes<K: Tagged>() -> Router<Arc<Controller>> {
    let base = format!("{}/{}/{{id}}/tags", K::PREFIX, K::COLLECTION);
    Router::new()
        .route(
            &base,
            get(|State(c): Ctl, Path(id): Path<String>| async move {
                let e = lookup::<K>(&c.view(), &id)?;
                let mut obj = (*e.obj).clone();
                Ok::<_, NeutronError>(Json(json!({"tags": obj.tags_mut()})))
            })
            .put(
                |State(c): Ctl, Path(id): Path<String>, b: Bytes| async move {
                    let obj = match body(&b)? {
                        Value::Object(o) => o,
                        _ => Map::new(),
                    };
                    if !obj.contains_key("tags") {
                        return Err(NeutronError::bad_request("Missing 'tags' in body"));
                    }
                    let TagsBody { tags } = request(&obj, &[])?;
                    let t = tags.clone();
                    update_with::<K>(&c, &id, None, |_, o, _| {
                        *o.tags_mut() = t.clone();
                        Ok(())
                    })
                    .await?;
                    Ok::<_, NeutronError>(Json(json!({ "tags": tags })))
                },
            )
            .delete(|State(c): Ctl, Path(id): Path<String>| async move {
                update_with::<K>(&c, &id, None, |_, o, _| {
                    o.tags_mut().clear();
                    Ok(())
                })
                .await?;
                Ok::<_, NeutronError>(StatusCode::NO_CONTENT)
            }),
        )
        .route(
            &format!("{base}/{{tag}}"),
            get(
                |State(c): Ctl, Path((id, tag)): Path<(String, String)>| async move {
                    let e = lookup::<K>(&c.view(), &id)?;
                    let mut obj = (*e.obj).clone();
                    if obj.tags_mut().contains(&tag) {
                        Ok(StatusCode::NO_CONTENT)
                    } else {
                        Err(tag_not_found(&tag))
                    }
                },
            )
            .put(
                |State(c): Ctl, Path((id, tag)): Path<(String, String)>| async move {
                    update_with::<K>(&c, &id, None, |_, o, _| {
                        let tags = o.tags_mut();
                        if !tags.contains(&tag) {
                            tags.push(tag.clone());
                            tags.sort();
                        }
                        Ok(())
                    })
                    .await?;
                    Ok::<_, NeutronError>((StatusCode::CREATED, Json(Value::Null)))
                },
            )
            .delete(
                |State(c): Ctl, Path((id, tag)): Path<(String, String)>| async move {
                    update_with::<K>(&c, &id, None, |_, o, _| {
                        let tags = o.tags_mut();
                        let before = tags.len();
                        tags.retain(|t| *t != tag);
                        if tags.len() == before {
                            return Err(tag_not_found(&tag));
                        }
                        Ok(())
                    })
                    .await?;
                    Ok::<_, NeutronError>(StatusCode::NO_CONTENT)
                },
            ),
        )
}

/// The body of a PUT of an object's tags, all of them; other members are ignored.
#[derive(Deserialize)]
struct TagsBody {
    tags: Vec<String>,
}

fn tag_not_found(tag: &str) -> NeutronError {
    NeutronError::new(
        StatusCode::NOT_FOUND,
        "TagNotFound",
        format!("Tag {tag} could not be found."),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use corvid_api::{NetworkCreate, PortCreate, SubnetCreate};

    fn object(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(o) => o,
            v => panic!("{v} is not an object"),
        }
    }

    #[test]
    fn a_value_that_does_not_fit_is_refused_naming_its_attribute_and_quoting_it() {
        let e =
            request::<NetworkCreate>(&object(json!({"name": "n", "mtu": "big"})), &[]).unwrap_err();
        assert_eq!(
            (e.status, e.kind.as_str(), e.message.as_str()),
            (
                StatusCode::BAD_REQUEST,
                "InvalidInput",
                "Invalid input for operation: '\"big\"' is not valid for mtu: invalid type: \
                 string \"big\", expected u32."
            )
        );
        // By its name on the wire, however deep the fault lies in its value.
        let e = request::<NetworkCreate>(&object(json!({"router:external": 1})), &[]).unwrap_err();
        assert!(
            e.message.contains("'1' is not valid for router:external: "),
            "{}",
            e.message
        );
        let e = request::<PortCreate>(
            &object(json!({"network_id": "n", "fixed_ips": [{"ip_address": "10.0.0.300"}]})),
            &[],
        )
        .unwrap_err();
        assert_eq!(
            e.message,
            "Invalid input for operation: '[{\"ip_address\":\"10.0.0.300\"}]' is not valid for \
             fixed_ips: invalid IP address syntax."
        );
    }

    #[test]
    fn null_is_refused_but_where_the_request_gives_it_a_meaning() {
        let gateway = ["gateway_ip"];
        let absent: SubnetCreate = request(&object(json!({"network_id": "n"})), &gateway).unwrap();
        let null: SubnetCreate = request(
            &object(json!({"network_id": "n", "gateway_ip": null})),
            &gateway,
        )
        .unwrap();
        assert_eq!((absent.gateway_ip, null.gateway_ip), (None, Some(None)));
        // Elsewhere in serde's words for the attribute's own type, as before it was typed.
        for (body, reason) in [
            (
                json!({"name": null}),
                "'null' is not valid for name: invalid type: null, expected a string",
            ),
            (
                json!({"mtu": null}),
                "'null' is not valid for mtu: invalid type: null, expected u32",
            ),
            (
                json!({"tags": null}),
                "'null' is not valid for tags: invalid type: null, expected a sequence",
            ),
        ] {
            let e = request::<NetworkCreate>(&object(body), &[]).unwrap_err();
            assert_eq!(e.message, format!("Invalid input for operation: {reason}."));
        }
        let e =
            request::<SubnetCreate>(&object(json!({"network_id": "n", "gateway_ip": null})), &[])
                .unwrap_err();
        assert!(e.message.contains("expected IP address"), "{}", e.message);
    }
}
