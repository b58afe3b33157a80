//! Security groups and their rules through a real HTTP client against a spawned `corvid
//! controller`, on both stores: every call and refusal in Neutron's status, type and
//! message; the default group each project gets once, with Neutron's four rules, even
//! when its first ports are made at once; the groups ports get and keep; the watch feed.

#[path = "support/controller.rs"]
mod support;

use std::collections::HashSet;
use std::time::Duration;

use corvid_api::requests::SecurityGroupRuleCreate;
use corvid_api::{
    ApiError, Client, Direction, Ethertype, EventKind, Network, Port, SecurityGroup,
    SecurityGroupRule, Subnet, WatchFilter,
};
use serde_json::{json, Value};
use support::{redb_store, ControllerProcess, Etcd};

/// Runs `f` against a controller on each backend.
fn on_both(f: impl Fn(&ControllerProcess)) {
    let (_dir, spec) = redb_store();
    f(&ControllerProcess::start(&spec, None));
    let etcd = Etcd::start();
    f(&ControllerProcess::start(
        &format!("etcd:{}", etcd.url),
        None,
    ));
}

/// The status, type and message of a refusal.
fn refused<T: std::fmt::Debug>(r: Result<T, ApiError>) -> (u16, String, String) {
    match r {
        Err(ApiError::Neutron {
            status,
            kind,
            message,
        }) => (status, kind, message),
        other => panic!("expected a Neutron error, got {other:?}"),
    }
}

/// A refusal's status and type, with its message expected to be `message`.
fn refusal(status: u16, kind: &str, message: &str) -> (u16, String, String) {
    (status, kind.to_string(), message.to_string())
}

/// The groups of `project`, listed (which makes its default group if it has none).
fn groups_of(c: &Client, project: &str) -> Vec<SecurityGroup> {
    c.list::<SecurityGroup>(&[("project_id", project)])
        .unwrap()
        .0
}

/// The one default group of `project`.
fn default_of(c: &Client, project: &str) -> SecurityGroup {
    let defaults: Vec<SecurityGroup> = groups_of(c, project)
        .into_iter()
        .filter(|g| g.name == "default")
        .collect();
    assert_eq!(defaults.len(), 1, "{defaults:?}");
    defaults.into_iter().next().unwrap()
}

fn network_with_subnet(c: &Client, cidr: &str) -> (Network, Subnet) {
    let net: Network = c.create(json!({"name": "sg-net"})).unwrap();
    let sub: Subnet = c
        .create(json!({"network_id": net.id, "cidr": cidr, "ip_version": 4}))
        .unwrap();
    (net, sub)
}

/// Neutron's default group: egress of each version to anywhere, ingress of each version
/// from the group's own ports, nothing narrower.
fn assert_neutron_default(g: &SecurityGroup, project: &str) {
    assert_eq!(
        (g.name.as_str(), g.description.as_str(), g.stateful),
        ("default", "Default security group", true)
    );
    assert_eq!(
        (g.project_id.as_str(), g.tenant_id.as_str()),
        (project, project)
    );
    let mut shape: Vec<(Direction, Ethertype, Option<&str>)> = g
        .security_group_rules
        .iter()
        .map(|r| (r.direction, r.ethertype, r.remote_group_id.as_deref()))
        .collect();
    shape.sort_by_key(|s| format!("{s:?}"));
    let own = Some(g.id.as_str());
    assert_eq!(
        shape,
        [
            (Direction::Egress, Ethertype::Ipv4, None),
            (Direction::Egress, Ethertype::Ipv6, None),
            (Direction::Ingress, Ethertype::Ipv4, own),
            (Direction::Ingress, Ethertype::Ipv6, own),
        ]
    );
    for r in &g.security_group_rules {
        assert_eq!(r.security_group_id, g.id);
        assert_eq!(
            (
                &r.protocol,
                r.port_range_min,
                r.port_range_max,
                r.remote_ip_prefix
            ),
            (&None, None, None, None),
            "{r:?}"
        );
        assert_eq!(r.project_id, project);
    }
}

