//! Security groups and their rules, in Neutron's shape. Each rule is its own store key, so
//! an agent watching the feed sees one small change per rule; a group is stored without
//! its rules and shown with them. Making or removing a rule bumps its group's revision in
//! the same transaction, which also makes two changes to one group's rules take turns.
//! Every project has a group named `default`, made the first time the project needs one
//! under an ID derived from the project: two requests making it at once write one key, and
//! the second's compare fails.

use std::collections::HashSet;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use corvid_api::protocols::{
    number as protocol_number, ICMP_PROTOCOLS, IPV6_PROTOCOLS, PORT_PROTOCOLS, PROTOCOLS,
};
use corvid_api::{
    Direction, Ethertype, Resource, SecurityGroup, SecurityGroupCreate, SecurityGroupRule,
    SecurityGroupRuleCreate, SecurityGroupUpdate,
};
use ipnet::IpNet;
use serde_json::{json, Map, Value};
use uuid::Uuid;

use super::attributes::{
    Attribute, Attributes, Type, Write, DESCRIPTION, NAME, NEUTRON, PROJECT_ID, TENANT_ID,
};
use super::{
    answer_as, body, if_match, list, lookup, named_project, project_of, request, show_route,
    to_stored, update_with, Ctl, Kind, Query, Tagged,
};
use crate::controller::Controller;
use crate::error::NeutronError;
use crate::keys;
use crate::query::ListQuery;
use crate::store::{Compare, Op, Txn};
use crate::util::{new_id, now};
use crate::view::{Table, View};

/// What a client may send of a security group.
pub(super) const SECURITY_GROUP: Attributes = Attributes {
    singular: "security_group",
    plural: "security_groups",
    common: &NEUTRON,
    own: &[
        Attribute::create("id", Type::Text),
        NAME,
        DESCRIPTION,
        Attribute::both("stateful", Type::Bool),
    ],
};

/// What a client may send of a security group rule: rules take no tags and never change.
pub(super) const SECURITY_GROUP_RULE: Attributes = Attributes {
    singular: "security_group_rule",
    plural: "security_group_rules",
    common: &[PROJECT_ID, TENANT_ID],
    own: &[
        Attribute::create("security_group_id", Type::Text),
        Attribute::create("direction", Type::Choice(&["ingress", "egress"])),
        Attribute::create("ethertype", Type::Choice(&["IPv4", "IPv6"])),
        Attribute::create("protocol", Type::Text),
        Attribute::create("port_range_min", Type::Int),
        Attribute::create("port_range_max", Type::Int),
        Attribute::create("remote_ip_prefix", Type::Text),
        Attribute::create("remote_group_id", Type::Text),
        Attribute::create("description", Type::Text),
    ],
};

/// The name of the group every project has.
const DEFAULT: &str = "default";

/// Where default groups' IDs are derived from the project's name. Fixed for ever: another
/// would give every project a second default group.
const DEFAULT_GROUPS: Uuid = Uuid::from_u128(0x5c1d_0b8e_4f3a_4e7b_9a51_2d6c_8e0f_a713);

/// The routes of both collections; rules have no update.
pub fn routes() -> Router<Arc<Controller>> {
    Router::new()
        .route(
            "/v2.0/security-groups",
            get(list_groups).post(create_groups),
        )
        .route(
            "/v2.0/security-groups/{id}",
            show_route::<SecurityGroup>()
                .put(update_group)
                .delete(delete_group),
        )
        .route(
            "/v2.0/security-group-rules",
            get(list_rules).post(create_rules),
        )
        .route(
            "/v2.0/security-group-rules/{id}",
            show_route::<SecurityGroupRule>().delete(delete_rule),
        )
}

impl Kind for SecurityGroup {
    const TITLE: &'static str = "SecurityGroup";
    type Stored = Self;
    fn table(v: &View) -> &Table<Self> {
        &v.security_groups
    }
    fn expand(stored: &Arc<Self>) -> Arc<Self> {
        stored.clone()
    }
    fn stamps(&mut self) -> (&mut u64, &mut String) {
        (&mut self.revision_number, &mut self.updated_at)
    }
    fn missing(id: &str) -> NeutronError {
        group_not_found(id)
    }
    fn shown(v: &View, obj: &Arc<Self>) -> Arc<Self> {
        let mut g = (**obj).clone();
        g.security_group_rules = v.rules_of(&g.id).map(|r| (**r).clone()).collect();
        Arc::new(g)
    }
}

impl Tagged for SecurityGroup {
    fn tags_mut(&mut self) -> &mut Vec<String> {
        &mut self.tags
    }
}

impl Kind for SecurityGroupRule {
    const TITLE: &'static str = "SecurityGroupRule";
    type Stored = Self;
    fn table(v: &View) -> &Table<Self> {
        &v.security_group_rules
    }
    fn expand(stored: &Arc<Self>) -> Arc<Self> {
        stored.clone()
    }
    fn stamps(&mut self) -> (&mut u64, &mut String) {
        (&mut self.revision_number, &mut self.updated_at)
    }
    fn missing(id: &str) -> NeutronError {
        NeutronError::new(
            StatusCode::NOT_FOUND,
            "SecurityGroupRuleNotFound",
            format!("Security group rule {id} does not exist"),
        )
    }
}

