//! The users of a shared root: its own `/etc/passwd` and `/etc/group`, so
//! that `adduser` inside the root makes a user on every node at once.
//!
//! Read by a root daemon: the files are opened without following a final
//! link, read up to a cap, and every malformed line is skipped.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The most of either file read.
const MAX_BYTES: u64 = 16 << 20;

/// A passwd entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
    pub shell: String,
}

fn read(root: &Path, file: &str) -> String {
    let path = root.join("etc").join(file);
    let mut text = String::new();
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&path);
    if let Ok(f) = opened {
        let _ = f.take(MAX_BYTES).read_to_string(&mut text);
    }
    text
}

/// `uid`'s entry in the root's `/etc/passwd`.
pub fn account(root: &Path, uid: u32) -> Option<Account> {
    read(root, "passwd").lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 7 || f[2].parse() != Ok(uid) {
            return None;
        }
        Some(Account {
            name: f[0].to_string(),
            uid,
            gid: f[3].parse().ok()?,
            home: f[5].to_string(),
            shell: f[6].to_string(),
        })
    })
}

/// The groups a user is in by the root's `/etc/group`: `gid` (its primary
/// group) first, then every group that lists `name` as a member.
pub fn groups(root: &Path, name: &str, gid: u32) -> Vec<u32> {
    let mut out = vec![gid];
    for line in read(root, "group").lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 4 {
            continue;
        }
        let Ok(g) = f[2].parse::<u32>() else { continue };
        if f[3].split(',').any(|m| m == name) && !out.contains(&g) {
            out.push(g);
        }
    }
    out
}

/// A group of the root's `/etc/group`, by name, or a number as it is.
pub fn group_id(root: &Path, group: &str) -> Option<u32> {
    if let Ok(gid) = group.parse() {
        return Some(gid);
    }
    read(root, "group").lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.len() >= 3 && f[0] == group)
            .then(|| f[2].parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_and_groups_come_from_the_roots_files() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("etc")).unwrap();
        std::fs::write(
            root.path().join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nbroken line\nalice:x:1000:1000::/home/alice:/bin/bash\n",
        )
        .unwrap();
        std::fs::write(
            root.path().join("etc/group"),
            "root:x:0:\nalice:x:1000:\ngpu:x:44:bob,alice\nbad:x:notanumber:alice\nlab:x:50:alice\n",
        )
        .unwrap();
        let a = account(root.path(), 1000).expect("alice");
        assert_eq!(
            (a.name.as_str(), a.gid, a.home.as_str()),
            ("alice", 1000, "/home/alice")
        );
        assert_eq!(account(root.path(), 1001), None);
        assert_eq!(groups(root.path(), "alice", 1000), [1000, 44, 50]);
        assert_eq!(groups(root.path(), "carol", 7), [7]);
        // A root without the files has no users.
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(account(empty.path(), 0), None);
        // A link in the final place is not followed.
        std::os::unix::fs::symlink(root.path().join("etc/passwd"), empty.path().join("passwd"))
            .unwrap();
        std::fs::create_dir(empty.path().join("etc")).unwrap();
        std::fs::rename(empty.path().join("passwd"), empty.path().join("etc/passwd")).unwrap();
        assert_eq!(account(empty.path(), 1000), None);
    }
}
