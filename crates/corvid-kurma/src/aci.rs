//! App Container Images (appc's ACI): a tar archive, plain or compressed with gzip, bzip2
//! or xz, holding exactly a `manifest` and a `rootfs/` directory. Unpacking checks what
//! an image may hold before anything of it is used: no entry outside those two, no path
//! that climbs out (`..`, absolute), no link that leads out of the root filesystem, and a
//! manifest that says what to run. The image ID is the sha512 of the uncompressed tar.

use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};

use serde_json::Value;
use sha2::{Digest, Sha512};

/// Why an image was refused.
#[derive(Debug, thiserror::Error)]
pub enum AciError {
    /// The archive could not be read (corrupt, truncated, not a tar).
    #[error("reading the image: {0}")]
    Read(#[from] io::Error),
    /// The archive holds something an ACI may not.
    #[error("not a valid ACI: {0}")]
    Layout(String),
    /// The manifest is missing, not JSON, or says nothing to run.
    #[error("the image's manifest: {0}")]
    Manifest(String),
    /// The manifest's `app.isolators` is not a list.
    #[error("the image's manifest: {name}: app.isolators is a list, not {found}")]
    Isolators {
        /// The image's name.
        name: String,
        /// What the manifest holds there.
        found: Value,
    },
    /// The [`PRIVILEGED`] isolator's value is not a boolean, which Kurma refused.
    #[error(
        "the image's manifest: {name}: the {PRIVILEGED} isolator is true or false, not {found}"
    )]
    Privileged {
        /// The image's name.
        name: String,
        /// The isolator's value.
        found: Value,
    },
}

/// How an archive is compressed, from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar.
    None,
    /// gzip.
    Gzip,
    /// bzip2.
    Bzip2,
    /// xz.
    Xz,
}

impl Compression {
    /// The compression whose magic number `head` starts with.
    pub fn detect(head: &[u8]) -> Compression {
        if head.starts_with(&[0x1f, 0x8b]) {
            Compression::Gzip
        } else if head.starts_with(b"BZh") {
            Compression::Bzip2
        } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
            Compression::Xz
        } else {
            Compression::None
        }
    }
}

/// An unpacked image.
#[derive(Debug, Clone)]
pub struct Aci {
    /// `sha512-<hex>` of the uncompressed archive.
    pub id: String,
    /// The manifest as written.
    pub manifest: Value,
    /// The image's name (`example.com/net/plugin`).
    pub name: String,
    /// The command the image runs (`app.exec`).
    pub exec: Vec<String>,
    /// Where its root filesystem was unpacked.
    pub rootfs: PathBuf,
    /// Whether the app carries the [`PRIVILEGED`] isolator set to true: all capabilities,
    /// where without it Kurma gave only [`crate::runtime::caps::KURMA_DEFAULT`].
    pub privileged: bool,
}

/// The one isolator Kurma honoured (`app.isolators`), as its images carried it; appc's
/// `actool validate` does not know it and refuses a manifest that has it.
pub const PRIVILEGED: &str = "os/linux/privileged";

/// Counts the bytes of the uncompressed archive into the image ID as they are read.
struct Hashing<R> {
    inner: R,
    hash: Sha512,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// `path` as a list of normal components, or none when it climbs (`..`) or is absolute.
pub(crate) fn contained(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir => {}
            _ => return None,
        }
    }
    Some(out)
}

/// Whether a symbolic link at `link` (inside the root filesystem) pointing to `target`
/// stays inside it: an absolute target is the container's root, a relative one may not
/// climb above it.
pub(crate) fn link_stays_inside(link: &Path, target: &Path) -> bool {
    if target.is_absolute() {
        return true;
    }
    let mut depth = link.components().count().saturating_sub(1) as i64;
    for c in target.components() {
        match c {
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            _ => {}
        }
        if depth < 0 {
            return false;
        }
    }
    true
}

/// Unpacks the image in `archive` into `dest` (its `rootfs/` becomes `dest/rootfs`) and
/// checks it; on any refusal, `dest` holds nothing of it.
pub fn unpack(archive: impl Read, dest: &Path) -> Result<Aci, AciError> {
    let result = unpack_checked(archive, dest);
    if result.is_err() {
        // Either name may be a file, a directory or a link, whatever the archive made.
        for name in ["rootfs", "manifest"] {
            let path = dest.join(name);
            let _ = match std::fs::symlink_metadata(&path) {
                Ok(m) if m.is_dir() => std::fs::remove_dir_all(&path),
                _ => std::fs::remove_file(&path),
            };
        }
    }
    result
}

