//! The typed HTTP client of the Mercury API: one request over TCP or the
//! host's Unix socket, with the token, space and act-as headers. Used by
//! `mrctl`, the temp host (demo, benches) and the tests.
//!
//! Why hyper and not reqwest: this client also runs inside the agent image
//! (as `mrctl`), which reaches the API only through the mounted socket and
//! has no TLS roots; plain HTTP/1 over a Unix socket or loopback TCP is all it
//! needs, and hyper speaks both without a TLS stack.
//!
//! Must never: print or log the API token (not in errors, not in `Debug`),
//! follow redirects, or talk to anything but the one configured address.

use std::path::{Path, PathBuf};
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST, USER_AGENT};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use url::{Host, Url};

pub(crate) const DEFAULT_URL: &str = "http://127.0.0.1:8787";
/// Chat turns run a whole agent turn before answering, so the default wait is long.
pub(crate) const DEFAULT_TIMEOUT_SECS: u64 = 600;
/// No route answers anything near this; a bigger body means something is wrong,
/// and refusing it keeps a confused peer from filling memory.
const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;
pub(crate) const SPACE_HEADER: &str = "x-mercury-space";
pub(crate) const ACT_AS_HEADER: &str = "x-mercury-act-as";

/// Where the server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// The host's `api.sock` (what a sandboxed turn uses).
    Unix(PathBuf),
    /// Plain HTTP; `base_path` is a prefix (no trailing slash) for servers behind a proxy.
    Http {
        host: String,
        port: u16,
        base_path: String,
    },
}

impl Endpoint {
    /// Parses `http://host[:port][/prefix]`. Only plain http: TLS belongs to a
    /// proxy in front of the host, and the socket needs none.
    pub fn parse_url(raw: &str) -> Result<Self, ClientError> {
        let bad = |why: &str| ClientError::Config(format!("MERCURY_URL {raw:?} {why}"));
        let trimmed = raw.trim();
        let lower = trimmed.to_ascii_lowercase();
        if lower.starts_with("https://") {
            return Err(bad("uses https, which mrctl does not speak: use http:// to a local address, or MERCURY_SOCKET"));
        }
        // Checked on the text: the WHATWG parser would also take `http:h`.
        if !lower.starts_with("http://") {
            return Err(bad("must start with http://"));
        }
        if trimmed.contains(['?', '#']) {
            return Err(bad("must not have a query or fragment"));
        }
        // The url crate follows the WHATWG URL Standard, which forgives what
        // RFC 3986 does not and MERCURY_URL never took: slashes before the
        // host (`http:///h`), empty userinfo (`http://@h`), an empty port
        // (`http://h:`). The authority as written keeps them refused.
        let written = trimmed["http://".len()..]
            .split(['/', '\\'])
            .next()
            .unwrap_or_default();
        if written.contains('@') {
            return Err(bad("must not carry credentials; use the token settings"));
        }
        if written.is_empty() {
            return Err(bad("has no host"));
        }
        let url = Url::parse(trimmed).map_err(|e| match e {
            url::ParseError::EmptyHost => bad("has no host"),
            url::ParseError::InvalidPort => bad("has a bad port"),
            url::ParseError::InvalidIpv6Address => match written.split_once(']') {
                None => bad("has an unclosed '[' in the host"),
                Some((_, tail)) if !tail.is_empty() && !tail.starts_with(':') => {
                    bad("has junk after the IPv6 host")
                }
                Some(_) => bad("has a bad IPv6 address"),
            },
            _ => bad("has a bad host"),
        })?;
        let host = match url.host() {
            Some(Host::Domain(d)) => d.to_owned(),
            Some(Host::Ipv4(a)) => a.to_string(),
            Some(Host::Ipv6(a)) => a.to_string(),
            None => return Err(bad("has no host")),
        };
        let port = match url.port_or_known_default() {
            Some(p) if p > 0 && !written.ends_with(':') => p,
            _ => return Err(bad("has a bad port")),
        };
        Ok(Endpoint::Http {
            host,
            port,
            base_path: url.path().trim_end_matches('/').to_owned(),
        })
    }

