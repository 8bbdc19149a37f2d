//! The cluster's certificates and keys, laid out as kubeadm lays them out under
//! `/etc/kubernetes/pki` (here `<cluster>/pki`), and the kubeconfig files of its clients.
//!
//! Made once per cluster directory and kept (a second `up` reuses them). What is the same as
//! kubeadm's: a cluster CA that signs the API server's serving certificate, every client
//! certificate and (through the controller manager) CSRs; a separate etcd CA; the service
//! account signing key pair `sa.key`/`sa.pub`. What differs, and why: ECDSA P-256 keys
//! throughout (kubeadm's default is RSA 2048; Kubernetes takes either, and these are made in
//! milliseconds); the kubelet's client certificate is issued here directly instead of through
//! a bootstrap token and its CSR (nothing on this box needs the bootstrap flow; the kubelet's
//! *serving* certificate is its own self-signed one, as kubeadm's, or a CSR with
//! `serverTLSBootstrap`); no front-proxy CA (no aggregated API server runs).

use std::{
    fs,
    io::Write as _,
    net::IpAddr,
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// How long the certificates made here are valid. A cluster on a developer's box lives hours;
/// a year keeps a long-lived one working without rotation.
const VALIDITY_DAYS: i64 = 365;

/// A certificate authority: its certificate file and what signs with it.
pub struct Authority {
    pub cert: PathBuf,
    issuer: Issuer<'static, KeyPair>,
}

/// One certificate to issue.
pub struct Leaf<'a> {
    /// The file stem under the PKI directory: `<stem>.crt`, `<stem>.key`.
    pub stem: &'a str,
    pub common_name: &'a str,
    pub organizations: &'a [&'a str],
    pub server_names: &'a [String],
    pub client: bool,
}

fn base_params(common_name: &str, organizations: &[&str]) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    for org in organizations {
        params
            .distinguished_name
            .push(DnType::OrganizationName, *org);
    }
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(VALIDITY_DAYS);
    params
}

/// Writes `content` to `path` with `mode`, replacing it.
pub fn write_private(path: &Path, content: &[u8], mode: u32) -> anyhow::Result<()> {
    let _ = fs::remove_file(path);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(content)
        .with_context(|| format!("writing {}", path.display()))
}

impl Authority {
    /// Makes a CA named `common_name` as `<dir>/<stem>.crt` and `.key`, or loads the one there.
    pub fn create_or_load(dir: &Path, stem: &str, common_name: &str) -> anyhow::Result<Self> {
        let cert = dir.join(format!("{stem}.crt"));
        let key_path = dir.join(format!("{stem}.key"));
        if cert.is_file() && key_path.is_file() {
            let key_pem = fs::read_to_string(&key_path)
                .with_context(|| format!("reading {}", key_path.display()))?;
            let key = KeyPair::from_pem(&key_pem)
                .with_context(|| format!("{} is not a private key", key_path.display()))?;
            let cert_pem =
                fs::read_to_string(&cert).with_context(|| format!("reading {}", cert.display()))?;
            let issuer = Issuer::from_ca_cert_pem(&cert_pem, key)
                .with_context(|| format!("{} is not a CA certificate", cert.display()))?;
            return Ok(Self { cert, issuer });
        }
        let key = KeyPair::generate().context("generating a CA key")?;
        let mut params = base_params(common_name, &[]);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_after = time::OffsetDateTime::now_utc() + time::Duration::days(10 * 365);
        let ca = params
            .self_signed(&key)
            .with_context(|| format!("signing the CA {common_name}"))?;
        write_private(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
        write_private(&cert, ca.pem().as_bytes(), 0o644)?;
        Ok(Self {
            cert,
            issuer: Issuer::new(params, key),
        })
    }

    /// Issues `leaf` under `dir` unless its files are there already; returns the paths.
    pub fn issue(&self, dir: &Path, leaf: &Leaf<'_>) -> anyhow::Result<(PathBuf, PathBuf)> {
        let cert = dir.join(format!("{}.crt", leaf.stem));
        let key_path = dir.join(format!("{}.key", leaf.stem));
        if cert.is_file() && key_path.is_file() {
            return Ok((cert, key_path));
        }
        let key = KeyPair::generate().context("generating a key")?;
        let mut params = base_params(leaf.common_name, leaf.organizations);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        if leaf.client {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ClientAuth);
        }
        if !leaf.server_names.is_empty() {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ServerAuth);
            for name in leaf.server_names {
                params.subject_alt_names.push(match name.parse::<IpAddr>() {
                    Ok(ip) => SanType::IpAddress(ip),
                    Err(_) => SanType::DnsName(
                        name.clone()
                            .try_into()
                            .with_context(|| format!("{name:?} is not a DNS name"))?,
                    ),
                });
            }
        }
        let signed = params
            .signed_by(&key, &self.issuer)
            .with_context(|| format!("signing {}", leaf.stem))?;
        write_private(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
        write_private(&cert, signed.pem().as_bytes(), 0o644)?;
        Ok((cert, key_path))
    }
}

