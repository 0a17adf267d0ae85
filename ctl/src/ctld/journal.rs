//! The store's write-ahead journal: each group of the controller's
//! changes is appended here and flushed (one write and one `fdatasync`)
//! before what it acknowledges goes out; the database takes the same
//! changes afterwards without a flush of its own, and is flushed only at
//! checkpoints. After a crash the store replays what the journal holds
//! past the database's last checkpoint.
//!
//! A record is a header (magic, sequence number, length, CRC-32 of the
//! sequence number, length and body) and its body, padded to whole
//! pages, so a record never shares a page with one already acknowledged.
//! Records are written from the start of the file after each checkpoint;
//! a scan takes consecutive sequence numbers from the start and stops at
//! the first page that is not the next one (an older record, zeros, or a
//! write torn by the crash).

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// Records are padded to this.
pub const PAGE: u64 = 4096;
const MAGIC: [u8; 4] = *b"CRJ1";
/// Magic, sequence number, body length, CRC-32.
const HEAD: usize = 4 + 8 + 4 + 4;

/// What the journal does with its file: positioned reads and writes, its
/// length, and a flush of its data. A file; in tests, one whose flush can
/// be made to fail.
pub trait Media {
    /// Writes all of `buf` at offset `at`.
    fn put(&self, buf: &[u8], at: u64) -> io::Result<()>;
    /// Fills `buf` from offset `at`.
    fn get(&self, buf: &mut [u8], at: u64) -> io::Result<()>;
    fn size(&self) -> io::Result<u64>;
    /// Flushes the data written (`fdatasync`).
    fn flush(&self) -> io::Result<()>;
}

impl Media for File {
    fn put(&self, buf: &[u8], at: u64) -> io::Result<()> {
        self.write_all_at(buf, at)
    }
    fn get(&self, buf: &mut [u8], at: u64) -> io::Result<()> {
        self.read_exact_at(buf, at)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }
    fn flush(&self) -> io::Result<()> {
        self.sync_data()
    }
}

/// The open journal file and where its next record goes.
#[derive(Debug)]
pub struct Journal<M: Media = File> {
    file: M,
    /// Offset of the next record.
    at: u64,
    /// The sequence number of the last record written.
    last: u64,
}

fn crc(seq: u64, body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&seq.to_le_bytes());
    h.update(&(body.len() as u32).to_le_bytes());
    h.update(body);
    h.finalize()
}

impl Journal {
    /// Opens (or creates, `size` bytes of zeros, so that records fit
    /// without the file growing) the journal at `path`, refusing a link.
    /// `last` is the sequence number the store last saw.
    pub fn open(path: &Path, size: u64, last: u64) -> io::Result<Journal> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(path)?;
        if file.metadata()?.len() < size {
            file.write_all_at(&vec![0u8; size as usize], 0)?;
            file.sync_all()?;
            // The new name too, or a crash could lose the whole file.
            if let Some(dir) = path.parent() {
                File::open(dir)?.sync_all()?;
            }
        }
        Ok(Journal::on(file, last))
    }
}

impl<M: Media> Journal<M> {
    /// The journal on `file`, its records written from the start.
    pub fn on(file: M, last: u64) -> Journal<M> {
        Journal { file, at: 0, last }
    }

    /// The records after sequence number `after`, in order, each with its
    /// number: consecutive from the start of the file.
    pub fn replay(&self, after: u64) -> io::Result<Vec<(u64, Vec<u8>)>> {
        let len = self.file.size()?;
        let mut out = Vec::new();
        let mut at = 0u64;
        let mut want = after + 1;
        let mut head = [0u8; HEAD];
        while at + HEAD as u64 <= len {
            self.file.get(&mut head, at)?;
            let seq = u64::from_le_bytes(head[4..12].try_into().unwrap_or_default());
            let n = u32::from_le_bytes(head[12..16].try_into().unwrap_or_default()) as u64;
            let sum = u32::from_le_bytes(head[16..20].try_into().unwrap_or_default());
            if head[..4] != MAGIC || seq != want || at + HEAD as u64 + n > len {
                break;
            }
            let mut body = vec![0u8; n as usize];
            self.file.get(&mut body, at + HEAD as u64)?;
            if crc(seq, &body) != sum {
                break;
            }
            out.push((seq, body));
            at += padded(HEAD as u64 + n);
            want += 1;
        }
        Ok(out)
    }

