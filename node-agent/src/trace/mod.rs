//! `node-agent trace`: what the kernel reports, live.

use std::{path::PathBuf, time::Duration};

use anyhow::Context as _;

use crate::{cgroup, ebpf::KernelPrograms};

#[derive(Debug, clap::Args)]
pub struct TraceArgs {
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long, value_name = "SECONDS")]
    pub duration: Option<u64>,
}

/// Tracks every top-level cgroup v2 directory and prints their forks and exits each second.
pub fn run(args: TraceArgs) -> anyhow::Result<()> {
    let root = cgroup::cgroup2_mount()?;
    let mut programs = KernelPrograms::load()?;
    let mut tracked: Vec<(PathBuf, u64)> = Vec::new();
    for entry in std::fs::read_dir(&root).with_context(|| format!("listing {}", root.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            let id = cgroup::cgroup_id(&path)?;
            programs.track_cgroup(id)?;
            tracked.push((path, id));
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let deadline = args.duration.map(Duration::from_secs);
        let started = tokio::time::Instant::now();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        println!("{:<40} {:>8} {:>8}", "CGROUP", "FORKS/s", "EXITS/s");
        let mut last = vec![Default::default(); tracked.len()];
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = tokio::signal::ctrl_c() => return anyhow::Ok(()),
            }
            for ((path, id), last) in tracked.iter().zip(last.iter_mut()) {
                let Some(now) = programs.task_counts(*id)? else {
                    continue;
                };
                let last_counts: &node_agent_common::TaskCounts = last;
                let (forks, exits) = (now.forks - last_counts.forks, now.exits - last_counts.exits);
                if forks + exits > 0 {
                    let rel = path.strip_prefix(&root).unwrap_or(path);
                    println!("{:<40} {:>8} {:>8}", rel.display(), forks, exits);
                }
                *last = now;
            }
            if deadline.is_some_and(|d| started.elapsed() >= d) {
                return Ok(());
            }
        }
    })
}
