//! loopback: brings `lo` up inside the container's namespace.

use crate::errors;
use corvid_cni::result::{Interface, IpConfig};
use corvid_cni::skel::{CmdArgs, Plugin};
use corvid_cni::{CniResult, Error, ErrorCode};
use corvid_net::{Netlink, Netns};

/// The loopback plugin.
pub struct Loopback;

fn open(args: &CmdArgs) -> Result<(Netns, Netlink), Error> {
    let path = args
        .netns
        .as_ref()
        .ok_or_else(|| Error::new(ErrorCode::InvalidEnvironment, "CNI_NETNS is required"))?;
    let ns = Netns::open(path).map_err(errors::net)?;
    let nl = Netlink::open_in(&ns).map_err(errors::net)?;
    Ok((ns, nl))
}

impl Plugin for Loopback {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, Error> {
        let (ns, mut nl) = open(args)?;
        let lo = nl
            .link_by_name("lo")
            .map_err(errors::net)?
            .ok_or_else(|| Error::new(ErrorCode::Kernel, "no loopback device in the namespace"))?;
        nl.set_up(&lo).map_err(errors::net)?;
        // In a chain the previous result is the answer; alone, lo is.
        if let Some(prev) = &args.prev_result {
            return Ok(prev.clone());
        }
        let ips = nl
            .addresses(Some(lo.index))
            .map_err(errors::net)?
            .into_iter()
            .map(|(_, address)| IpConfig {
                address,
                gateway: None,
                interface: Some(0),
            })
            .collect();
        Ok(CniResult {
            interfaces: vec![Interface {
                name: args.ifname.clone(),
                mac: "00:00:00:00:00:00".into(),
                sandbox: ns.path().display().to_string(),
                ..Interface::default()
            }],
            ips,
            ..CniResult::default()
        })
    }

    fn del(&self, _: &CmdArgs) -> Result<(), Error> {
        Ok(())
    }

    fn check(&self, args: &CmdArgs) -> Result<(), Error> {
        let (_, mut nl) = open(args)?;
        match nl.link_by_name("lo").map_err(errors::net)? {
            Some(lo) if lo.up => Ok(()),
            _ => Err(Error::new(ErrorCode::CheckFailed, "loopback is not up")),
        }
    }

    fn gc(&self, _: &CmdArgs) -> Result<(), Error> {
        Ok(())
    }

    fn status(&self, _: &CmdArgs) -> Result<(), Error> {
        Ok(())
    }
}
