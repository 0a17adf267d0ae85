//! What a directory lacks to be a usable shared root, in plain lines.

use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// Follows `path` inside `root` as the jail would see it (absolute links
/// are taken relative to `root`, never to the host). Returns the path in
/// the jail it leads to, and whether it exists in `root`; `None` if the
/// links loop.
fn resolve(root: &Path, path: &Path) -> Option<(PathBuf, bool)> {
    let normal = |p: &Path| -> Vec<std::ffi::OsString> {
        p.components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n.to_os_string()),
                Component::ParentDir => Some("..".into()),
                _ => None,
            })
            .collect()
    };
    let mut parts: Vec<std::ffi::OsString> = Vec::new();
    let mut todo: Vec<std::ffi::OsString> = normal(path).into_iter().rev().collect();
    let mut links = 0;
    while let Some(next) = todo.pop() {
        if next == ".." {
            parts.pop();
            continue;
        }
        let here: PathBuf = parts.iter().collect::<PathBuf>().join(&next);
        let Ok(meta) = std::fs::symlink_metadata(root.join(&here)) else {
            // Missing from here on: where it would be.
            parts.push(next);
            parts.extend(todo.into_iter().rev());
            return Some((
                Path::new("/").join(parts.iter().collect::<PathBuf>()),
                false,
            ));
        };
        if meta.file_type().is_symlink() {
            links += 1;
            if links > 40 {
                return None;
            }
            let target = std::fs::read_link(root.join(&here)).ok()?;
            if target.is_absolute() {
                parts.clear();
            }
            todo.extend(normal(&target).into_iter().rev());
        } else {
            parts.push(next);
        }
    }
    Some((Path::new("/").join(parts.iter().collect::<PathBuf>()), true))
}

/// Whether `path` in the jail is a directory (`dir`) or a file there.
fn present(root: &Path, path: &str, dir: bool) -> bool {
    match resolve(root, Path::new(path)) {
        Some((p, true)) => {
            let host = root.join(p.strip_prefix("/").unwrap_or(&p));
            if dir {
                host.is_dir()
            } else {
                host.is_file()
            }
        }
        _ => false,
    }
}

/// Lines saying what `root` lacks; empty when it is usable. `provided`
/// lists jail paths submounts will cover (their content is not checked).
pub fn check(root: &Path, provided: &[PathBuf]) -> Vec<String> {
    let mut lacks = Vec::new();
    let meta = match std::fs::metadata(root) {
        Ok(m) if m.is_dir() => m,
        Ok(_) => return vec![format!("{} is not a directory", root.display())],
        Err(e) => return vec![format!("{}: {e}", root.display())],
    };
    if meta.uid() != 0 || meta.mode() & 0o022 != 0 {
        lacks.push(format!(
            "{} must be owned by root and writable by no one else (it is uid {}, mode {:o})",
            root.display(),
            meta.uid(),
            meta.mode() & 0o7777
        ));
    }
    for dir in ["/proc", "/sys", "/dev", "/tmp", "/run", "/etc"] {
        if !present(root, dir, true) {
            lacks.push(format!("no {dir} directory to mount over"));
        }
    }
    for (file, why) in [
        ("/etc/hosts", "the node's is bound over it"),
        ("/etc/resolv.conf", "the node's is bound over it"),
        ("/etc/passwd", "the cluster's users are the root's"),
        ("/etc/group", "the cluster's groups are the root's"),
        ("/etc/os-release", "jobs and people tell the root by it"),
    ] {
        if !present(root, file, false) {
            lacks.push(format!("no {file} ({why})"));
        }
    }
    // A shell, in the root or in what a submount brings.
    let shell = resolve(root, Path::new("/bin/sh"));
    let brought = |p: &Path| provided.iter().any(|m| p.starts_with(m));
    let has_shell = match &shell {
        Some((_, true)) => present(root, "/bin/sh", false),
        Some((p, false)) => brought(p),
        None => false,
    };
    if !has_shell {
        lacks.push("no /bin/sh (batch scripts need a shell)".into());
    }
    lacks
}

/// The directories a task's `PATH` lists by default, and those above
/// them: a program put in any of them runs as whoever finds it first.
const ON_PATH: [&str; 11] = [
    "/",
    "/usr",
    "/usr/local",
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
    "/opt",
    "/etc",
];

