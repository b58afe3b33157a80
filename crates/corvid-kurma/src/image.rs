//! corvid's Kurma plugin image, built as an ACI (`corvid.io/cni-netplugin`) and as an
//! OCI image layout: the static plugin binary serving `/opt/network/add`, `del` and the
//! main process, with corvid's CNI plugins beside it.

use std::io::Write;
use std::path::{Path, PathBuf};

use oci_spec::image::{
    ConfigBuilder, DescriptorBuilder, ImageConfigurationBuilder, ImageIndexBuilder,
    ImageManifestBuilder, MediaType, RootFsBuilder, SCHEMA_VERSION,
};
use sha2::{Digest, Sha256};

/// The image's name.
pub const NAME: &str = "corvid.io/cni-netplugin";

/// The container's main process.
pub const MAIN: &str = "/opt/network/netplugin";

/// Where the plugin binary sits in the image.
pub const BINARY: &str = "opt/cni/bin/corvid-plugins";

/// Why the image could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The plugin binary is not a static program.
    #[error("{}: not a static executable (it asks for a program interpreter); scripts/build-static-plugins.sh builds one", .0.display())]
    NotStatic(PathBuf),
    /// Reading the binary or writing the image.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why.
        source: std::io::Error,
    },
    /// The OCI documents.
    #[error("the OCI image: {0}")]
    Oci(String),
}

/// One entry of the image's root filesystem.
enum Node {
    Dir,
    File(Vec<u8>),
    Link(&'static str),
}

/// The root filesystem's entries, in order, paths relative to it.
fn tree(binary: Vec<u8>, plugins: &[&str]) -> Vec<(String, Node)> {
    let mut out: Vec<(String, Node)> = [
        "opt",
        "opt/cni",
        "opt/cni/bin",
        "opt/network",
        "var",
        "var/lib",
        "var/lib/cni",
        "var/lib/kurma",
        "var/lib/kurma/netns",
        "proc",
        "sys",
        "dev",
        "tmp",
        "run",
    ]
    .into_iter()
    .map(|d| (d.to_string(), Node::Dir))
    .collect();
    out.push((BINARY.to_string(), Node::File(binary)));
    for p in plugins {
        out.push((format!("opt/cni/bin/{p}"), Node::Link("corvid-plugins")));
    }
    for program in ["add", "del", "netplugin"] {
        out.push((
            format!("opt/network/{program}"),
            Node::Link("../cni/bin/corvid-plugins"),
        ));
    }
    out
}

/// Writes `tree` as a tar under `prefix` (`rootfs/` for an ACI, nothing for a layer).
fn write_tree(
    tar: &mut tar::Builder<impl Write>,
    prefix: &str,
    tree: &[(String, Node)],
) -> std::io::Result<()> {
    for (path, node) in tree {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        let path = format!("{prefix}{path}");
        match node {
            Node::Dir => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                tar.append_data(&mut h, format!("{path}/"), std::io::empty())?;
            }
            Node::File(bytes) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(0o755);
                h.set_size(bytes.len() as u64);
                tar.append_data(&mut h, &path, bytes.as_slice())?;
            }
            Node::Link(target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                tar.append_link(&mut h, &path, target)?;
            }
        }
    }
    Ok(())
}

/// The ACI manifest: name, labels, and the main process run as root with Kurma's
/// `os/linux/privileged` isolator, without which Kurma gives no CAP_NET_ADMIN or
/// CAP_SYS_ADMIN (appc's `actool validate` refuses that one isolator; Kurma's contract
/// wins).
pub fn manifest(version: &str) -> serde_json::Value {
    serde_json::json!({
        "acKind": "ImageManifest",
        "acVersion": "0.8.11",
        "name": NAME,
        "labels": [
            {"name": "version", "value": version},
            {"name": "os", "value": "linux"},
            {"name": "arch", "value": "amd64"}
        ],
        "app": {
            "exec": [MAIN],
            "user": "0",
            "group": "0",
            "environment": [{"name": "PATH", "value": "/opt/cni/bin:/usr/sbin:/usr/bin:/sbin:/bin"}],
            "isolators": [{"name": crate::aci::PRIVILEGED, "value": true}]
        },
        "annotations": [
            {"name": "description", "value": "corvid's CNI plugins as a Kurma network plugin"}
        ]
    })
}

/// Whether the ELF file `bytes` asks for a program interpreter (is dynamically linked).
fn has_interpreter(bytes: &[u8]) -> bool {
    let le = |at: usize, n: usize| -> usize {
        bytes
            .get(at..at + n)
            .map(|b| {
                b.iter()
                    .rev()
                    .fold(0usize, |acc, x| (acc << 8) | *x as usize)
            })
            .unwrap_or(0)
    };
    if bytes.get(..4) != Some(b"\x7fELF".as_slice()) || bytes.get(4) != Some(&2) {
        return true;
    }
    let (phoff, phentsize, phnum) = (le(0x20, 8), le(0x36, 2), le(0x38, 2));
    (0..phnum).any(|i| le(phoff + i * phentsize, 4) == 3)
}

/// What `build` made.
#[derive(Debug, Clone)]
pub struct Built {
    /// The ACI.
    pub aci: PathBuf,
    /// The OCI image layout directory (its `index.json` tags the image `version`).
    pub oci: PathBuf,
}

