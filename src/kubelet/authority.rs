//! Old kubelets' `:authority`. Before Kubernetes 1.26 (kubernetes/kubernetes #112597) kubelet
//! dialled a plugin with gRPC-go's default authority, the socket path
//! (`/var/lib/kubelet/device-plugins/x.sock`). h2's server refuses a request whose
//! `:authority` is not a URI authority (a stream reset with PROTOCOL_ERROR, before tonic sees
//! the request; hyperium/h2 #487 was never merged), so such a kubelet could not call the
//! plugin at all. [`Rewrite`] sits between the accepted socket and the server and hands the
//! server the client's bytes with every such `:authority` replaced by `localhost`, what newer
//! kubelets send.
//!
//! The connection's first header block (HEADERS plus its CONTINUATIONs) decides, decoded by
//! an HPACK decoder that mirrors the client's encoder. An `:authority` that is a valid
//! authority (kubelet >= 1.26, every other client) leaves the whole connection to pass byte
//! for byte, that block included, and nothing is decoded again: a gRPC client sends one
//! authority per connection. Otherwise that block and every later one is decoded and encoded
//! again by an HPACK encoder that the server's decoder mirrors; re-encoding all of them keeps
//! each pair of dynamic tables in step by construction: the server never sees an index the
//! client's table gave. Both tables start empty with 4096 bytes, the protocol's default,
//! which h2's server (as tonic builds it) does not change; a client's size update above that
//! is refused here as h2 would refuse it. Re-encoded blocks lose their padding (it carries
//! nothing), keep PRIORITY, and are cut into frames of at most 16384 bytes, the smallest
//! SETTINGS_MAX_FRAME_SIZE a server can have. Frames other than HEADERS and CONTINUATION
//! always pass byte for byte.
//!
//! Ref: RFC 9113 §4.3, §6.2, §6.10 (header blocks); RFC 7541 (HPACK).

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const PREFACE_LEN: usize = 24;
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// HPACK's default dynamic table size (SETTINGS_HEADER_TABLE_SIZE's initial value).
const TABLE_SIZE: usize = 4096;
/// The initial (and smallest allowed) SETTINGS_MAX_FRAME_SIZE.
const MAX_FRAME: usize = 16384;
/// A kubelet's header block is a few hundred bytes; this bounds what one client can make
/// the plugin hold.
const MAX_BLOCK: usize = 64 * 1024;
/// Decoded size (RFC 7541's: name + value + 32 per field) of the longest header list read.
/// One 64 KiB block of one-byte references to a 4 KiB table entry decodes to ~256 MB; a
/// kubelet's list is a few hundred bytes, and h2 bounds its own lists the same way.
const MAX_LIST: usize = 64 * 1024;
/// What an `:authority` that is not an authority becomes.
pub const REPLACEMENT: &[u8] = b"localhost";

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// A header block being gathered: HEADERS seen, END_HEADERS not yet.
struct Block {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
    /// The frames as received (only for the first block, which may pass unchanged).
    raw: Vec<u8>,
}

/// What the connection's first header block decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    First,
    /// A valid authority: every byte from here on passes unchanged.
    Pass,
    Rewrite,
}

/// The client-to-server half of a connection, as a byte transformer.
pub struct Rewriter {
    decoder: Decoder<'static>,
    encoder: Encoder<'static>,
    /// Bytes of the connection preface still to pass.
    preface: usize,
    /// Payload bytes of a passed-through frame still to pass.
    passing: usize,
    block: Option<Block>,
    mode: Mode,
}

impl Default for Rewriter {
    fn default() -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(TABLE_SIZE);
        Rewriter {
            decoder,
            encoder: Encoder::new(),
            preface: PREFACE_LEN,
            passing: 0,
            block: None,
            mode: Mode::First,
        }
    }
}

impl Rewriter {
    /// Takes what it can use from the front of `input` and appends what the server should
    /// read to `out`; an incomplete frame stays in `input` for the next call.
    pub fn feed(&mut self, input: &mut Vec<u8>, out: &mut Vec<u8>) -> io::Result<()> {
        let mut at = 0;
        let result = self.feed_from(input, &mut at, out);
        input.drain(..at);
        result
    }

