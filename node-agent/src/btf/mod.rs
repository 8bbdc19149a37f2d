//! A small reader of the kernel's BTF (`/sys/kernel/btf/vmlinux`): enough to find struct member
//! offsets and enum values at load time, so the kernel programs never hard-code a layout that
//! differs between kernels (the format is documented in Documentation/bpf/btf.rst).

use std::collections::HashMap;

/// Where the running kernel publishes its BTF.
pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

const MAGIC: u16 = 0xeb9f;

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("reading {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("not BTF data: {0}")]
    Malformed(&'static str),
    #[error("BTF type kind {kind} at type id {id} is unknown to this reader")]
    UnknownKind { kind: u32, id: u32 },
    #[error("the kernel's BTF has no struct `{0}`")]
    NoStruct(String),
    #[error("struct `{strukt}` has no member `{member}` in the kernel's BTF")]
    NoMember { strukt: String, member: String },
    #[error("member `{strukt}.{member}` is a bitfield; only byte-aligned members can be read")]
    Bitfield { strukt: String, member: String },
    #[error("the kernel's BTF has no enumerator `{0}`")]
    NoEnumerator(String),
}

#[derive(Debug, Clone)]
struct Member {
    name: u32,
    ty: u32,
    bit_offset: u32,
    /// Non-zero for bitfields (only with the struct's kind_flag set).
    bitfield_size: u32,
}

#[derive(Debug, Clone)]
enum Type {
    /// Struct or union with its members and size in bytes.
    Composite {
        name: u32,
        size: u32,
        members: Vec<Member>,
    },
    /// Typedef, const, volatile, restrict, type tag: refers to another type.
    Alias {
        ty: u32,
    },
    Ptr {
        ty: u32,
    },
    Array {
        elem: u32,
    },
    FuncProto {
        params: u32,
    },
    Other,
}

/// What a member's type is, as far as the agent cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberKind {
    /// An array; `elem_size` is the element size when the element is a struct or union.
    Array {
        elem_struct: Option<String>,
        elem_size: Option<u32>,
    },
    Struct(String),
    Other,
}

/// Parsed kernel BTF: structs, unions and enumerators, by name.
pub struct Btf {
    strings: Vec<u8>,
    types: Vec<Type>,
    structs: HashMap<String, u32>,
    typedefs: HashMap<String, u32>,
    enumerators: HashMap<String, i64>,
}

impl Btf {
    /// Reads the running kernel's BTF.
    pub fn from_kernel() -> Result<Self, BtfError> {
        let data = std::fs::read(VMLINUX).map_err(|source| BtfError::Read {
            path: VMLINUX.into(),
            source,
        })?;
        Self::parse(&data)
    }

