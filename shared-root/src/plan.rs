//! A jail's plan, and the steps it becomes.

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;
use nix::sys::stat::Mode;

use crate::error::{JailError, PlanError};
use crate::sys::Syscall;

/// The most calls a plan may make: a failure is reported through an
/// errno-sized number that holds the step's index in 15 bits.
pub const MAX_STEPS: usize = 1 << 15;

/// The devices every jail has, from the host's `/dev`.
pub const USUAL_DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// A host path at the same path in every node's jail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submount {
    pub name: String,
    pub source: PathBuf,
    /// Absolute, inside the jail; it must exist in the shared root.
    pub target: PathBuf,
    pub read_only: bool,
}

/// A host path shown at `/run/corral/<name>` in the jail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Extra {
    /// One path component.
    pub name: String,
    pub source: PathBuf,
    pub read_only: bool,
}

/// What a jail is made of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The shared root (absolute).
    pub root: PathBuf,
    /// Where the host's device nodes are (`/dev`; a parameter for tests).
    pub host_dev: PathBuf,
    /// Host device nodes the task may open, beside [`USUAL_DEVICES`]
    /// (`/dev/nvidia1`, `/dev/nvidiactl`, …); each appears under its own
    /// name in the jail's `/dev`.
    pub devices: Vec<PathBuf>,
    pub submounts: Vec<Submount>,
    /// The node's own files bound at the same path (read-only); each must
    /// exist in the shared root.
    pub host_files: Vec<PathBuf>,
    pub extras: Vec<Extra>,
    /// The node's GPU driver files (NVIDIA's libraries and tools), bound
    /// read-only at [`DRIVER_LIB`] (a name with `.so` in it) or
    /// [`DRIVER_BIN`] under their own names, in this task's namespace
    /// only: nothing is written onto the shared root, so nodes with
    /// different driver versions share one root.
    pub driver_files: Vec<PathBuf>,
    /// Size of the private `/tmp` in MiB (0: tmpfs's default, half of RAM).
    pub tmp_size_mb: u64,
}

/// Where a jail's driver libraries are (the loader is pointed there).
pub const DRIVER_LIB: &str = "/run/corral/driver/lib";
/// Where a jail's driver tools are (on the tasks' `PATH`).
pub const DRIVER_BIN: &str = "/run/corral/driver/bin";

/// Whether a driver file is a library (else a tool).
pub fn is_library(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n.to_string_lossy().contains(".so"))
}

impl Plan {
    /// A plan with the usual devices, the node's `/etc/resolv.conf` and
    /// `/etc/hosts`, and nothing else.
    pub fn new(root: impl Into<PathBuf>) -> Plan {
        Plan {
            root: root.into(),
            host_dev: "/dev".into(),
            devices: Vec::new(),
            submounts: Vec::new(),
            host_files: vec!["/etc/resolv.conf".into(), "/etc/hosts".into()],
            extras: Vec::new(),
            driver_files: Vec::new(),
            tmp_size_mb: 0,
        }
    }
}

/// Which step of the jail a call belongs to (names the error).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    Unshare,
    Private,
    BindRoot,
    Proc,
    Sys,
    Dev,
    /// Index into [`Prepared`]'s device list.
    Device(usize),
    Pts,
    Shm,
    Tmp,
    Run,
    Extra(usize),
    /// Index into the plan's driver files.
    Driver(usize),
    Submount(usize),
    HostFile(usize),
    Pivot,
    DetachOldRoot,
}

#[derive(Debug)]
enum Call {
    Unshare(CloneFlags),
    Mount {
        source: Option<CString>,
        target: CString,
        fstype: Option<CString>,
        flags: MsFlags,
        data: Option<CString>,
    },
    Umount2(CString, MntFlags),
    Mkdir(CString, Mode),
    CreateFile(CString),
    Symlink(CString, CString),
    Chdir(CString),
    PivotRoot(CString, CString),
    SetAttrRecursive(CString, u64),
}

#[derive(Debug)]
struct Step {
    kind: StepKind,
    call: Call,
}

