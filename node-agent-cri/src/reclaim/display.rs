//! The plan as a person reads it (dry run, logs): one line per step, then what stays and why.

use std::fmt;

use super::{ContainerReason, KeptContainerReason, KeptImageReason, ReclaimPlan};

/// Binary units with one decimal, as `trace` prints sizes: `512 B`, `1.5 KiB`, `300.0 MiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// The first 13 characters of an ID without its `sha256:`, as `crictl` shortens them.
fn short(id: &str) -> &str {
    let id = id.strip_prefix("sha256:").unwrap_or(id);
    id.get(..13.min(id.len())).unwrap_or(id)
}

impl fmt::Display for ContainerReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ContainerReason::PodTerminated => f.write_str("its pod has terminated"),
            ContainerReason::PodGone => f.write_str("its pod no longer exists"),
            ContainerReason::OverPerContainerLimit { keep } => {
                write!(f, "older than the newest {keep} of its pod and name")
            }
            ContainerReason::OverNodeLimit { max } => {
                write!(f, "more than {max} dead containers on the node")
            }
        }
    }
}

impl fmt::Display for ReclaimPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.kinds.is_empty() {
            return write!(
                f,
                "node-level reclaim: nothing reclaims {} ({}); pods are evicted directly",
                self.signal, self.layout
            );
        }
        writeln!(
            f,
            "node-level reclaim for {} ({}): remove {} dead container(s) and {} unused image(s), expected to free {}",
            self.signal,
            self.layout,
            self.containers.len(),
            self.images.len(),
            human_bytes(self.expected_bytes()),
        )?;
        for c in &self.containers {
            let pod = if c.pod.name.is_empty() {
                "no pod".to_string()
            } else {
                format!("{}/{}", c.pod.namespace, c.pod.name)
            };
            let size = c.expected_bytes.map_or("size unknown".into(), human_bytes);
            writeln!(
                f,
                "  remove container {} {pod} {} (attempt {}, {}): {}; {size}",
                short(&c.id),
                c.name,
                c.attempt,
                c.state.as_str(),
                c.reason,
            )?;
        }
        for i in &self.images {
            let name = i.repo_tags.first().map_or("<untagged>", String::as_str);
            let used = i
                .last_used
                .map_or("never seen in use".into(), |t| format!("last used {t}"));
            let after = if i.after_containers.is_empty() {
                String::new()
            } else {
                format!(", after its {} container(s)", i.after_containers.len())
            };
            writeln!(
                f,
                "  remove image     {} {name} ({used}{after}); {}",
                short(&i.id),
                human_bytes(i.size_bytes),
            )?;
        }
        for k in &self.kept_images {
            let name = k.repo_tags.first().map_or("<untagged>", String::as_str);
            let why = match &k.reason {
                KeptImageReason::InUse { containers } => {
                    format!("in use by {} container(s)", containers.len())
                }
                KeptImageReason::Pinned => "pinned by the runtime".into(),
                KeptImageReason::Kept => "in the keep list".into(),
                KeptImageReason::TooNew { age_seconds } => {
                    format!("first seen {age_seconds}s ago, under the minimum age")
                }
            };
            writeln!(f, "  keep image       {} {name}: {why}", short(&k.id))?;
        }
        for k in &self.kept_containers {
            let why = match k.reason {
                KeptContainerReason::TooNew => "under the minimum age",
                KeptContainerReason::Newest => "newest of its pod and name",
            };
            writeln!(
                f,
                "  keep container   {} {} (attempt {}): {why}",
                short(&k.id),
                k.name,
                k.attempt
            )?;
        }
        Ok(())
    }
}
