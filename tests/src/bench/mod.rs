//! The benchmark behind `cargo xtask bench`. Each module measures one thing on the real kernel
//! and returns [`Row`]s; [`report`] turns them into the markdown tables and the JSON record.
//! The method of every row is fixed in docs/benchmarks.md (*Method*) before its figures.
//!
//! - [`stats`]: estimates with 95 % intervals; targets are judged at the interval's
//!   unfavourable end.
//! - [`latency`]: a controlled memory ramp crosses a line; the eBPF path, the cgroup v1 eventfd
//!   threshold and 1 s / 10 s pollers detect it ([`ramp`] drives the allocator).
//! - [`e2e`]: the release daemon (`node-agent run`) against a fake kubelet/API server: a pod's
//!   ramp crosses `memory.available` → the eviction request arrives ([`kube`]: the fake
//!   cluster, the pods and the daemon's one config text).
//! - [`psi`]: a PSI trigger on the same kind of ramp, pushed into reclaim.
//! - [`overhead`]: fork+exit and page-fault loops with no programs, with every line far and
//!   with a line near (the sampler's two paces), a spinner measuring the same, and each
//!   program's cost per invocation.
//! - [`stress`]: stress-ng's `vm` and `fork` stressors with `node-agent run` and with a line
//!   near, one worker pinned and one per CPU.
//! - [`throughput`]: events drained without loss, an overflowed ring, a bounded fork storm.
//! - [`footprint`]: idle CPU and RSS of `node-agent trace` (100 and 1000 pod cgroups) and of
//!   the daemon in Kubernetes mode (110 and 250 pods).
//! - [`idle`]: what the idle daemon costs the node (timer wake-ups, busy + steal), read by
//!   [`meter`], and the meter checked against a known load.
//! - [`policy`]: `evaluate()` time for 110 and 1000 pods.
//! - [`fexit`]: the fexit path, run inside the VMs of `cargo xtask bench` (emulated).
//!
//! Every cgroup it creates is named `node-agent-bench-<pid>-...` and removed on drop; stale
//! ones from a killed run are removed at start ([`cgroups::remove_stale`]).

pub mod cgroups;
pub mod child;
pub mod e2e;
pub mod fexit;
pub mod footprint;
pub mod idle;
pub mod kube;
pub mod latency;
pub mod meter;
pub mod oom;
pub mod overhead;
pub mod policy;
pub mod psi;
pub mod ramp;
pub mod report;
pub mod stats;
pub mod stress;
pub mod throughput;

use anyhow::Context as _;

pub use report::{Report, Row, Verdict};

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of `bpf_ktime_get_ns()`, so kernel event
/// timestamps and user-space times compare directly.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// The value at quantile `q` (0..=1) of `values`, nearest rank; `None` when empty.
pub fn quantile(values: &[f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

pub fn median(values: &[f64]) -> Option<f64> {
    quantile(values, 0.5)
}

/// Pins the calling thread (and so every process it starts) to the last online CPU until
/// dropped, then restores the CPUs it had.
pub struct PinnedCpu(libc::cpu_set_t);

impl PinnedCpu {
    pub fn last() -> anyhow::Result<Self> {
        // SAFETY: cpu_set_t is plain data; sched_getaffinity/sched_setaffinity read and write
        // only the sets passed, of the size passed.
        unsafe {
            let mut old: libc::cpu_set_t = std::mem::zeroed();
            let size = std::mem::size_of::<libc::cpu_set_t>();
            if libc::sched_getaffinity(0, size, &mut old) != 0 {
                anyhow::bail!("sched_getaffinity: {}", std::io::Error::last_os_error());
            }
            let cpu = (0..libc::CPU_SETSIZE as usize)
                .rev()
                .find(|&c| libc::CPU_ISSET(c, &old))
                .context("this process may run on no CPU")?;
            let mut one: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut one);
            if libc::sched_setaffinity(0, size, &one) != 0 {
                anyhow::bail!("pinning to CPU {cpu}: {}", std::io::Error::last_os_error());
            }
            Ok(Self(old))
        }
    }
}

impl Drop for PinnedCpu {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe {
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.0);
        }
    }
}

/// A small xorshift generator for random phases and names: reproducible enough, no dependency.
pub struct Rng(u64);

impl Rng {
    pub fn from_clock() -> Self {
        Self(mono_ns() | 1)
    }

    /// A generator that always gives the same sequence (the statistics' resampling).
    pub fn seeded(seed: u64) -> Self {
        Self(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[0, max)`.
    pub fn duration(&mut self, max: std::time::Duration) -> std::time::Duration {
        max.mul_f64(self.unit())
    }

    /// `n` lowercase hex digits.
    pub fn hex(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| char::from_digit((self.next_u64() % 16) as u32, 16).unwrap_or('0'))
            .collect()
    }

    /// A random pod UID in the canonical 8-4-4-4-12 form.
    pub fn uuid(&mut self) -> String {
        format!(
            "{}-{}-{}-{}-{}",
            self.hex(8),
            self.hex(4),
            self.hex(4),
            self.hex(4),
            self.hex(12)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_use_the_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let cases = [(0.5, 50.0), (0.99, 99.0), (1.0, 100.0), (0.0, 1.0)];
        for (q, want) in cases {
            assert_eq!(quantile(&v, q), Some(want), "q = {q}");
        }
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
    }
}