    /// Appends `body` as the next record and flushes it; its sequence
    /// number once it is on disk.
    pub fn append(&mut self, body: &[u8]) -> io::Result<u64> {
        let seq = self.last + 1;
        let len = u32::try_from(body.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "journal record too large"))?;
        let mut buf = Vec::with_capacity(padded((HEAD + body.len()) as u64) as usize);
        buf.extend_from_slice(&MAGIC);
        buf.extend_from_slice(&seq.to_le_bytes());
        buf.extend_from_slice(&len.to_le_bytes());
        buf.extend_from_slice(&crc(seq, body).to_le_bytes());
        buf.extend_from_slice(body);
        buf.resize(padded(buf.len() as u64) as usize, 0);
        self.file.put(&buf, self.at)?;
        if let Err(e) = self.file.flush() {
            // Refused to its callers, it must not be replayed should it
            // have reached the disk anyway: its header goes (best effort).
            let _ = self.file.put(&[0u8; HEAD], self.at);
            let _ = self.file.flush();
            return Err(e);
        }
        self.at += buf.len() as u64;
        self.last = seq;
        Ok(seq)
    }

    /// A new database starts with none of the journal's records: the
    /// first header goes, so that a journal left beside a removed
    /// database replays nothing into its successor.
    pub fn forget(&mut self) -> io::Result<()> {
        self.file.put(&[0u8; HEAD], 0)?;
        self.file.flush()?;
        self.at = 0;
        self.last = 0;
        Ok(())
    }

    /// Bytes written since the last checkpoint.
    pub fn used(&self) -> u64 {
        self.at
    }

    /// The database holds every record up to `last` (replayed, or
    /// written and applied): the next goes at the start.
    pub fn checkpointed(&mut self, last: u64) {
        self.at = 0;
        self.last = self.last.max(last);
    }

    /// The sequence number of the last record written.
    pub fn last(&self) -> u64 {
        self.last
    }
}