/// Lines warning of what in `root` lets one user act as another, though
/// the root is usable: directories on a user's path, `/home` and homes
/// that anyone may write (anyone could make `/home/<another user>` and
/// wait for that user's job to work there, or put a program on
/// everyone's `PATH`).
pub fn warnings(root: &Path) -> Vec<String> {
    let everyone = |jail: &Path| -> Option<u32> {
        let (p, true) = resolve(root, jail)? else {
            return None;
        };
        let host = root.join(p.strip_prefix("/").unwrap_or(&p));
        let meta = std::fs::metadata(host).ok()?;
        (meta.is_dir() && meta.mode() & 0o002 != 0).then_some(meta.mode() & 0o7777)
    };
    let mut out = Vec::new();
    for dir in ON_PATH {
        if let Some(mode) = everyone(Path::new(dir)) {
            out.push(format!(
                "warning: {dir} is writable by everyone (mode {mode:o}): any user can put programs where others run them"
            ));
        }
    }
    if let Some(mode) = everyone(Path::new("/home")) {
        out.push(format!(
            "warning: /home is writable by everyone (mode {mode:o}): any user can make another's home first (make it 0755, with a home per user)"
        ));
    }
    if let Some((home, true)) = resolve(root, Path::new("/home")) {
        let host = root.join(home.strip_prefix("/").unwrap_or(&home));
        let mut homes: Vec<_> = std::fs::read_dir(host)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        homes.sort();
        for name in homes {
            let jail = Path::new("/home").join(&name);
            if let Some(mode) = everyone(&jail) {
                out.push(format!(
                    "warning: {} is writable by everyone (mode {mode:o})",
                    jail.display()
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn world_writable_homes_and_path_directories_are_warned_of() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let mode = |p: &str, m: u32| {
            let path = root.join(p);
            std::fs::create_dir_all(&path).unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(m)).unwrap();
        };
        for d in ["usr/bin", "usr/local/bin", "etc"] {
            mode(d, 0o755);
        }
        mode("", 0o755);
        mode("home", 0o755);
        mode("home/alice", 0o700);
        assert_eq!(warnings(root), Vec::<String>::new());
        mode("home", 0o1777);
        mode("home/bob", 0o777);
        mode("usr/local/bin", 0o777);
        std::os::unix::fs::symlink("usr/bin", root.join("bin")).unwrap();
        mode("usr/bin", 0o1777);
        let w = warnings(root);
        assert_eq!(w.len(), 5, "{w:?}");
        assert!(w[0].starts_with("warning: /usr/local/bin is writable by everyone (mode 777)"));
        assert!(w[1].starts_with("warning: /usr/bin is writable"), "{w:?}");
        assert!(w[2].starts_with("warning: /bin is writable"), "{w:?}");
        assert!(w[3].starts_with("warning: /home is writable by everyone (mode 1777): any user can make another's home first"));
        assert_eq!(
            w[4],
            "warning: /home/bob is writable by everyone (mode 777)"
        );
    }

    #[test]
    fn a_tiny_root_lacks_only_what_its_submounts_bring() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        crate::scaffold::host_usr(root, "t").unwrap();
        let lacks = check(root, &[]);
        // The tiny root's /usr is empty until the host's is submounted.
        assert!(
            lacks.iter().any(|l| l.starts_with("no /bin/sh")),
            "{lacks:?}"
        );
        assert!(
            lacks.iter().any(|l| l.starts_with("no /etc/passwd")),
            "{lacks:?}"
        );
        let fine = check(root, &["/usr".into()]);
        assert!(!fine.iter().any(|l| l.contains("/bin/sh")), "{fine:?}");
        std::fs::write(root.join("etc/passwd"), "root:x:0:0::/root:/bin/sh\n").unwrap();
        std::fs::write(root.join("etc/group"), "root:x:0:\n").unwrap();
        let lacks = check(root, &["/usr".into()]);
        if nix::unistd::geteuid().is_root() {
            assert_eq!(lacks, Vec::<String>::new());
        }
        std::fs::remove_dir(root.join("run")).unwrap();
        assert!(
            check(root, &["/usr".into()]).contains(&"no /run directory to mount over".to_string())
        );
    }

    #[test]
    fn links_resolve_inside_the_root_not_on_the_host() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("usr/bin")).unwrap();
        std::fs::write(root.join("usr/bin/sh"), "").unwrap();
        std::os::unix::fs::symlink("usr/bin", root.join("bin")).unwrap();
        let sh = resolve(root, Path::new("/bin/sh"));
        assert_eq!(sh, Some((PathBuf::from("/usr/bin/sh"), true)));
        // An absolute link points into the root, not the host's /etc.
        std::fs::create_dir(root.join("etc")).unwrap();
        std::os::unix::fs::symlink("/nowhere/hosts", root.join("etc/hosts")).unwrap();
        let p = resolve(root, Path::new("/etc/hosts"));
        assert_eq!(p, Some((PathBuf::from("/nowhere/hosts"), false)));
    }
}
