//! The tags naming what an attachment put in corvid's nftables table, from a call's
//! arguments: the one being added or deleted, and the ones GC must keep.

use corvid_cni::skel::CmdArgs;
use corvid_net::nftables::AttachmentTag;

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
