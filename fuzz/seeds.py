#!/usr/bin/env python3
"""Writes the seed corpora in fuzz/corpus/<target>/ from the repository's test fixtures and
shipped files (deploy/config.yaml, the README's examples, the tests' inputs), plus the
inputs that once broke a parser. Run it again after changing those fixtures; libFuzzer finds
the rest from here. Each seed is named by its content's hash, as libFuzzer names its finds."""

import hashlib
import pathlib
import re
import struct

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"


def write(target, data):
    if isinstance(data, str):
        data = data.encode()
    directory = CORPUS / target
    directory.mkdir(parents=True, exist_ok=True)
    (directory / hashlib.sha1(data).hexdigest()).write_bytes(data)


def shipped_config():
    return (ROOT / "deploy" / "config.yaml").read_text()


def readme_block(after):
    text = (ROOT / "README.md").read_text()
    start = text.index(after)
    block = text[start:].split("```yaml\n", 1)[1].split("```", 1)[0]
    return block


QUANTITIES = [
    "500Mi", "1024Mi", "1.5Gi", "500M", "1.5G", "1000000", "100m", "1e9", "1E3", "1E", "2k",
    "0.5Ki", "0", "+1Ki", ".5M", "-1Gi", "5n", "10%", "<500Mi", "1K", "1 Gi", "1e99", "8Ei",
    "10Ei", "-10Ei", "8191Pi", "20E", "9223372036854775807", "9223372036854775808",
    "9223372036854775807.5", "-9223372036854775809", "99999999999999999999Ki", "64Mi", "1m",
]

DURATIONS = [
    "30s", "1m30s", "1.5h", "0", "0s", "250ms", "3\u00b5s", "3\u03bcs", "-1s", ".5s", "30", "1d",
    "-", ".s", "1h-1m", "9999999999h", "2562047h47m16.854775807s", "-2562047h47m16.854775808s",
    "2562047h47m16.854775808s", "2562047h2562047h", "1.0000000009s",
    # Wrapped to 0.23 s in release builds and panicked in debug ones (issue 12).
    "94522879700260684295381835.397777280960h",
    "1000000000000000000000000000000000000000000000ns",
]

KUBELET_CONFIGS = [
    readme_block("The eviction settings are the kubelet's own"),
    "evictionHard: {memory.available: 500Mi, nodefs.available: 10%}\n",
    "evictionSoft: {memory.available: 1Gi}\nevictionSoftGracePeriod: {memory.available: 1m30s}\n",
    "evictionMinimumReclaim: {memory.available: 200Mi, nodefs.available: 5%}\n",
    "evictionMaxPodGracePeriod: 60\nevictionPressureTransitionPeriod: 1m30s\n",
    "evictionMaxPodGracePeriod: 2147483648\n",
    "evictionHard: {memory.available: \"0%\", nodefs.available: \"100%\"}\n",
    "evictionHard: {pid.available: 1000, imagefs.inodesFree: 5%, allocatableMemory.available: 1Gi}\n",
    "enforceNodeAllocatable: [pods, system-reserved]\nevictionHard: {memory.available: 1Gi}\n",
    "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\nevictionHard: {memory.available: 20E}\n",
    # The kubelet's flags, one per line (see the target).
    "memory.available<500Mi,nodefs.available<10%\nmemory.available<1Gi\nmemory.available=1m30s\n"
    "memory.available=200Mi\n60\n5m\npods,system-reserved\n",
]

HEADER = "apiVersion: node-agent.io/v1alpha1\nkind: NodeAgentConfiguration\n"

