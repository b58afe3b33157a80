//! The OpenAPI 3 description of the API, served at `/openapi.json`.

use axum::Json;
use serde_json::{json, Map, Value};

use super::attributes::{Attributes, Type, Write};
use super::{floatingips, lbaas, networks, ports, routers, security_groups};

/// Collections with the standard list/create/show/delete operations, and update where
/// the collection takes any attribute on update.
const COLLECTIONS: [(&str, &Attributes); 12] = [
    ("/v2.0/networks", &networks::NETWORK),
    ("/v2.0/subnets", &networks::SUBNET),
    ("/v2.0/subnetpools", &networks::SUBNET_POOL),
    ("/v2.0/ports", &ports::PORT),
    ("/v2.0/floatingips", &floatingips::FLOATING_IP),
    ("/v2.0/routers", &routers::ROUTER),
    ("/v2.0/security-groups", &security_groups::SECURITY_GROUP),
    (
        "/v2.0/security-group-rules",
        &security_groups::SECURITY_GROUP_RULE,
    ),
    ("/v2/lbaas/loadbalancers", &lbaas::LOADBALANCER.attributes),
    ("/v2/lbaas/listeners", &lbaas::LISTENER.attributes),
    ("/v2/lbaas/pools", &lbaas::POOL.attributes),
    (
        "/v2/lbaas/pools/{pool_id}/members",
        &lbaas::MEMBER.attributes,
    ),
];

fn op(summary: String, ok: &str, body: Option<Value>) -> Value {
    let mut o = json!({
        "summary": summary,
        "responses": {
            ok: {"description": "success"},
            "400": {"$ref": "#/components/responses/Error"},
            "401": {"$ref": "#/components/responses/Error"},
            "404": {"$ref": "#/components/responses/Error"},
            "409": {"$ref": "#/components/responses/Error"},
            "413": {"$ref": "#/components/responses/Error"}
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
    for (path, attributes) in COLLECTIONS {
        let singular = attributes.singular;
        let mut params = Vec::new();
        if path.contains("{pool_id}") {
            params.push(id_param("pool_id"));
        }
        paths.insert(path.to_string(), json!({
            "parameters": params,
            "get": op(format!("List {singular}s (filters on any attribute, fields, limit/marker, sort_key/sort_dir, tags)"), "200", None),
            "post": op(format!("Create a {singular} (or several: {{\"{singular}s\": [...]}}, all or nothing)"), "201", Some(attributes.schema(Write::Create))),
        }));
        let mut item_params = params.clone();
        item_params.push(id_param("id"));
        let mut item = json!({
            "parameters": item_params,
            "get": op(format!("Show a {singular}"), "200", None),
            "delete": op(format!("Delete a {singular}"), "204", None),
        });
        if attributes.accepted(Write::Update).next().is_some() {
            item["put"] = op(
                format!("Update a {singular} (If-Match: revision_number=N guards it)"),
                "200",
                Some(attributes.schema(Write::Update)),
            );
        }
        paths.insert(format!("{path}/{{id}}"), item);
        let tagged = attributes.all().any(|a| a.name == "tags");
        if path.starts_with("/v2.0/") && tagged {
            paths.insert(
                format!("{path}/{{id}}/tags"),
                json!({
                    "parameters": [id_param("id")],
                    "get": op("List tags".into(), "200", None),
                    "put": op("Replace all tags".into(), "200", Some(json!({"type": "object", "required": ["tags"],
                        "properties": {"tags": Type::Texts.schema()}}))),
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
                Some(super::hosts::HOST.schema(Write::Update))),
            "delete": op("Forget a host".into(), "204", None),
        }),
    );
    let interface = json!({"type": "object", "additionalProperties": false, "minProperties": 1,
        "maxProperties": 1, "properties": {"subnet_id": {"type": "string"}, "port_id": {"type": "string"}}});
    for (action, summary) in [
        (
            "add_router_interface",
            "Give the router a subnet (its gateway address) or a port",
        ),
        (
            "remove_router_interface",
            "Take a subnet or a port off the router",
        ),
    ] {
        paths.insert(
            format!("/v2.0/routers/{{id}}/{action}"),
            json!({"parameters": [id_param("id")],
                "put": op(summary.into(), "200", Some(interface.clone()))}),
        );
    }
    let routes = json!({"type": "object", "required": ["router"], "properties": {"router": {
        "type": "object", "required": ["routes"],
        "properties": {"routes": Type::Pairs("destination", "nexthop").schema()}}}});
    for (action, summary) in [
        (
            "add_extraroutes",
            "Add extra routes to the router's (extraroute-atomic)",
        ),
        (
            "remove_extraroutes",
            "Remove extra routes from the router's (extraroute-atomic)",
        ),
    ] {
        paths.insert(
            format!("/v2.0/routers/{{id}}/{action}"),
            json!({"parameters": [id_param("id")],
                "put": op(summary.into(), "200", Some(routes.clone()))}),
        );
    }
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
                Some(super::ports::PORT.schema(Write::Create))),
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
