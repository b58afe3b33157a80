//! ControllerProcess benchmark: port-create throughput and latency with 16 concurrent clients on
//! each store, list-by-device_id latency and the controller's RSS at 100k ports, then
//! creates again on that full store (`redb+`).
//! Run with `cargo bench -p corvid --bench controller`; `CORVID_BENCH_PORTS` sets the
//! port count for the list/RSS part, `CORVID_BENCH_SECS` the create phase length.
//! Neutron cannot run here; its figure (about 7 creates/s, p50 2.3 s, 16 clients, on this
//! machine kind) was measured outside this repository.

#[path = "../tests/support/controller.rs"]
mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corvid_api::{Client, Network, Port, Subnet};
use serde_json::json;
use support::{cpu_time, env, redb_store, rss_mib, ControllerProcess, Etcd};

const CLIENTS: usize = 16;
const NEUTRON_CREATES_PER_SEC: f64 = 7.0;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p) as usize]
}

fn network(c: &Client) -> String {
    let net: Network = c.create(json!({"name": "bench"})).expect("network");
    c.create::<Subnet>(json!({"network_id": net.id, "cidr": "10.0.0.0/8"}))
        .expect("subnet");
    net.id
}

/// 16 clients create ports for `secs`; prints creates/s, p50, p99, and the controller's
/// CPU time per create (steadier than the rate on a shared machine).
fn creates(label: &str, ctl: &ControllerProcess, secs: u64) {
    let net = network(&ctl.client());
    let lat = Arc::new(Mutex::new(Vec::new()));
    let cpu_before = cpu_time(ctl.pid());
    let start = Instant::now();
    let deadline = start + Duration::from_secs(secs);
    let threads: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (c, net, lat) = (ctl.client(), net.clone(), lat.clone());
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    c.create::<Port>(json!({"network_id": net}))
                        .expect("create");
                    mine.push(t.elapsed());
                }
                lat.lock().unwrap().extend(mine);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = cpu_time(ctl.pid()) - cpu_before;
    let mut lat = lat.lock().unwrap().clone();
    lat.sort();
    let rate = lat.len() as f64 / elapsed;
    println!(
        "{label:5} port create, {CLIENTS} clients: {:7.0}/s  p50 {:6.2} ms  p99 {:6.2} ms  controller CPU {:4.0} us/create  ({} creates; {:.0}x Neutron's {NEUTRON_CREATES_PER_SEC}/s)",
        rate,
        percentile(&lat, 0.5).as_secs_f64() * 1e3,
        percentile(&lat, 0.99).as_secs_f64() * 1e3,
        cpu.as_secs_f64() * 1e6 / lat.len() as f64,
        lat.len(),
        rate / NEUTRON_CREATES_PER_SEC,
    );
}

/// Fills to `n` ports (bulk requests), then times list-by-device_id and reads RSS.
fn at_scale(ctl: &ControllerProcess, n: u64) {
    let c = ctl.client();
    let net = network(&c);
    let fill = Instant::now();
    let per = n / CLIENTS as u64;
    let threads: Vec<_> = (0..CLIENTS as u64)
        .map(|t| {
            let (c, net) = (ctl.client(), net.clone());
            std::thread::spawn(move || {
                for chunk in (0..per).collect::<Vec<_>>().chunks(100) {
                    let ports = chunk
                        .iter()
                        .map(|i| json!({"network_id": net, "device_id": format!("dev-{t}-{i}")}))
                        .collect();
                    c.create_bulk::<Port>(ports).expect("bulk create");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let total = per * CLIENTS as u64;
    println!(
        "filled {total} ports in {:.1} s",
        fill.elapsed().as_secs_f64()
    );
    let mut lat = Vec::new();
    for i in 0..300u64 {
        let dev = format!("dev-{}-{}", i % CLIENTS as u64, (i * 7919) % per);
        let t = Instant::now();
        let (found, _) = c.list::<Port>(&[("device_id", &dev)]).expect("list");
        lat.push(t.elapsed());
        assert_eq!(found.len(), 1);
    }
    lat.sort();
    println!(
        "redb  list by device_id at {total} ports: p50 {:.2} ms  p99 {:.2} ms; controller RSS {:.0} MiB",
        percentile(&lat, 0.5).as_secs_f64() * 1e3,
        percentile(&lat, 0.99).as_secs_f64() * 1e3,
        rss_mib(ctl.pid()),
    );
}

fn main() {
    let secs = env("CORVID_BENCH_SECS", 5);
    {
        let (_dir, spec) = redb_store();
        creates("redb", &ControllerProcess::start(&spec, None), secs);
    }
    {
        let (_dir, spec) = redb_store();
        let redb = ControllerProcess::start(&spec, None);
        at_scale(&redb, env("CORVID_BENCH_PORTS", 100_000));
        creates("redb+", &redb, secs);
    }
    let etcd = Etcd::start();
    let ctl = ControllerProcess::start(&format!("etcd:{}", etcd.url), None);
    creates("etcd", &ctl, secs);
}