/// The first step that failed, and how (no allocation needed to report
/// it from the child).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failed {
    pub step: usize,
    pub errno: Errno,
}

/// A plan turned into steps, ready to enter without allocating.
#[derive(Debug)]
pub struct Prepared {
    root: PathBuf,
    devices: Vec<PathBuf>,
    plan: Plan,
    steps: Vec<Step>,
}

fn c(path: &Path) -> Result<CString, PlanError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| PlanError::BadPath {
        what: "a path",
        path: path.to_path_buf(),
    })
}

fn cs(s: &str) -> CString {
    // Only called with literals and numbers, which hold no NUL.
    CString::new(s).unwrap_or_default()
}

/// An absolute path with no `..`, as a path relative to `/`.
fn inside(what: &'static str, p: &Path) -> Result<PathBuf, PlanError> {
    if !p.is_absolute() {
        return Err(PlanError::NotAbsolute {
            what,
            path: p.to_path_buf(),
        });
    }
    let mut rel = PathBuf::new();
    for part in p.components() {
        match part {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => rel.push(n),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(PlanError::BadPath {
                    what,
                    path: p.to_path_buf(),
                })
            }
        }
    }
    Ok(rel)
}

fn name_ok(what: &'static str, name: &str) -> Result<(), PlanError> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(PlanError::BadPath {
            what,
            path: name.into(),
        });
    }
    Ok(())
}

