//! Criterion benches only; see `benches/`. The workloads they use live in
//! `corral-replay` (`corral_replay::synthetic`).
