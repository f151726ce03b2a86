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
    &["api"],
    // An in-process adapter calls ingress, so it sits one row above it.
    &["adapters"],
    &["ingress"],
    &["app"],
    &["actors"],
    &["agent", "review", "shadow"],
    &["links", "perms", "redaction", "runtime"],
    // Prices, caps and the one seam every model call passes through.
    &["spend"],
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
