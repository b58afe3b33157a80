//! The image store: each image unpacked once, under its ID.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::aci::{self, Aci, AciError};
use crate::runtime::fetch::{GetError, SignatureError};
use crate::source::SourceError;

/// Why an image could not be had.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The `aci` field names nothing fetchable.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// Fetching failed.
    #[error("{aci}: {message}")]
    Fetch {
        /// The `aci` field.
        aci: String,
        /// What failed.
        message: String,
    },
    /// Downloading the image (or finding it by discovery) failed.
    #[error("{aci}: {source}")]
    Get {
        /// The `aci` field.
        aci: String,
        /// Why.
        source: GetError,
    },
    /// A keyring is configured and the image's signature could not be had or does not
    /// verify.
    #[error("{aci}: its signature: {source}")]
    Signature {
        /// The `aci` field.
        aci: String,
        /// Why (boxed: OpenPGP's errors are large, and every `Result` of the store
        /// would carry their size).
        source: Box<SignatureError>,
    },
    /// The image itself was refused.
    #[error("{aci}: {source}")]
    Image {
        /// The `aci` field.
        aci: String,
        /// Why.
        source: AciError,
    },
    /// The store's directory.
    #[error("the image store {}: {source}", dir.display())]
    Io {
        /// Which directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Unpacked images under one directory.
#[derive(Debug, Clone)]
pub struct Store {
    /// The directory.
    pub dir: PathBuf,
}

impl Store {
    /// The store in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Store {
        Store { dir: dir.into() }
    }

    /// Unpacks the ACI read from `archive` (for the `aci` field `aci`), once per ID.
    pub fn add(&self, aci: &str, archive: impl Read) -> Result<Aci, StoreError> {
        self.place(aci, |dir| aci::unpack(archive, dir))
    }

    /// Lets `make` build an image (`manifest` and `rootfs/`) in a new directory of the
    /// store, then keeps it under its ID; on failure nothing of it stays.
    pub fn place(
        &self,
        aci: &str,
        make: impl FnOnce(&Path) -> Result<Aci, AciError>,
    ) -> Result<Aci, StoreError> {
        let io = |source| StoreError::Io {
            dir: self.dir.clone(),
            source,
        };
        std::fs::create_dir_all(&self.dir).map_err(io)?;
        let tmp = tempfile::Builder::new()
            .prefix(".unpack-")
            .tempdir_in(&self.dir)
            .map_err(io)?;
        let image = make(tmp.path()).map_err(|source| StoreError::Image {
            aci: aci.to_string(),
            source,
        })?;
        if image.id.is_empty() || image.id.contains('/') || image.id.starts_with('.') {
            return Err(StoreError::Image {
                aci: aci.to_string(),
                source: AciError::Manifest(format!("no usable image ID ({:?})", image.id)),
            });
        }
        let home = self.dir.join(&image.id);
        if !home.join("rootfs").is_dir() {
            let _ = std::fs::remove_dir_all(&home);
            std::fs::rename(tmp.keep(), &home).map_err(io)?;
        }
        Ok(Aci {
            rootfs: home.join("rootfs"),
            ..image
        })
    }
}