    fn feed_from(&mut self, input: &[u8], at: &mut usize, out: &mut Vec<u8>) -> io::Result<()> {
        loop {
            if self.mode == Mode::Pass {
                out.extend_from_slice(&input[*at..]);
                *at = input.len();
                return Ok(());
            }
            for left in [&mut self.preface, &mut self.passing] {
                let n = (*left).min(input.len() - *at);
                out.extend_from_slice(&input[*at..*at + n]);
                *at += n;
                *left -= n;
                if *left > 0 {
                    return Ok(());
                }
            }
            let rest = &input[*at..];
            if rest.len() < FRAME_HEADER {
                return Ok(());
            }
            let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            let (kind, flags) = (rest[3], rest[4]);
            let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) & 0x7fff_ffff;
            if kind != HEADERS && kind != CONTINUATION {
                if self.block.is_some() {
                    return Err(invalid(format!("frame type {kind} inside a header block")));
                }
                out.extend_from_slice(&rest[..FRAME_HEADER]);
                *at += FRAME_HEADER;
                self.passing = len;
                continue;
            }
            let held = self.block.as_ref().map_or(0, |b| b.fragment.len());
            if held + len > MAX_BLOCK {
                return Err(invalid(format!("header block over {MAX_BLOCK} bytes")));
            }
            if rest.len() < FRAME_HEADER + len {
                return Ok(());
            }
            let payload = &rest[FRAME_HEADER..FRAME_HEADER + len];
            let raw = &rest[..FRAME_HEADER + len];
            let keep_raw = self.mode == Mode::First;
            *at += FRAME_HEADER + len;
            match (kind, &mut self.block) {
                (HEADERS, None) => {
                    let (fragment, priority) = headers_payload(payload, flags)?;
                    self.block = Some(Block {
                        stream,
                        end_stream: flags & END_STREAM != 0,
                        priority,
                        fragment: fragment.to_vec(),
                        raw: if keep_raw { raw.to_vec() } else { Vec::new() },
                    });
                }
                (CONTINUATION, Some(b)) if b.stream == stream => {
                    b.fragment.extend_from_slice(payload);
                    if keep_raw {
                        b.raw.extend_from_slice(raw);
                    }
                }
                _ => {
                    return Err(invalid(format!(
                        "frame type {kind} on stream {stream} out of order"
                    )))
                }
            }
            if flags & END_HEADERS != 0 {
                if let Some(b) = self.block.take() {
                    self.emit(b, out)?;
                }
            }
        }
    }

    fn emit(&mut self, b: Block, out: &mut Vec<u8>) -> io::Result<()> {
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut size = 0usize;
        // Past the bound nothing more is copied: the decoder still walks the block (its
        // table must stay in step), which costs the block's length, not its expansion.
        let decoded = self.decoder.decode_with_cb(&b.fragment, |n, v| {
            size = size.saturating_add(n.len() + v.len() + 32);
            if size <= MAX_LIST {
                fields.push((n.into_owned(), v.into_owned()))
            }
        });
        if size > MAX_LIST {
            return Err(invalid(format!(
                "header list over {MAX_LIST} bytes once decoded"
            )));
        }
        let bad = |(name, value): &(Vec<u8>, Vec<u8>)| {
            name == b":authority"
                && tonic::codegen::http::uri::Authority::try_from(&value[..]).is_err()
        };
        if self.mode == Mode::First {
            // A block this decoder cannot read passes too: h2 gives the client its error.
            if decoded.is_err() || !fields.iter().any(bad) {
                self.mode = Mode::Pass;
                out.extend_from_slice(&b.raw);
                return Ok(());
            }
            self.mode = Mode::Rewrite;
        }
        decoded.map_err(|e| invalid(format!("HPACK: {e:?}")))?;
        for field in &mut fields {
            if bad(field) {
                field.1 = REPLACEMENT.to_vec();
            }
        }
        let block = self
            .encoder
            .encode(fields.iter().map(|(n, v)| (&n[..], &v[..])));
        let head = b.priority.as_ref().map_or(&[][..], |p| &p[..]);
        let first = block.len().min(MAX_FRAME - head.len());
        let mut flags = if b.end_stream { END_STREAM } else { 0 };
        if b.priority.is_some() {
            flags |= PRIORITY;
        }
        let mut chunks = std::iter::once(&block[..first]).chain(block[first..].chunks(MAX_FRAME));
        let mut kind = HEADERS;
        let mut prefix = head;
        let mut next = chunks.next();
        while let Some(chunk) = next {
            next = chunks.next();
            if next.is_none() {
                flags |= END_HEADERS;
            }
            let len = prefix.len() + chunk.len();
            out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
            out.extend_from_slice(&[kind, flags]);
            out.extend_from_slice(&b.stream.to_be_bytes());
            out.extend_from_slice(prefix);
            out.extend_from_slice(chunk);
            (kind, flags, prefix) = (CONTINUATION, 0, &[]);
        }
        Ok(())
    }
}

