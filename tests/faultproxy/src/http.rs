//! Just enough HTTP/1.1 framing to find where each request and response ends on
//! a keep-alive connection: heads up to the blank line, bodies by
//! Content-Length, chunked coding or connection close. Bytes are passed on as
//! they came (framing included); nothing is rewritten.

use std::io;

use tokio::io::AsyncReadExt;
use tokio::net::tcp::OwnedReadHalf;

/// Largest request or response head accepted; a longer one is not HTTP we expect.
pub const HEAD_BYTES_MAX: usize = 64 * 1024;
/// Bytes asked of the socket per read (and so the largest piece forwarded).
pub const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Longest chunk-size or trailer line accepted in a chunked body.
const CHUNK_LINE_BYTES_MAX: usize = 4096;

/// A socket's read half with a buffer, read by framing rules.
pub struct Inbound {
    socket: OwnedReadHalf,
    buf: Vec<u8>,
    pos: usize,
}

/// What a parsed head says about the message that follows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The head's bytes, blank line included, as received.
    pub raw: Vec<u8>,
    /// Request method (requests) or empty (responses).
    pub method: String,
    /// Status code (responses) or 0 (requests).
    pub status: u16,
    /// How the body that follows is delimited.
    pub body: Body,
    /// `Connection: close` was sent.
    pub close: bool,
    /// `Expect: 100-continue` was sent (requests).
    pub expect_continue: bool,
}

/// How a body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// No body.
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// Until the sender closes the connection (responses only).
    UntilClose,
}

fn bad(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

impl Inbound {
    /// Wraps a read half.
    pub fn new(socket: OwnedReadHalf) -> Self {
        Inbound {
            socket,
            buf: Vec::with_capacity(READ_CHUNK_BYTES),
            pos: 0,
        }
    }

    /// Bytes buffered and not yet taken.
    fn buffered(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    /// Reads more from the socket; 0 means end of stream. Cancel-safe (a
    /// cancelled read has read nothing).
    pub async fn fill(&mut self) -> io::Result<usize> {
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
        self.buf.reserve(READ_CHUNK_BYTES);
        self.socket.read_buf(&mut self.buf).await
    }

    /// Takes up to `max` buffered bytes, reading first if none are buffered;
    /// an empty result is the end of the stream.
    pub async fn take_some(&mut self, max: usize) -> io::Result<Vec<u8>> {
        if self.buffered().is_empty() {
            // Straight from the socket into the piece: no copy through the buffer
            // (bodies are most of the bytes), and never past `max`, which may be
            // where the next message begins.
            let limit = max.min(READ_CHUNK_BYTES);
            let mut piece = Vec::with_capacity(limit);
            (&mut self.socket)
                .take(limit as u64)
                .read_buf(&mut piece)
                .await?;
            return Ok(piece);
        }
        let n = max.min(self.buffered().len());
        let piece = self.buffered()[..n].to_vec();
        self.pos += n;
        Ok(piece)
    }

    /// Takes one line ending in CRLF (or `\n`), reading as needed.
    async fn take_line(&mut self, max_bytes: usize) -> io::Result<Vec<u8>> {
        loop {
            if let Some(i) = self.buffered().iter().position(|&b| b == b'\n') {
                let line = self.buffered()[..=i].to_vec();
                self.pos += i + 1;
                return Ok(line);
            }
            if self.buffered().len() > max_bytes {
                return Err(bad(format!(
                    "a line longer than {max_bytes} bytes in a chunked body"
                )));
            }
            if self.fill().await? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "stream ended inside a chunked body",
                ));
            }
        }
    }

    /// Reads one head (up to and including the blank line). `None`: the stream
    /// ended cleanly before a new message began.
    pub async fn read_head(&mut self, is_request: bool) -> io::Result<Option<Head>> {
        loop {
            if let Some(end) = find_head_end(self.buffered()) {
                // The head stays buffered when it does not parse, so that a
                // connection falling back to raw forwarding loses nothing.
                let head = parse_head(self.buffered()[..end].to_vec(), is_request)?;
                self.pos += end;
                return Ok(Some(head));
            }
            if self.buffered().len() > HEAD_BYTES_MAX {
                return Err(bad(format!(
                    "no end of HTTP head within {HEAD_BYTES_MAX} bytes"
                )));
            }
            if self.fill().await? == 0 {
                if self.buffered().is_empty() {
                    return Ok(None);
                }
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "stream ended inside an HTTP head",
                ));
            }
        }
    }

    /// Everything still buffered, for a connection that falls back to raw forwarding.
    pub fn take_buffered(&mut self) -> Vec<u8> {
        let rest = self.buffered().to_vec();
        self.pos = self.buf.len();
        rest
    }
}

