//! Length-prefixed frames: `[u32 length][u16 version][bincode payload]`,
//! big-endian, length counting the version and the payload.
//!
//! A frame is refused before its body is read when it claims more than the
//! maximum size, and after when its version is not ours or its payload does
//! not decode to exactly the expected message. Refusal is an error for the
//! caller to close that one stream with; this module never panics on what
//! it reads.

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The version every frame carries. Bump it when a message changes shape.
pub const PROTOCOL_VERSION: u16 = 31;

/// The largest frame accepted (a batch script travels in one).
pub const MAX_FRAME: u32 = 8 << 20;

const HEADER: usize = 6;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    TooLarge { len: u32, max: u32 },
    #[error("frame has protocol version {got}, this side speaks {want}")]
    Version { got: u16, want: u16 },
    #[error("frame too short to hold a header ({0} bytes)")]
    Short(u32),
    #[error("frame does not decode")]
    Decode(#[source] bincode::error::DecodeError),
    #[error("frame has {0} bytes left over after its message")]
    Trailing(usize),
    #[error("message does not encode")]
    Encode(#[source] bincode::error::EncodeError),
    #[error("stream ended inside a frame")]
    Truncated,
    #[error("stream i/o")]
    Io(#[source] std::io::Error),
}

pub(crate) fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<{ MAX_FRAME as usize }>()
}

/// The bytes `msg` takes in a frame's body (`usize::MAX` if it cannot
/// be encoded within a frame).
pub fn encoded_len<T: Serialize>(msg: &T) -> usize {
    let mut w = bincode::enc::write::SizeWriter::default();
    match bincode::serde::encode_into_writer(msg, &mut w, config()) {
        Ok(()) => w.bytes_written,
        Err(_) => usize::MAX,
    }
}

/// Encodes one message as a whole frame.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, WireError> {
    let mut buf = vec![0u8; HEADER];
    bincode::serde::encode_into_std_write(msg, &mut buf, config()).map_err(WireError::Encode)?;
    let len = (buf.len() - 4) as u64;
    if len > MAX_FRAME as u64 {
        return Err(WireError::TooLarge {
            len: u32::try_from(len).unwrap_or(u32::MAX),
            max: MAX_FRAME,
        });
    }
    buf[..4].copy_from_slice(&(len as u32).to_be_bytes());
    buf[4..6].copy_from_slice(&PROTOCOL_VERSION.to_be_bytes());
    Ok(buf)
}

/// Decodes the body of a frame (the bytes after the length).
pub fn decode_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, WireError> {
    if body.len() < 2 {
        return Err(WireError::Short(body.len() as u32));
    }
    let got = u16::from_be_bytes([body[0], body[1]]);
    if got != PROTOCOL_VERSION {
        return Err(WireError::Version {
            got,
            want: PROTOCOL_VERSION,
        });
    }
    let (msg, used) =
        bincode::serde::decode_from_slice(&body[2..], config()).map_err(WireError::Decode)?;
    let left = body.len() - 2 - used;
    if left != 0 {
        return Err(WireError::Trailing(left));
    }
    Ok(msg)
}

/// Writes one message as a frame.
pub async fn write_frame<W, T>(w: &mut W, msg: &T) -> Result<(), WireError>
where
    W: AsyncWrite + Unpin,
    T: Serialize,
{
    let buf = encode(msg)?;
    w.write_all(&buf).await.map_err(WireError::Io)
}

/// Reads one frame. `Ok(None)` is a clean end of stream between frames.
pub async fn read_frame<R, T>(r: &mut R) -> Result<Option<T>, WireError>
where
    R: AsyncRead + Unpin,
    T: DeserializeOwned,
{
    match read_len(r).await? {
        Some(len) => read_body(r, len).await.map(Some),
        None => Ok(None),
    }
}

/// Reads a frame's length prefix and checks it, before anything is
/// allocated for the body (a reader with a memory budget takes its share
/// between the two). `Ok(None)` is a clean end of stream between frames.
pub async fn read_len<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<u32>, WireError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        let n = r.read(&mut len[got..]).await.map_err(WireError::Io)?;
        if n == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(WireError::Truncated)
            };
        }
        got += n;
    }
    let len = u32::from_be_bytes(len);
    if len > MAX_FRAME {
        return Err(WireError::TooLarge {
            len,
            max: MAX_FRAME,
        });
    }
    if len < 2 {
        return Err(WireError::Short(len));
    }
    Ok(Some(len))
}

/// Reads one frame whole, its length and version checked but its message
/// not decoded: what a relay passes on as it came (the reader at the far
/// end decodes and checks it). `Ok(None)` is a clean end of stream.
pub async fn read_raw_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Vec<u8>>, WireError> {
    let mut frame = Vec::new();
    Ok(read_raw_frame_into(r, &mut frame).await?.then_some(frame))
}

/// [`read_raw_frame`] into `frame`, its memory kept from the last frame
/// (a listing's twenty parts fault in their pages once, not twenty
/// times). `Ok(false)` is a clean end of stream.
pub async fn read_raw_frame_into<R: AsyncRead + Unpin>(
    r: &mut R,
    frame: &mut Vec<u8>,
) -> Result<bool, WireError> {
    let Some(len) = read_len(r).await? else {
        return Ok(false);
    };
    frame.clear();
    frame.resize(4 + len as usize, 0);
    frame[..4].copy_from_slice(&len.to_be_bytes());
    r.read_exact(&mut frame[4..]).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            WireError::Truncated
        } else {
            WireError::Io(e)
        }
    })?;
    let got = u16::from_be_bytes([frame[4], frame[5]]);
    if got != PROTOCOL_VERSION {
        return Err(WireError::Version {
            got,
            want: PROTOCOL_VERSION,
        });
    }
    Ok(true)
}

