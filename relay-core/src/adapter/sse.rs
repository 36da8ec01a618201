//! Server-sent-events framing: reassembling events from text that arrives in arbitrary pieces,
//! and writing events.

use serde_json::Value;

/// Splits an SSE stream into whole lines as its pieces arrive, keeping an unfinished last line
/// for the next piece. The one line reader of the relay: the adapter's event reader and chat
/// passthrough, the worker's usage reading and the proxy's Responses stream patcher all use it.
/// (The proxy's `CompletedWatch` keeps its own: it must skip large events without holding them.)
#[derive(Debug, Default)]
pub struct LineBuffer {
    partial: Vec<u8>,
}

impl LineBuffer {
    /// Adds `piece`; calls `on_line(content, ending)` for each line it completes, in order: the
    /// line without its ending, and the ending (`\n` or `\r\n`). Lines the piece holds whole are
    /// passed without a copy.
    pub fn push_bytes(&mut self, piece: &[u8], mut on_line: impl FnMut(&[u8], &[u8])) {
        let Some(last_newline) = piece.iter().rposition(|b| *b == b'\n') else {
            self.partial.extend_from_slice(piece);
            return;
        };
        let (complete, rest) = piece.split_at(last_newline + 1);
        let mut lines = complete.split_inclusive(|b| *b == b'\n');
        if !self.partial.is_empty() {
            // Only the new text is searched, so a long line arriving in many pieces costs
            // linear time.
            let first = lines.next().expect("`complete` ends with a newline");
            let mut joined = std::mem::take(&mut self.partial);
            joined.extend_from_slice(first);
            emit(&joined, &mut on_line);
        }
        for line in lines {
            emit(line, &mut on_line);
        }
        self.partial.extend_from_slice(rest);
    }

    /// The unfinished last line, if any, when the stream ends (its ending is empty, or a lone
    /// `\r`).
    pub fn finish_bytes(&mut self, mut on_line: impl FnMut(&[u8], &[u8])) {
        let rest = std::mem::take(&mut self.partial);
        if !rest.is_empty() {
            emit(&rest, &mut on_line);
        }
    }

    /// Adds `chunk`; returns the lines it completed, without their endings.
    pub(crate) fn push(&mut self, chunk: &str) -> Vec<String> {
        let mut lines = Vec::new();
        self.push_bytes(chunk.as_bytes(), |line, _| lines.push(text(line)));
        lines
    }

    /// The unfinished last line, if any, when the text ends.
    pub(crate) fn take_rest(&mut self) -> Option<String> {
        let mut rest = None;
        self.finish_bytes(|line, _| rest = Some(text(line)));
        rest.filter(|line| !line.is_empty())
    }
}

/// Passes `line` to `on_line` as its content and its ending.
fn emit(line: &[u8], on_line: &mut impl FnMut(&[u8], &[u8])) {
    let content_len = match line {
        [.., b'\r', b'\n'] => line.len() - 2,
        [.., b'\n'] | [.., b'\r'] => line.len() - 1,
        _ => line.len(),
    };
    let (content, ending) = line.split_at(content_len);
    on_line(content, ending);
}

/// Lines are cut at ASCII newlines, so text stays whole wherever the pieces were cut; invalid
/// UTF-8 from a backend is replaced rather than failing the stream.
fn text(line: &[u8]) -> String {
    String::from_utf8_lossy(line).into_owned()
}

/// The value of a `data:` line (one leading space dropped, as SSE says), or `None` for any other
/// line.
pub fn data_field(line: &str) -> Option<&str> {
    let value = line.strip_prefix("data:")?;
    Some(value.strip_prefix(' ').unwrap_or(value))
}

/// Reassembles SSE events and yields the `data` of each.
#[derive(Debug, Default)]
pub(crate) struct EventReader {
    lines: LineBuffer,
    data: Vec<String>,
}

impl EventReader {
    /// Adds `chunk`; returns the data of every event it completed.
    pub(crate) fn push(&mut self, chunk: &str) -> Vec<String> {
        let mut out = Vec::new();
        for line in self.lines.push(chunk) {
            self.line(&line, &mut out);
        }
        out
    }

    /// The data of an event left unterminated when the text ended.
    pub(crate) fn finish(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(line) = self.lines.take_rest() {
            self.line(&line, &mut out);
        }
        self.dispatch(&mut out);
        out
    }

    fn line(&mut self, line: &str, out: &mut Vec<String>) {
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        let Some(data) = data_field(line) else {
            // `event:`, `id:`, `retry:` and `:` comments carry nothing a chat stream needs.
            return;
        };
        if self.pending_is_whole() {
            // A backend that omits the blank line between events would otherwise glue two JSON
            // documents into one unreadable event.
            self.dispatch(out);
        }
        self.data.push(data.to_string());
    }

    fn pending_is_whole(&self) -> bool {
        match self.data.as_slice() {
            [] => false,
            [one] => one == "[DONE]" || serde_json::from_str::<Value>(one).is_ok(),
            _ => false,
        }
    }

    fn dispatch(&mut self, out: &mut Vec<String>) {
        if !self.data.is_empty() {
            out.push(self.data.join("\n"));
            self.data.clear();
        }
    }
}

