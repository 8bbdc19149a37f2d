//! `cargo xtask`: the one entry point for building, testing, linting and running the agent.

mod agent;
mod bench;
mod chart;
mod cluster;
mod fuzz;
mod image;
mod lint;
mod plugin;
mod test;
mod toolchain;
mod tools;
mod vm;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    about = "Build, test, lint and run the node agent"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Install what the eBPF build, the tests, the container tests, the VM tests and fuzzing
    /// need (Debian packages, bpf-linker, cargo-nextest, cargo-fuzz, kubectl,
    /// kubernetes-validate, containerd, runc, buildah, QEMU); idempotent.
    Setup,
    /// Build the kernel programs, then the agent that embeds them.
    Build {
        /// Build the agent with the release profile (the eBPF object is always optimised).
        #[arg(long)]
        release: bool,
    },
    /// Build, then run the agent with the privileges it needs: `cargo xtask run -- trace`.
    Run {
        #[arg(long)]
        release: bool,
        /// Arguments for `node-agent`.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Unit tests, doc tests, then the privileged kernel and end-to-end tests (root required;
    /// they never skip). Every step runs; the end names each one that failed.
    Test {
        /// Extra arguments for the test binaries, e.g. a test name filter.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// The agent as an OCI image (static binary, FROM scratch), saved as an OCI archive under
    /// target/image/.
    Image,
    /// The Helm chart (deploy/chart) linted and packaged into target/chart/, and with `--push
    /// oci://REGISTRY/PATH` pushed there as an OCI artifact, by Helm built from its Go module.
    Chart(chart::ChartArgs),
    /// rustfmt check and clippy with warnings denied, for every crate including the eBPF one.
    Lint,
    /// kubectl node-agent as one static binary, packed for krew: target/krew/ holds the
    /// archive and deploy/krew/node-agent.yaml with its sha256, both checked by krew's rules.
    Plugin,
    /// Runs every fuzz target (fuzz/) for a bounded time, from its committed corpus.
    Fuzz {
        /// How long each target runs.
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        /// Sanitizer for the instrumented build (address is slower to build).
        #[arg(long, value_enum, default_value_t = fuzz::Sanitizer::None)]
        sanitizer: fuzz::Sanitizer,
        /// Only these targets (default: all).
        targets: Vec<String>,
    },
    /// The kernel and end-to-end tests on Debian's cloud kernels (6.1, 6.12, 6.18) under QEMU
    /// with cgroup v2 only; reports per kernel and test, and the memory mechanism each got.
    VmTest(vm::TestArgs),
    /// Inside VMs only: attaches and detaches the programs many times under page-fault load,
    /// with one and two vCPUs, and reports any kernel oops.
    VmStress(vm::StressArgs),
    /// A real Kubernetes on this machine, built from its Go modules, with the agent installed
    /// from deploy/: `build`, `up`, `down`, `status`, `test` (the real-cluster tests).
    Cluster(cluster::ClusterArgs),
    /// Benchmarks (root): detection latency against polling, eventfd and PSI, probe overhead,
    /// event throughput, footprint and idle cost on this host, and the fexit path inside the
    /// 6.1/6.12/6.18 VMs (emulated). Prints the tables, writes target/bench/latest.json and
    /// updates docs/benchmarks.md.
    Bench {
        /// Fewer samples: a smoke run that leaves docs/benchmarks.md alone.
        #[arg(long)]
        quick: bool,
        /// Leave out the VMs (the fexit rows): for iterating on the host's rows only.
        #[arg(long)]
        no_vm: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Setup => toolchain::setup().and_then(|_| {
            tools::for_tests()?;
            tools::cargo_fuzz()?;
            image::setup_runtime()?;
            vm::setup_tools()
        }),
        Command::Build { release } => {
            toolchain::require().and_then(|tc| agent::agent(&tc, release).map(|_| ()))
        }
        Command::Run { release, args } => {
            toolchain::setup().and_then(|tc| agent::run(&tc, release, &args))
        }
        Command::Test { args } => toolchain::setup().and_then(|tc| test::test(&tc, &args)),
        Command::Image => toolchain::setup().and_then(|tc| image::image(&tc).map(drop)),
        Command::Chart(args) => chart::chart(&args),
        Command::Lint => toolchain::setup().and_then(|tc| lint::all(&tc)),
        Command::Plugin => toolchain::setup().and_then(|tc| plugin::plugin(&tc)),
        Command::VmTest(args) => toolchain::setup().and_then(|tc| vm::test(&tc, &args)),
        Command::VmStress(args) => toolchain::setup().and_then(|tc| vm::stress(&tc, &args)),
        Command::Bench { quick, no_vm } => {
            toolchain::setup().and_then(|tc| bench::bench(&tc, quick, !no_vm))
        }
        Command::Cluster(args) => cluster::run(&args),
        Command::Fuzz {
            seconds,
            sanitizer,
            targets,
        } => fuzz::fuzz(seconds, &targets, sanitizer),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}
