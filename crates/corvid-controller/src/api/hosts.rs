//! Hosts: each agent registers its host ID and underlay address with an idempotent PUT,
//! so every other agent learns where to send that host's overlay traffic.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Router;
use corvid_api::{Host, HostCreate};

use super::attributes::{Attribute, Attributes, Type, Write, DESCRIPTION};
use super::{answer_as, body, list_route, request, show_route, to_stored, Ctl};
use crate::controller::Controller;
use crate::error::NeutronError;
use crate::keys;
use crate::store::{Compare, Op, Txn};
use crate::util::now;

/// What an agent sends when it registers its host (an idempotent PUT).
pub(super) const HOST: Attributes = Attributes {
    singular: "host",
    plural: "hosts",
    common: &[],
    own: &[
        Attribute::both("underlay_ip", Type::Text),
        DESCRIPTION,
        Attribute::both("tags", Type::Texts),
    ],
};

pub fn routes() -> Router<Arc<Controller>> {
    Router::new()
        .route("/v2.0/hosts", list_route::<Host>())
        .route(
            "/v2.0/hosts/{id}",
            show_route::<Host>().put(register).delete(unregister),
        )
}

/// Creates or updates a host; a re-registration with the same address changes nothing.
async fn register(
    State(c): Ctl,
    Path(id): Path<String>,
    b: Bytes,
) -> Result<Response, NeutronError> {
    let HostCreate {
        underlay_ip,
        description,
        tags,
    } = request(&HOST.object(&body(&b)?, Write::Update)?, &[])?;
    let underlay_ip =
        underlay_ip.ok_or_else(|| NeutronError::bad_request("A host needs an underlay_ip"))?;
    if id.is_empty() || id.len() > 255 {
        return Err(NeutronError::invalid_input(
            "A host ID is 1 to 255 characters",
        ));
    }
    if let Some(e) = c.view().hosts.get(id.as_str()) {
        let same = e.obj.underlay_ip == underlay_ip
            && description.as_ref().is_none_or(|d| *d == e.obj.description)
            && tags.as_ref().is_none_or(|t| *t == e.obj.tags);
        if same {
            return Ok(answer_as(StatusCode::OK, "host", &*e.obj));
        }
    }
    let (host, created) = c
        .transact(|v| {
            let key = keys::resource("hosts", &id);
            let t = now();
            let (mut host, compare, created) = match v.hosts.get(id.as_str()) {
                Some(e) => (
                    (*e.obj).clone(),
                    Compare::ModRevision(key.clone(), e.mod_revision),
                    false,
                ),
                None => (
                    Host {
                        id: id.clone(),
                        underlay_ip,
                        description: String::new(),
                        tags: Vec::new(),
                        created_at: t.clone(),
                        updated_at: t.clone(),
                        revision_number: 0,
                    },
                    Compare::CreateRevision(key.clone(), 0),
                    true,
                ),
            };
            host.underlay_ip = underlay_ip;
            if let Some(d) = &description {
                host.description = d.clone();
            }
            if let Some(tags) = &tags {
                host.tags = tags.clone();
            }
            host.revision_number += 1;
            host.updated_at = t;
            let txn = Txn {
                compares: vec![compare],
                ops: vec![Op::Put(key, to_stored(&host))],
            };
            Ok((txn, (host, created)))
        })
        .await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(answer_as(status, "host", &host))
}

async fn unregister(State(c): Ctl, Path(id): Path<String>) -> Result<StatusCode, NeutronError> {
    c.transact(|v| {
        let entry = super::lookup::<Host>(v, &id)?;
        let key = keys::resource("hosts", &id);
        let txn = Txn {
            compares: vec![Compare::ModRevision(key.clone(), entry.mod_revision)],
            ops: vec![Op::Delete(key)],
        };
        Ok((txn, ()))
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}