/// The service account signing key pair (`sa.key`, `sa.pub`), made once.
pub fn service_account_keys(dir: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
    let private = dir.join("sa.key");
    let public = dir.join("sa.pub");
    if private.is_file() && public.is_file() {
        return Ok((private, public));
    }
    let key = KeyPair::generate().context("generating the service account key")?;
    write_private(&private, key.serialize_pem().as_bytes(), 0o600)?;
    write_private(&public, key.public_key_pem().as_bytes(), 0o644)?;
    Ok((private, public))
}

/// A kubeconfig for one client certificate, with everything embedded (it stays valid if the
/// directory moves, and can be handed to a user).
pub fn kubeconfig(
    server: &str,
    ca: &Path,
    cert: &Path,
    key: &Path,
    user: &str,
) -> anyhow::Result<String> {
    let b64 = |p: &Path| -> anyhow::Result<String> {
        let bytes = fs::read(p).with_context(|| format!("reading {}", p.display()))?;
        Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
    };
    Ok(format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: node-agent\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: {user}\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\ncontexts:\n- name: {user}@node-agent\n  context:\n    cluster: node-agent\n    user: {user}\ncurrent-context: {user}@node-agent\n",
        ca = b64(ca)?,
        cert = b64(cert)?,
        key = b64(key)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_is_made_once_and_loaded_after() {
        let dir = tempfile::tempdir().unwrap();
        let first = Authority::create_or_load(dir.path(), "ca", "test-ca").unwrap();
        let pem = fs::read_to_string(&first.cert).unwrap();
        let again = Authority::create_or_load(dir.path(), "ca", "test-ca").unwrap();
        assert_eq!(fs::read_to_string(&again.cert).unwrap(), pem);
        let mode = fs::metadata(dir.path().join("ca.key")).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o600
        );
    }

    #[test]
    fn a_leaf_is_issued_once_with_its_key_private() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Authority::create_or_load(dir.path(), "ca", "test-ca").unwrap();
        let names = vec!["127.0.0.1".to_string(), "kubernetes".to_string()];
        let (cert, key) = ca
            .issue(
                dir.path(),
                &Leaf {
                    stem: "apiserver",
                    common_name: "kube-apiserver",
                    organizations: &[],
                    server_names: &names,
                    client: false,
                },
            )
            .unwrap();
        assert!(cert.is_file() && key.is_file());
        let mode = fs::metadata(&key).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        let pem = fs::read_to_string(&cert).unwrap();
        let (again, _) = ca
            .issue(
                dir.path(),
                &Leaf {
                    stem: "apiserver",
                    common_name: "other",
                    organizations: &[],
                    server_names: &names,
                    client: false,
                },
            )
            .unwrap();
        assert_eq!(fs::read_to_string(again).unwrap(), pem);
    }
}