#[test]
fn groups_and_rules_are_made_shown_changed_and_refused_as_in_neutron() {
    on_both(|ctl| {
        let c = ctl.client();
        // A project's first look at its groups finds its default group, made once.
        let listed = groups_of(&c, "p1");
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_neutron_default(&listed[0], "p1");
        let default = default_of(&c, "p1");
        assert_eq!(
            default.id, listed[0].id,
            "listing again makes no second one"
        );
        let (rules, _) = c
            .list::<SecurityGroupRule>(&[("security_group_id", &default.id)])
            .unwrap();
        assert_eq!(rules.len(), 4);

        // A new group lets everything out, of either version, and nothing in.
        let web: SecurityGroup = c
            .create(
                json!({"name": "web", "description": "front", "project_id": "p1", "tags": ["t1"]}),
            )
            .unwrap();
        assert_eq!(
            (web.name.as_str(), web.description.as_str(), web.stateful),
            ("web", "front", true)
        );
        assert_eq!(
            (web.project_id.as_str(), web.tenant_id.as_str()),
            ("p1", "p1")
        );
        assert_eq!(web.tags, ["t1"]);
        assert!(!web.created_at.is_empty() && !web.updated_at.is_empty());
        let egress: Vec<(Direction, Ethertype)> = web
            .security_group_rules
            .iter()
            .map(|r| (r.direction, r.ethertype))
            .collect();
        assert_eq!(
            egress,
            [
                (Direction::Egress, Ethertype::Ipv4),
                (Direction::Egress, Ethertype::Ipv6)
            ]
        );
        assert_eq!(c.get::<SecurityGroup>(&web.id).unwrap(), web);
        let stateless: SecurityGroup = c
            .create(json!({"name": "raw", "stateful": false, "project_id": "p1"}))
            .unwrap();
        assert!(!stateless.stateful);
        for name in ["default", "Default"] {
            assert_eq!(
                refused(c.create::<SecurityGroup>(json!({"name": name, "project_id": "p1"}))),
                refusal(
                    409,
                    "SecurityGroupDefaultAlreadyExists",
                    "Default security group already exists."
                )
            );
        }
        assert_eq!(
            refused(c.create::<SecurityGroup>(json!({"name": "x", "id": "mine"}))),
            refusal(
                400,
                "HTTPBadRequest",
                "Invalid input for id. Reason: 'mine' is not a valid UUID."
            )
        );
        assert_eq!(
            refused(c.get::<SecurityGroup>("00000000-0000-0000-0000-000000000000")),
            refusal(
                404,
                "SecurityGroupNotFound",
                "Security group 00000000-0000-0000-0000-000000000000 does not exist"
            )
        );

        // Updates: name, description, statefulness; the default group keeps its name.
        let renamed: SecurityGroup = c
            .update(&web.id, json!({"name": "www", "description": "front door"}))
            .unwrap();
        assert_eq!(
            (renamed.name.as_str(), renamed.description.as_str()),
            ("www", "front door")
        );
        assert!(renamed.revision_number > web.revision_number);
        assert_eq!(
            renamed.security_group_rules, web.security_group_rules,
            "an update shows the rules"
        );
        assert_eq!(
            refused(c.update::<SecurityGroup>(&default.id, json!({"name": "mine"}))),
            refusal(
                409,
                "SecurityGroupCannotUpdateDefault",
                "Updating default security group not allowed."
            )
        );
        assert_eq!(
            refused(c.update::<SecurityGroup>(&web.id, json!({"name": "DEFAULT"}))).1,
            "SecurityGroupDefaultAlreadyExists"
        );
        let described: SecurityGroup = c
            .update(&default.id, json!({"description": "ours"}))
            .unwrap();
        assert_eq!(described.description, "ours");
        let flipped: SecurityGroup = c.update(&stateless.id, json!({"stateful": true})).unwrap();
        assert!(
            flipped.stateful,
            "no port has it: its statefulness may change"
        );
        assert_eq!(
            refused(c.update::<SecurityGroup>(&web.id, json!({"project_id": "p2"}))).0,
            400
        );

        // A rule: TCP 80 from a prefix, as given, and its network; the group shows it and
        // its revision moves.
        let before = c.get::<SecurityGroup>(&web.id).unwrap();
        let http: SecurityGroupRule = c
            .create(
                json!({"security_group_id": web.id, "direction": "ingress", "protocol": "tcp",
                "port_range_min": 80, "port_range_max": 80, "remote_ip_prefix": "10.0.0.5/24",
                "description": "http"}),
            )
            .unwrap();
        assert_eq!(
            (http.direction, http.ethertype, http.protocol.as_deref()),
            (Direction::Ingress, Ethertype::Ipv4, Some("tcp"))
        );
        assert_eq!(
            (http.port_range_min, http.port_range_max),
            (Some(80), Some(80))
        );
        assert_eq!(
            (
                http.remote_ip_prefix.map(|p| p.to_string()),
                http.normalized_cidr.map(|p| p.to_string())
            ),
            (Some("10.0.0.5/24".into()), Some("10.0.0.0/24".into()))
        );
        assert_eq!(
            (http.description.as_str(), http.project_id.as_str()),
            ("http", "p1")
        );
        let after = c.get::<SecurityGroup>(&web.id).unwrap();
        assert_eq!(after.revision_number, before.revision_number + 1);
        assert!(after.security_group_rules.contains(&http));
        assert_eq!(c.get::<SecurityGroupRule>(&http.id).unwrap(), http);

        // The same rule again, however spelt, is refused.
        let same = c.create::<SecurityGroupRule>(json!({"security_group_id": web.id,
            "direction": "ingress", "protocol": "6", "port_range_min": "80", "port_range_max": 80,
            "remote_ip_prefix": "10.0.0.5/24", "ethertype": "ipv4"}));
        assert_eq!(
            refused(same),
            refusal(
                409,
                "SecurityGroupRuleExists",
                &format!(
                    "Security group rule already exists. Rule id is {}.",
                    http.id
                )
            )
        );
        let egress_again = c.create::<SecurityGroupRule>(
            json!({"security_group_id": web.id, "direction": "egress"}),
        );
        assert_eq!(
            refused(egress_again).1,
            "SecurityGroupRuleExists",
            "the template's rule"
        );

        // A rule from the ports of a group, with the client's typed request.
        let from_default: SecurityGroupRule = c
            .create(SecurityGroupRuleCreate {
                protocol: Some("udp".into()),
                port_range_min: Some(53),
                port_range_max: Some(53),
                remote_group_id: Some(default.id.clone()),
                ..SecurityGroupRuleCreate::new(&web.id, Direction::Ingress)
            })
            .unwrap();
        assert_eq!(
            from_default.remote_group_id.as_deref(),
            Some(default.id.as_str())
        );
        assert_eq!(from_default.remote_ip_prefix, None);
        let icmp6: SecurityGroupRule = c
            .create(
                json!({"security_group_id": web.id, "direction": "ingress", "ethertype": "IPv6",
                "protocol": "icmp", "port_range_min": 128, "port_range_max": 0}),
            )
            .unwrap();
        assert_eq!(
            icmp6.protocol.as_deref(),
            Some("ipv6-icmp"),
            "IPv6's ICMP by its one name"
        );
        let any: SecurityGroupRule = c
            .create(
                json!({"security_group_id": web.id, "direction": "ingress", "protocol": "any",
                "remote_ip_prefix": "192.0.2.7"}),
            )
            .unwrap();
        assert_eq!(any.protocol, None);
        assert_eq!(
            any.remote_ip_prefix.map(|p| p.to_string()).as_deref(),
            Some("192.0.2.7/32")
        );

        // Refusals, each in Neutron's type and words.
        let rule = |extra: Value| {
            let mut body = json!({"security_group_id": web.id, "direction": "ingress"});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            refused(c.create::<SecurityGroupRule>(body))
        };
        assert_eq!(
            rule(json!({"protocol": "tcp", "port_range_min": 90, "port_range_max": 80})),
            refusal(
                400,
                "SecurityGroupInvalidPortRange",
                "For TCP/UDP protocols, port_range_min must be <= port_range_max"
            )
        );
        assert_eq!(
            rule(json!({"port_range_min": 80, "port_range_max": 80})),
            refusal(
                400,
                "SecurityGroupProtocolRequiredWithPorts",
                "Must also specify protocol if port range is given."
            )
        );
        assert_eq!(
            rule(json!({"protocol": "gre", "port_range_min": 80, "port_range_max": 80})),
            refusal(400, "SecurityGroupInvalidProtocolForPort", "Ports cannot be specified for protocol 47. Ports are only supported for DCCP, SCTP, TCP, UDP, UDPLITE.")
        );
        assert_eq!(
            rule(json!({"protocol": "icmp", "port_range_min": 300, "port_range_max": 0})),
            refusal(
                400,
                "SecurityGroupInvalidIcmpValue",
                "Invalid value for ICMP type (port_range_min) 300. It must be 0 to 255."
            )
        );
        assert_eq!(
            rule(json!({"protocol": "icmp", "port_range_min": 8, "port_range_max": 256})),
            refusal(
                400,
                "SecurityGroupInvalidIcmpValue",
                "Invalid value for ICMP code (port_range_max) 256. It must be 0 to 255."
            )
        );
        assert_eq!(
            rule(json!({"protocol": "tcp", "port_range_min": 70000, "port_range_max": 70000})),
            refusal(
                400,
                "SecurityGroupInvalidPortValue",
                "Invalid value for port 70000"
            )
        );
        assert_eq!(
            rule(json!({"remote_ip_prefix": "10.0.0.0/24", "remote_group_id": default.id})),
            refusal(400, "SecurityGroupMultipleRemoteEntites", "Only one of remote_ip_prefix or remote_group_id or remote_address_group_id may be provided.")
        );
        assert_eq!(
            rule(json!({"ethertype": "IPv6", "remote_ip_prefix": "10.0.0.0/24"})),
            refusal(
                400,
                "SecurityGroupRuleParameterConflict",
                "Conflicting value ethertype IPv6 for CIDR 10.0.0.0/24"
            )
        );
        assert_eq!(
            rule(json!({"protocol": "ipv6-icmp"})),
            refusal(
                400,
                "SecurityGroupEthertypeConflictWithProtocol",
                "Invalid ethertype IPv4 for protocol ipv6-icmp."
            )
        );
        assert_eq!(
            rule(json!({"protocol": "bogus"})).1,
            "SecurityGroupRuleInvalidProtocol"
        );
        assert_eq!(
            rule(json!({"ethertype": "IPv5"})),
            refusal(400, "SecurityGroupRuleInvalidEtherType", "Security group rule for ethertype 'IPv5' not supported. Allowed values are ['IPv4', 'IPv6'].")
        );
        assert_eq!(
            rule(json!({"direction": "up"})),
            refusal(
                400,
                "HTTPBadRequest",
                "Invalid input for direction. Reason: up is not in valid_values."
            )
        );
        assert_eq!(
            rule(json!({"remote_ip_prefix": "10.0.0.0/33"})),
            refusal(
                400,
                "InvalidCIDR",
                "Invalid CIDR 10.0.0.0/33 given as IP prefix."
            )
        );
        assert_eq!(
            rule(json!({"remote_group_id": "0190e5a5-0000-7000-8000-000000000000"})),
            refusal(
                404,
                "SecurityGroupNotFound",
                "Security group 0190e5a5-0000-7000-8000-000000000000 does not exist"
            )
        );
        assert_eq!(
            rule(json!({"security_group_id": "0190e5a5-0000-7000-8000-000000000001"})),
            refusal(
                404,
                "SecurityGroupNotFound",
                "Security group 0190e5a5-0000-7000-8000-000000000001 does not exist"
            )
        );
        assert_eq!(
            refused(c.create::<SecurityGroupRule>(json!({"direction": "ingress"}))),
            refusal(
                400,
                "HTTPBadRequest",
                "Failed to parse request. Required attribute 'security_group_id' not specified"
            )
        );
        assert_eq!(rule(json!({"tags": ["x"]})).0, 400, "rules take no tags");

        // A bulk is one group's, without duplicates, and all or nothing.
        let count = || {
            c.get::<SecurityGroup>(&web.id)
                .unwrap()
                .security_group_rules
                .len()
        };
        let had = count();
        let ssh = json!({"security_group_id": web.id, "direction": "ingress", "protocol": "tcp",
            "port_range_min": 22, "port_range_max": 22});
        let (s, v, _) = c
            .request(
                "POST",
                "/v2.0/security-group-rules",
                Some(&json!({"security_group_rules": [ssh, ssh]})),
            )
            .unwrap();
        assert_eq!(
            (s, v["NeutronError"]["type"].as_str()),
            (409, Some("DuplicateSecurityGroupRuleInPost")),
            "{v}"
        );
        let other_group =
            json!({"security_group_id": default.id, "direction": "ingress", "protocol": "tcp"});
        let (s, v, _) = c
            .request(
                "POST",
                "/v2.0/security-group-rules",
                Some(&json!({"security_group_rules": [ssh, other_group]})),
            )
            .unwrap();
        assert_eq!(
            (s, v["NeutronError"]["type"].as_str()),
            (400, Some("SecurityGroupNotSingleGroupRules")),
            "{v}"
        );
        assert_eq!(count(), had, "a refused bulk wrote nothing");
        let rdp = json!({"security_group_id": web.id, "direction": "ingress", "protocol": "tcp",
            "port_range_min": 3389, "port_range_max": 3389});
        let made = c.create_bulk::<SecurityGroupRule>(vec![ssh, rdp]).unwrap();
        assert_eq!(made.len(), 2);
        assert_eq!(count(), had + 2);

        // Rules never change; they go, and the group's revision moves.
        let (s, v, _) = c
            .request(
                "PUT",
                &format!("/v2.0/security-group-rules/{}", http.id),
                Some(&json!({"security_group_rule": {"description": "x"}})),
            )
            .unwrap();
        assert_eq!(
            (s, v["NeutronError"]["type"].as_str()),
            (405, Some("HTTPMethodNotAllowed"))
        );
        let before = c.get::<SecurityGroup>(&web.id).unwrap().revision_number;
        c.delete::<SecurityGroupRule>(&http.id).unwrap();
        let after = c.get::<SecurityGroup>(&web.id).unwrap();
        assert_eq!(after.revision_number, before + 1);
        assert!(!after.security_group_rules.iter().any(|r| r.id == http.id));
        assert_eq!(
            refused(c.delete::<SecurityGroupRule>(&http.id)),
            refusal(
                404,
                "SecurityGroupRuleNotFound",
                &format!("Security group rule {} does not exist", http.id)
            )
        );

        // Lists: filters, fields, sorting, pagination, tags.
        let (found, _) = c
            .list::<SecurityGroupRule>(&[("security_group_id", &web.id), ("protocol", "tcp")])
            .unwrap();
        assert_eq!(found.len(), 2, "{found:?}");
        let (_, v, _) = c
            .request(
                "GET",
                &format!("/v2.0/security-groups/{}?fields=id&fields=name", web.id),
                None,
            )
            .unwrap();
        assert_eq!(v["security_group"], json!({"id": web.id, "name": "www"}));
        let (_, v, _) = c
            .request(
                "GET",
                "/v2.0/security-groups?project_id=p1&sort_key=name&sort_dir=asc&fields=name",
                None,
            )
            .unwrap();
        assert_eq!(
            v["security_groups"],
            json!([{"name": "default"}, {"name": "raw"}, {"name": "www"}])
        );
        let (_, v, _) = c
            .request(
                "GET",
                "/v2.0/security-groups?project_id=p1&limit=2&sort_key=name",
                None,
            )
            .unwrap();
        let next = v["security_groups_links"][0]["href"].as_str().unwrap();
        assert!(next.contains("/v2.0/security-groups?"), "{next}");
        c.add_tag::<SecurityGroup>(&stateless.id, "t2").unwrap();
        let (tagged, _) = c.list::<SecurityGroup>(&[("tags-any", "t1,t2")]).unwrap();
        assert_eq!(tagged.len(), 2);

        // Deletes: never the default group; a group with the rules naming it elsewhere.
        assert_eq!(
            refused(c.delete::<SecurityGroup>(&default.id)),
            refusal(
                409,
                "SecurityGroupCannotRemoveDefault",
                "Insufficient rights for removing default security group."
            )
        );
        let naming: SecurityGroupRule = c
            .create(json!({"security_group_id": default.id, "direction": "ingress", "remote_group_id": stateless.id}))
            .unwrap();
        let default_before = c.get::<SecurityGroup>(&default.id).unwrap().revision_number;
        c.delete::<SecurityGroup>(&stateless.id).unwrap();
        assert_eq!(
            refused(c.get::<SecurityGroupRule>(&naming.id)).1,
            "SecurityGroupRuleNotFound"
        );
        let d = c.get::<SecurityGroup>(&default.id).unwrap();
        assert_eq!(d.revision_number, default_before + 1);
        assert_eq!(d.security_group_rules.len(), 4);
        c.delete::<SecurityGroup>(&web.id).unwrap();
        assert_eq!(
            refused(c.delete::<SecurityGroup>(&web.id)).1,
            "SecurityGroupNotFound"
        );
        let (left, _) = c
            .list::<SecurityGroupRule>(&[("project_id", "p1")])
            .unwrap();
        assert_eq!(
            left.len(),
            4,
            "only the default group's rules are left: {left:?}"
        );

        // Served, described and advertised.
        let (s, ext, _) = c
            .request("GET", "/v2.0/extensions/security-group", None)
            .unwrap();
        assert_eq!(
            (s, ext["extension"]["alias"].as_str()),
            (200, Some("security-group"))
        );
        let (_, all, _) = c.request("GET", "/v2.0/extensions", None).unwrap();
        let aliases: HashSet<&str> = all["extensions"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["alias"].as_str())
            .collect();
        for alias in [
            "stateful-security-group",
            "port-security",
            "allowed-address-pairs",
        ] {
            assert!(aliases.contains(alias), "{alias}");
        }
        let (_, doc, _) = c.request("GET", "/openapi.json", None).unwrap();
        let paths = &doc["paths"];
        assert!(paths["/v2.0/security-groups/{id}"]["put"].is_object());
        assert!(paths["/v2.0/security-groups/{id}/tags/{tag}"].is_object());
        assert!(paths["/v2.0/security-group-rules"]["post"].is_object());
        assert!(paths["/v2.0/security-group-rules/{id}"]["delete"].is_object());
        assert!(
            paths["/v2.0/security-group-rules/{id}"]
                .get("put")
                .is_none(),
            "rules never change"
        );
        assert!(
            paths.get("/v2.0/security-group-rules/{id}/tags").is_none(),
            "rules take no tags"
        );
        // What a create may send is what a show answers.
        let (_, shown, _) = c
            .request(
                "GET",
                &format!("/v2.0/security-groups/{}", default.id),
                None,
            )
            .unwrap();
        let rule_shown = serde_json::to_value(&d.security_group_rules[0]).unwrap();
        for (path, singular, shown) in [
            (
                "/v2.0/security-groups",
                "security_group",
                &shown["security_group"],
            ),
            (
                "/v2.0/security-group-rules",
                "security_group_rule",
                &rule_shown,
            ),
        ] {
            let create = &paths[path]["post"]["requestBody"]["content"]["application/json"]
                ["schema"]["properties"][singular]["properties"];
            for name in create.as_object().expect(path).keys() {
                assert!(
                    shown.get(name).is_some(),
                    "{singular} takes {name} but does not show it: {shown}"
                );
            }
        }
        let (_, root, _) = c.request("GET", "/v2.0/", None).unwrap();
        let collections: Vec<&str> = root["resources"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["links"][0]["href"].as_str())
            .collect();
        assert!(
            collections
                .iter()
                .any(|h| h.ends_with("/v2.0/security-group-rules")),
            "{collections:?}"
        );
    });
}