/// Neutron's 404 for groups: several IDs at once when a port names them.
fn group_not_found(ids: &str) -> NeutronError {
    NeutronError::new(
        StatusCode::NOT_FOUND,
        "SecurityGroupNotFound",
        format!("Security group {ids} does not exist"),
    )
}

/// Neutron's 409 for a group that ports have.
fn group_in_use(id: &str) -> NeutronError {
    NeutronError::conflict("SecurityGroupInUse", format!("Security Group {id} in use."))
}

/// A 400 of Neutron's exception `kind` (an `InvalidInput`), whose message is its own.
fn invalid(kind: &str, message: impl Into<String>) -> NeutronError {
    NeutronError::new(StatusCode::BAD_REQUEST, kind, message)
}

/// A value as Neutron's messages print it (Python's `str`): strings bare, `null` as None.
fn py(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        other => other.to_string(),
    }
}

/// The ID of `project`'s default group.
pub(super) fn default_group_id(project: &str) -> String {
    Uuid::new_v5(&DEFAULT_GROUPS, project.as_bytes()).to_string()
}

fn group_key(id: &str) -> String {
    keys::resource(SecurityGroup::PLURAL, id)
}

fn rule_key(id: &str) -> String {
    keys::resource(SecurityGroupRule::PLURAL, id)
}

/// A new group, without rules.
fn new_group(
    id: String,
    name: &str,
    description: &str,
    project: &str,
    stateful: bool,
    tags: Vec<String>,
) -> SecurityGroup {
    let t = now();
    SecurityGroup {
        id,
        name: name.into(),
        description: description.into(),
        tenant_id: project.into(),
        project_id: project.into(),
        stateful,
        security_group_rules: Vec::new(),
        tags,
        created_at: t.clone(),
        updated_at: t,
        revision_number: 1,
    }
}

/// A rule of `group` with everything unset but its direction and version.
fn bare_rule(
    group: &SecurityGroup,
    direction: Direction,
    ethertype: Ethertype,
) -> SecurityGroupRule {
    let t = now();
    SecurityGroupRule {
        id: new_id(),
        security_group_id: group.id.clone(),
        direction,
        ethertype,
        protocol: None,
        port_range_min: None,
        port_range_max: None,
        remote_ip_prefix: None,
        normalized_cidr: None,
        remote_group_id: None,
        description: String::new(),
        tenant_id: group.project_id.clone(),
        project_id: group.project_id.clone(),
        created_at: t.clone(),
        updated_at: t,
        revision_number: 0,
    }
}

/// The rules a new group starts with, Neutron's default template: anything may leave, of
/// either version; the default group also lets in what its own ports send.
fn template_rules(group: &SecurityGroup, default: bool) -> Vec<SecurityGroupRule> {
    let mut rules = Vec::new();
    for ethertype in [Ethertype::Ipv4, Ethertype::Ipv6] {
        if default {
            let mut ingress = bare_rule(group, Direction::Ingress, ethertype);
            ingress.remote_group_id = Some(group.id.clone());
            rules.push(ingress);
        }
        rules.push(bare_rule(group, Direction::Egress, ethertype));
    }
    rules
}

/// Drafts a new group and its rules into `txn`, the group's key checked absent.
fn draft_group(group: &SecurityGroup, rules: &[SecurityGroupRule], txn: &mut Txn) {
    let key = group_key(&group.id);
    txn.compares.push(Compare::CreateRevision(key.clone(), 0));
    for r in rules {
        txn.ops.push(Op::Put(rule_key(&r.id), to_stored(r)));
    }
    txn.ops.push(Op::Put(key, to_stored(group)));
}

/// Drafts `project`'s default group into `txn`, unless the view has it or `txn` makes it
/// already (a bulk of ports of one project); returns its ID.
pub(super) fn ensure_default(v: &View, project: &str, txn: &mut Txn) -> String {
    let id = default_group_id(project);
    let key = group_key(&id);
    let made = |op: &Op| matches!(op, Op::Put(k, _) if *k == key);
    if v.security_groups.contains_key(id.as_str()) || txn.ops.iter().any(made) {
        return id;
    }
    let group = new_group(
        id.clone(),
        DEFAULT,
        "Default security group",
        project,
        true,
        Vec::new(),
    );
    draft_group(&group, &template_rules(&group, true), txn);
    id
}