    /// Parses raw BTF (little-endian, as on every architecture this agent supports).
    pub fn parse(data: &[u8]) -> Result<Self, BtfError> {
        let mut r = Reader { data, pos: 0 };
        if r.u16()? != MAGIC {
            return Err(BtfError::Malformed(
                "bad magic (big-endian BTF is not supported)",
            ));
        }
        r.pos = 4;
        let hdr_len = r.u32()? as usize;
        let type_off = r.u32()? as usize;
        let type_len = r.u32()? as usize;
        let str_off = r.u32()? as usize;
        let str_len = r.u32()? as usize;
        let types_at = hdr_len
            .checked_add(type_off)
            .ok_or(BtfError::Malformed("type section offset"))?;
        let strings_at = hdr_len
            .checked_add(str_off)
            .ok_or(BtfError::Malformed("string section offset"))?;
        let type_bytes = data
            .get(types_at..types_at.saturating_add(type_len))
            .ok_or(BtfError::Malformed("type section out of bounds"))?;
        let strings = data
            .get(strings_at..strings_at.saturating_add(str_len))
            .ok_or(BtfError::Malformed("string section out of bounds"))?
            .to_vec();

        // Type id 0 is void.
        let mut types = vec![Type::Other];
        let mut enum_values: Vec<(u32, i64)> = Vec::new();
        let mut typedef_names: Vec<(u32, u32)> = Vec::new();
        let mut r = Reader {
            data: type_bytes,
            pos: 0,
        };
        while r.pos < type_bytes.len() {
            let id = types.len() as u32;
            let name = r.u32()?;
            let info = r.u32()?;
            let size_or_type = r.u32()?;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kind_flag = info >> 31 == 1;
            let ty = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => {
                    r.skip(4)?;
                    Type::Other
                }
                KIND_PTR => Type::Ptr { ty: size_or_type },
                KIND_FWD | KIND_FUNC | KIND_FLOAT => Type::Other,
                KIND_ARRAY => {
                    let elem = r.u32()?;
                    r.skip(8)?;
                    Type::Array { elem }
                }
                KIND_STRUCT | KIND_UNION => {
                    let mut members = Vec::with_capacity(vlen);
                    for _ in 0..vlen {
                        let m_name = r.u32()?;
                        let m_ty = r.u32()?;
                        let offset = r.u32()?;
                        let (bit_offset, bitfield_size) = if kind_flag {
                            (offset & 0x00ff_ffff, offset >> 24)
                        } else {
                            (offset, 0)
                        };
                        members.push(Member {
                            name: m_name,
                            ty: m_ty,
                            bit_offset,
                            bitfield_size,
                        });
                    }
                    Type::Composite {
                        name,
                        size: size_or_type,
                        members,
                    }
                }
                KIND_ENUM => {
                    for _ in 0..vlen {
                        let e_name = r.u32()?;
                        let value = r.u32()? as i32;
                        enum_values.push((e_name, i64::from(value)));
                    }
                    Type::Other
                }
                KIND_ENUM64 => {
                    for _ in 0..vlen {
                        let e_name = r.u32()?;
                        let lo = u64::from(r.u32()?);
                        let hi = u64::from(r.u32()?);
                        enum_values.push((e_name, (hi << 32 | lo) as i64));
                    }
                    Type::Other
                }
                KIND_TYPEDEF => {
                    typedef_names.push((name, id));
                    Type::Alias { ty: size_or_type }
                }
                KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    Type::Alias { ty: size_or_type }
                }
                KIND_FUNC_PROTO => {
                    r.skip(8 * vlen)?;
                    Type::FuncProto {
                        params: vlen as u32,
                    }
                }
                KIND_DATASEC => {
                    r.skip(12 * vlen)?;
                    Type::Other
                }
                _ => return Err(BtfError::UnknownKind { kind, id }),
            };
            types.push(ty);
        }

        let mut btf = Btf {
            strings,
            types,
            structs: HashMap::new(),
            typedefs: HashMap::new(),
            enumerators: HashMap::new(),
        };
        for (name, id) in typedef_names {
            if let Some(n) = btf.string(name) {
                btf.typedefs.entry(n.to_string()).or_insert(id);
            }
        }
        for (id, ty) in btf.types.iter().enumerate() {
            if let Type::Composite { name, .. } = ty {
                if let Some(n) = btf.string(*name).filter(|n| !n.is_empty()) {
                    // The first definition wins; later duplicates are identical in vmlinux.
                    btf.structs.entry(n.to_string()).or_insert(id as u32);
                }
            }
        }
        for (name, value) in enum_values {
            if let Some(n) = btf.string(name) {
                btf.enumerators.entry(n.to_string()).or_insert(value);
            }
        }
        Ok(btf)
    }

    fn string(&self, offset: u32) -> Option<&str> {
        let rest = self.strings.get(offset as usize..)?;
        let end = rest.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&rest[..end]).ok()
    }

    /// Byte offset of `member` in `struct strukt` (or union), looking through anonymous
    /// structs and unions the way C does.
    pub fn member_offset(&self, strukt: &str, member: &str) -> Result<u32, BtfError> {
        let id = *self
            .structs
            .get(strukt)
            .ok_or_else(|| BtfError::NoStruct(strukt.into()))?;
        self.path_offset_from(id, strukt, &[member])
    }

    /// Byte offset along a path of members, each inside the previous one by value
    /// (e.g. `["cgroups"]` or `["css", "cgroup"]`).
    pub fn path_offset(&self, strukt: &str, path: &[&str]) -> Result<u32, BtfError> {
        let id = *self
            .structs
            .get(strukt)
            .ok_or_else(|| BtfError::NoStruct(strukt.into()))?;
        self.path_offset_from(id, strukt, path)
    }

    fn path_offset_from(&self, mut id: u32, strukt: &str, path: &[&str]) -> Result<u32, BtfError> {
        let mut total = 0;
        let mut within = strukt;
        for member in path {
            let (bits, m) = self
                .find_member(id, member, 0)
                .ok_or_else(|| BtfError::NoMember {
                    strukt: within.into(),
                    member: (*member).into(),
                })?;
            if m.bitfield_size != 0 || bits % 8 != 0 {
                return Err(BtfError::Bitfield {
                    strukt: within.into(),
                    member: (*member).into(),
                });
            }
            total += bits / 8;
            id = self.resolve(m.ty);
            within = member;
        }
        Ok(total)
    }

    /// What the type of `strukt.member` is (looking through typedefs and qualifiers).
    pub fn member_kind(&self, strukt: &str, member: &str) -> Result<MemberKind, BtfError> {
        let id = *self
            .structs
            .get(strukt)
            .ok_or_else(|| BtfError::NoStruct(strukt.into()))?;
        let (_, m) = self
            .find_member(id, member, 0)
            .ok_or_else(|| BtfError::NoMember {
                strukt: strukt.into(),
                member: member.into(),
            })?;
        Ok(match self.types.get(self.resolve(m.ty) as usize) {
            Some(Type::Array { elem }) => match self.types.get(self.resolve(*elem) as usize) {
                Some(Type::Composite { name, size, .. }) => MemberKind::Array {
                    elem_struct: self.string(*name).map(str::to_string),
                    elem_size: Some(*size),
                },
                _ => MemberKind::Array {
                    elem_struct: None,
                    elem_size: None,
                },
            },
            Some(Type::Composite { name, .. }) => {
                MemberKind::Struct(self.string(*name).unwrap_or("").to_string())
            }
            _ => MemberKind::Other,
        })
    }

    /// Number of arguments a BTF tracepoint passes to its programs, from the kernel's
    /// `btf_trace_<name>` typedef (a pointer to a prototype whose first parameter is the
    /// tracepoint's private data). `None` if the kernel has no such tracepoint.
    pub fn tracepoint_args(&self, name: &str) -> Option<u32> {
        let id = *self.typedefs.get(&format!("btf_trace_{name}"))?;
        let Some(Type::Ptr { ty }) = self.types.get(self.resolve(id) as usize) else {
            return None;
        };
        match self.types.get(self.resolve(*ty) as usize) {
            Some(Type::FuncProto { params }) => Some(params.saturating_sub(1)),
            _ => None,
        }
    }

    /// Value of an enumerator such as `memory_cgrp_id`.
    pub fn enumerator(&self, name: &str) -> Result<i64, BtfError> {
        self.enumerators
            .get(name)
            .copied()
            .ok_or_else(|| BtfError::NoEnumerator(name.into()))
    }

    fn resolve(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.types.get(id as usize) {
                Some(Type::Alias { ty }) => id = *ty,
                _ => break,
            }
        }
        id
    }

    /// The member's bit offset from the start of `id`, and the member.
    fn find_member(&self, id: u32, member: &str, base: u32) -> Option<(u32, &Member)> {
        let Some(Type::Composite { members, .. }) = self.types.get(self.resolve(id) as usize)
        else {
            return None;
        };
        for m in members {
            let name = self.string(m.name).unwrap_or("");
            if name == member {
                return Some((base + m.bit_offset, m));
            }
            if name.is_empty() {
                if let Some(found) = self.find_member(m.ty, member, base + m.bit_offset) {
                    return Some(found);
                }
            }
        }
        None
    }
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], BtfError> {
        let bytes = self
            .data
            .get(self.pos..self.pos + N)
            .ok_or(BtfError::Malformed("truncated"))?;
        self.pos += N;
        Ok(bytes.try_into().expect("slice has length N"))
    }
    fn u16(&mut self) -> Result<u16, BtfError> {
        self.take::<2>().map(u16::from_le_bytes)
    }
    fn u32(&mut self) -> Result<u32, BtfError> {
        self.take::<4>().map(u32::from_le_bytes)
    }
    fn skip(&mut self, n: usize) -> Result<(), BtfError> {
        if self.pos + n > self.data.len() {
            return Err(BtfError::Malformed("truncated"));
        }
        self.pos += n;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