/// One named SSE event.
pub(crate) fn event(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// One unnamed SSE event, as chat-completions streams send them.
pub(crate) fn data(data: &Value) -> String {
    format!("data: {data}\n\n")
}

/// Appends `text` as a JSON string, quoted and escaped byte for byte as serde_json writes it
/// (`\"`, `\\`, the short escapes for \b \f \n \r \t, `\u00xx` for other control characters,
/// everything else as it is). The translated streams write their per-token events with it
/// instead of building a `Value` per token: the events are the same bytes (tests), at a fraction
/// of the allocations.
pub(crate) fn push_json_string(out: &mut String, text: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    let mut run = 0;
    for (at, byte) in text.bytes().enumerate() {
        let short = match byte {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0..=0x1f => "",
            _ => continue,
        };
        out.push_str(&text[run..at]);
        run = at + 1;
        if short.is_empty() {
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0xf)]));
        } else {
            out.push_str(short);
        }
    }
    out.push_str(&text[run..]);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_across_chunks_are_reassembled() {
        let mut lines = LineBuffer::default();
        assert!(lines.push("data: {\"a\"").is_empty());
        assert_eq!(lines.push(":1}\r\n\r\nda"), vec!["data: {\"a\":1}", ""]);
        assert_eq!(lines.take_rest().as_deref(), Some("da"));
        assert_eq!(lines.take_rest(), None);
    }

    #[test]
    fn lines_keep_their_endings_and_whole_lines_in_a_piece_come_as_they_are() {
        let mut lines = LineBuffer::default();
        let mut seen = Vec::new();
        let mut record = |content: &[u8], ending: &[u8]| {
            seen.push(format!(
                "{}|{}",
                String::from_utf8_lossy(content),
                ending.escape_ascii()
            ))
        };
        lines.push_bytes(b"a\r\nb\n\nc", &mut record);
        lines.push_bytes("\u{e9}\u{e9}".as_bytes().split_at(3).0, &mut record);
        lines.push_bytes(&"\u{e9}\u{e9}".as_bytes()[3..], &mut record);
        lines.push_bytes(b"\r", &mut record);
        lines.finish_bytes(&mut record);
        assert_eq!(
            seen,
            ["a|\\r\\n", "b|\\n", "|\\n", "c\u{e9}\u{e9}|\\r"],
            "a character cut between pieces is whole in its line"
        );
        assert_eq!(data_field("data: {}"), Some("{}"));
        assert_eq!(data_field("data:{}"), Some("{}"));
        assert_eq!(data_field("data:  x"), Some(" x"), "one space only");
        assert_eq!(data_field("event: data:"), None);
    }

    #[test]
    fn json_strings_are_written_as_serde_json_writes_them() {
        let all_controls: String = (0u8..0x20).map(char::from).collect();
        for text in [
            "",
            "plain",
            "quote \" and backslash \\ and slash /",
            "lines\nand\r\ttabs\u{8}\u{c}",
            &all_controls,
            "\u{7f} é 漢字 🦀 \u{2028}",
        ] {
            let mut out = String::from("x");
            push_json_string(&mut out, text);
            assert_eq!(out[1..], serde_json::to_string(text).unwrap(), "{text:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_json_string_is_written_as_serde_json_writes_it(text in ".*") {
            let mut out = String::new();
            push_json_string(&mut out, &text);
            proptest::prop_assert_eq!(out, serde_json::to_string(&text).unwrap());
        }

        /// However a stream is cut into pieces, the same lines come out.
        #[test]
        fn lines_do_not_depend_on_where_pieces_were_cut(
            text in "[a-z:\r\n ]{0,60}",
            cuts in proptest::collection::vec(0usize..60, 0..6),
        ) {
            let whole = {
                let mut lines = LineBuffer::default();
                let mut out = Vec::new();
                lines.push_bytes(text.as_bytes(), |c, e| out.push((c.to_vec(), e.to_vec())));
                lines.finish_bytes(|c, e| out.push((c.to_vec(), e.to_vec())));
                out
            };
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(text.len())).collect();
            cuts.sort();
            let mut lines = LineBuffer::default();
            let mut out = Vec::new();
            let mut from = 0;
            for cut in cuts.into_iter().chain([text.len()]) {
                lines.push_bytes(&text.as_bytes()[from..cut], |c, e| out.push((c.to_vec(), e.to_vec())));
                from = cut;
            }
            lines.finish_bytes(|c, e| out.push((c.to_vec(), e.to_vec())));
            proptest::prop_assert_eq!(out, whole);
        }
    }

    #[test]
    fn events_are_dispatched_at_blank_lines() {
        let mut reader = EventReader::default();
        let text = ": comment\nevent: x\ndata: {\"n\":1}\n\ndata: {\"n\":2}\n\ndata: [DONE]\n\n";
        let mut got = Vec::new();
        for piece in text.as_bytes().chunks(3) {
            got.extend(reader.push(std::str::from_utf8(piece).unwrap()));
        }
        assert_eq!(got, vec!["{\"n\":1}", "{\"n\":2}", "[DONE]"]);
        assert!(reader.finish().is_empty());
    }

    #[test]
    fn multi_line_data_is_joined_and_an_unterminated_event_is_flushed() {
        let mut reader = EventReader::default();
        assert_eq!(
            reader.push("data: {\"a\":\ndata: 1}\n\ndata: {\"b\":2}"),
            vec!["{\"a\":\n1}"]
        );
        assert_eq!(reader.finish(), vec!["{\"b\":2}"]);
    }

    #[test]
    fn missing_blank_lines_between_events_are_tolerated() {
        let mut reader = EventReader::default();
        assert_eq!(
            reader.push("data: {\"a\":1}\ndata: {\"b\":2}\ndata: [DONE]\n"),
            vec!["{\"a\":1}", "{\"b\":2}"]
        );
        assert_eq!(reader.finish(), vec!["[DONE]"]);
    }
}
