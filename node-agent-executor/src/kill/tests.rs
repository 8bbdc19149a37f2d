//! The round logic against a table of processes: who is signalled, and what is never touched.

use std::{
    collections::BTreeSet,
    io,
    path::{Path, PathBuf},
    time::Duration,
};

use super::*;

/// A process: its id, whether it is in the pod's cgroup, and whether it is alive.
#[derive(Debug, Clone)]
struct Proc {
    pid: u32,
    in_pod: bool,
    alive: bool,
}

/// What a test does to the world at each listing (its number): forks, exits, reuse.
type OnList = Box<dyn FnMut(usize, &mut Vec<Proc>)>;

/// A little world of processes. Each pin gets a serial number, so a reused id is another
/// process. `on_list` lets a test change the world between listings (forks, exits, reuse).
struct Table {
    cgroup_id: Option<u64>,
    procs: Vec<Proc>,
    listings: usize,
    on_list: OnList,
    killed: Vec<u32>,
    released: usize,
    release_errno: Option<i32>,
}

impl Table {
    fn new(procs: &[(u32, bool)]) -> Self {
        Self {
            cgroup_id: Some(7),
            procs: procs
                .iter()
                .map(|&(pid, in_pod)| Proc {
                    pid,
                    in_pod,
                    alive: true,
                })
                .collect(),
            listings: 0,
            on_list: Box::new(|_, _| {}),
            killed: Vec::new(),
            released: 0,
            release_errno: None,
        }
    }
}

impl Processes for Table {
    /// The index of the process pinned.
    type Pinned = usize;

    fn cgroup_id(&mut self, _: &Path) -> Result<Option<u64>, KillError> {
        Ok(self.cgroup_id)
    }

    fn list(&mut self, _: &Path) -> Result<BTreeSet<u32>, KillError> {
        let n = self.listings;
        self.listings += 1;
        (self.on_list)(n, &mut self.procs);
        Ok(self
            .procs
            .iter()
            .filter(|p| p.in_pod && p.alive)
            .map(|p| p.pid)
            .collect())
    }

    fn pin(&mut self, pid: u32) -> Option<usize> {
        self.procs.iter().rposition(|p| p.pid == pid && p.alive)
    }

    fn alive(&mut self, pinned: &usize) -> bool {
        self.procs[*pinned].alive
    }

    fn kill(&mut self, _pid: u32, pinned: &usize) -> io::Result<bool> {
        let p = &mut self.procs[*pinned];
        assert!(p.in_pod, "process {} outside the pod was signalled", p.pid);
        p.alive = false;
        self.killed.push(p.pid);
        Ok(true)
    }

    fn release(&mut self, _: &usize) -> Result<bool, i32> {
        match self.release_errno {
            Some(e) => Err(e),
            None => {
                self.released += 1;
                Ok(true)
            }
        }
    }
}

fn target() -> KillTarget {
    KillTarget {
        pod_uid: "uid".into(),
        cgroup: PathBuf::from("/sys/fs/cgroup/memory/kubepods/burstable/poduid"),
        cgroup_id: 7,
    }
}

const LONG: Duration = Duration::from_secs(5);

#[test]
fn every_process_of_the_pod_is_killed_and_released_and_nothing_else() {
    let mut t = Table::new(&[(10, true), (11, true), (12, false), (13, true)]);
    let signalled = kill_pod(&mut t, &target(), LONG).unwrap();
    assert_eq!(t.killed, vec![10, 11, 13]);
    let killed = signalled.killed.clone();
    assert_eq!(
        (killed.signalled, killed.rounds, killed.complete),
        (3, 1, true)
    );
    assert_eq!(
        t.released, 0,
        "released only when asked, after the kill is reported"
    );
    assert!(matches!(
        release(&mut t, signalled),
        Release::Released {
            reaped: 3,
            skipped: 0,
            ..
        }
    ));
    assert!(t.procs[2].alive, "the process outside the pod lives");
}

#[test]
fn children_forked_during_a_round_are_killed_in_the_next() {
    let mut t = Table::new(&[(10, true)]);
    // Between the first listing and the confirming one, 10 forks 20 and 21; in round two's
    // window 20 forks 30 (before it was signalled).
    t.on_list = Box::new(|n, procs| match n {
        1 => procs.extend([20, 21].map(|pid| Proc {
            pid,
            in_pod: true,
            alive: true,
        })),
        3 => procs.push(Proc {
            pid: 30,
            in_pod: true,
            alive: true,
        }),
        _ => {}
    });
    let killed = kill_pod(&mut t, &target(), LONG).unwrap().killed;
    let got: BTreeSet<u32> = t.killed.iter().copied().collect();
    assert_eq!(got, BTreeSet::from([10, 20, 21, 30]));
    assert_eq!(killed.signalled, 4);
    assert!(t.procs.iter().filter(|p| p.in_pod).all(|p| !p.alive));
}

