//! How an endpoint's serving certificate is judged ([`Verifier`]): by webpki with the name
//! checked against the URL's host or one of the other names the agent accepts ([`Named`]), or,
//! explicitly, not at all. Either way the handshake's signatures are checked one way, with the
//! provider's algorithms, as webpki's own verifier checks them.

use std::{error::Error as StdError, sync::Arc};

use rustls::{
    client::{
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
        WebPkiServerVerifier,
    },
    crypto::{CryptoProvider, WebPkiSupportedAlgorithms},
    pki_types::{CertificateDer, ServerName, UnixTime},
    CertificateError, DigitallySignedStruct, SignatureScheme,
};

/// How the certificate itself is judged.
#[derive(Debug)]
pub(super) enum Certificate {
    Named(Named),
    /// Any certificate (the handshake's signatures are still checked, so the session is with
    /// whoever holds the key of the certificate shown): `insecureSkipTLSVerify`, explicit only.
    Any,
}

/// The verifier of one endpoint: its [`Certificate`] check, and the handshake's signatures
/// checked with the provider's algorithms whichever that is.
#[derive(Debug)]
pub(super) struct Verifier {
    certificate: Certificate,
    provider: Arc<CryptoProvider>,
}

impl Verifier {
    pub(super) fn new(certificate: Certificate, provider: Arc<CryptoProvider>) -> Self {
        Self {
            certificate,
            provider,
        }
    }

    /// What the handshake's signatures are checked with, whichever [`Certificate`] check:
    /// the provider's algorithms, the same webpki's own verifier uses.
    fn signatures(&self) -> &WebPkiSupportedAlgorithms {
        &self.provider.signature_verification_algorithms
    }
}

/// webpki's verification (chain, validity, usage), with the name checked against the URL's
/// host first, then each of `also_named`: the certificate must name one of them.
#[derive(Debug)]
pub(super) struct Named {
    pub(super) webpki: Arc<WebPkiServerVerifier>,
    pub(super) also_named: Vec<ServerName<'static>>,
}

/// A certificate that names none of the names the agent accepts for the endpoint.
#[derive(Debug)]
pub(super) struct NameMismatch {
    tried: Vec<String>,
    presented: Option<Vec<String>>,
}

impl std::fmt::Display for NameMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the certificate is not valid for {}",
            self.tried.join(" nor ")
        )?;
        match &self.presented {
            Some(names) if names.is_empty() => f.write_str(" (it names nothing)"),
            Some(names) => write!(f, " (it names {})", names.join(", ")),
            None => Ok(()),
        }
    }
}

impl StdError for NameMismatch {}

/// A name as webpki presents it (`DnsName("worker-1")`), as a reader writes it (`worker-1`).
fn unquoted(presented: &str) -> String {
    match (presented.find('"'), presented.rfind('"')) {
        (Some(a), Some(b)) if b > a => presented[a + 1..b].to_string(),
        _ => presented.to_string(),
    }
}

fn is_name_mismatch(e: &rustls::Error) -> bool {
    matches!(
        e,
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }
        )
    )
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let named = match &self.certificate {
            Certificate::Named(named) => named,
            Certificate::Any => return Ok(ServerCertVerified::assertion()),
        };
        let first = named.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        );
        let Err(e) = first else { return first };
        if !is_name_mismatch(&e) || named.also_named.is_empty() {
            return Err(e);
        }
        for name in &named.also_named {
            let next = named.webpki.verify_server_cert(
                end_entity,
                intermediates,
                name,
                ocsp_response,
                now,
            );
            match next {
                Err(e) if is_name_mismatch(&e) => continue,
                other => return other,
            }
        }
        let presented = match e {
            rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
                presented,
                ..
            }) => Some(presented.iter().map(|p| unquoted(p)).collect()),
            _ => None,
        };
        let tried = std::iter::once(server_name.to_str().into_owned())
            .chain(named.also_named.iter().map(|n| n.to_str().into_owned()))
            .collect();
        Err(rustls::Error::InvalidCertificate(CertificateError::Other(
            rustls::OtherError(Arc::new(NameMismatch { tried, presented })),
        )))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, self.signatures())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, self.signatures())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.signatures().supported_schemes()
    }
}
