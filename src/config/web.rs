//! The `web:` section: the egress policy and caps of the host's `web_fetch`
//! tool, and the rule syntax of `web.allow` / `web.deny`, checked at start-up
//! so a typo in a rule stops the host instead of silently widening it.
//!
//! Must never: accept a rule it cannot match exactly (a half-parsed CIDR, a
//! name with a port or a path), or decide a fetch (that is
//! `crate::extensions::web`, which applies these rules after DNS).

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// `web_fetch`'s policy and caps (docs/extensions.md, "web_fetch").
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WebConfig {
    /// Exceptions to the built-in refusal of loopback, link-local and
    /// private addresses: a host name (`wiki.corp`, `*.corp.example`) lets
    /// that name through whatever it resolves to; an address or CIDR range
    /// (`127.0.0.1`, `10.0.0.0/8`) lets a URL that names such an address
    /// literally. A name is never let through because of an address rule.
    pub allow: Vec<String>,
    /// Refused whatever else holds: host names (as above) and addresses or
    /// ranges, matched against every address a name resolves to.
    pub deny: Vec<String>,
    /// Bytes of one response body read at most; the rest is cut off.
    pub max_bytes: usize,
    /// Seconds one fetch may take, redirects, DNS and body included.
    pub timeout_secs: u64,
    /// Redirects followed at most (each one checked like the first URL).
    pub max_redirects: u32,
    /// What one fetch costs, in the deployment's currency: charged to the
    /// space's budget like a model call (0: counted, free).
    pub fetch_cost: f64,
}

impl Default for WebConfig {
    fn default() -> Self {
        Self {
            allow: Vec::new(),
            deny: Vec::new(),
            max_bytes: 2 << 20,
            timeout_secs: 20,
            max_redirects: 5,
            fetch_cost: 0.0,
        }
    }
}

/// One `web.allow` / `web.deny` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebRule {
    /// A host name, lower-case; `*.example.com` matches every name below
    /// `example.com` (not the name itself).
    Name(String),
    /// An address range: the network and its prefix length.
    Net(IpAddr, u8),
}

impl WebRule {
    /// Parses one entry; the message says what is wrong with it.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let s = raw.trim();
        if s.is_empty() {
            return Err("an empty rule".into());
        }
        if let Some((ip, len)) = s.split_once('/') {
            let ip: IpAddr = ip
                .parse()
                .map_err(|_| format!("{raw:?}: {ip:?} is not an IP address"))?;
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let len: u8 = len
                .parse()
                .ok()
                .filter(|l| *l <= max)
                .ok_or_else(|| format!("{raw:?}: the prefix length must be 0-{max}"))?;
            return Ok(WebRule::Net(ip, len));
        }
        if let Ok(ip) = s
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            return Ok(WebRule::Net(ip, if ip.is_ipv4() { 32 } else { 128 }));
        }
        let name = s.to_ascii_lowercase();
        let bare = name.strip_prefix("*.").unwrap_or(&name);
        let ok = !bare.is_empty()
            && bare.len() <= 253
            && bare.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            });
        if !ok {
            return Err(format!(
                "{raw:?} is neither a host name (a-z, 0-9, '-', dots; '*.' in front for every name below), an IP address nor a CIDR range"
            ));
        }
        Ok(WebRule::Name(name))
    }

    /// Whether this rule names `host` (a lower-case host name).
    pub fn names(&self, host: &str) -> bool {
        match self {
            WebRule::Name(n) => match n.strip_prefix("*.") {
                Some(parent) => host
                    .strip_suffix(parent)
                    .is_some_and(|rest| rest.ends_with('.') && rest.len() > 1),
                None => n == host,
            },
            WebRule::Net(..) => false,
        }
    }

    /// Whether this rule's range holds `ip` (an IPv4-mapped IPv6 address is
    /// matched as the IPv4 address it carries).
    pub fn holds(&self, ip: IpAddr) -> bool {
        let WebRule::Net(net, len) = self else {
            return false;
        };
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = if *len == 0 {
                    0
                } else {
                    u32::MAX << (32 - u32::from(*len))
                };
                u32::from(*n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = if *len == 0 {
                    0
                } else {
                    u128::MAX << (128 - u32::from(*len))
                };
                u128::from(*n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl WebConfig {
    /// Checks every key; `Err((key, why))`.
    pub fn check(&self) -> Result<(), (String, String)> {
        for (key, list) in [("web.allow", &self.allow), ("web.deny", &self.deny)] {
            for r in list {
                WebRule::parse(r).map_err(|why| (key.to_owned(), why))?;
            }
        }
        if !(1024..=(64 << 20)).contains(&self.max_bytes) {
            return Err((
                "web.max_bytes".into(),
                "must be between 1024 and 67108864".into(),
            ));
        }
        if !(1..=300).contains(&self.timeout_secs) {
            return Err(("web.timeout_secs".into(), "must be 1-300 seconds".into()));
        }
        if self.max_redirects > 20 {
            return Err(("web.max_redirects".into(), "must be 0-20".into()));
        }
        if !(self.fetch_cost.is_finite() && (0.0..=1e6).contains(&self.fetch_cost)) {
            return Err((
                "web.fetch_cost".into(),
                "must be an amount between 0 and 1000000".into(),
            ));
        }
        Ok(())
    }

    /// The parsed rules (entries were checked at start-up; one that does
    /// not parse here is left out of `allow` and kept out by `deny`'s caller).
    pub fn rules(list: &[String]) -> Vec<WebRule> {
        list.iter().filter_map(|r| WebRule::parse(r).ok()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn web_rules_parse_names_addresses_and_ranges() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let r = WebRule::parse("10.0.0.0/8").unwrap();
        assert!(r.holds(ip("10.9.8.7")) && !r.holds(ip("11.0.0.1")));
        assert!(r.holds(ip("::ffff:10.1.1.1")));
        let one = WebRule::parse("127.0.0.1").unwrap();
        assert!(one.holds(ip("127.0.0.1")) && !one.holds(ip("127.0.0.2")));
        assert!(!one.names("localhost"));
        let v6 = WebRule::parse("fc00::/7").unwrap();
        assert!(v6.holds(ip("fd12::1")) && !v6.holds(ip("2001:db8::1")));
        let star = WebRule::parse("*.Corp.Example").unwrap();
        assert!(star.names("wiki.corp.example") && !star.names("corp.example"));
        assert!(!star.names("evilcorp.example"));
        assert!(WebRule::parse("wiki.corp").unwrap().names("wiki.corp"));
        for bad in [
            "",
            "10.0.0.0/33",
            "x/8",
            "http://a",
            "a b",
            "host:80",
            "a..b",
        ] {
            assert!(WebRule::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn web_config_check_names_the_key() {
        let c = WebConfig {
            deny: vec!["10.0.0.0/99".into()],
            ..Default::default()
        };
        assert_eq!(c.check().unwrap_err().0, "web.deny");
        assert!(WebConfig::default().check().is_ok());
    }
}
