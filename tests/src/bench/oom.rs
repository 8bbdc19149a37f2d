//! OOM-kill events: kernel → user-space latency of `oom_kill` records. A helper in a fresh
//! memory cgroup limited to 16 MiB touches memory until the OOM killer picks it; the record's
//! kernel timestamp (`mark_victim`, CLOCK_MONOTONIC) is compared with the moment the bench's
//! ring-buffer reader holds the decoded event.

use std::time::Duration;

use anyhow::Context as _;
use node_agent::ebpf::{KernelEvent, KernelPrograms};

use super::{
    cgroups::BenchCgroup,
    mono_ns, quantile,
    report::{ms, Row},
};
use crate::Helper;

const SECTION: &str = "latency";

pub fn run(rows: &mut Vec<Row>, kills: usize) -> anyhow::Result<()> {
    let rt = crate::runtime();
    let mut programs = KernelPrograms::load().context("loading the kernel programs")?;
    let mut events = rt.block_on(async { programs.events() })?;
    let exe = std::env::current_exe().context("finding the bench binary")?;
    let mut latencies = Vec::with_capacity(kills);
    for _ in 0..kills {
        let cgroup = BenchCgroup::memory("oom")?;
        cgroup.set_memory_limit(16 << 20)?;
        let id = cgroup.id()?;
        let mut helper = Helper::spawn(&exe.to_string_lossy(), &["child".into(), "oom".into()])?;
        cgroup.add(helper.pid())?;
        helper.go()?;
        let received = rt.block_on(async {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                let batch = tokio::time::timeout_at(deadline, events.next_batch())
                    .await
                    .context("no oom_kill event within 10 s")??;
                let now = mono_ns();
                for record in batch {
                    if let Ok(KernelEvent::OomKill(e)) = record {
                        if e.cgroup_id == id {
                            return anyhow::Ok((e.header.ktime_ns, now));
                        }
                    }
                }
            }
        })?;
        helper.wait_killed(Duration::from_secs(10))?;
        latencies.push(received.1.saturating_sub(received.0) as f64);
    }
    let p50 = quantile(&latencies, 0.5).unwrap_or(f64::NAN);
    let p99 = quantile(&latencies, 0.99).unwrap_or(f64::NAN);
    rows.push(
        Row::info(SECTION, "OOM kill: kernel event → user space (p50 / p99)", format!("{} / {} ms", ms(p50), ms(p99)))
            .value(p99 / 1e6, "ms")
            .note(format!(
                "n = {}; a helper in a fresh 16 MiB memory cgroup touches memory until the OOM killer picks it; \
                 mark_victim's kernel timestamp → the decoded record in the bench's reader",
                latencies.len()
            )),
    );
    Ok(())
}
