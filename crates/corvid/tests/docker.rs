//! A real Docker (Debian's dockerd, private state, started inside a simulated host) on
//! corvid networks through `corvid docker-plugin`: networks with and without `--subnet`,
//! containers that ping each other, a CNI pod on the same network and a container behind a
//! second host with its own dockerd, connect/disconnect, `docker network inspect`, a plugin
//! restart under running containers, and removal that leaves nothing in the controller or
//! on the hosts; and corvid's IPAM driver alone, under Docker's bridge driver. Runs as root, in namespaces only (see tests/support/cluster.rs).

#[path = "support/cluster.rs"]
mod cluster;

#[path = "support/controller.rs"]
mod controller;

use std::time::Duration;

use cluster::docker::{DockerPlugin, Dockerd, IMAGE};
use cluster::ns::wait_until;
use cluster::{cni_result, result_ip, url, Cluster};
use controller::Stored;
use corvid_api::{Network, Port, Status, Subnet, SubnetPool};
use serde_json::Value;

/// The controller's port holding `ip`.
fn port_at(cluster: &Cluster, ip: &str) -> Option<Port> {
    cluster
        .ports()
        .into_iter()
        .find(|p| p.fixed_ips.iter().any(|f| f.ip_address.to_string() == ip))
}

/// The controller network behind a Docker network ID (exactly one), and its subnet.
fn controller_network(cluster: &Cluster, docker_id: &str) -> (Network, Subnet) {
    cluster.api(|c| {
        let mut nets = c.list::<Network>(&[("tags", docker_id)]).unwrap().0;
        assert_eq!(nets.len(), 1, "one controller network for {docker_id}");
        let net = nets.remove(0);
        let mut subnets = c.list::<Subnet>(&[("network_id", &net.id)]).unwrap().0;
        assert_eq!(subnets.len(), 1);
        (net, subnets.remove(0))
    })
}

