//! A simulated cluster for tests and benchmarks: a "lan" namespace with the underlay bridge
//! and the controller, two host namespaces each running an agent, the plugins installed in
//! a temporary CNI bin directory.
#![allow(dead_code)]

#[path = "ns.rs"]
pub mod ns;

#[path = "docker.rs"]
pub mod docker;

#[path = "plugins.rs"]
pub mod plugins;

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use corvid_api::{Client, Network, Port, Subnet};
use ns::{spawn_with_input, wait_until, Ns, Proc};
use serde_json::{json, Value};

const CONTROLLER_PORT: u16 = 9696;

/// The simulated cluster: lan (underlay + controller), two hosts with agents.
/// One direct plugin run.
pub struct PluginCall<'a> {
    /// Index of the host namespace it runs in.
    pub host: usize,
    /// The installed plugin's name.
    pub plugin: &'a str,
    /// CNI_COMMAND.
    pub command: &'a str,
    /// CNI_CONTAINERID.
    pub container: &'a str,
    /// CNI_IFNAME.
    pub ifname: &'a str,
}

pub struct Cluster {
    pub tag: String,
    pub lan: Ns,
    pub hosts: Vec<Ns>,
    pub controller: Option<Proc>,
    pub agents: Vec<Option<Proc>>,
    pub store: String,
    pub _state: tempfile::TempDir,
    pub bin: tempfile::TempDir,
    pub conf: tempfile::TempDir,
    pub cache: tempfile::TempDir,
}

pub fn underlay_ip(host: usize) -> String {
    format!("10.99.0.{}", host + 1)
}

/// Host `host`'s IPv6 underlay address, beside its IPv4 one.
pub fn underlay_ip6(host: usize) -> String {
    format!("fd99::{}", host + 1)
}

pub fn url() -> String {
    format!("http://10.99.0.254:{CONTROLLER_PORT}")
}

/// The JSON result of a successful CNI ADD.
pub fn cni_result(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "ADD failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON result")
}

/// Every address of a CNI result, in its order, without their prefix lengths.
pub fn result_ips(result: &Value) -> Vec<String> {
    result["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|ip| {
            let a = ip["address"].as_str().unwrap();
            a.split('/').next().unwrap().to_string()
        })
        .collect()
}