impl Plan {
    /// Checks the plan and builds its steps (in the parent, before fork).
    pub fn prepare(&self) -> Result<Prepared, PlanError> {
        inside("the shared root", &self.root)?;
        inside("the host's /dev", &self.host_dev)?;
        let root = self.root.clone();
        let at = |rel: &str| root.join(rel);
        let mut steps: Vec<Step> = Vec::new();
        let mut push = |kind: StepKind, call: Call| steps.push(Step { kind, call });
        let mount = |source: Option<&Path>,
                     target: &Path,
                     fstype: Option<&str>,
                     flags: MsFlags,
                     data: Option<&str>|
         -> Result<Call, PlanError> {
            Ok(Call::Mount {
                source: source.map(c).transpose()?,
                target: c(target)?,
                fstype: fstype.map(cs),
                flags,
                data: data.map(cs),
            })
        };
        let bind = |source: &Path, target: &Path| {
            mount(
                Some(source),
                target,
                None,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                None,
            )
        };
        let read_only = |target: &Path| {
            let flags = MsFlags::MS_BIND
                | MsFlags::MS_REMOUNT
                | MsFlags::MS_RDONLY
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV;
            mount(None, target, None, flags, None)
        };
        let tmpfs = |target: &Path, flags: MsFlags, data: &str| {
            mount(
                Some(Path::new("tmpfs")),
                target,
                Some("tmpfs"),
                flags,
                Some(data),
            )
        };
        let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        // A bind keeps its source's set-user-ID files and device nodes
        // working: the root and every submount are remounted without
        // them (keeping the source's read-only or noexec), so nothing in
        // a root or a directory a user filled gains privileges.
        let harden = |target: &Path, source: &Path| {
            let kept = source_flags(source);
            mount(
                None,
                target,
                None,
                MsFlags::MS_BIND | MsFlags::MS_REMOUNT | nosuid_nodev | kept,
                None,
            )
        };

        push(StepKind::Unshare, Call::Unshare(CloneFlags::CLONE_NEWNS));
        push(
            StepKind::Private,
            mount(
                None,
                Path::new("/"),
                None,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None,
            )?,
        );
        push(StepKind::BindRoot, bind(&root, &root)?);
        push(StepKind::BindRoot, harden(&root, &root)?);
        // Other users' processes stay invisible: the jail shares the
        // host's PID namespace.
        push(
            StepKind::Proc,
            mount(
                Some(Path::new("proc")),
                &at("proc"),
                Some("proc"),
                nosuid_nodev | MsFlags::MS_NOEXEC,
                Some("hidepid=2"),
            )?,
        );
        push(StepKind::Sys, bind(Path::new("/sys"), &at("sys"))?);
        push(StepKind::Sys, read_only(&at("sys"))?);
        // And every mount below it (`/sys/fs/cgroup` and its hierarchies,
        // debugfs, …): the remount above reaches only the top.
        push(
            StepKind::Sys,
            Call::SetAttrRecursive(c(&at("sys"))?, crate::sys::ATTR_LOCKED_DOWN),
        );

        // /dev: a tmpfs with only what the task may open.
        push(
            StepKind::Dev,
            tmpfs(&at("dev"), MsFlags::MS_NOSUID, "mode=755,size=64k")?,
        );
        let mut devices: Vec<PathBuf> = USUAL_DEVICES
            .iter()
            .map(|d| self.host_dev.join(d))
            .collect();
        devices.extend(self.devices.iter().cloned());
        let mut seen = std::collections::HashSet::new();
        for (i, d) in devices.iter().enumerate() {
            inside("a device", d)?;
            let name =
                d.file_name()
                    .and_then(|n| n.to_str())
                    .ok_or_else(|| PlanError::BadPath {
                        what: "a device",
                        path: d.clone(),
                    })?;
            if !seen.insert(name.to_string()) {
                return Err(PlanError::Duplicate {
                    what: "a device",
                    name: name.into(),
                });
            }
            let target = at("dev").join(name);
            push(StepKind::Device(i), Call::CreateFile(c(&target)?));
            push(StepKind::Device(i), bind(d, &target)?);
        }
        push(
            StepKind::Pts,
            Call::Mkdir(c(&at("dev/pts"))?, Mode::from_bits_truncate(0o755)),
        );
        push(
            StepKind::Pts,
            mount(
                Some(Path::new("devpts")),
                &at("dev/pts"),
                Some("devpts"),
                MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
                Some("newinstance,ptmxmode=0666,mode=0620"),
            )?,
        );
        push(
            StepKind::Pts,
            Call::Symlink(cs("pts/ptmx"), c(&at("dev/ptmx"))?),
        );
        for (link, to) in [
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
        ] {
            push(
                StepKind::Dev,
                Call::Symlink(cs(to), c(&at("dev").join(link))?),
            );
        }
        push(
            StepKind::Shm,
            Call::Mkdir(c(&at("dev/shm"))?, Mode::from_bits_truncate(0o755)),
        );
        push(
            StepKind::Shm,
            tmpfs(&at("dev/shm"), nosuid_nodev, "mode=1777")?,
        );

        let tmp_data = match self.tmp_size_mb {
            0 => "mode=1777".to_string(),
            n => format!("mode=1777,size={n}m"),
        };
        push(StepKind::Tmp, tmpfs(&at("tmp"), nosuid_nodev, &tmp_data)?);

        // /run: the task's own, with the extras under /run/corral.
        push(StepKind::Run, tmpfs(&at("run"), nosuid_nodev, "mode=755")?);
        push(
            StepKind::Run,
            Call::Mkdir(c(&at("run/corral"))?, Mode::from_bits_truncate(0o755)),
        );
        let mut names = std::collections::HashSet::new();
        for (i, e) in self.extras.iter().enumerate() {
            name_ok("an extra's name", &e.name)?;
            inside("an extra's source", &e.source)?;
            if !names.insert(e.name.clone()) {
                return Err(PlanError::Duplicate {
                    what: "an extra",
                    name: e.name.clone(),
                });
            }
            let meta = std::fs::metadata(&e.source).map_err(|source| PlanError::Missing {
                what: "an extra's source",
                path: e.source.clone(),
                source,
            })?;
            let target = at("run/corral").join(&e.name);
            let point = if meta.is_dir() {
                Call::Mkdir(c(&target)?, Mode::from_bits_truncate(0o755))
            } else {
                Call::CreateFile(c(&target)?)
            };
            push(StepKind::Extra(i), point);
            push(StepKind::Extra(i), bind(&e.source, &target)?);
            if e.read_only {
                push(StepKind::Extra(i), read_only(&target)?);
            }
        }

        if !self.driver_files.is_empty() {
            for d in [
                "run/corral/driver",
                "run/corral/driver/lib",
                "run/corral/driver/bin",
            ] {
                push(
                    StepKind::Run,
                    Call::Mkdir(c(&at(d))?, Mode::from_bits_truncate(0o755)),
                );
            }
        }
        let mut names = std::collections::HashSet::new();
        for (i, f) in self.driver_files.iter().enumerate() {
            inside("a driver file", f)?;
            let name = f
                .file_name()
                .and_then(|n| n.to_str())
                .filter(|n| name_ok("a driver file", n).is_ok())
                .ok_or_else(|| PlanError::BadPath {
                    what: "a driver file",
                    path: f.clone(),
                })?;
            if !names.insert(name.to_string()) {
                return Err(PlanError::Duplicate {
                    what: "a driver file",
                    name: name.into(),
                });
            }
            let dir = if is_library(f) {
                DRIVER_LIB
            } else {
                DRIVER_BIN
            };
            let target = root.join(dir.trim_start_matches('/')).join(name);
            push(StepKind::Driver(i), Call::CreateFile(c(&target)?));
            push(StepKind::Driver(i), bind(f, &target)?);
            let ro =
                MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NODEV;
            push(
                StepKind::Driver(i),
                mount(None, &target, None, ro | MsFlags::MS_NOSUID, None)?,
            );
        }

        let mut names = std::collections::HashSet::new();
        for (i, s) in self.submounts.iter().enumerate() {
            name_ok("a submount's name", &s.name)?;
            inside("a submount's source", &s.source)?;
            let rel = inside("a submount's target", &s.target)?;
            if !names.insert(s.name.clone()) {
                return Err(PlanError::Duplicate {
                    what: "a submount",
                    name: s.name.clone(),
                });
            }
            let target = root.join(rel);
            push(StepKind::Submount(i), bind(&s.source, &target)?);
            if s.read_only {
                push(StepKind::Submount(i), read_only(&target)?);
            } else {
                push(StepKind::Submount(i), harden(&target, &s.source)?);
            }
        }
        for (i, f) in self.host_files.iter().enumerate() {
            let target = root.join(inside("a node file", f)?);
            push(StepKind::HostFile(i), bind(f, &target)?);
            push(StepKind::HostFile(i), read_only(&target)?);
        }

        // pivot_root(".", ".") stacks the old root on the new one; detaching
        // it leaves only the jail, with no directory for it in the root.
        push(StepKind::Pivot, Call::Chdir(c(&root)?));
        push(StepKind::Pivot, Call::PivotRoot(cs("."), cs(".")));
        push(
            StepKind::DetachOldRoot,
            Call::Umount2(cs("."), MntFlags::MNT_DETACH),
        );
        push(StepKind::DetachOldRoot, Call::Chdir(cs("/")));
        if steps.len() > MAX_STEPS {
            return Err(PlanError::TooLarge { steps: steps.len() });
        }
        Ok(Prepared {
            root,
            devices,
            plan: self.clone(),
            steps,
        })
    }
}

