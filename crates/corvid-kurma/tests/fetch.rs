//! Fetching plugin images as the runtime does, against real servers on loopback: files in
//! each compression, a plain HTTP server, appc discovery, detached signatures made by
//! gpg, and Debian's docker-registry with OCI and Docker v2 images (whiteouts included).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use corvid_kurma::config::FetchSettings;
use corvid_kurma::runtime::fetch::Fetcher;
use corvid_kurma::runtime::store::Store;

#[path = "../../corvid/tests/support/registry.rs"]
mod registry;
use registry::Registry;

/// A tar of `entries` (path, contents; a path ending in `/` is a directory).
fn tar(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut t = tar::Builder::new(Vec::new());
    for (path, body) in entries {
        let mut h = tar::Header::new_gnu();
        if path.ends_with('/') {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
            h.set_size(0);
            t.append_data(&mut h, path, std::io::empty()).unwrap();
        } else {
            h.set_mode(0o755);
            h.set_size(body.len() as u64);
            t.append_data(&mut h, path, *body).unwrap();
        }
    }
    t.into_inner().unwrap()
}

/// A plain ACI named `name` holding `/bin/hello`.
fn aci(name: &str) -> Vec<u8> {
    let manifest = serde_json::json!({"acKind": "ImageManifest", "acVersion": "0.8.11",
        "name": name, "app": {"exec": ["/bin/hello"]}})
    .to_string();
    tar(&[
        ("manifest", manifest.as_bytes()),
        ("rootfs/", b""),
        ("rootfs/bin/", b""),
        ("rootfs/bin/hello", b"#!/bin/sh\necho hello\n"),
    ])
}

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

fn fetch(
    store: &Store,
    settings: &FetchSettings,
    aci: &str,
) -> Result<corvid_kurma::aci::Aci, String> {
    Fetcher { store, settings }
        .fetch(aci)
        .map_err(|e| e.to_string())
}

/// Entries of the store other than finished images: what a failed fetch would leave.
fn leftovers(store: &Store) -> Vec<String> {
    std::fs::read_dir(&store.dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with("sha"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn files_in_every_compression_give_one_image_id() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path().join("store"));
    let plain = aci("example.com/hello");
    let mut bz = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::fast());
    bz.write_all(&plain).unwrap();
    let mut xz = liblzma::write::XzEncoder::new(Vec::new(), 1);
    xz.write_all(&plain).unwrap();
    let mut ids = Vec::new();
    for (ext, bytes) in [
        ("tar", plain.clone()),
        ("gz", gzip(&plain)),
        ("bz2", bz.finish().unwrap()),
        ("xz", xz.finish().unwrap()),
    ] {
        let path = dir.path().join(format!("hello.{ext}.aci"));
        std::fs::write(&path, bytes).unwrap();
        let image = fetch(
            &store,
            &FetchSettings::default(),
            &format!("file://{}", path.display()),
        )
        .unwrap();
        assert!(image.rootfs.join("bin/hello").is_file());
        assert_eq!(image.exec, ["/bin/hello"]);
        ids.push(image.id);
    }
    assert!(
        ids.iter()
            .all(|id| id == &ids[0] && id.starts_with("sha512-")),
        "{ids:?}"
    );
    let missing = fetch(
        &store,
        &FetchSettings::default(),
        "file:///nonexistent/x.aci",
    )
    .unwrap_err();
    assert!(missing.contains("/nonexistent/x.aci"), "{missing}");
    assert!(leftovers(&store).is_empty());
}

/// A loopback HTTP server answering GETs from a path table (query strings ignored), and
/// logging what it was asked.
struct Server {
    addr: String,
    pages: Arc<Mutex<HashMap<String, Vec<u8>>>>,
}

