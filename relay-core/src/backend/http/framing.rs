//! HTTP/1.1 framing for the worker's own backend client: the request head written, the response
//! head parsed, where the response body ends (RFC 9112 §6.3) and the chunked transfer coding
//! decoded.
//!
//! Plain functions over byte slices, with no I/O, so that the fuzzer can drive them with any
//! bytes a backend might send (`tests/fuzz`). Everything a backend says is bounded: the head's
//! size and header count, a chunk-size line, the trailers.

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

/// A response head larger than this is refused (hyper's default limit for a client is ~400 KB;
/// model servers send a few hundred bytes).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// More response headers than this are refused.
pub const MAX_HEADERS: usize = 128;

/// Trailer bytes after the last chunk beyond this are refused.
const MAX_TRAILER_BYTES: usize = 16 * 1024;

/// Hex digits in a chunk size beyond this are refused (16 fill a u64).
const MAX_SIZE_DIGITS: usize = 16;

/// Chunk extension bytes (`;name=value` after the size) beyond this are refused.
const MAX_EXTENSION_BYTES: usize = 4 * 1024;

/// What the backend sent that is not HTTP/1.1 as this client reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FramingError(pub String);

impl std::fmt::Display for FramingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for FramingError {}

fn error(message: impl Into<String>) -> FramingError {
    FramingError(message.into())
}

/// A header of the request that this client writes itself, or that only a connection may name:
/// never copied from the caller's headers.
pub fn written_by_client(name: &str) -> bool {
    name.eq_ignore_ascii_case("content-length")
        || name.eq_ignore_ascii_case("host")
        || name.eq_ignore_ascii_case("connection")
        || name.eq_ignore_ascii_case("transfer-encoding")
        || name.eq_ignore_ascii_case("keep-alive")
        || name.eq_ignore_ascii_case("upgrade")
        || name.eq_ignore_ascii_case("te")
}

/// The request: a POST of `body` to `target` (path and query) on `authority` (`host:port`), with
/// `headers`, as one buffer for one write.
///
/// Header names and values are checked as `http`'s types check them (a name is a token, a value
/// holds no CR, LF or NUL): a header that would end the head early and start another
/// (request smuggling through a client's header) is refused, not written.
pub fn post_request<'a>(
    authority: &str,
    target: &str,
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    body: &[u8],
) -> Result<Vec<u8>, FramingError> {
    if target.bytes().any(|b| b <= b' ' || b == 0x7f) || !target.starts_with('/') {
        return Err(error(format!("the request path {target:?} cannot be sent")));
    }
    let mut head = Vec::with_capacity(256 + body.len());
    head.extend_from_slice(b"POST ");
    head.extend_from_slice(target.as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    head.extend_from_slice(authority.as_bytes());
    head.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        if written_by_client(name) {
            continue;
        }
        HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| error(format!("the header name {name:?} is not valid HTTP")))?;
        HeaderValue::from_str(value)
            .map_err(|_| error(format!("the value of header {name:?} is not valid HTTP")))?;
        head.extend_from_slice(name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
    head.extend_from_slice(body);
    Ok(head)
}

/// A response head.
#[derive(Debug)]
pub struct ResponseHead {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// How many bytes of the input the head took.
    pub len: usize,
    /// Whether the connection may carry another request after this answer (HTTP/1.1 without
    /// `connection: close`).
    pub keep_alive: bool,
}

/// Parses a response head from the start of `input`: `Ok(None)` while it is incomplete.
pub fn parse_head(input: &[u8]) -> Result<Option<ResponseHead>, FramingError> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut slots);
    let len = match response.parse(input) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if input.len() < MAX_HEAD_BYTES => return Ok(None),
        Ok(httparse::Status::Partial) => {
            return Err(error(format!(
                "the backend's response head is longer than {MAX_HEAD_BYTES} bytes"
            )))
        }
        Err(httparse::Error::TooManyHeaders) => {
            return Err(error(format!(
                "the backend's response has more than {MAX_HEADERS} headers"
            )))
        }
        Err(why) => {
            return Err(error(format!(
                "the backend's answer is not an HTTP/1.1 response ({why})"
            )))
        }
    };
    if len > MAX_HEAD_BYTES {
        return Err(error(format!(
            "the backend's response head is longer than {MAX_HEAD_BYTES} bytes"
        )));
    }
    let code = response.code.unwrap_or_default();
    let status = StatusCode::from_u16(code)
        .map_err(|_| error(format!("the backend answered with status {code}")))?;
    let mut headers = HeaderMap::with_capacity(response.headers.len());
    for header in response.headers.iter() {
        let name = HeaderName::from_bytes(header.name.as_bytes()).map_err(|_| {
            error(format!(
                "the backend sent a bad header name {:?}",
                header.name
            ))
        })?;
        let value = HeaderValue::from_bytes(header.value)
            .map_err(|_| error(format!("the backend sent a bad value for {name}")))?;
        headers.append(name, value);
    }
    let closes = headers
        .get_all("connection")
        .iter()
        .any(|value| has_token(value.as_bytes(), "close"));
    Ok(Some(ResponseHead {
        status,
        keep_alive: response.version == Some(1) && !closes,
        headers,
        len,
    }))
}

