//! The seam between the jail's steps and the kernel.
//!
//! [`Kernel`] makes the system calls; [`Recorder`] writes them down for
//! tests. The kernel's side never allocates: every argument is a `&CStr`
//! prepared before fork.

use std::cell::RefCell;
use std::ffi::CStr;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;
use nix::sys::stat::Mode;

/// The system calls a jail needs.
pub trait Syscall {
    fn unshare(&self, flags: CloneFlags) -> Result<(), Errno>;
    fn mount(
        &self,
        source: Option<&CStr>,
        target: &CStr,
        fstype: Option<&CStr>,
        flags: MsFlags,
        data: Option<&CStr>,
    ) -> Result<(), Errno>;
    fn umount2(&self, target: &CStr, flags: MntFlags) -> Result<(), Errno>;
    fn mkdir(&self, path: &CStr, mode: Mode) -> Result<(), Errno>;
    /// Creates an empty regular file (a mount point for a bound file).
    fn create_file(&self, path: &CStr) -> Result<(), Errno>;
    fn symlink(&self, target: &CStr, link: &CStr) -> Result<(), Errno>;
    fn chdir(&self, path: &CStr) -> Result<(), Errno>;
    fn pivot_root(&self, new_root: &CStr, put_old: &CStr) -> Result<(), Errno>;
    /// Sets `MOUNT_ATTR_*` flags (`set`) on the mount at `path` and every
    /// mount below it (`mount_setattr` with `AT_RECURSIVE`).
    fn set_attr_recursive(&self, path: &CStr, set: u64) -> Result<(), Errno>;
}

/// `MOUNT_ATTR_RDONLY | NOSUID | NODEV | NOEXEC`.
pub const ATTR_LOCKED_DOWN: u64 = 0x1 | 0x2 | 0x4 | 0x8;

/// The kernel's `struct mount_attr` (its first version, 32 bytes).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// The real kernel.
#[derive(Debug, Default, Clone, Copy)]
pub struct Kernel;

impl Syscall for Kernel {
    fn unshare(&self, flags: CloneFlags) -> Result<(), Errno> {
        nix::sched::unshare(flags)
    }

    fn mount(
        &self,
        source: Option<&CStr>,
        target: &CStr,
        fstype: Option<&CStr>,
        flags: MsFlags,
        data: Option<&CStr>,
    ) -> Result<(), Errno> {
        nix::mount::mount(source, target, fstype, flags, data)
    }

    fn umount2(&self, target: &CStr, flags: MntFlags) -> Result<(), Errno> {
        nix::mount::umount2(target, flags)
    }

    fn mkdir(&self, path: &CStr, mode: Mode) -> Result<(), Errno> {
        nix::unistd::mkdir(path, mode)
    }

    fn create_file(&self, path: &CStr) -> Result<(), Errno> {
        let flags = OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_CLOEXEC;
        let fd = nix::fcntl::open(path, flags | OFlag::O_NOFOLLOW, Mode::empty())?;
        nix::unistd::close(fd)
    }

    fn symlink(&self, target: &CStr, link: &CStr) -> Result<(), Errno> {
        nix::unistd::symlinkat(target, None, link)
    }

    fn chdir(&self, path: &CStr) -> Result<(), Errno> {
        nix::unistd::chdir(path)
    }

    fn pivot_root(&self, new_root: &CStr, put_old: &CStr) -> Result<(), Errno> {
        nix::unistd::pivot_root(new_root, put_old)
    }

    /// A kernel without `mount_setattr` (before 5.12) leaves the mounts
    /// below as they were: the top stays read-only, file modes still hold.
    #[allow(unsafe_code)]
    fn set_attr_recursive(&self, path: &CStr, set: u64) -> Result<(), Errno> {
        let attr = MountAttr {
            attr_set: set,
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        };
        // SAFETY: `path` is a NUL-terminated string and `attr` a live
        // struct of the size passed, both only read by the kernel; no
        // allocation (safe between fork and exec).
        let r = unsafe {
            nix::libc::syscall(
                nix::libc::SYS_mount_setattr,
                nix::libc::AT_FDCWD,
                path.as_ptr(),
                nix::libc::AT_RECURSIVE as nix::libc::c_uint,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            )
        };
        match Errno::result(r) {
            Ok(_) | Err(Errno::ENOSYS) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Writes down every call, one line each, and fails the `fail_at`-th call
/// (0-based) with `errno`, for tests.
#[derive(Debug, Default)]
pub struct Recorder {
    pub calls: RefCell<Vec<String>>,
    pub fail_at: Option<(usize, Errno)>,
}

impl Recorder {
    /// A recorder that fails call `n` with `errno`.
    pub fn failing(n: usize, errno: Errno) -> Self {
        Recorder {
            calls: RefCell::default(),
            fail_at: Some((n, errno)),
        }
    }

    /// The calls so far.
    pub fn calls(&self) -> Vec<String> {
        self.calls.borrow().clone()
    }

    fn record(&self, line: String) -> Result<(), Errno> {
        let mut calls = self.calls.borrow_mut();
        let n = calls.len();
        calls.push(line);
        match self.fail_at {
            Some((at, errno)) if at == n => Err(errno),
            _ => Ok(()),
        }
    }
}

/// Flag names joined by `|` (`MS_BIND|MS_REC`).
macro_rules! names {
    ($f:expr) => {
        $f.iter_names()
            .map(|(n, _)| n)
            .collect::<Vec<_>>()
            .join("|")
    };
}

fn text(s: Option<&CStr>) -> String {
    s.map_or_else(|| "-".to_string(), |s| s.to_string_lossy().into_owned())
}

impl Syscall for Recorder {
    fn unshare(&self, flags: CloneFlags) -> Result<(), Errno> {
        self.record(format!("unshare {}", names!(flags)))
    }

    fn mount(
        &self,
        source: Option<&CStr>,
        target: &CStr,
        fstype: Option<&CStr>,
        flags: MsFlags,
        data: Option<&CStr>,
    ) -> Result<(), Errno> {
        self.record(format!(
            "mount {} {} {} {} {}",
            text(source),
            text(Some(target)),
            text(fstype),
            names!(flags),
            text(data)
        ))
    }

    fn umount2(&self, target: &CStr, flags: MntFlags) -> Result<(), Errno> {
        self.record(format!("umount2 {} {}", text(Some(target)), names!(flags)))
    }

    fn mkdir(&self, path: &CStr, mode: Mode) -> Result<(), Errno> {
        self.record(format!("mkdir {} {:o}", text(Some(path)), mode.bits()))
    }

    fn create_file(&self, path: &CStr) -> Result<(), Errno> {
        self.record(format!("create {}", text(Some(path))))
    }

    fn symlink(&self, target: &CStr, link: &CStr) -> Result<(), Errno> {
        self.record(format!(
            "symlink {} {}",
            text(Some(target)),
            text(Some(link))
        ))
    }

    fn chdir(&self, path: &CStr) -> Result<(), Errno> {
        self.record(format!("chdir {}", text(Some(path))))
    }

    fn pivot_root(&self, new_root: &CStr, put_old: &CStr) -> Result<(), Errno> {
        self.record(format!(
            "pivot_root {} {}",
            text(Some(new_root)),
            text(Some(put_old))
        ))
    }

    fn set_attr_recursive(&self, path: &CStr, set: u64) -> Result<(), Errno> {
        self.record(format!(
            "mount_setattr {} AT_RECURSIVE {set:#x}",
            text(Some(path))
        ))
    }
}
