//! Filesystem calls that can hang in the kernel, made in a helper process rather than in the
//! agent: `statfs` of nodefs and imagefs, whether a configured path is a directory, and the
//! kubelet's config file (on nodefs). A FUSE call the filesystem's server has taken and never
//! answers waits uninterruptibly: a thread of the agent stuck in one would keep the agent's
//! process alive after SIGTERM until the filesystem answered, however the loop had ended (issue
//! 31's probe: 55 s). A process of its own is the one thing the kernel lets go of: the agent
//! exits at once, and the helper, killed when the thread that started it ends
//! (`PR_SET_PDEATHSIG`), goes as soon as its call returns.
//!
//! The helper is the agent's own binary (`/proc/self/exe fs-helper`, a hidden subcommand),
//! answering one JSON request per line on stdin with one JSON answer per line on stdout, until
//! stdin closes. [`Helper`] is a long-lived one (a filesystem probe's, asked at every
//! evaluation); [`ask`] starts one for a single question and waits for its answer at most
//! [`ASK_DEADLINE`]: a config check or a reload never waits longer for a hung filesystem.
//! Only the `run` and `check-config` commands turn the helper on ([`use_helper`]); elsewhere
//! (unit tests) the calls are made in the process, as before. When a helper cannot be had
//! (no process to spare, a pids limit), the caller hears why: the call is never made in the
//! agent instead.
//!
//! Every helper that ends is reaped: one still stuck in the kernel when it is let go is kept
//! and reaped when it ends (looked at whenever a helper starts or ends), and at most
//! [`MAX_STUCK`] are left stuck before no new one is started.

pub mod read;

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    sync::{Mutex, OnceLock},
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

/// The hidden subcommand the helper runs as.
pub const SUBCOMMAND: &str = "fs-helper";

/// One question for the helper.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// `stat` and `statfs` of the path.
    StatFs(PathBuf),
    /// Whether the path is a directory (following links).
    IsDir(PathBuf),
    /// A config file, as [`read::read_capped`] reads it.
    Read(PathBuf),
}

/// One filesystem's figures, as `stat` and `statfs` give them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsFigures {
    pub device: u64,
    pub avail_bytes: i64,
    pub total_bytes: i64,
    pub avail_inodes: i64,
    pub total_inodes: i64,
}

/// The helper's answer; errors as their messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Answer {
    StatFs(Result<FsFigures, String>),
    /// `Ok(false)`: no such path, or not a directory; `Err`: the filesystem failed to say
    /// (a dead FUSE server's `ENOTCONN`, `EIO`).
    IsDir(Result<bool, String>),
    /// `Ok(None)`: there is no such file.
    Read(Result<Option<String>, String>),
}

