//! A job's spec as the controller keeps it: encoded.
//!
//! A [`JobSpec`] in memory is 792 bytes before its strings, most of them
//! options nobody set; encoded (bincode's variable-length integers, one
//! byte for each absent option) a typical pending job's is about a
//! hundred. The job table holds tens of thousands of them, and reads a
//! job's spec seldom (a view, a launch, an update), so each read decodes
//! it and each change encodes it again. The store sees a plain
//! [`JobSpec`]: [`PackedSpec`] serializes as the spec it holds, so the
//! stored records are what they were.

use corral_proto::msg::{
    ArraySpec, Dep, GpuAsk, JobKind, JobSpec, LimitSignal, StepIo, TaskFiles, UnixSecs,
};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// An encoded [`JobSpec`]: [`PackedSpec::get`] decodes it,
/// [`PackedSpec::edit`] changes it. What the clock looks at in every
/// running job each tick (its kind, its `--signal`) is kept beside the
/// encoded spec, made from the same spec: the kind as one more byte after
/// it (a field of its own would cost eight with its padding, and the
/// record a larger allocation).
#[derive(Clone, PartialEq, Eq)]
pub(super) struct PackedSpec {
    /// The encoded spec, then its [`Kind`]'s byte.
    bytes: Box<[u8]>,
    /// Boxed: few jobs have one, and eight bytes less of every record
    /// put it in a smaller allocation.
    limit_signal: Option<Box<LimitSignal>>,
}

/// A [`JobKind`] without its contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Batch,
    Interactive,
    Allocation,
}

impl PackedSpec {
    pub(super) fn new(spec: &JobSpec) -> PackedSpec {
        let mut bytes = bincode::serde::encode_to_vec(spec, config())
            .expect("a JobSpec always encodes: it holds only strings, numbers and lists");
        let kind = match spec.kind {
            JobKind::Batch { .. } => Kind::Batch,
            JobKind::Interactive { .. } => Kind::Interactive,
            JobKind::Allocation => Kind::Allocation,
        };
        bytes.push(kind as u8);
        PackedSpec {
            bytes: bytes.into_boxed_slice(),
            limit_signal: spec.limit_signal.map(Box::new),
        }
    }

    pub(super) fn kind(&self) -> Kind {
        match self.bytes.last() {
            Some(&b) if b == Kind::Interactive as u8 => Kind::Interactive,
            Some(&b) if b == Kind::Allocation as u8 => Kind::Allocation,
            _ => Kind::Batch,
        }
    }

    pub(super) fn limit_signal(&self) -> Option<LimitSignal> {
        self.limit_signal.as_deref().copied()
    }

    /// The spec, decoded.
    pub(super) fn get(&self) -> JobSpec {
        bincode::serde::decode_from_slice(&self.bytes, config())
            .map(|(s, _)| s)
            .expect("a PackedSpec holds bytes its own `new` encoded")
    }

    /// The spec read in place: its texts borrow the packed bytes, so a
    /// listing of ten thousand jobs allocates none of the texts it does
    /// not show (decoding each spec whole made and freed them all, a
    /// third of ctld's work for a `squeue`).
    pub(super) fn read(&self) -> SpecRef<'_> {
        bincode::serde::borrow_decode_from_slice(&self.bytes, config())
            .map(|(s, _)| s)
            .expect("a PackedSpec holds bytes its own `new` encoded")
    }

    /// The spec's first fields read in place, the rest left encoded: what
    /// a bare view shows ([`corral_proto::msg::JobFilter::bare`]). A
    /// listing of ten thousand jobs spent a third of ctld's time reading
    /// whole specs for a name and a node count.
    pub(super) fn head(&self) -> SpecHead<'_> {
        bincode::serde::borrow_decode_from_slice(&self.bytes, config())
            .map(|(s, _)| s)
            .expect("a PackedSpec holds bytes its own `new` encoded")
    }

    /// Where its bytes are, for [`scheduler_core::prefetch_bytes`].
    pub(super) fn bytes_at(&self) -> *const u8 {
        self.bytes.as_ptr()
    }

    /// The spec to change in place: encoded again when the guard goes.
    pub(super) fn edit(&mut self) -> SpecEdit<'_> {
        let spec = self.get();
        SpecEdit { packed: self, spec }
    }

    /// Bytes it takes.
    pub(super) fn len(&self) -> usize {
        self.bytes.len()
    }
}

impl std::fmt::Debug for PackedSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

impl Serialize for PackedSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.get().serialize(s)
    }
}

impl<'de> Deserialize<'de> for PackedSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<PackedSpec, D::Error> {
        JobSpec::deserialize(d).map(|s| PackedSpec::new(&s))
    }
}