impl Server {
    fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let pages: Arc<Mutex<HashMap<String, Vec<u8>>>> = Arc::default();
        let table = pages.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                let _ = reader.read_line(&mut line);
                let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
                let path = path.split('?').next().unwrap().to_string();
                loop {
                    let mut header = String::new();
                    if reader.read_line(&mut header).unwrap_or(0) <= 2 {
                        break;
                    }
                }
                let mut stream = stream;
                let page = table.lock().unwrap().get(&path).cloned();
                let (status, body) = match page {
                    Some(b) => ("200 OK", b),
                    None => ("404 Not Found", b"not here".to_vec()),
                };
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(&body);
            }
        });
        Server { addr, pages }
    }

    fn put(&self, path: &str, body: Vec<u8>) {
        self.pages.lock().unwrap().insert(path.to_string(), body);
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

#[test]
fn http_and_discovery_fetch_only_what_answers_200() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path().join("store"));
    let server = Server::start();
    server.put("/images/hello.aci", gzip(&aci("example.com/net/hello")));
    let ok = fetch(
        &store,
        &FetchSettings::default(),
        &server.url("/images/hello.aci"),
    )
    .unwrap();
    assert_eq!(ok.name, "example.com/net/hello");
    let err = fetch(
        &store,
        &FetchSettings::default(),
        &server.url("/images/nope.aci"),
    )
    .unwrap_err();
    assert!(err.contains("404"), "{err}");
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let err = fetch(
        &store,
        &FetchSettings::default(),
        &format!("http://{closed}/x.aci"),
    )
    .unwrap_err();
    assert!(err.contains(&closed.to_string()), "{err}");
    server.put("/images/garbage.aci", b"\x1f\x8b\x08garbage".to_vec());
    let err = fetch(
        &store,
        &FetchSettings::default(),
        &server.url("/images/garbage.aci"),
    )
    .unwrap_err();
    assert!(err.contains("reading the image"), "{err}");

    // Discovery: the page of a prefix of the name carries the template.
    let template = format!(
        "example.com/net http://{}/images/{{name}}-{{version}}-{{os}}-{{arch}}.{{ext}}",
        server.addr
    );
    server.put(
        "/net",
        format!("<html><head><meta name=\"ac-discovery\" content=\"{template}\"></head></html>")
            .into_bytes(),
    );
    server.put(
        "/images/example.com/net/plugin-1.0-linux-amd64.aci",
        gzip(&aci("example.com/net/plugin")),
    );
    let mut settings = FetchSettings {
        discovery_base_url: Some(format!("http://{}", server.addr)),
        insecure_discovery: true,
        ..Default::default()
    };
    let found = fetch(&store, &settings, "example.com/net/plugin:1.0").unwrap();
    assert_eq!(found.name, "example.com/net/plugin");
    let err = fetch(&store, &settings, "example.com/net/plugin:2.0").unwrap_err();
    assert!(err.contains("404"), "{err}");
    let err = fetch(&store, &settings, "other.org/plugin").unwrap_err();
    assert!(err.contains("found no ac-discovery template"), "{err}");
    settings.insecure_discovery = false;
    let err = fetch(&store, &settings, "example.com/net/plugin:1.0").unwrap_err();
    assert!(err.contains("insecureDiscovery"), "{err}");
    assert!(leftovers(&store).is_empty());
}

/// gpg in a private home: makes keys, exports them armored, signs files.
struct Gpg {
    home: tempfile::TempDir,
}

impl Gpg {
    fn new(user: &str) -> Gpg {
        let g = Gpg {
            home: tempfile::tempdir().unwrap(),
        };
        g.run(&[
            "--quick-gen-key",
            "--passphrase",
            "",
            user,
            "ed25519",
            "sign",
            "never",
        ]);
        g
    }

    fn run(&self, args: &[&str]) -> Vec<u8> {
        let out = Command::new("gpg")
            .arg("--homedir")
            .arg(self.home.path())
            .args(["--batch", "--yes", "--pinentry-mode", "loopback"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "gpg {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    fn export(&self, to: &Path) {
        std::fs::write(to, self.run(&["--armor", "--export"])).unwrap();
    }

    fn sign(&self, file: &Path) -> Vec<u8> {
        let sig = PathBuf::from(format!("{}.gpgsig", file.display()));
        self.run(&[
            "--armor",
            "--detach-sign",
            "--output",
            sig.to_str().unwrap(),
            file.to_str().unwrap(),
        ]);
        std::fs::read(sig).unwrap()
    }
}

#[test]
fn signatures_are_checked_against_the_keyring_when_one_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path().join("store"));
    let trusted = Gpg::new("corvid test <trusted@example.com>");
    let stranger = Gpg::new("stranger <stranger@example.com>");
    let keyring = dir.path().join("keyring.asc");
    trusted.export(&keyring);
    let image = dir.path().join("hello.aci");
    std::fs::write(&image, gzip(&aci("example.com/hello"))).unwrap();
    let settings = FetchSettings {
        keyring: Some(keyring),
        ..Default::default()
    };
    let file = format!("file://{}", image.display());
    let err = fetch(&store, &settings, &file).unwrap_err();
    assert!(err.contains("hello.aci.asc"), "no signature: {err}");
    std::fs::write(dir.path().join("hello.aci.asc"), stranger.sign(&image)).unwrap();
    let err = fetch(&store, &settings, &file).unwrap_err();
    assert!(err.contains("no key of the keyring made it"), "{err}");
    std::fs::write(dir.path().join("hello.aci.asc"), trusted.sign(&image)).unwrap();
    fetch(&store, &settings, &file).unwrap();
    // A good signature over other bytes.
    let other = dir.path().join("other.aci");
    std::fs::write(&other, gzip(&aci("example.com/other"))).unwrap();
    std::fs::write(dir.path().join("other.aci.asc"), trusted.sign(&image)).unwrap();
    let err = fetch(&store, &settings, &format!("file://{}", other.display())).unwrap_err();
    assert!(err.contains("no key of the keyring made it"), "{err}");
    std::fs::write(dir.path().join("other.aci.asc"), b"garbage").unwrap();
    let err = fetch(&store, &settings, &format!("file://{}", other.display())).unwrap_err();
    assert!(err.contains("not an armored OpenPGP signature"), "{err}");

