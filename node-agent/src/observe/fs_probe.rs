//! Filesystem readings off the loop: a `stat` and `statvfs` of one path, on a thread of its own,
//! with a deadline. A filesystem that stops answering (a hung NFS or FUSE mount, a dying disk)
//! blocks that thread in the kernel, never the loop: the loop waits at most [`WAIT`] for the
//! reading it asked for ([`FIRST_WAIT`] for a probe's first), and while an earlier one is still
//! out it does not wait at all.
//!
//! A reading that is merely slow does not flap the signal: until the call has been out for
//! [`HUNG_AFTER`], the last reading (if younger than [`STALE_AFTER`]) stands in; after that the
//! filesystem's signals are unknown, naming the path and for how long it has not answered.
//! One thread per probe, created once, and the call itself made by a helper process of the
//! thread's ([`crate::fs_helper`]): a hung call ties up that thread and its helper only, no new
//! call is made while it is out, and SIGTERM ends the agent whatever the helper waits for.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Condvar, Mutex},
    time::{Duration, Instant},
};

use crate::fs_helper::{Answer, FsFigures, Helper, Request};

/// How long the loop waits for a reading it asked for.
pub const WAIT: Duration = Duration::from_millis(50);
/// How long it waits for a probe's very first reading, which no earlier one can stand in for
/// (a thread just started on a loaded node may take longer than [`WAIT`] to be scheduled).
pub const FIRST_WAIT: Duration = Duration::from_secs(1);
/// A call out this long counts as hung: the filesystem's signals are unknown.
pub const HUNG_AFTER: Duration = Duration::from_secs(2);
/// The last reading stands in for a slow call for at most this long.
pub const STALE_AFTER: Duration = Duration::from_secs(10);

/// One filesystem as `statvfs` and `stat` see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStats {
    /// `st_dev` of the path: two paths on one filesystem share it.
    pub device: u64,
    pub avail_bytes: i64,
    pub total_bytes: i64,
    pub avail_inodes: i64,
    pub total_inodes: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    #[error("statfs {path}: {error}")]
    Io { path: PathBuf, error: String },
    #[error("statfs {path} has not answered for {for_:.1?} (a hung filesystem?)")]
    NotAnswering { path: PathBuf, for_: Duration },
}

#[derive(Debug, Default)]
struct Slot {
    /// A reading is asked for and not taken yet.
    asked: bool,
    /// The call in progress started then.
    busy_since: Option<Instant>,
    /// Bumped by every finished call.
    done: u64,
    last: Option<Result<FsStats, ProbeError>>,
    /// The last good reading and when it was taken.
    good: Option<(Instant, FsStats)>,
    stop: bool,
}

struct Shared {
    path: PathBuf,
    slot: Mutex<Slot>,
    changed: Condvar,
}

/// A path whose filesystem is read on demand, off the loop.
pub struct FsProbe {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FsProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsProbe")
            .field("path", &self.shared.path)
            .finish()
    }
}

impl Drop for FsProbe {
    fn drop(&mut self) {
        let mut slot = lock(&self.shared.slot);
        slot.stop = true;
        self.shared.changed.notify_all();
    }
}

fn lock(m: &Mutex<Slot>) -> std::sync::MutexGuard<'_, Slot> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl FsProbe {
    /// Starts the probe's thread; nothing is read until asked.
    pub fn new(path: &Path) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            path: path.to_path_buf(),
            slot: Mutex::new(Slot::default()),
            changed: Condvar::new(),
        });
        let worker = shared.clone();
        std::thread::Builder::new()
            .name("fs-probe".into())
            .spawn(move || serve(&worker))?;
        Ok(Self { shared })
    }

    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// A reading of the filesystem now, or as described in the module docs when it is slow.
    pub fn read(&self) -> Result<FsStats, ProbeError> {
        let first = lock(&self.shared.slot).done == 0;
        self.read_at(Instant::now(), if first { FIRST_WAIT } else { WAIT })
    }

    fn read_at(&self, now: Instant, wait: Duration) -> Result<FsStats, ProbeError> {
        let shared = &*self.shared;
        let mut slot = lock(&shared.slot);
        if slot.busy_since.is_none() && !slot.asked {
            // Ask, and wait a little for this very reading.
            slot.asked = true;
            let before = slot.done;
            shared.changed.notify_all();
            let (s, _) = shared
                .changed
                .wait_timeout_while(slot, wait, |s| s.done == before)
                .unwrap_or_else(|p| p.into_inner());
            slot = s;
            if slot.done != before {
                return slot.last.clone().expect("a finished call left its result");
            }
        }
        // The call is still out: a recent reading stands in until it counts as hung.
        let out_for = slot
            .busy_since
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        match slot.good {
            Some((at, stats))
                if out_for < HUNG_AFTER && now.saturating_duration_since(at) < STALE_AFTER =>
            {
                Ok(stats)
            }
            _ if out_for < HUNG_AFTER => match &slot.last {
                Some(Err(e)) => Err(e.clone()),
                _ => Err(ProbeError::NotAnswering {
                    path: shared.path.clone(),
                    for_: out_for,
                }),
            },
            _ => Err(ProbeError::NotAnswering {
                path: shared.path.clone(),
                for_: out_for,
            }),
        }
    }
}

