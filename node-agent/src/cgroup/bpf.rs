//! cgroup v2 device control: a small eBPF program of type
//! `BPF_PROG_TYPE_CGROUP_DEVICE`, attached to a job's cgroup, that denies
//! the GPU device nodes the job was not given and allows everything else
//! (v2 has no `devices.deny` file; the kernel asks the program instead).
//!
//! The program is assembled here from a handful of instructions and
//! loaded with the raw `bpf(2)` call: no BPF toolchain, no libbpf.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A character device `major:minor` a job may not open or create.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Denied {
    pub major: u32,
    pub minor: u32,
}

/// One BPF instruction: opcode, registers (dst low nibble, src high),
/// offset, immediate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

impl Insn {
    fn bytes(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0] = self.code;
        b[1] = self.regs;
        b[2..4].copy_from_slice(&self.off.to_le_bytes());
        b[4..8].copy_from_slice(&self.imm.to_le_bytes());
        b
    }
}

// Opcodes (linux/bpf.h, linux/bpf_common.h).
const LDX_MEM_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
const ALU32_AND_K: u8 = 0x54; // BPF_ALU | BPF_AND | BPF_K
const ALU64_MOV_K: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
const JMP_JNE_K: u8 = 0x55; // BPF_JMP | BPF_JNE | BPF_K
const JMP_JEQ_K: u8 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const JMP_EXIT: u8 = 0x95; // BPF_JMP | BPF_EXIT

/// `bpf_cgroup_dev_ctx.access_type` low half: a character device.
const DEVCG_DEV_CHAR: i32 = 2;

fn ldx_w(dst: u8, src: u8, off: i16) -> Insn {
    Insn {
        code: LDX_MEM_W,
        regs: dst | (src << 4),
        off,
        imm: 0,
    }
}

fn jmp(code: u8, dst: u8, imm: i32, off: usize) -> Insn {
    Insn {
        code,
        regs: dst,
        off: off as i16,
        imm,
    }
}

fn ret(value: i32) -> [Insn; 2] {
    [
        Insn {
            code: ALU64_MOV_K,
            regs: 0,
            off: 0,
            imm: value,
        },
        Insn {
            code: JMP_EXIT,
            regs: 0,
            off: 0,
            imm: 0,
        },
    ]
}

/// The program: r2 = device type, r3 = major, r4 = minor (the context is
/// `{u32 access_type; u32 major; u32 minor}`); a character device whose
/// major and minor are in `denied` returns 0 (EPERM), anything else 1.
/// Denied devices are grouped by major.
fn program(denied: &[Denied]) -> Vec<Insn> {
    let mut majors: Vec<u32> = denied.iter().map(|d| d.major).collect();
    majors.sort_unstable();
    majors.dedup();
    let mut p = vec![
        ldx_w(2, 1, 0),
        Insn {
            code: ALU32_AND_K,
            regs: 2,
            off: 0,
            imm: 0xffff,
        },
        ldx_w(3, 1, 4),
        ldx_w(4, 1, 8),
    ];
    // Jumps to the final "allow" and "deny" are patched once their
    // positions are known: (index, target).
    let mut to_allow = Vec::new();
    let mut to_deny = Vec::new();
    to_allow.push(p.len());
    p.push(jmp(JMP_JNE_K, 2, DEVCG_DEV_CHAR, 0));
    for major in majors {
        let minors: Vec<u32> = denied
            .iter()
            .filter(|d| d.major == major)
            .map(|d| d.minor)
            .collect();
        // if major != this one, skip this group's minor tests.
        let skip = p.len();
        p.push(jmp(JMP_JNE_K, 3, major as i32, minors.len()));
        for m in minors {
            to_deny.push(p.len());
            p.push(jmp(JMP_JEQ_K, 4, m as i32, 0));
        }
        debug_assert_eq!(p.len() - skip - 1, p[skip].off as usize);
    }
    let allow = p.len();
    p.extend(ret(1));
    let deny = p.len();
    p.extend(ret(0));
    for i in to_allow {
        p[i].off = (allow - i - 1) as i16;
    }
    for i in to_deny {
        p[i].off = (deny - i - 1) as i16;
    }
    p
}

