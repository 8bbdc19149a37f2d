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
//! evaluation); [`ask`] starts one for a single question. Only the `run` and `check-config`
//! commands turn the helper on ([`use_helper`]); elsewhere (unit tests) the calls are made in
//! the process, as before.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    sync::OnceLock,
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
    /// A config file, as [`crate::daemon::config::read::read_capped`] reads it.
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
    IsDir(bool),
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
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Helper {
    /// Starts a helper, or `None` when the calls are made in this process.
    pub fn start() -> Result<Option<Self>, HelperError> {
        let Some(program) = PROGRAM.get() else {
            return Ok(None);
        };
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
            let _ = child.kill();
            return Err(HelperError::Ended);
        };
        Ok(Some(Self {
            child,
            stdin,
            stdout: BufReader::new(stdout),
        }))
    }

    /// Asks one question and waits for its answer (on the caller's thread, which may wait as
    /// long as the filesystem does: never the loop's).
    pub fn ask(&mut self, request: &Request) -> Result<Answer, HelperError> {
        let mut line = serde_json::to_vec(request).expect("a request always serializes");
        line.push(b'\n');
        self.stdin.write_all(&line).map_err(HelperError::Io)?;
        self.stdin.flush().map_err(HelperError::Io)?;
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

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        // Reaped if it is gone already; one stuck in the kernel is left to end on its own.
        let _ = self.child.try_wait();
    }
}

/// One question, in a helper of its own when helpers are in use (else in this process).
pub fn ask(request: &Request) -> Result<Answer, HelperError> {
    match Helper::start()? {
        Some(mut helper) => helper.ask(request),
        None => Ok(answer(request)),
    }
}

/// The answer, worked out in this process.
pub fn answer(request: &Request) -> Answer {
    match request {
        Request::StatFs(path) => Answer::StatFs(statfs(path)),
        Request::IsDir(path) => Answer::IsDir(path.is_dir()),
        Request::Read(path) => Answer::Read(if !path.exists() {
            Ok(None)
        } else {
            crate::daemon::config::read::read_capped(path)
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
            (Request::IsDir(dir.path().into()), "IsDir(true)"),
            (Request::IsDir(file.clone()), "IsDir(false)"),
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