    /// The Host header: the authority for TCP; any name for the socket, since
    /// HTTP/1.1 requires one and the server does not route on it.
    fn authority(&self) -> String {
        match self {
            Endpoint::Unix(_) => "localhost".to_owned(),
            Endpoint::Http { host, port, .. } if host.contains(':') => format!("[{host}]:{port}"),
            Endpoint::Http { host, port, .. } => format!("{host}:{port}"),
        }
    }

    fn base_path(&self) -> &str {
        match self {
            Endpoint::Unix(_) => "",
            Endpoint::Http { base_path, .. } => base_path,
        }
    }

    /// How the endpoint is named in error messages.
    pub fn describe(&self) -> String {
        match self {
            Endpoint::Unix(p) => format!("unix socket {}", p.display()),
            Endpoint::Http { base_path, .. } => format!("http://{}{base_path}", self.authority()),
        }
    }

    fn hint(&self) -> &'static str {
        match self {
            Endpoint::Unix(_) => "check MERCURY_SOCKET and that `mercury serve` is running",
            Endpoint::Http { .. } => "check MERCURY_URL and that `mercury serve` is running",
        }
    }
}

/// Everything a request needs besides its method, path and body.
#[derive(Clone)]
pub struct Connection {
    pub endpoint: Endpoint,
    /// Sent as `Authorization: Bearer`; never printed.
    pub token: Option<String>,
    /// `x-mercury-space`.
    pub space: Option<String>,
    /// `x-mercury-act-as`: act in another space through a space link.
    pub act_as: Option<String>,
    /// Covers connecting, sending and reading the whole answer.
    pub timeout: Duration,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("space", &self.space)
            .field("act_as", &self.act_as)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Connection {
    pub fn new(endpoint: Endpoint) -> Self {
        Self {
            endpoint,
            token: None,
            space: None,
            act_as: None,
            timeout: Duration::from_secs(DEFAULT_TIMEOUT_SECS),
        }
    }

    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    pub fn with_space(mut self, space: impl Into<String>) -> Self {
        self.space = Some(space.into());
        self
    }

    /// Reads the connection settings the way `mrctl` does. `env` looks up an
    /// environment variable (a parameter so tests need not touch the real
    /// environment); `token_file` is `--token-file`; `act_as` is `--space`.
    pub fn from_env(
        env: &dyn Fn(&str) -> Option<String>,
        token_file: Option<&Path>,
        act_as: Option<String>,
    ) -> Result<Self, ClientError> {
        // An empty variable counts as unset, as shells make "unsetting" by `X=` common.
        let var = |k: &str| {
            env(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let endpoint = match var("MERCURY_SOCKET") {
            Some(sock) => Endpoint::Unix(PathBuf::from(sock)),
            None => {
                Endpoint::parse_url(&var("MERCURY_URL").unwrap_or_else(|| DEFAULT_URL.to_owned()))?
            }
        };
        let timeout = match var("MERCURY_TIMEOUT_SECS") {
            None => DEFAULT_TIMEOUT_SECS,
            Some(raw) => raw.parse::<u64>().ok().filter(|s| *s > 0).ok_or_else(|| {
                ClientError::Config(format!(
                    "MERCURY_TIMEOUT_SECS {raw:?} is not a positive number of seconds"
                ))
            })?,
        };
        let token = resolve_token(&var, token_file)?;
        Ok(Self {
            endpoint,
            token: Some(token),
            space: var("MERCURY_SPACE"),
            act_as,
            timeout: Duration::from_secs(timeout),
        })
    }
}

fn read_token_file(path: &Path, what: &str) -> Result<String, ClientError> {
    let raw = std::fs::read_to_string(path).map_err(|e| {
        ClientError::Config(format!(
            "cannot read the token file {} ({what}): {e}",
            path.display()
        ))
    })?;
    let token = raw.trim();
    if token.is_empty() {
        return Err(ClientError::Config(format!(
            "the token file {} ({what}) is empty",
            path.display()
        )));
    }
    Ok(token.to_owned())
}

/// `--token-file`, else `MERCURY_TOKEN`, else the owner token in the data dir.
fn resolve_token(
    var: &dyn Fn(&str) -> Option<String>,
    token_file: Option<&Path>,
) -> Result<String, ClientError> {
    if let Some(path) = token_file {
        return read_token_file(path, "--token-file");
    }
    if let Some(token) = var("MERCURY_TOKEN") {
        return Ok(token);
    }
    match var("MERCURY_DATA_DIR") {
        Some(dir) => {
            let path = Path::new(&dir).join("global").join("owner.token");
            if path.exists() {
                read_token_file(&path, "$MERCURY_DATA_DIR/global/owner.token")
            } else {
                Err(ClientError::Config(format!(
                    "no API token: --token-file was not given, MERCURY_TOKEN is not set, and {} does not exist",
                    path.display()
                )))
            }
        }
        None => Err(ClientError::Config(
            "no API token: --token-file was not given, MERCURY_TOKEN is not set, and MERCURY_DATA_DIR is not set \
             (mrctl would read $MERCURY_DATA_DIR/global/owner.token)"
                .into(),
        )),
    }
}

/// Everything that can go wrong before the server's answer is in hand.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Bad settings: URL, timeout, token location, header values.
    #[error("{0}")]
    Config(String),
    #[error("cannot reach the Mercury server at {addr} ({source}); {hint}")]
    Connect {
        addr: String,
        hint: &'static str,
        source: std::io::Error,
    },
    #[error(
        "no complete answer from {addr} within {secs} s (set MERCURY_TIMEOUT_SECS to wait longer)"
    )]
    Timeout { addr: String, secs: u64 },
    #[error("the connection to {addr} failed: {detail}")]
    Protocol { addr: String, detail: String },
}