/// The tar inside `archive`, however it is compressed.
pub(crate) fn decompressed<'a>(archive: impl Read + 'a) -> io::Result<Box<dyn Read + 'a>> {
    let mut archive = io::BufReader::new(archive);
    let head = io::BufRead::fill_buf(&mut archive)?.to_vec();
    Ok(match Compression::detect(&head) {
        Compression::None => Box::new(archive),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(archive)),
        Compression::Bzip2 => Box::new(bzip2::read::MultiBzDecoder::new(archive)),
        Compression::Xz => Box::new(liblzma::read::XzDecoder::new_multi_decoder(archive)),
    })
}

fn unpack_checked(archive: impl Read, dest: &Path) -> Result<Aci, AciError> {
    let plain = decompressed(archive)?;
    let mut hashing = Hashing {
        inner: plain,
        hash: Sha512::new(),
    };
    let mut manifest = None;
    let mut saw_rootfs = false;
    {
        let mut tar = tar::Archive::new(&mut hashing);
        tar.set_preserve_permissions(true);
        tar.set_overwrite(false);
        for entry in tar.entries()? {
            let mut entry = entry?;
            let raw = entry.path()?.into_owned();
            let path = contained(&raw).ok_or_else(|| {
                AciError::Layout(format!("{} leads out of the image", raw.display()))
            })?;
            let top = path.components().next().map(|c| c.as_os_str().to_owned());
            match top.as_ref().and_then(|t| t.to_str()) {
                Some("manifest") if path.components().count() == 1 => {
                    let mut text = String::new();
                    entry.read_to_string(&mut text)?;
                    manifest = Some(text);
                    continue;
                }
                Some("rootfs") => {
                    // The root itself must be a directory: a link there would make some
                    // other directory (the host's `/`, say) the container's root.
                    if path.components().count() == 1 && !entry.header().entry_type().is_dir() {
                        return Err(AciError::Layout("rootfs is not a directory".into()));
                    }
                    saw_rootfs = true
                }
                None => continue,
                Some(_) => {
                    return Err(AciError::Layout(format!(
                        "{} is neither the manifest nor under rootfs/",
                        path.display()
                    )))
                }
            }
            let inside_rootfs = path.strip_prefix("rootfs").unwrap_or(&path);
            if let Some(target) = entry.link_name()? {
                let kind = entry.header().entry_type();
                let stays = if kind.is_hard_link() {
                    contained(&target).is_some_and(|t| t.starts_with("rootfs"))
                } else {
                    link_stays_inside(inside_rootfs, &target)
                };
                if !stays {
                    return Err(AciError::Layout(format!(
                        "the link {} to {} leads out of the root filesystem",
                        path.display(),
                        target.display()
                    )));
                }
            }
            if !entry.unpack_in(dest)? {
                return Err(AciError::Layout(format!(
                    "{} leads out of the image",
                    path.display()
                )));
            }
        }
        // What follows the archive's end marker counts towards the ID too.
        io::copy(&mut tar.into_inner(), &mut io::sink())?;
    }
    let text = manifest.ok_or_else(|| AciError::Layout("no manifest".into()))?;
    let is_dir = std::fs::symlink_metadata(dest.join("rootfs")).is_ok_and(|m| m.is_dir());
    if !saw_rootfs || !is_dir {
        return Err(AciError::Layout("no rootfs/ directory".into()));
    }
    std::fs::write(dest.join("manifest"), &text)?;
    let manifest: Value =
        serde_json::from_str(&text).map_err(|e| AciError::Manifest(format!("not JSON: {e}")))?;
    image(
        manifest,
        format!("sha512-{:x}", hashing.hash.finalize()),
        dest.join("rootfs"),
    )
}