/// Whether the comma-separated header `value` names `token`.
fn has_token(value: &[u8], token: &str) -> bool {
    value
        .split(|&b| b == b',')
        .any(|part| part.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// Where a response body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLength {
    /// No body (1xx, 204, 304, or `content-length: 0`).
    Empty,
    /// Exactly this many bytes.
    Exact(u64),
    /// The chunked transfer coding.
    Chunked,
    /// Up to the end of the connection (which then cannot carry another request).
    UntilClose,
}

/// Where the body after `head` ends (RFC 9112 §6.3, for an answer to a POST).
pub fn body_length(head: &ResponseHead) -> Result<BodyLength, FramingError> {
    let status = head.status.as_u16();
    if (100..200).contains(&status) || status == 204 || status == 304 {
        return Ok(BodyLength::Empty);
    }
    let codings = head.headers.get_all("transfer-encoding");
    if codings.iter().next().is_some() {
        // The last coding decides: chunked is read; anything else runs until the close.
        let last = codings
            .iter()
            .flat_map(|value| value.as_bytes().split(|&b| b == b','))
            .map(<[u8]>::trim_ascii)
            .rfind(|coding| !coding.is_empty());
        return Ok(match last {
            Some(coding) if coding.eq_ignore_ascii_case(b"chunked") => BodyLength::Chunked,
            _ => BodyLength::UntilClose,
        });
    }
    let mut length: Option<u64> = None;
    for value in head.headers.get_all("content-length") {
        for part in value.as_bytes().split(|&b| b == b',') {
            let part = part.trim_ascii();
            let parsed = std::str::from_utf8(part)
                .ok()
                .filter(|text| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|text| text.parse::<u64>().ok())
                .ok_or_else(|| error("the backend sent an invalid content-length"))?;
            if length.is_some_and(|seen| seen != parsed) {
                return Err(error("the backend sent two different content-lengths"));
            }
            length = Some(parsed);
        }
    }
    Ok(match length {
        Some(0) => BodyLength::Empty,
        Some(n) => BodyLength::Exact(n),
        None => BodyLength::UntilClose,
    })
}

/// Decodes the chunked transfer coding as its bytes arrive, in pieces of any size.
#[derive(Debug, Clone, Default)]
pub struct ChunkedDecoder {
    state: Chunked,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Chunked {
    /// Reading a chunk size's hex digits.
    #[default]
    SizeStart,
    Size {
        value: u64,
        digits: usize,
    },
    /// Past the size: whitespace or an extension, up to the CR.
    SizeRest {
        value: u64,
        extension: usize,
    },
    SizeLf {
        value: u64,
    },
    Data {
        remaining: u64,
    },
    DataCr,
    DataLf,
    /// At the start of a trailer line (or of the empty line that ends the body).
    TrailerStart {
        seen: usize,
    },
    TrailerLine {
        seen: usize,
    },
    EndLf,
    Done,
}

impl ChunkedDecoder {
    /// Decodes what it can of `input`, appending chunk data to `out`: the bytes of `input` it
    /// took (all of them unless the body ended within `input`).
    pub fn decode(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, FramingError> {
        let mut at = 0;
        while at < input.len() && self.state != Chunked::Done {
            if let Chunked::Data { remaining } = self.state {
                let take = (input.len() - at).min(usize::try_from(remaining).unwrap_or(usize::MAX));
                out.extend_from_slice(&input[at..at + take]);
                at += take;
                let remaining = remaining - take as u64;
                self.state = if remaining == 0 {
                    Chunked::DataCr
                } else {
                    Chunked::Data { remaining }
                };
                continue;
            }
            self.state = self.step(input[at])?;
            at += 1;
        }
        Ok(at)
    }

    /// Whether the last chunk and the trailers have been read.
    pub fn is_done(&self) -> bool {
        self.state == Chunked::Done
    }

    fn step(&self, byte: u8) -> Result<Chunked, FramingError> {
        let bad = |what: &str| {
            Err(error(format!(
                "the backend's chunked body is malformed: {what}"
            )))
        };
        Ok(match self.state {
            Chunked::SizeStart => match hex(byte) {
                Some(digit) => Chunked::Size {
                    value: digit,
                    digits: 1,
                },
                None => return bad("a chunk size has no digits"),
            },
            Chunked::Size { value, digits } => match hex(byte) {
                Some(_) if digits >= MAX_SIZE_DIGITS => return bad("a chunk size is too large"),
                Some(digit) => Chunked::Size {
                    value: value << 4 | digit,
                    digits: digits + 1,
                },
                None => return Self::after_size(value, 0, byte),
            },
            Chunked::SizeRest { value, extension } => {
                if extension >= MAX_EXTENSION_BYTES {
                    return bad("a chunk extension is too long");
                }
                return Self::after_size(value, extension + 1, byte);
            }
            Chunked::SizeLf { value } => match byte {
                b'\n' if value == 0 => Chunked::TrailerStart { seen: 0 },
                b'\n' => Chunked::Data { remaining: value },
                _ => return bad("a chunk size line does not end in CRLF"),
            },
            Chunked::DataCr => match byte {
                b'\r' => Chunked::DataLf,
                _ => return bad("a chunk is longer than its size"),
            },
            Chunked::DataLf => match byte {
                b'\n' => Chunked::SizeStart,
                _ => return bad("a chunk does not end in CRLF"),
            },
            Chunked::TrailerStart { seen } => match byte {
                b'\r' => Chunked::EndLf,
                _ => Self::trailer_byte(seen, byte)?,
            },
            Chunked::TrailerLine { seen } => Self::trailer_byte(seen, byte)?,
            Chunked::EndLf => match byte {
                b'\n' => Chunked::Done,
                _ => return bad("the body does not end in CRLF"),
            },
            Chunked::Data { .. } | Chunked::Done => unreachable!("handled by decode"),
        })
    }

    /// After a chunk size's digits (`extension` bytes of whitespace or extension so far).
    fn after_size(value: u64, extension: usize, byte: u8) -> Result<Chunked, FramingError> {
        match byte {
            b'\r' => Ok(Chunked::SizeLf { value }),
            b'\n' => Err(error(
                "the backend's chunked body is malformed: a bare LF ends a chunk size",
            )),
            b';' | b' ' | b'\t' => Ok(Chunked::SizeRest { value, extension }),
            _ if extension > 0 && byte >= b' ' && byte != 0x7f => {
                Ok(Chunked::SizeRest { value, extension })
            }
            _ => Err(error(
                "the backend's chunked body is malformed: a chunk size is not hex",
            )),
        }
    }

    /// A byte of a trailer line (after the first of the line).
    fn trailer_byte(seen: usize, byte: u8) -> Result<Chunked, FramingError> {
        if seen >= MAX_TRAILER_BYTES {
            return Err(error("the backend's trailers are too long"));
        }
        Ok(match byte {
            b'\n' => Chunked::TrailerStart { seen: seen + 1 },
            _ => Chunked::TrailerLine { seen: seen + 1 },
        })
    }
}

fn hex(byte: u8) -> Option<u64> {
    (byte as char).to_digit(16).map(u64::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> ResponseHead {
        parse_head(text.as_bytes()).unwrap().unwrap()
    }

    fn decode_in_pieces(
        input: &[u8],
        piece: usize,
    ) -> Result<(Vec<u8>, usize, bool), FramingError> {
        let mut decoder = ChunkedDecoder::default();
        let (mut out, mut taken) = (Vec::new(), 0);
        for part in input.chunks(piece) {
            let took = decoder.decode(part, &mut out)?;
            taken += took;
            if took < part.len() {
                break;
            }
        }
        Ok((out, taken, decoder.is_done()))
    }

    #[test]
    fn a_request_head_names_the_host_and_length_and_keeps_the_callers_headers() {
        let request = post_request(
            "127.0.0.1:8080",
            "/v1/chat/completions?x=1",
            [
                ("content-type", "application/json"),
                ("Host", "evil"),
                ("content-length", "1"),
            ],
            b"{}",
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(request).unwrap(),
            "POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: 127.0.0.1:8080\r\n\
             content-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
        );
    }

    #[test]
    fn a_header_that_would_start_another_header_or_request_is_refused() {
        for (name, value) in [
            ("x-a", "1\r\nx-injected: 1"),
            ("x-a", "1\nGET / HTTP/1.1"),
            ("x-a", "nul\0"),
            ("x-a\r\nx-b", "1"),
            ("x a", "1"),
            ("", "1"),
        ] {
            assert!(
                post_request("h:1", "/", [(name, value)], b"").is_err(),
                "{name:?}: {value:?}"
            );
        }
        for target in ["/a b", "/a\r\nx: 1", "no-slash", ""] {
            assert!(post_request("h:1", target, [], b"").is_err(), "{target:?}");
        }
    }

    #[test]
    fn a_head_arriving_in_pieces_is_incomplete_until_its_empty_line() {
        let text = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\nbody";
        for end in 0..text.len() - 4 {
            assert!(
                parse_head(&text.as_bytes()[..end]).unwrap().is_none(),
                "{end}"
            );
        }
        let parsed = head(text);
        assert_eq!(parsed.len, text.len() - 4);
        assert_eq!(parsed.status, StatusCode::OK);
        assert_eq!(parsed.headers["content-type"], "text/event-stream");
        assert!(parsed.keep_alive);
    }

    #[test]
    fn a_closing_or_http_1_0_answer_is_not_kept_alive() {
        assert!(!head("HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\n\r\n").keep_alive);
        assert!(!head("HTTP/1.0 200 OK\r\n\r\n").keep_alive);
    }

    #[test]
    fn heads_that_are_not_http_too_long_or_with_too_many_headers_are_refused() {
        assert!(parse_head(b"\x00\x13\xffGARBAGE not http\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 999 Nine\r\n\r\n").is_ok());
        assert!(parse_head(b"HTTP/1.1 1000 Big\r\n\r\n").is_err());
        let long = format!("HTTP/1.1 200 OK\r\nx: {}", "a".repeat(MAX_HEAD_BYTES));
        assert!(parse_head(long.as_bytes()).is_err());
        let many: String = (0..=MAX_HEADERS).map(|i| format!("x-{i}: 1\r\n")).collect();
        assert!(parse_head(format!("HTTP/1.1 200 OK\r\n{many}\r\n").as_bytes()).is_err());
    }

    #[test]
    fn the_body_length_follows_rfc_9112() {
        let length = |text: &str| body_length(&head(text));
        assert_eq!(
            length("HTTP/1.1 204 No\r\ncontent-length: 5\r\n\r\n"),
            Ok(BodyLength::Empty)
        );
        assert_eq!(
            length("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"),
            Ok(BodyLength::Empty)
        );
        assert_eq!(
            length("HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\n"),
            Ok(BodyLength::Exact(12))
        );
        assert_eq!(
            length("HTTP/1.1 200 OK\r\ncontent-length: 12, 12\r\n\r\n"),
            Ok(BodyLength::Exact(12))
        );
        assert_eq!(
            length(
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\ncontent-length: 3\r\n\r\n"
            ),
            Ok(BodyLength::Chunked)
        );
        assert_eq!(
            length("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip\r\n\r\n"),
            Ok(BodyLength::UntilClose)
        );
        assert_eq!(
            length("HTTP/1.1 200 OK\r\n\r\n"),
            Ok(BodyLength::UntilClose)
        );
        for bad in ["12, 13", "-1", "+1", "1e3", "", "99999999999999999999999"] {
            assert!(
                length(&format!("HTTP/1.1 200 OK\r\ncontent-length: {bad}\r\n\r\n")).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_chunked_body_decodes_the_same_in_pieces_of_every_size() {
        let body = b"5\r\nhello\r\n7;name=\"v\"\r\n, world\r\n0\r\nx-trailer: 1\r\n\r\nNEXT";
        for piece in 1..body.len() {
            let (out, taken, done) = decode_in_pieces(body, piece).unwrap();
            assert_eq!(out, b"hello, world", "pieces of {piece}");
            assert_eq!(taken, body.len() - 4, "the bytes after the body are left");
            assert!(done);
        }
    }

    #[test]
    fn malformed_chunked_bodies_are_refused() {
        for bad in [
            &b"x\r\n"[..],
            b"\r\n",
            b"5\r\nhelloX",
            b"5\r\nhello\rX",
            b"5\nhello\r\n",
            b"11111111111111111\r\n",
            b"5 z\x01\r\n",
            b"0\r\n\r\r",
        ] {
            assert!(
                decode_in_pieces(bad, 3).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long_trailer = [b"0\r\n".as_slice(), &[b'a'; MAX_TRAILER_BYTES + 1]].concat();
        assert!(decode_in_pieces(&long_trailer, 1000).is_err());
        let long_extension = [b"1;".as_slice(), &[b'a'; MAX_EXTENSION_BYTES + 1]].concat();
        assert!(decode_in_pieces(&long_extension, 1000).is_err());
    }

    #[test]
    fn the_largest_chunk_size_is_read_without_overflow() {
        let mut decoder = ChunkedDecoder::default();
        let mut out = Vec::new();
        decoder.decode(b"ffffffffffffffff\r\nab", &mut out).unwrap();
        assert_eq!(out, b"ab");
        assert!(!decoder.is_done());
    }
}