/// The helper could not be asked, or said nothing readable.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    #[error("starting the filesystem helper process ({program})")]
    Start {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("talking to the filesystem helper process")]
    Io(#[source] std::io::Error),
    #[error("the filesystem helper process ended")]
    Ended,
    #[error("the filesystem helper process answered what is not an answer")]
    Garbled(#[source] serde_json::Error),
    #[error("the filesystem did not answer within {waited:?} (a hung mount?)")]
    Unanswered { waited: Duration },
    #[error("{MAX_STUCK} filesystem helper processes are still stuck in the kernel (a hung mount): no other is started until one ends")]
    TooManyStuck,
}

/// How long a single question ([`ask`]) waits for its answer.
pub const ASK_DEADLINE: Duration = Duration::from_secs(2);
/// Helpers let go while still stuck in the kernel, at most; beyond, none is started.
pub const MAX_STUCK: usize = 8;

/// Helpers killed but not gone yet (stuck in a filesystem call), reaped once they end.
static ENDING: Mutex<Vec<Child>> = Mutex::new(Vec::new());

/// Reaps the helpers that ended; how many are still stuck.
fn reap_ended() -> usize {
    let mut ending = ENDING.lock().unwrap_or_else(|p| p.into_inner());
    ending.retain_mut(|c| matches!(c.try_wait(), Ok(None)));
    ending.len()
}

static PROGRAM: OnceLock<PathBuf> = OnceLock::new();

/// Makes the filesystem calls in helper processes running `program` (the agent's own binary).
pub fn use_helper(program: PathBuf) {
    let _ = PROGRAM.set(program);
}

/// The most an answer may weigh: a config file of 1 MiB, escaped in JSON.
const MAX_ANSWER: u64 = 8 << 20;

/// A helper process, asked one question at a time. Dropping it kills the process (a call stuck
/// in the kernel ends it when it returns).
#[derive(Debug)]
pub struct Helper {
    /// Taken when the helper is let go.
    child: Option<Child>,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Helper {
    /// Starts a helper, or `None` when the calls are made in this process.
    pub fn start() -> Result<Option<Self>, HelperError> {
        let Some(program) = PROGRAM.get() else {
            return Ok(None);
        };
        if reap_ended() >= MAX_STUCK {
            return Err(HelperError::TooManyStuck);
        }
        let mut command = Command::new(program);
        command
            .arg(SUBCOMMAND)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        // SAFETY: prctl is async-signal-safe; the child asks to be killed when the thread that
        // started it ends (the agent exiting, or a probe dropped), and nothing else.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command.spawn().map_err(|source| HelperError::Start {
            program: program.clone(),
            source,
        })?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let_go(child);
            return Err(HelperError::Ended);
        };
        Ok(Some(Self {
            child: Some(child),
            stdin,
            stdout: BufReader::new(stdout),
        }))
    }

    /// Asks one question and waits for its answer (on the caller's thread, which may wait as
    /// long as the filesystem does: never the loop's).
    pub fn ask(&mut self, request: &Request) -> Result<Answer, HelperError> {
        self.ask_within(request, None)
    }

    /// [`Helper::ask`], waiting at most `deadline` for the answer to begin; past it,
    /// [`HelperError::Unanswered`] (the helper is then of no more use: drop it).
    pub fn ask_within(
        &mut self,
        request: &Request,
        deadline: Option<Duration>,
    ) -> Result<Answer, HelperError> {
        reap_ended();
        let mut line = serde_json::to_vec(request).expect("a request always serializes");
        line.push(b'\n');
        self.stdin.write_all(&line).map_err(HelperError::Io)?;
        self.stdin.flush().map_err(HelperError::Io)?;
        if let Some(deadline) = deadline {
            if self.stdout.buffer().is_empty() {
                wait_readable(self.stdout.get_ref(), deadline)?;
            }
        }
        let mut answer = Vec::new();
        (&mut self.stdout)
            .take(MAX_ANSWER)
            .read_until(b'\n', &mut answer)
            .map_err(HelperError::Io)?;
        if answer.is_empty() {
            return Err(HelperError::Ended);
        }
        serde_json::from_slice(&answer).map_err(HelperError::Garbled)
    }
}