/// Where the blank line ending a head is, as an offset just past it.
fn find_head_end(bytes: &[u8]) -> Option<usize> {
    bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4)
}

fn parse_head(raw: Vec<u8>, is_request: bool) -> io::Result<Head> {
    let text = String::from_utf8_lossy(&raw).into_owned();
    let mut lines = text.split("\r\n");
    let first = lines.next().unwrap_or_default();
    let mut words = first.split(' ');
    let (method, status) = if is_request {
        let method = words.next().unwrap_or_default();
        let version = first.rsplit(' ').next().unwrap_or_default();
        if method.is_empty()
            || !method.bytes().all(|b| b.is_ascii_uppercase())
            || !version.starts_with("HTTP/1.")
        {
            return Err(bad(format!("not an HTTP/1.x request line: {first:.80?}")));
        }
        (method.to_string(), 0)
    } else {
        let version = words.next().unwrap_or_default();
        let status = words.next().and_then(|s| s.parse::<u16>().ok());
        match status {
            Some(status) if version.starts_with("HTTP/1.") => (String::new(), status),
            _ => return Err(bad(format!("not an HTTP/1.x status line: {first:.80?}"))),
        }
    };
    let mut length = None;
    let mut chunked = false;
    let mut close = false;
    let mut expect_continue = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => {
                let n = value
                    .parse::<u64>()
                    .map_err(|_| bad(format!("Content-Length {value:?} is not a number")))?;
                length = Some(n);
            }
            "transfer-encoding" => {
                chunked = value
                    .rsplit(',')
                    .next()
                    .is_some_and(|c| c.trim().eq_ignore_ascii_case("chunked"))
            }
            "connection" => {
                close |= value
                    .split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("close"))
            }
            "expect" => expect_continue |= value.eq_ignore_ascii_case("100-continue"),
            _ => {}
        }
    }
    let body = match (chunked, length) {
        (true, _) => Body::Chunked,
        (false, Some(0)) => Body::Empty,
        (false, Some(n)) => Body::Length(n),
        (false, None) if is_request => Body::Empty,
        (false, None) => Body::UntilClose,
    };
    Ok(Head {
        raw,
        method,
        status,
        body,
        close,
        expect_continue,
    })
}

/// The body of a response to `request_method` with head `head`, by RFC 9112 6.3:
/// HEAD requests and 1xx, 204 and 304 responses have none.
pub fn response_body(request_method: &str, head: &Head) -> Body {
    if request_method == "HEAD" || head.status < 200 || head.status == 204 || head.status == 304 {
        Body::Empty
    } else {
        head.body
    }
}

/// Reads one body as a sequence of raw pieces (framing bytes included).
pub struct BodyReader {
    state: State,
}

enum State {
    Fixed(u64),
    ChunkSize,
    ChunkData(u64),
    ChunkCrlf,
    Trailers,
    UntilClose,
    Done,
}

impl BodyReader {
    /// A reader of a body delimited as `body`.
    pub fn new(body: Body) -> Self {
        let state = match body {
            Body::Empty => State::Done,
            Body::Length(n) => State::Fixed(n),
            Body::Chunked => State::ChunkSize,
            Body::UntilClose => State::UntilClose,
        };
        BodyReader { state }
    }

