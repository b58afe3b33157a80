//! ipvlan: the container's interface is an ipvlan of `master` (by default the device the
//! default route leaves through; chained, the previous result's single interface; with
//! `linkInContainer`, a device inside the container), in mode l2 (the default), l3 or
//! l3s. It shares the master's MAC. Its addresses come from IPAM, or chained without an
//! IPAM section from the previous result.

use super::child::{self, invalid, Addressing};
use crate::attach;
use crate::errors;
use corvid_cni::skel::{CmdArgs, Plugin};
use corvid_cni::{CniResult, Error};
use corvid_net::link::{ChildKind, ChildSpec, IpvlanMode, Link, LinkKind};
use corvid_net::Netlink;
use serde::Deserialize;

/// The ipvlan plugin.
pub struct Ipvlan;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Conf {
    #[serde(default)]
    master: String,
    #[serde(default)]
    mode: String,
    #[serde(default)]
    mtu: i64,
    #[serde(default)]
    link_in_container: bool,
}

/// The configuration with its defaults resolved against the kernel.
struct Setup {
    master: Link,
    mode: IpvlanMode,
    mtu: Option<u32>,
    link_in_container: bool,
}

fn load(args: &CmdArgs, host: &mut Netlink, container: &mut Netlink) -> Result<Setup, Error> {
    let c: Conf = serde_json::from_slice(&args.stdin).map_err(errors::config)?;
    let mode = IpvlanMode::parse(&c.mode)
        .ok_or_else(|| invalid(format!("unknown ipvlan mode: \"{}\"", c.mode)))?;
    let mut name = c.master.clone();
    if name.is_empty() {
        if let Some(prev) = &args.prev_result {
            // Chained: the interface the previous plugin made is the master.
            match prev.interfaces.as_slice() {
                [only] if !only.name.is_empty() => name = only.name.clone(),
                _ => {
                    return Err(invalid(
                        "ipvlan: chained master failure: prevResult lacks a single named interface",
                    ))
                }
            }
        }
    }
    let master = child::master(host, container, c.link_in_container, "ipvlan", &name)?;
    let mtu = child::check_mtu(c.mtu, &master)?;
    Ok(Setup {
        master,
        mode,
        mtu,
        link_in_container: c.link_in_container,
    })
}

fn add(args: &CmdArgs) -> Result<CniResult, Error> {
    let (ns, mut container, mut host) = child::open(args)?;
    let setup = load(args, &mut host, &mut container)?;
    let spec = ChildSpec {
        name: &args.ifname,
        parent: setup.master.index,
        kind: ChildKind::Ipvlan(setup.mode),
        mtu: setup.mtu,
        mac: None,
        bcqueuelen: None,
    };
    let parent_nl = (!setup.link_in_container).then_some(&mut host);
    child::add_child(
        args,
        "ipvlan",
        &ns,
        &mut container,
        parent_nl,
        &spec,
        Addressing::PreviousOrIpam,
    )
}

fn check(args: &CmdArgs) -> Result<(), Error> {
    let c: Conf = serde_json::from_slice(&args.stdin).map_err(errors::config)?;
    let mode = IpvlanMode::parse(&c.mode)
        .ok_or_else(|| invalid(format!("unknown ipvlan mode: \"{}\"", c.mode)))?;
    child::check(
        args,
        "ipvlan",
        LinkKind::Ipvlan,
        Some(ChildKind::Ipvlan(mode)),
    )
}

impl Plugin for Ipvlan {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, Error> {
        add(args)
    }

    fn del(&self, args: &CmdArgs) -> Result<(), Error> {
        serde_json::from_slice::<Conf>(&args.stdin).map_err(errors::config)?;
        child::del(args)
    }

    fn check(&self, args: &CmdArgs) -> Result<(), Error> {
        check(args)
    }

    fn gc(&self, args: &CmdArgs) -> Result<(), Error> {
        attach::gc(args, false)
    }

    fn status(&self, args: &CmdArgs) -> Result<(), Error> {
        attach::status(args)
    }
}
