//! A controller restarted under running agents, and before an agent starts, killed with
//! SIGKILL and stopped cleanly, with and without load balancers: every agent follows the
//! restarted controller's watch feed without spinning (its request rate stays bounded,
//! counted in the controller's metrics), a DEL after the restart removes the devices,
//! and a new attach works. And an agent facing a feed that refuses the revision its lists
//! were read at (a controller bug) backs off and says it is not ready, at its readiness
//! endpoint and at kube-proxy's health port. And a host that goes silent without closing
//! has its watch stream dropped within `--client-timeout`, then follows again once back.
//! Runs as root, in `cvt*` namespaces only.

#[path = "support/cluster.rs"]
mod cluster;

#[path = "support/up.rs"]
mod stack;

use std::process::Stdio;
use std::time::Duration;

use cluster::ns::{self, testing_script, wait_until, Proc};
use cluster::plugins;
use cluster::{cni_result, result_ip, Cluster};
use serde_json::json;

/// GET `url` from the calling thread's namespace: status and body.
fn get(url: &str) -> Option<(u16, String)> {
    match ureq::get(url).timeout(Duration::from_secs(5)).call() {
        Ok(r) => Some((r.status(), r.into_string().ok()?)),
        Err(ureq::Error::Status(code, r)) => Some((code, r.into_string().ok()?)),
        Err(_) => None,
    }
}