/// The groups a port names, checked as Neutron checks them: each exists, in the view (and
/// `txn` checks it still does) or made by `txn` itself, and they are all stateful or all
/// stateless. Each once, in the order named.
pub(super) fn port_groups(
    v: &View,
    named: &[String],
    txn: &mut Txn,
) -> Result<Vec<String>, NeutronError> {
    let mut seen = HashSet::new();
    let groups: Vec<String> = named
        .iter()
        .filter(|g| seen.insert(g.as_str()))
        .cloned()
        .collect();
    let mut missing = Vec::new();
    let mut stateful = HashSet::new();
    for g in &groups {
        let key = group_key(g);
        match v.security_groups.get(g.as_str()) {
            Some(e) => {
                stateful.insert(e.obj.stateful);
                txn.compares
                    .push(Compare::CreateRevision(key, e.create_revision));
            }
            // Only a default group, always stateful, is made alongside a port.
            None if txn
                .ops
                .iter()
                .any(|op| matches!(op, Op::Put(k, _) if *k == key)) =>
            {
                stateful.insert(true);
            }
            None => missing.push(g.as_str()),
        }
    }
    if !missing.is_empty() {
        return Err(group_not_found(&missing.join(", ")));
    }
    if stateful.len() > 1 {
        return Err(NeutronError::conflict(
            "SecurityGroupConflict",
            "Error Cannot apply both stateful and stateless security groups on the same port at the same time while attempting the operation.",
        ));
    }
    Ok(groups)
}

/// Ensures the default group of the project a list is for: the one its `project_id` (or
/// `tenant_id`) filter names, else the request's. Neutron makes it on a list too, so a
/// project's first look at its groups finds it.
async fn ensure_listed_default(
    c: &Controller,
    raw: Option<&str>,
    headers: &HeaderMap,
) -> Result<(), NeutronError> {
    let q = ListQuery::parse(raw)?;
    let first = |attr: &str| q.filter(attr).and_then(|v| v.first()).map(String::as_str);
    let project = project_of(first("project_id"), first("tenant_id"), headers);
    if c.view()
        .security_groups
        .contains_key(default_group_id(&project).as_str())
    {
        return Ok(());
    }
    c.transact(|v| {
        let mut txn = Txn::default();
        ensure_default(v, &project, &mut txn);
        Ok((txn, ()))
    })
    .await
}

async fn list_groups(
    State(c): Ctl,
    headers: HeaderMap,
    Query(q): Query,
) -> Result<Response, NeutronError> {
    ensure_listed_default(&c, q.as_deref(), &headers).await?;
    list::<SecurityGroup>(&c, q.as_deref(), None)
}

async fn list_rules(
    State(c): Ctl,
    headers: HeaderMap,
    Query(q): Query,
) -> Result<Response, NeutronError> {
    ensure_listed_default(&c, q.as_deref(), &headers).await?;
    list::<SecurityGroupRule>(&c, q.as_deref(), None)
}

/// A group's name may not be `default`, in any case: that name is the project's own group.
fn check_name(name: Option<&str>) -> Result<(), NeutronError> {
    match name {
        Some(n) if n.eq_ignore_ascii_case(DEFAULT) => Err(NeutronError::conflict(
            "SecurityGroupDefaultAlreadyExists",
            "Default security group already exists.",
        )),
        _ => Ok(()),
    }
}

/// POST of one group or of `{"security_groups": [...]}`, all in one transaction, each with
/// the default template's rules; the project's default group is made first if it has none.
async fn create_groups(
    State(c): Ctl,
    headers: HeaderMap,
    b: Bytes,
) -> Result<Response, NeutronError> {
    let (bulk, objs) = SECURITY_GROUP.objects(&body(&b)?)?;
    let mut asked = Vec::new();
    for o in &objs {
        let req: SecurityGroupCreate = request(o, &["project_id", "tenant_id"])?;
        check_name(req.name.as_deref())?;
        // An ID given (corvid's extension, as for networks) is a UUID, as the ones made.
        if let Some(id) = req.id.as_deref().filter(|id| Uuid::parse_str(id).is_err()) {
            return Err(NeutronError::bad_request(format!(
                "Invalid input for id. Reason: '{id}' is not a valid UUID."
            )));
        }
        asked.push(req);
    }
    let groups = c
        .transact(|v| {
            let mut txn = Txn::default();
            let mut groups = Vec::new();
            for req in &asked {
                let project = project_of(
                    req.project_id.as_deref(),
                    req.tenant_id.as_deref(),
                    &headers,
                );
                let default = ensure_default(v, &project, &mut txn);
                let id = req.id.clone().unwrap_or_else(new_id);
                if id == default
                    || v.security_groups.contains_key(id.as_str())
                    || groups.iter().any(|g: &SecurityGroup| g.id == id)
                {
                    return Err(NeutronError::conflict(
                        "SecurityGroupExists",
                        format!("A security group with id {id} already exists."),
                    ));
                }
                let mut group = new_group(
                    id,
                    req.name.as_deref().unwrap_or_default(),
                    req.description.as_deref().unwrap_or_default(),
                    &project,
                    req.stateful.unwrap_or(true),
                    req.tags.clone().unwrap_or_default(),
                );
                let rules = template_rules(&group, false);
                draft_group(&group, &rules, &mut txn);
                group.security_group_rules = rules;
                groups.push(group);
            }
            Ok((txn, groups))
        })
        .await?;
    Ok(if bulk {
        answer_as(StatusCode::CREATED, "security_groups", &groups)
    } else {
        answer_as(StatusCode::CREATED, "security_group", &groups[0])
    })
}

