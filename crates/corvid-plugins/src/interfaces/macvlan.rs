//! macvlan: the container's interface is a macvlan of a device of the host (`master`, by
//! default the one the default route leaves through) or of the container itself
//! (`linkInContainer`), in mode bridge, private, vepa or passthru. With an IPAM section it
//! gets addresses and routes; without, it is only brought up (layer 2).

use super::child::{self, invalid, Addressing};
use crate::attach;
use crate::errors;
use corvid_cni::skel::{CmdArgs, Plugin};
use corvid_cni::{CniResult, Error};
use corvid_net::link::{ChildKind, ChildSpec, Link, LinkKind, MacvlanMode};
use corvid_net::{Netlink, Netns};
use serde::Deserialize;

/// The macvlan plugin.
pub struct Macvlan;

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
    mac: String,
    #[serde(default)]
    link_in_container: bool,
    #[serde(default)]
    bcqueuelen: u32,
    #[serde(default)]
    runtime_config: RuntimeConfig,
}

#[derive(Deserialize, Default)]
struct RuntimeConfig {
    #[serde(default)]
    mac: String,
}

/// The configuration with its defaults resolved against the kernel.
struct Setup {
    master: Link,
    mode: MacvlanMode,
    mtu: Option<u32>,
    mac: Option<String>,
    bcqueuelen: Option<u32>,
    link_in_container: bool,
}

/// Reads the configuration and finds the master where it lives: on the host (`host`) or,
/// with `linkInContainer`, in the container (`container`).
fn load(args: &CmdArgs, host: &mut Netlink, container: &mut Netlink) -> Result<Setup, Error> {
    let c: Conf = serde_json::from_slice(&args.stdin).map_err(errors::config)?;
    args.args.only("macvlan", &["MAC"])?;
    let mode = MacvlanMode::parse(&c.mode)
        .ok_or_else(|| invalid(format!("unknown macvlan mode: \"{}\"", c.mode)))?;
    let master = child::master(host, container, c.link_in_container, "macvlan", &c.master)?;
    let mtu = child::check_mtu(c.mtu, &master)?;
    let mac = [
        args.args.get("MAC").unwrap_or_default(),
        &c.runtime_config.mac,
    ]
    .into_iter()
    .rev()
    .chain(std::iter::once(c.mac.as_str()))
    .find(|m| !m.is_empty())
    .map(str::to_string);
    if let Some(m) = &mac {
        if corvid_net::link::parse_mac(m).is_none() {
            return Err(invalid(format!("invalid args {m} for MAC addr")));
        }
    }
    Ok(Setup {
        master,
        mode,
        mtu,
        mac,
        bcqueuelen: (c.bcqueuelen > 0).then_some(c.bcqueuelen),
        link_in_container: c.link_in_container,
    })
}

fn add(args: &CmdArgs) -> Result<CniResult, Error> {
    let (ns, mut container, mut host) = child::open(args)?;
    let setup = load(args, &mut host, &mut container)?;
    let spec = ChildSpec {
        name: &args.ifname,
        parent: setup.master.index,
        kind: ChildKind::Macvlan(setup.mode),
        mtu: setup.mtu,
        mac: setup.mac.as_deref(),
        bcqueuelen: setup.bcqueuelen,
    };
    let parent_nl = (!setup.link_in_container).then_some(&mut host);
    child::add_child(
        args,
        "macvlan",
        &ns,
        &mut container,
        parent_nl,
        &spec,
        Addressing::IpamIfAny,
    )
}

fn check(args: &CmdArgs) -> Result<(), Error> {
    let ns = Netns::open(attach::netns_path(args)?).map_err(errors::net)?;
    let mut container = Netlink::open_in(&ns).map_err(errors::net)?;
    let mut host = Netlink::open().map_err(errors::net)?;
    let setup = load(args, &mut host, &mut container)?;
    child::check(
        args,
        "macvlan",
        LinkKind::Macvlan,
        Some(ChildKind::Macvlan(setup.mode)),
    )
}

impl Plugin for Macvlan {
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
