//! Fetching plugin images by their `aci` field: a file, an http(s) URL (only a 200
//! counts), an image name through appc discovery, or a registry image (`docker://`);
//! a detached signature checked against a keyring when one is configured.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pgp::composed::{Deserializable, DetachedSignature, SignedPublicKey};

use crate::aci::Aci;
use crate::config::FetchSettings;
use crate::runtime::store::{Store, StoreError};
use crate::source::Source;

/// The os and arch labels discovery asks for.
const OS: &str = "linux";
/// See [`OS`].
const ARCH: &str = "amd64";

/// Why a GET gave no image, page or signature.
#[derive(Debug, thiserror::Error)]
pub enum GetError {
    /// The request failed.
    #[error("GET {url}: {source}")]
    Request {
        /// The URL.
        url: String,
        /// Why.
        source: ureq::Error,
    },
    /// The answer was not a 200.
    #[error("GET {url}: {status} (only 200 counts)")]
    Status {
        /// The URL.
        url: String,
        /// The status answered.
        status: ureq::http::StatusCode,
    },
    /// The body could not be read.
    #[error("GET {url}: {source}")]
    Body {
        /// The URL.
        url: String,
        /// Why.
        source: std::io::Error,
    },
}

/// Why an image's detached signature could not be had or does not verify.
#[derive(Debug, thiserror::Error)]
pub enum SignatureError {
    /// The signature file next to the image could not be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The signature file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The signature could not be downloaded.
    #[error(transparent)]
    Get(#[from] GetError),
    /// The signature is no armored OpenPGP signature.
    #[error("not an armored OpenPGP signature: {0}")]
    NotArmored(#[source] pgp::errors::Error),
    /// The keyring could not be read.
    #[error("the keyring {}: {source}", path.display())]
    Keyring {
        /// The keyring file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The keyring holds no armored OpenPGP keys.
    #[error("the keyring {}: {source}", path.display())]
    KeyringKeys {
        /// The keyring file.
        path: PathBuf,
        /// Why.
        source: pgp::errors::Error,
    },
    /// The keyring holds no public key at all.
    #[error("the keyring {} holds no public key", .0.display())]
    NoKey(PathBuf),
    /// No key of the keyring made the signature.
    #[error("no key of the keyring made it (a bad or foreign signature)")]
    Unverified,
}

/// Fetches images into a store as the settings say.
pub struct Fetcher<'a> {
    /// Where images go.
    pub store: &'a Store,
    /// How.
    pub settings: &'a FetchSettings,
}

fn failed(aci: &str) -> impl Fn(String) -> StoreError + '_ {
    move |message| StoreError::Fetch {
        aci: aci.to_string(),
        message,
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_connect(Some(Duration::from_secs(10)))
        .timeout_global(Some(Duration::from_secs(300)))
        .build()
        .into()
}

/// GETs `url`; only a 200 counts.
fn get(agent: &ureq::Agent, url: &str) -> Result<ureq::http::Response<ureq::Body>, GetError> {
    let response = agent.get(url).call().map_err(|source| GetError::Request {
        url: url.to_string(),
        source,
    })?;
    if response.status() != 200 {
        return Err(GetError::Status {
            url: url.to_string(),
            status: response.status(),
        });
    }
    Ok(response)
}

/// Reads the whole body of `response` to `url`.
fn body(mut response: ureq::http::Response<ureq::Body>, url: &str) -> Result<Vec<u8>, GetError> {
    let mut bytes = Vec::new();
    response
        .body_mut()
        .as_reader()
        .read_to_end(&mut bytes)
        .map_err(|source| GetError::Body {
            url: url.to_string(),
            source,
        })?;
    Ok(bytes)
}

impl Fetcher<'_> {
    /// Fetches and unpacks the image an `aci` field names.
    pub fn fetch(&self, aci: &str) -> Result<Aci, StoreError> {
        let fail = failed(aci);
        match Source::parse(aci)? {
            Source::File(path) => {
                let signature = path.with_extension(
                    path.extension()
                        .map(|e| format!("{}.asc", e.to_string_lossy()))
                        .unwrap_or_else(|| "asc".into()),
                );
                let mut archive = Vec::new();
                std::fs::File::open(&path)
                    .and_then(|mut f| f.read_to_end(&mut archive))
                    .map_err(|e| fail(format!("{}: {e}", path.display())))?;
                self.check_signature(aci, &archive, || {
                    std::fs::read(&signature).map_err(|source| SignatureError::Read {
                        path: signature.clone(),
                        source,
                    })
                })?;
                self.store.add(aci, archive.as_slice())
            }
            Source::Http(url) => self.http(aci, &url),
            Source::Discovery { name, version } => {
                let url = self.discover(aci, &name, version.as_deref())?;
                if url.starts_with("http://") && !self.settings.insecure_discovery {
                    return Err(fail(format!(
                        "discovery gave {url}, plain HTTP, which insecureDiscovery does not allow"
                    )));
                }
                self.http(aci, &url)
            }
            Source::Docker {
                registry,
                repository,
                reference,
            } => crate::runtime::registry::pull(
                self.store,
                aci,
                &registry,
                &repository,
                &reference,
                &self.settings.insecure_registries,
            ),
        }
    }

    fn http(&self, aci: &str, url: &str) -> Result<Aci, StoreError> {
        let agent = agent();
        let archive = get(&agent, url)
            .and_then(|response| body(response, url))
            .map_err(|source| StoreError::Get {
                aci: aci.to_string(),
                source,
            })?;
        self.check_signature(aci, &archive, || {
            let signature = format!("{url}.asc");
            Ok(body(get(&agent, &signature)?, &signature)?)
        })?;
        self.store.add(aci, archive.as_slice())
    }

    /// The image URL appc discovery gives for `name`: the `ac-discovery` meta tags of
    /// `https://<name>?ac-discovery=1`, then of each shorter prefix of the name.
    fn discover(&self, aci: &str, name: &str, version: Option<&str>) -> Result<String, StoreError> {
        let fail = failed(aci);
        let agent = agent();
        let mut tried = Vec::new();
        let mut prefix = name;
        loop {
            let url = match &self.settings.discovery_base_url {
                Some(base) => {
                    let path = prefix.split_once('/').map_or("", |(_, p)| p);
                    format!("{}/{path}?ac-discovery=1", base.trim_end_matches('/'))
                }
                None => format!("https://{prefix}?ac-discovery=1"),
            };
            if let Ok(mut response) = get(&agent, &url) {
                let page = response
                    .body_mut()
                    .read_to_string()
                    .map_err(|e| StoreError::Get {
                        aci: aci.to_string(),
                        source: GetError::Body {
                            url: url.clone(),
                            source: e.into_io(),
                        },
                    })?;
                if let Some(found) = discovered(&page, name, version) {
                    return Ok(found);
                }
            }
            tried.push(url);
            match prefix.rsplit_once('/') {
                Some((shorter, _)) => prefix = shorter,
                None => break,
            }
        }
        Err(fail(format!(
            "appc discovery found no ac-discovery template for {name} at {}",
            tried.join(", ")
        )))
    }

    /// Checks `archive` against its detached signature when a keyring is configured.
    fn check_signature(
        &self,
        aci: &str,
        archive: &[u8],
        signature: impl FnOnce() -> Result<Vec<u8>, SignatureError>,
    ) -> Result<(), StoreError> {
        let Some(keyring) = &self.settings.keyring else {
            return Ok(());
        };
        signature()
            .and_then(|bytes| verify(keyring, archive, &bytes))
            .map_err(|source| StoreError::Signature {
                aci: aci.to_string(),
                source: Box::new(source),
            })
    }
}

/// Whether `signature` (armored) over `data` was made by a key of the armored `keyring`.
fn verify(keyring: &Path, data: &[u8], signature: &[u8]) -> Result<(), SignatureError> {
    let ring = std::fs::read(keyring).map_err(|source| SignatureError::Keyring {
        path: keyring.to_path_buf(),
        source,
    })?;
    let (signature, _) =
        DetachedSignature::from_armor_single(signature).map_err(SignatureError::NotArmored)?;
    let keys = SignedPublicKey::from_armor_many(ring.as_slice())
        .map_err(|source| SignatureError::KeyringKeys {
            path: keyring.to_path_buf(),
            source,
        })?
        .0
        .filter_map(Result::ok)
        .collect::<Vec<_>>();
    if keys.is_empty() {
        return Err(SignatureError::NoKey(keyring.to_path_buf()));
    }
    let good = keys.iter().any(|key| {
        signature.verify(key, data).is_ok()
            || key
                .public_subkeys
                .iter()
                .any(|sub| signature.verify(&sub.key, data).is_ok())
    });
    good.then_some(()).ok_or(SignatureError::Unverified)
}

/// The first `ac-discovery` template of `page` whose prefix covers `name`, rendered.
fn discovered(page: &str, name: &str, version: Option<&str>) -> Option<String> {
    meta_tags(page)
        .into_iter()
        .filter(|(tag, _)| tag == "ac-discovery")
        .find_map(|(_, content)| {
            let mut words = content.split_whitespace();
            let (prefix, template) = (words.next()?, words.next()?);
            name.starts_with(prefix).then(|| {
                template
                    .replace("{name}", name)
                    .replace("{version}", version.unwrap_or("latest"))
                    .replace("{os}", OS)
                    .replace("{arch}", ARCH)
                    .replace("{ext}", "aci")
            })
        })
}

/// The `(name, content)` of each `<meta>` tag of an HTML page.
fn meta_tags(page: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let lower = page.to_ascii_lowercase();
    let mut at = 0;
    while let Some(start) = lower[at..].find("<meta").map(|i| at + i) {
        let end = lower[start..].find('>').map_or(page.len(), |i| start + i);
        let tag = &page[start..end];
        let attr = |key: &str| -> Option<String> {
            let low = tag.to_ascii_lowercase();
            let i = low.find(&format!("{key}="))? + key.len() + 1;
            let rest = &tag[i..];
            let quote = rest.chars().next().filter(|c| *c == '"' || *c == '\'')?;
            let body = &rest[1..];
            Some(body[..body.find(quote)?].to_string())
        };
        if let (Some(name), Some(content)) = (attr("name"), attr("content")) {
            out.push((name, content));
        }
        at = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_reads_the_meta_templates_that_cover_the_name() {
        let page = r#"<html><head>
            <meta name="ac-discovery" content="other.org https://other.org/{name}.{ext}">
            <META name='ac-discovery' content='example.com/net https://dl.example.com/{name}-{version}-{os}-{arch}.{ext}'>
            <meta name="ac-discovery-pubkeys" content="example.com https://example.com/pubkeys.gpg">
            </head></html>"#;
        assert_eq!(
            discovered(page, "example.com/net/plugin", Some("1.2")).unwrap(),
            "https://dl.example.com/example.com/net/plugin-1.2-linux-amd64.aci"
        );
        assert_eq!(
            discovered(page, "example.com/net/plugin", None).unwrap(),
            "https://dl.example.com/example.com/net/plugin-latest-linux-amd64.aci"
        );
        assert_eq!(discovered(page, "nowhere.net/x", None), None);
        assert_eq!(discovered("<meta name=\"ac-discovery\">", "a", None), None);
    }
}