async fn update_group(
    State(c): Ctl,
    Path(id): Path<String>,
    headers: HeaderMap,
    b: Bytes,
) -> Result<Response, NeutronError> {
    let attrs = SECURITY_GROUP.object(&body(&b)?, Write::Update)?;
    let req: SecurityGroupUpdate = request(&attrs, &[])?;
    check_name(req.name.as_deref())?;
    let group = update_with::<SecurityGroup>(&c, &id, if_match(&headers), |v, g, txn| {
        if let Some(stateful) = req.stateful.filter(|s| *s != g.stateful) {
            // Agents would have to switch the ports' connection tracking under them.
            if v.ports
                .values()
                .any(|p| p.obj.security_groups.iter().any(|x| **x == *g.id))
            {
                return Err(group_in_use(&g.id));
            }
            txn.compares
                .push(Compare::PrefixEmpty(keys::group_users(&g.id)));
            g.stateful = stateful;
        }
        if let Some(name) = &req.name {
            if g.name == DEFAULT {
                return Err(NeutronError::conflict(
                    "SecurityGroupCannotUpdateDefault",
                    "Updating default security group not allowed.",
                ));
            }
            g.name = name.clone();
        }
        if let Some(d) = &req.description {
            g.description = d.clone();
        }
        Ok(())
    })
    .await?;
    let shown = SecurityGroup::shown(&c.view(), &Arc::new(group));
    Ok(answer_as(StatusCode::OK, "security_group", &*shown))
}

/// A group is bumped (its revision and update time) when its rules change.
fn bump(e: &crate::view::Entry<SecurityGroup>, txn: &mut Txn) {
    let mut g = (*e.obj).clone();
    g.revision_number += 1;
    g.updated_at = now();
    let key = group_key(&g.id);
    txn.compares
        .push(Compare::ModRevision(key.clone(), e.mod_revision));
    txn.ops.push(Op::Put(key, to_stored(&g)));
}