    // Over HTTP the signature is the URL with .asc.
    let server = Server::start();
    server.put("/hello.aci", std::fs::read(&image).unwrap());
    let err = fetch(&store, &settings, &server.url("/hello.aci")).unwrap_err();
    assert!(
        err.contains("hello.aci.asc") && err.contains("404"),
        "{err}"
    );
    server.put("/hello.aci.asc", trusted.sign(&image));
    fetch(&store, &settings, &server.url("/hello.aci")).unwrap();
    assert!(leftovers(&store).is_empty());
}

/// Pushes an image of `layers` (tars, gzipped here) running `entrypoint`, as OCI or as
/// Docker v2.
fn push(registry: &Registry, repository: &str, layers: &[Vec<u8>], entrypoint: &str, docker: bool) {
    use oci_client::manifest::*;
    let (layer_type, config_type, manifest_type) = if docker {
        (
            IMAGE_DOCKER_LAYER_GZIP_MEDIA_TYPE,
            IMAGE_DOCKER_CONFIG_MEDIA_TYPE,
            IMAGE_MANIFEST_MEDIA_TYPE,
        )
    } else {
        (
            IMAGE_LAYER_GZIP_MEDIA_TYPE,
            IMAGE_CONFIG_MEDIA_TYPE,
            OCI_IMAGE_MEDIA_TYPE,
        )
    };
    let diff_ids: Vec<String> = layers
        .iter()
        .map(|l| format!("sha256:{:x}", <sha2::Sha256 as sha2::Digest>::digest(l)))
        .collect();
    let layers: Vec<oci_client::client::ImageLayer> = layers
        .iter()
        .map(|l| oci_client::client::ImageLayer::new(gzip(l), layer_type.to_string(), None))
        .collect();
    let config = serde_json::json!({"architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": [entrypoint], "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids}});
    let config = oci_client::client::Config::new(
        config.to_string().into_bytes(),
        config_type.to_string(),
        None,
    );
    registry.push(repository, "1.0", &layers, config, manifest_type);
}

#[test]
fn registry_images_of_both_kinds_are_pulled_with_their_whiteouts() {
    let registry = Registry::start();
    let base = tar(&[
        ("bin/", b""),
        ("bin/hello", b"#!/bin/sh\necho hello\n"),
        ("etc/", b""),
        ("etc/junk", b"old"),
        ("etc/keep/", b""),
        ("etc/keep/x", b"x"),
    ]);
    let top = tar(&[
        ("etc/", b""),
        ("etc/.wh.junk", b""),
        ("etc/keep/", b""),
        ("etc/keep/.wh..wh..opq", b""),
        ("etc/keep/y", b"y"),
    ]);
    push(
        &registry,
        "corvid/oci",
        &[base.clone(), top.clone()],
        "/bin/hello",
        false,
    );
    push(&registry, "corvid/docker", &[base, top], "/bin/hello", true);
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path().join("store"));
    let settings = FetchSettings {
        insecure_registries: vec![registry.addr.clone()],
        ..Default::default()
    };
    for repo in ["corvid/oci", "corvid/docker"] {
        let image = fetch(
            &store,
            &settings,
            &format!("docker://{}/{repo}:1.0", registry.addr),
        )
        .unwrap();
        let root = &image.rootfs;
        assert!(root.join("bin/hello").is_file(), "{repo}");
        assert!(
            !root.join("etc/junk").exists(),
            "{repo}: the whiteout was not applied: {image:?}"
        );
        assert!(
            !root.join("etc/keep/x").exists(),
            "{repo}: the opaque directory kept a lower file"
        );
        assert_eq!(std::fs::read(root.join("etc/keep/y")).unwrap(), b"y");
        assert!(!root.join("etc/.wh.junk").exists());
        assert_eq!(image.exec, ["/bin/hello"]);
        assert!(image.id.starts_with("sha256-"), "{}", image.id);
    }
    let err = fetch(
        &store,
        &settings,
        &format!("docker://{}/corvid/none:1.0", registry.addr),
    )
    .unwrap_err();
    assert!(err.contains("corvid/none"), "{err}");
    // Without the insecure setting the registry is spoken to over TLS, which it lacks.
    let err = fetch(
        &store,
        &FetchSettings::default(),
        &format!("docker://{}/corvid/oci:1.0", registry.addr),
    )
    .unwrap_err();
    assert!(err.contains("pulling"), "{err}");
    assert!(leftovers(&store).is_empty());
}
