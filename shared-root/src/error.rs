//! What can go wrong: a plan that cannot be a jail ([`PlanError`], found in
//! the parent before fork) or a step that failed ([`JailError`], one
//! variant per kind of step, with the path involved).

use std::path::PathBuf;

/// A plan that cannot be a jail.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("{what} must be an absolute path: {path}")]
    NotAbsolute { what: &'static str, path: PathBuf },
    #[error("{what} may not contain `..`, a NUL or an empty name: {path}")]
    BadPath { what: &'static str, path: PathBuf },
    #[error("too many steps for one jail: {steps}, the most is {max}", max = crate::plan::MAX_STEPS)]
    TooLarge { steps: usize },
    #[error("{what} is given twice: {name}")]
    Duplicate { what: &'static str, name: String },
    #[error("{what} {path}")]
    Missing {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A step of entering the jail that failed.
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    #[error("creating a mount namespace")]
    Unshare(#[source] std::io::Error),
    #[error("making the mounts private")]
    Private(#[source] std::io::Error),
    #[error("binding the shared root {root}")]
    BindRoot {
        root: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("mounting /proc")]
    Proc(#[source] std::io::Error),
    #[error("mounting /sys read-only")]
    Sys(#[source] std::io::Error),
    #[error("mounting /dev")]
    Dev(#[source] std::io::Error),
    #[error("exposing the device {path}")]
    Device {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("mounting /dev/pts")]
    Pts(#[source] std::io::Error),
    #[error("mounting /dev/shm")]
    Shm(#[source] std::io::Error),
    #[error("mounting a private /tmp")]
    Tmp(#[source] std::io::Error),
    #[error("mounting /run")]
    Run(#[source] std::io::Error),
    #[error("showing {source_path} at /run/corral/{name}")]
    Extra {
        name: String,
        source_path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("submount {name}: {source_path} at {target}")]
    Submount {
        name: String,
        source_path: PathBuf,
        target: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("binding the node's {path}")]
    HostFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("binding the node's driver file {path}")]
    Driver {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("pivot_root into {root}")]
    Pivot {
        root: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("detaching the old root")]
    DetachOldRoot(#[source] std::io::Error),
}
