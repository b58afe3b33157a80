//! A real kube-apiserver and kube-controller-manager (v1.20, built by
//! scripts/build-kube.sh) on a real etcd, all inside a test namespace, with static token
//! users that RBAC binds like service accounts. The controller manager runs the endpoint
//! controllers only (Endpoints, EndpointSlices and their mirroring): what services serve.
//! No scheduler or kubelet: tests set `spec.nodeName` and play the kubelet (its Ready
//! condition and pod IP).
#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use corvid_net::Netns;
use serde_json::{json, Value};

use super::cluster::ns::Proc;
use super::cluster::{url, Cluster};

/// The cluster administrator (group system:masters).
pub const ADMIN_TOKEN: &str = "cvt-admin-token";
/// The watcher's user: what RBAC bindings to its ServiceAccount match.
pub const WATCHER_TOKEN: &str = "cvt-watcher-token";

/// Where the control plane's binary `name` is, built once and cached outside the
/// checkout (`$KUBE_CACHE`, as the build script takes it).
pub fn binary(name: &str) -> PathBuf {
    std::env::var_os("KUBE_CACHE")
        .map_or_else(|| PathBuf::from("/var/cache/kube-1.20"), PathBuf::from)
        .join(name)
}

/// A running API server, its etcd and the endpoint controllers.
pub struct KubeApi {
    _etcd: Proc,
    apiserver: Proc,
    controller_manager: Option<Proc>,
    dir: tempfile::TempDir,
    netns: PathBuf,
    /// Its URL, reachable from the namespace it runs in and the ones routed to it.
    pub url: String,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl is installed");
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

impl KubeApi {
    /// Starts etcd, the API server and the endpoint controllers in namespace `netns`,
    /// the API server serving on `addr:6443`.
    pub fn start(netns: &Path, addr: &str) -> KubeApi {
        KubeApi::start_with(netns, addr, &[])
    }