#[test]
fn docker_containers_live_on_corvid_networks() {
    let cluster = Cluster::new("dk");
    let (h1, h2) = (&cluster.hosts[0], &cluster.hosts[1]);
    let driver = format!("{}a", cluster.tag);
    let mut plugin = DockerPlugin::start(h1, &driver, "h1", &url());
    let docker = Dockerd::start(h1);
    let d = |args: &[&str]| docker.ok(args);

    // A network with --subnet and --ip-range: a controller network tagged with Docker's ID,
    // its subnet allocating from the range only.
    let n1 = docker.create_network(
        &driver,
        "cvtn1",
        &["--subnet", "10.213.7.0/24", "--ip-range", "10.213.7.128/25"],
    );
    let (net1, subnet1) = controller_network(&cluster, &n1);
    assert_eq!(subnet1.cidr.to_string(), "10.213.7.0/24");
    assert_eq!(subnet1.gateway_ip.unwrap().to_string(), "10.213.7.1");

    // Without --subnet: a distinct /24 from the default range, and Docker is content.
    let n2 = docker.create_network(&driver, "cvtn2", &[]);
    let (_, subnet2) = controller_network(&cluster, &n2);
    assert!(subnet2.cidr.to_string().starts_with("10.213."));
    assert_eq!(subnet2.cidr.prefix_len(), 24);
    assert_ne!(subnet2.cidr, subnet1.cidr);
    let inspect: Value = serde_json::from_str(&d(&["network", "inspect", "cvtn2"])).unwrap();
    assert_eq!(
        inspect[0]["IPAM"]["Config"][0]["Subnet"],
        subnet2.cidr.to_string()
    );

    // Two containers, one with a static address and MAC; they ping each other.
    d(&[
        "run", "-d", "--name", "ca", "--net", "cvtn1", IMAGE, "sleep", "600",
    ]);
    d(&[
        "run",
        "-d",
        "--name",
        "cb",
        "--net",
        "cvtn1",
        "--ip",
        "10.213.7.50",
        "--mac-address",
        "02:42:0a:d5:07:32",
        IMAGE,
        "sleep",
        "600",
    ]);
    let ip_a = docker.ip("ca", "cvtn1");
    let range: ipnet::IpNet = "10.213.7.128/25".parse().unwrap();
    assert!(
        range.contains(&ip_a.parse::<std::net::IpAddr>().unwrap()),
        "{ip_a}"
    );
    assert_eq!(docker.ip("cb", "cvtn1"), "10.213.7.50");
    assert!(docker.ping("ca", "10.213.7.50"), "a pings b");
    assert!(docker.ping("cb", &ip_a), "b pings a");
    assert!(docker.ping("ca", "10.213.7.1"), "a pings its gateway");
    let port_b = port_at(&cluster, "10.213.7.50").expect("b's port");
    assert_eq!(port_b.mac_address, "02:42:0a:d5:07:32");
    assert_eq!(port_b.binding_host_id, "h1");
    assert_eq!(port_b.status, Status::Active);
    let eth0 = d(&["exec", "cb", "cat", "/sys/class/net/eth0/address"]);
    assert_eq!(eth0, "02:42:0a:d5:07:32");

    // docker network inspect shows the controller's addresses.
    let inspect: Value = serde_json::from_str(&d(&["network", "inspect", "cvtn1"])).unwrap();
    let containers = inspect[0]["Containers"].as_object().unwrap();
    assert_eq!(containers.len(), 2);
    for c in containers.values() {
        let ip = c["IPv4Address"]
            .as_str()
            .unwrap()
            .split('/')
            .next()
            .unwrap();
        let port = port_at(&cluster, ip).expect("a controller port for each container");
        assert_eq!(port.network_id, net1.id);
        assert_eq!(c["MacAddress"], port.mac_address);
    }

    // A CNI pod on the same network, on the same host.
    cluster.conflist("n1", &subnet1.id);
    let pod = cluster.pod("pod");
    let ip_pod = result_ip(&cni_result(&cluster.add(0, "n1", &pod)));
    assert!(docker.ping("ca", &ip_pod), "a container pings a CNI pod");
    assert!(pod.ping("10.213.7.50"), "the CNI pod pings a container");

    // A second host with its own dockerd joins the same controller network.
    let driver2 = format!("{}b", cluster.tag);
    let _plugin2 = DockerPlugin::start(h2, &driver2, "h2", &url());
    let docker2 = Dockerd::start(h2);
    let subnet_opt = format!("corvid.subnet.id={}", subnet1.id);
    let net_opt = format!("corvid.net.id={}", net1.id);
    let refused = docker2
        .command(&[
            "network",
            "create",
            "-d",
            &driver2,
            "--ipam-driver",
            &driver2,
        ])
        .args(["-o", &net_opt, "cvtbad"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("is not a subnet of corvid network"),
        "{refused:?}"
    );
    let m1 = docker2.create_network(
        &driver2,
        "cvtn1",
        &["--ipam-opt", &subnet_opt, "-o", &net_opt],
    );
    docker2.ok(&[
        "run", "-d", "--name", "cc", "--net", "cvtn1", IMAGE, "sleep", "600",
    ]);
    let ip_c = docker2.ip("cc", "cvtn1");
    assert!(subnet1
        .cidr
        .contains(&ip_c.parse::<std::net::IpAddr>().unwrap()));
    assert_eq!(port_at(&cluster, &ip_c).unwrap().binding_host_id, "h2");
    assert!(
        docker.ping_eventually("ca", &ip_c),
        "a reaches c across hosts"
    );
    assert!(
        docker2.ping("cc", &ip_pod),
        "c reaches the CNI pod across hosts"
    );

    // connect and disconnect: a second interface with an address on the other network.
    d(&["network", "connect", "cvtn2", "ca"]);
    let ip_a2 = docker.ip("ca", "cvtn2");
    let port_a2 = port_at(&cluster, &ip_a2).expect("a's port on cvtn2");
    assert!(d(&["exec", "ca", "ip", "-4", "addr", "show", "eth1"]).contains(&ip_a2));
    assert_eq!(port_a2.status, Status::Active);
    let before = h1.links("cvp").len();
    d(&["network", "disconnect", "cvtn2", "ca"]);
    assert!(
        port_at(&cluster, &ip_a2).is_none(),
        "the port went with disconnect"
    );
    assert!(!docker
        .docker(&["exec", "ca", "ip", "link", "show", "eth1"])
        .status
        .success());
    assert_eq!(h1.links("cvp").len(), before - 1);
    // Its last endpoint gone, the subnet went too; the next one makes it again.
    let gone = cluster.api(|c| c.get::<Subnet>(&subnet2.id));
    assert!(gone.is_err(), "the emptied subnet is deleted");
    d(&["network", "connect", "cvtn2", "ca"]);
    let (_, remade) = controller_network(&cluster, &n2);
    assert_eq!(
        (remade.cidr, remade.gateway_ip),
        (subnet2.cidr, subnet2.gateway_ip)
    );
    let ip_again: std::net::IpAddr = docker.ip("ca", "cvtn2").parse().unwrap();
    assert!(remade.cidr.contains(&ip_again));
    assert!(docker.ping("ca", &remade.gateway_ip.unwrap().to_string()));
    d(&["network", "disconnect", "cvtn2", "ca"]);

    // The plugin dies and comes back: running containers keep their network, and
    // removing them works from what the controller holds.
    plugin.kill9();
    assert!(
        docker.ping("ca", "10.213.7.50"),
        "the datapath outlives the plugin"
    );
    plugin.restart(h1, "h1", &url());
    assert!(docker.ping("ca", &ip_c));
    d(&["rm", "-f", "ca", "cb"]);
    assert!(port_at(&cluster, &ip_a).is_none() && port_at(&cluster, "10.213.7.50").is_none());

    // Remove everything: nothing is left in the controller or on either host.
    docker2.ok(&["rm", "-f", "cc"]);
    docker2.ok(&["network", "rm", "cvtn1"]);
    let adopted = cluster.api(|c| c.get::<Network>(&net1.id).unwrap());
    assert!(
        !adopted.tags.contains(&m1),
        "the adopted network is untagged, not deleted"
    );
    let del = cluster.del(0, "n1", &pod);
    assert!(del.status.success(), "{del:?}");
    d(&["network", "rm", "cvtn1", "cvtn2"]);
    cluster.api(|c| {
        assert!(c.list::<Network>(&[]).unwrap().0.is_empty());
        assert!(c.list::<Subnet>(&[]).unwrap().0.is_empty());
        assert!(c.list::<SubnetPool>(&[]).unwrap().0.is_empty());
        assert!(c.list::<Port>(&[]).unwrap().0.is_empty());
    });
    for h in [h1, h2] {
        wait_until(
            "the hosts to drop corvid's links",
            Duration::from_secs(20),
            || {
                ["cvp", "cvc", "cvb", "cvx"]
                    .iter()
                    .all(|p| h.links(p).is_empty())
            },
        );
    }
}

/// The alternative to a unix socket: the driver on TCP, announced by a spec file.
#[test]
fn docker_finds_a_tcp_driver_by_its_spec_file() {
    let cluster = Cluster::new("ds");
    let host = &cluster.hosts[0];
    let driver = format!("{}s", cluster.tag);
    let plugin = DockerPlugin::start_tcp(host, &driver, "h1", &url());
    let spec = std::fs::read_to_string(&plugin.socket).unwrap();
    assert!(spec.starts_with("tcp://127.0.0.1:"), "{spec}");
    let docker = Dockerd::start(host);
    let id = docker.create_network(&driver, "cvtspec", &["--subnet", "10.218.0.0/24"]);
    let (_, subnet) = controller_network(&cluster, &id);
    assert_eq!(subnet.cidr.to_string(), "10.218.0.0/24");
    docker.ok(&[
        "run", "-d", "--name", "cs", "--net", "cvtspec", IMAGE, "sleep", "600",
    ]);
    assert!(
        docker.ping("cs", "10.218.0.1"),
        "the container reaches its gateway"
    );
    docker.ok(&["rm", "-f", "cs"]);
    docker.ok(&["network", "rm", "cvtspec"]);
    assert!(cluster.ports().is_empty());
}

/// corvid's IPAM driver alone, under Docker's own bridge driver, on a controller subnet
/// that CNI pods could share: Docker's bridge holds the gateway and the containers'
/// veths, corvid only their addresses (ports of the subnet). Removing a container releases
/// its address: afterwards the controller holds no port, and its store reserves no
/// address or MAC.
#[test]
fn corvid_ipam_serves_dockers_bridge_driver() {
    let mut cluster = Cluster::new("di");
    let (net, subnet) = cluster.network("ipam", "10.219.0.0/24", false);
    let host = &cluster.hosts[0];
    let driver = format!("{}i", cluster.tag);
    let _plugin = DockerPlugin::start(host, &driver, "h1", &url());
    let docker = Dockerd::start(host);
    let adopt = format!("corvid.subnet.id={}", subnet.id);
    docker.ok(&[
        "network",
        "create",
        "-d",
        "bridge",
        "--ipam-driver",
        &driver,
        "--ipam-opt",
        &adopt,
        "cvtipam",
    ]);
    for round in 0..2 {
        for name in ["ia", "ib"] {
            docker.ok(&[
                "run", "-d", "--name", name, "--net", "cvtipam", IMAGE, "sleep", "600",
            ]);
        }
        let (a, b) = (docker.ip("ia", "cvtipam"), docker.ip("ib", "cvtipam"));
        for ip in [&a, &b] {
            let port = port_at(&cluster, ip).expect("a controller port holds each address");
            assert_eq!(port.network_id, net.id);
            assert!(
                port.binding_host_id.is_empty(),
                "round {round}: an address, bound by no corvid driver"
            );
        }
        assert!(docker.ping("ia", &b), "round {round}: a pings b");
        assert!(
            docker.ping("ib", "10.219.0.1"),
            "round {round}: b pings the gateway on Docker's bridge"
        );
        docker.ok(&["rm", "-f", "ia", "ib"]);
        assert_eq!(
            cluster.ports(),
            Vec::<Port>::new(),
            "round {round}: the removed containers' addresses are released"
        );
    }
    docker.ok(&["network", "rm", "cvtipam"]);
    drop(docker);
    // The controller stopped: redb's file is one process's at a time.
    cluster.controller = None;
    let stored = Stored::read(&cluster.store);
    assert_eq!(
        (stored.ips, stored.macs),
        Default::default(),
        "reservations left"
    );
}

#[test]
fn ipv6_networks_give_containers_both_families() {
    let cluster = Cluster::new("d6");
    let h1 = &cluster.hosts[0];
    let driver = format!("{}a", cluster.tag);
    let _plugin = DockerPlugin::start(h1, &driver, "h1", &url());
    let docker = Dockerd::start(h1);
    let d = |args: &[&str]| docker.ok(args);
    // As on Docker's own bridge: --ipv6 and a subnet of each family.
    let id = docker.create_network(
        &driver,
        "cvtn6",
        &[
            "--ipv6",
            "--subnet",
            "10.218.0.0/24",
            "--subnet",
            "fd18::/64",
        ],
    );
    let subnets = cluster.api(|c| {
        let net = c
            .list::<Network>(&[("tags", id.as_str())])
            .unwrap()
            .0
            .remove(0);
        c.list::<Subnet>(&[("network_id", &net.id)]).unwrap().0
    });
    let mut cidrs: Vec<String> = subnets.iter().map(|s| s.cidr.to_string()).collect();
    cidrs.sort();
    assert_eq!(cidrs, ["10.218.0.0/24", "fd18::/64"]);
    for name in ["c6a", "c6b"] {
        d(&[
            "run", "-d", "--name", name, "--net", "cvtn6", IMAGE, "sleep", "600",
        ]);
    }
    let ip6 = |container: &str| {
        let format = "{{(index .NetworkSettings.Networks \"cvtn6\").GlobalIPv6Address}}";
        d(&["inspect", "--format", format, container])
    };
    let (a6, b6) = (ip6("c6a"), ip6("c6b"));
    for ip in [&a6, &b6] {
        let addr: std::net::Ipv6Addr = ip.parse().unwrap_or_else(|_| panic!("{ip:?}"));
        assert_eq!(addr.segments()[..4], [0xfd18, 0, 0, 0], "{ip}");
        assert!(
            port_at(&cluster, ip).is_some_and(|p| p.fixed_ips.len() == 2),
            "a port with both addresses holds {ip}"
        );
    }
    // The address is in the container, with the gateway's default route.
    let shown = d(&["exec", "c6a", "ip", "-6", "addr", "show", "eth0"]);
    assert!(shown.contains(&format!("{a6}/64")), "{shown}");
    let routes = d(&["exec", "c6a", "ip", "-6", "route"]);
    assert!(routes.contains("default via fd18::1"), "{routes}");
    assert!(docker.ping("c6a", &b6), "IPv6 between containers");
    assert!(docker.ping("c6a", "fd18::1"), "the IPv6 gateway");
    assert!(docker.ping("c6a", &docker.ip("c6b", "cvtn6")), "IPv4 still");
    d(&["rm", "-f", "c6a", "c6b"]);
    d(&["network", "rm", "cvtn6"]);
    assert!(cluster.ports().is_empty());
}
