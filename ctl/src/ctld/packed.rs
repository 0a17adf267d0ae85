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

use corral_proto::msg::{JobKind, JobSpec, LimitSignal};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// An encoded [`JobSpec`]: [`PackedSpec::get`] decodes it,
/// [`PackedSpec::edit`] changes it. What the clock looks at in every
/// running job each tick (its kind, its `--signal`) is kept beside the
/// bytes, made from the same spec.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct PackedSpec {
    bytes: Box<[u8]>,
    kind: Kind,
    limit_signal: Option<LimitSignal>,
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
        let bytes = bincode::serde::encode_to_vec(spec, config())
            .expect("a JobSpec always encodes: it holds only strings, numbers and lists");
        PackedSpec {
            bytes: bytes.into_boxed_slice(),
            kind: match spec.kind {
                JobKind::Batch { .. } => Kind::Batch,
                JobKind::Interactive { .. } => Kind::Interactive,
                JobKind::Allocation => Kind::Allocation,
            },
            limit_signal: spec.limit_signal,
        }
    }

    pub(super) fn kind(&self) -> Kind {
        self.kind
    }

    pub(super) fn limit_signal(&self) -> Option<LimitSignal> {
        self.limit_signal
    }

    /// The spec, decoded.
    pub(super) fn get(&self) -> JobSpec {
        bincode::serde::decode_from_slice(&self.bytes, config())
            .map(|(s, _)| s)
            .expect("a PackedSpec holds bytes its own `new` encoded")
    }

    /// The spec to change in place: encoded again when the guard goes.
    pub(super) fn edit(&mut self) -> SpecEdit<'_> {
        let spec = self.get();
        SpecEdit { packed: self, spec }
    }

    /// Bytes it takes.
    #[cfg(test)]
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