/// The first address of a CNI result, without its prefix length.
pub fn result_ip(result: &Value) -> String {
    result["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string()
}

impl Cluster {
    pub fn new(name: &str) -> Cluster {
        assert!(unsafe { libc::geteuid() } == 0, "run as root");
        let tag = format!("cvt{}{name}", std::process::id());
        let lan = Ns::new(&tag, "lan");
        lan.ip("link add cvtul type bridge");
        lan.ip("addr add 10.99.0.254/24 dev cvtul");
        lan.ip("addr add fd99::fe/64 dev cvtul nodad");
        lan.ip("link set cvtul up");
        lan.ip("link set lo up");
        let mut hosts = Vec::new();
        for i in 0..2 {
            let h = Ns::new(&tag, &format!("h{}", i + 1));
            lan.ip(&format!(
                "link add cvtu{i} type veth peer name eth0 netns {}",
                h.name()
            ));
            lan.ip(&format!("link set cvtu{i} master cvtul up"));
            h.ip(&format!("addr add {}/24 dev eth0", underlay_ip(i)));
            h.ip(&format!("addr add {}/64 dev eth0 nodad", underlay_ip6(i)));
            h.ip("link set eth0 up");
            h.ip("link set lo up");
            hosts.push(h);
        }
        let state = tempfile::Builder::new()
            .prefix("cvt-state")
            .tempdir()
            .unwrap();
        let store = format!("redb:{}", state.path().join("state.redb").display());
        let bin = tempfile::Builder::new()
            .prefix("cvt-bin")
            .tempdir()
            .unwrap();
        let plugins = plugins::binary();
        let out = Command::new(env!("CARGO_BIN_EXE_corvid"))
            .args(["cni", "install", "--dir"])
            .arg(bin.path())
            .args(["--from"])
            .arg(&plugins)
            .output()
            .unwrap();
        assert!(out.status.success(), "install: {out:?}");
        let mut c = Cluster {
            tag,
            lan,
            hosts,
            controller: None,
            agents: vec![None, None],
            store,
            _state: state,
            bin,
            conf: tempfile::Builder::new()
                .prefix("cvt-conf")
                .tempdir()
                .unwrap(),
            cache: tempfile::Builder::new()
                .prefix("cvt-cache")
                .tempdir()
                .unwrap(),
        };
        c.start_controller();
        c.start_agent(0);
        c.start_agent(1);
        c
    }

    pub fn start_controller(&mut self) {
        self.start_controller_with(&[]);
    }

    /// Starts the controller with extra arguments (e.g. `--client-timeout 4`).
    pub fn start_controller_with(&mut self, extra: &[&str]) {
        let child = self
            .lan
            .command(env!("CARGO_BIN_EXE_corvid"))
            .args(["controller", "--listen"])
            .arg(format!("10.99.0.254:{CONTROLLER_PORT}"))
            .args(["--store", &self.store])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.controller = Some(Proc(child));
        wait_until("the controller", Duration::from_secs(20), || {
            self.api(|c| c.request("GET", "/", None)).is_ok()
        });
    }

    pub fn start_agent(&mut self, i: usize) {
        self.start_agent_with(i, &[]);
    }

    /// Restarts both hosts' agents filtering by security groups, h2's serving its metrics
    /// at `metrics` when given.
    pub fn filtering_agents(&mut self, metrics: Option<&str>) {
        for i in 0..2 {
            self.agents[i].take();
            let mut args = vec!["--security-groups"];
            if let (1, Some(m)) = (i, metrics) {
                args.extend(["--metrics-listen", m]);
            }
            self.start_agent_with(i, &args);
        }
    }

    /// Starts host `i`'s agent with extra arguments (e.g. `--resync 1`); its underlay
    /// address is the IPv4 one unless they name another.
    pub fn start_agent_with(&mut self, i: usize, extra: &[&str]) {
        let underlay = underlay_ip(i);
        let default_underlay = ["--underlay-ip", underlay.as_str()];
        let underlay_args: &[&str] = if extra.contains(&"--underlay-ip") {
            &[]
        } else {
            &default_underlay
        };
        let child = self.hosts[i]
            .command(env!("CARGO_BIN_EXE_corvid"))
            .args(["agent", "--host-id", &format!("h{}", i + 1)])
            .args(["--controller", &url()])
            .args(underlay_args)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        self.agents[i] = Some(Proc(child));
    }

    /// Every host's links, addresses, FDB and neighbours, for a failed assertion.
    pub fn overlay_state(&self) -> String {
        self.hosts.iter().map(Ns::overlay_state).collect()
    }

    /// Runs `f` with a client whose sockets live in the lan namespace.
    pub fn api<T>(&self, f: impl FnOnce(&Client) -> T) -> T {
        let client = Client::new(&url());
        self.lan.open().run(|| f(&client)).unwrap()
    }

    /// The public network floating IPs come from: the lan's 10.99.0.100 to `.last`.
    pub fn public_network(&self, last: u8) -> Network {
        self.api(|c| {
            let n: Network = c
                .create(json!({"name": "public", "router:external": true}))
                .unwrap();
            let _: Subnet = c
                .create(json!({"network_id": n.id, "cidr": "10.99.0.0/24", "ip_version": 4,
                    "gateway_ip": null,
                    "allocation_pools": [{"start": "10.99.0.100", "end": format!("10.99.0.{last}")}]}))
                .unwrap();
            n
        })
    }

    /// A network with one /24 subnet, and its CNI configuration list in the conf dir.
    pub fn network(&self, name: &str, cidr: &str, masquerade: bool) -> (Network, Subnet) {
        let (net, subnet) = self.api(|c| {
            let net: Network = c
                .create(json!({"name": name, "corvid:masquerade": masquerade}))
                .unwrap();
            let subnet: Subnet = c
                .create(json!({"network_id": net.id, "cidr": cidr, "ip_version": 4}))
                .unwrap();
            (net, subnet)
        });
        self.conflist(name, &subnet.id);
        (net, subnet)
    }

    /// A CNI configuration list `<name>-h<N>` per host for the `corvid` plugin on `subnet`.
    pub fn conflist(&self, name: &str, subnet: &str) {
        for (i, _) in self.hosts.iter().enumerate() {
            let conf = json!({
                "cniVersion": "1.1.0",
                "name": format!("{name}-h{}", i + 1),
                "plugins": [{
                    "type": "corvid",
                    "mpurl": url(),
                    "project": "corvid",
                    "subnet": subnet,
                    "hostId": format!("h{}", i + 1),
                    "timeout": 20
                }]
            });
            std::fs::write(
                self.conf.path().join(format!("{name}-h{}.conflist", i + 1)),
                conf.to_string(),
            )
            .unwrap();
        }
    }

    pub fn cni(&self, host: usize, args: &[&str]) -> Command {
        let mut cmd = self.hosts[host].command(env!("CARGO_BIN_EXE_corvid"));
        cmd.arg("cni")
            .arg("--json")
            .arg("--conf-dir")
            .arg(self.conf.path())
            .arg("--cni-path")
            .arg(self.bin.path())
            .arg("--cache-dir")
            .arg(self.cache.path())
            .args(args);
        cmd
    }

    /// `corvid cni <verb>` of pod `pod` (a namespace) on host `host` to network `net`.
    pub fn attach(&self, verb: &str, host: usize, net: &str, pod: &Ns) -> Command {
        let network = format!("{net}-h{}", host + 1);
        self.cni(host, &[verb, &network, &pod.path.display().to_string()])
    }

    pub fn add(&self, host: usize, net: &str, pod: &Ns) -> Output {
        self.attach("add", host, net, pod).output().unwrap()
    }

    pub fn del(&self, host: usize, net: &str, pod: &Ns) -> Output {
        self.attach("del", host, net, pod).output().unwrap()
    }

    /// The `corvid` plugin run directly, as a runtime would, with `conf` on stdin.
    pub fn plugin(
        &self,
        host: usize,
        command: &str,
        container: &str,
        pod: &Ns,
        conf: &Value,
    ) -> Child {
        self.run_plugin(
            &PluginCall {
                host,
                plugin: "corvid",
                command,
                container,
                ifname: "eth0",
            },
            pod,
            conf,
        )
    }

    /// Any installed plugin run directly, with `conf` on stdin.
    pub fn run_plugin(&self, c: &PluginCall, pod: &Ns, conf: &Value) -> Child {
        let mut cmd = self.hosts[c.host].command(self.bin.path().join(c.plugin));
        cmd.env("CNI_COMMAND", c.command)
            .env("CNI_CONTAINERID", c.container)
            .env("CNI_NETNS", &pod.path)
            .env("CNI_IFNAME", c.ifname)
            .env("CNI_PATH", self.bin.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        spawn_with_input(&mut cmd, &conf.to_string())
    }

    pub fn pod(&self, name: &str) -> Ns {
        let p = Ns::new(&self.tag, name);
        p.ip("link set lo up");
        p
    }

    pub fn ports(&self) -> Vec<Port> {
        self.api(|c| c.list::<Port>(&[])).unwrap().0
    }

    /// `method path` with `body` through the API, asserted to succeed: the answer.
    pub fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let (status, v, _) = self.api(|c| c.request(method, path, Some(&body))).unwrap();
        assert!(
            (200..300).contains(&status),
            "{method} {path}: {status} {v}"
        );
        v
    }

    /// A new security group named `name` (with Neutron's egress rules).
    pub fn security_group(&self, name: &str) -> corvid_api::SecurityGroup {
        let v = self.call(
            "POST",
            "/v2.0/security-groups",
            json!({"security_group": {"name": name}}),
        );
        serde_json::from_value(v["security_group"].clone()).unwrap()
    }

    /// A port on `subnet` made through the API for host `host` and plugged into `pod`
    /// (as `eth0`) by that host's agent, with `extra` attributes (addresses, groups,
    /// port security): the port once it is ACTIVE.
    pub fn api_port(&self, host: usize, subnet: &Subnet, pod: &Ns, extra: Value) -> Port {
        let mut body = json!({"network_id": subnet.network_id,
            "binding:host_id": format!("h{}", host + 1),
            "veth_name": "eth0", "network_ns": pod.path.display().to_string()});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let port: Port = self.api(|c| c.create(body)).unwrap();
        wait_until("the port to be plugged", Duration::from_secs(10), || {
            self.api(|c| c.get::<Port>(&port.id)).unwrap().status == corvid_api::Status::Active
        });
        self.api(|c| c.get::<Port>(&port.id)).unwrap()
    }
}

/// Seconds since the epoch, as a prober prints them.
pub fn epoch() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// A prober in `pod` sending a UDP datagram to `to`:5353 every millisecond; it prints
/// the wall-clock time of the first answer.
pub fn prober(pod: &Ns, to: &str) -> (Proc, std::io::BufReader<std::process::ChildStdout>) {
    let script = format!(
        "import socket, time\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         s.settimeout(0.001)\n\
         print('ready', flush=True)\n\
         while True:\n\
         \x20   s.sendto(b'x', ('{to}', 5353))\n\
         \x20   try:\n\
         \x20       s.recv(100)\n\
         \x20       print(repr(time.time()), flush=True)\n\
         \x20       break\n\
         \x20   except OSError:\n\
         \x20       time.sleep(0.001)\n"
    );
    pod.python_ready(&script)
}

/// The reconcile time so far of the agent on `host` serving metrics at `metrics`:
/// (seconds, passes) of change passes.
pub fn agent_work(metrics: &str, host: &Ns) -> (f64, f64) {
    let text = host
        .open()
        .run(|| {
            ureq::get(&format!("http://{metrics}/metrics"))
                .call()
                .unwrap()
                .into_string()
                .unwrap()
        })
        .unwrap();
    let sample = |name: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(name) && l.contains("kind=\"changes\""))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    };
    (
        sample("corvid_agent_reconcile_duration_seconds_sum"),
        sample("corvid_agent_reconcile_duration_seconds_count"),
    )
}