#[test]
fn ports_get_their_projects_default_group_and_keep_the_groups_they_have() {
    on_both(|ctl| {
        let c = ctl.client();
        let (net, sub) = network_with_subnet(&c, "10.20.0.0/24");
        let port = |body: Value| {
            let mut b = json!({"network_id": net.id, "project_id": "p2"});
            for (k, v) in body.as_object().unwrap() {
                b[k] = v.clone();
            }
            c.create::<Port>(b)
        };

        // Security off: no group, and the project gets no default group from it.
        let open: Port = port(json!({"port_security_enabled": false})).unwrap();
        assert_eq!(
            (open.port_security_enabled, open.security_groups.len()),
            (false, 0)
        );
        let (all, _) = c.list::<SecurityGroup>(&[("name", "default")]).unwrap();
        assert!(all.iter().all(|g| g.project_id != "p2"), "{all:?}");
        // The first port naming no group gets the project's default group, made for it.
        let first: Port = port(json!({})).unwrap();
        assert!(first.port_security_enabled);
        let default = default_of(&c, "p2");
        assert_neutron_default(&default, "p2");
        assert_eq!(first.security_groups, std::slice::from_ref(&default.id));
        let second: Port = port(json!({})).unwrap();
        assert_eq!(second.security_groups, first.security_groups);
        assert_eq!(groups_of(&c, "p2").len(), 1);

        let db: SecurityGroup = c.create(json!({"name": "db", "project_id": "p2"})).unwrap();
        let cache: SecurityGroup = c
            .create(json!({"name": "cache", "project_id": "p2"}))
            .unwrap();
        let raw: SecurityGroup = c
            .create(json!({"name": "raw", "project_id": "p2", "stateful": false}))
            .unwrap();
        let named: Port = port(json!({"security_groups": [db.id, db.id]})).unwrap();
        assert_eq!(
            named.security_groups,
            std::slice::from_ref(&db.id),
            "each group once"
        );
        let none: Port = port(json!({"security_groups": []})).unwrap();
        assert!(none.security_groups.is_empty());
        let nulled: Port = port(json!({"security_groups": null})).unwrap();
        assert!(
            nulled.security_groups.is_empty(),
            "null is an empty list, as in Neutron"
        );
        let unknown = "0190e5a5-0000-7000-8000-0000000000aa";
        assert_eq!(
            refused(port(json!({"security_groups": [db.id, unknown]}))),
            refusal(
                404,
                "SecurityGroupNotFound",
                &format!("Security group {unknown} does not exist")
            )
        );
        assert_eq!(
            refused(port(json!({"security_groups": [db.id, raw.id]}))).1,
            "SecurityGroupConflict",
            "stateful and stateless groups on one port"
        );
        assert_eq!(
            refused(port(json!({"port_security_enabled": false, "security_groups": [db.id]}))),
            refusal(400, "PortSecurityAndIPRequiredForSecurityGroups", "Port security must be enabled and port must have an IP address in order to use security groups.")
        );
        assert!(port(json!({"port_security_enabled": false, "security_groups": []})).is_ok());
        let (by_group, _) = c.list::<Port>(&[("security_groups", &db.id)]).unwrap();
        assert_eq!(
            by_group.iter().map(|p| &p.id).collect::<Vec<_>>(),
            [&named.id]
        );

        // The network's own ports get none, even naming some.
        let dhcp: Port =
            port(json!({"device_owner": "network:dhcp", "security_groups": [db.id]})).unwrap();
        assert!(dhcp.security_groups.is_empty());
        let router: corvid_api::Router = c.create(json!({"name": "r"})).unwrap();
        let iface = c
            .add_router_interface(
                &router.id,
                &corvid_api::RouterInterface {
                    subnet_id: Some(sub.id.clone()),
                    port_id: None,
                },
            )
            .unwrap();
        assert!(c
            .get::<Port>(&iface.port_id)
            .unwrap()
            .security_groups
            .is_empty());
        // A network without port security makes ports without it, and without groups.
        let closed: Network = c
            .create(json!({"name": "n2", "port_security_enabled": false}))
            .unwrap();
        c.create::<Subnet>(json!({"network_id": closed.id, "cidr": "10.21.0.0/24"}))
            .unwrap();
        let inherited: Port = c
            .create(json!({"network_id": closed.id, "project_id": "p2"}))
            .unwrap();
        assert_eq!(
            (
                inherited.port_security_enabled,
                inherited.security_groups.len()
            ),
            (false, 0)
        );

        // Allowed address pairs: checked, stored with a MAC each, only with port security.
        let paired: Port = port(json!({"allowed_address_pairs": [
            {"ip_address": "10.20.0.200"},
            {"ip_address": "10.30.0.0/24", "mac_address": "FA:16:3E:AA:BB:CC"}]}))
        .unwrap();
        assert_eq!(
            paired.allowed_address_pairs,
            [
                json!({"ip_address": "10.20.0.200", "mac_address": paired.mac_address}),
                json!({"ip_address": "10.30.0.0/24", "mac_address": "fa:16:3e:aa:bb:cc"})
            ]
        );
        assert_eq!(
            refused(port(
                json!({"port_security_enabled": false, "allowed_address_pairs": [{"ip_address": "10.20.0.9"}]})
            )),
            refusal(
                409,
                "AddressPairAndPortSecurityRequired",
                "Port Security must be enabled in order to have allowed address pairs on a port."
            )
        );
        assert_eq!(
            refused(port(
                json!({"allowed_address_pairs": [{"mac_address": "fa:16:3e:00:00:01"}]})
            )),
            refusal(
                400,
                "AllowedAddressPairsMissingIP",
                "AllowedAddressPair must contain ip_address"
            )
        );
        assert_eq!(
            refused(port(
                json!({"allowed_address_pairs": [{"ip_address": "10.20.0.300"}]})
            )),
            refusal(
                400,
                "HTTPBadRequest",
                "'10.20.0.300' is not a valid IP address"
            )
        );
        assert_eq!(
            refused(port(
                json!({"allowed_address_pairs": [{"ip_address": "10.20.0.0/40"}]})
            )),
            refusal(
                400,
                "HTTPBadRequest",
                "'10.20.0.0/40' is not a valid IP subnet"
            )
        );
        assert_eq!(
            refused(port(
                json!({"allowed_address_pairs": [{"ip_address": "10.20.0.9"}, {"ip_address": "10.20.0.9"}]})
            )),
            refusal(
                400,
                "DuplicateAddressPairInRequest",
                "Request contains duplicate address pair: mac_address None ip_address 10.20.0.9."
            )
        );
        assert_eq!(
            refused(port(
                json!({"allowed_address_pairs": [{"ip_address": "10.20.0.9", "mac_address": "nope"}]})
            )),
            refusal(400, "HTTPBadRequest", "'nope' is not a valid MAC address")
        );

        // A group in use stays, and keeps its statefulness; its description may change.
        assert_eq!(
            refused(c.delete::<SecurityGroup>(&db.id)),
            refusal(
                409,
                "SecurityGroupInUse",
                &format!("Security Group {} in use.", db.id)
            )
        );
        assert_eq!(
            refused(c.update::<SecurityGroup>(&db.id, json!({"stateful": false}))),
            refusal(
                409,
                "SecurityGroupInUse",
                &format!("Security Group {} in use.", db.id)
            )
        );
        c.update::<SecurityGroup>(&db.id, json!({"description": "still used"}))
            .unwrap();

        // A port's groups change by update, which bumps the port's revision.
        let moved: Port = c
            .update(&named.id, json!({"security_groups": [cache.id]}))
            .unwrap();
        assert_eq!(moved.security_groups, std::slice::from_ref(&cache.id));
        assert!(moved.revision_number > named.revision_number);
        assert_eq!(
            refused(c.update::<Port>(&named.id, json!({"security_groups": [unknown]}))).1,
            "SecurityGroupNotFound"
        );
        assert_eq!(
            c.get::<Port>(&named.id).unwrap().security_groups,
            std::slice::from_ref(&cache.id)
        );
        c.delete::<SecurityGroup>(&db.id)
            .expect("no port has it any more");

        // Port security goes off only without groups and pairs, which cannot come back.
        assert_eq!(
            refused(c.update::<Port>(&named.id, json!({"port_security_enabled": false}))),
            refusal(409, "PortSecurityPortHasSecurityGroup", "Port has security group associated. Cannot disable port security or IP address until security group is removed.")
        );
        let off: Port = c
            .update(
                &named.id,
                json!({"port_security_enabled": false, "security_groups": []}),
            )
            .unwrap();
        assert_eq!(
            (off.port_security_enabled, off.security_groups.len()),
            (false, 0)
        );
        assert_eq!(
            refused(c.update::<Port>(&named.id, json!({"security_groups": [cache.id]}))).1,
            "PortSecurityAndIPRequiredForSecurityGroups"
        );
        assert_eq!(
            refused(c.update::<Port>(
                &paired.id,
                json!({"port_security_enabled": false, "security_groups": []})
            ))
            .1,
            "AddressPairAndPortSecurityRequired",
            "its address pairs need port security"
        );
        let repaired: Port = c
            .update(&paired.id, json!({"allowed_address_pairs": [{"ip_address": "10.20.0.201", "mac_address": "fa:16:3e:00:00:02"}]}))
            .unwrap();
        assert_eq!(
            repaired.allowed_address_pairs,
            [json!({"ip_address": "10.20.0.201", "mac_address": "fa:16:3e:00:00:02"})]
        );

        // A group goes once its last port does.
        let only: Port = port(json!({"security_groups": [cache.id]})).unwrap();
        c.update::<Port>(
            &named.id,
            json!({"port_security_enabled": true, "security_groups": [cache.id]}),
        )
        .unwrap();
        assert_eq!(
            refused(c.delete::<SecurityGroup>(&cache.id)).1,
            "SecurityGroupInUse"
        );
        c.delete::<Port>(&only.id).unwrap();
        c.delete::<Port>(&named.id).unwrap();
        c.delete::<SecurityGroup>(&cache.id)
            .expect("its ports are gone");
    });
}

