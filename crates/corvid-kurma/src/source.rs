//! Where a plugin image comes from, as a network's `aci` field names it.

/// Why an `aci` field names nothing that can be fetched.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("aci {aci:?}: {message}")]
pub struct SourceError {
    /// The field as written.
    pub aci: String,
    /// What is wrong.
    pub message: String,
}

/// A plugin image's origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `file:///path/to/image.aci`: an ACI on this host.
    File(std::path::PathBuf),
    /// `http://` or `https://`: an ACI at a URL (only a 200 answer counts).
    Http(String),
    /// `docker://[registry/]repository[:tag|@digest]`: an OCI or Docker v2 image.
    Docker {
        /// The registry's host (and port); Docker Hub when the reference names none.
        registry: String,
        /// The repository (`library/` added for Docker Hub's single names).
        repository: String,
        /// The tag or digest (`latest` when none).
        reference: String,
    },
    /// A bare image name (`example.com/net/plugin[:version]`), found by appc discovery.
    Discovery {
        /// The image name.
        name: String,
        /// The version label, if given.
        version: Option<String>,
    },
}

/// Docker Hub's registry host.
pub const DOCKER_HUB: &str = "registry-1.docker.io";

impl Source {
    /// Reads an `aci` field.
    pub fn parse(aci: &str) -> Result<Source, SourceError> {
        let bad = |message: &str| SourceError {
            aci: aci.to_string(),
            message: message.to_string(),
        };
        if let Some(path) = aci.strip_prefix("file://") {
            if !path.starts_with('/') {
                return Err(bad("a file:// URL needs an absolute path (file:///...)"));
            }
            return Ok(Source::File(path.into()));
        }
        if aci.starts_with("http://") || aci.starts_with("https://") {
            let host = aci.split("://").nth(1).unwrap_or("");
            if host.is_empty() || host.starts_with('/') {
                return Err(bad("the URL names no host"));
            }
            return Ok(Source::Http(aci.to_string()));
        }
        if let Some(rest) = aci.strip_prefix("docker://") {
            return docker(rest.trim_start_matches('/'))
                .ok_or_else(|| bad("not a docker image reference"));
        }
        if let Some((scheme, _)) = aci.split_once("://") {
            return Err(bad(&format!(
                "unknown scheme {scheme}:// (file, http, https, docker, or an image name)"
            )));
        }
        let (name, version) = match aci.rsplit_once(':') {
            Some((n, v)) if !v.contains('/') => (n, Some(v.to_string())),
            _ => (aci, None),
        };
        let valid = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-._~/".contains(c))
            && !name.starts_with('/');
        if !valid {
            return Err(bad("not an image name (lower-case letters, digits, -._~/)"));
        }
        Ok(Source::Discovery {
            name: name.to_string(),
            version,
        })
    }
}

/// `[registry/]repository[:tag|@digest]`, with Docker's defaults.
fn docker(reference: &str) -> Option<Source> {
    if reference.is_empty() {
        return None;
    }
    let (name, reference) = match reference.split_once('@') {
        Some((n, digest)) => (n, digest.to_string()),
        None => match reference.rsplit_once(':') {
            Some((n, tag)) if !tag.contains('/') => (n, tag.to_string()),
            _ => (reference, "latest".to_string()),
        },
    };
    let (registry, repository) = match name.split_once('/') {
        Some((first, rest))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            (first.to_string(), rest.to_string())
        }
        _ if name.contains('/') => (DOCKER_HUB.to_string(), name.to_string()),
        _ => (DOCKER_HUB.to_string(), format!("library/{name}")),
    };
    (!repository.is_empty() && !reference.is_empty()).then_some(Source::Docker {
        registry,
        repository,
        reference,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn docker_of(r: &str, repo: &str, reference: &str) -> Source {
        Source::Docker {
            registry: r.into(),
            repository: repo.into(),
            reference: reference.into(),
        }
    }

    #[test]
    fn every_form_of_the_document_and_of_kurma_is_read() {
        assert_eq!(
            Source::parse("file:///var/lib/x.aci").unwrap(),
            Source::File("/var/lib/x.aci".into())
        );
        assert_eq!(
            Source::parse("https://example.com/x.aci").unwrap(),
            Source::Http("https://example.com/x.aci".into())
        );
        assert_eq!(
            Source::parse("docker:///user/plugin-name:tag").unwrap(),
            docker_of(DOCKER_HUB, "user/plugin-name", "tag")
        );
        assert_eq!(
            Source::parse("docker://busybox").unwrap(),
            docker_of(DOCKER_HUB, "library/busybox", "latest")
        );
        assert_eq!(
            Source::parse("docker://127.0.0.1:5000/corvid/plugin@sha256:abc").unwrap(),
            docker_of("127.0.0.1:5000", "corvid/plugin", "sha256:abc")
        );
        assert_eq!(
            Source::parse("apcera.com/kurma/cni-netplugin:0.3.0").unwrap(),
            Source::Discovery {
                name: "apcera.com/kurma/cni-netplugin".into(),
                version: Some("0.3.0".into())
            }
        );
    }

    #[test]
    fn what_names_nothing_fetchable_is_refused_clearly() {
        for (aci, says) in [
            ("ftp://example.com/x.aci", "unknown scheme ftp://"),
            ("file://relative/x.aci", "absolute path"),
            ("http:///x.aci", "no host"),
            ("docker://", "not a docker image reference"),
            ("Example.COM/Plugin", "not an image name"),
        ] {
            let err = Source::parse(aci).unwrap_err().to_string();
            assert!(err.contains(says), "{aci}: {err}");
        }
    }
}
