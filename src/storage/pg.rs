//! The PostgreSQL backend: a deadpool of tokio-postgres clients driven by a
//! small runtime of the store's own, so storage's synchronous closures (run
//! on the writer thread and on blocking threads) can wait on the server.
//!
//! Owns the `?N` → `$N` rewrite, the mapping of PostgreSQL's column types to
//! [`Cell`]s and of [`Param`]s to its wire types, and the TLS set-up
//! (`sslmode` `disable`, `prefer`, `require` as libpq means them, plus
//! `verify-full` against `sslrootcert`).
//!
//! Must never: block a thread of the host's async runtime (every call here
//! runs on the writer thread, a blocking thread or a thread of its own), or
//! return a connection to the pool inside an open transaction.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use tokio_postgres::types::{IsNull, ToSql, Type};

use super::conn::{Cell, Param};
use super::{StoreError, StoreResult};

/// Connections the pool keeps at most (the writer's one and the readers').
const POOL_SIZE: usize = 16;
/// Statements kept prepared per connection before the cache is emptied
/// (a few statements are built with a variable number of placeholders).
const STATEMENT_CACHE: usize = 512;

/// The pool and the runtime its connections' tasks run on.
pub(crate) struct PgBackend {
    runtime: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
    pool: Pool,
    /// What the operator named (the URL without its password), for messages.
    pub(crate) display: String,
    /// How the pool connects, kept for the one connection `LISTEN` needs
    /// (a pooled client cannot be watched for notifications).
    config: Box<tokio_postgres::Config>,
    tls: tokio_postgres_rustls::MakeRustlsConnect,
}

impl Drop for PgBackend {
    fn drop(&mut self) {
        // Dropping a runtime blocks; the last store may go in async code.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// One pooled client, usable from a thread that may block.
pub(crate) struct PgConn {
    client: Object,
    handle: tokio::runtime::Handle,
}

fn unavailable(display: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!(
        "the PostgreSQL server at {display} cannot be reached: {e}"
    ))
}

/// The URL with its password replaced, safe to print.
pub(crate) fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            let pairs: Vec<(String, String)> = u
                .query_pairs()
                .map(|(k, v)| {
                    let v = if k == "password" {
                        "***".into()
                    } else {
                        v.into_owned()
                    };
                    (k.into_owned(), v)
                })
                .collect();
            if !pairs.is_empty() {
                u.query_pairs_mut().clear().extend_pairs(pairs);
            }
            u.to_string()
        }
        Err(_) => "(an unparsable storage.url)".into(),
    }
}

/// TLS as `sslmode` asks: `verify-full` checks the server's certificate
/// against `sslrootcert` and its name; `prefer` and `require` encrypt
/// without checking it, as libpq does.
struct TlsChoice {
    url: String,
    verify_with: Option<String>,
}

fn tls_choice(url: &str) -> StoreResult<TlsChoice> {
    let Ok(mut u) = url::Url::parse(url) else {
        return Ok(TlsChoice {
            url: url.to_owned(),
            verify_with: None,
        });
    };
    let mut verify = false;
    let mut root = None;
    let mut kept = Vec::new();
    for (k, v) in u.query_pairs() {
        match (k.as_ref(), v.as_ref()) {
            ("sslmode", "verify-full" | "verify-ca") => verify = true,
            ("sslrootcert", path) => root = Some(path.to_owned()),
            _ => kept.push((k.into_owned(), v.into_owned())),
        }
    }
    if verify {
        kept.push(("sslmode".into(), "require".into()));
    }
    if verify && root.is_none() {
        return Err(StoreError::Invalid(
            "sslmode=verify-full needs sslrootcert=PATH (the certificate of the authority that signed the server's)".into(),
        ));
    }
    u.query_pairs_mut().clear().extend_pairs(kept);
    let mut s = u.to_string();
    if s.ends_with('?') {
        s.pop();
    }
    Ok(TlsChoice {
        url: s,
        verify_with: if verify { root } else { None },
    })
}

