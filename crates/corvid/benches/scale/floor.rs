//! The store's floor: what the etcd cluster commits of the churn's writes with no
//! controller in front of it. Each cycle is a few ports' three transactions over gRPC,
//! shaped like the controller's (whose create carries a few more compares and puts: the
//! network's and groups' use keys): a create (three "does not exist" compares, four puts
//! of a port-sized value and its address, MAC and device entries), an ACTIVE report (a
//! compare of the port's revision, a put) and a delete (a compare, four deletes). With
//! one port a request, as the controller sent them before `store/etcd.rs` folded queued
//! transactions into one commit; with several, each a nested transaction, as it does now
//! when etcd is busy. `writers` workers send cycles back to back for `secs`; a cycle etcd
//! refuses (a leader change) is not counted.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};

/// A port-sized value (the controller's ports are about a kilobyte of JSON).
fn port_value(id: &str, status: &str) -> String {
    format!(
        r#"{{"id":"{id}","status":"{status}","description":"{}"}}"#,
        "x".repeat(900)
    )
}

/// One cycle of worker `w`, ports `n * per_request` on, `per_request` of them in each
/// request; Err when a transaction was refused.
async fn cycle(
    kv: &mut etcd_client::KvClient,
    w: usize,
    n: u64,
    per_request: u64,
) -> Result<(), String> {
    let ports: Vec<(String, String, [String; 3])> = (n * per_request..(n + 1) * per_request)
        .map(|n| {
            let id = format!("{w:04x}{n:012x}-0000-4000-8000-000000000000");
            let port = format!("/cvt-floor/ports/{id}");
            let others = ["ip", "mac", "device"].map(|k| format!("/cvt-floor/{k}/{w}/{n}"));
            (id, port, others)
        })
        .collect();
    // The ports' own transactions, one request: nested when there are several.
    let run = |txns: Vec<Txn>| {
        let mut kv = kv.clone();
        async move {
            let request = match <[Txn; 1]>::try_from(txns) {
                Ok([one]) => one,
                Err(txns) => {
                    Txn::new().and_then(txns.into_iter().map(TxnOp::txn).collect::<Vec<_>>())
                }
            };
            let answer = kv.txn(request).await.map_err(|e| e.to_string())?;
            let nested = answer.op_responses();
            let held = answer.succeeded()
                && nested.iter().all(|r| match r {
                    TxnOpResponse::Txn(t) => t.succeeded(),
                    _ => true,
                });
            match held {
                true => Ok(answer.header().map_or(0, |h| h.revision())),
                false => Err("a compare failed".to_string()),
            }
        }
    };
    let created = run(ports
        .iter()
        .map(|(id, port, others)| {
            Txn::new()
                .when(
                    others
                        .iter()
                        .map(|k| Compare::create_revision(k.as_str(), CompareOp::Equal, 0))
                        .collect::<Vec<_>>(),
                )
                .and_then(
                    std::iter::once(TxnOp::put(port.as_str(), port_value(id, "DOWN"), None))
                        .chain(
                            others
                                .iter()
                                .map(|k| TxnOp::put(k.as_str(), id.as_str(), None)),
                        )
                        .collect::<Vec<_>>(),
                )
        })
        .collect())
    .await?;
    let active = run(ports
        .iter()
        .map(|(id, port, _)| {
            Txn::new()
                .when([Compare::mod_revision(
                    port.as_str(),
                    CompareOp::Equal,
                    created,
                )])
                .and_then([TxnOp::put(port.as_str(), port_value(id, "ACTIVE"), None)])
        })
        .collect())
    .await?;
    run(ports
        .iter()
        .map(|(_, port, others)| {
            Txn::new()
                .when([Compare::mod_revision(
                    port.as_str(),
                    CompareOp::Equal,
                    active,
                )])
                .and_then(
                    std::iter::once(TxnOp::delete(port.as_str(), None))
                        .chain(others.iter().map(|k| TxnOp::delete(k.as_str(), None)))
                        .collect::<Vec<_>>(),
                )
        })
        .collect())
    .await?;
    Ok(())
}

/// Ports per second that `writers` workers got through on the cluster at `urls` in
/// `secs`, `per_request` ports a request, each worker on its own connection to a member
/// in turn.
pub fn ports(urls: &[String], writers: usize, per_request: u64, secs: f64) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let started = Instant::now();
    let workers: Vec<_> = (0..writers)
        .map(|w| {
            let (stop, done, url) = (stop.clone(), done.clone(), urls[w % urls.len()].clone());
            runtime.spawn(async move {
                let mut kv = etcd_client::Client::connect([url.as_str()], None)
                    .await
                    .expect("etcd over gRPC")
                    .kv_client();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    if cycle(&mut kv, w, n, per_request).await.is_ok() {
                        done.fetch_add(per_request, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    runtime.block_on(async {
        for w in workers {
            w.await.expect("a floor worker");
        }
    });
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}
