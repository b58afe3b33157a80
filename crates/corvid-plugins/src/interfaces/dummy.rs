//! dummy: the container's interface is a dummy device, a place for addresses with no
//! link to anywhere (as for a service address). It needs an IPAM section.

use super::child::{self, invalid, Addressing};
use crate::attach::{self, ipam_type};
use crate::errors;
use corvid_cni::skel::{CmdArgs, Plugin};
use corvid_cni::{CniResult, Error, NetConf};
use corvid_net::link::LinkKind;

/// The dummy plugin.
pub struct Dummy;

fn load(args: &CmdArgs) -> Result<(), Error> {
    serde_json::from_slice::<NetConf>(&args.stdin).map_err(errors::config)?;
    if ipam_type(args).is_none_or(str::is_empty) {
        return Err(invalid("dummy interface requires an IPAM configuration"));
    }
    Ok(())
}

fn add(args: &CmdArgs) -> Result<CniResult, Error> {
    load(args)?;
    let (ns, mut container) = attach::open_free(args)?;
    container
        .add_dummy(&args.ifname, None, None)
        .map_err(errors::net)?;
    child::address(args, "dummy", &ns, &mut container, Addressing::Ipam)
}

impl Plugin for Dummy {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, Error> {
        add(args)
    }

    fn del(&self, args: &CmdArgs) -> Result<(), Error> {
        load(args)?;
        child::del(args)
    }

    fn check(&self, args: &CmdArgs) -> Result<(), Error> {
        load(args)?;
        child::check(args, "dummy", LinkKind::Dummy, None)
    }

    fn gc(&self, args: &CmdArgs) -> Result<(), Error> {
        attach::gc(args, false)
    }

    fn status(&self, args: &CmdArgs) -> Result<(), Error> {
        attach::status(args)
    }
}
