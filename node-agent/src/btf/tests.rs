use super::*;

/// Builds little-endian BTF by hand: enough kinds to exercise the reader.
#[derive(Default)]
struct Builder {
    types: Vec<u8>,
    strings: Vec<u8>,
}

impl Builder {
    fn new() -> Self {
        Self {
            types: Vec::new(),
            strings: vec![0],
        }
    }
    fn s(&mut self, name: &str) -> u32 {
        if name.is_empty() {
            return 0;
        }
        let off = self.strings.len() as u32;
        self.strings.extend_from_slice(name.as_bytes());
        self.strings.push(0);
        off
    }
    fn push(&mut self, words: &[u32]) {
        for w in words {
            self.types.extend_from_slice(&w.to_le_bytes());
        }
    }
    fn header(&mut self, name: &str, kind: u32, kind_flag: bool, vlen: u32, size_or_type: u32) {
        let n = self.s(name);
        let info = (u32::from(kind_flag) << 31) | (kind << 24) | vlen;
        self.push(&[n, info, size_or_type]);
    }
    fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&24u32.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(self.types.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.types.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.strings.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.types);
        out.extend_from_slice(&self.strings);
        out
    }
}

/// Types (ids from 1):
/// 1 int; 2 anonymous union { int a @0; int b @0 }; 3 struct inner { int x @0; int y @32 };
/// 4 typedef inner_t = 3; 5 struct outer { int first @0; union(2) @64; inner_t nested @128;
///   bitfield flags @200 (kind_flag) }; 6 enum { red = 1, memory_cgrp_id = 4 };
/// 7 enum64 { big = 2^40 }; 8 func_proto with 2 params.
fn sample() -> Vec<u8> {
    let mut b = Builder::new();
    b.header("int", KIND_INT, false, 0, 4);
    b.push(&[32]);
    b.header("", KIND_UNION, false, 2, 4);
    let (a, bb) = (b.s("a"), b.s("b"));
    b.push(&[a, 1, 0, bb, 1, 0]);
    b.header("inner", KIND_STRUCT, false, 2, 8);
    let (x, y) = (b.s("x"), b.s("y"));
    b.push(&[x, 1, 0, y, 1, 32]);
    b.header("inner_t", KIND_TYPEDEF, false, 0, 3);
    b.header("outer", KIND_STRUCT, true, 4, 32);
    let (first, nested, flags) = (b.s("first"), b.s("nested"), b.s("flags"));
    b.push(&[
        first,
        1,
        0,
        0,
        2,
        64,
        nested,
        4,
        128,
        flags,
        1,
        (3 << 24) | 200,
    ]);
    b.header("colour", KIND_ENUM, false, 2, 4);
    let (red, mem) = (b.s("red"), b.s("memory_cgrp_id"));
    b.push(&[red, 1, mem, 4]);
    b.header("wide", KIND_ENUM64, false, 1, 8);
    let big = b.s("big");
    b.push(&[big, 0, 1 << 8]);
    b.header("", KIND_FUNC_PROTO, false, 2, 1);
    b.push(&[0, 1, 0, 1]);
    b.bytes()
}

#[test]
fn finds_members_enumerators_and_paths() {
    let btf = Btf::parse(&sample()).expect("sample parses");
    let cases: &[(&str, &str, &str, Result<u32, &str>)] = &[
        ("plain member", "outer", "first", Ok(0)),
        ("member of an anonymous union", "outer", "b", Ok(8)),
        ("member through a typedef", "outer", "nested", Ok(16)),
        ("second member of a struct", "inner", "y", Ok(4)),
        ("bitfield refused", "outer", "flags", Err("bitfield")),
        ("unknown member", "outer", "nope", Err("no member")),
        ("unknown struct", "missing", "x", Err("no struct")),
    ];
    for (name, strukt, member, want) in cases {
        let got = btf.member_offset(strukt, member);
        match (want, got) {
            (Ok(w), Ok(g)) => assert_eq!(*w, g, "{name}"),
            (Err(w), Err(e)) => assert!(e.to_string().contains(w), "{name}: {e}"),
            (w, g) => panic!("{name}: want {w:?}, got {g:?}"),
        }
    }
    assert_eq!(btf.path_offset("outer", &["nested", "y"]).unwrap(), 20);
    assert_eq!(btf.enumerator("memory_cgrp_id").unwrap(), 4);
    assert_eq!(btf.enumerator("big").unwrap(), 1 << 40);
    assert!(btf.enumerator("absent").is_err());
    assert_eq!(
        btf.member_kind("outer", "nested").unwrap(),
        MemberKind::Struct("inner".into())
    );
    assert_eq!(
        btf.member_kind("outer", "first").unwrap(),
        MemberKind::Other
    );
}

#[test]
fn refuses_malformed_data_without_panicking() {
    let good = sample();
    let mut bad_magic = good.clone();
    bad_magic[0] = 0;
    let mut unknown_kind = good.clone();
    // The first type's info word: set kind 31.
    unknown_kind[24 + 7] = 31;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("bad magic", bad_magic),
        ("truncated in the header", good[..10].to_vec()),
        ("truncated in the types", good[..40].to_vec()),
        ("unknown kind", unknown_kind),
    ];
    for (name, data) in cases {
        assert!(Btf::parse(&data).is_err(), "{name}");
    }
    // Every prefix either parses or fails cleanly.
    for len in 0..good.len() {
        let _ = Btf::parse(&good[..len]);
    }
}

#[test]
fn reads_the_running_kernels_btf() {
    let btf = Btf::from_kernel().expect("this machine has /sys/kernel/btf/vmlinux");
    // Offsets differ per kernel; what holds everywhere: these members exist, are byte-aligned,
    // and lie inside their structs.
    for (strukt, member) in [
        ("task_struct", "pid"),
        ("task_struct", "tgid"),
        ("task_struct", "cgroups"),
        ("css_set", "subsys"),
        ("cgroup_subsys_state", "cgroup"),
        ("cgroup", "kn"),
        ("kernfs_node", "id"),
    ] {
        let off = btf
            .member_offset(strukt, member)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(off < 16384, "{strukt}.{member} at {off}");
    }
    assert!(
        btf.member_offset("task_struct", "tgid").unwrap()
            > btf.member_offset("task_struct", "pid").unwrap()
    );
    assert!(btf.enumerator("memory_cgrp_id").unwrap() >= 0);
    // mark_victim passes (task, uid) on the kernels this agent supports; sched_process_fork
    // passes (parent, child).
    assert_eq!(btf.tracepoint_args("sched_process_fork"), Some(2));
    assert!(matches!(btf.tracepoint_args("mark_victim"), Some(1 | 2)));
    assert_eq!(btf.tracepoint_args("no_such_tracepoint"), None);
}
