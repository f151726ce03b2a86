//! `web_fetch` (issue 29 item 6): the built-in tool the host runs for a turn
//! (the sandbox has no network), off in a space until its admin sets the
//! space's config key `web.fetch` to `on`.
//!
//! Owns one fetch: the egress policy (`web.allow` / `web.deny`; loopback,
//! link-local, private and other special ranges refused unless allowed),
//! applied to the addresses DNS gave and again on every redirect; the
//! connection goes to exactly those checked addresses (the HTTP client is
//! handed them and never resolves the name itself); caps on time, size and
//! redirects; the text of an HTML page ([`super::html_text`]).
//!
//! Must never: connect to an address it did not check, follow a redirect it
//! did not check, use a proxy (it would resolve names itself), send a
//! credential or cookie, read more than `web.max_bytes` of a body, or take
//! longer than `web.timeout_secs` in all.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use url::{Host, Url};

use super::html_text;
use crate::config::web::{WebConfig, WebRule};

/// The tool's name, as the model calls it.
pub const TOOL_NAME: &str = "web_fetch";
/// The space config key that turns it on (`on` / `off`; absent: off).
pub const CONFIG_KEY: &str = "web.fetch";

/// Why a fetch gave no page, as the model reads it.
#[derive(Debug, thiserror::Error)]
pub enum WebError {
    #[error("{0:?} is not an http:// or https:// URL with a host")]
    BadUrl(String),
    #[error("{0}")]
    Refused(String),
    #[error("the fetch did not finish within {0:?}; it was cut off")]
    Timeout(Duration),
    #[error("more than {0} redirects; the fetch was stopped")]
    TooManyRedirects(u32),
    #[error("cannot resolve {host}: {why}")]
    Dns { host: String, why: String },
    #[error("the request to {url} failed: {why}")]
    Http { url: String, why: String },
    #[error("{url} is {content_type}, not text; nothing of it was read")]
    NotText { url: String, content_type: String },
}

/// A fetched page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// Where the page came from, after redirects.
    pub url: String,
    pub status: u16,
    pub content_type: String,
    pub title: Option<String>,
    /// The page's text (an HTML page's extracted text).
    pub text: String,
    /// Set when the body was longer than the cap: the sentence saying so.
    pub cut_off: Option<String>,
}

impl Fetched {
    /// What the model reads.
    pub fn render(&self) -> String {
        let mut out = format!("URL: {}\nStatus: {}\n", self.url, self.status);
        if let Some(t) = &self.title {
            out.push_str(&format!("Title: {t}\n"));
        }
        out.push('\n');
        out.push_str(&self.text);
        if let Some(c) = &self.cut_off {
            out.push_str(&format!("\n[{c}]"));
        }
        out
    }
}

/// The special ranges a fetch refuses unless `web.allow` lets the URL's
/// host through: what each is, in words.
fn special(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => special_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => special_v4(v4),
            None => special_v6(v6),
        },
    }
}

fn special_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    Some(if ip.is_loopback() {
        "a loopback address"
    } else if ip.is_private() {
        "a private address"
    } else if ip.is_link_local() {
        "a link-local address"
    } else if o[0] == 0 || ip.is_broadcast() || ip.is_multicast() || o[0] >= 240 {
        "not a unicast address"
    } else if o[0] == 100 && (o[1] & 0xc0) == 64 {
        "a shared (carrier-grade NAT) address"
    } else if (o[0] == 192 && o[1] == 0 && o[2] == 0) || (o[0] == 198 && (o[1] & 0xfe) == 18) {
        "a reserved address"
    } else {
        return None;
    })
}

fn special_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    Some(if ip.is_loopback() {
        "a loopback address"
    } else if ip.is_unspecified() || ip.is_multicast() {
        "not a unicast address"
    } else if (s[0] & 0xffc0) == 0xfe80 || (s[0] & 0xffc0) == 0xfec0 {
        "a link-local address"
    } else if (s[0] & 0xfe00) == 0xfc00 {
        "a private address"
    } else if s[0] == 0x64 && s[1] == 0xff9b {
        // NAT64 carries an IPv4 address: judged as that one.
        let v4 = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
        return special_v4(v4);
    } else {
        return None;
    })
}

/// The egress policy of one host's settings.
pub struct Policy {
    allow: Vec<WebRule>,
    deny: Vec<WebRule>,
}

impl Policy {
    pub fn new(cfg: &WebConfig) -> Self {
        Self {
            allow: WebConfig::rules(&cfg.allow),
            deny: WebConfig::rules(&cfg.deny),
        }
    }

