//! OCI images written by the test itself, no registry: one gzip layer, a config and a
//! manifest in an OCI image layout, packed in a tar that `ctr images import` reads.
//!
//! The layout (image-spec v1.0): `oci-layout`, `index.json` naming the manifest with the
//! `io.containerd.image.name` annotation (the name containerd gives the image), and
//! `blobs/sha256/<digest>` for the layer, the config and the manifest.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use serde_json::json;
use sha2::{Digest as _, Sha256};

/// Debian's busybox-static: one static binary that is a whole userland.
pub const BUSYBOX: &str = "/bin/busybox";
/// Applets the tests use, linked to busybox in `/bin`.
const APPLETS: &[&str] = &[
    "sh", "sleep", "cat", "echo", "dd", "ls", "mkdir", "rm", "true",
];

/// One file of a layer.
#[derive(Debug, Clone)]
pub enum Entry {
    Dir(String),
    File {
        path: String,
        mode: u32,
        data: Vec<u8>,
    },
    Symlink {
        path: String,
        target: String,
    },
}

/// An image of one layer.
#[derive(Debug, Clone)]
pub struct ImageSpec {
    /// The name containerd gives it, e.g. `localhost/node-agent-test/busybox:1`.
    pub name: String,
    pub entries: Vec<Entry>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
}

/// What was written.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    pub name: String,
    pub tar: PathBuf,
    /// `sha256:<config digest>`: the image ID containerd reports.
    pub id: String,
    /// Compressed layer plus config and manifest: what the image's content takes.
    pub content_bytes: u64,
}

impl ImageSpec {
    /// busybox with a few applets, `/tmp` and the directories a runtime mounts over.
    pub fn busybox(name: &str) -> anyhow::Result<Self> {
        let data = std::fs::read(BUSYBOX).with_context(|| {
            format!("reading {BUSYBOX} (Debian's busybox-static; `cargo xtask setup` installs it)")
        })?;
        let mut entries = vec![
            Entry::Dir("bin".into()),
            Entry::Dir("dev".into()),
            Entry::Dir("etc".into()),
            Entry::Dir("proc".into()),
            Entry::Dir("sys".into()),
            Entry::Dir("tmp".into()),
            Entry::Dir("data".into()),
            Entry::File {
                path: "bin/busybox".into(),
                mode: 0o755,
                data,
            },
        ];
        entries.extend(APPLETS.iter().map(|a| Entry::Symlink {
            path: format!("bin/{a}"),
            target: "busybox".into(),
        }));
        Ok(Self {
            name: name.into(),
            entries,
            entrypoint: vec![],
            cmd: vec!["/bin/sh".into()],
        })
    }

    /// Adds `bytes` of incompressible data at `/data/<file>`, so the image takes that much
    /// disk whatever the compression; `seed` makes images differ (distinct IDs).
    pub fn with_filler(mut self, file: &str, bytes: usize, seed: u64) -> Self {
        self.entries.push(Entry::File {
            path: format!("data/{file}"),
            mode: 0o644,
            data: noise(bytes, seed),
        });
        self
    }

    pub fn with_cmd(mut self, cmd: &[&str]) -> Self {
        self.cmd = cmd.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Writes the image as an OCI-layout tar at `out`.
    pub fn write(&self, out: &Path) -> anyhow::Result<BuiltImage> {
        let layer_tar = self.layer_tar()?;
        let diff_id = sha256(&layer_tar);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&layer_tar)?;
        let layer = gz.finish()?;
        let config = serde_json::to_vec(&json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Entrypoint": self.entrypoint,
                "Cmd": self.cmd,
                "Env": ["PATH=/bin"],
                "WorkingDir": "/",
            },
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }))?;
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": descriptor("application/vnd.oci.image.config.v1+json", &config),
            "layers": [descriptor("application/vnd.oci.image.layer.v1.tar+gzip", &layer)],
        }))?;
        let mut manifest_desc = descriptor("application/vnd.oci.image.manifest.v1+json", &manifest);
        manifest_desc["annotations"] = json!({
            "io.containerd.image.name": self.name,
            "org.opencontainers.image.ref.name": self.name.rsplit(':').next().unwrap_or("latest"),
        });
        let index = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [manifest_desc],
        }))?;

        let file =
            std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
        let mut tar = tar::Builder::new(std::io::BufWriter::new(file));
        append(
            &mut tar,
            "oci-layout",
            br#"{"imageLayoutVersion":"1.0.0"}"#,
            0o644,
        )?;
        append(&mut tar, "index.json", &index, 0o644)?;
        for blob in [&layer, &config, &manifest] {
            let hex = sha256(blob).trim_start_matches("sha256:").to_string();
            append(&mut tar, &format!("blobs/sha256/{hex}"), blob, 0o644)?;
        }
        tar.into_inner()?.flush()?;
        Ok(BuiltImage {
            name: self.name.clone(),
            tar: out.to_path_buf(),
            id: sha256(&config),
            content_bytes: (layer.len() + config.len() + manifest.len()) as u64,
        })
    }

    fn layer_tar(&self) -> anyhow::Result<Vec<u8>> {
        let mut tar = tar::Builder::new(Vec::new());
        for entry in &self.entries {
            let mut header = tar::Header::new_gnu();
            header.set_mtime(0);
            header.set_uid(0);
            header.set_gid(0);
            match entry {
                Entry::Dir(path) => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(0o755);
                    header.set_size(0);
                    tar.append_data(&mut header, path, std::io::empty())?;
                }
                Entry::File { path, mode, data } => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_mode(*mode);
                    header.set_size(data.len() as u64);
                    tar.append_data(&mut header, path, data.as_slice())?;
                }
                Entry::Symlink { path, target } => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_mode(0o777);
                    header.set_size(0);
                    tar.append_link(&mut header, path, target)?;
                }
            }
        }
        Ok(tar.into_inner()?)
    }
}

fn sha256(data: &[u8]) -> String {
    let digest = Sha256::digest(data);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

fn descriptor(media_type: &str, blob: &[u8]) -> serde_json::Value {
    json!({"mediaType": media_type, "digest": sha256(blob), "size": blob.len()})
}

fn append<W: std::io::Write>(
    tar: &mut tar::Builder<W>,
    path: &str,
    data: &[u8],
    mode: u32,
) -> anyhow::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(mode);
    header.set_size(data.len() as u64);
    header.set_mtime(0);
    tar.append_data(&mut header, path, data)?;
    Ok(())
}

/// Incompressible bytes (xorshift64*), cheap to make.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        out.extend_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}
