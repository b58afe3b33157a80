//! What a client may send, described once per resource: the attribute allow-lists of
//! create and update and the OpenAPI request schemas are both derived from it, so a new
//! attribute is one line here and cannot be accepted but undocumented, or the reverse.

use corvid_api::Status;
use serde_json::{json, Map, Value};

use crate::error::NeutronError;

/// An attribute's JSON type, by Neutron's and Octavia's definitions.
#[derive(Clone, Copy, Debug)]
pub enum Type {
    /// `true` or `false`.
    Bool,
    /// A whole number.
    Int,
    /// 4 or 6.
    IpVersion,
    /// A string, or `null`.
    Text,
    /// A list of strings.
    Texts,
    /// A list of objects with two string members, such as `{"start", "end"}`.
    Pairs(&'static str, &'static str),
    /// A list of free-form objects.
    Objects,
    /// A free-form object, or `null`.
    Object,
    /// A port status name.
    Status,
    /// One of a closed set of strings (`ingress`, `egress`).
    Choice(&'static [&'static str]),
}

impl Type {
    /// The JSON schema of a value of this type.
    pub fn schema(self) -> Value {
        match self {
            Type::Bool => json!({"type": "boolean"}),
            Type::Int => json!({"type": "integer"}),
            Type::IpVersion => json!({"type": "integer", "enum": [4, 6]}),
            Type::Text => json!({"type": "string", "nullable": true}),
            Type::Texts => json!({"type": "array", "items": {"type": "string"}}),
            Type::Pairs(a, b) => {
                json!({"type": "array", "items": {"type": "object", "additionalProperties": false,
                    "properties": {a: {"type": "string"}, b: {"type": "string"}}}})
            }
            Type::Objects => json!({"type": "array", "items": {"type": "object"}}),
            Type::Object => json!({"type": "object", "nullable": true}),
            Type::Status => json!({"type": "string", "enum": Status::names()}),
            Type::Choice(values) => json!({"type": "string", "enum": values}),
        }
    }
}

/// Which request a body belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write {
    /// POST to the collection.
    Create,
    /// PUT to one object.
    Update,
}

/// One attribute a client may send.
#[derive(Clone, Copy, Debug)]
pub struct Attribute {
    /// Its name on the wire.
    pub name: &'static str,
    /// Its JSON type.
    pub ty: Type,
    create: bool,
    update: bool,
    /// For collections that fill absent attributes from their description (Octavia's):
    /// the value as JSON, or `None` when the attribute is required.
    pub default: Option<&'static str>,
}

impl Attribute {
    /// Accepted on create only: fixed for the object's life.
    pub const fn create(name: &'static str, ty: Type) -> Self {
        Attribute {
            name,
            ty,
            create: true,
            update: false,
            default: Some("null"),
        }
    }

    /// Accepted on create and on update.
    pub const fn both(name: &'static str, ty: Type) -> Self {
        Attribute {
            update: true,
            ..Attribute::create(name, ty)
        }
    }

    /// Accepted on update only: set by the system at creation.
    pub const fn update(name: &'static str, ty: Type) -> Self {
        Attribute {
            create: false,
            ..Attribute::both(name, ty)
        }
    }

    /// The same attribute with `json` as its default.
    pub const fn or(self, json: &'static str) -> Self {
        Attribute {
            default: Some(json),
            ..self
        }
    }

    /// The same attribute, with no default: a create must give it.
    pub const fn required(self) -> Self {
        Attribute {
            default: None,
            ..self
        }
    }

    /// Whether a `write` request may carry it.
    pub fn accepted(&self, write: Write) -> bool {
        match write {
            Write::Create => self.create,
            Write::Update => self.update,
        }
    }
}

/// The attributes of one resource.
#[derive(Debug)]
pub struct Attributes {
    /// The key of one object in a body (`port`).
    pub singular: &'static str,
    /// The key of a bulk create (`ports`).
    pub plural: &'static str,
    /// Attributes it shares with its family of resources.
    pub common: &'static [Attribute],
    /// Its own attributes.
    pub own: &'static [Attribute],
}

