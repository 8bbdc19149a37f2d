//! The rustls setup of one endpoint: how its certificate is checked ([`Tls`]), the CA files
//! read into a root store, and the verifier built from them ([`super::verify`]).

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use rustls::{
    client::WebPkiServerVerifier,
    pki_types::{pem::PemObject as _, CertificateDer, ServerName},
    RootCertStore,
};

use super::{
    error::TransportError,
    verify::{Certificate, Named, Verifier},
};

/// How an endpoint's serving certificate is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tls {
    /// It must chain to a certificate of one of `ca_files` (PEM, each read when the transport
    /// is built; one that cannot be read, or holds no certificate, is an error) and name the
    /// host of the URL, or else one of `also_named` (DNS names or IP addresses): a kubelet's
    /// self-signed certificate names its hostname only, while the agent dials its address.
    Verify {
        ca_files: Vec<PathBuf>,
        also_named: Vec<String>,
    },
    /// Not checked at all. Only ever from a setting that says so explicitly.
    Insecure,
}

impl Tls {
    /// Verified against one CA file, for the URL's host only.
    pub fn ca(path: impl Into<PathBuf>) -> Self {
        Self::Verify {
            ca_files: vec![path.into()],
            also_named: Vec::new(),
        }
    }
}

/// The rustls configuration for `tls`: the CA files read now, and a verifier that accepts a
/// certificate for the URL's host or one of the other names (or, explicitly, any certificate).
pub(super) fn client_tls(
    endpoint: &'static str,
    tls: &Tls,
) -> Result<rustls::ClientConfig, TransportError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let setup = |detail: String| TransportError::TlsSetup { endpoint, detail };
    let certificate = match tls {
        Tls::Insecure => Certificate::Any,
        Tls::Verify {
            ca_files,
            also_named,
        } => {
            let mut roots = RootCertStore::empty();
            for path in ca_files {
                for der in read_ca(endpoint, path)? {
                    roots.add(der).map_err(|e| TransportError::BadCa {
                        endpoint,
                        path: path.clone(),
                        detail: Some(e.to_string()),
                    })?;
                }
            }
            let webpki =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|e| setup(e.to_string()))?;
            let also_named = also_named
                .iter()
                .map(|n| {
                    ServerName::try_from(n.clone()).map_err(|_| TransportError::BadServerName {
                        endpoint,
                        name: n.clone(),
                    })
                })
                .collect::<Result<_, _>>()?;
            Certificate::Named(Named { webpki, also_named })
        }
    };
    let verifier = Arc::new(Verifier::new(certificate, provider.clone()));
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| setup(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth())
}

/// The certificates of a PEM file (a CA bundle, or a kubelet's `kubelet.crt`: its certificate
/// followed by the CA that signed it).
fn read_ca(
    endpoint: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TransportError> {
    let pem = std::fs::read(path).map_err(|source| TransportError::ReadCa {
        endpoint,
        path: path.to_path_buf(),
        source,
    })?;
    let bad = |detail: Option<String>| TransportError::BadCa {
        endpoint,
        path: path.to_path_buf(),
        detail,
    };
    let ders = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(Some(e.to_string())))?;
    if ders.is_empty() {
        return Err(bad(None));
    }
    Ok(ders)
}
