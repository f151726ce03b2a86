//! Server-sent events as the streaming providers send them (the
//! `text/event-stream` framing of the HTML standard): bytes in, in whatever
//! pieces the network delivers them, whole events out.
//!
//! Must never: hold more than one event's bytes beyond [`MAX_EVENT_BYTES`]
//! (a stream that never ends its event is refused, not buffered forever), or
//! split a UTF-8 character that a network read cut in two.

/// The largest event kept while it is read; no provider's event comes near.
pub(super) const MAX_EVENT_BYTES: usize = 4 << 20;

/// One event: its `event:` name (empty when the stream names none) and its
/// `data:` lines joined with `\n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Event {
    pub name: String,
    pub data: String,
}

/// Reads events out of a byte stream.
#[derive(Debug, Default)]
pub(super) struct Decoder {
    /// Bytes of a line not yet ended.
    line: Vec<u8>,
    name: String,
    data: String,
    /// Whether a `data:` line was seen in the current event (an event with
    /// an empty data line still counts; one with none is not dispatched).
    has_data: bool,
}

impl Decoder {
    /// Takes the next piece of the stream; the events it completed, in order.
    pub(super) fn push(&mut self, bytes: &[u8]) -> Result<Vec<Event>, String> {
        let mut out = Vec::new();
        for &b in bytes {
            if b == b'\n' {
                let mut line = std::mem::take(&mut self.line);
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                let line = String::from_utf8(line)
                    .map_err(|_| "an event-stream line is not UTF-8".to_string())?;
                if let Some(event) = self.line_ended(&line) {
                    out.push(event);
                }
            } else {
                self.line.push(b);
            }
            if self.line.len() + self.data.len() > MAX_EVENT_BYTES {
                return Err(format!(
                    "an event-stream event is longer than {MAX_EVENT_BYTES} bytes"
                ));
            }
        }
        Ok(out)
    }

    /// The event a stream that ended without a blank line left (`None`: it
    /// ended cleanly).
    pub(super) fn finish(&mut self) -> Option<Event> {
        if !self.line.is_empty() {
            let line = String::from_utf8_lossy(&std::mem::take(&mut self.line)).into_owned();
            if let Some(e) = self.line_ended(&line) {
                return Some(e);
            }
        }
        self.dispatch()
    }

    fn line_ended(&mut self, line: &str) -> Option<Event> {
        if line.is_empty() {
            return self.dispatch();
        }
        // A comment (a keep-alive): nothing to read.
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => self.name = value.to_owned(),
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            // `id` and `retry` matter to a browser reconnecting; a model
            // call is never resumed, it is retried whole.
            _ => {}
        }
        None
    }

    fn dispatch(&mut self) -> Option<Event> {
        let name = std::mem::take(&mut self.name);
        let data = std::mem::take(&mut self.data);
        std::mem::replace(&mut self.has_data, false).then_some(Event { name, data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(pieces: &[&[u8]]) -> Vec<Event> {
        let mut d = Decoder::default();
        let mut out = Vec::new();
        for p in pieces {
            out.extend(d.push(p).unwrap());
        }
        out.extend(d.finish());
        out
    }

    #[test]
    fn events_come_out_whole_however_the_bytes_are_cut() {
        let stream = "event: message_start\ndata: {\"a\":1}\n\n: ping\n\ndata: one\r\ndata: two\r\n\r\ndata: [DONE]\n\n";
        let expected = vec![
            Event {
                name: "message_start".into(),
                data: "{\"a\":1}".into(),
            },
            Event {
                name: String::new(),
                data: "one\ntwo".into(),
            },
            Event {
                name: String::new(),
                data: "[DONE]".into(),
            },
        ];
        let bytes = stream.as_bytes();
        assert_eq!(all(&[bytes]), expected);
        // Every cut point, including inside `\r\n`.
        for cut in 0..bytes.len() {
            assert_eq!(all(&[&bytes[..cut], &bytes[cut..]]), expected, "cut {cut}");
        }
        // One byte at a time.
        let singles: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(all(&singles), expected);
    }

    #[test]
    fn a_character_cut_by_the_network_is_joined_again() {
        let bytes = "data: caf\u{e9} \u{1f600}\n\n".as_bytes();
        for cut in 0..bytes.len() {
            let events = all(&[&bytes[..cut], &bytes[cut..]]);
            assert_eq!(events[0].data, "caf\u{e9} \u{1f600}", "cut {cut}");
        }
    }

    #[test]
    fn a_stream_cut_off_mid_event_still_gives_its_data_and_an_endless_event_is_refused() {
        assert_eq!(all(&[b"data: partial"])[0].data, "partial");
        assert!(all(&[b"event: x\n"]).is_empty(), "no data, no event");
        let mut d = Decoder::default();
        let endless = vec![b'a'; MAX_EVENT_BYTES + 1];
        assert!(d.push(b"data: ").is_ok());
        assert!(d.push(&endless).is_err());
    }
}
