//! `shared-root`: the jail every task of a Corral job runs in.
//!
//! It knows mounts and namespaces, never jobs. A [`Plan`] names the shared
//! root, the host devices the task may see, the submounts every node puts
//! at the same path, the node's own files (`/etc/resolv.conf`,
//! `/etc/hosts`) and extra host paths shown under `/run/corral` (the
//! `corral` binary, the agent's socket, driver libraries). Nothing is
//! ever written onto the shared root: every mount point that is not in it
//! is made on a tmpfs that lives only in the task's mount namespace.
//!
//! # Order of calls
//!
//! 1. In the parent, before fork: [`Plan::prepare`] checks the plan and
//!    turns it into [`Prepared`] steps whose paths are ready-made C
//!    strings, because the child of a multi-threaded parent must not
//!    allocate.
//! 2. In the child, between fork and exec: [`Prepared::enter`] performs
//!    the steps through a [`Syscall`] (the kernel: [`Kernel`]), stopping at
//!    the first that fails with its index and errno, nothing allocated.
//! 3. Back in the parent, when the child reports a failure:
//!    [`Prepared::error`] names it as a [`JailError`], one variant per kind
//!    of step, with the path involved.
//!
//! The steps, in order (firecracker's jailer and youki show the same
//! shape): a new mount namespace; everything made private so nothing
//! propagates back to the host; the root bound onto itself; a fresh
//! `/proc`; `/sys` read-only; `/dev` as a tmpfs holding only the usual
//! devices and the plan's, with its own `pts` and `shm`; a private `/tmp`;
//! `/run` as a tmpfs with `/run/corral/<name>` for each extra; the
//! submounts; the node's files; then `pivot_root` into the root and the
//! old root detached. Dropping to the user and exec stay with the caller.
//!
//! [`Recorder`] is a [`Syscall`] that writes down each call (and can be
//! told to fail one), so the order and the error of every step are
//! unit-tested without root; the tests in `tests/jail.rs` enter a real
//! jail as root.

pub mod check;
pub mod config;
mod error;
mod plan;
pub mod scaffold;
mod sys;
pub mod users;

pub use error::{JailError, PlanError};
pub use plan::{
    is_library, Extra, Failed, Plan, Prepared, StepKind, Submount, DRIVER_BIN, DRIVER_LIB,
    MAX_STEPS, USUAL_DEVICES,
};
pub use sys::{Kernel, Recorder, Syscall};