/// The sum of every series of metric `name` whose labels include `label`.
fn sample(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            (n == name && rest.contains(label))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// Requests the controller answered so far (all routes, methods and codes).
fn controller_requests(cluster: &Cluster) -> f64 {
    let url = format!("{}/metrics", cluster::url());
    let (_, text) = cluster.lan.open().run(|| get(&url)).unwrap().unwrap();
    sample(&text, "corvid_controller_requests_total", "")
}

/// The agent of host `i`'s `/readyz`, served on 127.0.0.1:9697 in its namespace.
fn agent_ready(cluster: &Cluster, i: usize) -> Option<(u16, String)> {
    cluster.hosts[i]
        .open()
        .run(|| get("http://127.0.0.1:9697/readyz"))
        .unwrap()
}

/// What the agent in `host` answers at kube-proxy's health port: status and JSON body.
fn kube_proxy_health(host: &ns::Ns) -> (u16, serde_json::Value) {
    let (status, body) = host
        .open()
        .run(|| get("http://127.0.0.1:10256/healthz"))
        .unwrap()
        .expect("an answer at 10256");
    (status, serde_json::from_str(&body).unwrap())
}

/// Stops the controller: SIGKILL, or SIGTERM and a wait for it to exit.
fn stop_controller(cluster: &mut Cluster, kill: bool) {
    let mut p = cluster.controller.take().unwrap();
    if kill {
        p.kill9();
    } else {
        stack::stop(&mut p, libc::SIGTERM, Duration::from_secs(10));
    }
}

/// Requests the controller answers in three seconds of quiet: agents long-poll the
/// watch (20 s a request), so a handful; an agent in a relist loop makes thousands.
fn quiet_rate(cluster: &Cluster) -> f64 {
    let before = controller_requests(cluster);
    std::thread::sleep(Duration::from_secs(3));
    // The scrape itself is one request.
    controller_requests(cluster) - before - 1.0
}

#[test]
fn agents_follow_a_restarted_controller_without_spinning() {
    let mut cluster = Cluster::new("rs");
    for i in 0..2 {
        cluster.agents[i].take();
        cluster.start_agent_with(i, &["--metrics-listen", "127.0.0.1:9697"]);
    }
    let (_, subnet) = cluster.network("blue", "10.61.0.0/24", false);
    let keep = cluster.pod("keep");
    let keep_ip = result_ip(&cni_result(&cluster.add(1, "blue", &keep)));

    for (round, kill) in [(0, true), (1, false), (2, true), (3, false)] {
        if round == 2 {
            // The same again with load balancers, whose lists once carried no revision.
            let lb = cluster.api(|c| {
                let (status, v, _) = c
                    .request(
                        "POST",
                        "/v2/lbaas/loadbalancers",
                        Some(&json!({"loadbalancer": {"vip_subnet_id": subnet.id, "name": "lb"}})),
                    )
                    .unwrap();
                assert_eq!(status, 201, "{v}");
                v
            });
            let listener = json!({"listener": {"loadbalancer_id": lb["loadbalancer"]["id"],
                "protocol": "TCP", "protocol_port": 80}});
            cluster.api(|c| {
                let (status, v, _) = c
                    .request("POST", "/v2/lbaas/listeners", Some(&listener))
                    .unwrap();
                assert_eq!(status, 201, "{v}");
            });
        }
        let pod = cluster.pod(&format!("p{round}"));
        let ip = result_ip(&cni_result(&cluster.add(0, "blue", &pod)));
        let veths_before = cluster.hosts[0].links("cvp");
        assert_eq!(veths_before.len(), 1, "{veths_before:?}");

        stop_controller(&mut cluster, kill);
        cluster.start_controller();
        for i in 0..2 {
            wait_until(
                "the agent to follow the restarted controller",
                Duration::from_secs(30),
                || agent_ready(&cluster, i).is_some_and(|(s, _)| s == 200),
            );
        }
        let rate = quiet_rate(&cluster);
        assert!(
            rate < 30.0,
            "round {round}: {rate} requests in 3 s of quiet"
        );

        // A DEL after the restart takes the devices with it; what stays keeps working.
        assert!(
            pod.ping(&keep_ip),
            "round {round}: {ip} to {keep_ip}\n{}",
            cluster.overlay_state()
        );
        let out = cluster.del(0, "blue", &pod);
        assert!(out.status.success(), "DEL: {out:?}");
        wait_until(
            "the agent to unplug the pod",
            Duration::from_secs(10),
            || cluster.hosts[0].links("cvp").is_empty() && cluster.hosts[0].links("cvb").is_empty(),
        );
        assert!(pod.links("eth0").is_empty());
    }

    // A controller restarted while an agent is down: the agent that starts afterwards
    // loads, plugs and follows.
    cluster.agents[0].take();
    stop_controller(&mut cluster, true);
    cluster.start_controller();
    cluster.start_agent_with(
        0,
        &[
            "--metrics-listen",
            "127.0.0.1:9697",
            "--kube-proxy-listen",
            "127.0.0.1",
        ],
    );
    wait_until(
        "the late agent to follow the feed",
        Duration::from_secs(20),
        || agent_ready(&cluster, 0).is_some_and(|(s, _)| s == 200),
    );
    std::thread::sleep(Duration::from_secs(2));
    let (status, why) = agent_ready(&cluster, 0).unwrap();
    assert_eq!(status, 200, "{why}");
    // Healthy at kube-proxy's health port too, updated since it started.
    let (status, health) = kube_proxy_health(&cluster.hosts[0]);
    assert_eq!(status, 200, "{health}");
    let updated = humantime::parse_rfc3339(health["lastUpdated"].as_str().unwrap()).unwrap();
    let age = std::time::SystemTime::now()
        .duration_since(updated)
        .unwrap_or_default();
    assert!(age < Duration::from_secs(30), "{health}");
    let late = cluster.pod("late");
    let late_ip = result_ip(&cni_result(&cluster.add(0, "blue", &late)));
    assert!(late.ping(&keep_ip), "{}", cluster.overlay_state());
    assert!(keep.ping(&late_ip), "{}", cluster.overlay_state());
    let rate = quiet_rate(&cluster);
    assert!(rate < 30.0, "{rate} requests in 3 s of quiet");
}

#[test]
fn an_agent_whose_feed_refuses_its_lists_backs_off_and_is_not_ready() {
    let tag = format!("cvt{}fs", std::process::id());
    let host = cluster::ns::Ns::new(&tag, "host");
    host.ip("link set lo up");
    // A controller with the bug: lists at revision 5, a watch feed that starts later.
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut fake = host.command("python3");
    fake.arg(testing_script("feed_gone.py"))
        .arg(log.path())
        .stdout(Stdio::piped());
    let mut fake = Proc(fake.spawn().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(fake.0.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "ready");
    let _agent = Proc(
        host.command(env!("CARGO_BIN_EXE_corvid"))
            .args([
                "agent",
                "--host-id",
                "h1",
                "--controller",
                "http://127.0.0.1:9696",
            ])
            .args([
                "--underlay-ip",
                "127.0.0.1",
                "--metrics-listen",
                "127.0.0.1:9697",
                "--kube-proxy-listen",
                "127.0.0.1",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let ready = || {
        host.open()
            .run(|| get("http://127.0.0.1:9697/readyz"))
            .unwrap()
    };
    wait_until(
        "the agent to report the stall",
        Duration::from_secs(20),
        || ready().is_some_and(|(s, body)| s == 503 && body.contains("watch feed")),
    );
    // What a cloud load balancer's health check sees at kube-proxy's port: not healthy,
    // in kube-proxy's shape; and the proxy mode.
    let (status, health) = kube_proxy_health(&host);
    assert_eq!(status, 503, "{health}");
    assert!(health["lastUpdated"].is_string(), "{health}");
    let mode = host.open().run(|| get("http://127.0.0.1:10249/proxyMode"));
    assert_eq!(mode.unwrap(), Some((200, "corvid".to_string())));
    let requests = || std::fs::read_to_string(log.path()).unwrap().lines().count();
    let before = requests();
    std::thread::sleep(Duration::from_secs(4));
    let made = requests() - before;
    // Backing off, an agent lists (ten requests) a few times in 4 s; spinning, thousands.
    assert!(made < 60, "{made} requests in 4 s");
    let metrics = host
        .open()
        .run(|| get("http://127.0.0.1:9697/metrics"))
        .unwrap()
        .unwrap()
        .1;
    assert!(
        sample(&metrics, "corvid_agent_errors_total", "kind=\"feed_start\"") >= 1.0,
        "{metrics}"
    );
}

/// Watch requests the controller holds open, one stream per agent.
fn controller_watchers(cluster: &Cluster) -> f64 {
    let url = format!("{}/metrics", cluster::url());
    let (_, text) = cluster.lan.open().run(|| get(&url)).unwrap().unwrap();
    sample(&text, "corvid_controller_watch_subscribers", "")
}

#[test]
fn a_host_gone_silent_has_its_watch_stream_dropped() {
    let mut cluster = Cluster::new("gs");
    cluster.controller.take();
    cluster.start_controller_with(&["--client-timeout", "4"]);
    wait_until("both agents' streams", Duration::from_secs(30), || {
        controller_watchers(&cluster) == 2.0
    });
    // Host 2 vanishes without closing anything: its underlay port goes down, so the
    // controller's packets to it are dropped unanswered, as when a host loses power.
    cluster.lan.ip("link set cvtu1 down");
    // The next quiet page (the agent waits 20 s a page) meets the dead peer at the
    // latest; the kernel alone would retransmit it for about 15 minutes.
    wait_until(
        "the silent host's stream to be dropped",
        Duration::from_secs(40),
        || controller_watchers(&cluster) == 1.0,
    );
    // Host 1's stream, quiet as long, is live and kept.
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(controller_watchers(&cluster), 1.0);
    cluster.lan.ip("link set cvtu1 up");
    wait_until(
        "host 2's agent to follow the feed again",
        Duration::from_secs(60),
        || controller_watchers(&cluster) == 2.0,
    );
    // And it applies changes: a port bound to it goes ACTIVE through its agent.
    cluster.network("green", "10.62.0.0/24", false);
    let pod = cluster.pod("back");
    cni_result(&cluster.add(1, "green", &pod));
}