AGENT_CONFIGS = [
    shipped_config(),
    readme_block("One config file, a versioned"),
    HEADER + "eviction: {evictionHard: {memory.available: 500Mi}}\nlisten: '127.0.0.1:9999'\nresyncInterval: 30s\n",
    HEADER + "eviction:\n  evictionHard: {memory.available: 824Mi}\n"
    "kubernetes:\n  podSource: kubelet\n  nodeName: test-node\n  podRefreshInterval: 500ms\n"
    "  kubelet: {url: 'https://127.0.0.1:1', caFile: '/tmp/ca.pem'}\n"
    "  apiServer: {url: 'https://127.0.0.1:1', caFile: '/tmp/ca.pem'}\n"
    "  tokenPath: '/tmp/token'\n  evictionsPerMinute: 60\n  retry: {initialBackoff: 50ms, maxBackoff: 100ms}\n"
    "listen: '127.0.0.1:9464'\ntraceSocket: '/tmp/trace.sock'\nnodeCgroup: '/test'\n"
    "memoryCapacity: 1Gi\nresyncInterval: 60s\nforkLimit: 0\nringBufferSize: 4Ki\n",
    HEADER + "cri: {endpoint: 'unix:///run/crio/crio.sock', imageMinimumGCAge: 0s, keepImages: []}\n",
    HEADER + "memoryCapacity: 1m\n",
    HEADER + "ringBufferSize: 2Gi\n",
    HEADER + "nodeCgroup: /../..\n",
    HEADER + "resyncInterval: 30\n",
    HEADER + "kubernetes:\n",
    HEADER + "eviction: {evictionHard: {pid.available: 1000}, evictionSoft: {memory.available: 1.5}}\n",
    # The format before node-agent.io/v1alpha1: refused, naming each key's new spelling.
    "agent: {dry_run: true, ring_bytes: 1048576}\nkubernetes: {request_timeout_seconds: 10, dry_run: true}\n",
    "apiVersion: node-agent.io/v1\nkind: NodeAgentConfiguration\n",
    "",
]

NODE = "node:\n  capacity: {memory: 10Gi, ephemeral-storage: 100Gi, inodes: 1000000, pids: 32768}\n"


def scenarios():
    source = (ROOT / "node-agent" / "tests" / "scenario.rs").read_text()
    example = re.search(r'"\{NODE\}(  fsLayout: shared\n.*?)"\n', source, re.S).group(1)
    example = example.replace("{{", "{").replace("}}", "}")
    simulate = (ROOT / "node-agent" / "tests" / "simulate.rs").read_text()
    shipped = re.search(r'const SCENARIO: &str = "(.*?)";', simulate, re.S).group(1)
    return [
        NODE + example,
        shipped,
        NODE + "pods:\n  - pod: {metadata: {name: big}, spec: {containers: [{name: app}]}}\n    usage: {memory: 3Gi}\n"
        "config:\n  evictionHard: {memory.available: 500Mi}\n"
        "steps:\n  - at: 0s\n    signals: {memory.available: 100Mi}\n  - at: 10s\n",
        NODE + "steps:\n  - at: 0s\n    signals: {memory.available: 20E}\n",
        '{"node": {"capacity": {"memory": "8Gi"}}, "pods": [{"pod": {"metadata": {"name": "a"},'
        ' "spec": {"containers": [{"name": "app"}]}}, "usage": {"memory": "1Gi"}}],'
        ' "steps": [{"at": "0s", "signals": {"memory.available": "50Mi"}}]}',
    ]


def header(kind, cpu=1, ktime=123456789):
    return struct.pack("<IIQ", kind, cpu, ktime)


def comm(name):
    return name.encode().ljust(16, b"\0")


def ring_records():
    return [
        # OomKillEvent, 104 bytes.
        header(1) + struct.pack("<QQIIIIiIQQQQ", 4242, 4200, 1234, 1234, 0, 1, 0, 0,
                                 100000, 8192, 512, 0) + comm("mem-helper"),
        # MemoryThresholdEvent, 48 bytes.
        header(2) + struct.pack("<QQQII", 4242, 200 << 20, 150 << 20, 1, 0),
        # PidThresholdEvent, 48 bytes.
        header(3) + struct.pack("<qQQII", 31000, 32768, 2000, 1, 0),
        # ForkStormEvent, 72 bytes.
        header(4) + struct.pack("<QQQQII", 4242, 1500, 1_000_000_000, 1000, 777, 0) + comm("fork-helper"),
        # CgroupChangeEvent, 32 bytes.
        header(5) + struct.pack("<QII", 4242, 1, 0),
        # Overflowed `limit as i64 - live` in the trace record (found by this target).
        header(3) + struct.pack("<qQQII", -1, 2**64 - 1, 0, 0, 0),
        header(99),
        header(1)[:10],
    ]


def main():
    for q in QUANTITIES:
        write("quantity", q)
    for d in DURATIONS:
        write("duration", d)
    for c in KUBELET_CONFIGS:
        write("kubelet_config", c)
    for c in AGENT_CONFIGS:
        write("agent_config", c)
    for s in scenarios():
        write("scenario", s)
    for r in ring_records():
        write("ring_record", r)


if __name__ == "__main__":
    main()