fn serve(shared: &Shared) {
    // Started at the first reading (or again after it ended); killed when this thread ends.
    let mut helper: Option<Helper> = None;
    loop {
        {
            let mut slot = lock(&shared.slot);
            while !slot.asked && !slot.stop {
                slot = shared.changed.wait(slot).unwrap_or_else(|p| p.into_inner());
            }
            if slot.stop {
                return;
            }
            slot.asked = false;
            slot.busy_since = Some(Instant::now());
        }
        let result = stat_through(&mut helper, &shared.path);
        let mut slot = lock(&shared.slot);
        if let Ok(stats) = &result {
            slot.good = Some((Instant::now(), *stats));
        }
        slot.last = Some(result);
        slot.busy_since = None;
        slot.done += 1;
        shared.changed.notify_all();
    }
}

/// `stat` and `statvfs` of `path`, through the thread's helper process when helpers are in
/// use (started here, and again after one ended), else in this process.
fn stat_through(helper: &mut Option<Helper>, path: &Path) -> Result<FsStats, ProbeError> {
    let io = |error: String| ProbeError::Io {
        path: path.to_path_buf(),
        error,
    };
    if helper.is_none() {
        *helper = Helper::start().map_err(|e| io(crate::error_chain(&e)))?;
    }
    let Some(h) = helper else {
        return stat(path);
    };
    match h.ask(&Request::StatFs(path.to_path_buf())) {
        Ok(Answer::StatFs(figures)) => figures.map(FsStats::from).map_err(io),
        Ok(other) => Err(io(format!("the filesystem helper answered {other:?}"))),
        Err(e) => {
            *helper = None;
            Err(io(crate::error_chain(&e)))
        }
    }
}

/// `stat` and `statvfs` of `path`, in this process.
pub fn stat(path: &Path) -> Result<FsStats, ProbeError> {
    crate::fs_helper::statfs(path)
        .map(FsStats::from)
        .map_err(|error| ProbeError::Io {
            path: path.to_path_buf(),
            error,
        })
}

impl From<FsFigures> for FsStats {
    fn from(f: FsFigures) -> Self {
        Self {
            device: f.device,
            avail_bytes: f.avail_bytes,
            total_bytes: f.total_bytes,
            avail_inodes: f.avail_inodes,
            total_inodes: f.total_inodes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_filesystem_and_names_a_path_that_is_not_there() {
        let probe = FsProbe::new(Path::new("/")).unwrap();
        let root = probe.read().expect("/ is readable");
        assert!(root.total_bytes > 0 && root.avail_bytes <= root.total_bytes);
        let again = probe.read().expect("a second reading");
        assert_eq!(again.device, root.device);
        let missing = FsProbe::new(Path::new("/no/such/dir")).unwrap();
        let err = missing.read().unwrap_err();
        assert!(
            matches!(&err, ProbeError::Io { path, .. } if path == Path::new("/no/such/dir")),
            "{err}"
        );
    }

    /// A call that does not come back: no new call is asked for while it is out; the last good
    /// reading stands in until the call counts as hung, then the path is named as not
    /// answering.
    #[test]
    fn a_hung_call_is_waited_for_once_then_reported_not_answering() {
        let probe = FsProbe::new(Path::new("/")).unwrap();
        let good = probe.read().unwrap();
        // Park the worker as a hung statfs would: the slot says busy since `t0`, and the
        // worker never finishes that call.
        let t0 = Instant::now();
        {
            let mut slot = lock(&probe.shared.slot);
            slot.busy_since = Some(t0);
            slot.asked = false;
        }
        let rows = [
            (
                "slow, not hung: the last reading stands in",
                Duration::from_millis(100),
                Ok(good),
            ),
            ("hung", HUNG_AFTER + Duration::from_millis(1), Err(())),
        ];
        for (what, after, want) in rows {
            let got = probe.read_at(t0 + after, WAIT);
            match (want, got) {
                (Ok(w), Ok(g)) => assert_eq!(w, g, "{what}"),
                (Err(()), Err(ProbeError::NotAnswering { for_, .. })) => {
                    assert!(for_ > HUNG_AFTER, "{what}: {for_:?}")
                }
                (w, g) => panic!("{what}: want {w:?}, got {g:?}"),
            }
        }
        // While the call is out, a reading asks for nothing more (and so waits for nothing).
        let _ = probe.read_at(t0 + HUNG_AFTER * 2, Duration::from_secs(3600));
        assert!(
            !lock(&probe.shared.slot).asked,
            "no second call is asked for"
        );
    }
}
