//! The image store: each image unpacked once, under its ID.

use std::io::Read;
use std::path::PathBuf;

use crate::aci::{self, Aci, AciError};
use crate::source::{Source, SourceError};

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
        let io = |source| StoreError::Io {
            dir: self.dir.clone(),
            source,
        };
        std::fs::create_dir_all(&self.dir).map_err(io)?;
        let tmp = tempfile::Builder::new()
            .prefix(".unpack-")
            .tempdir_in(&self.dir)
            .map_err(io)?
            .keep();
        let unpacked = aci::unpack(archive, &tmp).map_err(|source| StoreError::Image {
            aci: aci.to_string(),
            source,
        });
        let image = match unpacked {
            Ok(image) => image,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                return Err(e);
            }
        };
        let home = self.dir.join(&image.id);
        if home.join("rootfs").is_dir() {
            let _ = std::fs::remove_dir_all(&tmp);
        } else {
            let _ = std::fs::remove_dir_all(&home);
            std::fs::rename(&tmp, &home).map_err(io)?;
        }
        Ok(Aci {
            rootfs: home.join("rootfs"),
            ..image
        })
    }

    /// Fetches and unpacks the image an `aci` field names.
    pub fn fetch(&self, aci: &str) -> Result<Aci, StoreError> {
        let fetch_err = |message: String| StoreError::Fetch {
            aci: aci.to_string(),
            message,
        };
        match Source::parse(aci)? {
            Source::File(path) => {
                let file = std::fs::File::open(&path)
                    .map_err(|e| fetch_err(format!("{}: {e}", path.display())))?;
                self.add(aci, file)
            }
            other => Err(fetch_err(format!(
                "fetching {other:?} is not built yet (issue 20)"
            ))),
        }
    }
}