/// The image a manifest describes, once its root filesystem is in place.
pub(crate) fn image(manifest: Value, id: String, rootfs: PathBuf) -> Result<Aci, AciError> {
    let name = manifest["name"]
        .as_str()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| AciError::Manifest("no name".into()))?
        .to_string();
    let exec: Vec<String> = manifest["app"]["exec"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    if exec.is_empty() {
        return Err(AciError::Manifest(format!(
            "{name} says nothing to run (app.exec)"
        )));
    }
    let privileged = privileged(&name, &manifest["app"]["isolators"])?;
    Ok(Aci {
        id,
        manifest,
        name,
        exec,
        rootfs,
        privileged,
    })
}

/// Whether `isolators` (the app's list) sets [`PRIVILEGED`] true. Kurma read its value
/// as a JSON boolean and refused the manifest otherwise; other isolators it ignored.
/// `name` is the image's, for the error.
fn privileged(name: &str, isolators: &Value) -> Result<bool, AciError> {
    let list = match isolators {
        Value::Null => return Ok(false),
        Value::Array(list) => list,
        other => {
            return Err(AciError::Isolators {
                name: name.to_string(),
                found: other.clone(),
            })
        }
    };
    let mut privileged = false;
    for isolator in list.iter().filter(|i| i["name"] == PRIVILEGED) {
        match &isolator["value"] {
            Value::Bool(b) => privileged = *b,
            other => {
                return Err(AciError::Privileged {
                    name: name.to_string(),
                    found: other.clone(),
                })
            }
        }
    }
    Ok(privileged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A tar of (path, contents or link target, kind) entries.
    fn tar_of(entries: &[(&str, &str, tar::EntryType)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, body, kind) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_mode(0o755);
            match *kind {
                tar::EntryType::Symlink | tar::EntryType::Link => {
                    h.set_size(0);
                    // Written raw: the builder's own setters refuse what these tests need.
                    h.as_old_mut().linkname[..body.len()].copy_from_slice(body.as_bytes());
                    h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
                    h.set_cksum();
                    b.append(&h, io::empty()).unwrap();
                }
                _ => {
                    h.set_size(body.len() as u64);
                    h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
                    h.set_cksum();
                    b.append(&h, body.as_bytes()).unwrap();
                }
            }
        }
        b.into_inner().unwrap()
    }

    const MANIFEST: &str = r#"{"acKind": "ImageManifest", "acVersion": "0.8.11",
        "name": "corvid.io/test", "app": {"exec": ["/bin/plugin"], "user": "0", "group": "0"}}"#;

    fn good() -> Vec<u8> {
        use tar::EntryType::*;
        tar_of(&[
            ("manifest", MANIFEST, Regular),
            ("rootfs/", "", Directory),
            ("rootfs/bin/", "", Directory),
            ("rootfs/bin/plugin", "#!/bin/sh\n", Regular),
            ("rootfs/bin/sh", "/bin/plugin", Symlink),
            ("rootfs/bin/up", "../bin/plugin", Symlink),
        ])
    }

    fn compressed(c: Compression, plain: &[u8]) -> Vec<u8> {
        match c {
            Compression::None => plain.to_vec(),
            Compression::Gzip => {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), Default::default());
                e.write_all(plain).unwrap();
                e.finish().unwrap()
            }
            Compression::Bzip2 => {
                let mut e = bzip2::write::BzEncoder::new(Vec::new(), Default::default());
                e.write_all(plain).unwrap();
                e.finish().unwrap()
            }
            Compression::Xz => {
                let mut e = liblzma::write::XzEncoder::new(Vec::new(), 6);
                e.write_all(plain).unwrap();
                e.finish().unwrap()
            }
        }
    }

    #[test]
    fn every_compression_unpacks_to_the_same_image_id() {
        let plain = good();
        let want = format!("sha512-{:x}", Sha512::digest(&plain));
        for c in [
            Compression::None,
            Compression::Gzip,
            Compression::Bzip2,
            Compression::Xz,
        ] {
            let bytes = compressed(c, &plain);
            assert_eq!(Compression::detect(&bytes), c);
            let dir = tempfile::tempdir().unwrap();
            let aci = unpack(bytes.as_slice(), dir.path()).unwrap();
            assert_eq!(aci.id, want, "{c:?}");
            assert_eq!(
                (aci.name.as_str(), aci.exec.as_slice()),
                ("corvid.io/test", &["/bin/plugin".to_string()][..])
            );
            assert_eq!(
                std::fs::read_to_string(aci.rootfs.join("bin/plugin")).unwrap(),
                "#!/bin/sh\n"
            );
            assert!(dir.path().join("manifest").exists());
        }
    }

    #[test]
    fn the_privileged_isolator_is_read_as_kurma_read_it() {
        let with = |isolators: Value| {
            let manifest = serde_json::json!({"name": "corvid.io/x",
                "app": {"exec": ["/x"], "isolators": isolators}});
            image(manifest, "sha512-x".into(), "/r".into()).map(|a| a.privileged)
        };
        assert!(!with(Value::Null).unwrap());
        assert!(with(serde_json::json!([{"name": "os/linux/privileged", "value": true}])).unwrap());
        assert!(
            !with(serde_json::json!([{"name": "os/linux/privileged", "value": false}])).unwrap()
        );
        // Other isolators Kurma ignored.
        assert!(
            !with(serde_json::json!([{"name": "resource/cpu", "value": {"limit": "1"}}])).unwrap()
        );
        let err = with(serde_json::json!([{"name": "os/linux/privileged", "value": "yes"}]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("os/linux/privileged isolator is true or false"),
            "{err}"
        );
    }

    #[test]
    fn what_an_image_may_not_hold_is_refused_and_nothing_is_left() {
        use tar::EntryType::*;
        // (case, archive, what the error must say)
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            (
                "climbs",
                tar_of(&[
                    ("manifest", MANIFEST, Regular),
                    ("rootfs/../../x", "x", Regular),
                ]),
                "leads out of the image",
            ),
            (
                "absolute",
                tar_of(&[("manifest", MANIFEST, Regular), ("/etc/x", "x", Regular)]),
                "leads out of the image",
            ),
            // Found by tests/fuzz.rs: a rootfs that is a file was left behind, and one
            // that is a link was taken for the root.
            (
                "rootfs is a file",
                tar_of(&[("rootfs", "", Regular)]),
                "rootfs is not a directory",
            ),
            (
                "rootfs is a link",
                tar_of(&[("manifest", MANIFEST, Regular), ("rootfs", "/", Symlink)]),
                "rootfs is not a directory",
            ),
            (
                "extra entry",
                tar_of(&[
                    ("manifest", MANIFEST, Regular),
                    ("rootfs/", "", Directory),
                    ("other", "x", Regular),
                ]),
                "neither the manifest",
            ),
            (
                "link out",
                tar_of(&[
                    ("manifest", MANIFEST, Regular),
                    ("rootfs/", "", Directory),
                    ("rootfs/x", "../../etc", Symlink),
                ]),
                "out of the root filesystem",
            ),
            // Out of the image and back down by as many steps: its final depth is fine,
            // but it names a path outside the image wherever the image is unpacked.
            (
                "link out and back",
                tar_of(&[
                    ("manifest", MANIFEST, Regular),
                    ("rootfs/", "", Directory),
                    ("rootfs/x", "../../../var/tmp/xyz", Symlink),
                ]),
                "out of the root filesystem",
            ),
            (
                "hard link out",
                tar_of(&[
                    ("manifest", MANIFEST, Regular),
                    ("rootfs/", "", Directory),
                    ("rootfs/x", "/etc/passwd", Link),
                ]),
                "out of the root filesystem",
            ),
            (
                "no manifest",
                tar_of(&[("rootfs/", "", Directory), ("rootfs/x", "x", Regular)]),
                "no manifest",
            ),
            (
                "no rootfs",
                tar_of(&[("manifest", MANIFEST, Regular)]),
                "no rootfs/",
            ),
            (
                "manifest not JSON",
                tar_of(&[("manifest", "{", Regular), ("rootfs/", "", Directory)]),
                "not JSON",
            ),
            (
                "nothing to run",
                tar_of(&[
                    ("manifest", r#"{"name": "corvid.io/x", "app": {}}"#, Regular),
                    ("rootfs/", "", Directory),
                ]),
                "app.exec",
            ),
            (
                "corrupt",
                compressed(Compression::Gzip, &good())[..40].to_vec(),
                "reading the image",
            ),
        ];
        for (what, bytes, says) in cases {
            let dir = tempfile::tempdir().unwrap();
            let err = unpack(bytes.as_slice(), dir.path()).expect_err(what);
            assert!(err.to_string().contains(says), "{what}: {err}");
            let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
            assert!(left.is_empty(), "{what}: {err}: left {left:?}");
        }
    }
}
