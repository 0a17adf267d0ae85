//! A throw-away shared root that borrows the host's `/usr` (read-only):
//! enough for `/bin/sh` and the usual tools, for tests and demos on a
//! machine without debootstrap. A real cluster's root is a full
//! distribution on shared storage.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::plan::{Plan, Submount};

/// Lays out `dir` as a root: the directories a jail mounts over, the
/// usrmerge links, an `/etc/os-release` naming `id`, and empty
/// `/etc/hosts` and `/etc/resolv.conf` for the node's to cover.
pub fn host_usr(dir: &Path, id: &str) -> std::io::Result<()> {
    for d in ["proc", "sys", "dev", "tmp", "run", "etc", "usr", "home"] {
        std::fs::create_dir_all(dir.join(d))?;
    }
    for (link, to) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("sbin", "usr/sbin"),
    ] {
        if std::fs::symlink_metadata(dir.join(link)).is_err() {
            std::os::unix::fs::symlink(to, dir.join(link))?;
        }
    }
    std::fs::write(dir.join("etc/os-release"), format!("ID={id}\n"))?;
    std::fs::write(dir.join("etc/hosts"), "")?;
    std::fs::write(dir.join("etc/resolv.conf"), "")?;
    Ok(())
}

impl Plan {
    /// Adds the host's `/usr` at `/usr`, read-only (see [`host_usr`]).
    pub fn with_host_usr(mut self) -> Plan {
        self.submounts.push(Submount {
            name: "usr".into(),
            source: "/usr".into(),
            target: "/usr".into(),
            read_only: true,
        });
        self
    }
}

/// A program on `PATH` (or in the usual system directories).
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/bin", "/sbin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Whether an ELF executable needs no loader (no `PT_INTERP` segment).
pub fn is_static(binary: &Path) -> std::io::Result<bool> {
    let data = std::fs::read(binary)?;
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "not a 64-bit ELF file");
    if data.len() < 64 || &data[..4] != b"\x7fELF" || data[4] != 2 {
        return Err(bad());
    }
    let u16_at = |o: usize| u16::from_le_bytes([data[o], data[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(data[0x20..0x28].try_into().map_err(|_| bad())?) as usize;
    let (size, count) = (u16_at(0x36), u16_at(0x38));
    for i in 0..count {
        let at = phoff + i * size;
        let kind = data
            .get(at..at + 4)
            .ok_or_else(bad)?
            .try_into()
            .map(u32::from_le_bytes)
            .map_err(|_| bad())?;
        if kind == 3 {
            return Ok(false); // PT_INTERP
        }
    }
    Ok(true)
}

/// Copies the shared libraries `binary` needs (as `ldd` lists them,
/// loader included) into `dir` at the same paths, so it runs in a root
/// that has no C library of its own (the cluster's commands in a
/// busybox root).
pub fn copy_libraries(dir: &Path, binary: &Path) -> std::io::Result<()> {
    let out = std::process::Command::new("ldd").arg(binary).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or
        // "/lib64/ld-linux-x86-64.so.2 (0x…)"; "linux-vdso.so.1 (0x…)" is
        // the kernel's.
        let path = match line.split_once("=>") {
            Some((_, right)) => right.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        let Some(path) = path.filter(|p| p.starts_with('/')) else {
            continue;
        };
        let source = Path::new(path);
        let target = dir.join(path.trim_start_matches('/'));
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::copy(source, &target)?;
    }
    Ok(())
}

/// Lays out `dir` as a tiny self-contained root made of a statically
/// linked `busybox` (Debian's busybox-static): the directories a jail
/// mounts over, every applet linked at its usual path, root and nobody in
/// `/etc/passwd`, and an `/etc/os-release` naming `id`.
pub fn busybox(dir: &Path, busybox: &Path, id: &str) -> std::io::Result<()> {
    if !is_static(busybox)? {
        return Err(std::io::Error::other(format!(
            "{} is not statically linked (install busybox-static)",
            busybox.display()
        )));
    }
    for d in [
        "proc", "sys", "dev", "tmp", "run", "etc", "home", "root", "bin", "sbin", "usr/bin",
        "usr/sbin", "var/tmp",
    ] {
        std::fs::create_dir_all(dir.join(d))?;
    }
    let inside = dir.join("bin/busybox");
    std::fs::copy(busybox, &inside)?;
    std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(0o755))?;
    let out = std::process::Command::new(busybox)
        .arg("--list-full")
        .output()?;
    for applet in String::from_utf8_lossy(&out.stdout).lines() {
        let link = dir.join(applet.trim().trim_start_matches('/'));
        if applet.trim().is_empty() || link == inside || link.exists() {
            continue;
        }
        if let Some(parent) = link.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::os::unix::fs::symlink("/bin/busybox", &link)?;
    }
    std::fs::set_permissions(dir.join("tmp"), std::fs::Permissions::from_mode(0o1777))?;
    std::fs::set_permissions(dir.join("var/tmp"), std::fs::Permissions::from_mode(0o1777))?;
    // Homes are made per user by whoever adds users: a /home anyone may
    // write lets one user make another's home before she does.
    std::fs::set_permissions(dir.join("home"), std::fs::Permissions::from_mode(0o755))?;
    for (file, text) in [
        ("etc/os-release", format!("ID={id}\n")),
        (
            "etc/passwd",
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n"
                .into(),
        ),
        ("etc/group", "root:x:0:\nnogroup:x:65534:\n".into()),
        ("etc/hosts", String::new()),
        ("etc/resolv.conf", String::new()),
        ("etc/nsswitch.conf", "hosts: files dns\n".into()),
    ] {
        std::fs::write(dir.join(file), text)?;
    }
    Ok(())
}

/// Builds a real Debian root in `dir` with `debootstrap --variant=minbase`
/// (which must be installed), then adds what a jail mounts over.
pub fn debootstrap(dir: &Path, suite: &str, mirror: Option<&str>) -> std::io::Result<()> {
    let program = find_program("debootstrap").ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "debootstrap is not installed (apt-get install debootstrap)",
        )
    })?;
    let mut cmd = std::process::Command::new(program);
    cmd.args(["--variant=minbase", suite]).arg(dir);
    cmd.args(mirror);
    let st = cmd.status()?;
    if !st.success() {
        return Err(std::io::Error::other(format!("debootstrap failed ({st})")));
    }
    for d in ["proc", "sys", "dev", "tmp", "run", "etc", "home"] {
        std::fs::create_dir_all(dir.join(d))?;
    }
    for f in ["etc/hosts", "etc/resolv.conf"] {
        if !dir.join(f).exists() {
            std::fs::write(dir.join(f), "")?;
        }
    }
    Ok(())
}
