//! Finding cgroup mounts from `/proc/self/mountinfo`.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("reading /proc/self/mountinfo")]
    Read(#[source] std::io::Error),
    #[error("no cgroup2 filesystem is mounted (looked in /proc/self/mountinfo)")]
    NoCgroup2,
}

/// The mount point of the cgroup v2 hierarchy: `/sys/fs/cgroup` on a unified host,
/// `/sys/fs/cgroup/unified` on a hybrid one.
pub fn cgroup2_mount() -> Result<PathBuf, MountError> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").map_err(MountError::Read)?;
    parse_cgroup2_mount(&text).ok_or(MountError::NoCgroup2)
}

/// Parses mountinfo text (proc(5)). Returns the first cgroup2 mount point.
pub fn parse_cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo
        .lines()
        .filter_map(MountLine::parse)
        .find(|mount| mount.fstype == "cgroup2")
        .map(|mount| mount.mount_point)
}

/// One line of mountinfo (proc(5)): `id parent major:minor root mountpoint options [optional
/// fields...] - fstype source superoptions`.
pub(super) struct MountLine<'a> {
    pub mount_point: PathBuf,
    pub fstype: &'a str,
    /// For cgroup v1 these name the controllers bound to the hierarchy (`rw,cpu,cpuacct`).
    pub super_options: &'a str,
}

impl<'a> MountLine<'a> {
    /// `None` when the line does not have mountinfo's shape.
    pub fn parse(line: &'a str) -> Option<Self> {
        let (left, right) = line.split_once(" - ")?;
        let mount_point = left.split_whitespace().nth(4)?;
        let mut right = right.split_whitespace();
        let fstype = right.next()?;
        let _source = right.next()?;
        let super_options = right.next()?;
        Some(Self {
            mount_point: PathBuf::from(unescape_octal(mount_point)),
            fstype,
            super_options,
        })
    }
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_octal(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = bytes
            .get(i + 1..i + 4)
            .filter(|digits| bytes[i] == b'\\' && digits.iter().all(|b| (b'0'..=b'7').contains(b)))
            .map(|digits| digits.iter().fold(0u32, |v, d| v * 8 + u32::from(d - b'0')))
            .and_then(|v| u8::try_from(v).ok());
        if let Some(v) = escaped {
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
25 30 0:23 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid shared:5 - cgroup2 cgroup2 rw,nsdelegate
27 25 0:25 / /sys/fs/cgroup/memory rw,nosuid shared:6 - cgroup cgroup rw,memory
";
    const UNIFIED: &str = "\
22 1 0:21 / / rw - ext4 /dev/vda rw
30 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw
";
    const NONE: &str = "22 1 0:21 / / rw - ext4 /dev/vda rw\n";
    const ESCAPED: &str = "30 22 0:26 / /mnt/cg\\040two rw - cgroup2 cgroup2 rw\n";
    const BAD_ESCAPE: &str = "30 22 0:26 / /mnt/cg\\777 rw - cgroup2 cgroup2 rw\n";

    #[test]
    fn finds_the_cgroup2_mount_in_each_layout() {
        let cases: &[(&str, &str, Option<&str>)] = &[
            (
                "hybrid host mounts v2 under unified",
                HYBRID,
                Some("/sys/fs/cgroup/unified"),
            ),
            (
                "unified host mounts v2 at the top",
                UNIFIED,
                Some("/sys/fs/cgroup"),
            ),
            ("no cgroup2 mount at all", NONE, None),
            ("escaped space in mount point", ESCAPED, Some("/mnt/cg two")),
            (
                "out-of-range escape kept as written",
                BAD_ESCAPE,
                Some("/mnt/cg\\777"),
            ),
        ];
        for (name, text, want) in cases {
            assert_eq!(
                parse_cgroup2_mount(text).as_deref(),
                want.map(std::path::Path::new),
                "{name}"
            );
        }
    }
}
