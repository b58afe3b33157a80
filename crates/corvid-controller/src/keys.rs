//! Where each thing lives in the store. Everything is under one prefix so one watch sees it.

use std::net::IpAddr;

/// The prefix of every corvid key.
pub const ROOT: &str = "/corvid/";

/// The cluster's identity, made by the first controller to start on the store: agents
/// mark their devices with it.
pub const CLUSTER_ID: &str = "/corvid/cluster-id";

/// Written by a controller to learn how far its view has followed the store: the watch
/// delivers this key's change after every change before it. Nothing reads its value.
pub const PROGRESS: &str = "/corvid/progress";

/// The prefixes of the keys the view holds: the objects. The rest only guard writes (taken
/// addresses and MACs, which the view works out of the objects; who uses a network or a
/// group; VNIs), so a load leaves them out: at 100,000 ports they are four keys of five.
pub const VIEWED: [&str; 1] = ["/corvid/r/"];

/// A resource object: `/corvid/r/<collection>/<id>`.
pub fn resource(collection: &str, id: &str) -> String {
    format!("{ROOT}r/{collection}/{id}")
}

/// An address taken in a subnet: `/corvid/ip/<subnet>/<ip>` (value: the owner's ID).
pub fn ip(subnet: &str, ip: IpAddr) -> String {
    format!("{ROOT}ip/{subnet}/{ip}")
}

/// Prefix of every address taken in a subnet; empty means the subnet is unused.
pub fn ips_of(subnet: &str) -> String {
    format!("{ROOT}ip/{subnet}/")
}

/// A MAC address in use: `/corvid/mac/<mac>`.
pub fn mac(mac: &str) -> String {
    format!("{ROOT}mac/{mac}")
}

/// Something that keeps a network in use (a port, a floating IP).
pub fn network_user(network: &str, user: &str) -> String {
    format!("{ROOT}netuse/{network}/{user}")
}

/// Prefix of a network's users; empty means the network can be deleted.
pub fn network_users(network: &str) -> String {
    format!("{ROOT}netuse/{network}/")
}

/// A port that has a security group: `/corvid/sguse/<group>/<port>`.
pub fn group_user(group: &str, port: &str) -> String {
    format!("{ROOT}sguse/{group}/{port}")
}

/// Prefix of the ports that have a security group; empty means no port has it.
pub fn group_users(group: &str) -> String {
    format!("{ROOT}sguse/{group}/")
}

/// A VXLAN segment ID taken by a network: `/corvid/vni/<id>` (value: the network's ID).
pub fn vni(id: u32) -> String {
    format!("{ROOT}vni/{id}")
}

/// What a key names.
#[derive(Debug, PartialEq)]
pub enum Parsed<'a> {
    /// A resource object.
    Resource(&'a str, &'a str),
    /// A taken address.
    Ip(&'a str, IpAddr),
    /// A MAC in use.
    Mac(&'a str),
    /// Anything else (index keys the view does not need).
    Other,
}

/// Parses a key written by this module.
pub fn parse(key: &str) -> Parsed<'_> {
    let Some(rest) = key.strip_prefix(ROOT) else {
        return Parsed::Other;
    };
    let mut parts = rest.splitn(3, '/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("r"), Some(coll), Some(id)) => Parsed::Resource(coll, id),
        (Some("ip"), Some(subnet), Some(ip)) => match ip.parse() {
            Ok(ip) => Parsed::Ip(subnet, ip),
            Err(_) => Parsed::Other,
        },
        (Some("mac"), Some(mac), None) => Parsed::Mac(mac),
        _ => Parsed::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_back() {
        assert_eq!(
            parse(&resource("ports", "p1")),
            Parsed::Resource("ports", "p1")
        );
        let a: IpAddr = "fd00::5".parse().unwrap();
        assert_eq!(parse(&ip("s1", a)), Parsed::Ip("s1", a));
        assert_eq!(
            parse(&mac("fa:16:3e:00:00:01")),
            Parsed::Mac("fa:16:3e:00:00:01")
        );
        assert_eq!(parse(&network_user("n", "p")), Parsed::Other);
        assert_eq!(parse(&group_user("g", "p")), Parsed::Other);
        assert!(group_user("g", "p").starts_with(&group_users("g")));
        assert_eq!(parse("/elsewhere/x"), Parsed::Other);
    }
}
