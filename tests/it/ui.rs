//! The web dashboard (issue 27) over plain HTTP: the sign-in cookie and its
//! flags, one-time links, CSRF refusal, the security headers, and access
//! decided as the API decides it. The real browser runs in `ui_browser.rs`.

use reqwest::header::{CONTENT_SECURITY_POLICY, LOCATION, SET_COOKIE, X_CONTENT_TYPE_OPTIONS};
use reqwest::{redirect, Client, Method, StatusCode};

use crate::common::{HostOptions, TestHost};

/// A form body, as a browser sends it.
pub(crate) fn encoded<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs.iter().map(|(k, v)| (k.as_ref(), v.as_ref())))
        .finish()
}

pub(crate) fn no_redirects() -> Client {
    Client::builder()
        .redirect(redirect::Policy::none())
        .build()
        .unwrap()
}

/// Signs in with `token` through the form; the cookie pair (`name=value`).
pub(crate) async fn sign_in(host: &TestHost, http: &Client, token: &str) -> String {
    let r = http
        .post(format!("{}/ui/login", host.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(encoded(&[("token", token)]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()[LOCATION], "/ui/");
    let cookie = r.headers()[SET_COOKIE].to_str().unwrap().to_owned();
    cookie.split(';').next().unwrap().to_owned()
}

pub(crate) async fn get(
    host: &TestHost,
    http: &Client,
    path: &str,
    cookie: &str,
) -> (StatusCode, String) {
    let r = http
        .get(format!("{}{path}", host.url))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    let st = r.status();
    (st, r.text().await.unwrap())
}

/// Posts a form as the signed-in browser would; the status and the
/// redirect's target (empty when none).
pub(crate) async fn post_form(
    host: &TestHost,
    http: &Client,
    path: &str,
    cookie: &str,
    form: &[(&str, &str)],
) -> (StatusCode, String) {
    let r = http
        .post(format!("{}{path}", host.url))
        .header("cookie", cookie)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(encoded(form))
        .send()
        .await
        .unwrap();
    let to = r
        .headers()
        .get(LOCATION)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (r.status(), to)
}

/// The CSRF token the page's sign-out form carries.
pub(crate) fn csrf_of(html: &str) -> String {
    let at = html.find("name=\"csrf\" value=\"").expect("a csrf field") + 19;
    html[at..at + 32].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_sign_in_cookie_csrf_headers_and_access() {
    let host = TestHost::start(HostOptions::default()).await;
    let http = no_redirects();

    // Signed out: every page sends the browser to the sign-in page, which
    // carries the security headers.
    let r = http.get(format!("{}/ui/", host.url)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()[LOCATION], "/ui/login");
    let r = http
        .get(format!("{}/ui/login", host.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let csp = r.headers()[CONTENT_SECURITY_POLICY].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(r.headers()[X_CONTENT_TYPE_OPTIONS], "nosniff");

    // A wrong token, and a run-less adapter token, do not sign in.
    let r = http
        .post(format!("{}/ui/login", host.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(encoded(&[("token", "mrc_nope")]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(r.headers().get(SET_COOKIE).is_none());
    let adapter = host.adapter_token("adapter:x", "test").await;
    let r = http
        .post(format!("{}/ui/login", host.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(encoded(&[("token", adapter.as_str())]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);

    // The cookie: HttpOnly, SameSite=Strict, an expiry, Secure only behind TLS.
    let r = http
        .post(format!("{}/ui/login", host.url))
        .header("x-forwarded-proto", "https")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(encoded(&[("token", host.owner_token.as_str())]))
        .send()
        .await
        .unwrap();
    let set = r.headers()[SET_COOKIE].to_str().unwrap().to_owned();
    for flag in [
        "HttpOnly",
        "SameSite=Strict",
        "Max-Age=",
        "Secure",
        "Path=/ui",
    ] {
        assert!(set.contains(flag), "{flag} missing: {set}");
    }
    let cookie = sign_in(&host, &http, &host.owner_token).await;
    let plain = http
        .post(format!("{}/ui/login", host.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(encoded(&[("token", host.owner_token.as_str())]))
        .send()
        .await
        .unwrap();
    assert!(!plain.headers()[SET_COOKIE]
        .to_str()
        .unwrap()
        .contains("Secure"));

    let (st, html) = get(&host, &http, "/ui/", &cookie).await;
    assert_eq!(st, StatusCode::OK);
    assert!(html.contains("Overview"), "{html}");
    let csrf = csrf_of(&html);

    // A form without the CSRF token (or with another's) changes nothing.
    for form in [vec![], vec![("csrf", "0".repeat(32))]] {
        let r = http
            .post(format!("{}/ui/logout", host.url))
            .header("cookie", &cookie)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(encoded(&form))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
    }
    assert_eq!(get(&host, &http, "/ui/", &cookie).await.0, StatusCode::OK);

    // Space access is the API's: a space admin sees their space, and is
    // refused another's page (403) and finds it missing from the list.
    host.create_space("alpha").await;
    host.create_space("beta").await;
    let bob = host.token("api:bob", "user").await;
    host.grant("beta", "api:bob", "admin").await;
    let bob_cookie = sign_in(&host, &http, &bob).await;
    let (st, html) = get(&host, &http, "/ui/spaces/alpha", &bob_cookie).await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{html}");
    assert_eq!(
        get(&host, &http, "/ui/spaces/beta", &bob_cookie).await.0,
        StatusCode::OK
    );
    assert_eq!(
        get(&host, &http, "/ui/spaces/nosuch", &bob_cookie).await.0,
        StatusCode::FORBIDDEN,
        "a missing space answers like another's"
    );
    let (_, list) = get(&host, &http, "/ui/spaces", &bob_cookie).await;
    assert!(
        list.contains("/ui/spaces/beta") && !list.contains("/ui/spaces/alpha"),
        "{list}"
    );
    let (_, all) = get(&host, &http, "/ui/spaces?q=alp", &cookie).await;
    assert!(
        all.contains("/ui/spaces/alpha") && !all.contains("/ui/spaces/beta"),
        "{all}"
    );

    // The links graph, drawn on the server, and the audit: global admins only.
    host.link("beta", "alpha", "read").await;
    let (st, links) = get(&host, &http, "/ui/links", &cookie).await;
    assert_eq!(st, StatusCode::OK);
    let svg = &links[links.find("<svg").expect("an svg graph")..links.find("</svg>").unwrap()];
    assert_eq!(svg.matches("<line").count(), 1, "{svg}");
    assert!(
        svg.contains(">alpha</text>")
            && svg.contains(">beta</text>")
            && svg.contains(">read</text>"),
        "{svg}"
    );
    let (st, _) = get(&host, &http, "/ui/links?space=alpha", &cookie).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        get(&host, &http, "/ui/links", &bob_cookie).await.0,
        StatusCode::FORBIDDEN
    );

    // Sign-ins are listed and revocable; revoking the token ends them too.
    let (_, signins) = get(&host, &http, "/ui/signins", &cookie).await;
    assert!(signins.matches("<tr>").count() >= 3, "{signins}");
    let (st, v) = host.owner(Method::GET, "/api/tokens", None, None).await;
    assert_eq!(st, 200);
    let bob_id = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["caller_id"] == "api:bob")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (st, v) = host
        .owner(Method::DELETE, &format!("/api/tokens/{bob_id}"), None, None)
        .await;
    assert!(st == 200 || st == 204, "{st} {v}");
    assert_eq!(
        get(&host, &http, "/ui/spaces/beta", &bob_cookie).await.0,
        StatusCode::SEE_OTHER,
        "a sign-in outlived its revoked token"
    );

    // One-time links: made with a user token, good once.
    let r = http
        .post(format!("{}/ui/login-links", host.url))
        .bearer_auth(&host.owner_token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let path = r.json::<serde_json::Value>().await.unwrap()["path"]
        .as_str()
        .unwrap()
        .to_owned();
    let first = http
        .get(format!("{}{path}", host.url))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::SEE_OTHER);
    assert!(first.headers().get(SET_COOKIE).is_some());
    let again = http
        .get(format!("{}{path}", host.url))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::FORBIDDEN);
    assert!(again.headers().get(SET_COOKIE).is_none());
    let r = http
        .post(format!("{}/ui/login-links", host.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);

    // `mrctl ui login` prints a whole link on the URL it reached the host at.
    let out = host
        .mrctl(&host.owner_token, None)
        .args(["ui", "login"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8(out.stdout).unwrap();
    let link = printed.lines().next().unwrap().to_owned();
    assert!(
        link.starts_with(&format!("{}/ui/link/mrc_", host.url)),
        "{printed}"
    );
    let r = http.get(&link).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert!(r.headers()[SET_COOKIE]
        .to_str()
        .unwrap()
        .contains("HttpOnly"));

    // Sign out: the cookie stops working.
    let r = http
        .post(format!("{}/ui/logout", host.url))
        .header("cookie", &cookie)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(encoded(&[("csrf", csrf.as_str())]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert!(r.headers()[SET_COOKIE]
        .to_str()
        .unwrap()
        .contains("Max-Age=0"));
    assert_eq!(
        get(&host, &http, "/ui/", &cookie).await.0,
        StatusCode::SEE_OTHER
    );
    host.stop().await;
}
