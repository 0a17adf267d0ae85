//! Multifactor priority and fair-share.
//!
//! A job's priority is a weighted sum of factors in `[0, 1]` (age, size,
//! partition tier, QOS, fair-share) minus its nice value, as Slurm's
//! priority/multifactor plugin computes it. Fair-share usage decays with a
//! half-life; it is charged when a job ends. Owns arithmetic only.

use std::collections::HashMap;

use crate::model::{AccountId, Secs, UserId};

/// Weights of the priority factors. Every factor is in `[0, 1]`, so a
/// weight is the most priority that factor can add.
#[derive(Clone, Debug, PartialEq)]
pub struct PriorityWeights {
    pub age: u32,
    /// Age at which the age factor reaches 1.
    pub max_age: Secs,
    pub size: u32,
    pub partition: u32,
    pub qos: u32,
    pub fairshare: u32,
}

impl Default for PriorityWeights {
    /// Fair-share first, then partition tier and QOS; no size factor, as
    /// in Slurm (`PriorityWeightJobSize` is 0 unless set), so one user's
    /// jobs rank in submit order whatever their size. A size weight puts
    /// large jobs first: with limits in whole minutes, as Slurm users
    /// write them, each big job then reserves the machine ahead of the
    /// small ones queued before it (on the compare trace slice, mean wait
    /// 32 s against 19 s in submit order, `corral-sim`).
    fn default() -> Self {
        PriorityWeights {
            age: 1_000,
            max_age: 7 * 24 * 3600,
            size: 0,
            partition: 1_000,
            qos: 1_000,
            fairshare: 10_000,
        }
    }
}

impl PriorityWeights {
    /// Age only, never capped: first come, first served order.
    pub fn age_only() -> Self {
        PriorityWeights {
            age: 1_000_000,
            max_age: crate::model::INFINITE,
            size: 0,
            partition: 0,
            qos: 0,
            fairshare: 0,
        }
    }
}

/// A usage figure that halves every `half_life` seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Decayed {
    value: f64,
    at: Secs,
}

impl Decayed {
    fn at(self, now: Secs, half_life: Secs) -> f64 {
        if half_life == 0 || now <= self.at {
            return self.value;
        }
        self.value * 0.5f64.powf((now - self.at) as f64 / half_life as f64)
    }

    fn add(&mut self, now: Secs, half_life: Secs, amount: f64) {
        self.value = self.at(now, half_life) + amount;
        self.at = self.at.max(now);
    }
}

/// Decayed usage per user and per account.
#[derive(Clone, Debug, Default)]
pub(crate) struct FairShare {
    half_life: Secs,
    users: HashMap<UserId, Decayed>,
    accounts: HashMap<AccountId, Decayed>,
    total: Decayed,
}

impl FairShare {
    pub fn new(half_life: Secs) -> Self {
        FairShare {
            half_life,
            ..Default::default()
        }
    }

    /// Charges `amount` (billing units × seconds) to a user and account.
    pub fn charge(&mut self, now: Secs, user: UserId, account: AccountId, amount: f64) {
        let hl = self.half_life;
        self.users.entry(user).or_default().add(now, hl, amount);
        self.accounts
            .entry(account)
            .or_default()
            .add(now, hl, amount);
        self.total.add(now, hl, amount);
    }

    /// The fair-share factor: 1 for no usage, falling towards 0 as a user's
    /// (and their account's) share of recent usage exceeds an even split
    /// among `parties` users.
    pub fn factor(&self, now: Secs, user: UserId, account: AccountId, parties: usize) -> f64 {
        let total = self.total.at(now, self.half_life);
        if total <= 0.0 {
            return 1.0;
        }
        let share = 1.0 / parties.max(1) as f64;
        let u = self
            .users
            .get(&user)
            .map_or(0.0, |d| d.at(now, self.half_life))
            / total;
        let a = self
            .accounts
            .get(&account)
            .map_or(0.0, |d| d.at(now, self.half_life))
            / total;
        (0.5f64.powf(u / share) + 0.5f64.powf(a / share)) / 2.0
    }

    /// The decayed usage of a user, of an account and of everyone.
    pub fn usage(&self, now: Secs, user: UserId, account: AccountId) -> (f64, f64, f64) {
        let hl = self.half_life;
        (
            self.users.get(&user).map_or(0.0, |d| d.at(now, hl)),
            self.accounts.get(&account).map_or(0.0, |d| d.at(now, hl)),
            self.total.at(now, hl),
        )
    }

    /// Users seen so far (for the even split).
    pub fn known_users(&self) -> impl Iterator<Item = UserId> + '_ {
        self.users.keys().copied()
    }
}

/// The inputs of one job's priority.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Factors {
    pub age: Secs,
    pub size: f64,
    pub partition: f64,
    pub qos: f64,
    pub fairshare: f64,
    pub nice: i32,
}

pub(crate) fn priority(w: &PriorityWeights, f: Factors) -> i64 {
    let age = if w.max_age == 0 {
        1.0
    } else {
        (f.age as f64 / w.max_age as f64).min(1.0)
    };
    let sum = w.age as f64 * age
        + w.size as f64 * f.size.clamp(0.0, 1.0)
        + w.partition as f64 * f.partition.clamp(0.0, 1.0)
        + w.qos as f64 * f.qos.clamp(0.0, 1.0)
        + w.fairshare as f64 * f.fairshare.clamp(0.0, 1.0);
    sum.round() as i64 - i64::from(f.nice)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_halves_every_half_life() {
        let mut fs = FairShare::new(100);
        fs.charge(0, UserId(1), AccountId(1), 1000.0);
        fs.charge(0, UserId(2), AccountId(2), 1000.0);
        let f0 = fs.factor(0, UserId(1), AccountId(1), 2);
        assert!((f0 - 0.5).abs() < 1e-9, "{f0}");
        // A new charge to user 2 after one half-life: user 1's share drops.
        fs.charge(100, UserId(2), AccountId(2), 1000.0);
        assert!(fs.factor(100, UserId(1), AccountId(1), 2) > f0);
        assert!(fs.factor(100, UserId(2), AccountId(2), 2) < f0);
        assert!(fs.factor(0, UserId(3), AccountId(3), 3) > 0.99);
    }

    #[test]
    fn nice_and_age_move_priority() {
        let w = PriorityWeights::default();
        let base = Factors {
            age: 0,
            size: 0.0,
            partition: 0.0,
            qos: 0.0,
            fairshare: 1.0,
            nice: 0,
        };
        let p0 = priority(&w, base);
        assert_eq!(p0, 10_000);
        assert_eq!(priority(&w, Factors { nice: 100, ..base }), p0 - 100);
        assert_eq!(
            priority(
                &w,
                Factors {
                    age: w.max_age * 5,
                    ..base
                }
            ),
            p0 + 1000
        );
    }
}
