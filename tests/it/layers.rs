//! The module layers run one way (issue 13): a top-level module of `src/`
//! imports only from the layers below its own. Read from the source itself:
//! every `crate::X` path (and every name of a `crate::{…}` group) outside
//! the `#[cfg(test)]` module at the end of a file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top to bottom; a module may import from any row below its own, never
/// from its own row or above. The binaries (`src/bin`) sit above all.
const LAYERS: &[&[&str]] = &[
    &["cli"],
    &["bench"],
    &["host"],
    &["api", "ui"],
    // An in-process adapter calls ingress, so it sits one row above it.
    &["adapters"],
    &["ingress"],
    &["app"],
    &["actors"],
    &["agent", "review", "shadow"],
    // Extensions: manifests, and the MCP calls a turn makes.
    &["extensions"],
    &["links", "perms", "redaction", "runtime"],
    // Prices, caps and the one seam every model call passes through.
    &["spend", "cluster"],
    &["model", "sandbox", "storage", "client", "workspace"],
    &["config"],
    &["ids", "clock", "schedule", "telemetry"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|row| row.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its test module and its comments.
fn code_of(text: &str) -> String {
    let cut = text
        .find("#[cfg(test)]\nmod ")
        .or_else(|| text.find("#[cfg(test)]\npub mod "))
        .unwrap_or(text.len());
    text[..cut]
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules named by `crate::` paths in `code`.
fn imported(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let name = ident(part.trim());
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

#[test]
fn imports_run_one_way_down_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut unknown = BTreeSet::new();
    let mut upward: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut checked = 0;
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src");
        let top = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .map(|s| s.trim_end_matches(".rs").to_owned())
            .expect("a name");
        if top == "bin" || top == "lib" {
            continue;
        }
        let Some(own) = layer_of(&top) else {
            unknown.insert(top);
            continue;
        };
        let text = std::fs::read_to_string(file).expect("read");
        for dep in imported(&code_of(&text)) {
            if dep == top {
                continue;
            }
            checked += 1;
            match layer_of(&dep) {
                None => {
                    unknown.insert(dep);
                }
                Some(layer) if layer <= own => {
                    upward
                        .entry(format!("{top} -> {dep}"))
                        .or_default()
                        .insert(rel.display().to_string());
                }
                Some(_) => {}
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "modules missing from the layer table: {unknown:?}"
    );
    assert!(
        upward.is_empty(),
        "imports that run up (or across) the layers: {upward:#?}"
    );
    println!("{checked} imports checked across {} files", files.len());
    assert!(checked > 50, "the scan found almost no imports: {checked}");
}

#[test]
fn the_scanner_sees_paths_groups_and_skips_tests_and_comments() {
    let code = code_of(
        "use crate::a::b;\nuse crate::{c, d::e};\nfn f() { crate::g::h(); } // crate::x\n\
         #[cfg(test)]\nmod tests { use crate::y; }\n",
    );
    assert_eq!(
        imported(&code),
        ["a", "c", "d", "g"]
            .iter()
            .map(std::string::ToString::to_string)
            .collect()
    );
}

/// The database driver's crate name, spelled so this file does not name it.
const DRIVER: &str = concat!("rus", "qlite");

/// Statement keywords a SQL string begins with (case-sensitive, as SQL is
/// written in this tree).
const SQL_KEYWORDS: &[&str] = &[
    "SELECT", "INSERT", "UPDATE", "DELETE", "CREATE", "PRAGMA", "WITH", "ALTER", "DROP", "ATTACH",
    "VACUUM", "BEGIN",
];

/// Keywords that make a whole statement alone (`"VACUUM"`); the others need
/// more after them, so an HTTP method `"DELETE"` is not a statement.
const SQL_ALONE: &[&str] = &["VACUUM", "BEGIN"];

/// Every string literal of `text` (plain, raw and byte strings) with the
/// line it starts on. Comments and char literals are skipped; a lifetime is
/// told from a char literal by its missing closing quote.
fn string_literals(text: &str) -> Vec<(usize, String)> {
    let b = text.as_bytes();
    let (mut i, mut line, mut out) = (0, 1, Vec::new());
    let count_lines = |s: &[u8]| s.iter().filter(|c| **c == b'\n').count();
    while i < b.len() {
        match b[i] {
            b'\n' => {
                line += 1;
                i += 1;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let end = text[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
                line += count_lines(&b[i..end]);
                i = end;
            }
            b'\'' => {
                // 'x' or '\n' / '\u{..}' is a char literal; 'a (no closing quote) a lifetime.
                if b.get(i + 1) == Some(&b'\\') {
                    let end = text[i + 2..].find('\'').map_or(b.len(), |e| i + 2 + e + 1);
                    i = end;
                } else {
                    let ch_len = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                    if b.get(i + 1 + ch_len) == Some(&b'\'') {
                        i += ch_len + 2;
                    } else {
                        i += 1;
                    }
                }
            }
            b'r' | b'b' if prefixed_string(b, i).is_some() => {
                let (raw, hashes, quote) = prefixed_string(b, i).unwrap_or_default();
                if raw {
                    let close = format!("\"{}", "#".repeat(hashes));
                    let end = text[quote + 1..]
                        .find(&close)
                        .map_or(b.len(), |e| quote + 1 + e);
                    out.push((line, text[quote + 1..end].to_owned()));
                    line += count_lines(&b[i..end]);
                    i = (end + close.len()).min(b.len());
                } else {
                    let (lit, end) = plain_string(text, quote);
                    out.push((line, lit));
                    line += count_lines(&b[i..end]);
                    i = end;
                }
            }
            b'"' => {
                let (lit, end) = plain_string(text, i);
                out.push((line, lit));
                line += count_lines(&b[i..end]);
                i = end;
            }
            _ => i += 1,
        }
    }
    out
}

/// A string literal with a prefix at `i` (`r"`, `r#"`, `b"`, `br#"`):
/// whether it is raw, its `#` count and where its opening quote is.
fn prefixed_string(b: &[u8], i: usize) -> Option<(bool, usize, usize)> {
    if i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_') {
        return None;
    }
    let mut j = i + 1;
    let raw = b[i] == b'r' || b.get(j) == Some(&b'r');
    if b[i] == b'b' && raw {
        j += 1;
    }
    let hashes = if raw {
        b[j..].iter().take_while(|c| **c == b'#').count()
    } else {
        0
    };
    j += hashes;
    (b.get(j) == Some(&b'"')).then_some((raw, hashes, j))
}

/// The literal opening at the quote `at`, with escapes left as written, and
/// the index after its closing quote.
fn plain_string(text: &str, at: usize) -> (String, usize) {
    let b = text.as_bytes();
    let mut i = at + 1;
    while i < b.len() && b[i] != b'"' {
        i += if b[i] == b'\\' { 2 } else { 1 };
    }
    (
        text[at + 1..i.min(b.len())].to_owned(),
        (i + 1).min(b.len()),
    )
}

/// The statement a literal begins with, if it begins with one: a keyword
/// after any leading whitespace (and `\` line continuations), followed by
/// whitespace or `;` (or the literal's end, for a keyword that is a
/// statement alone).
fn sql_start(literal: &str) -> Option<&str> {
    let mut rest = literal;
    loop {
        let t = rest.trim_start();
        let t = t
            .strip_prefix("\\n")
            .or_else(|| t.strip_prefix('\\'))
            .unwrap_or(t);
        if t.len() == rest.len() {
            break;
        }
        rest = t;
    }
    SQL_KEYWORDS
        .iter()
        .any(|k| {
            rest.strip_prefix(k)
                .is_some_and(|after| match after.chars().next() {
                    None => SQL_ALONE.contains(k),
                    Some(c) => c.is_whitespace() || c == ';' || after.starts_with("\\n"),
                })
        })
        .then_some(rest)
}

fn is_sql(literal: &str) -> bool {
    sql_start(literal).is_some()
}

#[test]
fn sql_and_the_driver_live_only_in_storage() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let storage = root.join("src").join("storage");
    let mut src = Vec::new();
    rust_files(&root.join("src"), &mut src);
    src.retain(|f| !f.starts_with(&storage));
    src.push(root.join("build.rs"));
    let mut tests = Vec::new();
    rust_files(&root.join("tests"), &mut tests);
    let fixture = root.join("tests").join("it").join("common.rs");

    let mut offences = Vec::new();
    let mut literals = 0;
    for file in src.iter().chain(&tests) {
        let text = std::fs::read_to_string(file).expect("read");
        let rel = file.strip_prefix(root).expect("under the crate");
        for (n, l) in text.lines().enumerate() {
            if l.contains(DRIVER) {
                offences.push(format!(
                    "{}:{}: names {DRIVER}: {}",
                    rel.display(),
                    n + 1,
                    l.trim()
                ));
            }
        }
        if src.contains(file) || *file == fixture {
            for (line, lit) in string_literals(&text) {
                literals += 1;
                if let Some(sql) = sql_start(&lit) {
                    let first = sql.lines().next().unwrap_or_default();
                    offences.push(format!(
                        "{}:{line}: SQL outside storage: \"{first}",
                        rel.display()
                    ));
                }
            }
        }
    }
    offences.sort();
    assert!(
        offences.is_empty(),
        "SQL and the database driver belong in src/storage/ only; call a storage function \
         (add one named for what it answers) instead:\n{}",
        offences.join("\n")
    );
    println!(
        "{literals} string literals checked across {} files",
        src.len() + tests.len()
    );
    assert!(
        literals > 1000,
        "the scan found almost no string literals: {literals}"
    );
}

#[test]
fn the_sql_scanner_tells_statements_from_methods_and_skips_comments() {
    let code = "let a = \"SELECT id FROM t\"; // \"DELETE FROM c\"\n\
                let b = (\"DELETE\", 'x', '\\'', \"CREATED BY\");\n\
                fn f<'a>(x: &'a str) {}\n\
                let c = r#\"\n  INSERT INTO t\"#; let d = \"\\\n   UPDATE t SET\";\n\
                /* \"DROP TABLE x\" */ let e = \"VACUUM\"; let g = b\"BEGIN;\";\n";
    let found: Vec<(usize, String)> = string_literals(code)
        .into_iter()
        .filter(|(_, l)| is_sql(l))
        .collect();
    let lines: Vec<usize> = found.iter().map(|(n, _)| *n).collect();
    assert_eq!(lines, [1, 4, 5, 7, 7], "{found:?}");
    assert!(!is_sql("DELETE"));
    assert!(!is_sql("CREATED"));
    assert!(is_sql("WITH x AS (SELECT 1) SELECT * FROM x"));
}

/// The container engine's names, spelled so this file does not hold them
/// as code.
const ENGINE_NAMES: &[&str] = &[
    concat!("boll", "ard::"),
    concat!("use boll", "ard"),
    concat!("sandbox::", "docker"),
    concat!("Docker", "Backend"),
    concat!("image_", "exists"),
];

/// "Many hosts": only `sandbox` knows its engine is Docker. The host, the
/// CLI and the bench reach the engines through `sandbox::lifecycle` (images,
/// running sandboxes) and `SandboxBackend` (sessions, sweep, health), so
/// another engine is a new implementation there, not an edit everywhere.
#[test]
fn only_the_sandbox_names_the_container_engine() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let sandbox = src.join("sandbox");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut offences = Vec::new();
    let mut scanned = 0;
    for file in files.iter().filter(|f| !f.starts_with(&sandbox)) {
        scanned += 1;
        let code = code_of(&std::fs::read_to_string(file).expect("read"));
        let rel = file.strip_prefix(&src).expect("under src");
        for (n, line) in code.lines().enumerate() {
            if let Some(name) = ENGINE_NAMES.iter().find(|name| line.contains(*name)) {
                offences.push(format!(
                    "src/{}:{}: names {name}: {}",
                    rel.display(),
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        offences.is_empty(),
        "the container engine belongs in src/sandbox/ only; ask \
         sandbox::lifecycle::SandboxLifecycle or SandboxBackend instead (add a method named \
         for what it answers):\n{}",
        offences.join("\n")
    );
    assert!(scanned > 100, "the scan found almost no files: {scanned}");
}

/// Issue 26: every model call the host makes is reserved and settled by
/// `spend::Spend::call`, so no module but `spend` (and the providers
/// themselves, and the bench that times a bare provider) calls `complete(`.
#[test]
fn every_model_call_goes_through_the_spend_seam() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut callers = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src");
        let top = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .unwrap_or_default()
            .to_owned();
        if ["model", "spend", "bench"].contains(&top.as_str()) {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(file).expect("read"));
        if code.contains(".complete(") {
            callers.push(rel.display().to_string());
        }
    }
    assert!(
        callers.is_empty(),
        "these call a model provider around the spend seam (use Spend::call): {callers:?}"
    );
}
