//! The MCP client side: one connection per server a turn calls, over a
//! sandboxed process's pipes (`stdio`) or the host's HTTP broker (`http`),
//! with the caps every answer passes through.
//!
//! Must never: send a credential anywhere but the URL its manifest names,
//! read more than [`MAX_MESSAGE_BYTES`] of one answer, or wait on a server
//! past the caller's deadline.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, Tool};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use tokio::io::{AsyncRead, ReadBuf};

use super::ExtensionError;
use crate::sandbox::SpawnedProcess;

/// Largest single message a server may send (one JSON-RPC line on stdio,
/// one body or event over HTTP): a server that answers more is cut off.
pub(crate) const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// A running client; dropping it ends the connection (and, for stdio, the
/// process with it).
pub(crate) struct Connection {
    service: RunningService<RoleClient, ()>,
    /// The sandboxed process, killed when the connection goes.
    _process: Option<Box<dyn Send + Sync>>,
}

/// Speaks MCP over a process's pipes.
pub(crate) async fn connect_stdio(
    process: SpawnedProcess,
    deadline: Duration,
) -> Result<Connection, ExtensionError> {
    let SpawnedProcess {
        stdin,
        stdout,
        handle,
    } = process;
    let reader = LineCap::new(stdout, MAX_MESSAGE_BYTES);
    let service = tokio::time::timeout(deadline, ().serve((reader, stdin)))
        .await
        .map_err(|_| ExtensionError::Timeout(deadline))?
        .map_err(|e| ExtensionError::Protocol(format!("the server did not start MCP: {e}")))?;
    Ok(Connection {
        service,
        _process: Some(handle),
    })
}

/// Speaks MCP to `url` from the host, with `credential` as its bearer.
pub(crate) async fn connect_http(
    url: &str,
    credential: Option<String>,
    deadline: Duration,
) -> Result<Connection, ExtensionError> {
    let http = reqwest::Client::builder()
        // The only address this client calls is the manifest's.
        .redirect(reqwest::redirect::Policy::none())
        // A backstop behind the caller's own deadline, which says why.
        .timeout(deadline + Duration::from_secs(5))
        .build()
        .map_err(|e| ExtensionError::Protocol(format!("http client: {e}")))?;
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_owned())
        .max_json_response_size(MAX_MESSAGE_BYTES)
        .max_sse_event_size(MAX_MESSAGE_BYTES);
    if let Some(c) = credential {
        config = config.auth_header(c);
    }
    let transport = StreamableHttpClientTransport::with_client(http, config);
    let service = tokio::time::timeout(deadline, ().serve(transport))
        .await
        .map_err(|_| ExtensionError::Timeout(deadline))?
        .map_err(|e| ExtensionError::Protocol(format!("the server did not start MCP: {e}")))?;
    Ok(Connection {
        service,
        _process: None,
    })
}

impl Connection {
    pub(crate) async fn list_tools(&self, deadline: Duration) -> Result<Vec<Tool>, ExtensionError> {
        tokio::time::timeout(deadline, self.service.peer().list_all_tools())
            .await
            .map_err(|_| ExtensionError::Timeout(deadline))?
            .map_err(|e| ExtensionError::Protocol(format!("tools/list: {e}")))
    }

    /// Calls `tool`; its text content joined (structured content when there
    /// is none), and whether the server called it an error.
    pub(crate) async fn call(
        &self,
        tool: &str,
        arguments: serde_json::Value,
        deadline: Duration,
    ) -> Result<(String, bool), ExtensionError> {
        let arguments = match arguments {
            serde_json::Value::Object(m) => m,
            serde_json::Value::Null => Default::default(),
            _ => {
                return Err(ExtensionError::BadCall(
                    "the arguments must be a JSON object".into(),
                ))
            }
        };
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        let result = tokio::time::timeout(deadline, self.service.peer().call_tool(params))
            .await
            .map_err(|_| ExtensionError::Timeout(deadline))?
            .map_err(|e| ExtensionError::Protocol(format!("tools/call: {e}")))?;
        let mut text: Vec<String> = result
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect();
        if text.is_empty() {
            if let Some(v) = &result.structured_content {
                text.push(v.to_string());
            }
        }
        Ok((text.join("\n"), result.is_error == Some(true)))
    }

    pub(crate) async fn close(self) {
        let _ = tokio::time::timeout(Duration::from_secs(2), self.service.cancel()).await;
    }
}

/// A reader that fails once more than `cap` bytes arrive without a newline:
/// the stdio transport buffers a whole line before it parses it.
pub(crate) struct LineCap<R> {
    inner: R,
    cap: usize,
    since_newline: usize,
}

impl<R> LineCap<R> {
    pub(crate) fn new(inner: R, cap: usize) -> Self {
        Self {
            inner,
            cap,
            since_newline: 0,
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for LineCap<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                for b in &buf.filled()[before..] {
                    if *b == b'\n' {
                        this.since_newline = 0;
                    } else {
                        this.since_newline += 1;
                    }
                }
                if this.since_newline > this.cap {
                    // Nothing of this read is handed on: the error is its result.
                    buf.set_filled(before);
                    return Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("the server sent a message of more than {} bytes", this.cap),
                    )));
                }
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::LineCap;

    #[tokio::test]
    async fn line_cap_fails_a_long_line_and_passes_short_ones() {
        let mut short = LineCap::new(&b"ab\ncd\n"[..], 3);
        let mut out = String::new();
        short.read_to_string(&mut out).await.unwrap();
        assert_eq!(out, "ab\ncd\n");
        let long = [b'x'; 100];
        let mut r = LineCap::new(&long[..], 10);
        let mut sink = Vec::new();
        assert!(r.read_to_end(&mut sink).await.is_err());
    }
}