#[test]
fn ports_made_at_once_in_a_new_project_share_one_default_group() {
    on_both(|ctl| {
        let c = ctl.client();
        let (net, _) = network_with_subnet(&c, "10.22.0.0/24");
        for round in 0..4 {
            let project = format!("race-{round}");
            // Ports made at once, and a list racing them: each may be the one to make it.
            let threads: Vec<_> = (0..6)
                .map(|i| {
                    let (c, net, project) = (c.clone(), net.id.clone(), project.clone());
                    std::thread::spawn(move || {
                        if i == 5 {
                            return c
                                .list::<SecurityGroup>(&[("project_id", &project)])
                                .map(|_| Vec::new());
                        }
                        c.create::<Port>(json!({"network_id": net, "project_id": project}))
                            .map(|p| p.security_groups)
                    })
                })
                .collect();
            let groups: HashSet<Vec<String>> = threads
                .into_iter()
                .map(|t| t.join().unwrap().unwrap())
                .filter(|g| !g.is_empty())
                .collect();
            let default = default_of(&c, &project);
            assert_eq!(
                groups,
                HashSet::from([vec![default.id.clone()]]),
                "round {round}"
            );
            assert_neutron_default(&default, &project);
            let (rules, _) = c
                .list::<SecurityGroupRule>(&[("project_id", &project)])
                .unwrap();
            assert_eq!(
                rules.len(),
                4,
                "round {round}: one default group's rules: {rules:?}"
            );
        }
    });
}

