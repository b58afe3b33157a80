//! containerd's CRI (Debian's containerd, private state) running pods on a list of
//! corvid's plugins only: bridge, then portmap and bandwidth, which containerd fills from
//! the sandbox's port mappings and bandwidth annotations, in PascalCase. The published
//! port answers from the node, the pod's traffic is shaped, and removing the sandbox
//! leaves nothing.

mod support {
    pub mod cluster;
    pub mod cri;
}

use k8s_cri::v1::{PortMapping, Protocol};
use serde_json::json;
use std::process::Command;
use support::cluster::ns::Ns;
use support::cri::Containerd;

/// What corvid put in the node's nftables table.
fn table_tags(node: &Ns) -> Vec<String> {
    node.open()
        .run(|| {
            let mut nft = corvid_net::nftables::Nftables::open().unwrap();
            corvid_net::nftables::portmap::port_mapping_tags(&mut nft).unwrap()
        })
        .unwrap()
}

#[test]
fn cri_sandboxes_get_published_ports_and_shaping_from_corvid_plugins() {
    let tag = format!("cvt{}", std::process::id());
    let node = Ns::new(&tag, "cri");
    node.ip("link set lo up");
    let bin = tempfile::Builder::new()
        .prefix("cvt-bin")
        .tempdir()
        .unwrap();
    let plugins = support::cluster::plugins::binary();
    let out = Command::new(env!("CARGO_BIN_EXE_corvid"))
        .args(["cni", "install", "--dir"])
        .arg(bin.path())
        .arg("--from")
        .arg(&plugins)
        .output()
        .unwrap();
    assert!(out.status.success(), "install: {out:?}");
    let leases = tempfile::tempdir().unwrap();
    let conflist = json!({"cniVersion": "1.0.0", "name": "cvtcri", "plugins": [
        {"type": "bridge", "bridge": "cvtbrc", "isGateway": true, "ipMasq": true,
         "hairpinMode": true,
         "ipam": {"type": "host-local", "subnet": "10.74.0.0/24", "dataDir": leases.path(),
                  "routes": [{"dst": "0.0.0.0/0"}]}},
        {"type": "portmap", "capabilities": {"portMappings": true}},
        {"type": "bandwidth", "capabilities": {"bandwidth": true}}]});
    let cri = Containerd::start(&node, bin.path(), &conflist);
    let mut config = cri.sandbox_config("default", "web", "cvt-uid-web");
    config.port_mappings = vec![PortMapping {
        protocol: Protocol::Tcp as i32,
        container_port: 80,
        host_port: 18082,
        host_ip: String::new(),
    }];
    config.annotations = [
        ("kubernetes.io/ingress-bandwidth", "8M"),
        ("kubernetes.io/egress-bandwidth", "8M"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let (id, status) = cri.run_sandbox(config);
    let ip = support::cri::sandbox_ip(&status);
    let netns = support::cri::sandbox_netns(&status);
    assert!(ip.starts_with("10.74.0."), "{ip}");
    assert_eq!(table_tags(&node).len(), 2, "the mapping and its hairpin");

    // A server in the pod's network namespace answers on the node's published port.
    let mut python3 = Command::new("nsenter");
    python3.arg(format!("--net={netns}")).arg("python3");
    let server = support::cluster::ns::serve_name_with(python3, "pod", 80);
    let got = node
        .command("python3")
        .args([
            "-c",
            "import socket\ns = socket.create_connection(('127.0.0.1', 18082), timeout=3)\nprint(s.recv(10).decode())",
        ])
        .output()
        .unwrap();
    drop(server);
    assert_eq!(
        String::from_utf8_lossy(&got.stdout).trim(),
        "pod",
        "{got:?}"
    );

    // 8M in the annotations is 8,000,000 bits a second: a million bytes.
    let mut nl = node.netlink();
    let veth = nl
        .links()
        .unwrap()
        .into_iter()
        .find(|l| l.name.starts_with("veth"))
        .expect("the pod's veth");
    let shaped = nl
        .token_bucket(&veth)
        .unwrap()
        .expect("shaped into the pod");
    assert_eq!(shaped.rate, 1_000_000);
    assert_eq!(
        node.links(corvid_net::names::IFB_PREFIX).len(),
        1,
        "an ifb for the egress"
    );

    cri.remove_sandbox(id);
    assert!(table_tags(&node).is_empty(), "mappings left");
    assert!(
        node.links(corvid_net::names::IFB_PREFIX).is_empty(),
        "ifb left"
    );
    assert!(node.links("veth").is_empty(), "veth left");
}