#[test]
fn an_id_reused_outside_the_pod_before_it_was_pinned_is_not_signalled() {
    let mut t = Table::new(&[(10, true), (11, true)]);
    // After the first listing, 11 exits and its id goes to a process elsewhere, which the pin
    // then names; the confirming listing does not show 11.
    t.on_list = Box::new(|n, procs| {
        if n == 0 {
            procs[1].alive = false;
            procs.push(Proc {
                pid: 11,
                in_pod: false,
                alive: true,
            });
        }
    });
    let killed = kill_pod(&mut t, &target(), LONG).unwrap().killed;
    assert_eq!(t.killed, vec![10]);
    assert_eq!(killed.signalled, 1);
    assert!(t.procs[2].alive, "the namesake outside the pod lives");
}

#[test]
fn an_id_reused_inside_the_pod_after_its_process_was_reaped_is_killed_too() {
    let mut t = Table::new(&[(10, true)]);
    // 10 is signalled in round one; before round two's listing it is reaped and its id goes
    // to a new process forked in the pod.
    t.on_list = Box::new(|n, procs| {
        if n == 2 {
            procs.push(Proc {
                pid: 10,
                in_pod: true,
                alive: true,
            });
        }
    });
    let killed = kill_pod(&mut t, &target(), LONG).unwrap().killed;
    assert_eq!(t.killed, vec![10, 10]);
    assert_eq!(killed.signalled, 1, "one entry per id, the newest pinned");
    assert!(t.procs.iter().all(|p| !p.alive));
}

#[test]
fn nothing_left_to_kill_is_a_kill_of_nothing() {
    let mut t = Table::new(&[(12, false)]);
    let signalled = kill_pod(&mut t, &target(), LONG).unwrap();
    assert_eq!(
        (signalled.killed.signalled, signalled.killed.rounds),
        (0, 0)
    );
    assert_eq!(release(&mut t, signalled), Release::Nothing);
}

#[test]
fn a_cgroup_that_is_not_the_verified_one_is_not_touched() {
    let rows: [(&str, Option<u64>); 2] = [("made anew", Some(8)), ("gone", None)];
    for (what, id) in rows {
        let mut t = Table::new(&[(10, true)]);
        t.cgroup_id = id;
        let err = kill_pod(&mut t, &target(), LONG).unwrap_err();
        assert!(t.killed.is_empty(), "{what}: nothing signalled");
        match (id, err) {
            (
                Some(8),
                KillError::NotVerified {
                    expected, found, ..
                },
            ) => {
                assert_eq!((expected, found), (7, 8))
            }
            (None, KillError::Gone { .. }) => {}
            (_, e) => panic!("{what}: {e}"),
        }
    }
}

#[test]
fn a_refused_release_leaves_the_kill_done_and_says_why() {
    let mut t = Table::new(&[(10, true)]);
    t.release_errno = Some(libc::ENOSYS);
    let signalled = kill_pod(&mut t, &target(), LONG).unwrap();
    assert_eq!(signalled.killed.signalled, 1);
    assert_eq!(
        release(&mut t, signalled),
        Release::Unavailable(libc::ENOSYS)
    );
}

#[test]
fn a_storm_that_outlasts_the_rounds_is_killed_as_far_as_it_went_and_said_unfinished() {
    let mut t = Table::new(&[(10, true)]);
    let mut next = 100;
    // A new process in the pod before every confirming listing, for ever.
    t.on_list = Box::new(move |n, procs| {
        if n % 2 == 1 {
            next += 1;
            procs.push(Proc {
                pid: next,
                in_pod: true,
                alive: true,
            });
        }
    });
    let signalled = kill_pod(&mut t, &target(), LONG).unwrap();
    let killed = signalled.killed.clone();
    assert!(!killed.complete, "said unfinished");
    assert_eq!(killed.rounds, MAX_ROUNDS + 1);
    assert!(
        killed.signalled >= MAX_ROUNDS as usize,
        "{}",
        killed.signalled
    );
    release(&mut t, signalled);
    assert!(t.released > 0, "what was signalled is still released");
}
