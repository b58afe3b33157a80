//! What the controller's view holds per port: the heap bytes (as glibc's malloc charges
//! them) of a view fed N ports as the controller stores them, with the address and MAC
//! keys the watch delivers beside them (which the view passes over). Two shapes: the scale harness's ports (a network and a host, nothing else) and the
//! Kubernetes watcher's (a name, a device, an owner and two tags).
//! `cargo bench -p corvid-controller --bench view_memory` (`CORVID_BENCH_PORTS`, default
//! 100,000).

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicUsize, Ordering};

use corvid_controller::keys;
use corvid_controller::store::{Event, KeyValue};
use corvid_controller::view::View;
use serde_json::{json, Value};

struct Counting;

static BYTES: AtomicUsize = AtomicUsize::new(0);

/// What malloc takes for `size` bytes: an 8-byte header, rounded to 16, at least 32.
fn charged(size: usize) -> usize {
    ((size + 8).div_ceil(16) * 16).max(32)
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        BYTES.fetch_add(charged(l.size()), Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        BYTES.fetch_sub(charged(l.size()), Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn kv(key: String, value: Vec<u8>, rev: i64) -> KeyValue {
    KeyValue {
        key,
        value,
        create_revision: rev,
        mod_revision: rev,
    }
}

/// The keys port `n` writes: its object, address and MAC; `pod` adds what the Kubernetes
/// watcher sets.
fn port_keys(n: usize, pod: bool) -> Vec<KeyValue> {
    let net = n % 1000;
    let network_id = format!("5e1f0000-0000-4000-8000-{net:012x}");
    let subnet_id = format!("5b000000-0000-4000-8000-{net:012x}");
    let id = format!("90000000-0000-4000-8000-{n:012x}");
    let mac = format!(
        "fa:16:3e:{:02x}:{:02x}:{:02x}",
        n >> 16 & 255,
        n >> 8 & 255,
        n & 255
    );
    let base = u32::from(Ipv4Addr::new(10, (net >> 8) as u8, net as u8, 0));
    let ip = IpAddr::from(Ipv4Addr::from(base + (n / 1000) as u32 + 2));
    let mut port = json!({
        "id": id, "name": "", "network_id": network_id,
        "tenant_id": "c0ffee00c0ffee00c0ffee00c0ffee00",
        "project_id": "c0ffee00c0ffee00c0ffee00c0ffee00",
        "mac_address": mac, "admin_state_up": true, "status": "ACTIVE",
        "device_id": "", "device_owner": "",
        "fixed_ips": [{"subnet_id": subnet_id, "ip_address": ip.to_string()}],
        "binding:host_id": format!("scale-host-{:04}", n % 1000),
        "binding:profile": {}, "binding:vnic_type": "normal", "binding:vif_type": "veth",
        "binding:vif_details": {}, "port_security_enabled": true,
        "security_groups": ["5ec00000-0000-4000-8000-000000000001"],
        "allowed_address_pairs": [], "extra_dhcp_opts": [], "ip_allocation": "immediate",
        "description": "", "tags": [], "created_at": "2026-11-29T18:00:00Z",
        "updated_at": "2026-11-29T18:00:01Z", "revision_number": 2
    });
    if pod {
        let more = json!({
            "name": format!("namespace-{net}/web-7d4b9c6f5-{n:05x}"),
            "device_id": format!("3b1c7a8e-62f4-4b5e-9a0d-{n:012x}"),
            "device_owner": "compute:kubernetes",
            "tags": [format!("namespace:namespace-{net}"), format!("pod:web-7d4b9c6f5-{n:05x}")],
        });
        for (k, v) in more.as_object().into_iter().flatten() {
            port[k] = v.clone();
        }
    }
    vec![
        kv(keys::resource("ports", &id), to_vec(&port), n as i64 + 10),
        kv(
            keys::ip(&subnet_id, ip),
            id.clone().into_bytes(),
            n as i64 + 10,
        ),
        kv(keys::mac(&mac), id.into_bytes(), n as i64 + 10),
    ]
}

fn to_vec(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

fn main() {
    let ports: usize = std::env::var("CORVID_BENCH_PORTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    for (shape, pod) in [("scale harness", false), ("Kubernetes pod", true)] {
        let kvs: Vec<KeyValue> = (0..ports).flat_map(|n| port_keys(n, pod)).collect();
        let stored: usize = kvs
            .iter()
            .filter(|kv| kv.key.starts_with(keys::VIEWED[0]))
            .map(|kv| kv.value.len())
            .sum();
        let base = BYTES.load(Ordering::Relaxed);
        let mut view = View::load(Vec::new(), 1);
        for kv in &kvs {
            view.apply(&[Event::Put(kv.clone())]);
        }
        // The feed keeps its last 10,000 changes whatever the size.
        view.feed.clear();
        let bytes = BYTES.load(Ordering::Relaxed) - base;
        assert_eq!(view.ports.len(), ports, "a port did not parse");
        println!(
            "{shape:>14}: {ports} ports, view {:.1} MiB, {:.0} B/port (the stored JSON: {:.0} B/port)",
            bytes as f64 / 1048576.0,
            bytes as f64 / ports as f64,
            stored as f64 / ports as f64,
        );
    }
}