fn padded(n: u64) -> u64 {
    n.div_ceil(PAGE) * PAGE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_come_back_in_order_after_the_checkpointed_one_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let mut j = Journal::open(&path, 4 * PAGE, 0).unwrap();
        assert_eq!(j.append(b"one").unwrap(), 1);
        assert_eq!(j.append(&[7u8; 5000]).unwrap(), 2);
        assert_eq!(j.used(), 3 * PAGE, "each record padded to whole pages");
        assert_eq!(j.append(b"three").unwrap(), 3);
        let all = j.replay(0).unwrap();
        let seqs: Vec<u64> = all.iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, [1, 2, 3]);
        assert_eq!(all[1].1, vec![7u8; 5000]);
        // The store had checkpointed 1..3: nothing to replay, and the
        // records written after the checkpoint start over at the front.
        assert!(j.replay(3).unwrap().is_empty());
        j.checkpointed(3);
        assert_eq!(j.append(b"four").unwrap(), 4);
        let after = j.replay(3).unwrap();
        assert_eq!(
            after,
            [(4, b"four".to_vec())],
            "older records behind it are not taken"
        );
        // Opened again (a restart) it finds the same.
        let j2 = Journal::open(&path, 4 * PAGE, 3).unwrap();
        assert_eq!(j2.replay(3).unwrap(), after);
    }

    #[test]
    fn a_torn_or_corrupt_record_ends_the_replay() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let mut j = Journal::open(&path, 4 * PAGE, 10).unwrap();
        j.append(b"eleven").unwrap();
        j.append(b"twelve").unwrap();
        j.append(b"thirteen").unwrap();
        // A flipped byte in the second record's body.
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(b"X", PAGE + HEAD as u64 + 1).unwrap();
        let got = j.replay(10).unwrap();
        assert_eq!(got, [(11, b"eleven".to_vec())]);
        // A length past the end of the file is not read.
        f.write_all_at(&u32::MAX.to_le_bytes(), 12).unwrap();
        assert!(j.replay(10).unwrap().is_empty());
    }

    #[test]
    fn a_record_larger_than_the_file_grows_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let mut j = Journal::open(&path, PAGE, 0).unwrap();
        let big = vec![1u8; 3 * PAGE as usize];
        j.append(&big).unwrap();
        j.append(b"next").unwrap();
        let got = j.replay(0).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].1, big);
    }

    /// A file in memory: what the process wrote, and what a crash would
    /// leave on disk. A failing flush still takes the data to the disk
    /// (the worst case: the caller hears of a failure, the disk has it).
    #[derive(Default)]
    struct Flaky {
        written: std::cell::RefCell<Vec<u8>>,
        disk: std::cell::RefCell<Vec<u8>>,
        /// Flushes still to fail.
        fail: std::cell::Cell<u32>,
    }

    impl Flaky {
        fn of(bytes: Vec<u8>) -> Flaky {
            Flaky {
                written: bytes.into(),
                ..Flaky::default()
            }
        }

        /// The journal as a restart after a crash now reads it.
        fn after_crash(&self) -> Vec<(u64, Vec<u8>)> {
            let disk = Flaky::of(self.disk.borrow().clone());
            Journal::on(&disk, 0).replay(0).unwrap()
        }
    }

    impl Media for &Flaky {
        fn put(&self, buf: &[u8], at: u64) -> io::Result<()> {
            let mut w = self.written.borrow_mut();
            let end = at as usize + buf.len();
            if w.len() < end {
                w.resize(end, 0);
            }
            w[at as usize..end].copy_from_slice(buf);
            Ok(())
        }
        fn get(&self, buf: &mut [u8], at: u64) -> io::Result<()> {
            let w = self.written.borrow();
            buf.copy_from_slice(&w[at as usize..at as usize + buf.len()]);
            Ok(())
        }
        fn size(&self) -> io::Result<u64> {
            Ok(self.written.borrow().len() as u64)
        }
        fn flush(&self) -> io::Result<()> {
            *self.disk.borrow_mut() = self.written.borrow().clone();
            match self.fail.get() {
                0 => Ok(()),
                n => {
                    self.fail.set(n - 1);
                    Err(io::Error::other("injected EIO"))
                }
            }
        }
    }

    #[test]
    fn a_record_whose_flush_failed_is_never_replayed() {
        let media = Flaky::of(vec![0u8; 4 * PAGE as usize]);
        let mut j = Journal::on(&media, 0);
        assert_eq!(j.append(b"one").unwrap(), 1);
        media.fail.set(1);
        assert!(j.append(b"refused").is_err());
        // Its body reached the disk with the failed flush; its header was
        // erased after, so a restart does not take it.
        assert_eq!(media.after_crash(), [(1, b"one".to_vec())]);
        assert_eq!(j.replay(0).unwrap(), [(1, b"one".to_vec())]);
        // The next record takes its number and its place.
        assert_eq!(j.append(b"two").unwrap(), 2);
        assert_eq!(j.used(), 2 * PAGE);
        assert_eq!(
            media.after_crash(),
            [(1, b"one".to_vec()), (2, b"two".to_vec())]
        );
    }

    #[test]
    fn a_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, b"not yours").unwrap();
        let link = dir.path().join("j");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(Journal::open(&link, PAGE, 0).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"not yours");
    }
}
