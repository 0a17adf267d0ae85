//! Bytes from the network: every message type decodes or refuses, never
//! panics; what decodes re-encodes to a frame that decodes the same.
#![no_main]

use corral_proto::frame::{decode_body, encode};
use corral_proto::msg::{AgentMsg, CtldMsg, LocalRequest, Open, Response, StepDown, StepUp};
use libfuzzer_sys::fuzz_target;

fn check<T: serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug>(body: &[u8]) {
    if let Ok(msg) = decode_body::<T>(body) {
        let frame = encode(&msg).expect("a decoded message encodes");
        let again: T = decode_body(&frame[4..]).expect("an encoded message decodes");
        assert_eq!(format!("{msg:?}"), format!("{again:?}"));
    }
}

fuzz_target!(|data: &[u8]| {
    check::<Open>(data);
    check::<AgentMsg>(data);
    check::<CtldMsg>(data);
    check::<LocalRequest>(data);
    check::<Response>(data);
    check::<StepUp>(data);
    check::<StepDown>(data);
});
