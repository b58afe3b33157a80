//! `scripts/testing/cluster_dns.py`, the cluster DNS `scripts/k8s-e2e.sh` runs in place of
//! CoreDNS, against a real API server: the records the e2e suite resolves, following
//! the objects as they change.

use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

use super::support::cluster::ns::{wait_until, Ns, Proc};
use super::support::kube::{KubeApi, ADMIN_TOKEN};

/// Asks the server on the namespace's loopback for `name`'s `qtype` records, with
/// dnslib's client: the answer's code and its records, as "TYPE data".
fn ask(lan: &Ns, name: &str, qtype: &str) -> (String, Vec<String>) {
    const QUERY: &str = "import sys
from dnslib import DNSRecord, QTYPE, RCODE
q = DNSRecord.question(sys.argv[1], sys.argv[2])
r = DNSRecord.parse(q.send('127.0.0.1', 53, timeout=2))
print(RCODE[r.header.rcode])
for a in r.rr:
    print(QTYPE[a.rtype], str(a.rdata).rstrip('.'))";
    let out = lan
        .command("/usr/bin/python3")
        .args(["-c", QUERY, name, qtype])
        .output()
        .unwrap();
    assert!(out.status.success(), "asking for {name}: {out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines().map(str::to_string);
    (lines.next().unwrap(), lines.collect())
}

fn records(lan: &Ns, name: &str, qtype: &str) -> Vec<String> {
    let (code, answers) = ask(lan, name, qtype);
    assert_eq!(code, "NOERROR", "{name} {qtype}");
    answers
}

#[test]
fn the_stand_in_cluster_dns_answers_what_the_e2e_suite_asks() {
    let lan = Ns::new("kd", "lan");
    lan.ip("link set lo up");
    let kube = KubeApi::start(&lan.path, "127.0.0.1");
    kube.admin(|c| async move {
        let services: Api<Service> = Api::namespaced(c.clone(), "default");
        for spec in [
            json!({"clusterIP": "10.0.0.50", "ports": [{"name": "http", "port": 80}]}),
            json!({"clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]}),
            json!({"type": "ExternalName", "externalName": "web.default.svc.cluster.local"}),
        ]
        .into_iter()
        .zip(["web", "db", "ext"])
        .map(|(spec, name)| json!({"metadata": {"name": name}, "spec": spec}))
        {
            let svc: Service = serde_json::from_value(spec).unwrap();
            services.create(&PostParams::default(), &svc).await.unwrap();
        }
        let endpoints: Endpoints = serde_json::from_value(json!({
            "metadata": {"name": "db"},
            "subsets": [{"addresses": [{"ip": "10.1.2.3", "hostname": "db-0"}],
                         "ports": [{"name": "pg", "port": 5432}]}],
        }))
        .unwrap();
        Api::<Endpoints>::namespaced(c, "default")
            .create(&PostParams::default(), &endpoints)
            .await
            .unwrap();
    });
    let dir = tempfile::Builder::new()
        .prefix("cvt-dns")
        .tempdir()
        .unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, ADMIN_TOKEN).unwrap();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/testing/cluster_dns.py"
    );
    let _dns = Proc(
        lan.command("/usr/bin/python3")
            .arg(script)
            .arg(&kube.url)
            .arg(&token)
            .arg(kube.ca())
            .arg("127.0.0.1")
            .stdout(Stdio::null())
            .spawn()
            .expect("python3-dnslib is installed"),
    );
    let web = "web.default.svc.cluster.local";
    wait_until("the DNS to answer", Duration::from_secs(20), || {
        lan.command("/usr/bin/python3")
            .args([
                "-c",
                "import socket; socket.create_connection(('127.0.0.1', 53), 1)",
            ])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });

    assert_eq!(records(&lan, web, "A"), ["A 10.0.0.50"]);
    assert_eq!(
        records(&lan, "ext.default.svc.cluster.local", "A"),
        [format!("CNAME {web}"), "A 10.0.0.50".into()],
        "an external name in the cluster is followed"
    );
    let db = "db.default.svc.cluster.local";
    assert_eq!(records(&lan, db, "A"), ["A 10.1.2.3"], "headless");
    assert_eq!(records(&lan, &format!("db-0.{db}"), "A"), ["A 10.1.2.3"]);
    assert_eq!(
        records(&lan, &format!("_pg._tcp.{db}"), "SRV"),
        [format!("SRV 0 100 5432 db-0.{db}")]
    );
    assert_eq!(
        records(&lan, "10-1-2-9.default.pod.cluster.local", "A"),
        ["A 10.1.2.9"]
    );
    assert_eq!(
        records(&lan, "50.0.0.10.in-addr.arpa", "PTR"),
        [format!("PTR {web}")]
    );
    assert!(records(&lan, web, "AAAA").is_empty(), "no IPv6 address");
    assert_eq!(
        ask(&lan, "nope.default.svc.cluster.local", "A").0,
        "NXDOMAIN"
    );
    assert_eq!(ask(&lan, "example.com", "A").0, "REFUSED", "no upstream");

    // A deleted service's name goes within the second the server rereads in.
    kube.admin(|c| async move {
        Api::<Service>::namespaced(c, "default")
            .delete("web", &DeleteParams::default())
            .await
            .unwrap();
    });
    wait_until("web's name to go", Duration::from_secs(5), || {
        ask(&lan, web, "A").0 == "NXDOMAIN"
    });
}
