//! Real database servers for the accounting tests: PostgreSQL and
//! MariaDB from Debian's packages (`.ci/run` installs them), each started
//! here in a private directory on a free loopback port, and stopped when
//! dropped. Where a server is not installed, [`postgres`] and [`mariadb`]
//! say so and the caller prints SKIPPED.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A database server this process started.
#[derive(Debug)]
pub struct DbServer {
    /// The URL corral-ctld's `[accounting] url` takes.
    pub url: String,
    kind: Kind,
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    running: bool,
}

#[derive(Debug, Clone)]
enum Kind {
    Postgres { bin: PathBuf },
    MariaDb { server: PathBuf },
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Runs a command (as `user` when root), returning its output or why not.
fn run(user: Option<&str>, program: &Path, args: &[&str]) -> Result<(), String> {
    let mut cmd = match (user, is_root()) {
        (Some(u), true) => {
            let mut c = Command::new("runuser");
            c.args(["-u", u, "--"]).arg(program);
            c
        }
        _ => Command::new(program),
    };
    let out = cmd
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{}: {e}", program.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} {args:?}: {}{}",
            program.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn wait_port(port: u16, what: &str) -> Result<(), String> {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(60) {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!("{what} did not listen on port {port}"))
}

fn private_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("corral-db-")
        .tempdir()
        .expect("temporary directory");
    // The server runs as its own user: it must reach its directory.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod the server's directory");
    dir
}

/// PostgreSQL's programs, newest version first.
fn postgres_bin() -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|b| b.join("pg_ctl").exists() && b.join("initdb").exists())
        .collect();
    found.sort();
    found.pop()
}

/// A fresh PostgreSQL with database `corral` (user `corral`, trusted on
/// loopback), or why there is none.
pub fn postgres() -> Result<DbServer, String> {
    let bin = postgres_bin().ok_or("PostgreSQL is not installed (apt-get install postgresql)")?;
    let dir = private_dir();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).map_err(|e| e.to_string())?;
    if is_root() {
        run(
            None,
            Path::new("chown"),
            &["-R", "postgres", &dir.path().to_string_lossy()],
        )?;
    }
    let user = Some("postgres");
    run(
        user,
        &bin.join("initdb"),
        &[
            "-D",
            &data.to_string_lossy(),
            "-U",
            "corral",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        ],
    )?;
    let port = free_port();
    let mut s = DbServer {
        url: format!("postgres://corral@127.0.0.1:{port}/corral"),
        kind: Kind::Postgres { bin: bin.clone() },
        port,
        dir,
        child: None,
        running: false,
    };
    s.start()?;
    run(
        user,
        &bin.join("createdb"),
        &[
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "corral",
            "corral",
        ],
    )?;
    Ok(s)
}

fn which(names: &[&str]) -> Option<PathBuf> {
    for n in names {
        for dir in ["/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin"] {
            let p = Path::new(dir).join(n);
            if p.exists() {
                return Some(p);
            }
        }
    }
    None
}

/// A fresh MariaDB (or MySQL) with database `corral` and a user `corral`
/// without a password, or why there is none.
pub fn mariadb() -> Result<DbServer, String> {
    let missing = "MariaDB is not installed (apt-get install mariadb-server)";
    let server = which(&["mariadbd", "mysqld"]).ok_or(missing)?;
    let client = which(&["mariadb", "mysql"]).ok_or(missing)?;
    let install = which(&["mariadb-install-db", "mysql_install_db"]).ok_or(missing)?;
    let dir = private_dir();
    let data = dir.path().join("data");
    let user = if is_root() {
        "--user=root"
    } else {
        "--no-defaults"
    };
    run(
        None,
        &install,
        &[
            "--no-defaults",
            &format!("--datadir={}", data.display()),
            user,
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        ],
    )?;
    let port = free_port();
    let mut s = DbServer {
        url: format!("mysql://corral@127.0.0.1:{port}/corral"),
        kind: Kind::MariaDb { server },
        port,
        dir,
        child: None,
        running: false,
    };
    s.start()?;
    let sock = s.dir.path().join("sock");
    run(
        None,
        &client,
        &[
            "--no-defaults",
            "-uroot",
            &format!("--socket={}", sock.display()),
            "-e",
            "CREATE DATABASE corral; CREATE USER 'corral'@'%'; \
             GRANT ALL ON corral.* TO 'corral'@'%'; FLUSH PRIVILEGES;",
        ],
    )?;
    Ok(s)
}

impl DbServer {
    /// Starts the server (again, with its data, on its port).
    pub fn start(&mut self) -> Result<(), String> {
        if self.running {
            return Ok(());
        }
        let dir = self.dir.path().to_path_buf();
        match self.kind.clone() {
            Kind::Postgres { bin } => {
                let opts = format!(
                    "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
                    self.port,
                    dir.display()
                );
                run(
                    Some("postgres"),
                    &bin.join("pg_ctl"),
                    &[
                        "-D",
                        &dir.join("data").to_string_lossy(),
                        "-l",
                        &dir.join("log").to_string_lossy(),
                        "-o",
                        &opts,
                        "-w",
                        "-t",
                        "60",
                        "start",
                    ],
                )?;
            }
            Kind::MariaDb { server } => {
                let log = std::fs::File::create(dir.join("log")).map_err(|e| e.to_string())?;
                let mut cmd = Command::new(&server);
                cmd.arg("--no-defaults")
                    .arg(format!("--datadir={}", dir.join("data").display()))
                    .arg(format!("--socket={}", dir.join("sock").display()))
                    .arg(format!("--pid-file={}", dir.join("pid").display()))
                    .arg(format!("--port={}", self.port))
                    .arg("--bind-address=127.0.0.1")
                    .arg("--skip-log-bin")
                    .arg("--innodb-flush-log-at-trx-commit=2");
                if is_root() {
                    cmd.arg("--user=root");
                }
                let child = cmd
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(log)
                    .spawn()
                    .map_err(|e| format!("{}: {e}", server.display()))?;
                self.child = Some(child);
            }
        }
        self.running = true;
        wait_port(self.port, "the database")
    }

    /// Stops the server (its data stays for [`DbServer::start`]).
    pub fn stop(&mut self) {
        if !self.running {
            return;
        }
        self.running = false;
        match &self.kind {
            Kind::Postgres { bin } => {
                let data = self.dir.path().join("data");
                let _ = run(
                    Some("postgres"),
                    &bin.join("pg_ctl"),
                    &["-D", &data.to_string_lossy(), "-m", "fast", "-w", "stop"],
                );
            }
            Kind::MariaDb { .. } => {
                if let Some(mut c) = self.child.take() {
                    // SIGTERM: a clean shutdown.
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(c.id() as i32),
                        nix::sys::signal::Signal::SIGTERM,
                    );
                    let _ = c.wait();
                }
            }
        }
    }

    /// What the server logged (for a failing test's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }
}

impl Drop for DbServer {
    fn drop(&mut self) {
        self.stop();
    }
}
