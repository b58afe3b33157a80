//! Test support: Debian's docker-registry on a loopback port, storage in a temporary
//! directory, stopped on drop; images pushed with oci-client.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::manifest::OciImageManifest;
use oci_client::secrets::RegistryAuth;

/// A running registry.
pub struct Registry {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    _dir: tempfile::TempDir,
}

impl Registry {
    pub fn start() -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker-registry (Debian's docker-registry package)");
        let start = Instant::now();
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the registry did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Registry {
            child,
            addr,
            _dir: dir,
        }
    }

    /// Pushes `layers` and `config` as `repository:tag` under a manifest of `media_type`.
    pub fn push(
        &self,
        repository: &str,
        tag: &str,
        layers: &[ImageLayer],
        config: Config,
        media_type: &str,
    ) {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut manifest = OciImageManifest::build(layers, &config, None);
        manifest.media_type = Some(media_type.to_string());
        let client = oci_client::Client::new(ClientConfig {
            protocol: ClientProtocol::Http,
            ..Default::default()
        });
        let reference: oci_client::Reference =
            format!("{}/{repository}:{tag}", self.addr).parse().unwrap();
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(client.push(
                &reference,
                layers,
                config,
                &RegistryAuth::Anonymous,
                Some(manifest),
            ))
            .unwrap();
    }

    /// Pushes the first image of the OCI image layout in `dir` as `repository:tag`.
    pub fn push_layout(&self, repository: &str, tag: &str, dir: &Path) {
        let json = |p: &Path| -> serde_json::Value {
            serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
        };
        let blob = |digest: &str| {
            std::fs::read(
                dir.join("blobs/sha256")
                    .join(digest.trim_start_matches("sha256:")),
            )
            .unwrap()
        };
        let index = json(&dir.join("index.json"));
        let manifest: serde_json::Value =
            serde_json::from_slice(&blob(index["manifests"][0]["digest"].as_str().unwrap()))
                .unwrap();
        let layers: Vec<ImageLayer> = manifest["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                ImageLayer::new(
                    blob(l["digest"].as_str().unwrap()),
                    l["mediaType"].as_str().unwrap().into(),
                    None,
                )
            })
            .collect();
        let config = Config::new(
            blob(manifest["config"]["digest"].as_str().unwrap()),
            manifest["config"]["mediaType"].as_str().unwrap().into(),
            None,
        );
        self.push(
            repository,
            tag,
            &layers,
            config,
            manifest["mediaType"].as_str().unwrap(),
        );
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
