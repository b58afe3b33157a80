//! The OpenAPI 3 description of the API, served at `/openapi.json`.

use axum::Json;
use corvid_api::Status;
use serde_json::{json, Map, Value};

/// Collections with the standard list/create/show/update/delete operations.
const COLLECTIONS: [(&str, &str); 9] = [
    ("/v2.0/networks", "network"),
    ("/v2.0/subnets", "subnet"),
    ("/v2.0/subnetpools", "subnetpool"),
    ("/v2.0/ports", "port"),
    ("/v2.0/floatingips", "floatingip"),
    ("/v2/lbaas/loadbalancers", "loadbalancer"),
    ("/v2/lbaas/listeners", "listener"),
    ("/v2/lbaas/pools", "pool"),
    ("/v2/lbaas/pools/{pool_id}/members", "member"),
];

/// The attributes a create and an update of `singular` take.
fn attributes(singular: &str) -> (Vec<&'static str>, &'static [&'static str]) {
    use super::{floatingips as f, networks as n, ports as p};
    match singular {
        "network" => (n::NETWORK_ATTRS.to_vec(), n::NETWORK_UPDATE),
        "subnet" => (n::SUBNET_ATTRS.to_vec(), n::SUBNET_UPDATE),
        "subnetpool" => (n::POOL_ATTRS.to_vec(), n::POOL_UPDATE),
        "port" => (p::PORT_ATTRS.to_vec(), p::PORT_UPDATE),
        "floatingip" => (f::FIP_ATTRS.to_vec(), f::FIP_UPDATE),
        other => super::lbaas::attributes(other).unwrap_or_default(),
    }
}

/// The JSON schema of one attribute, by Neutron's and Octavia's types.
fn attribute_schema(name: &str) -> Value {
    let pair = |a: &str, b: &str| {
        json!({"type": "array", "items": {"type": "object", "additionalProperties": false,
            "properties": {a: {"type": "string"}, b: {"type": "string"}}}})
    };
    match name {
        "admin_state_up"
        | "shared"
        | "port_security_enabled"
        | "router:external"
        | "enable_dhcp"
        | "fast_path"
        | "is_default"
        | "corvid:masquerade"
        | "backup" => {
            json!({"type": "boolean"})
        }
        "ip_version" => json!({"type": "integer", "enum": [4, 6]}),
        "mtu"
        | "prefixlen"
        | "default_prefixlen"
        | "min_prefixlen"
        | "max_prefixlen"
        | "provider:segmentation_id"
        | "protocol_port"
        | "weight"
        | "connection_limit" => {
            json!({"type": "integer"})
        }
        "tags" | "dns_nameservers" | "prefixes" | "security_groups" | "service_types" => {
            json!({"type": "array", "items": {"type": "string"}})
        }
        "fixed_ips" => pair("subnet_id", "ip_address"),
        "allocation_pools" => pair("start", "end"),
        "host_routes" => pair("destination", "nexthop"),
        "allowed_address_pairs" | "extra_dhcp_opts" => {
            json!({"type": "array", "items": {"type": "object"}})
        }
        "binding:profile" | "session_persistence" => json!({"type": "object", "nullable": true}),
        "status" => {
            json!({"type": "string", "enum": Status::names()})
        }
        _ => json!({"type": "string", "nullable": true}),
    }
}

/// `{"<singular>": {attributes}}`, and for a create also `{"<singular>s": [...]}`.
fn body_schema(singular: &str, attrs: &[&str], bulk: bool) -> Value {
    let object = json!({"type": "object", "additionalProperties": false,
        "properties": attrs.iter().map(|a| (a.to_string(), attribute_schema(a))).collect::<Map<_, _>>()});
    let mut properties = Map::new();
    properties.insert(singular.into(), object.clone());
    if bulk {
        properties.insert(
            format!("{singular}s"),
            json!({"type": "array", "items": object}),
        );
    }
    json!({"type": "object", "minProperties": 1, "maxProperties": 1, "properties": properties})
}

fn op(summary: String, ok: &str, body: Option<Value>) -> Value {
    let mut o = json!({
        "summary": summary,
        "responses": {
            ok: {"description": "success"},
            "400": {"$ref": "#/components/responses/Error"},
            "401": {"$ref": "#/components/responses/Error"},
            "404": {"$ref": "#/components/responses/Error"},
            "409": {"$ref": "#/components/responses/Error"}
        }
    });
    if let Some(schema) = body {
        o["requestBody"] =
            json!({"required": true, "content": {"application/json": {"schema": schema}}});
    }
    o
}

fn id_param(name: &str) -> Value {
    json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}})
}

