//! ttrpc's framing (containerd's light gRPC, github.com/containerd/ttrpc channel.go), written
//! small: each message is a 10-byte header (payload length u32, stream id u32, both
//! big-endian; type u8; flags u8) and the payload, at most 4 MiB. A request's payload is a
//! `ttrpc.Request` (service, method, the method's message), a response's a `ttrpc.Response`
//! (status, the answer's message). A client numbers its streams 1, 3, 5, ...
//!
//! Pure: [`encode`] and [`Reader`]; docs/design.md says why not the `ttrpc` crate.

/// Length, stream id, type, flags.
pub const HEADER_LEN: usize = 10;
/// ttrpc's largest message.
pub const MAX_MESSAGE: usize = 4 << 20;

pub const REQUEST: u8 = 1;
pub const RESPONSE: u8 = 2;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub stream: u32,
    pub kind: u8,
    pub flags: u8,
    pub payload: Vec<u8>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TtrpcError {
    #[error("ttrpc message of {0} bytes is larger than {MAX_MESSAGE}")]
    TooLarge(usize),
}

/// The message's bytes: header and payload.
pub fn encode(stream: u32, kind: u8, payload: &[u8]) -> Result<Vec<u8>, TtrpcError> {
    if payload.len() > MAX_MESSAGE {
        return Err(TtrpcError::TooLarge(payload.len()));
    }
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&stream.to_be_bytes());
    out.push(kind);
    out.push(0);
    out.extend_from_slice(payload);
    Ok(out)
}

/// One logical connection's bytes, cut into messages.
#[derive(Debug, Default)]
pub struct Reader {
    buf: Vec<u8>,
}

impl Reader {
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole message, or `None` until more bytes come.
    pub fn next_message(&mut self) -> Result<Option<Message>, TtrpcError> {
        let Some(h) = self.buf.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
        if len > MAX_MESSAGE {
            return Err(TtrpcError::TooLarge(len));
        }
        if self.buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let stream = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
        let (kind, flags) = (h[8], h[9]);
        let payload = self.buf[HEADER_LEN..HEADER_LEN + len].to_vec();
        self.buf.drain(..HEADER_LEN + len);
        Ok(Some(Message {
            stream,
            kind,
            flags,
            payload,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_length_stream_type_flags() {
        let m = encode(3, REQUEST, b"xy").unwrap();
        assert_eq!(m, [0, 0, 0, 2, 0, 0, 0, 3, 1, 0, b'x', b'y']);
    }

    #[test]
    fn messages_split_and_merged_come_out_whole() {
        let mut wire = encode(1, REQUEST, b"first").unwrap();
        wire.extend(encode(3, RESPONSE, b"").unwrap());
        wire.extend(encode(5, REQUEST, &[7; 300]).unwrap());
        let mut r = Reader::default();
        let mut got = Vec::new();
        for chunk in wire.chunks(7) {
            r.push(chunk);
            while let Some(m) = r.next_message().unwrap() {
                got.push(m);
            }
        }
        assert_eq!(got.len(), 3);
        assert_eq!((got[0].stream, got[0].kind), (1, REQUEST));
        assert_eq!(got[0].payload, b"first");
        assert_eq!(
            (got[1].stream, got[1].kind, got[1].payload.len()),
            (3, RESPONSE, 0)
        );
        assert_eq!(got[2].payload, vec![7; 300]);
    }

    #[test]
    fn oversized_message_is_refused() {
        let mut r = Reader::default();
        let mut h = ((MAX_MESSAGE + 1) as u32).to_be_bytes().to_vec();
        h.extend([0, 0, 0, 1, 1, 0]);
        r.push(&h);
        assert_eq!(r.next_message(), Err(TtrpcError::TooLarge(MAX_MESSAGE + 1)));
        assert_eq!(
            encode(1, REQUEST, &vec![0; MAX_MESSAGE + 1]),
            Err(TtrpcError::TooLarge(MAX_MESSAGE + 1))
        );
    }
}
