//! What each user's launches may hold on this node: live tasks, and the
//! agent's descriptors. `--overlap` steps hold no CPUs, so without a
//! budget one user's steps could take every descriptor the agent has and
//! fail everyone's launches (and drain the node through the descriptor
//! check). No I/O: the agent passes the descriptors it has open.

use std::collections::HashMap;

use crate::health::FD_RESERVE;

/// Descriptors a step holds while its tasks start, beside its tasks'
/// own: the step cgroup's `cgroup.procs` files (one per hierarchy on v1,
/// dropped once the tasks are started), task 0's input and a terminal.
pub const STEP_FDS: u64 = 10;

/// Descriptors each running task holds in the agent: its output and
/// error pipes and its pidfd (a task starting holds its three pipes'
/// other ends and its exec error pipe for a moment).
pub const TASK_FDS: u64 = 3;

/// Why a launch was refused here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("user {uid} would have {want} tasks on this node, more than the {most} a user may run here (--max-user-tasks)")]
    Tasks { uid: u32, want: u64, most: u32 },
    #[error(
        "the agent has {open} of {limit} descriptors open; {keep} stay for other users' launches"
    )]
    Descriptors { open: u64, limit: u64, keep: u64 },
}

/// The live tasks of each user on this node, against their budget.
#[derive(Debug)]
pub struct Budget {
    user_tasks: u32,
    users: HashMap<u32, u64>,
}

impl Budget {
    /// A budget of `user_tasks` live tasks a user.
    pub fn new(user_tasks: u32) -> Budget {
        Budget {
            user_tasks,
            users: HashMap::new(),
        }
    }

    /// The default for a node of `cpus` CPUs: eight tasks a CPU, at least
    /// 256 (a 2-CPU node's MPI test still starts 256 ranks).
    pub fn default_user_tasks(cpus: u32) -> u32 {
        cpus.saturating_mul(8).max(256)
    }

    /// Descriptors kept free from a user who already runs something
    /// here: an eighth of the agent's, at least 256, so that users with
    /// nothing here can still start (the descriptor check drains a node
    /// only below [`FD_RESERVE`]).
    pub fn reserve(limit: u64) -> u64 {
        (limit / 8).max(4 * FD_RESERVE)
    }

    /// Takes `tasks` for user `uid`, with `open` of the agent's `limit`
    /// descriptors in use: refused if the user would pass their task
    /// budget, or the launch would leave fewer descriptors free than are
    /// kept for others (for a user with nothing here, than the node's own
    /// reserve, twice over). Give them back with [`Budget::release`].
    pub fn admit(&mut self, uid: u32, tasks: u32, open: u64, limit: u64) -> Result<(), Refusal> {
        let held = self.users.get(&uid).copied().unwrap_or(0);
        let want = held + u64::from(tasks);
        if want > u64::from(self.user_tasks) {
            return Err(Refusal::Tasks {
                uid,
                want,
                most: self.user_tasks,
            });
        }
        let keep = if held > 0 {
            Budget::reserve(limit)
        } else {
            2 * FD_RESERVE
        };
        let cost = STEP_FDS + TASK_FDS * u64::from(tasks);
        if open + cost + keep > limit {
            return Err(Refusal::Descriptors { open, limit, keep });
        }
        self.users.insert(uid, want);
        Ok(())
    }

    /// Gives back what [`Budget::admit`] took.
    pub fn release(&mut self, uid: u32, tasks: u32) {
        if let Some(held) = self.users.get_mut(&uid) {
            *held = held.saturating_sub(u64::from(tasks));
            if *held == 0 {
                self.users.remove(&uid);
            }
        }
    }

    /// The live tasks user `uid` holds here.
    pub fn tasks_of(&self, uid: u32) -> u64 {
        self.users.get(&uid).copied().unwrap_or(0)
    }
}

/// The descriptors this process has open.
pub fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_is_held_to_their_tasks_and_others_keep_theirs() {
        let mut b = Budget::new(300);
        b.admit(1000, 200, 100, 100_000).unwrap();
        assert_eq!(
            b.admit(1000, 101, 100, 100_000).unwrap_err(),
            Refusal::Tasks {
                uid: 1000,
                want: 301,
                most: 300
            }
        );
        b.admit(1000, 100, 100, 100_000).unwrap();
        b.admit(1001, 300, 100, 100_000).unwrap();
        b.release(1000, 300);
        assert_eq!(b.tasks_of(1000), 0);
        b.admit(1000, 300, 100, 100_000).unwrap();
    }

    #[test]
    fn descriptors_are_kept_for_users_with_nothing_here() {
        let mut b = Budget::new(10_000);
        let limit = 1024;
        // 1024 - 256 kept: a busy user stops at 768 open.
        b.admit(1000, 1, 100, limit).unwrap();
        let refused = b.admit(1000, 15, 768 - STEP_FDS - 3 * 15 + 1, limit);
        assert_eq!(
            refused.unwrap_err(),
            Refusal::Descriptors {
                open: 768 - STEP_FDS - 45 + 1,
                limit,
                keep: 256
            }
        );
        b.admit(1000, 15, 768 - STEP_FDS - 45, limit).unwrap();
        // Another user still starts, down to twice the node's reserve.
        b.admit(1001, 15, 800, limit).unwrap();
        assert!(b
            .admit(1002, 1, limit - 2 * FD_RESERVE - STEP_FDS, limit)
            .is_err());
        b.admit(1002, 1, limit - 2 * FD_RESERVE - STEP_FDS - TASK_FDS, limit)
            .unwrap();
        // A refusal takes nothing.
        assert_eq!(b.tasks_of(1000), 16);
    }
}
