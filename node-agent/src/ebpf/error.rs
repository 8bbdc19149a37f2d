//! The errors of loading and driving the kernel programs, in one place below the modules that
//! raise them (the object, its control maps, the sampler), so none of them imports another for
//! its errors.

use node_agent_common::MAX_MEMORY_LINES;

use crate::btf::BtfError;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(
        "this node-agent binary was built without its kernel programs (plain `cargo build`); \
         build it with `cargo xtask build`"
    )]
    NotEmbedded,
    #[error(
        "loading kernel programs needs root, or CAP_BPF and CAP_PERFMON (and CAP_SYS_RESOURCE \
         before 5.11, which charges BPF memory to RLIMIT_MEMLOCK) (the kernel said: {source})"
    )]
    NotPermitted {
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the kernel has no BTF at {path}: this agent needs a kernel built with \
         CONFIG_DEBUG_INFO_BTF=y (5.8 or later)",
        path = crate::btf::VMLINUX
    )]
    NoBtf,
    #[error("reading the kernel's BTF")]
    Btf(#[source] BtfError),
    #[error("ring buffer size {0} must be a power of two and at least 4096 bytes")]
    RingSize(u32),
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
    #[error("opening the memory cgroup hierarchy at {path}")]
    MemoryHierarchy {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("setting up the in-kernel memory sampler")]
    Sampler(#[source] Box<ControlError>),
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("counting CPUs")]
    Cpus(#[source] std::io::Error),
    #[error("map {map} (key {key})")]
    Map {
        map: &'static str,
        key: u64,
        #[source]
        source: aya::maps::MapError,
    },
    #[error(transparent)]
    Setup(#[from] LoadError),
    #[error(transparent)]
    Sampler(#[from] SamplerError),
}

pub(crate) fn map_err(
    map: &'static str,
    key: u64,
) -> impl FnOnce(aya::maps::MapError) -> ControlError {
    move |source| ControlError::Map { map, key, source }
}

#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    #[error("the sampler watches at most {MAX_MEMORY_LINES} memory lines")]
    Full,
    #[error("opening cgroup {cgroup} in the memory hierarchy at {mount} by its id")]
    Open {
        cgroup: u64,
        mount: String,
        #[source]
        source: std::io::Error,
    },
    #[error("running the cgroup iterator on cgroup {cgroup} ({step})")]
    Iterator {
        cgroup: u64,
        step: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the kernel found no memory page counter for cgroup {cgroup} (on cgroup v2, is the \
         memory controller enabled in its parent's cgroup.subtree_control?)"
    )]
    Unresolved { cgroup: u64 },
}

fn is_permission(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES))
}

pub(crate) fn classify_load_error(e: aya::EbpfError) -> LoadError {
    match e {
        aya::EbpfError::MapError(aya::maps::MapError::CreateError { io_error, .. })
            if is_permission(&io_error) =>
        {
            LoadError::NotPermitted { source: io_error }
        }
        other => LoadError::Object(other),
    }
}

pub(crate) fn classify_program_error(
    name: &'static str,
    e: aya::programs::ProgramError,
) -> LoadError {
    match e {
        aya::programs::ProgramError::SyscallError(aya::sys::SyscallError { io_error, .. })
            if is_permission(&io_error) =>
        {
            LoadError::NotPermitted { source: io_error }
        }
        // BPF_PROG_LOAD of a tracing program without CAP_PERFMON (CAP_BPF alone creates the
        // maps): EPERM before the verifier runs. Only EPERM: the verifier rejects a program
        // with EACCES, and that is not about privileges.
        aya::programs::ProgramError::LoadError { io_error, .. }
            if io_error.raw_os_error() == Some(libc::EPERM) =>
        {
            LoadError::NotPermitted { source: io_error }
        }
        other => LoadError::Program {
            name,
            source: other,
        },
    }
}