    /// The next raw piece of the body, `None` once it has ended.
    pub async fn next_piece(&mut self, inbound: &mut Inbound) -> io::Result<Option<Vec<u8>>> {
        let early_end =
            || io::Error::new(io::ErrorKind::UnexpectedEof, "stream ended inside a body");
        match self.state {
            State::Done => Ok(None),
            State::Fixed(left) | State::ChunkData(left) => {
                let max = usize::try_from(left)
                    .unwrap_or(usize::MAX)
                    .min(READ_CHUNK_BYTES);
                let piece = inbound.take_some(max).await?;
                if piece.is_empty() {
                    return Err(early_end());
                }
                let left = left - piece.len() as u64;
                self.state = match (&self.state, left) {
                    (State::Fixed(_), 0) => State::Done,
                    (State::Fixed(_), n) => State::Fixed(n),
                    (_, 0) => State::ChunkCrlf,
                    (_, n) => State::ChunkData(n),
                };
                Ok(Some(piece))
            }
            State::ChunkSize => {
                let line = inbound.take_line(CHUNK_LINE_BYTES_MAX).await?;
                let text = String::from_utf8_lossy(&line);
                let size_text = text.split(';').next().unwrap_or_default().trim();
                let size = u64::from_str_radix(size_text, 16)
                    .map_err(|_| bad(format!("chunk size {size_text:?} is not hexadecimal")))?;
                self.state = if size == 0 {
                    State::Trailers
                } else {
                    State::ChunkData(size)
                };
                Ok(Some(line))
            }
            State::ChunkCrlf => {
                let line = inbound.take_line(CHUNK_LINE_BYTES_MAX).await?;
                if line != b"\r\n" && line != b"\n" {
                    return Err(bad("chunk data not followed by CRLF".into()));
                }
                self.state = State::ChunkSize;
                Ok(Some(line))
            }
            State::Trailers => {
                let line = inbound.take_line(CHUNK_LINE_BYTES_MAX).await?;
                if line == b"\r\n" || line == b"\n" {
                    self.state = State::Done;
                }
                Ok(Some(line))
            }
            State::UntilClose => {
                let piece = inbound.take_some(READ_CHUNK_BYTES).await?;
                if piece.is_empty() {
                    self.state = State::Done;
                    return Ok(None);
                }
                Ok(Some(piece))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_heads_give_method_and_body_framing() {
        let head = parse_head(
            b"PUT /b/k HTTP/1.1\r\nContent-Length: 12\r\nExpect: 100-continue\r\n\r\n".to_vec(),
            true,
        )
        .unwrap();
        assert_eq!(head.method, "PUT");
        assert_eq!(head.body, Body::Length(12));
        assert!(head.expect_continue);
        let head = parse_head(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), true).unwrap();
        assert_eq!(head.body, Body::Empty);
        let head = parse_head(
            b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n".to_vec(),
            true,
        )
        .unwrap();
        assert_eq!(head.body, Body::Chunked);
    }

    #[test]
    fn response_heads_give_status_and_body_framing() {
        let head = parse_head(
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nConnection: close\r\n\r\n".to_vec(),
            false,
        )
        .unwrap();
        assert_eq!(
            (head.status, head.body, head.close),
            (200, Body::Length(5), true)
        );
        let head = parse_head(b"HTTP/1.0 200 OK\r\n\r\n".to_vec(), false).unwrap();
        assert_eq!(head.body, Body::UntilClose);
        assert_eq!(
            response_body(
                "HEAD",
                &parse_head(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n".to_vec(),
                    false
                )
                .unwrap()
            ),
            Body::Empty
        );
        assert_eq!(
            response_body(
                "GET",
                &parse_head(b"HTTP/1.1 304 Not Modified\r\n\r\n".to_vec(), false).unwrap()
            ),
            Body::Empty
        );
    }

    #[test]
    fn what_is_not_http_is_named() {
        let err = parse_head(b"\x16\x03\x01 hello\r\n\r\n".to_vec(), true).unwrap_err();
        assert!(
            err.to_string().contains("not an HTTP/1.x request line"),
            "{err}"
        );
        let err = parse_head(
            b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n".to_vec(),
            false,
        )
        .unwrap_err();
        assert!(err.to_string().contains("Content-Length \"x\""), "{err}");
    }
}