impl Attributes {
    /// The attributes a `write` request may carry.
    pub fn accepted(&self, write: Write) -> impl Iterator<Item = &'static Attribute> {
        self.all().filter(move |a| a.accepted(write))
    }

    /// Every attribute a client may send.
    pub fn all(&self) -> impl Iterator<Item = &'static Attribute> {
        self.common.iter().chain(self.own)
    }

    /// The `{"<singular>": {...}}` object of a body, with attributes `write` does not take
    /// refused in Neutron's words.
    pub fn object(&self, v: &Value, write: Write) -> Result<Map<String, Value>, NeutronError> {
        let Some(obj) = v.get(self.singular).and_then(Value::as_object) else {
            return Err(NeutronError::bad_request(format!(
                "Resource body required: expected an object under \"{}\"",
                self.singular
            )));
        };
        self.check(obj, write)?;
        Ok(obj.clone())
    }

    /// The objects of a create body: one under the singular key, or a bulk list under the
    /// plural one (returned with `true`).
    pub fn objects(&self, v: &Value) -> Result<(bool, Vec<Map<String, Value>>), NeutronError> {
        let Some(items) = v.get(self.plural).and_then(Value::as_array) else {
            return Ok((false, vec![self.object(v, Write::Create)?]));
        };
        if items.is_empty() {
            return Err(NeutronError::bad_request(format!(
                "\"{}\" holds no {} to create",
                self.plural, self.singular
            )));
        }
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let o = item.as_object().ok_or_else(|| {
                NeutronError::bad_request(format!("Each of \"{}\" must be an object", self.plural))
            })?;
            self.check(o, Write::Create)?;
            out.push(o.clone());
        }
        Ok((true, out))
    }

    fn check(&self, obj: &Map<String, Value>, write: Write) -> Result<(), NeutronError> {
        let unknown: Vec<&str> = obj
            .keys()
            .map(String::as_str)
            .filter(|k| !self.accepted(write).any(|a| a.name == *k))
            .collect();
        if unknown.is_empty() {
            return Ok(());
        }
        Err(NeutronError::bad_request(format!(
            "Unrecognized attribute(s) '{}'",
            unknown.join(", ")
        )))
    }

    /// The JSON schema of a `write` request's body; a create may also be a bulk list.
    pub fn schema(&self, write: Write) -> Value {
        let properties: Map<String, Value> = self
            .accepted(write)
            .map(|a| (a.name.to_string(), a.ty.schema()))
            .collect();
        let object =
            json!({"type": "object", "additionalProperties": false, "properties": properties});
        let mut body = Map::new();
        body.insert(self.singular.into(), object.clone());
        if write == Write::Create {
            body.insert(
                self.plural.into(),
                json!({"type": "array", "items": object}),
            );
        }
        json!({"type": "object", "minProperties": 1, "maxProperties": 1, "properties": body})
    }
}

/// What every Neutron resource that a project owns takes on create.
pub const NEUTRON: [Attribute; 3] = [TAGS, PROJECT_ID, TENANT_ID];

/// `name`, on every resource.
pub const NAME: Attribute = Attribute::both("name", Type::Text);
/// `description`, on every resource.
pub const DESCRIPTION: Attribute = Attribute::both("description", Type::Text);
/// `admin_state_up`.
pub const ADMIN_STATE_UP: Attribute = Attribute::both("admin_state_up", Type::Bool);
/// `tags`, set on create; changed afterwards through the tags routes.
pub const TAGS: Attribute = Attribute::create("tags", Type::Texts);
/// `project_id`.
pub const PROJECT_ID: Attribute = Attribute::create("project_id", Type::Text);
/// `tenant_id`, the older name of `project_id`.
pub const TENANT_ID: Attribute = Attribute::create("tenant_id", Type::Text);

#[cfg(test)]
mod tests {
    use super::*;

    const THING: Attributes = Attributes {
        singular: "thing",
        plural: "things",
        common: &[NAME],
        own: &[
            Attribute::create("size", Type::Int),
            Attribute::update("status", Type::Status),
        ],
    };

