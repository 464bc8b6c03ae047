//! NRI's connection multiplexing (pkg/net/multiplex): the plugin's one unix socket carries
//! two logical connections, the runtime calling the plugin's service on one and the plugin
//! calling the runtime's on the other. Each write is a frame: the connection's id (u32,
//! big-endian), the payload's length (u32, big-endian), the payload. A logical connection is
//! a byte stream: one ttrpc message may span frames and one frame may hold several.
//! Frames for an id nobody opened are dropped, as NRI's own reader drops them.
//!
//! Pure: [`encode`] writes frames into a buffer, [`Demux`] takes bytes as they are read and
//! hands out whole frames; the socket is the session's (src/nri/session.rs).

/// The connection on which the plugin serves `Plugin` (the runtime is the client).
pub const PLUGIN_SERVICE_CONN: u32 = 1;
/// The connection on which the runtime serves `Runtime` (the plugin is the client).
pub const RUNTIME_SERVICE_CONN: u32 = 2;
/// Connection id, then payload length.
pub const HEADER_LEN: usize = 8;
/// The largest payload of one frame: a ttrpc header and ttrpc's largest message, as NRI
/// splits writes.
pub const MAX_PAYLOAD: usize = super::ttrpc::HEADER_LEN + super::ttrpc::MAX_MESSAGE;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MuxError {
    #[error("NRI frame for connection {conn} of {len} bytes is larger than {MAX_PAYLOAD}")]
    TooLarge { conn: u32, len: usize },
    #[error("NRI connection closed in the middle of a frame ({0} bytes left unread)")]
    Truncated(usize),
}

/// Appends `payload` to `out` as frames of connection `conn`, split where longer than
/// [`MAX_PAYLOAD`] (nothing for an empty payload; a ttrpc message never is).
pub fn encode(conn: u32, payload: &[u8], out: &mut Vec<u8>) {
    for chunk in payload.chunks(MAX_PAYLOAD) {
        out.extend_from_slice(&conn.to_be_bytes());
        // A chunk is at most MAX_PAYLOAD, far below u32::MAX.
        out.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
        out.extend_from_slice(chunk);
    }
}

/// Bytes read from the socket, cut into frames.
#[derive(Debug, Default)]
pub struct Demux {
    buf: Vec<u8>,
    /// Start of the first byte not yet handed out.
    at: usize,
}

impl Demux {
    pub fn push(&mut self, bytes: &[u8]) {
        if self.at == self.buf.len() {
            self.buf.clear();
            self.at = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame (connection id, payload), or `None` until more bytes come.
    pub fn next_frame(&mut self) -> Result<Option<(u32, Vec<u8>)>, MuxError> {
        let rest = &self.buf[self.at..];
        let Some(header) = rest.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let conn = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
        let len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
        if len > MAX_PAYLOAD {
            return Err(MuxError::TooLarge { conn, len });
        }
        let Some(payload) = rest.get(HEADER_LEN..HEADER_LEN + len) else {
            return Ok(None);
        };
        let payload = payload.to_vec();
        self.at += HEADER_LEN + len;
        if self.at > 64 * 1024 && self.at * 2 > self.buf.len() {
            self.buf.drain(..self.at);
            self.at = 0;
        }
        Ok(Some((conn, payload)))
    }

    /// At the end of the stream: an error when a frame was left half read.
    pub fn finish(&self) -> Result<(), MuxError> {
        match self.buf.len() - self.at {
            0 => Ok(()),
            n => Err(MuxError::Truncated(n)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(d: &mut Demux) -> Vec<(u32, Vec<u8>)> {
        std::iter::from_fn(|| d.next_frame().unwrap()).collect()
    }

    #[test]
    fn header_is_id_then_length_big_endian() {
        let mut out = Vec::new();
        encode(RUNTIME_SERVICE_CONN, b"abc", &mut out);
        assert_eq!(out, [0, 0, 0, 2, 0, 0, 0, 3, b'a', b'b', b'c']);
    }

    #[test]
    fn frames_split_across_reads_come_out_whole() {
        let mut wire = Vec::new();
        encode(PLUGIN_SERVICE_CONN, b"hello", &mut wire);
        encode(RUNTIME_SERVICE_CONN, b"world!", &mut wire);
        let mut d = Demux::default();
        let mut got = Vec::new();
        // One byte at a time: every split point of both headers and payloads.
        for b in &wire {
            d.push(std::slice::from_ref(b));
            got.extend(frames(&mut d));
        }
        assert_eq!(
            got,
            vec![
                (PLUGIN_SERVICE_CONN, b"hello".to_vec()),
                (RUNTIME_SERVICE_CONN, b"world!".to_vec())
            ]
        );
        assert_eq!(d.finish(), Ok(()));
    }

    #[test]
    fn frames_merged_in_one_read_come_out_one_by_one() {
        let mut wire = Vec::new();
        for i in 0..3u8 {
            encode(PLUGIN_SERVICE_CONN, &[i; 4], &mut wire);
        }
        encode(7, b"?", &mut wire);
        let mut d = Demux::default();
        d.push(&wire);
        let got = frames(&mut d);
        assert_eq!(got.len(), 4);
        assert_eq!(got[2], (PLUGIN_SERVICE_CONN, vec![2; 4]));
        // An id nobody opened still parses as a frame; the session drops it.
        assert_eq!(got[3], (7, b"?".to_vec()));
    }

    #[test]
    fn nothing_to_write_is_no_frame() {
        // As NRI's writer: a frame is written per chunk of payload, none for an empty one.
        let mut out = Vec::new();
        encode(PLUGIN_SERVICE_CONN, b"", &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn eof_inside_a_frame_is_an_error() {
        let mut wire = Vec::new();
        encode(PLUGIN_SERVICE_CONN, b"hello", &mut wire);
        let mut d = Demux::default();
        d.push(&wire[..wire.len() - 2]);
        assert_eq!(d.next_frame(), Ok(None));
        assert_eq!(d.finish(), Err(MuxError::Truncated(11)));
        let mut d = Demux::default();
        d.push(&wire[..3]);
        assert_eq!(d.finish(), Err(MuxError::Truncated(3)));
    }

    #[test]
    fn oversized_frame_is_refused_not_buffered() {
        let mut wire = vec![0, 0, 0, 1];
        wire.extend_from_slice(&u32::MAX.to_be_bytes());
        let mut d = Demux::default();
        d.push(&wire);
        assert!(matches!(
            d.next_frame(),
            Err(MuxError::TooLarge { conn: 1, .. })
        ));
    }

    #[test]
    fn long_payload_is_split_at_the_frame_limit() {
        let payload = vec![9u8; MAX_PAYLOAD + 5];
        let mut wire = Vec::new();
        encode(PLUGIN_SERVICE_CONN, &payload, &mut wire);
        let mut d = Demux::default();
        d.push(&wire);
        let got = frames(&mut d);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].1.len(), MAX_PAYLOAD);
        assert_eq!(got[1].1.len(), 5);
    }
}
