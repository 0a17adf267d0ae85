//! `corral jail`: prepare and check a shared root.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use super::{fail, parse};

const CMD: &str = "corral jail";

/// Prepare or check the shared root jobs run in.
#[derive(Debug, Parser)]
#[command(name = "corral jail")]
pub struct JailArgs {
    #[command(subcommand)]
    pub what: What,
}

#[derive(Debug, Subcommand)]
pub enum What {
    /// Make a shared root in DIR: by default a tiny one that borrows the
    /// host's /usr (give the agents `--jail-submount /usr:/usr:ro`), for
    /// tests and demos.
    Init {
        dir: PathBuf,
        /// The ID in its /etc/os-release.
        #[arg(long)]
        id: Option<String>,
        /// A tiny self-contained root from Debian's busybox-static, with
        /// the C library the cluster's commands need.
        #[arg(long, conflicts_with = "debootstrap")]
        busybox: bool,
        /// A real Debian root of this suite (bookworm, trixie, …) made by
        /// debootstrap, which must be installed.
        #[arg(long, value_name = "SUITE")]
        debootstrap: Option<String>,
        /// With --debootstrap: the Debian mirror to use.
        #[arg(long, requires = "debootstrap")]
        mirror: Option<String>,
    },
    /// Enter the shared root as on a login node: your shell (or COMMAND)
    /// in the root every job runs in, with the cluster's commands on PATH.
    /// Needs root: run it with sudo; inside you are yourself.
    Shell {
        /// The shared root (default: [jail] root in the cluster's
        /// corral.toml).
        dir: Option<PathBuf>,
        /// The cluster's corral.toml (default: $CORRAL_CONF, else
        /// /etc/corral/corral.toml).
        #[arg(long)]
        config: Option<PathBuf>,
        /// SOURCE:TARGET[:ro] (repeatable; default: the configuration's).
        #[arg(long = "submount", value_parser = shared_root::config::parse_submount)]
        submounts: Vec<shared_root::Submount>,
        /// What to run instead of your shell.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Say in plain lines what DIR lacks to be a usable shared root.
    Check {
        dir: PathBuf,
        /// A jail path a submount will cover (repeatable).
        #[arg(long = "submount")]
        submounts: Vec<PathBuf>,
    },
}

pub fn main(args: &[OsString]) -> i32 {
    let mut args = args.to_vec();
    args[0] = CMD.into();
    let a: JailArgs = match parse(CMD, &args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    match a.what {
        What::Init {
            dir,
            id,
            busybox: true,
            ..
        } => {
            let Some(bb) = shared_root::scaffold::find_program("busybox") else {
                return fail(
                    CMD,
                    "busybox is not installed (apt-get install busybox-static)",
                );
            };
            let id = id.unwrap_or_else(|| "corral-busybox".into());
            let made = shared_root::scaffold::busybox(&dir, &bb, &id).and_then(|()| {
                // The cluster's commands are this binary, bound in at
                // /run/corral/bin: give it its C library.
                let me = std::env::current_exe()?;
                shared_root::scaffold::copy_libraries(&dir, &me)
            });
            match made {
                Ok(()) => {
                    crate::say!(
                        "{}: a busybox root; run jobs in it with\n  corral up --jail {}",
                        dir.display(),
                        dir.display()
                    );
                    0
                }
                Err(e) => fail(CMD, format!("{}: {e}", dir.display())),
            }
        }
        What::Init {
            dir,
            debootstrap: Some(suite),
            mirror,
            ..
        } => match shared_root::scaffold::debootstrap(&dir, &suite, mirror.as_deref()) {
            Ok(()) => {
                crate::say!(
                    "{}: a Debian {suite} root; run jobs in it with\n  corral up --jail {}",
                    dir.display(),
                    dir.display()
                );
                0
            }
            Err(e) => fail(CMD, format!("{}: {e}", dir.display())),
        },
        What::Init { dir, id, .. } => {
            let id = id.unwrap_or_else(|| "corral-tiny".into());
            let made = shared_root::scaffold::host_usr(&dir, &id).and_then(|()| {
                let home = dir.join("home");
                // Homes are made per user by whoever adds users.
                std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755))?;
                for (file, text) in [
                    ("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"),
                    ("etc/group", "root:x:0:\n"),
                ] {
                    if !dir.join(file).exists() {
                        std::fs::write(dir.join(file), text)?;
                    }
                }
                Ok(())
            });
            match made {
                Ok(()) => {
                    crate::say!(
                        "{}: a tiny root; run jobs in it with\n  corral up --jail {} --jail-submount /usr:/usr:ro",
                        dir.display(),
                        dir.display()
                    );
                    0
                }
                Err(e) => fail(CMD, format!("{}: {e}", dir.display())),
            }
        }
        What::Shell {
            dir,
            config,
            submounts,
            command,
        } => {
            let a = super::jail_shell::ShellArgs {
                dir,
                config,
                submounts,
                command,
            };
            match super::jail_shell::run(a) {
                Ok(code) => code,
                Err(e) => fail(CMD, e),
            }
        }
        What::Check { dir, submounts } => {
            let lacks = shared_root::check::check(&dir, &submounts);
            for w in shared_root::check::warnings(&dir) {
                crate::say!("{}: {w}", dir.display());
            }
            if lacks.is_empty() {
                crate::say!("{}: a usable shared root", dir.display());
                return 0;
            }
            for l in &lacks {
                crate::say!("{}: {l}", dir.display());
            }
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subcommands_parse() {
        let a =
            JailArgs::try_parse_from(["corral jail", "check", "/srv/root", "--submount", "/usr"])
                .expect("check parses");
        assert!(
            matches!(a.what, What::Check { ref submounts, .. } if submounts == &[PathBuf::from("/usr")])
        );
        assert!(JailArgs::try_parse_from(["corral jail", "init"]).is_err());
    }
}