/// A [`JobSpec`] as [`PackedSpec::read`] decodes it: the same fields in
/// the same order (bincode reads by position), texts borrowed. The
/// `reads_every_field_as_the_spec_has_it` test fills every field of a
/// spec and compares, so a field added to one and not the other fails it.
// bincode reads by position: every field is here, read or not.
#[allow(dead_code)]
#[derive(Debug, Deserialize)]
pub(super) struct SpecRef<'a> {
    pub name: &'a str,
    #[serde(borrow)]
    pub partition: Option<&'a str>,
    pub nodes: Option<u32>,
    pub ntasks: Option<u32>,
    pub ntasks_per_node: Option<u32>,
    pub cpus_per_task: Option<u32>,
    pub mem_mb: Option<u64>,
    pub mem_whole: bool,
    pub mem_per_cpu_mb: Option<u64>,
    pub mem_per_gpu_mb: Option<u64>,
    pub gpus: GpuAsk,
    #[serde(borrow)]
    pub gpu_type: Option<&'a str>,
    pub exclusive: bool,
    pub time_limit: Option<u64>,
    #[serde(borrow)]
    pub nodelist: Vec<&'a str>,
    #[serde(borrow)]
    pub exclude: Vec<&'a str>,
    pub requeue: bool,
    pub hold: bool,
    pub dependencies: Vec<Dep>,
    pub dependency_any: bool,
    pub kill_on_invalid_dep: bool,
    pub begin: Option<UnixSecs>,
    #[serde(borrow)]
    pub qos: Option<&'a str>,
    #[serde(borrow)]
    pub account: Option<&'a str>,
    pub nice: i32,
    pub work_dir: &'a str,
    #[serde(borrow)]
    pub env: Vec<(&'a str, &'a str)>,
    #[serde(borrow)]
    pub kind: KindRef<'a>,
    #[serde(borrow)]
    pub constraint: Vec<&'a str>,
    pub constraint_any: bool,
    pub limit_signal: Option<LimitSignal>,
    #[serde(borrow)]
    pub submit_dir: Option<&'a str>,
    #[serde(borrow)]
    pub submit_host: Option<&'a str>,
    pub open_append: bool,
    #[serde(borrow)]
    pub script_path: Option<&'a str>,
    #[serde(borrow)]
    pub comment: Option<&'a str>,
    #[serde(borrow)]
    pub mail_type: Option<&'a str>,
    #[serde(borrow)]
    pub mail_user: Option<&'a str>,
    pub array: Option<ArraySpec>,
    #[serde(borrow)]
    pub wckey: Option<&'a str>,
}

/// The first fields of a [`JobSpec`], in its order: bincode reads by
/// position and stops after the last field asked for
/// (`the_head_is_the_specs_first_fields` checks them against the spec).
#[derive(Debug, Deserialize)]
pub(super) struct SpecHead<'a> {
    pub name: &'a str,
    /// Read on the way to `nodes` (the record has the partition).
    #[allow(dead_code)]
    #[serde(borrow)]
    pub partition: Option<&'a str>,
    pub nodes: Option<u32>,
}

/// A [`JobKind`] as [`SpecRef`] reads it. An interactive job's files are
/// decoded owned: few jobs have them.
#[allow(dead_code)]
#[derive(Debug, Deserialize)]
pub(super) enum KindRef<'a> {
    Batch {
        /// Empty once the store holds the script.
        script: Vec<u8>,
        #[serde(borrow)]
        args: Vec<&'a str>,
        #[serde(borrow)]
        stdout: Option<&'a str>,
        #[serde(borrow)]
        stderr: Option<&'a str>,
    },
    Interactive {
        #[serde(borrow)]
        argv: Vec<&'a str>,
        io: StepIo,
        files: TaskFiles,
    },
    Allocation,
}

/// A spec being changed ([`PackedSpec::edit`]).
pub(super) struct SpecEdit<'a> {
    packed: &'a mut PackedSpec,
    spec: JobSpec,
}

impl std::ops::Deref for SpecEdit<'_> {
    type Target = JobSpec;
    fn deref(&self) -> &JobSpec {
        &self.spec
    }
}

impl std::ops::DerefMut for SpecEdit<'_> {
    fn deref_mut(&mut self) -> &mut JobSpec {
        &mut self.spec
    }
}