/// A HEADERS payload's block fragment and priority fields, padding removed.
fn headers_payload(payload: &[u8], flags: u8) -> io::Result<(&[u8], Option<[u8; 5]>)> {
    let bad = || invalid("HEADERS frame shorter than its padding and priority".into());
    let mut p = payload;
    let mut pad = 0;
    if flags & PADDED != 0 {
        let (&n, tail) = p.split_first().ok_or_else(bad)?;
        pad = usize::from(n);
        p = tail;
    }
    let mut priority = None;
    if flags & PRIORITY != 0 {
        let (fields, tail) = p.split_first_chunk::<5>().ok_or_else(bad)?;
        priority = Some(*fields);
        p = tail;
    }
    let end = p.len().checked_sub(pad).ok_or_else(bad)?;
    Ok((&p[..end], priority))
}

/// An accepted connection whose client-to-server bytes go through a [`Rewriter`].
pub struct Rewrite<S> {
    inner: S,
    rewriter: Rewriter,
    input: Vec<u8>,
    out: Vec<u8>,
    out_at: usize,
    eof: bool,
}

impl<S> Rewrite<S> {
    pub fn new(inner: S) -> Self {
        Rewrite {
            inner,
            rewriter: Rewriter::default(),
            input: Vec::new(),
            out: Vec::new(),
            out_at: 0,
            eof: false,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewrite<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        loop {
            if me.out_at < me.out.len() {
                let n = buf.remaining().min(me.out.len() - me.out_at);
                buf.put_slice(&me.out[me.out_at..me.out_at + n]);
                me.out_at += n;
                if me.out_at == me.out.len() {
                    me.out.clear();
                    me.out_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if me.eof {
                // The server sees the connection end; an unfinished frame is not passed on.
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut me.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                me.eof = true;
                continue;
            }
            me.input.extend_from_slice(read.filled());
            me.rewriter.feed(&mut me.input, &mut me.out)?;
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewrite<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for Rewrite<S> {
    type ConnectInfo = S::ConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    const SOCKET: &[u8] = b"/var/lib/kubelet/device-plugins/accel-enflame-com-gcu.sock";

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, flags]);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// Splits a server-side byte stream (after the preface) into frames.
    fn frames(mut b: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut out = Vec::new();
        while !b.is_empty() {
            let len = usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]);
            let stream = u32::from_be_bytes([b[5], b[6], b[7], b[8]]);
            out.push((b[3], b[4], stream, b[9..9 + len].to_vec()));
            b = &b[9 + len..];
        }
        out
    }

    /// Header lists the server decodes from `out` (one per header block), checking the
    /// framing rules on the way: frame sizes, CONTINUATION order, END_HEADERS last.
    fn server_sees(out: &[u8]) -> Vec<Vec<(String, String)>> {
        assert_eq!(&out[..24], PREFACE);
        let mut dec = Decoder::new();
        let mut lists = Vec::new();
        let mut block: Option<Vec<u8>> = None;
        for (kind, flags, _, payload) in frames(&out[24..]) {
            assert!(payload.len() <= MAX_FRAME);
            match kind {
                HEADERS => {
                    assert!(block.is_none());
                    assert_eq!(flags & PADDED, 0);
                    let skip = if flags & PRIORITY != 0 { 5 } else { 0 };
                    block = Some(payload[skip..].to_vec());
                }
                CONTINUATION => block.as_mut().unwrap().extend_from_slice(&payload),
                _ => {
                    assert!(block.is_none());
                    continue;
                }
            }
            if flags & END_HEADERS != 0 {
                let list = dec.decode(&block.take().unwrap()).unwrap();
                lists.push(
                    list.into_iter()
                        .map(|(n, v)| {
                            (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap())
                        })
                        .collect(),
                );
            }
        }
        assert!(block.is_none());
        lists
    }

    fn run(input: &[u8]) -> Vec<u8> {
        let mut rw = Rewriter::default();
        let (mut inp, mut out) = (input.to_vec(), Vec::new());
        rw.feed(&mut inp, &mut out).unwrap();
        assert!(inp.is_empty());
        out
    }

    fn authority(list: &[(String, String)]) -> &str {
        &list.iter().find(|(n, _)| n == ":authority").unwrap().1
    }

    fn raw(s: &[u8]) -> Vec<u8> {
        assert!(s.len() < 127);
        let mut v = vec![s.len() as u8];
        v.extend_from_slice(s);
        v
    }

    /// :method POST, :scheme http, :path /v1beta1.DevicePlugin/Allocate (static name 4).
    fn common() -> Vec<u8> {
        let mut b = vec![0x83, 0x86, 0x04];
        b.extend(raw(b"/v1beta1.DevicePlugin/Allocate"));
        b
    }

    /// Huffman code (RFC 7541 Appendix B) of the few symbols the tests use.
    fn huffman(s: &[u8]) -> Vec<u8> {
        let (mut bits, mut n, mut out) = (0u64, 0u32, Vec::new());
        for c in s {
            let (code, len) = match c {
                b'.' => (0x17, 6),
                b'/' => (0x18, 6),
                b'a' => (0x3, 5),
                b'c' => (0x4, 5),
                b'k' => (0x75, 7),
                b'o' => (0x7, 5),
                b's' => (0x8, 5),
                _ => panic!("no code for {c}"),
            };
            bits = bits << len | code;
            n += len;
            while n >= 8 {
                out.push((bits >> (n - 8)) as u8);
                n -= 8;
            }
        }
        if n > 0 {
            out.push((bits << (8 - n)) as u8 | (0xff >> n));
        }
        let mut check = loona_hpack::huffman::HuffmanDecoder::new();
        assert_eq!(check.decode(&out).unwrap(), s);
        let mut v = vec![0x80 | out.len() as u8];
        v.extend(out);
        v
    }

    /// Issue 23, class 3: a small block of references to one large table entry must not
    /// decode into hundreds of megabytes.
    #[test]
    fn amplifying_header_block_is_refused() {
        let big = vec![b'a'; 4000];
        let mut first = common();
        first.push(0x40);
        first.extend(raw(b"x-big"));
        first.extend(loona_hpack::encoder::encode_integer(big.len(), 7));
        first.extend(&big);
        // 15,000 references to it (dynamic index 62): ~60 MB decoded from ~19 KB sent.
        first.extend(std::iter::repeat_n(0xbe, 15_000));
        let mut input = PREFACE.to_vec();
        let mut block = &first[..];
        let mut kind = HEADERS;
        while !block.is_empty() {
            let n = block.len().min(MAX_FRAME);
            let flags = if n == block.len() { END_HEADERS } else { 0 };
            input.extend(frame(kind, flags, 1, &block[..n]));
            block = &block[n..];
            kind = CONTINUATION;
        }
        let mut rw = Rewriter::default();
        let (mut inp, mut out) = (input, Vec::new());
        let e = rw.feed(&mut inp, &mut out).unwrap_err();
        assert_eq!(e.to_string(), "header list over 65536 bytes once decoded");
        assert!(out.len() <= PREFACE_LEN, "nothing of the block passed");
    }

    #[test]
    fn static_name_literal_is_rewritten() {
        // Literal without indexing, name :authority (static 1), raw value.
        let mut block = common();
        block.push(0x01);
        block.extend(raw(SOCKET));
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &block));
        let lists = server_sees(&run(&input));
        assert_eq!(lists.len(), 1);
        assert_eq!(authority(&lists[0]), "localhost");
        assert_eq!(
            lists[0][2],
            (":path".into(), "/v1beta1.DevicePlugin/Allocate".into())
        );
    }