/// Sends one request and returns the status and the JSON answer. A body that
/// is empty comes back as `Value::Null`, one that is not JSON as a
/// `Value::String` of its text, so non-JSON error pages can still be shown.
/// Statuses are not judged here: a 4xx is `Ok`, the caller decides.
pub(crate) async fn request(
    conn: &Connection,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Result<(u16, Value), ClientError> {
    request_with_headers(conn, method, path, body, &[]).await
}

/// [`request`] with extra headers (such as `If-Match`).
pub(crate) async fn request_with_headers(
    conn: &Connection,
    method: Method,
    path: &str,
    body: Option<Value>,
    headers: &[(&str, String)],
) -> Result<(u16, Value), ClientError> {
    let req = build_request(conn, method, path, body, headers)?;
    let addr = conn.endpoint.describe();
    let exchange_fut = async {
        match &conn.endpoint {
            #[cfg(unix)]
            Endpoint::Unix(p) => {
                let stream = tokio::net::UnixStream::connect(p)
                    .await
                    .map_err(|e| connect_error(conn, e))?;
                exchange(stream, req, &addr).await
            }
            #[cfg(not(unix))]
            Endpoint::Unix(_) => Err(ClientError::Config(
                "Unix sockets are not available on this platform".into(),
            )),
            Endpoint::Http { host, port, .. } => {
                let stream = tokio::net::TcpStream::connect((host.as_str(), *port))
                    .await
                    .map_err(|e| connect_error(conn, e))?;
                // Requests are one small write; don't let Nagle hold it back.
                let _ = stream.set_nodelay(true);
                exchange(stream, req, &addr).await
            }
        }
    };
    match tokio::time::timeout(conn.timeout, exchange_fut).await {
        Ok(result) => result,
        Err(_) => Err(ClientError::Timeout {
            addr,
            secs: conn.timeout.as_secs(),
        }),
    }
}

fn connect_error(conn: &Connection, source: std::io::Error) -> ClientError {
    ClientError::Connect {
        addr: conn.endpoint.describe(),
        hint: conn.endpoint.hint(),
        source,
    }
}

fn header_value(name: &str, value: &str, sensitive: bool) -> Result<HeaderValue, ClientError> {
    let mut v = HeaderValue::from_str(value).map_err(|_| {
        // The value itself is deliberately not echoed: for the token it is a secret.
        ClientError::Config(format!(
            "the {name} contains characters that cannot go in an HTTP header"
        ))
    })?;
    v.set_sensitive(sensitive);
    Ok(v)
}

fn build_request(
    conn: &Connection,
    method: Method,
    path: &str,
    body: Option<Value>,
    headers: &[(&str, String)],
) -> Result<Request<Full<Bytes>>, ClientError> {
    let mut builder = Request::builder()
        .method(method)
        .uri(format!("{}{path}", conn.endpoint.base_path()))
        .header(
            HOST,
            header_value("host", &conn.endpoint.authority(), false)?,
        )
        .header(ACCEPT, "application/json")
        .header(USER_AGENT, concat!("mrctl/", env!("CARGO_PKG_VERSION")));
    if let Some(token) = &conn.token {
        builder = builder.header(
            AUTHORIZATION,
            header_value("API token", &format!("Bearer {token}"), true)?,
        );
    }
    if let Some(space) = &conn.space {
        builder = builder.header(
            SPACE_HEADER,
            header_value("space id (MERCURY_SPACE)", space, false)?,
        );
    }
    if let Some(other) = &conn.act_as {
        builder = builder.header(ACT_AS_HEADER, header_value("--space value", other, false)?);
    }
    for (name, value) in headers {
        builder = builder.header(*name, header_value(name, value, false)?);
    }
    let bytes = match body {
        Some(v) => {
            builder = builder.header(CONTENT_TYPE, "application/json");
            Bytes::from(v.to_string())
        }
        None => Bytes::new(),
    };
    builder
        .body(Full::new(bytes))
        .map_err(|e| ClientError::Config(format!("cannot build the request for {path}: {e}")))
}

async fn exchange<S>(
    stream: S,
    req: Request<Full<Bytes>>,
    addr: &str,
) -> Result<(u16, Value), ClientError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let protocol = |e: &dyn std::fmt::Display| ClientError::Protocol {
        addr: addr.to_owned(),
        detail: e.to_string(),
    };
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| protocol(&e))?;
    // The connection future does the socket I/O; it has to run while we wait
    // for the answer. It ends by itself once `sender` is dropped.
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let response = sender.send_request(req).await.map_err(|e| protocol(&e))?;
    let status = response.status().as_u16();
    let bytes = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
        .collect()
        .await
        .map_err(|e| protocol(&e))?
        .to_bytes();
    let value = if bytes.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).trim().to_owned()))
    };
    Ok((status, value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn urls_parse_to_endpoints() {
        let ep = |raw: &str| match Endpoint::parse_url(raw) {
            Ok(e) => e,
            Err(e) => panic!("{raw}: {e}"),
        };
        let http = |host: &str, port, base: &str| Endpoint::Http {
            host: host.into(),
            port,
            base_path: base.into(),
        };
        assert_eq!(ep("http://127.0.0.1:8787"), http("127.0.0.1", 8787, ""));
        assert_eq!(ep("http://localhost/"), http("localhost", 80, ""));
        assert_eq!(ep("HTTP://host:1/mercury/"), http("host", 1, "/mercury"));
        assert_eq!(ep("http://[::1]:9000"), http("::1", 9000, ""));
        assert_eq!(ep("http://[::1]:9000").describe(), "http://[::1]:9000");
        for bad in [
            "https://x",
            "ftp://x",
            "x:80",
            "http://:80",
            "http://h:0",
            "http://h:99999",
            "http://u:p@h",
            "http://h/?q",
            "http://[::1",
        ] {
            assert!(Endpoint::parse_url(bad).is_err(), "{bad}");
        }
        match Endpoint::parse_url("https://x") {
            Err(e) => assert!(e.to_string().contains("MERCURY_SOCKET"), "{e}"),
            Ok(e) => panic!("{e:?}"),
        }
    }

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k: &str| map.get(k).cloned()
    }

    fn conn_from(
        pairs: &[(&str, &str)],
        token_file: Option<&Path>,
    ) -> Result<Connection, ClientError> {
        Connection::from_env(&env_of(pairs), token_file, None)
    }

    #[test]
    fn connection_settings_come_from_the_environment() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir_all(dir.path().join("global"))?;
        std::fs::write(dir.path().join("global/owner.token"), "  owner-secret\n")?;
        let file = dir.path().join("my.token");
        std::fs::write(&file, "file-secret\n")?;
        let data_dir = dir.path().to_str().ok_or("utf8")?;

        // Defaults: the owner token from the data dir, the default URL, no space.
        let c = conn_from(&[("MERCURY_DATA_DIR", data_dir)], None)?;
        assert_eq!(c.token.as_deref(), Some("owner-secret"));
        assert_eq!(c.endpoint, Endpoint::parse_url(DEFAULT_URL)?);
        assert_eq!(c.space, None);
        assert_eq!(c.timeout, Duration::from_secs(600));

        // MERCURY_TOKEN beats the data dir; --token-file beats both.
        let env = [
            ("MERCURY_DATA_DIR", data_dir),
            ("MERCURY_TOKEN", " env-secret "),
            ("MERCURY_SPACE", "family"),
        ];
        let c = conn_from(&env, None)?;
        assert_eq!(c.token.as_deref(), Some("env-secret"));
        assert_eq!(c.space.as_deref(), Some("family"));
        assert_eq!(
            conn_from(&env, Some(&file))?.token.as_deref(),
            Some("file-secret")
        );

        // The socket beats the URL.
        let c = conn_from(
            &[
                ("MERCURY_TOKEN", "t"),
                ("MERCURY_SOCKET", "/x/api.sock"),
                ("MERCURY_URL", "http://h:1"),
            ],
            None,
        )?;
        assert_eq!(c.endpoint, Endpoint::Unix(PathBuf::from("/x/api.sock")));
        let c = conn_from(
            &[
                ("MERCURY_TOKEN", "t"),
                ("MERCURY_SOCKET", ""),
                ("MERCURY_TIMEOUT_SECS", "5"),
            ],
            None,
        )?;
        assert!(matches!(c.endpoint, Endpoint::Http { .. }));
        assert_eq!(c.timeout, Duration::from_secs(5));
        assert!(conn_from(
            &[("MERCURY_TOKEN", "t"), ("MERCURY_TIMEOUT_SECS", "0")],
            None
        )
        .is_err());
        Ok(())
    }

    #[test]
    fn missing_token_says_where_it_looked() -> Result<(), Box<dyn std::error::Error>> {
        let err = conn_from(&[], None)
            .err()
            .ok_or("expected an error")?
            .to_string();
        assert!(
            err.contains("--token-file")
                && err.contains("MERCURY_TOKEN")
                && err.contains("MERCURY_DATA_DIR"),
            "{err}"
        );
        let dir = tempfile::tempdir()?;
        let data_dir = dir.path().to_str().ok_or("utf8")?;
        let err = conn_from(&[("MERCURY_DATA_DIR", data_dir)], None)
            .err()
            .ok_or("expected an error")?
            .to_string();
        assert!(
            err.contains("owner.token") && err.contains("does not exist"),
            "{err}"
        );
        let missing = dir.path().join("nope");
        let err = conn_from(&[("MERCURY_TOKEN", "t")], Some(&missing))
            .err()
            .ok_or("expected an error")?
            .to_string();
        assert!(err.contains("nope"), "{err}");
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n")?;
        let err = conn_from(&[], Some(&empty))
            .err()
            .ok_or("expected an error")?
            .to_string();
        assert!(err.contains("empty"), "{err}");
        Ok(())
    }

    #[test]
    fn the_token_never_shows() {
        let conn = Connection::new(Endpoint::Unix("/s".into())).with_token("sekret-123");
        assert!(!format!("{conn:?}").contains("sekret"));
        let conn = conn.with_token("bad\ntoken-sekret");
        match build_request(&conn, Method::GET, "/api/whoami", None, &[]) {
            Err(e) => assert!(!e.to_string().contains("sekret"), "{e}"),
            Ok(_) => panic!("a newline in the token must be refused"),
        }
    }

    fn refusal(raw: &str) -> String {
        match Endpoint::parse_url(raw) {
            Ok(e) => panic!("{raw:?} was taken as {e:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn http(raw: &str) -> (String, u16, String) {
        match Endpoint::parse_url(raw) {
            Ok(Endpoint::Http {
                host,
                port,
                base_path,
            }) => (host, port, base_path),
            other => panic!("{raw:?}: {other:?}"),
        }
    }

    #[test]
    fn each_refusal_keeps_its_sentence() {
        for (raw, why) in [
            ("https://x", "uses https"),
            ("ftp://x", "must start with http://"),
            ("x:80", "must start with http://"),
            ("http:h", "must start with http://"),
            ("http://h/?q", "must not have a query or fragment"),
            ("http://h#f", "must not have a query or fragment"),
            ("http://u@h?q", "must not have a query or fragment"),
            ("http://u:p@h", "must not carry credentials"),
            ("http://u@h", "must not carry credentials"),
            ("http://u@:80", "must not carry credentials"),
            ("http://[::1", "has an unclosed '[' in the host"),
            ("http://[::1]x", "has junk after the IPv6 host"),
            ("http://", "has no host"),
            ("http://:80", "has no host"),
            ("http://h:0", "has a bad port"),
            ("http://h:99999", "has a bad port"),
            ("http://h:x", "has a bad port"),
            ("http://[::1]:x", "has a bad port"),
        ] {
            let e = refusal(raw);
            assert!(e.starts_with(&format!("MERCURY_URL {raw:?} ")), "{e}");
            assert!(e.contains(why), "{raw:?}: {e}");
        }
    }

    /// What the WHATWG URL Standard forgives and RFC 3986 does not: the url
    /// crate alone would take these, MERCURY_URL never did and still does not.
    #[test]
    fn whatwg_leniency_stays_refused() {
        for (raw, why) in [
            ("http:///h", "has no host"),
            ("http://\\h", "has no host"),
            ("http://@h", "must not carry credentials"),
            ("http://:@h", "must not carry credentials"),
            ("http://h:", "has a bad port"),
            ("http://[::1]:", "has a bad port"),
        ] {
            assert!(refusal(raw).contains(why), "{raw:?}");
        }
    }

    /// Where the old hand-written parser was wrong: it took any text as a
    /// host, so these reached DNS (or the Host header) as garbage. The url
    /// crate refuses them, or reads them as the standard says.
    #[test]
    fn the_old_parsers_mistakes_are_corrected() {
        assert!(refusal("http://a b").contains("has a bad host"));
        assert!(refusal("http://[zz]").contains("has a bad IPv6 address"));
        // `u16::from_str` takes a leading `+`; a URL port is digits only.
        assert!(refusal("http://h:+80").contains("has a bad port"));
        assert_eq!(http("http://h\\p"), ("h".into(), 80, "/p".into()));
        // Hosts are normalised: DNS names are case-free, IPv4 has one spelling.
        assert_eq!(http("http://LOCALHOST:8787").0, "localhost");
        assert_eq!(http("http://127.1").0, "127.0.0.1");
        assert_eq!(http("http://[0:0::1]").0, "::1");
        // A base path is resolved and encoded once, here, not at each request.
        assert_eq!(http("http://h/a/../mercury/").2, "/mercury");
        assert_eq!(http("http://h/my path").2, "/my%20path");
    }

    #[test]
    fn accepted_urls_keep_their_shape() {
        assert_eq!(http(" http://h:080 "), ("h".into(), 80, String::new()));
        assert_eq!(http("http://h:80/"), ("h".into(), 80, String::new()));
        assert_eq!(http("http://h//x//"), ("h".into(), 80, "//x".into()));
        assert_eq!(
            http("http://[::1]:9000/m"),
            ("::1".into(), 9000, "/m".into())
        );
    }
}