    /// As [`KubeApi::start`], with more arguments for the API server.
    pub fn start_with(netns: &Path, addr: &str, extra: &[&str]) -> KubeApi {
        let [bin, kcm] = ["kube-apiserver", "kube-controller-manager"].map(binary);
        for b in [&bin, &kcm] {
            assert!(
                b.exists(),
                "{} is missing: run scripts/build-kube.sh (scripts/test.sh does)",
                b.display()
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("cvt-kube")
            .tempdir()
            .unwrap();
        let d = dir.path();
        // A CA and a server certificate it signs: rustls refuses a CA certificate as a
        // server's own.
        openssl(
            d,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=cvt-kube-ca",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
            ],
        );
        openssl(
            d,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                "/CN=cvt-kube-apiserver",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
            ],
        );
        std::fs::write(
            d.join("server.ext"),
            format!(
                "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n\
                 extendedKeyUsage=serverAuth\n\
                 subjectAltName=IP:{addr},IP:127.0.0.1,IP:10.0.0.1,DNS:kubernetes.default.svc\n"
            ),
        )
        .unwrap();
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                "server.ext",
                "-out",
                "server.crt",
            ],
        );
        openssl(d, &["genrsa", "-out", "sa.key", "2048"]);
        let sa = |name: &str| format!("system:serviceaccount:kube-system:{name}");
        std::fs::write(
            d.join("tokens.csv"),
            format!(
                "{ADMIN_TOKEN},cvt-admin,cvt-admin,\"system:masters\"\n\
                 {WATCHER_TOKEN},{},cvt-watcher,\"system:serviceaccounts,system:serviceaccounts:kube-system\"\n",
                sa("corvid-kube-watch"),
            ),
        )
        .unwrap();
        let ns = Netns::open(netns).unwrap();
        let etcd_url = "http://127.0.0.1:2379";
        let mut etcd = Command::new("etcd");
        etcd.arg("--data-dir")
            .arg(d.join("etcd"))
            .args([
                "--listen-client-urls",
                etcd_url,
                "--advertise-client-urls",
                etcd_url,
            ])
            .args(["--listen-peer-urls", "http://127.0.0.1:2380"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        ns.apply_to(&mut etcd).unwrap();
        let etcd = Proc(
            etcd.spawn()
                .expect("etcd (Debian's etcd-server) is installed"),
        );
        let log = std::fs::File::create(d.join("apiserver.log")).unwrap();
        let mut api = Command::new(&bin);
        api.args([
            &format!("--etcd-servers={etcd_url}"),
            &format!("--bind-address={addr}"),
            &format!("--advertise-address={addr}"),
            "--secure-port=6443",
            "--insecure-port=0",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--authorization-mode=RBAC",
            "--disable-admission-plugins=ServiceAccount",
            // The API server writes the `kubernetes` service's endpoints (its own
            // address), as every real one does: pods reach it through that service.
            "--endpoint-reconciler-type=lease",
            "--enable-priority-and-fairness=false",
            "--profiling=false",
            // As kubeadm and every distribution set it: node agents run privileged.
            "--allow-privileged=true",
            "--service-account-issuer=https://kubernetes.default.svc",
        ])
        .arg(format!(
            "--token-auth-file={}",
            d.join("tokens.csv").display()
        ))
        .arg(format!(
            "--tls-cert-file={}",
            d.join("server.crt").display()
        ))
        .arg(format!(
            "--tls-private-key-file={}",
            d.join("server.key").display()
        ))
        .arg(format!(
            "--service-account-key-file={}",
            d.join("sa.key").display()
        ))
        .arg(format!(
            "--service-account-signing-key-file={}",
            d.join("sa.key").display()
        ))
        .arg(format!("--cert-dir={}", d.join("certs").display()))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log);
        ns.apply_to(&mut api).unwrap();
        let apiserver = Proc(api.spawn().unwrap());
        let mut kube = KubeApi {
            _etcd: etcd,
            apiserver,
            controller_manager: None,
            netns: netns.to_path_buf(),
            url: format!("https://{addr}:6443"),
            dir,
        };
        let ready = kube.kubeconfig(ADMIN_TOKEN);
        let start = std::time::Instant::now();
        // Ready once the bootstrap controller has made the system namespaces and an
        // authorized read succeeds: RBAC, not only the socket.
        while !kube.run(&ready, |c| async move {
            let ns: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(c);
            ns.get("kube-system").await.is_ok() && ns.get("default").await.is_ok()
        }) {
            if start.elapsed() > Duration::from_secs(60) {
                let log = kube.log();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                panic!(
                    "the API server is not ready after 60 s; its log ends:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        // The simulated cluster's nodes, as their kubelets register them: the EndpointSlice
        // controller refuses pods on a node it does not know.
        kube.admin(|c| async move {
            for node in ["h1", "h2"] {
                let n: k8s_openapi::api::core::v1::Node =
                    serde_json::from_value(json!({"metadata": {"name": node}})).unwrap();
                kube::Api::<k8s_openapi::api::core::v1::Node>::all(c.clone())
                    .create(&Default::default(), &n)
                    .await
                    .unwrap();
            }
        });
        let log = std::fs::File::create(kube.dir.path().join("controller-manager.log")).unwrap();
        let mut kcm = Command::new(kcm);
        kcm.arg(format!("--kubeconfig={}", ready.display()))
            .args([
                "--controllers=endpoint,endpointslice,endpointslicemirroring",
                "--leader-elect=false",
                "--use-service-account-credentials=false",
                "--port=0",
                "--secure-port=0",
            ])
            // The API server's feature gates (IPv6DualStack) are the controllers' too.
            .args(extra.iter().filter(|a| a.starts_with("--feature-gates=")))
            .stdout(Stdio::null())
            .stderr(log);
        ns.apply_to(&mut kcm).unwrap();
        kube.controller_manager = Some(Proc(kcm.spawn().unwrap()));
        kube.wait_controller_manager(start);
        kube
    }

    /// Waits until the endpoint controllers act: they start only after their informers
    /// sync, which on a loaded machine took longer than a test's 20-second wait for a
    /// service's members (seen in CI). A probe service's Endpoints object is the sign;
    /// the probe goes before any watcher starts.
    fn wait_controller_manager(&self, start: std::time::Instant) {
        use k8s_openapi::api::core::v1::{Endpoints, Service};
        const PROBE: &str = "cvt-kcm-ready";
        let acted = self.admin(|c| async move {
            let services = kube::Api::<Service>::namespaced(c.clone(), "default");
            let probe = json!({"metadata": {"name": PROBE},
                "spec": {"selector": {"app": PROBE}, "ports": [{"port": 1}]}});
            services
                .create(&Default::default(), &serde_json::from_value(probe).unwrap())
                .await
                .unwrap();
            let endpoints = kube::Api::<Endpoints>::namespaced(c, "default");
            let mut acted = false;
            while !acted && start.elapsed() < Duration::from_secs(120) {
                acted = endpoints.get_opt(PROBE).await.unwrap().is_some();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            services.delete(PROBE, &Default::default()).await.unwrap();
            acted
        });
        if !acted {
            let log = std::fs::read_to_string(self.dir.path().join("controller-manager.log"))
                .unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            panic!(
                "the controller manager made no Endpoints in 120 s; its log ends:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }

    /// The CA certificate the API server's is signed by.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The API server's log, for assertion messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("apiserver.log")).unwrap_or_default()
    }

    /// A kubeconfig for the user with `token`, trusting the server's certificate.
    pub fn kubeconfig(&self, token: &str) -> PathBuf {
        let path = self.dir.path().join(format!("{token}.kubeconfig"));
        let config = serde_json::json!({
            "apiVersion": "v1", "kind": "Config", "current-context": "cvt",
            "clusters": [{"name": "cvt", "cluster": {
                "server": self.url,
                "certificate-authority": self.dir.path().join("ca.crt"),
            }}],
            "users": [{"name": "cvt", "user": {"token": token}}],
            "contexts": [{"name": "cvt", "context": {"cluster": "cvt", "user": "cvt"}}],
        });
        std::fs::write(&path, config.to_string()).unwrap();
        path
    }

    /// Runs `f` with a client of the user in `kubeconfig`, its sockets in the API server's
    /// namespace.
    pub fn run<F, T>(&self, kubeconfig: &Path, f: impl FnOnce(kube::Client) -> F + Send) -> T
    where
        F: Future<Output = T>,
        T: Send,
    {
        let ns = Netns::open(&self.netns).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                ns.run(|| {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    rt.block_on(async {
                        let client = corvid_k8s::connect(Some(kubeconfig)).await.unwrap();
                        f(client).await
                    })
                })
                .unwrap()
            })
            .join()
            .unwrap()
        })
    }

    /// Runs `f` as the administrator.
    pub fn admin<F, T>(&self, f: impl FnOnce(kube::Client) -> F + Send) -> T
    where
        F: Future<Output = T>,
        T: Send,
    {
        self.run(&self.kubeconfig(ADMIN_TOKEN), f)
    }

    /// Applies every object of a multi-document YAML manifest, as the administrator.
    pub fn apply_manifest(&self, path: &Path) {
        let text = std::fs::read_to_string(path).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
        self.admin(|c| async move {
            for doc in docs.into_iter().filter(|d| d.is_object()) {
                let obj: kube::core::DynamicObject = serde_json::from_value(doc.clone()).unwrap();
                let types = obj.types.clone().expect("apiVersion and kind");
                let (group, version) = match types.api_version.split_once('/') {
                    Some((g, v)) => (g.to_string(), v.to_string()),
                    None => (String::new(), types.api_version.clone()),
                };
                let plural = format!("{}s", types.kind.to_ascii_lowercase());
                let ar = kube::core::ApiResource {
                    group,
                    version,
                    api_version: types.api_version.clone(),
                    kind: types.kind.clone(),
                    plural,
                };
                let api: kube::Api<kube::core::DynamicObject> = match &obj.metadata.namespace {
                    Some(ns) => kube::Api::namespaced_with(c.clone(), ns, &ar),
                    None => kube::Api::all_with(c.clone(), &ar),
                };
                api.create(&Default::default(), &obj)
                    .await
                    .unwrap_or_else(|e| {
                        panic!("applying {} {:?}: {e}", types.kind, obj.metadata.name)
                    });
            }
        })
    }
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        if let Some(kcm) = &mut self.controller_manager {
            kcm.kill9();
        }
        self.apiserver.kill9();
    }
}

/// `corvid kube-watch` in the lan namespace, as the watcher's RBAC-bound user.
pub fn start_watcher(cluster: &Cluster, kube: &KubeApi, extra: &[&str]) -> Proc {
    start_watcher_of(
        Path::new(env!("CARGO_BIN_EXE_corvid")),
        cluster,
        kube,
        extra,
    )
}

/// As [`start_watcher`], with the `corvid` binary at `corvid` (another build's).
pub fn start_watcher_of(corvid: &Path, cluster: &Cluster, kube: &KubeApi, extra: &[&str]) -> Proc {
    let child = cluster
        .lan
        .command(corvid)
        .arg("kube-watch")
        .arg("--kubeconfig")
        .arg(kube.kubeconfig(WATCHER_TOKEN))
        .args(["--controller", &url()])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    Proc(child)
}

/// `corvid kube-watch` as its Deployment runs it, in namespace `ns` (a node's, for its
/// host network): no kubeconfig, the API server at `KUBERNETES_SERVICE_HOST:PORT` (`api`),
/// and the service account's token, CA and namespace at the fixed path kube reads them
/// from, in a mount namespace of its own (a tmpfs over /run: the machine's is not
/// touched). Keep the returned directory while it runs.
pub fn start_in_cluster_watcher(
    ns: &super::cluster::ns::Ns,
    kube: &KubeApi,
    api: (&str, u16),
    extra: &[&str],
) -> (Proc, tempfile::TempDir) {
    let sa = tempfile::Builder::new().prefix("cvt-sa").tempdir().unwrap();
    std::fs::write(sa.path().join("token"), WATCHER_TOKEN).unwrap();
    std::fs::copy(kube.ca(), sa.path().join("ca.crt")).unwrap();
    std::fs::write(sa.path().join("namespace"), "kube-system").unwrap();
    let script = "mount -t tmpfs cvt-run /run \
        && mkdir -p /run/secrets/kubernetes.io/serviceaccount \
        && cp \"$CVT_SA\"/* /run/secrets/kubernetes.io/serviceaccount/ \
        && exec \"$@\"";
    let child = ns
        .command("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .arg(env!("CARGO_BIN_EXE_corvid"))
        .args(["kube-watch", "--controller", &url()])
        .args(extra)
        .env("CVT_SA", sa.path())
        .env("KUBERNETES_SERVICE_HOST", api.0)
        .env("KUBERNETES_SERVICE_PORT", api.1.to_string())
        // No kubeconfig anywhere kube looks first.
        .env_remove("KUBECONFIG")
        .env("HOME", sa.path())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    (Proc(child), sa)
}

/// The `corvid-k8s` plugin's configuration for node `host`: the controller only, as
/// the plugin needs no API server.
pub fn plugin_conf(host: usize, timeout: u64) -> Value {
    json!({
        "cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "corvid-k8s",
        "controller": url(), "hostId": format!("h{}", host + 1), "timeout": timeout,
    })
}