impl Drop for SpecEdit<'_> {
    fn drop(&mut self) {
        *self.packed = PackedSpec::new(&self.spec);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_proto::msg::{GpuAsk, JobKind};

    fn spec() -> JobSpec {
        JobSpec {
            name: "train".into(),
            work_dir: "/home/ada/run".into(),
            gpus: GpuAsk::PerNode(4),
            time_limit: Some(3600),
            env: vec![("A".into(), "1".into())],
            kind: JobKind::Batch {
                script: b"#!/bin/sh\ntrue\n".to_vec(),
                args: vec!["x".into()],
                stdout: Some("out-%j".into()),
                stderr: None,
            },
            ..JobSpec::default()
        }
    }

    #[test]
    fn keeps_the_spec_and_changes_it() {
        let s = spec();
        let mut p = PackedSpec::new(&s);
        assert_eq!(p.get(), s);
        assert_eq!(p.kind(), Kind::Batch);
        assert_eq!(p.limit_signal(), None);
        // The point of it: far smaller than the spec's own size.
        assert!(p.len() < 120, "{} bytes", p.len());
        p.edit().hold = true;
        let mut want = s.clone();
        want.hold = true;
        assert_eq!(p.get(), want);
        let mut e = p.edit();
        e.kind = JobKind::Allocation;
        e.limit_signal = Some(LimitSignal {
            signal: corral_proto::msg::SendSignal {
                to: corral_proto::msg::SignalTo::All,
                signal: 10,
            },
            before: 60,
        });
        drop(e);
        assert_eq!(
            p.kind(),
            Kind::Allocation,
            "made again from the changed spec"
        );
        assert!(p.limit_signal().is_some());
    }

    #[test]
    fn the_head_is_the_specs_first_fields() {
        let mut s = spec();
        s.partition = Some("gpu".into());
        s.nodes = Some(3);
        s.ntasks = Some(7);
        let p = PackedSpec::new(&s);
        let h = p.head();
        assert_eq!(
            (h.name, h.partition, h.nodes),
            ("train", Some("gpu"), Some(3))
        );
        s.partition = None;
        s.nodes = None;
        let p = PackedSpec::new(&s);
        let h = p.head();
        assert_eq!((h.name, h.partition, h.nodes), ("train", None, None));
    }

    fn strs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }

    /// Every field of [`JobSpec`] set (a struct literal without
    /// `..Default`: a new field does not compile until it is here), no
    /// two neighbours alike, read through [`SpecRef`] and compared.
    #[test]
    fn reads_every_field_as_the_spec_has_it() {
        use corral_proto::msg::{DepCond, IndexRun, SendSignal, SignalTo};
        let io = StepIo {
            addr: "127.0.0.1:7".parse().unwrap(),
            cert_sha256: [3; 32],
            secret: [4; 32],
        };
        let files = TaskFiles {
            stdout: Some("o".into()),
            stderr: Some("e".into()),
            stdin: Some("i".into()),
            pty: true,
        };
        for kind in [
            JobKind::Batch {
                script: b"#!/bin/sh\n".to_vec(),
                args: vec!["a1".into(), "a2".into()],
                stdout: Some("out-%j".into()),
                stderr: Some("err-%j".into()),
            },
            JobKind::Interactive {
                argv: vec!["hostname".into(), "-f".into()],
                io,
                files: files.clone(),
            },
            JobKind::Allocation,
        ] {
            let s = JobSpec {
                name: "train".into(),
                partition: Some("gpu".into()),
                nodes: Some(2),
                ntasks: Some(16),
                ntasks_per_node: Some(8),
                cpus_per_task: Some(4),
                mem_mb: Some(1024),
                mem_whole: true,
                mem_per_cpu_mb: Some(5),
                mem_per_gpu_mb: Some(6),
                gpus: GpuAsk::PerTask(1),
                gpu_type: Some("h200".into()),
                exclusive: true,
                time_limit: Some(3600),
                nodelist: vec!["n1".into(), "n2".into()],
                exclude: vec!["n3".into()],
                requeue: true,
                hold: false,
                dependencies: vec![
                    Dep::AfterOk(corral_proto::msg::JobId(9)),
                    Dep::Task {
                        cond: DepCond::AfterAny,
                        job: corral_proto::msg::JobId(10),
                        task: 3,
                    },
                ],
                dependency_any: true,
                kill_on_invalid_dep: false,
                begin: Some(77),
                qos: Some("high".into()),
                account: Some("physics".into()),
                nice: -5,
                work_dir: "/home/ada/run".into(),
                env: vec![("A".into(), "1".into()), ("B".into(), "2".into())],
                kind,
                constraint: vec!["ib".into(), "nvme".into()],
                constraint_any: true,
                limit_signal: Some(LimitSignal {
                    signal: SendSignal {
                        to: SignalTo::All,
                        signal: 10,
                    },
                    before: 60,
                }),
                submit_dir: Some("/home/ada".into()),
                submit_host: Some("login1".into()),
                open_append: false,
                script_path: Some("/home/ada/run.sh".into()),
                comment: Some("c".into()),
                mail_type: Some("END".into()),
                mail_user: Some("ada@example.org".into()),
                wckey: Some("submitit".into()),
                array: Some(ArraySpec {
                    runs: vec![IndexRun {
                        first: 1,
                        count: 4,
                        step: 2,
                    }],
                    throttle: 2,
                }),
            };
            let p = PackedSpec::new(&s);
            let r = p.read();
            assert_eq!(r.name, s.name);
            assert_eq!(r.partition, s.partition.as_deref());
            assert_eq!(
                (r.nodes, r.ntasks, r.ntasks_per_node, r.cpus_per_task),
                (s.nodes, s.ntasks, s.ntasks_per_node, s.cpus_per_task)
            );
            assert_eq!(
                (r.mem_mb, r.mem_whole, r.mem_per_cpu_mb, r.mem_per_gpu_mb),
                (s.mem_mb, s.mem_whole, s.mem_per_cpu_mb, s.mem_per_gpu_mb)
            );
            assert_eq!((r.gpus, r.gpu_type), (s.gpus, s.gpu_type.as_deref()));
            assert_eq!((r.exclusive, r.time_limit), (s.exclusive, s.time_limit));
            assert_eq!(r.nodelist, strs(&s.nodelist));
            assert_eq!(r.exclude, strs(&s.exclude));
            assert_eq!((r.requeue, r.hold), (s.requeue, s.hold));
            assert_eq!(r.dependencies, s.dependencies);
            assert_eq!(
                (r.dependency_any, r.kill_on_invalid_dep, r.begin),
                (s.dependency_any, s.kill_on_invalid_dep, s.begin)
            );
            assert_eq!(
                (r.qos, r.account, r.nice),
                (s.qos.as_deref(), s.account.as_deref(), s.nice)
            );
            assert_eq!(r.work_dir, s.work_dir);
            assert_eq!(
                r.env,
                s.env
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect::<Vec<_>>()
            );
            // The kind kept after the spec's bytes is the spec's.
            let kept = match s.kind {
                JobKind::Batch { .. } => Kind::Batch,
                JobKind::Interactive { .. } => Kind::Interactive,
                JobKind::Allocation => Kind::Allocation,
            };
            assert_eq!(p.kind(), kept);
            match (&r.kind, &s.kind) {
                (
                    KindRef::Batch {
                        script,
                        args,
                        stdout,
                        stderr,
                    },
                    JobKind::Batch {
                        script: s2,
                        args: a2,
                        stdout: o2,
                        stderr: e2,
                    },
                ) => {
                    assert_eq!(script, s2);
                    assert_eq!(*args, strs(a2));
                    assert_eq!((*stdout, *stderr), (o2.as_deref(), e2.as_deref()));
                }
                (
                    KindRef::Interactive { argv, io, files },
                    JobKind::Interactive {
                        argv: a2,
                        io: i2,
                        files: f2,
                    },
                ) => {
                    assert_eq!(*argv, strs(a2));
                    assert_eq!((io, files), (i2, f2));
                }
                (KindRef::Allocation, JobKind::Allocation) => {}
                (r, s) => panic!("{r:?} read from {s:?}"),
            }
            assert_eq!(r.constraint, strs(&s.constraint));
            assert_eq!(
                (r.constraint_any, r.limit_signal),
                (s.constraint_any, s.limit_signal)
            );
            assert_eq!(
                (r.submit_dir, r.submit_host, r.open_append),
                (
                    s.submit_dir.as_deref(),
                    s.submit_host.as_deref(),
                    s.open_append
                )
            );
            assert_eq!(
                (r.script_path, r.comment, r.mail_type, r.mail_user),
                (
                    s.script_path.as_deref(),
                    s.comment.as_deref(),
                    s.mail_type.as_deref(),
                    s.mail_user.as_deref()
                )
            );
            assert_eq!(r.array, s.array);
            assert_eq!(r.wckey, s.wckey.as_deref());
            // And it read them all: nothing was left over.
            let (_, used): (SpecRef<'_>, usize) =
                bincode::serde::borrow_decode_from_slice(&p.bytes, config()).expect("decode");
            assert_eq!(used + 1, p.bytes.len());
        }
    }

    #[test]
    fn serializes_as_the_spec() {
        let s = spec();
        let p = PackedSpec::new(&s);
        let a = bincode::serde::encode_to_vec(&p, config()).expect("encode");
        let b = bincode::serde::encode_to_vec(&s, config()).expect("encode");
        assert_eq!(a, b, "the store's records are unchanged");
        let (back, _): (PackedSpec, usize) =
            bincode::serde::decode_from_slice(&b, config()).expect("decode");
        assert_eq!(back.get(), s);
    }
}