    /// Whether `url`'s host, resolved to `addrs`, may be fetched; the
    /// sentence saying why not. Every address must pass (a name resolving
    /// to one public and one private address is refused).
    pub fn check(&self, url: &Url, host: &Host<&str>, addrs: &[IpAddr]) -> Result<(), String> {
        let (name, literal) = match host {
            Host::Domain(d) => (Some(d.trim_end_matches('.').to_ascii_lowercase()), None),
            Host::Ipv4(ip) => (None, Some(IpAddr::V4(*ip))),
            Host::Ipv6(ip) => (None, Some(IpAddr::V6(*ip))),
        };
        let shown = url.host_str().unwrap_or("");
        if let Some(n) = &name {
            if self.deny.iter().any(|r| r.names(n)) {
                return Err(format!(
                    "{shown} is refused by web.deny; nothing was fetched"
                ));
            }
        }
        if addrs.is_empty() {
            return Err(format!(
                "{shown} resolves to no address; nothing was fetched"
            ));
        }
        for ip in addrs {
            if self.deny.iter().any(|r| r.holds(*ip)) {
                return Err(format!(
                    "{shown} resolves to {ip}, which web.deny refuses; nothing was fetched"
                ));
            }
            let Some(what) = special(*ip) else { continue };
            let allowed = match (&name, literal) {
                (Some(n), _) => self.allow.iter().any(|r| r.names(n)),
                (None, Some(l)) => self.allow.iter().any(|r| r.holds(l)),
                (None, None) => false,
            };
            if !allowed {
                let how = if name.is_some() {
                    format!("{shown} resolves to {ip}, {what}")
                } else {
                    format!("{shown} is {what}")
                };
                return Err(format!(
                    "{how}, and web.allow does not name it; nothing was fetched"
                ));
            }
        }
        Ok(())
    }
}

/// Fetches `raw` under `cfg`: the page, or the sentence saying why not.
pub async fn fetch(cfg: &WebConfig, raw: &str) -> Result<Fetched, WebError> {
    let limit = Duration::from_secs(cfg.timeout_secs);
    match tokio::time::timeout(limit, fetch_within(cfg, raw, Instant::now() + limit)).await {
        Ok(r) => r,
        Err(_) => Err(WebError::Timeout(limit)),
    }
}

async fn fetch_within(cfg: &WebConfig, raw: &str, deadline: Instant) -> Result<Fetched, WebError> {
    let policy = Policy::new(cfg);
    let limit = Duration::from_secs(cfg.timeout_secs);
    let mut url = parse_url(raw)?;
    let mut hops = 0;
    loop {
        let host = url
            .host()
            .ok_or_else(|| WebError::BadUrl(url.to_string()))?;
        let port = url
            .port_or_known_default()
            .ok_or_else(|| WebError::BadUrl(url.to_string()))?;
        let addrs: Vec<IpAddr> = match &host {
            Host::Ipv4(ip) => vec![IpAddr::V4(*ip)],
            Host::Ipv6(ip) => vec![IpAddr::V6(*ip)],
            Host::Domain(d) => {
                let found =
                    tokio::net::lookup_host((*d, port))
                        .await
                        .map_err(|e| WebError::Dns {
                            host: (*d).to_owned(),
                            why: e.to_string(),
                        })?;
                let mut ips: Vec<IpAddr> = found.map(|a| a.ip()).collect();
                ips.dedup();
                ips
            }
        };
        policy
            .check(&url, &host, &addrs)
            .map_err(WebError::Refused)?;
        let mut client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("mercury-web-fetch/", env!("CARGO_PKG_VERSION")))
            .timeout(deadline.saturating_duration_since(Instant::now()));
        if let Host::Domain(d) = &host {
            // The checked addresses, and only those: the client never
            // resolves the name again (a second answer could differ).
            let pinned: Vec<SocketAddr> =
                addrs.iter().map(|ip| SocketAddr::new(*ip, port)).collect();
            client = client.resolve_to_addrs(d, &pinned);
        }
        let client = client.build().map_err(|e| WebError::Http {
            url: url.to_string(),
            why: e.to_string(),
        })?;
        let mut resp = client
            .get(url.clone())
            .header(
                reqwest::header::ACCEPT,
                "text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.5",
            )
            .send()
            .await
            .map_err(|e| http_err(&url, &e, limit))?;
        let status = resp.status();
        if status.is_redirection() {
            let Some(to) = resp
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|l| l.to_str().ok())
            else {
                return Err(WebError::Http {
                    url: url.to_string(),
                    why: format!("{status} without a Location"),
                });
            };
            if hops >= cfg.max_redirects {
                return Err(WebError::TooManyRedirects(cfg.max_redirects));
            }
            hops += 1;
            let next = url.join(to).map_err(|_| WebError::BadUrl(to.to_owned()))?;
            url = parse_url(next.as_str())?;
            continue;
        }
        let content_type = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        let mime = content_type
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_owned();
        let is_html = mime == "text/html" || mime == "application/xhtml+xml";
        let is_text = is_html
            || mime.is_empty()
            || mime.starts_with("text/")
            || mime.ends_with("+json")
            || mime.ends_with("+xml")
            || matches!(
                mime.as_str(),
                "application/json" | "application/xml" | "application/javascript"
            );
        if !is_text {
            return Err(WebError::NotText {
                url: url.to_string(),
                content_type: mime,
            });
        }
        let mut body: Vec<u8> = Vec::new();
        let mut cut_off = None;
        while let Some(chunk) = resp.chunk().await.map_err(|e| http_err(&url, &e, limit))? {
            let room = cfg.max_bytes - body.len();
            if chunk.len() > room {
                body.extend_from_slice(&chunk[..room]);
                cut_off = Some(format!(
                    "the page is larger than web.max_bytes ({} bytes); the rest was cut off",
                    cfg.max_bytes
                ));
                break;
            }
            body.extend_from_slice(&chunk);
        }
        // Dropping the response closes the connection mid-body.
        drop(resp);
        let text = String::from_utf8_lossy(&body);
        let sniff_html = mime.is_empty() && text.trim_start().starts_with('<');
        let (title, text) = if is_html || sniff_html {
            (html_text::title(&text), html_text::extract(&text))
        } else {
            (None, text.into_owned())
        };
        return Ok(Fetched {
            url: url.to_string(),
            status: status.as_u16(),
            content_type: mime,
            title,
            text,
            cut_off,
        });
    }
}

