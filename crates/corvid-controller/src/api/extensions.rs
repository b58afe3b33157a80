//! `/v2.0/extensions`: the Neutron API extensions this controller implements. Clients
//! probe for them before they start: kuryr-libnetwork refuses to run without
//! `subnet_allocation` and tags resources only when a tag extension is listed.

use axum::extract::Path;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::sync::Arc;

use crate::controller::Controller;
use crate::error::NeutronError;

/// Alias, name and what each extension adds; only what the API really serves.
const EXTENSIONS: &[(&str, &str, &str)] = &[
    (
        "subnet_allocation",
        "Subnet Allocation",
        "Enables allocation of subnets from a subnet pool",
    ),
    (
        "standard-attr-tag",
        "Tag support for resources with standard attribute",
        "Enables to set tag on resources with standard attribute.",
    ),
    ("tag", "Tag support", "Enables to set tag on resources."),
    (
        "tag-ext",
        "Tag support for resources: subnet, subnetpool, port, router",
        "Extends tag support to more L2 and L3 resources.",
    ),
    (
        "binding",
        "Port Binding",
        "Expose port bindings of a virtual port to external application",
    ),
    (
        "provider",
        "Provider Network",
        "Expose mapping of virtual networks to physical networks",
    ),
    (
        "router",
        "Neutron L3 Router",
        "Router abstraction for basic L3 forwarding between L2 Neutron networks and access to external networks via a NAT gateway.",
    ),
    (
        "extraroute",
        "Neutron Extra Route",
        "Extra routes configuration for L3 router",
    ),
    (
        "extraroute-atomic",
        "Atomically add/remove extra routes",
        "Edit extra routes of a router on server side by atomically adding/removing extra routes",
    ),
    (
        "ext-gw-mode",
        "Neutron L3 Configurable external gateway mode",
        "Extension of the router abstraction for specifying whether SNAT should occur on the external gateway",
    ),
    (
        "dvr",
        "Distributed Virtual Router",
        "Enables configuration of Distributed Virtual Routers.",
    ),
    (
        "external-net",
        "Neutron external network",
        "Adds external network attribute to network resource.",
    ),
    (
        "net-mtu",
        "Network MTU",
        "Provides MTU attribute for a network resource.",
    ),
    (
        "project-id",
        "project_id field enabled",
        "Extension that indicates that project_id field is enabled.",
    ),
    (
        "standard-attr-description",
        "standard-attr-description",
        "Extension to add descriptions to standard attributes",
    ),
    (
        "standard-attr-revisions",
        "Resource revision numbers",
        "This extension will display the revision number of neutron resources.",
    ),
    (
        "revision-if-match",
        "If-Match constraints based on revision_number",
        "Extension indicating that If-Match based on revision_number is supported.",
    ),
    (
        "pagination",
        "Pagination support",
        "Extension that indicates that pagination is enabled.",
    ),
    (
        "sorting",
        "Sorting support",
        "Extension that indicates that sorting is enabled.",
    ),
    (
        "fip-port-details",
        "Floating IP Port Details Extension",
        "Add port_details attribute to Floating IP resource",
    ),
    (
        "security-group",
        "security-group",
        "The security groups extension.",
    ),
    (
        "stateful-security-group",
        "Stateful security group",
        "Indicates if the security group is stateful or not",
    ),
    ("port-security", "Port Security", "Provides port security"),
    (
        "allowed-address-pairs",
        "Allowed Address Pairs",
        "Provides allowed address pairs",
    ),
    (
        "port-security-groups-filtering",
        "Port filtering on security groups",
        "Provides security groups filtering when listing ports",
    ),
];

fn extension((alias, name, description): &(&str, &str, &str)) -> Value {
    json!({"alias": alias, "name": name, "description": description,
           "updated": "2026-01-01T00:00:00-00:00", "links": []})
}

pub fn routes() -> Router<Arc<Controller>> {
    Router::new()
        .route(
            "/v2.0/extensions",
            get(|| async {
                Json(json!({"extensions": EXTENSIONS.iter().map(extension).collect::<Vec<_>>()}))
            }),
        )
        .route(
            "/v2.0/extensions/{alias}",
            get(|Path(alias): Path<String>| async move {
                EXTENSIONS
                    .iter()
                    .find(|e| e.0 == alias)
                    .map(|e| Json(json!({"extension": extension(e)})))
                    .ok_or_else(|| {
                        NeutronError::new(
                            StatusCode::NOT_FOUND,
                            "ExtensionNotFound",
                            format!("Extension with alias {alias} does not exist"),
                        )
                    })
            }),
        )
}