/// A group deleted while ports take it and rules name it: whichever wins, no port and no
/// rule is left with a group that is gone.
#[test]
fn a_group_deleted_while_ports_take_it_and_rules_name_it_leaves_no_dangling_reference() {
    on_both(|ctl| {
        let c = ctl.client();
        let (net, _) = network_with_subnet(&c, "10.23.0.0/24");
        let keeper: SecurityGroup = c
            .create(json!({"name": "keeper", "project_id": "r"}))
            .unwrap();
        for round in 0..12 {
            let doomed: SecurityGroup = c
                .create(json!({"name": format!("doomed-{round}"), "project_id": "r"}))
                .unwrap();
            let takers: Vec<_> = (0..3)
                .map(|i| {
                    let (c, net, g, keeper) = (c.clone(), net.id.clone(), doomed.id.clone(), keeper.id.clone());
                    std::thread::spawn(move || match i {
                        0 => c
                            .create::<Port>(json!({"network_id": net, "project_id": "r", "security_groups": [g]}))
                            .map(drop),
                        _ => c
                            .create::<SecurityGroupRule>(json!({"security_group_id": keeper, "direction": "ingress",
                                "protocol": "tcp", "port_range_min": 1000 * round + i, "port_range_max": 1000 * round + i,
                                "remote_group_id": g}))
                            .map(drop),
                    })
                })
                .collect();
            let deleted = c.delete::<SecurityGroup>(&doomed.id);
            for t in takers {
                if let Err(e) = t.join().unwrap() {
                    assert_eq!(e.status(), Some(404), "round {round}: {e}");
                }
            }
            if let Err(e) = deleted {
                assert_eq!(
                    refused::<()>(Err(e)).1,
                    "SecurityGroupInUse",
                    "round {round}"
                );
            }
            let groups: HashSet<String> = c
                .list::<SecurityGroup>(&[])
                .unwrap()
                .0
                .into_iter()
                .map(|g| g.id)
                .collect();
            for p in c.list::<Port>(&[("network_id", &net.id)]).unwrap().0 {
                for g in &p.security_groups {
                    assert!(
                        groups.contains(g),
                        "round {round}: port {} has {g}, which is gone",
                        p.id
                    );
                }
            }
            for r in c.list::<SecurityGroupRule>(&[]).unwrap().0 {
                if let Some(g) = &r.remote_group_id {
                    assert!(
                        groups.contains(g),
                        "round {round}: rule {} names {g}, which is gone",
                        r.id
                    );
                }
            }
        }
    });
}

