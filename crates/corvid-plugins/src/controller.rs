//! corvid: the controller-backed plugin of the Mizar-MP agreement. ADD asks the controller
//! for a port bound to this host and waits until the host's agent has plugged it (status
//! UP); DEL deletes the port. The plugin never touches the kernel itself.

use std::time::{Duration, Instant};

use corvid_api::{ApiError, Client, Port, WatchPage};
use corvid_cni::result::{Dns, Interface, IpConfig, Route};
use corvid_cni::skel::{CmdArgs, Plugin};
use corvid_cni::{CniResult, Error, ErrorCode};
use corvid_net::{Netlink, Netns};
use ipnet::IpNet;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::errors;

/// The controller-backed plugin.
pub struct Controller;

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

fn default_timeout() -> u64 {
    60
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Conf {
    #[serde(rename = "mpurl")]
    url: String,
    project: String,
    subnet: String,
    host_id: String,
    #[serde(default = "default_timeout")]
    timeout: u64,
    #[serde(default)]
    token: Option<String>,
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
            format!("\"mpurl\" must be an http:// URL, not {}", c.url),
        ));
    }
    let mut client = Client::new(&c.url);
    if let Some(t) = &c.token {
        client = client.with_token(t);
    }
    Ok((c, client))
}

/// The port of one attachment: the same (network, container, interface) always gives the
/// same UUID, so DEL and GC find what an ADD made even if that ADD was killed midway.
pub fn port_id(network: &str, container_id: &str, ifname: &str) -> String {
    let hash = |seed: u64| {
        let mut h = seed;
        for b in [network, container_id, ifname]
            .iter()
            .flat_map(|p| p.bytes().chain(std::iter::once(0)))
        {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h
    };
    let hi = hash(0xcbf2_9ce4_8422_2325);
    let lo = hash(0x6c62_272e_07bb_0142);
    // RFC 9562 version 8 (custom) with the RFC variant.
    let hi = (hi & !0xf000) | 0x8000;
    let lo = (lo & !(0xc << 60)) | (0x8 << 60);
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
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

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn port_path(conf: &Conf, id: &str) -> String {
    format!("/project/{}/ports/{id}", conf.project)
}

/// Sends one request and turns an error status into `ApiError`.
fn call(
    client: &Client,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<Value, ApiError> {
    let (status, v, _) = client.request(method, path, body)?;
    if status < 400 {
        return Ok(v);
    }
    Err(ApiError::Neutron {
        status,
        kind: v["NeutronError"]["type"]
            .as_str()
            .unwrap_or("HTTPError")
            .to_string(),
        message: v["NeutronError"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    })
}

/// Creates the port, or finds the one a repeated ADD made before.
fn create_port(
    client: &Client,
    conf: &Conf,
    args: &CmdArgs,
    id: &str,
    netns: &str,
) -> Result<(), ApiError> {
    let body = json!({"port": {
        "project_id": conf.project,
        "id": id,
        "name": format!("k8s_{id}"),
        "admin_state_up": true,
        "description": format!("cni {}, ns:{netns}, host:{}", args.container_id, hostname()),
        "network_id": conf.subnet,
        "veth_name": args.ifname,
        "network_ns": netns,
        "port_security_enabled": false,
        "binding:host_id": conf.host_id,
        "binding:vnic_type": "normal",
        "fast_path": true,
    }});
    match call(
        client,
        "POST",
        &format!("/project/{}/ports", conf.project),
        Some(&body),
    ) {
        Err(ApiError::Neutron {
            status: 409, kind, ..
        }) if kind == "PortExists" => Ok(()),
        r => r.map(drop),
    }
}

fn status_of(p: &Port) -> &str {
    p.status.as_str()
}

/// Waits for the port's status to leave BUILD/DOWN: the watch feed when possible, so
/// UP is seen the moment the agent reports it.
fn wait_up(client: &Client, conf: &Conf, id: &str) -> Result<Port, Error> {
    let deadline = Instant::now() + Duration::from_secs(conf.timeout);
    let (ports, mut revision) = client
        .list::<Port>(&[("id", id)])
        .map_err(|e| api(e, conf, "read the port"))?;
    let mut port = ports.into_iter().next().ok_or_else(|| {
        Error::new(
            Code::ControllerRefused,
            format!("port {id} vanished while waiting for it to come UP"),
        )
    })?;
    loop {
        match status_of(&port) {
            "ACTIVE" => return Ok(port),
            "ERROR" => {
                return Err(Error::new(
                    Code::PortFailed,
                    format!(
                        "the agent of host {} could not plug port {id}: see its log",
                        conf.host_id
                    ),
                ))
            }
            _ => {}
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::new(
                Code::PortTimeout,
                format!(
                    "port {id} is not UP after {}s: is `corvid agent --host-id {}` running on this host?",
                    conf.timeout, conf.host_id
                ),
            ));
        }
        let wait = left.as_secs().clamp(1, 30);
        let path = format!(
            "/v2.0/watch?since={revision}&timeout={wait}&resource=ports&binding:host_id={}",
            encode(&conf.host_id)
        );
        let page: WatchPage = call(client, "GET", &path, None)
            .and_then(|v| serde_json::from_value(v).map_err(|e| ApiError::Decode(e.to_string())))
            .or_else(|e| match e {
                // Fell behind the feed: read the port again and watch from there.
                ApiError::Neutron { status: 410, .. } => {
                    let (ports, r) = client.list::<Port>(&[("id", id)])?;
                    Ok(WatchPage {
                        revision: r,
                        events: ports
                            .into_iter()
                            .map(|p| corvid_api::WatchEvent {
                                revision: r,
                                kind: "put".into(),
                                resource: "ports".into(),
                                id: p.id.clone(),
                                object: serde_json::to_value(p).unwrap_or_default(),
                            })
                            .collect(),
                    })
                }
                e => Err(e),
            })
            .map_err(|e| api(e, conf, "wait for the port"))?;
        revision = page.revision;
        for e in page.events.into_iter().filter(|e| e.id == id) {
            if e.kind == "delete" {
                return Err(Error::new(
                    Code::ControllerRefused,
                    format!("port {id} was deleted while waiting for it to come UP"),
                ));
            }
            if let Ok(p) = serde_json::from_value::<Port>(e.object) {
                port = p;
            }
        }
    }
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The CNI result of an UP port: its interface, addresses and the subnet's gateway.
fn result_of(
    client: &Client,
    conf: &Conf,
    port: &Port,
    args: &CmdArgs,
    netns: &str,
) -> Result<CniResult, Error> {
    let subnet = call(
        client,
        "GET",
        &format!("/project/{}/subnets/{}", conf.project, conf.subnet),
        None,
    )
    .map_err(|e| api(e, conf, "read the subnet"))?;
    let subnet = &subnet["subnet"];
    let cidr: IpNet = subnet["cidr"]
        .as_str()
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| Error::new(Code::ControllerRefused, "the subnet has no cidr"))?;
    let gateway = subnet["gateway_ip"].as_str().and_then(|g| g.parse().ok());
    let mut result = CniResult {
        interfaces: vec![Interface {
            name: args.ifname.clone(),
            mac: port.mac_address.clone(),
            sandbox: netns.to_string(),
            ..Interface::default()
        }],
        ..CniResult::default()
    };
    for ip in port
        .fixed_ips
        .iter()
        .filter(|ip| cidr.contains(&ip.ip_address))
    {
        result.ips.push(IpConfig {
            address: IpNet::new(ip.ip_address, cidr.prefix_len()).expect("prefix of a valid cidr"),
            gateway,
            interface: Some(0),
        });
    }
    if let Some(gw) = gateway {
        let default = if gw.is_ipv4() {
            IpNet::V4(Default::default())
        } else {
            IpNet::V6(Default::default())
        };
        result.routes.push(Route {
            dst: default,
            gw: Some(gw),
            ..Route::default()
        });
    }
    let nameservers: Vec<String> = subnet["dns_nameservers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect();
    if !nameservers.is_empty() {
        result.dns = Dns {
            nameservers,
            ..Dns::default()
        };
    }
    Ok(result)
}

fn delete_port(client: &Client, conf: &Conf, id: &str) -> Result<(), Error> {
    match call(client, "DELETE", &port_path(conf, id), None) {
        Ok(_) | Err(ApiError::Neutron { status: 404, .. }) => Ok(()),
        Err(e) => Err(api(e, conf, "delete the port")),
    }
}

fn netns_of(args: &CmdArgs) -> Result<String, Error> {
    args.netns
        .as_ref()
        .map(|p| p.display().to_string())
        .ok_or_else(|| Error::new(ErrorCode::InvalidEnvironment, "CNI_NETNS is required"))
}

impl Plugin for Controller {
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
        delete_port(
            &client,
            &conf,
            &port_id(&args.conf.name, &args.container_id, &args.ifname),
        )
    }

    fn check(&self, args: &CmdArgs) -> Result<(), Error> {
        let (conf, client) = load(args)?;
        let fail = |msg: String| Error::new(ErrorCode::CheckFailed, msg);
        let id = port_id(&args.conf.name, &args.container_id, &args.ifname);
        let v = call(&client, "GET", &port_path(&conf, &id), None)
            .map_err(|e| api(e, &conf, "read the port"))?;
        let port: Port = serde_json::from_value(v["port"].clone())
            .map_err(|e| api(ApiError::Decode(e.to_string()), &conf, "read the port"))?;
        if v["port"]["status"] != "UP" {
            return Err(fail(format!(
                "port {id} is {}, not UP",
                v["port"]["status"]
            )));
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
            .map(|a| port_id(&args.conf.name, &a.container_id, &a.ifname))
            .collect();
        let (ports, _) = client
            .list::<Port>(&[("binding:host_id", &conf.host_id)])
            .map_err(|e| api(e, &conf, "list this host's ports"))?;
        for p in ports {
            let ours = p.name == format!("k8s_{}", p.id)
                && p.description.starts_with("cni ")
                && p.fixed_ips.iter().any(|ip| ip.subnet_id == conf.subnet)
                && p.id
                    == port_id(
                        &args.conf.name,
                        p.description
                            .strip_prefix("cni ")
                            .and_then(|d| d.split(',').next())
                            .unwrap_or_default(),
                        p.veth_name.as_deref().unwrap_or_default(),
                    );
            if ours && !keep.contains(&p.id) {
                delete_port(&client, &conf, &p.id)?;
            }
        }
        Ok(())
    }

    fn status(&self, args: &CmdArgs) -> Result<(), Error> {
        let (conf, client) = load(args)?;
        let path = format!("/project/{}/subnets/{}", conf.project, conf.subnet);
        match call(&client, "GET", &path, None) {
            Ok(_) => Ok(()),
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
        let parts: Vec<&str> = a.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(parts[2].starts_with('8'));
        assert!(matches!(
            parts[3].chars().next(),
            Some('8' | '9' | 'a' | 'b')
        ));
    }
}
