//! corvid: the controller-backed plugin of the Mizar-MP agreement. ADD asks the controller
//! for a port bound to this host and waits until the host's agent has plugged it (status
//! UP); DEL deletes the port. The plugin never touches the kernel itself.

use std::hash::Hasher;
use std::time::Duration;

use corvid_api::{ApiError, Client, Network, Port, PortCreate, Status, Subnet};
use corvid_cni::result::{Dns, Interface, IpConfig, Route};
use corvid_cni::skel::{CmdArgs, Plugin};
use corvid_cni::{CniResult, Error, ErrorCode};
use corvid_net::{Netlink, Netns};
use ipnet::IpNet;
use serde::Deserialize;
use uuid::Uuid;

use super::wait::{self, NotActive};
use crate::errors;

/// The controller-backed plugin.
pub struct Corvid;

/// This plugin's own CNI error codes (the spec leaves 100 and up to plugins).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Code {
    /// 106: the network controller could not be reached.
    ControllerUnreachable = 106,
    /// 107: the port did not come UP in time (no agent on this host plugged it).
    PortTimeout = 107,
    /// 108: the controller refused the request.
    ControllerRefused = 108,
    /// 109: the host's agent could not plug the port.
    PortFailed = 109,
}

impl From<Code> for u32 {
    fn from(c: Code) -> u32 {
        c as u32
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Conf {
    #[serde(rename = "mpurl")]
    url: String,
    project: String,
    subnet: String,
    host_id: String,
    #[serde(default = "wait::default_timeout")]
    timeout: u64,
    #[serde(flatten)]
    access: super::credentials::ControllerAccess,
}

fn load(args: &CmdArgs) -> Result<(Conf, Client), Error> {
    let c: Conf = serde_json::from_slice(&args.stdin).map_err(errors::config)?;
    for (field, v) in [
        ("mpurl", &c.url),
        ("project", &c.project),
        ("subnet", &c.subnet),
        ("hostId", &c.host_id),
    ] {
        if v.is_empty() {
            return Err(Error::new(
                ErrorCode::InvalidNetworkConfig,
                format!("\"{field}\" must not be empty"),
            ));
        }
    }
    if !c.url.starts_with("http://") && !c.url.starts_with("https://") {
        return Err(Error::new(
            ErrorCode::InvalidNetworkConfig,
            format!(
                "\"mpurl\" must be an http:// or https:// URL, not {}",
                c.url
            ),
        ));
    }
    let client = c.access.client(&c.url)?.project(&c.project);
    Ok((c, client))
}

/// The namespace of port UUIDs: version 5 of `corvid:cni-port` in the URL namespace.
const PORT_NAMESPACE: Uuid = uuid::uuid!("a08d9f77-8266-5113-806b-ccd9c8bbb0bf");

/// The attachment's parts, each ended by a NUL, so that ("ab", "c") and ("a", "bc") differ.
fn attachment(network: &str, container_id: &str, ifname: &str) -> Vec<u8> {
    [network, container_id, ifname]
        .iter()
        .flat_map(|p| p.bytes().chain(std::iter::once(0)))
        .collect()
}

/// The port of one attachment: the same (network, container, interface) always gives the
/// same UUID (RFC 9562 version 5), so DEL and GC find what an ADD made even if that ADD
/// was killed midway.
pub fn port_id(network: &str, container_id: &str, ifname: &str) -> String {
    Uuid::new_v5(&PORT_NAMESPACE, &attachment(network, container_id, ifname)).to_string()
}

/// The UUID corvid gave the attachment before version 5 (two FNV-1a hashes as a version
/// 8 UUID): ports made then are still found by DEL, CHECK and GC.
pub fn legacy_port_id(network: &str, container_id: &str, ifname: &str) -> String {
    let name = attachment(network, container_id, ifname);
    let hash = |key: u64| {
        let mut h = fnv::FnvHasher::with_key(key);
        h.write(&name);
        h.finish()
    };
    let hi = (hash(0xcbf2_9ce4_8422_2325) & !0xf000) | 0x8000;
    let lo = (hash(0x6c62_272e_07bb_0142) & !(0xc << 60)) | (0x8 << 60);
    Uuid::from_u64_pair(hi, lo).to_string()
}

/// Both UUIDs an attachment's port may have, today's first.
fn port_ids(network: &str, container_id: &str, ifname: &str) -> [String; 2] {
    [
        port_id(network, container_id, ifname),
        legacy_port_id(network, container_id, ifname),
    ]
}

/// A controller failure as a CNI error a person can act on.
fn api(e: ApiError, conf: &Conf, doing: &str) -> Error {
    match e {
        ApiError::Transport(why) => Error::new(
            Code::ControllerUnreachable,
            format!(
                "{doing}: the corvid controller at {} is unreachable",
                conf.url
            ),
        )
        .with_details(why),
        ApiError::Neutron {
            status: 409,
            ref kind,
            ref message,
        } if kind == "IpAddressGenerationFailure" => Error::new(
            ErrorCode::AddressExhausted,
            format!("{doing}: subnet {} has no free address left", conf.subnet),
        )
        .with_details(message.clone()),
        ApiError::Neutron {
            status,
            kind,
            message,
            ..
        } => Error::new(
            Code::ControllerRefused,
            format!("{doing}: the controller answered {status} {kind}"),
        )
        .with_details(message),
        ApiError::Decode(why) => Error::new(
            Code::ControllerRefused,
            format!("{doing}: unexpected answer from the controller"),
        )
        .with_details(why),
    }
}

/// Creates the port, or finds the one a repeated ADD made before.
fn create_port(
    client: &Client,
    conf: &Conf,
    args: &CmdArgs,
    id: &str,
    netns: &str,
) -> Result<(), ApiError> {
    let attrs = PortCreate {
        project_id: Some(conf.project.clone()),
        id: Some(id.to_string()),
        name: Some(format!("k8s_{id}")),
        admin_state_up: Some(true),
        description: Some(format!(
            "cni {}, ns:{netns}, host:{}",
            args.container_id,
            corvid_net::hostname()
        )),
        network_id: conf.subnet.clone(),
        veth_name: Some(args.ifname.clone()),
        network_ns: Some(netns.to_string()),
        port_security_enabled: Some(false),
        host_id: Some(conf.host_id.clone()),
        vnic_type: Some("normal".into()),
        fast_path: Some(true),
        ..Default::default()
    };
    match client.create(attrs) {
        Err(ApiError::Neutron {
            status: 409, kind, ..
        }) if kind == "PortExists" => Ok(()),
        r => r.map(drop),
    }
}

/// Waits until the host's agent has plugged the port and reported it UP.
fn wait_up(client: &Client, conf: &Conf, id: &str) -> Result<Port, Error> {
    wait::active(client, &conf.host_id, id, Duration::from_secs(conf.timeout)).map_err(|e| match e {
        NotActive::Failed => Error::new(
            Code::PortFailed,
            format!(
                "the agent of host {} could not plug port {id}: see its log",
                conf.host_id
            ),
        ),
        NotActive::Timeout => Error::new(
            Code::PortTimeout,
            format!(
                "port {id} is not UP after {}s: is `corvid agent --host-id {}` running on this host?",
                conf.timeout, conf.host_id
            ),
        ),
        NotActive::Gone => Error::new(
            Code::ControllerRefused,
            format!("port {id} was deleted while waiting for it to come UP"),
        ),
        NotActive::Api(e) => api(e, conf, "wait for the port"),
    })
}

/// The CNI result of an UP port: its interface, an address per fixed IP with its
/// subnet's prefix, and a default route per family through that family's first gateway.
fn result_of(
    client: &Client,
    conf: &Conf,
    port: &Port,
    args: &CmdArgs,
    netns: &str,
) -> Result<CniResult, Error> {
    let mut result = CniResult {
        interfaces: vec![Interface {
            name: args.ifname.clone(),
            mac: port.mac_address.clone(),
            sandbox: netns.to_string(),
            ..Interface::default()
        }],
        ..CniResult::default()
    };
    let mut fixed_ips: Vec<_> = port.fixed_ips.iter().collect();
    // IPv4 first: the address most runtimes take for "the" pod IP.
    fixed_ips.sort_by_key(|ip| ip.ip_address.is_ipv6());
    let mut subnets: Vec<Subnet> = Vec::new();
    for ip in fixed_ips {
        let at = match subnets.iter().position(|s| s.id == ip.subnet_id) {
            Some(at) => at,
            None => {
                let s: Subnet = client
                    .get(&ip.subnet_id)
                    .map_err(|e| api(e, conf, "read the port's subnet"))?;
                subnets.push(s);
                subnets.len() - 1
            }
        };
        let subnet = &subnets[at];
        result.ips.push(IpConfig {
            address: IpNet::new(ip.ip_address, subnet.cidr.prefix_len())
                .expect("prefix of a valid cidr"),
            gateway: subnet.gateway_ip,
            interface: Some(0),
        });
        if let Some(gw) = subnet.gateway_ip {
            let default = if gw.is_ipv4() {
                IpNet::V4(Default::default())
            } else {
                IpNet::V6(Default::default())
            };
            if !result.routes.iter().any(|r| r.dst == default) {
                result.routes.push(Route {
                    dst: default,
                    gw: Some(gw),
                    ..Route::default()
                });
            }
        }
    }
    let mut nameservers: Vec<String> = Vec::new();
    for n in subnets.iter().flat_map(|s| &s.dns_nameservers) {
        if !nameservers.contains(n) {
            nameservers.push(n.clone());
        }
    }
    if !nameservers.is_empty() {
        result.dns = Dns {
            nameservers,
            ..Dns::default()
        };
    }
    Ok(result)
}

/// Deletes a port; false when there was none.
fn delete_port(client: &Client, conf: &Conf, id: &str) -> Result<bool, Error> {
    match client.delete::<Port>(id) {
        Ok(()) => Ok(true),
        Err(ApiError::Neutron { status: 404, .. }) => Ok(false),
        Err(e) => Err(api(e, conf, "delete the port")),
    }
}

fn netns_of(args: &CmdArgs) -> Result<String, Error> {
    args.netns
        .as_ref()
        .map(|p| p.display().to_string())
        .ok_or_else(|| Error::new(ErrorCode::InvalidEnvironment, "CNI_NETNS is required"))
}

impl Plugin for Corvid {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, Error> {
        let (conf, client) = load(args)?;
        let netns = netns_of(args)?;
        Netns::open(&netns).map_err(errors::net)?;
        let id = port_id(&args.conf.name, &args.container_id, &args.ifname);
        create_port(&client, &conf, args, &id, &netns)
            .map_err(|e| api(e, &conf, "create the port"))?;
        let done = wait_up(&client, &conf, &id)
            .and_then(|port| result_of(&client, &conf, &port, args, &netns));
        if done.is_err() {
            let _ = delete_port(&client, &conf, &id);
        }
        done
    }

    fn del(&self, args: &CmdArgs) -> Result<(), Error> {
        let (conf, client) = load(args)?;
        let [id, legacy] = port_ids(&args.conf.name, &args.container_id, &args.ifname);
        if !delete_port(&client, &conf, &id)? {
            delete_port(&client, &conf, &legacy)?;
        }
        Ok(())
    }

    fn check(&self, args: &CmdArgs) -> Result<(), Error> {
        let (conf, client) = load(args)?;
        let fail = |msg: String| Error::new(ErrorCode::CheckFailed, msg);
        let [id, legacy] = port_ids(&args.conf.name, &args.container_id, &args.ifname);
        let port: Port = match client.get(&id) {
            Err(ApiError::Neutron { status: 404, .. }) => client.get(&legacy),
            r => r,
        }
        .map_err(|e| api(e, &conf, "read the port"))?;
        let id = &port.id;
        if port.status != Status::Active {
            return Err(fail(format!("port {id} is {}, not UP", port.status)));
        }
        let ns = Netns::open(netns_of(args)?).map_err(errors::net)?;
        let mut nl = Netlink::open_in(&ns).map_err(errors::net)?;
        let link = nl
            .link_by_name(&args.ifname)
            .map_err(errors::net)?
            .ok_or_else(|| fail(format!("interface {} is missing", args.ifname)))?;
        if !link.mac.eq_ignore_ascii_case(&port.mac_address) {
            return Err(fail(format!(
                "interface {} has MAC {}, the port has {}",
                args.ifname, link.mac, port.mac_address
            )));
        }
        let have = nl.addresses(Some(link.index)).map_err(errors::net)?;
        for ip in &port.fixed_ips {
            if !have.iter().any(|(_, a)| a.addr() == ip.ip_address) {
                return Err(fail(format!(
                    "interface {} lacks address {}",
                    args.ifname, ip.ip_address
                )));
            }
        }
        Ok(())
    }

    fn gc(&self, args: &CmdArgs) -> Result<(), Error> {
        let (conf, client) = load(args)?;
        let keep: Vec<String> = args
            .conf
            .valid_attachments
            .iter()
            .flatten()
            .flat_map(|a| port_ids(&args.conf.name, &a.container_id, &a.ifname))
            .collect();
        let (ports, _) = client
            .list::<Port>(&[("binding:host_id", &conf.host_id)])
            .map_err(|e| api(e, &conf, "list this host's ports"))?;
        for p in ports {
            let ours = p.name == format!("k8s_{}", p.id)
                && p.description.starts_with("cni ")
                && (p.network_id == conf.subnet
                    || p.fixed_ips.iter().any(|ip| ip.subnet_id == conf.subnet))
                && port_ids(
                    &args.conf.name,
                    p.description
                        .strip_prefix("cni ")
                        .and_then(|d| d.split(',').next())
                        .unwrap_or_default(),
                    p.veth_name.as_deref().unwrap_or_default(),
                )
                .contains(&p.id);
            if ours && !keep.contains(&p.id) {
                delete_port(&client, &conf, &p.id)?;
            }
        }
        Ok(())
    }

    fn status(&self, args: &CmdArgs) -> Result<(), Error> {
        let (conf, client) = load(args)?;
        let found = match client.get::<Subnet>(&conf.subnet) {
            Err(ApiError::Neutron { status: 404, .. }) => {
                client.get::<Network>(&conf.subnet).map(drop)
            }
            r => r.map(drop),
        };
        match found {
            Ok(()) => Ok(()),
            Err(e) => Err(Error::new(
                ErrorCode::PluginNotAvailable,
                api(e, &conf, "reach the subnet").msg,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_ids_are_stable_uuids_per_attachment() {
        let a = port_id("net", "c1", "eth0");
        assert_eq!(a, port_id("net", "c1", "eth0"));
        assert_ne!(a, port_id("net", "c1", "eth1"));
        assert_ne!(a, port_id("net2", "c1", "eth0"));
        assert_ne!(port_id("n", "ab", "c"), port_id("n", "a", "bc"));
        // Pinned: Python's uuid.uuid5(UUID("a08d9f77-..."), "net\0c1\0eth0\0") agrees.
        assert_eq!(a, "352bb6de-0a02-5416-bf14-28339205558d");
        assert_eq!(Uuid::parse_str(&a).unwrap().get_version_num(), 5);
    }

    #[test]
    fn legacy_port_ids_are_what_earlier_corvid_made() {
        assert_eq!(
            legacy_port_id("net", "c1", "eth0"),
            "45cfdc87-1006-8183-9e42-f5ce4417f154"
        );
        assert_ne!(
            legacy_port_id("n", "ab", "c"),
            legacy_port_id("n", "a", "bc")
        );
        assert_eq!(
            port_ids("net", "c1", "eth0"),
            [
                port_id("net", "c1", "eth0"),
                legacy_port_id("net", "c1", "eth0")
            ]
        );
    }
}