/// Reads and decodes the body of a frame whose length [`read_len`] gave.
pub async fn read_body<R, T>(r: &mut R, len: u32) -> Result<T, WireError>
where
    R: AsyncRead + Unpin,
    T: DeserializeOwned,
{
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            WireError::Truncated
        } else {
            WireError::Io(e)
        }
    })?;
    decode_body(&body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Msg {
        id: u64,
        text: String,
        list: Vec<u32>,
    }

    fn msg() -> Msg {
        Msg {
            id: 7,
            text: "hello".into(),
            list: vec![1, 2, 3],
        }
    }

    #[tokio::test]
    async fn round_trip_and_clean_end() {
        let mut buf = encode(&msg()).unwrap();
        buf.extend(encode(&msg()).unwrap());
        let mut r = &buf[..];
        assert_eq!(read_frame::<_, Msg>(&mut r).await.unwrap(), Some(msg()));
        assert_eq!(read_frame::<_, Msg>(&mut r).await.unwrap(), Some(msg()));
        assert!(read_frame::<_, Msg>(&mut r).await.unwrap().is_none());
    }

    /// A raw frame comes back byte for byte, its header checked: a relay
    /// passes on only frames of this version and size.
    #[tokio::test]
    async fn raw_frames_pass_as_they_came_headers_checked() {
        let one = encode(&msg()).unwrap();
        let mut two = one.clone();
        two.extend(encode(&msg()).unwrap());
        let mut r = &two[..];
        assert_eq!(read_raw_frame(&mut r).await.unwrap(), Some(one.clone()));
        let again = read_raw_frame(&mut r).await.unwrap().unwrap();
        assert_eq!(
            read_frame::<_, Msg>(&mut &again[..]).await.unwrap(),
            Some(msg())
        );
        assert!(read_raw_frame(&mut r).await.unwrap().is_none());
        let mut other = one.clone();
        other[4..6].copy_from_slice(&(PROTOCOL_VERSION + 1).to_be_bytes());
        let err = read_raw_frame(&mut &other[..]).await.unwrap_err();
        assert!(matches!(err, WireError::Version { .. }), "{err}");
        let err = read_raw_frame(&mut &one[..one.len() - 1])
            .await
            .unwrap_err();
        assert!(matches!(err, WireError::Truncated), "{err}");
        let mut huge = (MAX_FRAME + 1).to_be_bytes().to_vec();
        huge.extend(PROTOCOL_VERSION.to_be_bytes());
        let err = read_raw_frame(&mut &huge[..]).await.unwrap_err();
        assert!(matches!(err, WireError::TooLarge { .. }), "{err}");
    }

    #[tokio::test]
    async fn refuses_oversized_before_reading_body() {
        let mut frame = (MAX_FRAME + 1).to_be_bytes().to_vec();
        frame.extend(PROTOCOL_VERSION.to_be_bytes());
        let err = read_frame::<_, Msg>(&mut &frame[..]).await.unwrap_err();
        assert!(matches!(err, WireError::TooLarge { .. }), "{err}");
    }

    #[tokio::test]
    async fn refuses_other_version() {
        let mut frame = encode(&msg()).unwrap();
        frame[4..6].copy_from_slice(&(PROTOCOL_VERSION + 1).to_be_bytes());
        let err = read_frame::<_, Msg>(&mut &frame[..]).await.unwrap_err();
        assert!(matches!(err, WireError::Version { .. }), "{err}");
    }

    #[tokio::test]
    async fn refuses_truncated_and_trailing() {
        let frame = encode(&msg()).unwrap();
        let err = read_frame::<_, Msg>(&mut &frame[..frame.len() - 1])
            .await
            .unwrap_err();
        assert!(matches!(err, WireError::Truncated), "{err}");
        let err = read_frame::<_, Msg>(&mut &frame[..2]).await.unwrap_err();
        assert!(matches!(err, WireError::Truncated), "{err}");
        // One byte more inside the frame than the message uses.
        let mut long = frame.clone();
        long.push(0);
        let n = (long.len() - 4) as u32;
        long[..4].copy_from_slice(&n.to_be_bytes());
        let err = read_frame::<_, Msg>(&mut &long[..]).await.unwrap_err();
        assert!(matches!(err, WireError::Trailing(1)), "{err}");
    }

    #[test]
    fn hostile_length_prefix_inside_payload_is_bounded() {
        // A vector claiming 2^60 elements must fail to decode, not allocate.
        let mut body = PROTOCOL_VERSION.to_be_bytes().to_vec();
        body.extend([7u8, 5, b'h', b'e', b'l', b'l', b'o']);
        body.push(0xFF); // varint marker for a u64 length follows
        body.extend((1u64 << 60).to_le_bytes());
        assert!(decode_body::<Msg>(&body).is_err());
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let _ = decode_body::<Msg>(&bytes);
        }
    }
}
