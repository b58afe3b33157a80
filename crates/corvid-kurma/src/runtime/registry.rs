//! `docker://` images: an OCI or Docker v2 image pulled from a registry, its layers
//! applied in order (whiteouts and opaque directories honoured) into one root filesystem,
//! and its configuration turned into the manifest the runtime reads.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::aci::{self, Aci};
use crate::runtime::store::{Store, StoreError};

/// The layer types an image may have.
const LAYERS: [&str; 4] = [
    manifest::IMAGE_LAYER_GZIP_MEDIA_TYPE,
    manifest::IMAGE_LAYER_MEDIA_TYPE,
    manifest::IMAGE_DOCKER_LAYER_GZIP_MEDIA_TYPE,
    manifest::IMAGE_DOCKER_LAYER_TAR_MEDIA_TYPE,
];

/// Pulls `registry/repository:reference` (or `@digest`) into the store.
pub fn pull(
    store: &Store,
    aci: &str,
    registry: &str,
    repository: &str,
    reference: &str,
    insecure: &[String],
) -> Result<Aci, StoreError> {
    let fail = |message: String| StoreError::Fetch {
        aci: aci.to_string(),
        message,
    };
    // rustls needs one process-wide provider; ring is the one corvid builds everywhere.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let at = if reference.contains(':') { "@" } else { ":" };
    let name: Reference = format!("{registry}/{repository}{at}{reference}")
        .parse()
        .map_err(|e| fail(format!("{e}")))?;
    let protocol = if insecure.is_empty() {
        ClientProtocol::Https
    } else {
        ClientProtocol::HttpsExcept(insecure.to_vec())
    };
    let client = Client::new(ClientConfig {
        protocol,
        ..Default::default()
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| fail(format!("{e}")))?;
    let image = runtime
        .block_on(client.pull(&name, &RegistryAuth::Anonymous, LAYERS.to_vec()))
        .map_err(|e| fail(format!("pulling {name}: {e}")))?;
    // oci-client hands the layers back in the order their downloads finished: put them
    // back in the manifest's, by digest.
    let digests: HashMap<String, &[u8]> = image
        .layers
        .iter()
        .map(|l| (format!("sha256:{:x}", Sha256::digest(&l.data)), &l.data[..]))
        .collect();
    let layers: Vec<&[u8]> = image
        .manifest
        .iter()
        .flat_map(|m| &m.layers)
        .map(|d| {
            digests
                .get(&d.digest)
                .copied()
                .ok_or_else(|| fail(format!("layer {} did not arrive whole", d.digest)))
        })
        .collect::<Result<_, _>>()?;
    let config: Value = serde_json::from_slice(&image.config.data)
        .map_err(|e| fail(format!("the image's configuration: {e}")))?;
    let exec: Vec<Value> = ["Entrypoint", "Cmd"]
        .iter()
        .filter_map(|k| config["config"][k].as_array())
        .flatten()
        .cloned()
        .collect();
    let environment: Vec<Value> = config["config"]["Env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e.as_str()?.split_once('='))
        .map(|(k, v)| json!({"name": k, "value": v}))
        .collect();
    // An OCI image has no isolators; a label named like Kurma's privileged isolator
    // stands for it (corvid's own image carries one), since without it the plugin could
    // configure no network.
    let isolators: Vec<Value> = match config["config"]["Labels"][aci::PRIVILEGED].as_str() {
        Some("true") => vec![json!({"name": aci::PRIVILEGED, "value": true})],
        _ => Vec::new(),
    };
    let manifest = json!({
        "acKind": "ImageManifest",
        "acVersion": "0.8.11",
        "name": format!("{registry}/{repository}"),
        "labels": [
            {"name": "version", "value": reference},
            {"name": "os", "value": "linux"},
            {"name": "arch", "value": "amd64"}
        ],
        "app": {"exec": exec, "user": "0", "group": "0", "environment": environment,
            "isolators": isolators}
    });
    let id = match &image.digest {
        Some(d) if !d.is_empty() => d.replace(':', "-"),
        _ => format!("sha256-{:x}", Sha256::digest(&image.config.data)),
    };
    store.place(aci, |dir| {
        let rootfs = dir.join("rootfs");
        std::fs::create_dir_all(&rootfs)?;
        for layer in &layers {
            apply(&rootfs, layer)?;
        }
        std::fs::write(dir.join("manifest"), manifest.to_string())?;
        aci::image(manifest.clone(), id.clone(), rootfs)
    })
}

/// `path` in `root`, if its parent resolves (through any links) inside `root`.
fn inside(root: &Path, path: &Path) -> Result<Option<PathBuf>, aci::AciError> {
    let full = root.join(path);
    let Some(parent) = full.parent() else {
        return Ok(None);
    };
    match parent.canonicalize() {
        Ok(p) if p.starts_with(root.canonicalize()?) => Ok(Some(full)),
        Ok(_) => Err(aci::AciError::Layout(format!(
            "{} leads out of the root filesystem",
            path.display()
        ))),
        Err(_) => Ok(None),
    }
}

/// Applies one layer on top of `root`.
fn apply(root: &Path, layer: &[u8]) -> Result<(), aci::AciError> {
    let out = |p: &Path| aci::AciError::Layout(format!("{} leads out of the image", p.display()));
    let mut tar = tar::Archive::new(aci::decompressed(layer)?);
    tar.set_preserve_permissions(true);
    tar.set_overwrite(true);
    let mut written: HashSet<PathBuf> = HashSet::new();
    for entry in tar.entries()? {
        let mut entry = entry?;
        let raw = entry.path()?.into_owned();
        let path = aci::contained(&raw).ok_or_else(|| out(&raw))?;
        let file = path.file_name().map(|f| f.to_string_lossy().into_owned());
        let dir = path.parent().unwrap_or(Path::new(""));
        if file.as_deref() == Some(".wh..wh..opq") {
            // Opaque: what lower layers put in the directory goes; this layer's stays.
            if let Some(full) = inside(root, &path)? {
                for e in std::fs::read_dir(full.parent().unwrap_or(root))?.flatten() {
                    if !written.contains(&dir.join(e.file_name())) {
                        remove(&e.path())?;
                    }
                }
            }
            continue;
        }
        if let Some(hidden) = file.as_deref().and_then(|f| f.strip_prefix(".wh.")) {
            if let Some(full) = inside(root, &dir.join(hidden))? {
                remove(&full)?;
            }
            continue;
        }
        if let Some(target) = entry.link_name()? {
            let stays = if entry.header().entry_type().is_hard_link() {
                aci::contained(&target).is_some()
            } else {
                aci::link_stays_inside(&path, &target)
            };
            if !stays {
                return Err(aci::AciError::Layout(format!(
                    "the link {} to {} leads out of the root filesystem",
                    path.display(),
                    target.display()
                )));
            }
        }
        if !entry.unpack_in(root)? {
            return Err(out(&path));
        }
        written.insert(path);
    }
    Ok(())
}

/// Removes a file, link or whole directory (never what a link points to).
fn remove(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}
