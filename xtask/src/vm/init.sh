#!/bin/busybox sh
# PID 1 of the VM tests, written into the initramfs by `cargo xtask vm-test` (xtask/src/vm/).
# Mounts what the agent needs, makes the unified cgroup hierarchy a node with the memory and
# pids controllers, follows /vmtest/plan, and reports on the first serial port in lines that
# start with "@vmtest " (xtask reads them; the kernel's own console is the second port).
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/null >/dev/ttyS0 2>&1

fail() {
    echo "@vmtest setup-failed $*"
    poweroff -f
}
mount -t cgroup2 cgroup2 /sys/fs/cgroup || fail "mounting cgroup2 at /sys/fs/cgroup"
echo "+memory +pids" >/sys/fs/cgroup/cgroup.subtree_control ||
    fail "enabling +memory +pids in /sys/fs/cgroup/cgroup.subtree_control"
mount -t tracefs tracefs /sys/kernel/tracing || fail "mounting tracefs"
mount -t bpf bpf /sys/fs/bpf || fail "mounting bpffs"
# /tmp and /run stay on the initramfs (already in RAM): a tmpfs mounted there would hide the
# test helpers, which sit at their host paths, and a CI clone may well live under /tmp.
ifconfig lo 127.0.0.1 up || fail "bringing up the loopback interface"

v1=$(awk '$3 == "cgroup"' /proc/mounts | wc -l)
echo "@vmtest boot kernel=$(uname -r) cpus=$(nproc) memory_kib=$(awk '/MemTotal/ {print $2}' /proc/meminfo) cgroup_v1_mounts=$v1 subtree_control=$(tr ' ' , </sys/fs/cgroup/cgroup.subtree_control)"

export NODE_AGENT_BIN=/vmtest/bin/node-agent RUST_BACKTRACE=1
# Emulation runs the guest ten times slower or more: the tests stretch their waits and hang
# guards by this (tests/src/lib.rs `scaled`), never the figures they assert.
export NODE_AGENT_TEST_TIME_SCALE=10
# Which memory mechanism the agent gets on this kernel, in its own words.
RUST_LOG=info timeout 180 /vmtest/bin/node-agent trace --no-attach --duration 1s --output json \
    >/dev/null 2>/tmp/probe.log
rc=$?
sed 's/^/probe: /' /tmp/probe.log
echo "@vmtest mechanism rc=$rc $(grep -m1 'kernel programs attached' /tmp/probe.log)"

uptime_s() { cut -d' ' -f1 /proc/uptime; }
TAB=$(printf '\t')
while IFS="$TAB" read -r kind a b; do
    case "$kind" in
    test)
        echo "@vmtest start ${a##*/} $b"
        start=$(uptime_s)
        timeout -s KILL @TEST_TIMEOUT@ "$a" --exact "$b" --test-threads=1 </dev/null
        rc=$?
        echo
        echo "@vmtest result ${a##*/} $b rc=$rc start=$start end=$(uptime_s)"
        ;;
    run)
        echo "@vmtest start $a"
        start=$(uptime_s)
        # The command line is split on spaces, as written by xtask.
        $b </dev/null
        rc=$?
        echo
        echo "@vmtest result $a - rc=$rc start=$start end=$(uptime_s)"
        ;;
    esac
done </vmtest/plan
echo "@vmtest done"
poweroff -f