#[test]
fn the_watch_feed_carries_each_group_and_each_rule() {
    on_both(|ctl| {
        let c = ctl.client();
        let (_, start) = c.list::<SecurityGroup>(&[("project_id", "w")]).unwrap();
        let g: SecurityGroup = c
            .create(json!({"name": "watched", "project_id": "w"}))
            .unwrap();
        let r: SecurityGroupRule = c
            .create(
                json!({"security_group_id": g.id, "direction": "ingress", "protocol": "tcp",
                "port_range_min": 443, "port_range_max": 443}),
            )
            .unwrap();
        c.delete::<SecurityGroupRule>(&r.id).unwrap();
        let rules = WatchFilter {
            resource: Some("security_group_rules"),
            ..WatchFilter::default()
        };
        let page = c.watch(start, &rules, Duration::from_secs(1)).unwrap();
        let mine: Vec<_> = page.events.iter().filter(|e| e.id == r.id).collect();
        assert_eq!(mine.len(), 2, "{page:?}");
        assert_eq!(mine[0].kind, EventKind::Put);
        assert_eq!(mine[0].decode::<SecurityGroupRule>().unwrap(), r);
        assert_eq!(mine[1].kind, EventKind::Delete);
        let made = page
            .events
            .iter()
            .filter(|e| e.object["security_group_id"] == json!(g.id));
        assert_eq!(
            made.count(),
            4,
            "two template rules made and one rule made and gone"
        );
        let groups = WatchFilter {
            resource: Some("security_groups"),
            ..WatchFilter::default()
        };
        let page = c.watch(start, &groups, Duration::from_secs(1)).unwrap();
        let revisions: Vec<u64> = page
            .events
            .iter()
            .filter(|e| e.id == g.id)
            .map(|e| e.decode::<SecurityGroup>().unwrap().revision_number)
            .collect();
        assert_eq!(revisions, [1, 2, 3], "made, a rule made, a rule gone");
    });
}