/// DELETE of a group no port has, with its rules and, as Neutron's cascade does, the
/// rules of other groups that name it as their remote group.
async fn delete_group(State(c): Ctl, Path(id): Path<String>) -> Result<StatusCode, NeutronError> {
    c.transact_named(|v| {
        if v.ports
            .values()
            .any(|p| p.obj.security_groups.iter().any(|x| **x == *id))
        {
            return Err(group_in_use(&id));
        }
        let e = lookup::<SecurityGroup>(v, &id)?;
        if e.obj.name == DEFAULT {
            return Err(NeutronError::conflict(
                "SecurityGroupCannotRemoveDefault",
                "Insufficient rights for removing default security group.",
            ));
        }
        let key = group_key(&id);
        let mut txn = Txn {
            compares: vec![
                Compare::ModRevision(key.clone(), e.mod_revision),
                Compare::PrefixEmpty(keys::group_users(&id)),
            ],
            ops: vec![Op::Delete(key)],
        };
        for r in v.rules_of(&id) {
            txn.ops.push(Op::Delete(rule_key(&r.id)));
        }
        let mut bumped = HashSet::new();
        for r in v.security_group_rules.values().filter(|r| {
            r.obj.remote_group_id.as_deref() == Some(id.as_str()) && r.obj.security_group_id != id
        }) {
            txn.compares
                .push(Compare::ModRevision(rule_key(&r.obj.id), r.mod_revision));
            txn.ops.push(Op::Delete(rule_key(&r.obj.id)));
            let owner = &r.obj.security_group_id;
            if let Some(g) = v.security_groups.get(owner.as_str()) {
                if bumped.insert(owner.clone()) {
                    bump(g, &mut txn);
                }
            }
        }
        Ok((txn, ()))
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn delete_rule(State(c): Ctl, Path(id): Path<String>) -> Result<StatusCode, NeutronError> {
    c.transact_named(|v| {
        let e = lookup::<SecurityGroupRule>(v, &id)?;
        let key = rule_key(&id);
        let mut txn = Txn {
            compares: vec![Compare::ModRevision(key.clone(), e.mod_revision)],
            ops: vec![Op::Delete(key)],
        };
        if let Some(g) = v.security_groups.get(e.obj.security_group_id.as_str()) {
            bump(g, &mut txn);
        }
        Ok((txn, ()))
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Neutron's `convert_protocol`: `null` and `any` are any protocol, a number must be one
/// of 0 to 255, a name one Neutron knows (in any case).
fn convert_protocol(v: &Value) -> Result<Value, NeutronError> {
    let refused = || {
        let names: Vec<String> = PROTOCOLS.iter().map(|(n, _)| format!("'{n}'")).collect();
        invalid(
            "SecurityGroupRuleInvalidProtocol",
            format!(
                "Security group rule protocol {} not supported. Only protocol values (None, 'any', {}) and integer representations [0 to 255] are supported.",
                py(v),
                names.join(", ")
            ),
        )
    };
    let text = match v {
        Value::Null => return Ok(Value::Null),
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        _ => return Err(refused()),
    };
    if text.eq_ignore_ascii_case("any") {
        return Ok(Value::Null);
    }
    match text.parse::<i64>() {
        Ok(n) if (0..=255).contains(&n) => Ok(Value::String(text)),
        Ok(_) => Err(refused()),
        Err(_) => {
            let lower = text.to_ascii_lowercase();
            if PROTOCOLS.iter().any(|(name, _)| *name == lower) {
                Ok(Value::String(lower))
            } else {
                Err(refused())
            }
        }
    }
}

/// Neutron's `convert_validate_port_value`: a number (or its text) of 0 to 65535.
fn convert_port(v: &Value) -> Result<Value, NeutronError> {
    let port = match v {
        Value::Null => return Ok(Value::Null),
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    };
    match port.filter(|p| *p <= 65535) {
        Some(p) => Ok(json!(p)),
        None => Err(invalid(
            "SecurityGroupInvalidPortValue",
            format!("Invalid value for port {}", py(v)),
        )),
    }
}

/// A rule's attributes converted and checked as Neutron's API layer does before its
/// plugin sees them: required ones present, names and numbers in their one spelling.
fn rule_request(mut obj: Map<String, Value>) -> Result<SecurityGroupRuleCreate, NeutronError> {
    for required in ["security_group_id", "direction"] {
        if !obj.contains_key(required) {
            return Err(NeutronError::bad_request(format!(
                "Failed to parse request. Required attribute '{required}' not specified"
            )));
        }
    }
    if let Some(d) = obj.get("direction") {
        if !matches!(d.as_str(), Some("ingress" | "egress")) {
            return Err(NeutronError::bad_request(format!(
                "Invalid input for direction. Reason: {} is not in valid_values.",
                py(d)
            )));
        }
    }
    if let Some(p) = obj.get_mut("protocol") {
        *p = convert_protocol(p)?;
    }
    for name in ["port_range_min", "port_range_max"] {
        if let Some(p) = obj.get_mut(name) {
            *p = convert_port(p)?;
        }
    }
    if let Some(e) = obj.get_mut("ethertype") {
        let known = [Ethertype::Ipv4, Ethertype::Ipv6].into_iter().find(|t| {
            e.as_str()
                .is_some_and(|s| s.eq_ignore_ascii_case(t.as_str()))
        });
        match known {
            Some(t) => *e = json!(t),
            None => {
                return Err(invalid(
                    "SecurityGroupRuleInvalidEtherType",
                    format!(
                        "Security group rule for ethertype '{}' not supported. Allowed values are ['IPv4', 'IPv6'].",
                        py(e)
                    ),
                ))
            }
        }
    }
    if let Some(prefix) = obj.get_mut("remote_ip_prefix") {
        let given = prefix.as_str().unwrap_or_default();
        *prefix = if prefix.is_null() || given.is_empty() {
            Value::Null
        } else {
            // A bare address is a prefix of one address, as Neutron takes it.
            let parsed = given
                .parse::<IpNet>()
                .or_else(|_| given.parse::<std::net::IpAddr>().map(IpNet::from));
            match parsed {
                Ok(net) => json!(net),
                Err(_) => {
                    return Err(NeutronError::new(
                        StatusCode::BAD_REQUEST,
                        "InvalidCIDR",
                        format!("Invalid CIDR {} given as IP prefix.", py(prefix)),
                    ))
                }
            }
        };
    }
    let nullable = [
        "protocol",
        "port_range_min",
        "port_range_max",
        "remote_ip_prefix",
        "remote_group_id",
        "project_id",
        "tenant_id",
    ];
    request(&obj, &nullable)
}

/// Neutron's checks of a rule's attributes together, in its order, on its canonical form:
/// IPv6 ICMP by one name and number, and a port range of every port as none.
fn check_rule(r: &mut SecurityGroupRuleCreate) -> Result<(), NeutronError> {
    let ethertype = r.ethertype.unwrap_or_default();
    if ethertype == Ethertype::Ipv6 {
        match r.protocol.as_deref() {
            Some("icmp" | "icmpv6") => r.protocol = Some("ipv6-icmp".into()),
            Some("1") => r.protocol = Some("58".into()),
            _ => {}
        }
    }
    if (r.port_range_min, r.port_range_max) == (Some(1), Some(65535)) {
        (r.port_range_min, r.port_range_max) = (None, None);
    }
    let number = r.protocol.as_deref().and_then(protocol_number);
    let (min, max) = (r.port_range_min, r.port_range_max);
    if min.is_some() || max.is_some() {
        let Some(number) = number else {
            return Err(invalid(
                "SecurityGroupProtocolRequiredWithPorts",
                "Must also specify protocol if port range is given.",
            ));
        };
        if PORT_PROTOCOLS.contains(&number) {
            if min == Some(0) || max == Some(0) {
                return Err(invalid(
                    "SecurityGroupInvalidPortValue",
                    "Invalid value for port 0",
                ));
            }
            if !matches!((min, max), (Some(a), Some(b)) if a <= b) {
                return Err(invalid(
                    "SecurityGroupInvalidPortRange",
                    "For TCP/UDP protocols, port_range_min must be <= port_range_max",
                ));
            }
        } else if ICMP_PROTOCOLS.contains(&number) {
            for (value, attr, field) in [
                (min, "port_range_min", "type"),
                (max, "port_range_max", "code"),
            ] {
                if let Some(value) = value.filter(|v| *v > 255) {
                    return Err(invalid(
                        "SecurityGroupInvalidIcmpValue",
                        format!(
                            "Invalid value for ICMP {field} ({attr}) {value}. It must be 0 to 255."
                        ),
                    ));
                }
            }
            if let (None, Some(code)) = (min, max) {
                return Err(invalid(
                    "SecurityGroupMissingIcmpType",
                    format!("ICMP code (port-range-max) {code} is provided but ICMP type (port-range-min) is missing."),
                ));
            }
        } else {
            return Err(invalid(
                "SecurityGroupInvalidProtocolForPort",
                format!("Ports cannot be specified for protocol {number}. Ports are only supported for DCCP, SCTP, TCP, UDP, UDPLITE."),
            ));
        }
    }
    if let Some(prefix) = r.remote_ip_prefix {
        if Ethertype::of(prefix.addr()) != ethertype {
            return Err(invalid(
                "SecurityGroupRuleParameterConflict",
                format!("Conflicting value ethertype {ethertype} for CIDR {prefix}"),
            ));
        }
    }
    if let (Ethertype::Ipv4, Some(p)) = (ethertype, &r.protocol) {
        if number.is_some_and(|n| IPV6_PROTOCOLS.contains(&n)) {
            return Err(invalid(
                "SecurityGroupEthertypeConflictWithProtocol",
                format!("Invalid ethertype IPv4 for protocol {p}."),
            ));
        }
    }
    if r.remote_ip_prefix.is_some() && r.remote_group_id.is_some() {
        return Err(invalid(
            "SecurityGroupMultipleRemoteEntites",
            "Only one of remote_ip_prefix or remote_group_id or remote_address_group_id may be provided.",
        ));
    }
    Ok(())
}

/// What makes two rules the same rule, as Neutron compares them: a protocol by its number,
/// and a prefix of every address as none.
type RuleIdentity = (
    Direction,
    Ethertype,
    Option<u16>,
    Option<u16>,
    Option<u8>,
    Option<String>,
    Option<IpNet>,
    String,
);

fn identity(r: &SecurityGroupRule) -> RuleIdentity {
    (
        r.direction,
        r.ethertype,
        r.port_range_min,
        r.port_range_max,
        r.protocol.as_deref().and_then(protocol_number),
        r.remote_group_id.clone(),
        r.remote_ip_prefix.filter(|p| p.prefix_len() != 0),
        r.security_group_id.clone(),
    )
}

/// POST of one rule or of `{"security_group_rules": [...]}` of one group and project,
/// all in one transaction that bumps the group.
async fn create_rules(
    State(c): Ctl,
    headers: HeaderMap,
    b: Bytes,
) -> Result<Response, NeutronError> {
    let (bulk, objs) = SECURITY_GROUP_RULE.objects(&body(&b)?)?;
    let mut asked = Vec::new();
    for o in objs {
        asked.push(rule_request(o)?);
    }
    // A rule a request names no project for is its group's project's.
    let project = |r: &SecurityGroupRuleCreate| {
        named_project(r.project_id.as_deref(), r.tenant_id.as_deref(), &headers)
    };
    if asked
        .iter()
        .any(|r| r.security_group_id != asked[0].security_group_id)
    {
        return Err(invalid(
            "SecurityGroupNotSingleGroupRules",
            "Only allowed to update rules for one security profile at a time",
        ));
    }
    if asked.iter().any(|r| project(r) != project(&asked[0])) {
        return Err(invalid(
            "SecurityGroupRulesNotSingleProject",
            "Multiple project_ids in bulk security group rule create not allowed",
        ));
    }
    for r in &mut asked {
        check_rule(r)?;
    }
    let rules = c
        .transact(|v| {
            let group_id = &asked[0].security_group_id;
            let mut txn = Txn::default();
            let mut touched = HashSet::new();
            let mut rules = Vec::new();
            for r in &asked {
                if let Some(remote) = r.remote_group_id.as_deref() {
                    let e = lookup::<SecurityGroup>(v, remote)?;
                    // Written unchanged, so that a delete of the remote group racing this
                    // rule fails its compare, and sees the rule it has to remove.
                    if remote != group_id && touched.insert(remote) {
                        let key = group_key(remote);
                        txn.compares
                            .push(Compare::ModRevision(key.clone(), e.mod_revision));
                        txn.ops.push(Op::Put(key, to_stored(&*e.obj)));
                    }
                }
                let group = lookup::<SecurityGroup>(v, group_id)?;
                let mut rule = bare_rule(&group.obj, r.direction, r.ethertype.unwrap_or_default());
                rule.protocol = r.protocol.clone();
                rule.port_range_min = r.port_range_min;
                rule.port_range_max = r.port_range_max;
                rule.remote_ip_prefix = r.remote_ip_prefix;
                rule.normalized_cidr = r.remote_ip_prefix.map(|p| p.trunc());
                rule.remote_group_id = r.remote_group_id.clone();
                rule.description = r.description.clone().unwrap_or_default();
                if let Some(p) = project(r) {
                    rule.project_id = p.clone();
                    rule.tenant_id = p;
                }
                rules.push(rule);
            }
            let mut posted = HashSet::new();
            if !rules.iter().all(|r| posted.insert(identity(r))) {
                return Err(NeutronError::conflict(
                    "DuplicateSecurityGroupRuleInPost",
                    "Duplicate Security Group Rule in POST.",
                ));
            }
            if let Some(have) = v.rules_of(group_id).find(|r| posted.contains(&identity(r))) {
                return Err(NeutronError::conflict(
                    "SecurityGroupRuleExists",
                    format!(
                        "Security group rule already exists. Rule id is {}.",
                        have.id
                    ),
                ));
            }
            for r in &rules {
                let key = rule_key(&r.id);
                txn.compares.push(Compare::CreateRevision(key.clone(), 0));
                txn.ops.push(Op::Put(key, to_stored(r)));
            }
            bump(&lookup::<SecurityGroup>(v, group_id)?, &mut txn);
            Ok((txn, rules))
        })
        .await?;
    Ok(if bulk {
        answer_as(StatusCode::CREATED, "security_group_rules", &rules)
    } else {
        answer_as(StatusCode::CREATED, "security_group_rule", &rules[0])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(v: Value) -> Result<SecurityGroupRuleCreate, NeutronError> {
        let mut r = rule_request(v.as_object().cloned().unwrap_or_default())?;
        check_rule(&mut r)?;
        Ok(r)
    }

    fn refusal(v: Value) -> (u16, String, String) {
        let e = rule(v).unwrap_err();
        (e.status.as_u16(), e.kind, e.message)
    }

    #[test]
    fn rules_take_neutrons_spellings_and_canonical_forms() {
        let r = rule(
            json!({"security_group_id": "g", "direction": "ingress", "ethertype": "ipv6",
            "protocol": "ICMP", "port_range_min": "8", "port_range_max": 0}),
        )
        .unwrap();
        assert_eq!(r.ethertype, Some(Ethertype::Ipv6));
        assert_eq!(r.protocol.as_deref(), Some("ipv6-icmp"));
        assert_eq!((r.port_range_min, r.port_range_max), (Some(8), Some(0)));
        let r = rule(
            json!({"security_group_id": "g", "direction": "egress", "protocol": 6,
            "port_range_min": 1, "port_range_max": 65535, "remote_ip_prefix": "10.0.0.5"}),
        )
        .unwrap();
        assert_eq!(r.protocol.as_deref(), Some("6"));
        assert_eq!(
            (r.port_range_min, r.port_range_max),
            (None, None),
            "every port is none"
        );
        assert_eq!(
            r.remote_ip_prefix.map(|p| p.to_string()).as_deref(),
            Some("10.0.0.5/32")
        );
        let r = rule(json!({"security_group_id": "g", "direction": "egress", "protocol": "any"}));
        assert_eq!(r.unwrap().protocol, None);
        assert_eq!(protocol_number("icmpv6"), Some(58));
        assert_eq!(protocol_number("200"), Some(200));
    }

    #[test]
    fn rules_are_refused_in_neutrons_words() {
        let base = |extra: Value| {
            let mut o = json!({"security_group_id": "g", "direction": "ingress"});
            for (k, v) in extra.as_object().unwrap() {
                o[k] = v.clone();
            }
            o
        };
        assert_eq!(
            refusal(json!({"security_group_id": "g"})),
            (
                400,
                "HTTPBadRequest".into(),
                "Failed to parse request. Required attribute 'direction' not specified".into()
            )
        );
        assert_eq!(
            refusal(base(json!({"direction": "up"}))).2,
            "Invalid input for direction. Reason: up is not in valid_values."
        );
        let e = refusal(base(json!({"protocol": "bogus"})));
        assert_eq!(e.1, "SecurityGroupRuleInvalidProtocol");
        assert!(e.2.starts_with("Security group rule protocol bogus not supported. Only protocol values (None, 'any', 'ah', 'dccp',"), "{}", e.2);
        assert!(
            e.2.ends_with(
                "'udplite', 'vrrp') and integer representations [0 to 255] are supported."
            ),
            "{}",
            e.2
        );
        assert_eq!(
            refusal(base(json!({"protocol": 256}))).1,
            "SecurityGroupRuleInvalidProtocol"
        );
        assert_eq!(
            refusal(base(json!({"protocol": "tcp", "port_range_min": 70000}))),
            (
                400,
                "SecurityGroupInvalidPortValue".into(),
                "Invalid value for port 70000".into()
            )
        );
        assert_eq!(
            refusal(base(json!({"ethertype": "IPv5"}))).2,
            "Security group rule for ethertype 'IPv5' not supported. Allowed values are ['IPv4', 'IPv6']."
        );
        assert_eq!(
            refusal(base(json!({"remote_ip_prefix": "10.0.0.300/24"}))),
            (
                400,
                "InvalidCIDR".into(),
                "Invalid CIDR 10.0.0.300/24 given as IP prefix.".into()
            )
        );
        assert_eq!(
            refusal(base(
                json!({"protocol": "tcp", "port_range_min": 90, "port_range_max": 80})
            ))
            .1,
            "SecurityGroupInvalidPortRange"
        );
        assert_eq!(
            refusal(base(json!({"protocol": "tcp", "port_range_min": 80}))).1,
            "SecurityGroupInvalidPortRange",
            "a TCP range needs both ends"
        );
        assert_eq!(
            refusal(base(
                json!({"protocol": "udp", "port_range_min": 0, "port_range_max": 5})
            ))
            .2,
            "Invalid value for port 0"
        );
        assert_eq!(
            refusal(base(json!({"port_range_min": 80, "port_range_max": 80}))).1,
            "SecurityGroupProtocolRequiredWithPorts"
        );
        assert_eq!(
            refusal(base(json!({"protocol": "gre", "port_range_min": 80, "port_range_max": 80}))).2,
            "Ports cannot be specified for protocol 47. Ports are only supported for DCCP, SCTP, TCP, UDP, UDPLITE."
        );
        assert_eq!(
            refusal(base(json!({"protocol": "icmp", "port_range_min": 300}))).2,
            "Invalid value for ICMP type (port_range_min) 300. It must be 0 to 255."
        );
        assert_eq!(
            refusal(base(
                json!({"protocol": "icmp", "port_range_min": 8, "port_range_max": 256})
            ))
            .2,
            "Invalid value for ICMP code (port_range_max) 256. It must be 0 to 255."
        );
        assert_eq!(
            refusal(base(json!({"protocol": "icmp", "port_range_max": 3}))).1,
            "SecurityGroupMissingIcmpType"
        );
        assert_eq!(
            refusal(base(
                json!({"ethertype": "IPv6", "remote_ip_prefix": "10.0.0.0/24"})
            )),
            (
                400,
                "SecurityGroupRuleParameterConflict".into(),
                "Conflicting value ethertype IPv6 for CIDR 10.0.0.0/24".into()
            )
        );
        assert_eq!(
            refusal(base(json!({"protocol": "ipv6-icmp"}))).2,
            "Invalid ethertype IPv4 for protocol ipv6-icmp."
        );
        assert_eq!(
            refusal(base(
                json!({"remote_ip_prefix": "10.0.0.0/24", "remote_group_id": "g"})
            ))
            .1,
            "SecurityGroupMultipleRemoteEntites"
        );
    }

    #[test]
    fn the_same_rule_is_the_same_whatever_its_spelling() {
        let g = new_group("g".into(), "g", "", "p", true, Vec::new());
        let mut a = bare_rule(&g, Direction::Ingress, Ethertype::Ipv4);
        let mut b = bare_rule(&g, Direction::Ingress, Ethertype::Ipv4);
        a.protocol = Some("tcp".into());
        b.protocol = Some("6".into());
        b.remote_ip_prefix = "0.0.0.0/0".parse().ok();
        assert_eq!(identity(&a), identity(&b));
        b.remote_ip_prefix = "10.0.0.5/24".parse().ok();
        assert_ne!(identity(&a), identity(&b));
    }

    #[test]
    fn a_projects_default_group_has_one_id_and_neutrons_four_rules() {
        assert_eq!(default_group_id("p"), default_group_id("p"));
        assert_ne!(default_group_id("p"), default_group_id("q"));
        let g = new_group(default_group_id("p"), DEFAULT, "", "p", true, Vec::new());
        let rules = template_rules(&g, true);
        let shape: Vec<_> = rules
            .iter()
            .map(|r| (r.direction, r.ethertype, r.remote_group_id.is_some()))
            .collect();
        assert_eq!(
            shape,
            [
                (Direction::Ingress, Ethertype::Ipv4, true),
                (Direction::Egress, Ethertype::Ipv4, false),
                (Direction::Ingress, Ethertype::Ipv6, true),
                (Direction::Egress, Ethertype::Ipv6, false),
            ]
        );
        assert_eq!(template_rules(&g, false).len(), 2);
        let mut txn = Txn::default();
        let v = View::default();
        let id = ensure_default(&v, "p", &mut txn);
        assert_eq!(txn.ops.len(), 5);
        assert_eq!(ensure_default(&v, "p", &mut txn), id);
        assert_eq!(txn.ops.len(), 5, "made once per transaction");
    }
}