    #[test]
    fn each_request_takes_only_its_own_attributes() {
        let create = json!({"thing": {"name": "a", "size": 1}});
        assert!(THING.object(&create, Write::Create).is_ok());
        let e = THING.object(&create, Write::Update).unwrap_err();
        assert!(e.message.contains("'size'"), "{}", e.message);
        let e = THING
            .object(&json!({"thing": {"status": "DOWN"}}), Write::Create)
            .unwrap_err();
        assert!(e.message.contains("'status'"), "{}", e.message);
        let (bulk, objs) = THING
            .objects(&json!({"things": [{"name": "a"}, {"size": 2}]}))
            .unwrap();
        assert!(bulk);
        assert_eq!(objs.len(), 2);
        assert!(THING.objects(&json!({"things": []})).is_err());
    }

    /// The client's request types (corvid-api's `requests`) and this description are
    /// one: a field the controller would refuse, or an attribute no client can send,
    /// fails here.
    #[test]
    fn each_request_type_of_the_client_carries_exactly_what_its_request_accepts() {
        use crate::api::{floatingips, hosts, lbaas, networks, ports, routers, security_groups};
        use corvid_api::requests::*;
        use serde_aux::serde_introspection::serde_introspect;
        fn check<T: serde::de::DeserializeOwned>(a: &Attributes, write: Write) {
            let mut fields = serde_introspect::<T>().to_vec();
            fields.sort_unstable();
            let mut accepted: Vec<&str> = a.accepted(write).map(|a| a.name).collect();
            accepted.sort_unstable();
            assert_eq!(fields, accepted, "{} {write:?}", a.singular);
        }
        use Write::{Create, Update};
        check::<NetworkCreate>(&networks::NETWORK, Create);
        check::<NetworkUpdate>(&networks::NETWORK, Update);
        check::<SubnetCreate>(&networks::SUBNET, Create);
        check::<SubnetUpdate>(&networks::SUBNET, Update);
        check::<SubnetPoolCreate>(&networks::SUBNET_POOL, Create);
        check::<SubnetPoolUpdate>(&networks::SUBNET_POOL, Update);
        check::<PortCreate>(&ports::PORT, Create);
        check::<PortUpdate>(&ports::PORT, Update);
        check::<FloatingIpCreate>(&floatingips::FLOATING_IP, Create);
        check::<FloatingIpUpdate>(&floatingips::FLOATING_IP, Update);
        check::<RouterCreate>(&routers::ROUTER, Create);
        check::<RouterUpdate>(&routers::ROUTER, Update);
        check::<SecurityGroupCreate>(&security_groups::SECURITY_GROUP, Create);
        check::<SecurityGroupUpdate>(&security_groups::SECURITY_GROUP, Update);
        check::<SecurityGroupRuleCreate>(&security_groups::SECURITY_GROUP_RULE, Create);
        assert_eq!(
            security_groups::SECURITY_GROUP_RULE
                .accepted(Update)
                .count(),
            0,
            "rules never change"
        );
        check::<HostCreate>(&hosts::HOST, Create);
        check::<HostCreate>(&hosts::HOST, Update);
        check::<LoadBalancerCreate>(&lbaas::LOADBALANCER.attributes, Create);
        check::<LoadBalancerUpdate>(&lbaas::LOADBALANCER.attributes, Update);
        check::<ListenerCreate>(&lbaas::LISTENER.attributes, Create);
        check::<ListenerUpdate>(&lbaas::LISTENER.attributes, Update);
        check::<PoolCreate>(&lbaas::POOL.attributes, Create);
        check::<PoolUpdate>(&lbaas::POOL.attributes, Update);
        check::<MemberCreate>(&lbaas::MEMBER.attributes, Create);
        check::<MemberUpdate>(&lbaas::MEMBER.attributes, Update);
    }

    #[test]
    fn the_schema_lists_what_the_request_accepts() {
        let s = THING.schema(Write::Update);
        let props = &s["properties"]["thing"]["properties"];
        assert!(props.get("status").is_some());
        assert!(props.get("size").is_none());
        assert!(s["properties"].get("things").is_none());
        assert!(THING.schema(Write::Create)["properties"]["things"].is_object());
    }
}
