//! Accounts as `[accounts]` of `corral.toml` declares them: Slurm's
//! associations, read-only. A job that names no account gets its user's
//! default (the first listed for the user, else `[accounts] default`), as
//! a Slurm user's default association gives it; `sacctmgr show` and
//! `sshare` read them, with the fair-share usage the scheduler charged.
//! Corral does not enforce them: a job may still name any account, as a
//! Slurm without `AccountingStorageEnforce=associations` lets it.

use std::collections::HashMap;

use corral_proto::msg::{Association, Associations, Ident};
use scheduler_core::{AccountId, UserId};

/// The associations, with the users' ids where their names are known.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Accounts {
    /// The account of a user not listed (`None`: no account, Slurm's
    /// `(null)`).
    default: Option<String>,
    /// Each listed user's accounts, the first the default, by name order.
    users: Vec<(String, Vec<String>)>,
    /// Listed users by uid (`resolve`), an index into `users`.
    by_uid: HashMap<u32, usize>,
    /// Each listed user's uid, where known (beside `users`).
    uids: Vec<Option<u32>>,
}

impl Accounts {
    pub fn new(default: Option<String>, users: Vec<(String, Vec<String>)>) -> Self {
        let mut a = Accounts {
            default,
            uids: vec![None; users.len()],
            users,
            by_uid: HashMap::new(),
        };
        // A user given by number needs no lookup.
        a.resolve(|_| None);
        a
    }

    /// Finds each listed user's uid by `lookup` (the passwd database);
    /// a name it does not know matches no one's jobs.
    pub fn resolve(&mut self, lookup: impl Fn(&str) -> Option<u32>) {
        for (i, (name, _)) in self.users.iter().enumerate() {
            if let Some(uid) = name.parse::<u32>().ok().or_else(|| lookup(name)) {
                self.by_uid.entry(uid).or_insert(i);
                self.uids[i] = Some(uid);
            }
        }
    }

    /// The account a job of `uid` that names none is charged to.
    pub fn default_for(&self, uid: u32) -> Option<&str> {
        match self.by_uid.get(&uid) {
            Some(&i) => self.users[i].1.first().map(String::as_str),
            None => self.default.as_deref(),
        }
    }

    /// Every association, with the usage `usage` finds for each (the
    /// user's uid where known, and the account); `caller` (its uid and
    /// name) is listed with the default account when it is not listed
    /// itself, as its jobs are charged there.
    pub fn listing(
        &self,
        cluster: &str,
        caller: Option<(u32, String)>,
        usage: impl Fn(Option<u32>, &str) -> (f64, f64, f64, f64),
    ) -> Associations {
        let mut list = Vec::new();
        let mut push = |user: &str, uid: Option<u32>, account: &str, default: bool| {
            let (user_usage, account_usage, total, factor) = usage(uid, account);
            list.push(Association {
                user: user.to_string(),
                account: account.to_string(),
                default,
                user_usage,
                account_usage,
                total_usage: total,
                fairshare: factor,
            });
        };
        for ((name, accounts), &uid) in self.users.iter().zip(&self.uids) {
            for (k, a) in accounts.iter().enumerate() {
                push(name, uid, a, k == 0);
            }
        }
        if let (Some((uid, name)), Some(default)) = (caller, self.default.as_deref()) {
            if !self.by_uid.contains_key(&uid) {
                push(&name, Some(uid), default, true);
            }
        }
        Associations {
            cluster: cluster.to_string(),
            default: self.default.clone(),
            list,
        }
    }
}

impl super::Controller {
    /// `sacctmgr show` and `sshare`: every association, and the caller's
    /// (`name` is its user name) with the usage charged to each.
    pub fn associations(&self, who: Ident, name: String, now: u64) -> Associations {
        let accounts = &self.cfg.accounts;
        accounts.listing(&self.cfg.cluster, Some((who.uid, name)), |uid, account| {
            let Some(uid) = uid else {
                return (0.0, 0.0, 0.0, 1.0);
            };
            let user = UserId(uid);
            let u = self
                .sched
                .share_usage(now, user, account_id(user, Some(account)));
            (u.user, u.account, u.total, u.factor)
        })
    }
}

/// The fair-share id of a job's account: its name's FNV-1a hash with the
/// top bit set, stable across restarts and apart from the ids of jobs
/// with no account (their user's uid, below 2^31).
pub fn account_id(user: UserId, name: Option<&str>) -> AccountId {
    let Some(name) = name.filter(|n| !n.is_empty()) else {
        return AccountId(user.0);
    };
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    AccountId(h | 0x8000_0000)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accounts() -> Accounts {
        let mut a = Accounts::new(
            Some("default".into()),
            vec![
                ("alice".into(), vec!["ml".into(), "vision".into()]),
                ("1234".into(), vec!["physics".into()]),
                ("ghost".into(), vec!["ml".into()]),
            ],
        );
        a.resolve(|n| (n == "alice").then_some(1000));
        a
    }

    #[test]
    fn a_listed_user_gets_their_first_account_and_others_the_default() {
        let a = accounts();
        assert_eq!(a.default_for(1000), Some("ml"));
        assert_eq!(a.default_for(1234), Some("physics"));
        assert_eq!(a.default_for(2000), Some("default"));
        let none = Accounts::new(None, Vec::new());
        assert_eq!(none.default_for(2000), None);
    }

    #[test]
    fn the_listing_has_every_association_and_the_callers_own() {
        let a = accounts();
        let l = a.listing("corral", Some((2000, "bob".into())), |uid, acct| {
            (f64::from(uid.unwrap_or(0)), acct.len() as f64, 10.0, 0.5)
        });
        let rows: Vec<(&str, &str, bool, f64)> = l
            .list
            .iter()
            .map(|r| (&*r.user, &*r.account, r.default, r.user_usage))
            .collect();
        assert_eq!(
            rows,
            [
                ("alice", "ml", true, 1000.0),
                ("alice", "vision", false, 1000.0),
                ("1234", "physics", true, 1234.0),
                ("ghost", "ml", true, 0.0),
                ("bob", "default", true, 2000.0),
            ]
        );
        // A listed caller is not listed twice.
        let l = a.listing("corral", Some((1000, "alice".into())), |_, _| {
            (0.0, 0.0, 0.0, 1.0)
        });
        assert_eq!(l.list.len(), 4);
    }

    #[test]
    fn account_ids_are_stable_and_apart_from_uids() {
        let u = UserId(1000);
        assert_eq!(account_id(u, None), AccountId(1000));
        assert_eq!(account_id(u, Some("")), AccountId(1000));
        let ml = account_id(u, Some("ml"));
        assert_eq!(ml, account_id(UserId(7), Some("ml")));
        assert!(ml.0 >= 0x8000_0000);
        assert_ne!(ml, account_id(u, Some("vision")));
    }
}