/// A group made with its ID (as the Kubernetes watcher makes its groups, so that it finds
/// them again): made once; the same ID again, or the project's default group's, is
/// refused and changes nothing.
#[test]
fn a_group_made_with_its_id_is_made_once() {
    on_both(|ctl| {
        let c = ctl.client();
        let id = "4f1f1c3e-0000-4000-8000-000000000001";
        let g: SecurityGroup = c
            .create(json!({"id": id, "name": "np", "project_id": "p1"}))
            .unwrap();
        assert_eq!(g.id, id);
        assert_eq!(
            refused(
                c.create::<SecurityGroup>(json!({"id": id, "name": "again", "project_id": "p1"}))
            ),
            refusal(
                409,
                "SecurityGroupExists",
                &format!("A security group with id {id} already exists.")
            )
        );
        assert_eq!(c.get::<SecurityGroup>(id).unwrap().name, "np");
        let default = default_of(&c, "p1");
        let (status, kind, _) = refused(c.create::<SecurityGroup>(
            json!({"id": default.id, "name": "mine", "project_id": "p1"}),
        ));
        assert_eq!((status, kind.as_str()), (409, "SecurityGroupExists"));
        assert_eq!(default_of(&c, "p1"), default);
        // Made from the watcher's own request type too.
        let req = corvid_api::SecurityGroupCreate {
            id: Some("4f1f1c3e-0000-4000-8000-000000000002".into()),
            name: Some("typed".into()),
            ..Default::default()
        };
        let g: SecurityGroup = c
            .create_or_get("4f1f1c3e-0000-4000-8000-000000000002", req.clone())
            .unwrap();
        let again: SecurityGroup = c.create_or_get(&g.id, req).unwrap();
        assert_eq!(again, g, "create_or_get finds it");
        // A project's first group made with an ID gives the project its default too.
        let other: SecurityGroup = c
            .create(json!({"id": "4f1f1c3e-0000-4000-8000-000000000003", "name": "x", "project_id": "p2"}))
            .unwrap();
        assert_ne!(default_of(&c, "p2").id, other.id);
    });
}