/// The flags of the mount `path` is on that a remount of its bind must
/// keep (read-only, noexec, noatime); none when it cannot be read (a
/// plan made for a root that is not there yet, in tests).
fn source_flags(path: &Path) -> MsFlags {
    use nix::sys::statvfs::FsFlags;
    let Ok(st) = nix::sys::statvfs::statvfs(path) else {
        return MsFlags::empty();
    };
    let f = st.flags();
    let mut out = MsFlags::empty();
    for (fs, ms) in [
        (FsFlags::ST_RDONLY, MsFlags::MS_RDONLY),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if f.contains(fs) {
            out |= ms;
        }
    }
    out
}

fn opt(s: &Option<CString>) -> Option<&CStr> {
    s.as_deref()
}

impl Prepared {
    /// Enters the jail: every step in order, stopping at the first that
    /// fails. Allocates nothing, so it may run between fork and exec.
    pub fn enter(&self, sys: &impl Syscall) -> Result<(), Failed> {
        for (i, step) in self.steps.iter().enumerate() {
            let r = match &step.call {
                Call::Unshare(flags) => sys.unshare(*flags),
                Call::Mount {
                    source,
                    target,
                    fstype,
                    flags,
                    data,
                } => sys.mount(opt(source), target, opt(fstype), *flags, opt(data)),
                Call::Umount2(target, flags) => sys.umount2(target, *flags),
                Call::Mkdir(path, mode) => sys.mkdir(path, *mode),
                Call::CreateFile(path) => sys.create_file(path),
                Call::Symlink(target, link) => sys.symlink(target, link),
                Call::Chdir(path) => sys.chdir(path),
                Call::PivotRoot(new, old) => sys.pivot_root(new, old),
                Call::SetAttrRecursive(path, set) => sys.set_attr_recursive(path, *set),
            };
            r.map_err(|errno| Failed { step: i, errno })?;
        }
        Ok(())
    }

