//! host-device: moves a device of the host (by `device` name, `hwaddr` or `kernelpath`)
//! into the container as CNI_IFNAME, remembering its host name in the link's alias, and
//! back under that name on DEL. With an IPAM section it gets addresses and routes.
//! PCI and auxiliary devices (`pciBusID`, `runtimeConfig.deviceID`, DPDK) are left out.

use crate::attach::{self, ipam_type};
use crate::{delegate, errors};
use corvid_cni::skel::{CmdArgs, Plugin};
use corvid_cni::Command;
use corvid_cni::{CniResult, Error, ErrorCode};
use corvid_net::binding::configure;
use corvid_net::link::Link;
use corvid_net::{Netlink, Netns};
use ipnet::IpNet;
use serde::Deserialize;

/// The host-device plugin.
pub struct HostDevice;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Conf {
    #[serde(default)]
    device: String,
    #[serde(default)]
    hwaddr: String,
    #[serde(default)]
    kernelpath: String,
    #[serde(default, rename = "pciBusID")]
    pci_bus_id: String,
    #[serde(default)]
    runtime_config: RuntimeConfig,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RuntimeConfig {
    #[serde(default, rename = "deviceID")]
    device_id: String,
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorCode::InvalidNetworkConfig, msg)
}

fn load(args: &CmdArgs) -> Result<Conf, Error> {
    let c: Conf = serde_json::from_slice(&args.stdin).map_err(errors::config)?;
    if !c.pci_bus_id.is_empty() || !c.runtime_config.device_id.is_empty() {
        return Err(Error::new(
            ErrorCode::UnsupportedField,
            "host-device: PCI and auxiliary devices (pciBusID, deviceID) are not implemented by corvid's host-device",
        ));
    }
    if c.device.is_empty() && c.hwaddr.is_empty() && c.kernelpath.is_empty() {
        return Err(invalid(
            "host-device: specify either \"device\", \"hwaddr\" or \"kernelpath\"",
        ));
    }
    if !c.kernelpath.is_empty() && !c.kernelpath.starts_with("/sys/devices/") {
        return Err(invalid(format!(
            "host-device: kernel device path \"{}\" must be absolute and begin with /sys/devices/",
            c.kernelpath
        )));
    }
    Ok(c)
}

/// The host's device the configuration names.
fn find(host: &mut Netlink, c: &Conf) -> Result<Link, Error> {
    let found = if !c.device.is_empty() {
        host.link_by_name(&c.device).map_err(errors::net)?
    } else if !c.hwaddr.is_empty() {
        let want = corvid_net::link::parse_mac(&c.hwaddr).ok_or_else(|| {
            invalid(format!(
                "host-device: \"{}\" is not a MAC address",
                c.hwaddr
            ))
        })?;
        let want = corvid_net::link::format_mac(&want);
        host.links()
            .map_err(errors::net)?
            .into_iter()
            .find(|l| l.mac.eq_ignore_ascii_case(&want))
    } else {
        let dir = std::path::Path::new(&c.kernelpath).join("net");
        let name = std::fs::read_dir(&dir)
            .ok()
            .and_then(|mut d| d.next())
            .and_then(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned());
        match name {
            Some(n) => host.link_by_name(&n).map_err(errors::net)?,
            None => None,
        }
    };
    found.ok_or_else(|| {
        let what = [
            ("device", &c.device),
            ("hwaddr", &c.hwaddr),
            ("kernelpath", &c.kernelpath),
        ]
        .into_iter()
        .find(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k} \"{v}\""))
        .unwrap_or_default();
        invalid(format!("host-device: no device with {what} on the host"))
    })
}

fn add(args: &CmdArgs, c: &Conf) -> Result<CniResult, Error> {
    let (ns, mut container) = attach::open_free(args)?;
    let mut host = Netlink::open().map_err(errors::net)?;
    let device = find(&mut host, c)?;
    let host_ns = Netns::current().map_err(errors::net)?;
    host.move_link(&device, &ns, &args.ifname, &device.name, true)
        .map_err(errors::net)?;
    let link = container
        .link_by_name(&args.ifname)
        .map_err(errors::net)?
        .ok_or_else(|| Error::new(ErrorCode::Internal, format!("{} vanished", args.ifname)))?;
    let mut ipam_done = false;
    let done = (|| {
        let mut result = CniResult::default();
        if let Some(t) = ipam_type(args).filter(|t| !t.is_empty()) {
            result = delegate::run(t, Command::Add, args)?.unwrap_or_default();
            ipam_done = true;
            if result.ips.is_empty() {
                return Err(invalid(format!(
                    "host-device: IPAM plugin {t} returned no address"
                )));
            }
            let addrs: Vec<IpNet> = result.ips.iter().map(|ip| ip.address).collect();
            let routes = attach::result_routes(&result, link.index);
            configure(&mut container, &link, &addrs, &routes).map_err(errors::net)?;
            for ip in &mut result.ips {
                ip.interface = Some(0);
            }
        }
        attach::single_interface(args, &mut result, &link, &ns);
        Ok(result)
    })();
    done.inspect_err(|_| {
        // The device goes home under its own name, as it came.
        let _ = container.move_link(&link, &host_ns, &device.name, "", device.up);
        if ipam_done {
            if let Some(t) = ipam_type(args) {
                let _ = delegate::run(t, Command::Del, args);
            }
        }
    })
}

/// Moves the container's interface back to the host under the name its alias keeps.
fn move_out(args: &CmdArgs) -> Result<(), Error> {
    let Some(ns) = args.netns.as_ref().and_then(|p| Netns::open(p).ok()) else {
        return Ok(());
    };
    let mut container = Netlink::open_in(&ns).map_err(errors::net)?;
    let Some(link) = container.link_by_name(&args.ifname).map_err(errors::net)? else {
        return Ok(());
    };
    if link.alias.is_empty() {
        return Err(Error::new(
            ErrorCode::Internal,
            format!(
                "host-device: {} has no alias naming its host device, so it cannot go back",
                args.ifname
            ),
        ));
    }
    let host_ns = Netns::current().map_err(errors::net)?;
    container
        .move_link(&link, &host_ns, &link.alias, "", false)
        .map_err(errors::net)
}

impl Plugin for HostDevice {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, Error> {
        add(args, &load(args)?)
    }

    fn del(&self, args: &CmdArgs) -> Result<(), Error> {
        load(args)?;
        let mut failures = Vec::new();
        if let Some(t) = ipam_type(args).filter(|t| !t.is_empty()) {
            if let Err(e) = delegate::run(t, Command::Del, args) {
                failures.push(e.during(&format!("release the address ({t})")));
            }
        }
        if let Err(e) = move_out(args) {
            failures.push(e.during(&format!("move {} back to the host", args.ifname)));
        }
        Error::all(failures)
    }

    fn check(&self, args: &CmdArgs) -> Result<(), Error> {
        load(args)?;
        let (prev, mut c) = attach::checked(args, "host-device")?;
        attach::check_mac(prev, &c)?;
        attach::check_addresses_and_routes(&mut c.container, &c.link, prev, Some(c.own), &c.ns)
    }

    fn gc(&self, args: &CmdArgs) -> Result<(), Error> {
        attach::gc(args, false)
    }

    fn status(&self, args: &CmdArgs) -> Result<(), Error> {
        attach::status(args)
    }
}