pub async fn document() -> Json<Value> {
    let mut paths = Map::new();
    for (path, singular) in COLLECTIONS {
        let (create, update) = attributes(singular);
        let mut params = Vec::new();
        if path.contains("{pool_id}") {
            params.push(id_param("pool_id"));
        }
        paths.insert(path.to_string(), json!({
            "parameters": params,
            "get": op(format!("List {singular}s (filters on any attribute, fields, limit/marker, sort_key/sort_dir, tags)"), "200", None),
            "post": op(format!("Create a {singular} (or several: {{\"{singular}s\": [...]}}, all or nothing)"), "201", Some(body_schema(singular, &create, true))),
        }));
        let mut item_params = params.clone();
        item_params.push(id_param("id"));
        paths.insert(format!("{path}/{{id}}"), json!({
            "parameters": item_params,
            "get": op(format!("Show a {singular}"), "200", None),
            "put": op(format!("Update a {singular} (If-Match: revision_number=N guards it)"), "200", Some(body_schema(singular, update, false))),
            "delete": op(format!("Delete a {singular}"), "204", None),
        }));
        if path.starts_with("/v2.0/") {
            paths.insert(
                format!("{path}/{{id}}/tags"),
                json!({
                    "parameters": [id_param("id")],
                    "get": op("List tags".into(), "200", None),
                    "put": op("Replace all tags".into(), "200", Some(json!({"type": "object", "required": ["tags"],
                        "properties": {"tags": attribute_schema("tags")}}))),
                    "delete": op("Remove all tags".into(), "204", None),
                }),
            );
            paths.insert(
                format!("{path}/{{id}}/tags/{{tag}}"),
                json!({
                    "parameters": [id_param("id"), id_param("tag")],
                    "get": op("Check a tag".into(), "204", None),
                    "put": op("Add a tag".into(), "201", None),
                    "delete": op("Remove a tag".into(), "204", None),
                }),
            );
        }
    }
    paths.insert(
        "/v2.0/hosts".into(),
        json!({"get": op("List the hosts agents registered".into(), "200", None)}),
    );
    paths.insert(
        "/v2.0/hosts/{id}".into(),
        json!({
            "parameters": [id_param("id")],
            "get": op("Show a host".into(), "200", None),
            "put": op("Register a host and its underlay_ip (idempotent)".into(), "200",
                Some(body_schema("host", super::hosts::HOST_ATTRS, false))),
            "delete": op("Forget a host".into(), "204", None),
        }),
    );
    paths.insert(
        "/v2.0/extensions".into(),
        json!({"get": op("List the Neutron API extensions served".into(), "200", None)}),
    );
    paths.insert(
        "/v2.0/extensions/{alias}".into(),
        json!({
            "parameters": [id_param("alias")],
            "get": op("Show an extension; 404 if not served".into(), "200", None),
        }),
    );
    paths.insert("/v2.0/watch".into(), json!({"get": {
        "summary": "Changes after a revision (long poll), optionally only ports bound to one host",
        "parameters": [
            {"name": "since", "in": "query", "required": true, "schema": {"type": "integer"}},
            {"name": "binding:host_id", "in": "query", "schema": {"type": "string"}},
            {"name": "resource", "in": "query", "schema": {"type": "string"}},
            {"name": "timeout", "in": "query", "schema": {"type": "integer"}}
        ],
        "responses": {"200": {"description": "events and the revision to resume from"},
                      "410": {"$ref": "#/components/responses/Error"}}
    }}));
    paths.insert(
        "/project/{project_id}/ports".into(),
        json!({
            "parameters": [id_param("project_id")],
            "post": op("Create ports (Mizar-MP agreement)".into(), "201",
                Some(body_schema("port", super::ports::PORT_ATTRS, true))),
            "get": op("List the project's ports".into(), "200", None),
        }),
    );
    paths.insert("/project/{project_id}/ports/{id}".into(), json!({
        "parameters": [id_param("project_id"), id_param("id")],
        "get": op("Show a port; status UP once plugged (Mizar-MP agreement)".into(), "200", None),
        "delete": op("Delete a port (Mizar-MP agreement)".into(), "200", None),
    }));
    paths.insert(
        "/project/{project_id}/subnets/{id}".into(),
        json!({
            "parameters": [id_param("project_id"), id_param("id")],
            "get": op("Show a subnet (Mizar-MP agreement)".into(), "200", None),
        }),
    );
    Json(json!({
        "openapi": "3.0.3",
        "info": {"title": "corvid controller", "version": env!("CARGO_PKG_VERSION"),
                 "description": "Neutron v2.0-shaped networking API with Octavia-shaped load balancers."},
        "components": {
            "securitySchemes": {"token": {"type": "apiKey", "in": "header", "name": "X-Auth-Token"}},
            "responses": {"Error": {"description": "NeutronError", "content": {"application/json": {"schema": {
                "type": "object", "properties": {"NeutronError": {"type": "object", "properties": {
                    "type": {"type": "string"}, "message": {"type": "string"}, "detail": {"type": "string"}}}}}}}}}
        },
        "security": [{"token": []}],
        "paths": paths,
    }))
}
