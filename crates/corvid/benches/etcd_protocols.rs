//! etcd's two client protocols side by side on one etcd: the JSON gateway (`/v3/kv/txn`,
//! base64 keys and values, as `EtcdStore` sent them before it moved to gRPC) and gRPC
//! through the `etcd-client` crate, as `EtcdStore` sends them now. 16 workers send
//! transactions shaped like a port create (three "does not exist" compares, four puts: the port, its address, MAC and
//! device entries) for `CORVID_BENCH_SECS` (5) per round, the protocols taking turns for
//! three rounds each; printed are transactions per second and etcd's CPU time per
//! transaction, with their ratios. Then one transaction of 40 port creates (160 puts)
//! is sent each way: etcd's `--max-txn-ops` (128) refuses it whatever the protocol.
//!
//! `cargo bench -p corvid --bench etcd_protocols`

#[path = "../tests/support/controller.rs"]
mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use serde_json::{json, Value};
use support::{cpu_time, env, Etcd};

const WORKERS: usize = 16;

/// The keys and value of port `n` of worker `w`: a port-sized JSON value.
fn port_writes(w: usize, n: u64) -> Vec<(String, String)> {
    let id = format!("{w:04x}{n:012x}-0000-4000-8000-000000000000");
    let value = json!({"id": id, "network_id": "n", "mac_address": format!("fa:16:3e:{w:02x}:{:02x}:{:02x}", n >> 8 & 0xff, n & 0xff),
        "fixed_ips": [{"subnet_id": "s", "ip_address": format!("10.{w}.{}.{}", n >> 8 & 0xff, n & 0xff)}],
        "name": "", "device_id": format!("dev-{w}-{n}"), "device_owner": "", "status": "DOWN",
        "binding:host_id": "", "binding:profile": {}, "binding:vif_details": {}, "tags": [],
        "security_groups": [], "allowed_address_pairs": [], "extra_dhcp_opts": [],
        "description": "a port about as large as the controller's", "revision_number": 1,
        "created_at": "2026-11-24T12:00:00Z", "updated_at": "2026-11-24T12:00:00Z"})
    .to_string();
    vec![
        (format!("/bench/ports/{id}"), value),
        (format!("/bench/ip/{w}/{n}"), id.clone()),
        (format!("/bench/mac/{w}/{n}"), id.clone()),
        (format!("/bench/device/{w}/{n}"), id),
    ]
}

/// One transaction through the JSON gateway, as the controller sent it.
fn gateway_txn(agent: &ureq::Agent, url: &str, writes: &[(String, String)]) -> Result<(), String> {
    let b64 = |s: &str| B64.encode(s);
    let compare: Vec<Value> = writes[..writes.len().min(3)]
        .iter()
        .map(|(k, _)| json!({"key": b64(k), "target": "CREATE", "result": "EQUAL", "create_revision": 0}))
        .collect();
    let success: Vec<Value> = writes
        .iter()
        .map(|(k, v)| json!({"request_put": {"key": b64(k), "value": b64(v)}}))
        .collect();
    let body = json!({"compare": compare, "success": success});
    match agent.post(&format!("{url}/v3/kv/txn")).send_json(body) {
        Ok(r) => {
            let v: Value = r.into_json().map_err(|e| e.to_string())?;
            if v["succeeded"] == true {
                Ok(())
            } else {
                Err(format!("not applied: {v}"))
            }
        }
        Err(ureq::Error::Status(code, r)) => {
            Err(format!("{code} {}", r.into_string().unwrap_or_default()))
        }
        Err(e) => Err(e.to_string()),
    }
}

/// The same transaction over gRPC.
async fn grpc_txn(
    kv: &mut etcd_client::KvClient,
    writes: &[(String, String)],
) -> Result<(), String> {
    let compares: Vec<Compare> = writes[..writes.len().min(3)]
        .iter()
        .map(|(k, _)| Compare::create_revision(k.as_str(), CompareOp::Equal, 0))
        .collect();
    let ops: Vec<TxnOp> = writes
        .iter()
        .map(|(k, v)| TxnOp::put(k.as_str(), v.as_str(), None))
        .collect();
    let r = kv
        .txn(Txn::new().when(compares).and_then(ops))
        .await
        .map_err(|e| e.to_string())?;
    if r.succeeded() {
        Ok(())
    } else {
        Err("not applied".into())
    }
}

/// Runs `WORKERS` workers of one protocol for `secs`; answers transactions per second
/// and etcd's CPU time per transaction.
fn round(etcd: &Etcd, grpc: bool, secs: u64, base: &AtomicU64) -> (f64, Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let cpu0 = cpu_time(etcd.pid());
    let start = Instant::now();
    let first = base.fetch_add(1 << 32, Ordering::Relaxed);
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (stop, done, url) = (stop.clone(), done.clone(), etcd.url.clone());
            std::thread::spawn(move || {
                let mut n = first;
                if grpc {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    rt.block_on(async {
                        let mut kv = etcd_client::Client::connect([url.as_str()], None)
                            .await
                            .expect("gRPC connect")
                            .kv_client();
                        while !stop.load(Ordering::Relaxed) {
                            n += 1;
                            grpc_txn(&mut kv, &port_writes(w, n))
                                .await
                                .expect("gRPC txn");
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                } else {
                    let agent = ureq::AgentBuilder::new().build();
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        gateway_txn(&agent, &url, &port_writes(w, n)).expect("gateway txn");
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let (elapsed, cpu) = (start.elapsed(), cpu_time(etcd.pid()) - cpu0);
    let n = done.load(Ordering::Relaxed).max(1);
    (n as f64 / elapsed.as_secs_f64(), cpu / n as u32)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let secs = env("CORVID_BENCH_SECS", 5);
    let etcd = Etcd::start();
    let base = AtomicU64::new(0);
    let (mut json_runs, mut grpc_runs) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        json_runs.push(round(&etcd, false, secs, &base));
        grpc_runs.push(round(&etcd, true, secs, &base));
    }
    let median = |runs: &mut Vec<(f64, Duration)>| {
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        runs[1]
    };
    let (json_rate, json_cpu) = median(&mut json_runs);
    let (grpc_rate, grpc_cpu) = median(&mut grpc_runs);
    println!("16 workers, port-create-shaped transactions (3 compares, 4 puts), medians of 3 rounds of {secs} s:");
    println!(
        "JSON gateway  {json_rate:>7.0} txn/s  etcd CPU {:>6.0} us/txn",
        json_cpu.as_secs_f64() * 1e6
    );
    println!(
        "gRPC          {grpc_rate:>7.0} txn/s  etcd CPU {:>6.0} us/txn",
        grpc_cpu.as_secs_f64() * 1e6
    );
    println!(
        "gRPC over JSON: rate x{:.2}, etcd CPU per txn x{:.2}",
        grpc_rate / json_rate,
        grpc_cpu.as_secs_f64() / json_cpu.as_secs_f64()
    );
    let big: Vec<(String, String)> = (0..40).flat_map(|n| port_writes(99, n)).collect();
    let json_big = gateway_txn(&ureq::AgentBuilder::new().build(), &etcd.url, &big);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let grpc_big = rt.block_on(async {
        let mut kv = etcd_client::Client::connect([etcd.url.as_str()], None)
            .await
            .unwrap()
            .kv_client();
        grpc_txn(&mut kv, &big).await
    });
    println!("40 port creates in one transaction (160 puts):");
    println!(
        "JSON gateway: {}",
        json_big.err().unwrap_or_else(|| "applied".into())
    );
    println!(
        "gRPC:         {}",
        grpc_big.err().unwrap_or_else(|| "applied".into())
    );
}