#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn tls_config(verify_with: Option<&str>) -> StoreResult<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Invalid(format!("TLS set-up: {e}")))?;
    Ok(match verify_with {
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in rustls::pki_types::CertificateDer::pem_file_iter(path)
                .map_err(|e| StoreError::Invalid(format!("reading sslrootcert {path}: {e}")))?
            {
                let cert = cert
                    .map_err(|e| StoreError::Invalid(format!("reading sslrootcert {path}: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| StoreError::Invalid(format!("sslrootcert {path}: {e}")))?;
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_no_client_auth(),
    })
}

impl PgBackend {
    /// Connects (once, to check the server answers) and keeps the pool.
    /// Runs on a thread of its own: the caller may be on the async runtime.
    /// `then` runs on that thread too (the migrations).
    pub(crate) fn connect(
        url: &str,
        password: Option<String>,
        then: impl FnOnce(&PgBackend) -> StoreResult<()> + Send,
    ) -> StoreResult<PgBackend> {
        let display = redact_url(url);
        let url = url.to_owned();
        std::thread::scope(|s| {
            s.spawn(move || {
                let backend = Self::connect_here(&url, password, display)?;
                then(&backend)?;
                Ok(backend)
            })
            .join()
            .map_err(|_| StoreError::Join("the PostgreSQL connect thread panicked".into()))?
        })
    }

    fn connect_here(
        url: &str,
        password: Option<String>,
        display: String,
    ) -> StoreResult<PgBackend> {
        let choice = tls_choice(url)?;
        let mut config: tokio_postgres::Config = choice
            .url
            .parse()
            .map_err(|e| StoreError::Invalid(format!("storage.url: {e}")))?;
        if let Some(p) = password {
            config.password(p);
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(5));
        }
        config.application_name("mercury");
        let tls = tokio_postgres_rustls::MakeRustlsConnect::new(tls_config(
            choice.verify_with.as_deref(),
        )?);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("mercury-postgres")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Join(format!("cannot start the PostgreSQL runtime: {e}")))?;
        let manager = Manager::from_config(
            config.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(10)))
            .create_timeout(Some(Duration::from_secs(5)))
            .recycle_timeout(Some(Duration::from_secs(5)))
            .build()
            .map_err(|e| StoreError::Invalid(format!("storage.url: {e}")))?;
        let handle = runtime.handle().clone();
        let backend = PgBackend {
            runtime: Some(runtime),
            handle,
            pool,
            display,
            config: Box::new(config),
            tls,
        };
        backend.get()?;
        Ok(backend)
    }

    /// The payloads of `NOTIFY channel` from now on, on a connection of its
    /// own, opened again whenever it drops (a server restart): a
    /// notification sent while it was down is lost, so a listener must
    /// have another way to find the work (the hosts poll).
    pub(crate) fn listen(&self, channel: &str) -> tokio::sync::mpsc::UnboundedReceiver<String> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (config, tls, server) = (self.config.clone(), self.tls.clone(), self.display.clone());
        let listen = format!("LISTEN \"{}\"", channel.replace('"', ""));
        self.handle.spawn(async move {
            use futures_util::StreamExt;
            while !tx.is_closed() {
                match config.connect(tls.clone()).await {
                    Ok((client, mut connection)) => {
                        let mut messages =
                            futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
                        let forward = async {
                            while let Some(message) = messages.next().await {
                                match message {
                                    Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                                        if tx.send(n.payload().to_owned()).is_err() {
                                            return;
                                        }
                                    }
                                    Ok(_) => {}
                                    Err(e) => {
                                        tracing::warn!(at = %server, error = %e, "the notification connection dropped");
                                        return;
                                    }
                                }
                            }
                        };
                        // The connection is driven by `forward`; the command
                        // goes out on it once it is polled.
                        let subscribe = async {
                            if let Err(e) = client.batch_execute(&listen).await {
                                tracing::warn!(at = %server, error = %e, "LISTEN failed");
                            }
                            std::future::pending::<()>().await;
                        };
                        tokio::select! {
                            _ = forward => {}
                            _ = subscribe => {}
                        }
                    }
                    Err(e) => {
                        tracing::warn!(at = %server, error = %e, "cannot open the notification connection");
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        rx
    }

    /// A client from the pool (a new connection if the server restarted).
    pub(crate) fn get(&self) -> StoreResult<PgConn> {
        let client =
            block(&self.handle, self.pool.get()).map_err(|e| unavailable(&self.display, e))?;
        if client.statement_cache.size() > STATEMENT_CACHE {
            client.statement_cache.clear();
        }
        Ok(PgConn {
            client,
            handle: self.handle.clone(),
        })
    }
}

thread_local! {
    /// Set while a thread may block on the pool's runtime although it has a
    /// runtime's context: the store's own blocking reads (`Store::read`'s
    /// blocking task).
    static MAY_BLOCK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with this thread marked as one where a statement may block on
/// the pool's runtime directly.
pub(super) fn blocking_here<T>(f: impl FnOnce() -> T) -> T {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            MAY_BLOCK.with(|m| m.set(self.0));
        }
    }
    let _reset = Reset(MAY_BLOCK.with(|m| m.replace(true)));
    f()
}

/// Waits for `fut` on the pool's runtime. A thread that drives async tasks
/// must not block on a runtime (tokio panics): from such a thread (a
/// synchronous read called from async code) the wait moves to a thread of
/// its own, so no caller can make storage panic.
fn block<F>(handle: &tokio::runtime::Handle, fut: F) -> F::Output
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    let direct =
        MAY_BLOCK.with(std::cell::Cell::get) || tokio::runtime::Handle::try_current().is_err();
    if direct {
        return handle.block_on(fut);
    }
    std::thread::scope(|s| match s.spawn(|| handle.block_on(fut)).join() {
        Ok(out) => out,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

impl PgConn {
    /// Drops the connection instead of returning it to the pool (its
    /// transaction state is unknown).
    pub(crate) fn discard(self) {
        let _ = Object::take(self.client);
    }

    async fn statement(&self, sql: &str) -> StoreResult<tokio_postgres::Statement> {
        let sql = translate(sql);
        Ok(self.client.prepare_cached(&sql).await?)
    }

    fn params<'a>(params: &'a [Param<'a>]) -> Vec<&'a (dyn ToSql + Sync)> {
        params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
    }

    pub(crate) fn execute(&self, sql: &str, params: &[Param<'_>]) -> StoreResult<usize> {
        block(&self.handle, async {
            let st = self.statement(sql).await?;
            let n = self.client.execute(&st, &Self::params(params)).await?;
            Ok(usize::try_from(n).unwrap_or(usize::MAX))
        })
    }

    pub(crate) fn query(
        &self,
        sql: &str,
        params: &[Param<'_>],
    ) -> StoreResult<Vec<tokio_postgres::Row>> {
        block(&self.handle, async {
            let st = self.statement(sql).await?;
            Ok(self.client.query(&st, &Self::params(params)).await?)
        })
    }

    pub(crate) fn query_opt(
        &self,
        sql: &str,
        params: &[Param<'_>],
    ) -> StoreResult<Option<tokio_postgres::Row>> {
        Ok(self.query(sql, params)?.into_iter().next())
    }

    pub(crate) fn batch(&self, sql: &str) -> StoreResult<()> {
        block(&self.handle, async {
            Ok(self.client.batch_execute(sql).await?)
        })
    }

    pub(crate) fn columns(&self, sql: &str) -> StoreResult<Vec<String>> {
        block(&self.handle, async {
            let st = self.statement(sql).await?;
            Ok(st.columns().iter().map(|c| c.name().to_owned()).collect())
        })
    }
}

/// Rewrites `?N` (and a bare `?`) placeholders to PostgreSQL's `$N`, drops
/// SQLite's `INDEXED BY name` planner hint, and spells SQLite's null-safe
/// comparisons PostgreSQL's way; quoted text is left alone.
pub(crate) fn translate(sql: &str) -> Cow<'_, str> {
    match placeholders(sql) {
        Cow::Borrowed(s) => Cow::Borrowed(s),
        Cow::Owned(s) => Cow::Owned(null_safe(s)),
    }
}

/// `x IS $1` / `x IS NOT $1` are `IS [NOT] DISTINCT FROM`; and in
/// `($1 IS NULL OR col = $1)` the comparison goes first, because PostgreSQL
/// takes a placeholder's type from its first use and `$1 IS NULL` gives none.
fn null_safe(sql: String) -> String {
    use std::sync::LazyLock;
    type Pattern = LazyLock<Option<regex::Regex>>;
    static IS_NOT: Pattern = LazyLock::new(|| regex::Regex::new(r"\bIS NOT (\$\d+)").ok());
    static IS: Pattern = LazyLock::new(|| regex::Regex::new(r"\bIS (\$\d+)").ok());
    static EITHER: Pattern = LazyLock::new(|| {
        regex::Regex::new(r"\((\$\d+) IS NULL OR ([A-Za-z_][A-Za-z0-9_.]*) = (\$\d+)\)").ok()
    });
    // The patterns are constants (a unit test runs them); a failed build of
    // one leaves the text as it is.
    let (Some(is_not), Some(is), Some(either)) = (&*IS_NOT, &*IS, &*EITHER) else {
        return sql;
    };
    if !sql.contains(" IS ") {
        return sql;
    }
    let sql = is_not.replace_all(&sql, "IS DISTINCT FROM $1");
    let sql = is.replace_all(&sql, "IS NOT DISTINCT FROM $1");
    either
        .replace_all(&sql, |c: &regex::Captures<'_>| {
            if c[1] == c[3] {
                format!("({} = {} OR {} IS NULL)", &c[2], &c[1], &c[1])
            } else {
                c[0].to_owned()
            }
        })
        .into_owned()
}

fn placeholders(sql: &str) -> Cow<'_, str> {
    if !sql.contains('?') && !sql.contains("INDEXED BY") {
        return Cow::Borrowed(sql);
    }
    let mut out = String::with_capacity(sql.len() + 8);
    let mut chars = sql.char_indices().peekable();
    let mut next_bare = 1;
    let mut quote: Option<char> = None;
    while let Some((i, c)) = chars.next() {
        if let Some(q) = quote {
            out.push(c);
            if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '\'' | '"' => {
                quote = Some(c);
                out.push(c);
            }
            '?' => {
                let mut digits = String::new();
                while let Some(&(_, d)) = chars.peek() {
                    if d.is_ascii_digit() {
                        digits.push(d);
                        chars.next();
                    } else {
                        break;
                    }
                }
                out.push('$');
                if digits.is_empty() {
                    out.push_str(&next_bare.to_string());
                    next_bare += 1;
                } else {
                    out.push_str(&digits);
                }
            }
            'I' if sql[i..].starts_with("INDEXED BY ") => {
                // Skip the hint and the index name after it.
                let rest = &sql[i + "INDEXED BY ".len()..];
                let name_len = rest
                    .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
                    .unwrap_or(rest.len());
                // And the space after it, so the text reads as it did.
                let space = usize::from(rest[name_len..].starts_with(' '));
                let skip = "INDEXED BY ".len() + name_len + space;
                while let Some(&(j, _)) = chars.peek() {
                    if j < i + skip {
                        chars.next();
                    } else {
                        break;
                    }
                }
            }
            _ => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Reads column `idx` of a PostgreSQL row as a [`Cell`].
pub(crate) fn cell<T>(
    row: &tokio_postgres::Row,
    idx: usize,
    convert: impl FnOnce(Cell<'_>) -> StoreResult<T>,
) -> StoreResult<T> {
    let Some(column) = row.columns().get(idx) else {
        return Err(StoreError::Column(format!("no column {idx}")));
    };
    let ty = column.type_().clone();
    let cell = match ty {
        Type::INT8 => row.try_get::<_, Option<i64>>(idx)?.map(Cell::Int),
        Type::INT4 => row
            .try_get::<_, Option<i32>>(idx)?
            .map(|v| Cell::Int(v.into())),
        Type::INT2 => row
            .try_get::<_, Option<i16>>(idx)?
            .map(|v| Cell::Int(v.into())),
        Type::OID => row
            .try_get::<_, Option<u32>>(idx)?
            .map(|v| Cell::Int(v.into())),
        Type::BOOL => row
            .try_get::<_, Option<bool>>(idx)?
            .map(|v| Cell::Int(v.into())),
        Type::FLOAT8 => row.try_get::<_, Option<f64>>(idx)?.map(Cell::Real),
        Type::FLOAT4 => row
            .try_get::<_, Option<f32>>(idx)?
            .map(|v| Cell::Real(v.into())),
        // SUM and AVG of integers are NUMERIC on PostgreSQL: an integer when
        // it has no fractional digits, as SQLite gives it.
        Type::NUMERIC => row.try_get::<_, Option<Numeric>>(idx)?.map(|n| n.0),
        Type::BYTEA => {
            return convert(match row.try_get::<_, Option<&[u8]>>(idx)? {
                Some(b) => Cell::Blob(b),
                None => Cell::Null,
            })
        }
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
            return convert(match row.try_get::<_, Option<&str>>(idx)? {
                Some(t) => Cell::Text(t),
                None => Cell::Null,
            })
        }
        other => {
            return Err(StoreError::Column(format!(
                "column {idx} ({}) has the type {other}, which storage does not read",
                column.name()
            )))
        }
    };
    convert(cell.unwrap_or(Cell::Null))
}

/// A NUMERIC read from its binary form (base-10000 digits).
struct Numeric(Cell<'static>);

impl<'a> tokio_postgres::types::FromSql<'a> for Numeric {
    fn from_sql(
        _ty: &Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let word = |i: usize| -> Result<u16, Box<dyn std::error::Error + Sync + Send>> {
            raw.get(i..i + 2)
                .map(|b| u16::from_be_bytes([b[0], b[1]]))
                .ok_or_else(|| "a NUMERIC shorter than its header".into())
        };
        let ndigits = usize::from(word(0)?);
        let weight = i32::from(word(2)? as i16);
        let sign = word(4)?;
        let dscale = word(6)?;
        if sign == 0xC000 {
            return Ok(Numeric(Cell::Real(f64::NAN)));
        }
        let mut int: Option<i64> = Some(0);
        let mut real = 0f64;
        for i in 0..ndigits {
            let d = i64::from(word(8 + 2 * i)?);
            let power = weight - i as i32;
            real += d as f64 * 10000f64.powi(power);
            int = match (int, power) {
                (Some(acc), p) if p >= 0 => 10000i64
                    .checked_pow(p as u32)
                    .and_then(|m| d.checked_mul(m))
                    .and_then(|v| acc.checked_add(v)),
                (Some(acc), _) if d == 0 => Some(acc),
                _ => None,
            };
        }
        let negative = sign == 0x4000;
        Ok(Numeric(match int {
            Some(v) if dscale == 0 => Cell::Int(if negative { -v } else { v }),
            _ => Cell::Real(if negative { -real } else { real }),
        }))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::NUMERIC
    }
}

impl ToSql for Param<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        // The server infers each placeholder's type from where it stands;
        // SQLite would take any value anywhere, so convert where it is exact.
        match *self {
            Param::Null => Ok(IsNull::Yes),
            Param::Int(v) => match *ty {
                Type::INT8 => v.to_sql(ty, out),
                Type::INT4 => i32::try_from(v)?.to_sql(ty, out),
                Type::INT2 => i16::try_from(v)?.to_sql(ty, out),
                Type::BOOL => (v != 0).to_sql(ty, out),
                Type::FLOAT8 => (v as f64).to_sql(ty, out),
                Type::FLOAT4 => (v as f32).to_sql(ty, out),
                Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                    v.to_string().as_str().to_sql(ty, out)
                }
                _ => Err(format!("an integer cannot be bound to a {ty} placeholder").into()),
            },
            Param::Real(v) => match *ty {
                Type::FLOAT8 => v.to_sql(ty, out),
                Type::FLOAT4 => (v as f32).to_sql(ty, out),
                _ => Err(format!("a real cannot be bound to a {ty} placeholder").into()),
            },
            Param::Text(v) => match *ty {
                Type::INT8 => v.parse::<i64>()?.to_sql(ty, out),
                _ => v.to_sql(ty, out),
            },
            Param::Blob(v) => v.to_sql(ty, out),
        }
    }

    fn accepts(_ty: &Type) -> bool {
        true
    }

    tokio_postgres::types::to_sql_checked!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_become_numbered_and_quoted_text_is_kept() {
        assert_eq!(
            translate("SELECT a FROM t WHERE b = ?1 AND c = '?2' AND d = ?12"),
            "SELECT a FROM t WHERE b = $1 AND c = '?2' AND d = $12"
        );
        assert_eq!(translate("VALUES (?, ?)"), "VALUES ($1, $2)");
        assert_eq!(
            translate("FROM messages INDEXED BY messages_pending WHERE x = ?1"),
            "FROM messages WHERE x = $1"
        );
        assert!(matches!(translate("SELECT 1"), Cow::Borrowed(_)));
        assert_eq!(
            translate("WHERE a IS ?3 AND b IS NOT ?2 AND (?1 IS NULL OR c.d = ?1) AND e IS NULL"),
            "WHERE a IS NOT DISTINCT FROM $3 AND b IS DISTINCT FROM $2 AND (c.d = $1 OR $1 IS NULL) AND e IS NULL"
        );
    }

    #[test]
    fn a_printed_url_hides_its_password() {
        let shown = redact_url("postgres://mercury:s3cret@db.example:5432/mercury?sslmode=require");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("db.example"), "{shown}");
        let shown = redact_url("postgres://db.example/m?password=s3cret");
        assert!(!shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn verify_full_needs_a_root_certificate_and_keeps_the_rest_of_the_url() {
        assert!(tls_choice("postgres://h/db?sslmode=verify-full").is_err());
        let c =
            tls_choice("postgres://h/db?sslmode=verify-full&sslrootcert=/r.pem&connect_timeout=3")
                .unwrap();
        assert_eq!(c.verify_with.as_deref(), Some("/r.pem"));
        assert!(c.url.contains("sslmode=require") && c.url.contains("connect_timeout=3"));
        assert!(!c.url.contains("sslrootcert"));
    }
}