fn http_err(url: &Url, e: &reqwest::Error, limit: Duration) -> WebError {
    if e.is_timeout() {
        // The client's deadline is the rest of the whole fetch's.
        return WebError::Timeout(limit);
    }
    let mut why = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        why = format!("{why}: {s}");
        src = s.source();
    }
    WebError::Http {
        url: url.to_string(),
        why,
    }
}

/// An http(s) URL with a host and no credential in it.
fn parse_url(raw: &str) -> Result<Url, WebError> {
    let bad = || WebError::BadUrl(raw.chars().take(300).collect());
    let u = Url::parse(raw.trim()).map_err(|_| bad())?;
    if !matches!(u.scheme(), "http" | "https") || u.host().is_none() {
        return Err(bad());
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err(WebError::Refused(
            "a URL with a user name or password in it is not fetched".into(),
        ));
    }
    Ok(u)
}

/// The tool as the model sees it.
pub fn spec() -> crate::model::ToolSpec {
    crate::model::ToolSpec {
        name: TOOL_NAME.into(),
        description: "Fetch a web page (http or https) and read its text. The host fetches it \
                      (the sandbox has no network): private and loopback addresses are refused, \
                      pages are size- and time-capped, HTML is reduced to its text."
            .into(),
        parameters: serde_json::json!({
            "type": "object",
            "properties": {"url": {"type": "string", "description": "The http:// or https:// URL"}},
            "required": ["url"],
            "additionalProperties": false
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(cfg: &WebConfig, url: &str, addrs: &[&str]) -> Result<(), String> {
        let u = Url::parse(url).unwrap();
        let ips: Vec<IpAddr> = addrs.iter().map(|a| a.parse().unwrap()).collect();
        Policy::new(cfg).check(&u, &u.host().unwrap(), &ips)
    }

    #[test]
    fn web_policy_refuses_special_ranges_unless_the_url_names_an_allowed_host() {
        let none = WebConfig::default();
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "64:ff9b::a00:1",
        ] {
            assert!(
                check(&none, "http://example.com/", &[ip]).is_err(),
                "{ip} passed"
            );
        }
        assert!(check(&none, "http://example.com/", &["93.184.215.14"]).is_ok());
        // One bad address among good ones refuses the name.
        assert!(check(&none, "http://example.com/", &["93.184.215.14", "10.0.0.1"]).is_err());
        let allow = WebConfig {
            allow: vec!["127.0.0.1".into(), "wiki.corp".into()],
            deny: vec!["203.0.113.0/24".into(), "*.bad.example".into()],
            ..Default::default()
        };
        assert!(check(&allow, "http://127.0.0.1:8080/", &["127.0.0.1"]).is_ok());
        // An address rule never lets a name through: localhost stays refused.
        let e = check(&allow, "http://localhost:8080/", &["127.0.0.1"]).unwrap_err();
        assert!(
            e.contains("localhost resolves to 127.0.0.1, a loopback address"),
            "{e}"
        );
        assert!(check(&allow, "http://wiki.corp/", &["10.0.0.5"]).is_ok());
        assert!(check(&allow, "http://x.bad.example/", &["93.184.215.14"]).is_err());
        let e = check(&allow, "http://ok.example/", &["203.0.113.9"]).unwrap_err();
        assert!(e.contains("web.deny"), "{e}");
    }

    #[test]
    fn web_urls_must_be_http_with_a_host_and_no_credential() {
        assert!(matches!(
            parse_url("file:///etc/passwd"),
            Err(WebError::BadUrl(_))
        ));
        assert!(matches!(parse_url("not a url"), Err(WebError::BadUrl(_))));
        assert!(matches!(
            parse_url("http://u:p@example.com/"),
            Err(WebError::Refused(_))
        ));
        assert!(parse_url("https://example.com/a?b").is_ok());
    }
}
