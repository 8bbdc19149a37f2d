//! Kernel programs of the node agent. Each program is an entry point plus a `try_*` twin that
//! returns `Result`, filters as early as it can and keeps its logic thin; aggregation happens in
//! maps and user space does the rest. Struct offsets come from `OFFSETS`, which user space fills
//! from the running kernel's BTF (see `node-agent/src/ebpf/offsets.rs`).
#![no_std]
#![no_main]
// `atomic_xchg`: the bpfel target has no compare-and-swap in `core::sync::atomic`, but the
// kernel (5.12+) runs BPF_XCHG on any BPF CPU version.
#![feature(core_intrinsics)]
#![allow(internal_features)]

mod cgroups;
mod kernel;
mod maps;
mod memcg;
mod oom;
mod sampler;
mod tasks;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any reachable panic path; this is only here to satisfy `no_std`.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