    #[test]
    fn indexed_reference_to_a_rewritten_value() {
        // Incremental indexing puts the socket path at dynamic index 62; the next request
        // names it by index only (0xbe), as gRPC-go's encoder does.
        let mut first = common();
        first.push(0x41);
        first.extend(raw(SOCKET));
        first.push(0x40);
        first.extend(raw(b"te"));
        first.extend(raw(b"trailers"));
        let mut second = common();
        second.extend([0xbf, 0xbe]); // te: trailers (63 after the insert), then :authority
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &first));
        input.extend(frame(0x0, END_STREAM, 1, &[0, 0, 0, 0, 0]));
        input.extend(frame(HEADERS, END_HEADERS, 3, &second));
        let lists = server_sees(&run(&input));
        assert_eq!(lists.len(), 2);
        for l in &lists {
            assert_eq!(authority(l), "localhost");
            assert!(l.contains(&("te".into(), "trailers".into())));
        }
    }

    #[test]
    fn huffman_coded_socket_path_is_rewritten() {
        let mut block = common();
        block.push(0x41);
        block.extend(huffman(b"/a.sock"));
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 1, &block));
        let out = run(&input);
        let f = frames(&out[24..]);
        assert_eq!(f[0].1, END_HEADERS | END_STREAM);
        assert_eq!(authority(&server_sees(&out)[0]), "localhost");
    }

    #[test]
    fn valid_authorities_keep_their_value_across_the_rfc_examples() {
        // RFC 7541 C.4.1-C.4.3: Huffman coding, incremental indexing, indexed references
        // and an eviction-free dynamic table carried across three requests.
        let blocks: [&[u8]; 3] = [
            &[
                0x82, 0x86, 0x84, 0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab,
                0x90, 0xf4, 0xff,
            ],
            &[
                0x82, 0x86, 0x84, 0xbe, 0x58, 0x86, 0xa8, 0xeb, 0x10, 0x64, 0x9c, 0xbf,
            ],
            &[
                0x82, 0x87, 0x85, 0xbf, 0x40, 0x88, 0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xa9, 0x7d, 0x7f,
                0x89, 0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xb8, 0xe8, 0xb4, 0xbf,
            ],
        ];
        let mut input = PREFACE.to_vec();
        let mut client = Decoder::new();
        let mut want = Vec::new();
        for (i, b) in blocks.iter().enumerate() {
            input.extend(frame(HEADERS, END_HEADERS, 1 + 2 * i as u32, b));
            let list = client.decode(b).unwrap();
            want.push(
                list.into_iter()
                    .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
                    .collect::<Vec<_>>(),
            );
        }
        assert_eq!(authority(&want[2]), "www.example.com");
        let out = run(&input);
        assert_eq!(
            out, input,
            "a valid first authority: the connection passes unchanged"
        );
        let mut rw = Rewriter::default();
        let (mut inp, mut bytewise) = (Vec::new(), Vec::new());
        for byte in &input {
            inp.push(*byte);
            rw.feed(&mut inp, &mut bytewise).unwrap();
        }
        assert_eq!(bytewise, input);
        assert_eq!(server_sees(&out), want);
    }

    #[test]
    fn rewriting_goes_on_after_a_valid_authority_in_rewrite_mode() {
        // Once the first block was rewritten, later blocks are decoded and encoded again
        // whatever they carry (the tables stay paired): a valid authority keeps its value.
        let mut first = common();
        first.push(0x41);
        first.extend(raw(SOCKET));
        let mut second = common();
        second.push(0x01);
        second.extend(raw(b"localhost:1234"));
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &first));
        input.extend(frame(HEADERS, END_HEADERS, 3, &second));
        let lists = server_sees(&run(&input));
        assert_eq!(authority(&lists[0]), "localhost");
        assert_eq!(authority(&lists[1]), "localhost:1234");
    }

    #[test]
    fn split_reads_padding_priority_and_continuation() {
        // A padded HEADERS with priority fields, its block cut in two by a CONTINUATION, a
        // DATA frame, then a second request: fed one byte at a time, the server sees the
        // same as when it comes in one piece.
        let mut block = common();
        block.push(0x41);
        block.extend(raw(SOCKET));
        let (a, b) = block.split_at(10);
        let mut payload = vec![3]; // pad length
        payload.extend([0x80, 0, 0, 0, 16]); // exclusive dependency on stream 0, weight 17
        payload.extend(a);
        payload.extend([0, 0, 0]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, PADDED | PRIORITY, 1, &payload));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, b));
        input.extend(frame(0x0, END_STREAM, 1, &[0, 0, 0, 0, 0]));
        let mut second = common();
        second.push(0xbe);
        input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 3, &second));

        let whole = run(&input);
        let mut rw = Rewriter::default();
        let (mut inp, mut bytewise) = (Vec::new(), Vec::new());
        for byte in &input {
            inp.push(*byte);
            rw.feed(&mut inp, &mut bytewise).unwrap();
        }
        assert!(inp.is_empty());
        assert_eq!(bytewise, whole);

        let f = frames(&whole[24..]);
        assert_eq!(f.len(), 3);
        assert_eq!((f[0].0, f[0].1), (HEADERS, PRIORITY | END_HEADERS));
        assert_eq!(&f[0].3[..5], &[0x80, 0, 0, 0, 16]);
        assert_eq!(f[1], (0x0, END_STREAM, 1, vec![0, 0, 0, 0, 0]));
        assert_eq!((f[2].1, f[2].2), (END_HEADERS | END_STREAM, 3));
        let lists = server_sees(&whole);
        assert_eq!(authority(&lists[0]), "localhost");
        assert_eq!(authority(&lists[1]), "localhost");
    }

    #[test]
    fn a_block_longer_than_a_frame_is_cut_into_continuations() {
        // A 20000-byte value, sent Huffman-free; the re-encoded block needs two frames.
        let value = vec![b'v'; 20000];
        let mut block = common();
        block.push(0x01);
        block.extend(raw(SOCKET));
        block.push(0x00);
        block.extend(raw(b"x-big"));
        let mut len = loona_hpack::encoder::encode_integer(value.len(), 7);
        block.append(&mut len);
        block.extend(&value);
        let (a, b) = block.split_at(16000);
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            HEADERS,
            PRIORITY,
            1,
            &[&[0, 0, 0, 1, 200][..], a].concat(),
        ));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, b));
        let out = run(&input);
        let f = frames(&out[24..]);
        assert_eq!(f.len(), 2);
        assert_eq!(
            (f[0].0, f[0].1, f[0].3.len()),
            (HEADERS, PRIORITY, MAX_FRAME)
        );
        assert_eq!((f[1].0, f[1].1), (CONTINUATION, END_HEADERS));
        let list = &server_sees(&out)[0];
        assert_eq!(authority(list), "localhost");
        assert_eq!(list.last().unwrap().1.len(), 20000);
    }

    #[test]
    fn frames_out_of_order_are_refused() {
        let mut rw = Rewriter::default();
        let mut input = PREFACE.to_vec();
        input.extend(frame(CONTINUATION, END_HEADERS, 1, &[0x82]));
        assert!(rw.feed(&mut input, &mut Vec::new()).is_err());

        let mut rw = Rewriter::default();
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, 0, 1, &[0x82]));
        input.extend(frame(0x0, 0, 1, &[]));
        assert!(rw.feed(&mut input, &mut Vec::new()).is_err());

        // A dynamic table larger than the server allows: as the first block it passes
        // unchanged (h2 refuses it), after a rewritten block it ends the connection here.
        let oversized = frame(HEADERS, END_HEADERS, 3, &[0x3f, 0xe1, 0x3f, 0x82]);
        let mut input = PREFACE.to_vec();
        input.extend(&oversized);
        assert_eq!(run(&input), input);
        let mut first = common();
        first.push(0x01);
        first.extend(raw(SOCKET));
        let mut rw = Rewriter::default();
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &first));
        input.extend(&oversized);
        assert!(rw.feed(&mut input, &mut Vec::new()).is_err());
    }
}
