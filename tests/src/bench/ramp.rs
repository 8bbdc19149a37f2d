//! The controlled memory ramp, seen from the bench: a helper process in a bench cgroup that
//! crosses a usage line on command and says when it did (see [`super::child`]).

use anyhow::{bail, Context as _};

use super::cgroups::BenchCgroup;
use crate::Helper;

/// The moment the allocator's own reading of the usage file first showed the line passed.
#[derive(Debug, Clone, Copy)]
pub struct Crossing {
    /// CLOCK_MONOTONIC ns just before the page whose charge crossed the line was touched.
    pub t_ns: u64,
    /// Usage read right after that page.
    pub usage: u64,
}

pub struct Ramp {
    helper: Helper,
    /// The line, in bytes of cgroup usage.
    pub line: u64,
    /// Usage at the bottom of the ramp, last seen.
    pub low: u64,
}

fn bench_exe() -> anyhow::Result<String> {
    let exe = std::env::current_exe().context("finding the bench binary")?;
    Ok(exe.to_string_lossy().into_owned())
}

impl Ramp {
    /// Anonymous memory: LOW MiB held, ramps to HIGH MiB; the line is `offset` bytes above the
    /// usage at LOW.
    pub fn anon(
        cgroup: &BenchCgroup,
        low_mib: usize,
        high_mib: usize,
        offset: u64,
    ) -> anyhow::Result<Self> {
        let usage = cgroup.usage_file()?;
        let args = [
            "child".to_string(),
            "ramp-anon".to_string(),
            usage.to_string_lossy().into_owned(),
            low_mib.to_string(),
            high_mib.to_string(),
            offset.to_string(),
        ];
        Self::start(&args, &[cgroup])
    }

    /// Page cache: reads `file` round and round while up; `extra` cgroups (the v2 cgroup PSI is
    /// read from) get the helper too.
    pub fn file(
        cgroup: &BenchCgroup,
        extra: &[&BenchCgroup],
        file: &std::path::Path,
        line: u64,
    ) -> anyhow::Result<Self> {
        let usage = cgroup.usage_file()?;
        let args = [
            "child".to_string(),
            "ramp-file".to_string(),
            usage.to_string_lossy().into_owned(),
            file.to_string_lossy().into_owned(),
            line.to_string(),
        ];
        let mut all = vec![cgroup];
        all.extend_from_slice(extra);
        Self::start(&args, &all)
    }

    fn start(args: &[String], cgroups: &[&BenchCgroup]) -> anyhow::Result<Self> {
        let mut helper = Helper::spawn(&bench_exe()?, args)?;
        for cg in cgroups {
            cg.add(helper.pid())?;
        }
        helper.go()?;
        let mut ramp = Self {
            helper,
            line: 0,
            low: 0,
        };
        ramp.read_low()?;
        Ok(ramp)
    }

    fn answer(&mut self) -> anyhow::Result<Vec<u64>> {
        let line = self.helper.read_line()?;
        let mut words = line.split_whitespace();
        let tag = words.next().unwrap_or("");
        let nums: Vec<u64> = words
            .map(|w| w.parse())
            .collect::<Result<_, _>>()
            .with_context(|| format!("ramp helper said {line:?}"))?;
        match (tag, nums.len()) {
            ("low", 2) | ("cross", 2) => Ok(std::iter::once(1).chain(nums).collect()),
            ("nocross", 1) => Ok(std::iter::once(0).chain(nums).collect()),
            ("", _) => bail!("the ramp helper exited (see its stderr above)"),
            _ => bail!("ramp helper said {line:?}, expected low/cross/nocross"),
        }
    }

    fn read_low(&mut self) -> anyhow::Result<u64> {
        let a = self.answer()?;
        anyhow::ensure!(
            a.len() == 3,
            "expected `low USAGE LINE` from the ramp helper"
        );
        self.low = a[1];
        self.line = a[2];
        Ok(self.low)
    }

    fn read_crossing(&mut self) -> anyhow::Result<Option<Crossing>> {
        let a = self.answer()?;
        Ok((a[0] == 1).then(|| Crossing {
            t_ns: a[1],
            usage: a[2],
        }))
    }

    /// Anonymous ramp: up to HIGH; returns once there.
    pub fn up(&mut self) -> anyhow::Result<Option<Crossing>> {
        self.helper.go()?;
        self.read_crossing()
    }

    /// File ramp: starts reading; [`Ramp::stop`] ends it.
    pub fn start_up(&mut self) -> anyhow::Result<()> {
        self.helper.go()
    }

    pub fn stop(&mut self) -> anyhow::Result<Option<Crossing>> {
        self.helper.go()?;
        self.read_crossing()
    }

    /// Back to the bottom of the ramp; returns the usage there.
    pub fn down(&mut self) -> anyhow::Result<u64> {
        self.helper.go()?;
        self.read_low()
    }
}
