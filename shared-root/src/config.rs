//! The `[jail]` section of `corral.toml`: one file for the whole cluster,
//! read by the controller (which checks it), by every agent (which runs
//! tasks in it) and by `corral jail shell` on login nodes.
//!
//! ```toml
//! [jail]
//! root = "/srv/shared-root"                 # the shared root, on shared storage
//! bin = "/usr/lib/corral/jail-bin"          # corral and its command links, at /run/corral/bin
//! submounts = ["/home:/home", "/datasets:/datasets:ro"]   # SOURCE:TARGET[:ro]
//! host_files = ["/etc/krb5.conf"]           # node-local files bound at the same path
//! docker_socket = "/run/docker.sock"        # exclusive jobs of docker_group's members only
//! docker_group = "docker"                   # in the root's /etc/group (unset: no job gets it)
//! driver_files = []                         # default: NVIDIA's, from the loader's cache
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::plan::Submount;

/// The cluster's jail, as configured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JailSection {
    pub root: PathBuf,
    pub bin: Option<PathBuf>,
    pub submounts: Vec<Submount>,
    /// Node-local files bound at the same path (besides `/etc/hosts` and
    /// `/etc/resolv.conf`).
    pub host_files: Vec<PathBuf>,
    pub docker_socket: Option<PathBuf>,
    /// Whose exclusive jobs get the Docker socket (root on the node): a
    /// group of the shared root's `/etc/group`, by name or number. Unset:
    /// no job gets it.
    pub docker_group: Option<String>,
    /// `None`: find the node's NVIDIA driver.
    pub driver_files: Option<Vec<PathBuf>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJail {
    root: PathBuf,
    bin: Option<PathBuf>,
    #[serde(default)]
    submounts: Vec<String>,
    #[serde(default)]
    host_files: Vec<PathBuf>,
    docker_socket: Option<PathBuf>,
    docker_group: Option<String>,
    driver_files: Option<Vec<PathBuf>>,
}

/// The whole file, of which only `[jail]` matters here.
#[derive(Debug, Deserialize)]
struct File {
    jail: Option<RawJail>,
}

/// Why a `[jail]` section is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("{path}: [jail]: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// `SOURCE:TARGET[:ro|:rw]`; the submount is named after its target.
pub fn parse_submount(s: &str) -> Result<Submount, String> {
    let parts: Vec<&str> = s.split(':').collect();
    let (source, target, read_only) = match parts[..] {
        [source, target] => (source, target, false),
        [source, target, "ro"] => (source, target, true),
        [source, target, "rw"] => (source, target, false),
        _ => return Err(format!("expected SOURCE:TARGET[:ro], got {s}")),
    };
    let name = target.trim_matches('/').replace('/', "-");
    if name.is_empty() {
        return Err(format!("a submount cannot cover the root: {s}"));
    }
    if !source.starts_with('/') || !target.starts_with('/') {
        return Err(format!("a submount's paths are absolute: {s}"));
    }
    Ok(Submount {
        name,
        source: source.into(),
        target: target.into(),
        read_only,
    })
}

impl JailSection {
    /// The `[jail]` section of `text` (the whole `corral.toml`), if any.
    pub fn parse(path: &Path, text: &str) -> Result<Option<JailSection>, ConfigError> {
        let file: File = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        let Some(raw) = file.jail else {
            return Ok(None);
        };
        let invalid = |message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        if !raw.root.is_absolute() {
            return Err(invalid(format!(
                "root must be an absolute path, not {}",
                raw.root.display()
            )));
        }
        let submounts = raw
            .submounts
            .iter()
            .map(|s| parse_submount(s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(invalid)?;
        if let Some(f) = raw.host_files.iter().find(|f| !f.is_absolute()) {
            return Err(invalid(format!(
                "host_files are absolute paths, not {}",
                f.display()
            )));
        }
        Ok(Some(JailSection {
            root: raw.root,
            bin: raw.bin,
            submounts,
            host_files: raw.host_files,
            docker_socket: raw.docker_socket,
            docker_group: raw.docker_group,
            driver_files: raw.driver_files,
        }))
    }

    /// Reads `path` and parses its `[jail]` section.
    pub fn load(path: &Path) -> Result<Option<JailSection>, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        JailSection::parse(path, &text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jail_section_among_the_rest_of_the_file() {
        let text = "cluster = \"x\"\n[[partition]]\nname = \"p\"\nnodes = \"ALL\"\n\
                    [jail]\nroot = \"/srv/root\"\nsubmounts = [\"/home:/home\", \"/data:/datasets:ro\"]\n\
                    host_files = [\"/etc/krb5.conf\"]\n";
        let j = JailSection::parse(Path::new("c.toml"), text)
            .unwrap()
            .expect("a jail");
        assert_eq!(j.root, Path::new("/srv/root"));
        assert_eq!(j.submounts.len(), 2);
        assert_eq!(j.submounts[1].name, "datasets");
        assert!(j.submounts[1].read_only);
        assert_eq!(j.host_files, [PathBuf::from("/etc/krb5.conf")]);
        assert_eq!(j.driver_files, None);
        assert_eq!(
            JailSection::parse(Path::new("c.toml"), "cluster = \"x\"\n").unwrap(),
            None
        );
    }

    #[test]
    fn mistakes_name_the_file_and_the_section() {
        for (text, want) in [
            ("[jail]\nroot = \"srv\"\n", "root must be an absolute path"),
            (
                "[jail]\nroot = \"/r\"\nsubmounts = [\"/a\"]\n",
                "expected SOURCE:TARGET",
            ),
            (
                "[jail]\nroot = \"/r\"\nsubmounts = [\"/a:/\"]\n",
                "cannot cover the root",
            ),
            (
                "[jail]\nroot = \"/r\"\nhost_files = [\"etc/x\"]\n",
                "absolute",
            ),
            ("[jail]\nroot = \"/r\"\nbogus = 1\n", "c.toml"),
        ] {
            let e = JailSection::parse(Path::new("c.toml"), text).unwrap_err();
            let msg = format!(
                "{e}: {}",
                std::error::Error::source(&e)
                    .map(|s| s.to_string())
                    .unwrap_or_default()
            );
            assert!(msg.contains(want) && msg.contains("c.toml"), "{msg}");
        }
    }
}