/// Why the device program could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("loading the device program (bpf BPF_PROG_LOAD): {0}")]
    Load(#[source] std::io::Error),
    #[error("attaching the device program to the job's cgroup (bpf BPF_PROG_ATTACH): {0}")]
    Attach(#[source] std::io::Error),
    #[error("too many denied devices ({0})")]
    TooMany(usize),
}

const BPF_PROG_LOAD: i64 = 5;
const BPF_PROG_ATTACH: i64 = 8;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
const BPF_F_ALLOW_MULTI: u32 = 2;

/// Size of the `union bpf_attr` passed; the unused tail is zero, as the
/// kernel requires.
const ATTR_SIZE: usize = 128;

#[allow(unsafe_code)]
fn bpf(cmd: i64, attr: &mut [u8; ATTR_SIZE]) -> std::io::Result<i64> {
    // SAFETY: `attr` is a live, writable buffer of ATTR_SIZE bytes laid
    // out as `union bpf_attr` for `cmd`; every pointer inside it refers to
    // memory the caller keeps alive across the call.
    let r =
        unsafe { nix::libc::syscall(nix::libc::SYS_bpf, cmd, attr.as_mut_ptr(), ATTR_SIZE as u32) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn put_u32(attr: &mut [u8; ATTR_SIZE], at: usize, v: u32) {
    attr[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put_u64(attr: &mut [u8; ATTR_SIZE], at: usize, v: u64) {
    attr[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

/// Loads the program denying `denied` and attaches it to the cgroup open
/// at `cgroup` (a directory descriptor). The attachment lives as long as
/// the cgroup; the program's descriptor is closed on return.
pub fn attach(cgroup: &impl AsRawFd, denied: &[Denied]) -> Result<(), BpfError> {
    if denied.len() > 4096 {
        return Err(BpfError::TooMany(denied.len()));
    }
    let insns: Vec<u8> = program(denied).into_iter().flat_map(Insn::bytes).collect();
    let license = c"GPL";
    let mut attr = [0u8; ATTR_SIZE];
    // struct { u32 prog_type; u32 insn_cnt; u64 insns; u64 license; ... }
    put_u32(&mut attr, 0, BPF_PROG_TYPE_CGROUP_DEVICE);
    put_u32(&mut attr, 4, (insns.len() / 8) as u32);
    put_u64(&mut attr, 8, insns.as_ptr() as u64);
    put_u64(&mut attr, 16, license.as_ptr() as u64);
    let fd = bpf(BPF_PROG_LOAD, &mut attr).map_err(BpfError::Load)?;
    // SAFETY: a successful BPF_PROG_LOAD returns a new descriptor we own.
    #[allow(unsafe_code)]
    let prog = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let mut attr = [0u8; ATTR_SIZE];
    // struct { u32 target_fd; u32 attach_bpf_fd; u32 attach_type; u32 attach_flags; }
    put_u32(&mut attr, 0, cgroup.as_raw_fd() as u32);
    put_u32(&mut attr, 4, prog.as_raw_fd() as u32);
    put_u32(&mut attr, 8, BPF_CGROUP_DEVICE);
    put_u32(&mut attr, 12, BPF_F_ALLOW_MULTI);
    bpf(BPF_PROG_ATTACH, &mut attr).map_err(BpfError::Attach)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the program on a context the way the kernel would: a tiny
    /// interpreter for exactly the instructions [`program`] emits.
    fn run(p: &[Insn], kind: u32, major: u32, minor: u32) -> i64 {
        let ctx = [kind, major, minor];
        let mut r = [0i64; 11];
        let mut pc = 0usize;
        loop {
            let i = p[pc];
            let (dst, src) = ((i.regs & 0xf) as usize, (i.regs >> 4) as usize);
            pc += 1;
            match i.code {
                LDX_MEM_W => {
                    assert_eq!(src, 1, "loads come from the context");
                    r[dst] = i64::from(ctx[i.off as usize / 4]);
                }
                ALU32_AND_K => r[dst] = (r[dst] as u32 & i.imm as u32) as i64,
                ALU64_MOV_K => r[dst] = i64::from(i.imm),
                JMP_JNE_K if r[dst] != i64::from(i.imm) => pc += i.off as usize,
                JMP_JEQ_K if r[dst] == i64::from(i.imm) => pc += i.off as usize,
                JMP_JNE_K | JMP_JEQ_K => {}
                JMP_EXIT => return r[0],
                c => panic!("unexpected opcode {c:#x}"),
            }
        }
    }

    const READ: u32 = 2 << 16; // BPF_DEVCG_ACC_READ
    const CHAR: u32 = 2;
    const BLOCK: u32 = 1;

    #[test]
    fn the_program_denies_exactly_the_listed_character_devices() {
        let denied = [
            Denied {
                major: 195,
                minor: 0,
            },
            Denied {
                major: 195,
                minor: 2,
            },
            Denied {
                major: 240,
                minor: 7,
            },
        ];
        let p = program(&denied);
        assert_eq!(run(&p, READ | CHAR, 195, 0), 0);
        assert_eq!(run(&p, READ | CHAR, 195, 2), 0);
        assert_eq!(run(&p, READ | CHAR, 240, 7), 0);
        // The job's own GPU, the control device, other devices: allowed.
        assert_eq!(run(&p, READ | CHAR, 195, 1), 1);
        assert_eq!(run(&p, READ | CHAR, 195, 255), 1);
        assert_eq!(run(&p, READ | CHAR, 1, 3), 1);
        assert_eq!(run(&p, READ | CHAR, 240, 0), 1);
        // A block device with the same numbers is not a GPU.
        assert_eq!(run(&p, READ | BLOCK, 195, 0), 1);
    }

    #[test]
    fn an_empty_list_allows_everything() {
        let p = program(&[]);
        assert_eq!(run(&p, READ | CHAR, 195, 0), 1);
        assert_eq!(p.len(), 4 + 1 + 2 + 2);
    }
}
