//! `multipart/form-data` bodies, as upload endpoints take them (a
//! transcription's audio, a platform's document or photo): text fields and
//! files, one boundary that no part's bytes can end early.
//!
//! Must never: put a caller's text into a part's header unquoted (a name
//! or file name with a quote, CR or LF would forge a header).

/// A form being written.
#[derive(Debug)]
pub struct Form {
    boundary: String,
    body: Vec<u8>,
}

impl Default for Form {
    fn default() -> Self {
        Self::new()
    }
}

impl Form {
    pub fn new() -> Self {
        Self {
            // 128 random bits: no file's bytes hold it by chance.
            boundary: format!("mercury-{:032x}", rand::random::<u128>()),
            body: Vec::new(),
        }
    }

    /// A text field.
    pub fn text(mut self, name: &str, value: &str) -> Self {
        self.body.extend_from_slice(
            format!(
                "--{}\r\nContent-Disposition: form-data; name=\"{}\"\r\n\r\n{value}\r\n",
                self.boundary,
                header_safe(name)
            )
            .as_bytes(),
        );
        self
    }

    /// A file field.
    pub fn file(mut self, name: &str, file_name: &str, mime: &str, bytes: &[u8]) -> Self {
        self.body.extend_from_slice(
            format!(
                "--{}\r\nContent-Disposition: form-data; name=\"{}\"; filename=\"{}\"\r\nContent-Type: {}\r\n\r\n",
                self.boundary,
                header_safe(name),
                header_safe(file_name),
                header_safe(mime)
            )
            .as_bytes(),
        );
        self.body.extend_from_slice(bytes);
        self.body.extend_from_slice(b"\r\n");
        self
    }

    /// The `Content-Type` header and the body.
    pub fn finish(mut self) -> (String, Vec<u8>) {
        self.body
            .extend_from_slice(format!("--{}--\r\n", self.boundary).as_bytes());
        (
            format!("multipart/form-data; boundary={}", self.boundary),
            self.body,
        )
    }
}

/// `s` without the characters that would end a header's quoted value.
fn header_safe(s: &str) -> String {
    s.chars()
        .filter(|c| !c.is_control() && *c != '"' && *c != '\\')
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_files_are_framed_and_a_name_cannot_forge_a_header() {
        let (content_type, body) = Form::new()
            .text("chat_id", "42")
            .file("document", "a\"\r\nX-Evil: 1.txt", "text/plain", b"hello")
            .finish();
        let boundary = content_type
            .strip_prefix("multipart/form-data; boundary=")
            .unwrap();
        let body = String::from_utf8(body).unwrap();
        assert!(body.starts_with(&format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"chat_id\"\r\n\r\n42\r\n"
        )));
        assert!(body
            .contains("filename=\"aX-Evil: 1.txt\"\r\nContent-Type: text/plain\r\n\r\nhello\r\n"));
        assert!(body.ends_with(&format!("--{boundary}--\r\n")));
        assert!(!body.contains("\r\nX-Evil"));
    }
}
