//! The embedded eBPF object and its life cycle: load, attach, detach on drop.

use aya::{programs::TracePoint, Ebpf};

/// The object `cargo xtask build` compiled; empty when built with plain `cargo build`.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/node-agent-ebpf.o"));

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(
        "this node-agent binary was built without its kernel programs (plain `cargo build`); \
         build it with `cargo xtask build`"
    )]
    NotEmbedded,
    #[error(
        "loading kernel programs needs root, or CAP_BPF, CAP_PERFMON and CAP_SYS_RESOURCE \
         (the kernel said: {source})"
    )]
    NotPermitted {
        #[source]
        source: std::io::Error,
    },
    #[error("loading the eBPF object")]
    Object(#[source] aya::EbpfError),
    #[error("the eBPF object has no program `{0}`")]
    MissingProgram(&'static str),
    #[error("the eBPF object has no map `{0}`")]
    MissingMap(&'static str),
    #[error("program `{name}`")]
    Program {
        name: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("map `{name}`")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
}

/// Tracepoints the agent attaches: (program name in the object, category, event).
const TRACEPOINTS: &[(&str, &str, &str)] = &[
    ("sched_process_fork", "sched", "sched_process_fork"),
    ("sched_process_exit", "sched", "sched_process_exit"),
];

/// The loaded and attached kernel programs. Dropping it detaches every program and frees the
/// maps.
pub struct KernelPrograms {
    pub(crate) ebpf: Ebpf,
}

impl KernelPrograms {
    /// Loads the embedded object and attaches every program.
    pub fn load() -> Result<Self, LoadError> {
        if OBJECT.is_empty() {
            return Err(LoadError::NotEmbedded);
        }
        raise_memlock_limit();
        let mut ebpf = Ebpf::load(OBJECT).map_err(classify_load_error)?;
        for &(name, category, event) in TRACEPOINTS {
            let program: &mut TracePoint = ebpf
                .program_mut(name)
                .ok_or(LoadError::MissingProgram(name))?
                .try_into()
                .map_err(|source| LoadError::Program { name, source })?;
            program
                .load()
                .map_err(|source| classify_program_error(name, source))?;
            program
                .attach(category, event)
                .map_err(|source| classify_program_error(name, source))?;
        }
        Ok(Self { ebpf })
    }
}

/// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; later ones to the memcg, where this
/// is harmless. Failure is not fatal: the load error that follows says more.
fn raise_memlock_limit() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads the struct we pass and nothing else.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "could not raise RLIMIT_MEMLOCK");
    }
}

fn is_permission(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES))
}

fn classify_load_error(e: aya::EbpfError) -> LoadError {
    match e {
        aya::EbpfError::MapError(aya::maps::MapError::CreateError { io_error, .. })
            if is_permission(&io_error) =>
        {
            LoadError::NotPermitted { source: io_error }
        }
        other => LoadError::Object(other),
    }
}

fn classify_program_error(name: &'static str, e: aya::programs::ProgramError) -> LoadError {
    match e {
        aya::programs::ProgramError::SyscallError(aya::sys::SyscallError { io_error, .. })
            if is_permission(&io_error) =>
        {
            LoadError::NotPermitted { source: io_error }
        }
        other => LoadError::Program {
            name,
            source: other,
        },
    }
}
