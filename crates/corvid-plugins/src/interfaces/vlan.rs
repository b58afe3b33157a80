//! vlan: the container's interface is an 802.1Q VLAN (`vlanId`, 0 to 4094) of `master`, a
//! device of the host (or, with `linkInContainer`, of the container), with `mtu` at most
//! the master's. Its addresses come from the IPAM section, which it needs.

use super::child::{self, invalid, Addressing};
use crate::attach;
use crate::errors;
use corvid_cni::skel::{CmdArgs, Plugin};
use corvid_cni::{CniResult, Error};
use corvid_net::link::{ChildKind, ChildSpec, LinkKind};
use serde::Deserialize;

/// The vlan plugin.
pub struct Vlan;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Conf {
    #[serde(default)]
    master: String,
    #[serde(default)]
    vlan_id: i64,
    #[serde(default)]
    mtu: i64,
    #[serde(default)]
    link_in_container: bool,
}

fn load(args: &CmdArgs) -> Result<(Conf, u16), Error> {
    let c: Conf = serde_json::from_slice(&args.stdin).map_err(errors::config)?;
    if c.master.is_empty() {
        return Err(invalid(
            "vlan: \"master\" field is required. It specifies the host interface name to create the VLAN for",
        ));
    }
    let id = u16::try_from(c.vlan_id)
        .ok()
        .filter(|id| *id <= 4094)
        .ok_or_else(|| {
            invalid(format!(
                "vlan: invalid VLAN ID {} (must be between 0 and 4094 inclusive)",
                c.vlan_id
            ))
        })?;
    Ok((c, id))
}

fn add(args: &CmdArgs) -> Result<CniResult, Error> {
    let (c, id) = load(args)?;
    let (ns, mut container, mut host) = child::open(args)?;
    let master = child::master(
        &mut host,
        &mut container,
        c.link_in_container,
        "vlan",
        &c.master,
    )?;
    let spec = ChildSpec {
        name: &args.ifname,
        parent: master.index,
        kind: ChildKind::Vlan(id),
        mtu: child::check_mtu(c.mtu, &master)?,
        mac: None,
        bcqueuelen: None,
    };
    let parent_nl = (!c.link_in_container).then_some(&mut host);
    child::add_child(
        args,
        "vlan",
        &ns,
        &mut container,
        parent_nl,
        &spec,
        Addressing::Ipam,
    )
}

impl Plugin for Vlan {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, Error> {
        add(args)
    }

    fn del(&self, args: &CmdArgs) -> Result<(), Error> {
        load(args)?;
        child::del(args)
    }

    fn check(&self, args: &CmdArgs) -> Result<(), Error> {
        let (_, id) = load(args)?;
        child::check(args, "vlan", LinkKind::Vlan, Some(ChildKind::Vlan(id)))
    }

    fn gc(&self, args: &CmdArgs) -> Result<(), Error> {
        attach::gc(args, false)
    }

    fn status(&self, args: &CmdArgs) -> Result<(), Error> {
        attach::status(args)
    }
}
