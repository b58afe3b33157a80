//! What the chained plugins (portmap, firewall) know of an attachment: the tags naming
//! what it put in corvid's nftables table, from a call's arguments (the one being added
//! or deleted, and the ones GC must keep), and its addresses from prevResult.

use corvid_cni::skel::CmdArgs;
use corvid_cni::{CniResult, Error};
use corvid_net::nftables::{AttachmentTag, Nftables};
use std::net::IpAddr;

/// The container's addresses, from the result the previous plugin gave.
pub fn addresses(prev: &CniResult) -> Vec<IpAddr> {
    prev.ips.iter().map(|ip| ip.address.addr()).collect()
}

/// A socket on corvid's nftables table, failures as CNI errors.
pub fn nftables() -> Result<Nftables, Error> {
    Nftables::open().map_err(crate::errors::net)
}

/// The tag of the attachment this call is about.
pub fn tag(args: &CmdArgs) -> AttachmentTag {
    AttachmentTag::new(&args.conf.name, &args.container_id, &args.ifname)
}

/// The tags of the attachments a GC call lists as valid.
pub fn valid(args: &CmdArgs) -> Vec<AttachmentTag> {
    args.conf
        .valid_attachments
        .iter()
        .flatten()
        .map(|a| AttachmentTag::new(&args.conf.name, &a.container_id, &a.ifname))
        .collect()
}