    /// The shared root this jail enters.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// How many calls entering makes.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The kind of step of call `i`.
    pub fn kind(&self, i: usize) -> Option<StepKind> {
        self.steps.get(i).map(|s| s.kind)
    }

    /// Names a failure the child reported.
    pub fn error(&self, f: Failed) -> JailError {
        let source = std::io::Error::from_raw_os_error(f.errno as i32);
        let p = &self.plan;
        match self.kind(f.step).unwrap_or(StepKind::Unshare) {
            StepKind::Unshare => JailError::Unshare(source),
            StepKind::Private => JailError::Private(source),
            StepKind::BindRoot => JailError::BindRoot {
                root: self.root.clone(),
                source,
            },
            StepKind::Proc => JailError::Proc(source),
            StepKind::Sys => JailError::Sys(source),
            StepKind::Dev => JailError::Dev(source),
            StepKind::Device(i) => JailError::Device {
                path: self.devices.get(i).cloned().unwrap_or_default(),
                source,
            },
            StepKind::Pts => JailError::Pts(source),
            StepKind::Shm => JailError::Shm(source),
            StepKind::Tmp => JailError::Tmp(source),
            StepKind::Run => JailError::Run(source),
            StepKind::Extra(i) => {
                let e = p.extras.get(i);
                JailError::Extra {
                    name: e.map(|e| e.name.clone()).unwrap_or_default(),
                    source_path: e.map(|e| e.source.clone()).unwrap_or_default(),
                    source,
                }
            }
            StepKind::Submount(i) => {
                let s = p.submounts.get(i);
                JailError::Submount {
                    name: s.map(|s| s.name.clone()).unwrap_or_default(),
                    source_path: s.map(|s| s.source.clone()).unwrap_or_default(),
                    target: s.map(|s| s.target.clone()).unwrap_or_default(),
                    source,
                }
            }
            StepKind::HostFile(i) => JailError::HostFile {
                path: p.host_files.get(i).cloned().unwrap_or_default(),
                source,
            },
            StepKind::Driver(i) => JailError::Driver {
                path: p.driver_files.get(i).cloned().unwrap_or_default(),
                source,
            },
            StepKind::Pivot => JailError::Pivot {
                root: self.root.clone(),
                source,
            },
            StepKind::DetachOldRoot => JailError::DetachOldRoot(source),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::Recorder;

    fn plan(extra_source: &Path) -> Plan {
        let mut p = Plan::new("/jail");
        p.host_dev = "/hostdev".into();
        p.devices = vec!["/hostdev/nvidia1".into(), "/hostdev/nvidiactl".into()];
        p.submounts = vec![Submount {
            name: "data".into(),
            source: "/srv/data".into(),
            target: "/data".into(),
            read_only: true,
        }];
        p.extras = vec![Extra {
            name: "bin".into(),
            source: extra_source.to_path_buf(),
            read_only: true,
        }];
        p
    }

    fn recorded(p: &Plan) -> Vec<String> {
        let r = Recorder::default();
        p.prepare()
            .expect("a good plan")
            .enter(&r)
            .expect("no failure");
        r.calls()
    }

    fn position(calls: &[String], prefix: &str) -> usize {
        calls
            .iter()
            .position(|c| c.starts_with(prefix))
            .unwrap_or_else(|| panic!("no call starting {prefix:?} in {calls:#?}"))
    }

    #[test]
    fn every_mount_under_sys_is_made_read_only() {
        let dir = tempfile::tempdir().unwrap();
        let calls = recorded(&plan(dir.path()));
        let top = position(&calls, "mount - /jail/sys - MS_RDONLY");
        assert_eq!(calls[top + 1], "mount_setattr /jail/sys AT_RECURSIVE 0xf");
    }

    #[test]
    fn driver_files_are_bound_read_only_under_run_corral_driver() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = plan(dir.path());
        p.driver_files = vec![
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
            "/usr/bin/nvidia-smi".into(),
        ];
        let calls = recorded(&p);
        for want in [
            "mkdir /jail/run/corral/driver/lib",
            "create /jail/run/corral/driver/lib/libcuda.so.1",
            "mount /usr/lib/x86_64-linux-gnu/libcuda.so.1 /jail/run/corral/driver/lib/libcuda.so.1 - MS_BIND",
            "mount - /jail/run/corral/driver/lib/libcuda.so.1 - MS_RDONLY",
            "create /jail/run/corral/driver/bin/nvidia-smi",
        ] {
            position(&calls, want);
        }
        // Before the pivot, after /run exists.
        assert!(
            position(&calls, "mount tmpfs /jail/run")
                < position(&calls, "create /jail/run/corral/driver/lib/libcuda.so.1")
        );
        // A failure names the file.
        let prepared = p.prepare().unwrap();
        let i = (0..prepared.len())
            .find(|&i| prepared.kind(i) == Some(StepKind::Driver(1)))
            .unwrap();
        let e = prepared.error(Failed {
            step: i,
            errno: Errno::ENOENT,
        });
        assert!(e.to_string().contains("/usr/bin/nvidia-smi"), "{e}");
        // Two files of one name cannot both be there.
        p.driver_files.push("/opt/other/libcuda.so.1".into());
        assert!(matches!(p.prepare(), Err(PlanError::Duplicate { .. })));
    }

    #[test]
    fn steps_go_in_order_and_stay_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let calls = recorded(&plan(dir.path()));
        assert_eq!(calls[0], "unshare CLONE_NEWNS");
        assert!(
            calls[1].starts_with("mount - / - MS_REC|MS_PRIVATE"),
            "{}",
            calls[1]
        );
        assert!(
            calls[2].starts_with("mount /jail /jail - MS_BIND|MS_REC"),
            "{}",
            calls[2]
        );
        // The root's set-user-ID files and devices do nothing inside, and
        // no submount's either.
        let hardened =
            |c: &str| c.contains("MS_REMOUNT") && c.contains("MS_NOSUID") && c.contains("MS_NODEV");
        assert!(
            calls[3].starts_with("mount - /jail ") && hardened(&calls[3]),
            "{}",
            calls[3]
        );
        let data = calls
            .iter()
            .position(|c| c.starts_with("mount /srv/data /jail/data"))
            .expect("the submount");
        assert!(
            calls[data + 1].starts_with("mount - /jail/data ") && hardened(&calls[data + 1]),
            "{}",
            calls[data + 1]
        );
        let order = [
            "mount proc /jail/proc proc",
            "mount /sys /jail/sys",
            "mount tmpfs /jail/dev tmpfs",
            "create /jail/dev/null",
            "create /jail/dev/nvidia1",
            "mount devpts /jail/dev/pts devpts",
            "mount tmpfs /jail/dev/shm",
            "mount tmpfs /jail/tmp tmpfs",
            "mount tmpfs /jail/run tmpfs",
            "mkdir /jail/run/corral",
            "mount /srv/data /jail/data",
            "mount /etc/resolv.conf /jail/etc/resolv.conf",
            "chdir /jail",
            "pivot_root . .",
            "umount2 . MNT_DETACH",
        ];
        let at: Vec<usize> = order.iter().map(|p| position(&calls, p)).collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{calls:#?}");
        assert_eq!(calls.last().map(String::as_str), Some("chdir /"));
        // Only the usual devices and the plan's are exposed.
        let devices: Vec<&str> = calls
            .iter()
            .filter_map(|c| c.strip_prefix("create /jail/dev/"))
            .collect();
        assert_eq!(
            devices,
            [
                "null",
                "zero",
                "full",
                "random",
                "urandom",
                "tty",
                "nvidia1",
                "nvidiactl"
            ]
        );
        // Every mount lands inside the root (the first only changes
        // propagation of what is already there).
        for c in calls.iter().filter(|c| c.starts_with("mount ")).skip(1) {
            let target = c.split(' ').nth(2).unwrap_or("");
            assert!(target.starts_with("/jail"), "{c}");
        }
        // Read-only binds are remounted read-only right after.
        let ro = position(&calls, "mount /srv/data /jail/data");
        assert!(calls[ro + 1].contains("MS_RDONLY") && calls[ro + 1].contains("/jail/data"));
    }

    #[test]
    fn each_failing_step_stops_there_and_names_itself() {
        let dir = tempfile::tempdir().unwrap();
        let prepared = plan(dir.path()).prepare().unwrap();
        for i in 0..prepared.len() {
            let r = Recorder::failing(i, Errno::EACCES);
            let f = prepared.enter(&r).unwrap_err();
            assert_eq!(
                f,
                Failed {
                    step: i,
                    errno: Errno::EACCES
                }
            );
            assert_eq!(r.calls().len(), i + 1, "nothing after the failing call");
            let e = prepared.error(f);
            let text = e.to_string();
            let kind = prepared.kind(i).unwrap();
            let ok = match (kind, &e) {
                (StepKind::Unshare, JailError::Unshare(_))
                | (StepKind::Private, JailError::Private(_))
                | (StepKind::Proc, JailError::Proc(_))
                | (StepKind::Sys, JailError::Sys(_))
                | (StepKind::Dev, JailError::Dev(_))
                | (StepKind::Pts, JailError::Pts(_))
                | (StepKind::Shm, JailError::Shm(_))
                | (StepKind::Tmp, JailError::Tmp(_))
                | (StepKind::Run, JailError::Run(_))
                | (StepKind::DetachOldRoot, JailError::DetachOldRoot(_)) => true,
                (StepKind::BindRoot, JailError::BindRoot { .. })
                | (StepKind::Pivot, JailError::Pivot { .. }) => text.contains("/jail"),
                (StepKind::Device(_), JailError::Device { path, .. }) => {
                    text.contains(&*path.to_string_lossy())
                }
                (StepKind::Extra(0), JailError::Extra { name, .. }) => name == "bin",
                (StepKind::Submount(0), JailError::Submount { name, .. }) => {
                    name == "data" && text.contains("/srv/data")
                }
                (StepKind::HostFile(i), JailError::HostFile { path, .. }) => {
                    *path == plan(dir.path()).host_files[i]
                }
                _ => false,
            };
            assert!(ok, "call {i} ({kind:?}) failed as {e:?}");
            let cause = std::error::Error::source(&e).map(ToString::to_string);
            assert_eq!(cause.as_deref(), Some("Permission denied (os error 13)"));
        }
    }

    #[test]
    fn plans_that_cannot_be_jails_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let good = plan(dir.path());
        let refused = |change: &dyn Fn(&mut Plan)| {
            let mut p = good.clone();
            change(&mut p);
            p.prepare().map(|_| ()).unwrap_err().to_string()
        };
        assert!(refused(&|p| p.root = "jail".into()).contains("absolute"));
        assert!(refused(&|p| p.submounts[0].target = "/data/../etc".into()).contains(".."));
        assert!(refused(&|p| p.devices.push("/other/nvidia1".into())).contains("twice"));
        assert!(refused(&|p| p.extras[0].name = "a/b".into()).contains("a/b"));
        let missing = refused(&|p| p.extras[0].source = "/no/such/corral".into());
        assert!(missing.contains("/no/such/corral"), "{missing}");
        let huge = refused(&|p| {
            p.devices = (0..MAX_STEPS)
                .map(|i| format!("/dev/nvidia{i}").into())
                .collect()
        });
        assert!(huge.contains("too many"), "{huge}");
        assert!(good.prepare().is_ok());
    }
}