impl Helper {
    /// Ends a helper that has answered: it waits for its next question, in a pipe read the
    /// kill ends at once, so it is reaped now.
    fn finish(mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Waits until `out` has something to read (or its writer is gone), at most `deadline`.
fn wait_readable(out: &ChildStdout, deadline: Duration) -> Result<(), HelperError> {
    use std::os::fd::AsRawFd as _;
    let started = Instant::now();
    loop {
        let left = deadline.saturating_sub(started.elapsed());
        let mut fd = libc::pollfd {
            fd: out.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(left.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd, for the duration of the call.
        match unsafe { libc::poll(&mut fd, 1, ms) } {
            0 => return Err(HelperError::Unanswered { waited: deadline }),
            n if n > 0 => return Ok(()),
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(HelperError::Io(e));
                }
            }
        }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            let_go(child);
        }
    }
}

/// Kills a helper and reaps it, now if it is gone already, else once its call returns (a
/// helper stuck in the kernel is kept in [`ENDING`], and a reaper thread looks at it every
/// second until none is left).
fn let_go(mut child: Child) {
    let _ = child.kill();
    if let Ok(None) = child.try_wait() {
        ENDING.lock().unwrap_or_else(|p| p.into_inner()).push(child);
        start_reaper();
    }
    reap_ended();
}

/// A reaper thread is looking at [`ENDING`].
static REAPING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Starts the reaper unless one runs: it reaps the helpers that ended every second and stops
/// when none is left. Without a thread to spare, they are reaped when a helper next starts,
/// asks or ends.
fn start_reaper() {
    use std::sync::atomic::Ordering;
    if REAPING.swap(true, Ordering::AcqRel) {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("fs-helper-reap".into())
        .spawn(|| loop {
            std::thread::sleep(Duration::from_secs(1));
            if reap_ended() == 0 {
                REAPING.store(false, Ordering::Release);
                // One pushed between the sweep and the store starts its own reaper.
                if reap_ended() == 0 || REAPING.swap(true, Ordering::AcqRel) {
                    return;
                }
            }
        });
    if spawned.is_err() {
        REAPING.store(false, Ordering::Release);
    }
}

/// One question, in a helper of its own when helpers are in use (else in this process),
/// answered within [`ASK_DEADLINE`].
pub fn ask(request: &Request) -> Result<Answer, HelperError> {
    match Helper::start()? {
        Some(mut helper) => {
            let answer = helper.ask_within(request, Some(ASK_DEADLINE))?;
            helper.finish();
            Ok(answer)
        }
        None => Ok(answer(request)),
    }
}

/// The answer, worked out in this process.
pub fn answer(request: &Request) -> Answer {
    match request {
        Request::StatFs(path) => Answer::StatFs(statfs(path)),
        Request::IsDir(path) => Answer::IsDir(match std::fs::metadata(path) {
            Ok(m) => Ok(m.is_dir()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => Ok(false),
            Err(e) => Err(e.to_string()),
        }),
        Request::Read(path) => Answer::Read(if !path.exists() {
            Ok(None)
        } else {
            read::read_capped(path)
                .map(|bytes| Some(String::from_utf8_lossy(&bytes).into_owned()))
                .map_err(|e| e.to_string())
        }),
    }
}

/// `stat` and `statvfs` of `path`.
pub fn statfs(path: &Path) -> Result<FsFigures, String> {
    use std::os::unix::{ffi::OsStrExt as _, fs::MetadataExt as _};
    let device = std::fs::metadata(path).map_err(|e| e.to_string())?.dev();
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| "the path contains a NUL byte".to_string())?;
    // SAFETY: statvfs writes only into `st`; `c` is a valid NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    let frsize = st.f_frsize as i64;
    Ok(FsFigures {
        device,
        avail_bytes: (st.f_bavail as i64).saturating_mul(frsize),
        total_bytes: (st.f_blocks as i64).saturating_mul(frsize),
        avail_inodes: st.f_favail as i64,
        total_inodes: st.f_files as i64,
    })
}

/// The helper's side: answers each request line on stdin until it closes. Requests that are
/// not requests end it.
pub fn serve() -> std::process::ExitCode {
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    let mut line = String::new();
    let mut input = stdin.lock();
    loop {
        line.clear();
        match (&mut input).take(64 << 10).read_line(&mut line) {
            Ok(0) => return std::process::ExitCode::SUCCESS,
            Ok(_) => {}
            Err(_) => return std::process::ExitCode::FAILURE,
        }
        let Ok(request) = serde_json::from_str::<Request>(&line) else {
            return std::process::ExitCode::FAILURE;
        };
        let mut out = serde_json::to_vec(&answer(&request)).expect("an answer always serializes");
        out.push(b'\n');
        if stdout
            .write_all(&out)
            .and_then(|()| stdout.flush())
            .is_err()
        {
            return std::process::ExitCode::FAILURE;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_in_this_process_without_a_helper() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        std::fs::write(&file, "a: 1\n").unwrap();
        let rows = [
            (Request::IsDir(dir.path().into()), "IsDir(Ok(true))"),
            (Request::IsDir(file.clone()), "IsDir(Ok(false))"),
            (
                Request::IsDir(dir.path().join("absent")),
                "IsDir(Ok(false))",
            ),
            (Request::IsDir(file.join("below")), "IsDir(Ok(false))"),
            (Request::Read(file.clone()), "Read(Ok(Some(\"a: 1\\n\")))"),
            (Request::Read(dir.path().join("absent")), "Read(Ok(None))"),
        ];
        for (request, want) in rows {
            assert_eq!(format!("{:?}", ask(&request).unwrap()), want, "{request:?}");
        }
        let Answer::StatFs(Ok(root)) = answer(&Request::StatFs("/".into())) else {
            panic!("statfs of /");
        };
        assert!(root.total_bytes > 0);
        let Answer::StatFs(Err(e)) = answer(&Request::StatFs("/no/such".into())) else {
            panic!("statfs of a missing path");
        };
        assert!(e.contains("No such file"), "{e}");
    }

    /// Requests and answers survive the wire.
    #[test]
    fn the_wire_format_round_trips() {
        let answers = [
            Answer::StatFs(Ok(FsFigures {
                device: 1,
                avail_bytes: 2,
                total_bytes: 3,
                avail_inodes: 4,
                total_inodes: 5,
            })),
            Answer::StatFs(Err("statfs: hung".into())),
            Answer::Read(Ok(Some("x\ny\n".into()))),
        ];
        for a in answers {
            let line = serde_json::to_string(&a).unwrap();
            assert!(!line.contains('\n'), "one line: {line}");
            assert_eq!(serde_json::from_str::<Answer>(&line).unwrap(), a);
        }
    }
}