/// Builds the ACI and the OCI layout of version `version` into `out`, from the static
/// plugin binary at `binary`; `plugins` are the CNI plugin names it serves.
pub fn build(
    binary: &Path,
    plugins: &[&str],
    version: &str,
    out: &Path,
) -> Result<Built, BuildError> {
    let io = |what: String| move |source| BuildError::Io { what, source };
    let bytes = std::fs::read(binary).map_err(io(binary.display().to_string()))?;
    if has_interpreter(&bytes) {
        return Err(BuildError::NotStatic(binary.to_path_buf()));
    }
    std::fs::create_dir_all(out).map_err(io(out.display().to_string()))?;
    let tree = tree(bytes, plugins);
    let aci = out.join(format!("corvid-cni-netplugin-{version}-linux-amd64.aci"));
    let written = (|| -> std::io::Result<()> {
        let gz = flate2::write::GzEncoder::new(
            std::fs::File::create(&aci)?,
            flate2::Compression::fast(),
        );
        let mut tar = tar::Builder::new(gz);
        let manifest = serde_json::to_vec_pretty(&manifest(version))?;
        let mut h = tar::Header::new_gnu();
        h.set_mtime(0);
        h.set_mode(0o644);
        h.set_size(manifest.len() as u64);
        tar.append_data(&mut h, "manifest", manifest.as_slice())?;
        write_tree(&mut tar, "rootfs/", &[("".into(), Node::Dir)])?;
        write_tree(&mut tar, "rootfs/", &tree)?;
        tar.into_inner()?.finish()?.flush()
    })();
    written.map_err(io(aci.display().to_string()))?;
    let oci = out.join("oci");
    oci_layout(&tree, version, &oci)?;
    Ok(Built { aci, oci })
}

/// Writes a blob; answers its digest and size.
fn blob(dir: &Path, bytes: &[u8]) -> Result<(String, u64), BuildError> {
    let hex = format!("{:x}", Sha256::digest(bytes));
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs)
        .and_then(|()| std::fs::write(blobs.join(&hex), bytes))
        .map_err(|source| BuildError::Io {
            what: blobs.display().to_string(),
            source,
        })?;
    Ok((format!("sha256:{hex}"), bytes.len() as u64))
}

fn oci_layout(tree: &[(String, Node)], version: &str, dir: &Path) -> Result<(), BuildError> {
    let oci = |e: oci_spec::OciSpecError| BuildError::Oci(e.to_string());
    let io = |source| BuildError::Io {
        what: dir.display().to_string(),
        source,
    };
    let mut tar = tar::Builder::new(Vec::new());
    write_tree(&mut tar, "", tree).map_err(io)?;
    let layer = tar.into_inner().map_err(io)?;
    let diff_id = format!("sha256:{:x}", Sha256::digest(&layer));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&layer).map_err(io)?;
    let (layer_digest, layer_size) = blob(dir, &gz.finish().map_err(io)?)?;
    let labels = [
        (
            "org.opencontainers.image.title".to_string(),
            NAME.to_string(),
        ),
        (
            "org.opencontainers.image.version".to_string(),
            version.to_string(),
        ),
        // What the ACI's isolator says, for docker:// pulls (see runtime/registry.rs).
        (crate::aci::PRIVILEGED.to_string(), "true".to_string()),
    ];
    let config = ImageConfigurationBuilder::default()
        .architecture("amd64")
        .os("linux")
        .config(
            ConfigBuilder::default()
                .entrypoint(vec![MAIN.to_string()])
                .env(vec![
                    "PATH=/opt/cni/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string()
                ])
                .labels(
                    labels
                        .iter()
                        .cloned()
                        .collect::<std::collections::HashMap<_, _>>(),
                )
                .build()
                .map_err(oci)?,
        )
        .rootfs(
            RootFsBuilder::default()
                .typ("layers")
                .diff_ids(vec![diff_id])
                .build()
                .map_err(oci)?,
        )
        .build()
        .map_err(oci)?;
    let config_bytes = serde_json::to_vec(&config).map_err(|e| BuildError::Oci(e.to_string()))?;
    let (config_digest, config_size) = blob(dir, &config_bytes)?;
    let descriptor = |media: MediaType, digest: String, size: u64| {
        DescriptorBuilder::default()
            .media_type(media)
            .digest(digest.parse::<oci_spec::image::Digest>().map_err(oci)?)
            .size(size)
            .build()
            .map_err(oci)
    };
    let manifest = ImageManifestBuilder::default()
        .schema_version(SCHEMA_VERSION)
        .media_type(MediaType::ImageManifest)
        .config(descriptor(
            MediaType::ImageConfig,
            config_digest,
            config_size,
        )?)
        .layers(vec![descriptor(
            MediaType::ImageLayerGzip,
            layer_digest,
            layer_size,
        )?])
        .build()
        .map_err(oci)?;
    let manifest_bytes =
        serde_json::to_vec(&manifest).map_err(|e| BuildError::Oci(e.to_string()))?;
    let (manifest_digest, manifest_size) = blob(dir, &manifest_bytes)?;
    let mut entry = descriptor(MediaType::ImageManifest, manifest_digest, manifest_size)?;
    entry.set_annotations(Some(
        [(
            "org.opencontainers.image.ref.name".to_string(),
            version.to_string(),
        )]
        .into_iter()
        .collect(),
    ));
    let index = ImageIndexBuilder::default()
        .schema_version(SCHEMA_VERSION)
        .media_type(MediaType::ImageIndex)
        .manifests(vec![entry])
        .build()
        .map_err(oci)?;
    std::fs::write(
        dir.join("index.json"),
        serde_json::to_vec(&index).map_err(|e| BuildError::Oci(e.to_string()))?,
    )
    .and_then(|()| std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#))
    .map_err(io)
}
