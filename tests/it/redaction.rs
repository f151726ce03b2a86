//! Redaction and the identifier gate against Unicode, invisible characters and
//! obfuscation (issue 12): a generated corpus covering every class through
//! `mercury review redact|gate`, a property over random identifiers in random
//! shapes inside random ordinary text, and a real scan whose exchanges use
//! these shapes.
//!
//! The figures printed here (recall, gate catch rate, kept ratio) are the
//! ones in docs/review.md.

mod corpus;

use std::cell::RefCell;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use mercury::redaction::{assert_no_identifiers, RedactionList, Redactor};
use proptest::test_runner::{Config, RngSeed, TestRunner};
use reqwest::Method;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;
use unicode_security::confusable_detection::skeleton;

use crate::common::{HostOptions, TestHost};
use corpus::{Figures, Rng, CLASSES};

fn names_file(dir: &Path, people: &[String]) -> PathBuf {
    let path = dir.join("names.txt");
    std::fs::write(
        &path,
        format!("# the redaction list\n{}\n", people.join("\n")),
    )
    .unwrap();
    path
}

fn mercury(args: &[&str], names: &Path, stdin: &str) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mercury"))
        .args(args)
        .arg("--names-file")
        .arg(names)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn mercury");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The gate names kinds, never values.
    assert!(
        !stderr.chars().any(|c| c.is_ascii_digit()),
        "the gate's message holds digits: {stderr}"
    );
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
    )
}

/// Every class, random values, through the CLI: `mercury review redact`
/// removes every identifier, `mercury review gate` exits 3 on every raw line,
/// and ordinary tokens stay.
#[test]
fn redaction_corpus_every_class_is_redacted_and_every_raw_line_gated() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(0x1201_2026);
    let people = corpus::people(&mut rng, 8);
    let names = names_file(dir.path(), &people);
    let lines = corpus::corpus(&mut rng, &people, 12);
    let list = RedactionList::new().with_names(people.clone());
    // A line holding a line break (a name hyphenated over it) goes through
    // `mercury review redact` on its own; the rest in one process.
    let input: String = lines
        .iter()
        .filter(|l| !l.text.contains('\n'))
        .map(|l| format!("{}\n", l.text))
        .collect();
    let (code, redacted) = mercury(&["review", "redact"], &names, &input);
    assert_eq!(code, 0);
    let mut outputs = redacted.lines().map(str::to_owned);
    let (figures, misses) = corpus::evaluate(
        &lines,
        |text| {
            if text.contains('\n') {
                let (code, out) = mercury(&["review", "redact"], &names, &format!("{text}\n"));
                assert_eq!(code, 0);
                out.strip_suffix('\n').unwrap_or(&out).to_owned()
            } else {
                outputs.next().unwrap_or_default()
            }
        },
        |text| {
            let (code, _) = mercury(&["review", "gate"], &names, text);
            assert!(code == 0 || code == 3, "gate exit {code}");
            code == 3
        },
        |text| assert_no_identifiers(text, &list).is_err(),
    );
    println!("{}", figures.report("corpus (mercury review redact|gate)"));
    for m in misses.iter().take(20) {
        println!("{m}");
    }
    assert_eq!(
        figures.per_class.len(),
        CLASSES.len(),
        "every class is in the corpus"
    );
    assert!(misses.is_empty(), "{} misses", misses.len());
    assert_eq!(figures.recall(), 1.0);
    assert_eq!(figures.gate_recall(), 1.0);
    assert!(
        figures.kept_ratio() >= 0.99,
        "kept {:.3}",
        figures.kept_ratio()
    );
}

/// The property: random identifiers (1 to 3, any class, random values and
/// decorations) at random places in random ordinary text. Every one is gone
/// from the redactor's output, the gate fails on the raw line and on each
/// identifier alone, and over all cases at least 95 % of ordinary tokens
/// are kept.
///
/// The cases come from a fixed seed, so a CI run tests what the last local
/// run tested; `PROPTEST_RNG_SEED=<u64>` explores other cases.
#[test]
fn redaction_property_random_identifiers_in_random_text() {
    let totals = RefCell::new(Figures::default());
    let base = Config::default();
    let rng_seed = if std::env::var_os("PROPTEST_RNG_SEED").is_some() {
        base.rng_seed
    } else {
        RngSeed::Fixed(0x1201_2026)
    };
    let mut runner = TestRunner::new(Config {
        cases: 512,
        failure_persistence: None,
        rng_seed,
        ..base
    });
    let strategy = (proptest::num::u64::ANY, 1usize..=3, 0usize..14, 0usize..6);
    let result = runner.run(&strategy, |(seed, n, words, random_people)| {
        let mut rng = Rng::new(seed);
        let people = corpus::people(&mut rng, random_people);
        let ids = (0..n)
            .map(|_| {
                let class = *rng.pick(CLASSES);
                corpus::identifier(&mut rng, class, &people)
            })
            .collect();
        let line = corpus::line(&mut rng, ids, words);
        let list = RedactionList::new().with_names(people.clone());
        let mut redactor = Redactor::new(list.clone()).unwrap();
        let out = redactor.redact_identifiers(&line.text);
        let mut t = totals.borrow_mut();
        t.lines += 1;
        for slot in &line.planted {
            let e = t.per_class.entry(slot.id.class).or_default();
            e.0 += 1;
            proptest::prop_assert!(
                corpus::slot_redacted(slot, &out),
                "{} survived: {:?} → {:?}",
                slot.id.class,
                line.text,
                out
            );
            e.1 += 1;
            let alone = format!(
                "{}{}{}{}{}",
                slot.left, slot.id.context_before, slot.id.raw, slot.id.context_after, slot.right
            );
            proptest::prop_assert!(
                assert_no_identifiers(&alone, &list).is_err(),
                "the gate passed {}: {:?}",
                slot.id.class,
                alone
            );
            e.2 += 1;
        }
        proptest::prop_assert!(
            assert_no_identifiers(&line.text, &list).is_err(),
            "the gate passed {:?}",
            line.text
        );
        // Redacting again changes nothing: the output is a fixed point.
        proptest::prop_assert_eq!(redactor.redact_identifiers(&out), out.clone());
        t.ordinary += line.ordinary.len();
        t.kept += corpus::kept_tokens(&line, &out);
        if assert_no_identifiers(&out, &list).is_err() {
            t.redacted_lines_blocked += 1;
        }
        Ok(())
    });
    let totals = totals.into_inner();
    println!("{}", totals.report("property (library)"));
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(
        totals.kept_ratio() >= 0.99,
        "kept {:.3}",
        totals.kept_ratio()
    );
}

// ---------------------------------------------------------------------------
// A real scan whose exchanges use these shapes
// ---------------------------------------------------------------------------

const OWNER: &str = "31655501234@s.whatsapp.net";
const OWNER_NAME: &str = "Olivia Bakker";
const LUKASZ: (&str, &str) = ("48601234567@s.whatsapp.net", "Łukasz Wróbel");
const ANNA: (&str, &str) = ("31612345678@lid", "Anna de Vries");

/// What the seeded users write: each line one leaked shape of the incident.
const EXCHANGES: &[&str] = &[
    "call Wróbel on 06\u{2013}12\u{2009}34\u{200B}56\u{00B7}78 tonight",
    "my whatsapp is 31\u{2012}6 1234\u{00AD}5678@s.whatsapp.net ok",
    "mail ＯＬＩＶＩＡ at olivia\u{00AD}.bakker＠example。com or olivia (at) example (dot) com",
    "ask OliviaBakker, @olivia_bakker, \u{41E}livia or O\u{301}livia about it",
    "see [msg 0612345678], dial +31\u{3000}6\u{2002}8765\u{2212}4321 or bram@[192.168.10.20]",
    "ping bob@localhost and \u{141}UK\u{410}SZ WRO\u{301}BEL and Mr. Vries, thanks",
    "tab separated 06\t87\t65\t43\t21 and 06_11_22_33_44 numbers",
];

/// The values, as an independent check reads them: every digit run of the
/// identifiers and every name part, folded by the confusables skeleton.
const DIGITS: &[&str] = &[
    "0612345678",
    "31612345678",
    "3168765432",
    "192168",
    "0687654321",
    "0611223344",
    "48601234567",
    "31655501234",
];
const NAME_PARTS: &[&str] = &[
    "olivia", "bakker", "lukasz", "wrobel", "anna", "vries", "bram",
];

fn fold(s: &str) -> String {
    use unicode_normalization::UnicodeNormalization;
    let nfkc: String = s
        .nfkc()
        .filter(|c| {
            !matches!(
                c,
                '\u{AD}' | '\u{200B}'..='\u{200F}' | '\u{2060}' | '\u{FEFF}'
            )
        })
        .collect();
    skeleton(&nfkc)
        .filter(|c| !unicode_normalization::char::is_combining_mark(*c))
        .flat_map(char::to_lowercase)
        .flat_map(|c| match c {
            'l' => vec!['i'],
            'm' => vec!['r', 'n'],
            c => vec![c],
        })
        .collect()
}

fn digit_of(c: char) -> Option<char> {
    use unicode_normalization::UnicodeNormalization;
    if c.is_ascii_digit() {
        return Some(c);
    }
    let n: String = std::iter::once(c).nfkc().collect();
    n.chars().next().filter(char::is_ascii_digit)
}

/// What of the seeded values `text` holds: digit runs once every separator
/// and invisible character is dropped (letters and line breaks end a run),
/// name parts and host names through the confusables skeleton.
fn leaks(text: &str) -> Vec<String> {
    let clean = corpus::without_placeholders(text, "|");
    let digits: String = clean
        .chars()
        .filter_map(|c| {
            digit_of(c).or(if c.is_alphabetic() || c == '\n' {
                Some('|')
            } else {
                None
            })
        })
        .collect();
    let folded = fold(&clean);
    let mut found = Vec::new();
    for d in DIGITS {
        if digits.contains(d) {
            found.push(format!("digits {d}"));
        }
    }
    for n in NAME_PARTS
        .iter()
        .chain(&["@s.whatsapp", "@lid", "(at)", "example", "localhost", "@["])
    {
        if folded.contains(&fold(n)) {
            found.push(n.to_string());
        }
    }
    found
}

/// The judge quotes the user line of every exchange as its evidence, so the
/// report carries whatever of the user's text reached the judge.
fn judge_quoting(evidence: &str) -> Value {
    let finding = json!({
        "message_id": 0, "kind": "privacy", "scope": "space", "target_layer": "memory",
        "severity": 2, "summary": "The user shared contact details.",
        "evidence": "EVIDENCE", "suggestion": "Do not repeat contact details."
    })
    .to_string()
    .replace("\"message_id\":0", "\"message_id\":$1")
    .replace("EVIDENCE", evidence);
    json!({"rules": [
        {"purpose": "judge",
         "match": "\\[msg (\\d+)\\]\\n(?:context: [^\\n]*\\n)*user [^\\n:]*: ([^\\n\"\\\\]*)",
         "reply": format!("{{\"findings\": [{finding}]}}")},
        {"purpose": "judge", "reply": "{\"findings\": []}"},
        {"purpose": "turn", "reply": "Noted."}
    ]})
}

async fn say(host: &TestHost, adapter: &str, sender: (&str, &str), text: &str, mid: &str) -> Value {
    let (st, v) = host
        .call(
            Method::POST,
            "/api/ingress",
            Some(adapter),
            None,
            Some(json!({
                "platform": "whatsapp", "conversation": sender.0, "sender_id": sender.0,
                "sender_name": sender.1, "text": text, "message_id": mid, "is_group": false,
            })),
        )
        .await;
    assert!(st == 202 || st == 200, "ingress {mid}: {st} {v}");
    v
}

async fn link(host: &TestHost, external_id: &str, space: &str) {
    let (st, v) = host
        .owner(
            Method::GET,
            "/api/conversations?all=true",
            Some(space),
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let id = v["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["external_id"] == external_id)
        .unwrap_or_else(|| panic!("no conversation {external_id}: {v}"))["id"]
        .as_i64()
        .unwrap();
    let (st, v) = host
        .owner(
            Method::POST,
            &format!("/api/conversations/{id}/link"),
            Some(space),
            Some(json!({"space_id": space})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
}

/// Seeds one DM space per sender and every exchange of [`EXCHANGES`],
/// alternating senders; returns how many exchanges were answered.
async fn seed(host: &TestHost) -> i64 {
    seed_with(host, EXCHANGES).await
}

async fn seed_with(host: &TestHost, exchanges: &[&str]) -> i64 {
    let adapter = host.adapter_token("adapter:whatsapp", "whatsapp").await;
    for (sender, space) in [(LUKASZ, "dm-lukasz"), (ANNA, "dm-anna")] {
        host.create_space(space).await;
        let v = say(host, &adapter, sender, "hello", &format!("{space}-0")).await;
        assert_eq!(v["status"], "unlinked", "{v}");
        link(host, sender.0, space).await;
    }
    for (i, text) in exchanges.iter().enumerate() {
        let sender = if i % 2 == 0 { LUKASZ } else { ANNA };
        let replies = host.count("SELECT COUNT(*) FROM messages WHERE role = 'assistant'");
        let v = say(host, &adapter, sender, text, &format!("x{i}")).await;
        assert_eq!(v["status"], "queued", "{v}");
        let n = host
            .wait_count(
                "SELECT COUNT(*) FROM messages WHERE role = 'assistant'",
                replies + 1,
                30,
            )
            .await;
        assert_eq!(n, replies + 1, "no reply to exchange {i}");
    }
    exchanges.len() as i64
}

fn options(model: Value) -> HostOptions {
    HostOptions {
        model,
        config: vec![
            ("ingress.auto_space", Yaml::Bool(false)),
            // Reviewed conversations come from strangers the tests then link:
            // an open bot (the sender policy has its own tests, tests/it/pairing.rs).
            ("ingress.dm_policy", Yaml::String("open".into())),
            ("review.owner", Yaml::String(OWNER.into())),
            (
                "review.owner_names",
                Yaml::Sequence(vec![Yaml::String(OWNER_NAME.into())]),
            ),
            ("review.batch_size", Yaml::Number(1.into())),
            ("review.calls_per_minute", Yaml::Number(600.into())),
        ],
        ..Default::default()
    }
}

fn report_dir(host: &TestHost, summary: &Value) -> PathBuf {
    host.data
        .join("reviews")
        .join(format!("{}-daily", summary["date"].as_str().unwrap()))
}

/// A scan of exchanges written in every leaked shape: the judge quotes each
/// user line back, and the report is written (the redactor left the gate
/// nothing to block) holding none of the identifiers, by an independent
/// check: digits whatever their script and separators, name parts and hosts
/// through the confusables skeleton.
#[tokio::test]
async fn redaction_scan_of_obfuscated_exchanges_writes_no_identifier() {
    let host = TestHost::start(options(judge_quoting("$2"))).await;
    let exchanges = seed(&host).await;
    // The seeding itself holds every value: the check sees them raw.
    for text in EXCHANGES {
        assert!(!leaks(text).is_empty(), "the leak check misses {text:?}");
    }

    let (st, summary) = host
        .owner(Method::POST, "/api/review/run", None, None)
        .await;
    assert_eq!(st, 200, "{summary}");
    let dir = report_dir(&host, &summary);
    // Every exchange reached the judge redacted, was quoted, and the report
    // passed the gate: written, not blocked.
    assert_eq!(summary["status"], "done", "{summary:#}");
    assert_eq!(summary["exchanges_judged"], exchanges, "{summary:#}");
    assert_eq!(summary["findings"], exchanges, "{summary:#}");
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    let json = std::fs::read_to_string(dir.join("report.json")).unwrap();
    assert!(md.contains("- evidence: call [PERSON_"), "{md}");
    for (file, text) in [("report.md", &md), ("report.json", &json)] {
        let found = leaks(text);
        assert!(found.is_empty(), "{file} holds {found:?}:\n{text}");
    }
    host.stop().await;
}

/// The judge quoting one of these shapes raw (it could only have invented
/// it, or the redactor missed it): the wider gate blocks the report, where
/// the gate as wide as the redactor let such shapes through.
#[tokio::test]
async fn redaction_judge_quoting_an_obfuscated_phone_gets_the_report_blocked() {
    for evidence in [
        "call 06\u{2013}12\u{2009}34\u{200B}56\u{00B7}78",
        "dial [msg 612345678]",
        "ISBN 978-3-16-148410-0 or ticket 2026-00421234",
        "write to someone (at) example",
        "the bakkerij in town",
    ] {
        let host = TestHost::start(options(judge_quoting(evidence))).await;
        seed(&host).await;
        let (st, summary) = host
            .owner(Method::POST, "/api/review/run", None, None)
            .await;
        assert_eq!(st, 200, "{summary}");
        assert_eq!(summary["status"], "blocked", "{evidence:?}: {summary:#}");
        let dir = report_dir(&host, &summary);
        assert!(
            !dir.join("report.md").exists(),
            "{evidence:?}: report written"
        );
        assert!(
            !dir.join("report.json").exists(),
            "{evidence:?}: report written"
        );
        host.stop().await;
    }
}

// ---------------------------------------------------------------------------
// Issue 23: the encodings a real daily review let through
// ---------------------------------------------------------------------------

/// What the seeded users write: the shapes of issue 23, item 9.
const ENCODED_EXCHANGES: &[&str] = &[
    "call me on 06|1234|5678 or 06;12;34;56;78 tonight",
    "or 06*1234*5678, 06'1234'5678, 06~1234~5678 and 06+1234+5678",
    "the office is [06] [1234] [5678] or 0\u{FE0F}\u{20E3}6\u{FE0F}\u{20E3}1\u{FE0F}\u{20E3}2\u{FE0F}\u{20E3}3\u{FE0F}\u{20E3}4\u{FE0F}\u{20E3}5\u{FE0F}\u{20E3}6\u{FE0F}\u{20E3}7\u{FE0F}\u{20E3}8\u{FE0F}\u{20E3}",
    "overlined 0\u{305}6\u{305}1\u{305}2\u{305}3\u{305}4\u{305}5\u{305}6\u{305}7\u{305}8\u{305} or mail olivia&#46;bakker&#64;example&#46;com or 06&#45;12&#45;34&#45;56&#45;78",
    "escaped bram%40example%2Ecom and 06%2012%2034%2056%2078",
    "ask O l i v i a or O.l.i.v.i.a, \u{1D0F}\u{29F}\u{26A}\u{1D20}\u{26A}\u{1D00} \u{299}\u{1D00}\u{1D0B}\u{1D0B}\u{1D07}\u{280}, 0l1v1a and \u{1F1F4}\u{1F1F1}\u{1F1EE}\u{1F1FB}\u{1F1EE}\u{1F1E6}",
    "Oli\u{3000}via said Wr\u{F3}-\nbel will call",
];

/// An independent check for [`ENCODED_EXCHANGES`]: character references and
/// URL escapes decoded, then digit runs (any separators and marks dropped)
/// and name parts with every non-letter squeezed out, small capitals,
/// regional indicators and digit look-alikes read as letters.
fn encoded_leaks(text: &str) -> Vec<String> {
    let clean = corpus::without_placeholders(text, "|");
    let mut decoded = clean.clone();
    let html = regex::Regex::new(r"&#(x[0-9a-fA-F]+|[0-9]+);?").unwrap();
    for _ in 0..3 {
        decoded = html
            .replace_all(&decoded, |c: &regex::Captures| {
                let n = &c[1];
                let v = match n.strip_prefix('x') {
                    Some(h) => u32::from_str_radix(h, 16).ok(),
                    None => n.parse().ok(),
                };
                v.and_then(char::from_u32)
                    .map(String::from)
                    .unwrap_or_default()
            })
            .replace("&commat;", "@");
        decoded = percent_encoding::percent_decode_str(&decoded)
            .decode_utf8_lossy()
            .into_owned();
    }
    let digits: String = decoded
        .chars()
        .filter_map(|c| {
            digit_of(c).or(if c.is_alphabetic() || c == '\n' {
                Some('|')
            } else {
                None
            })
        })
        .collect();
    let letter = |c: char| -> Option<char> {
        let small = "ᴀʙᴄᴅᴇꜰɢʜɪᴊᴋʟᴍɴᴏᴘꞯʀꜱᴛᴜᴠᴡxʏᴢ";
        if let Some(i) = small.chars().position(|s| s == c) {
            return char::from_u32('a' as u32 + i as u32);
        }
        if ('\u{1F1E6}'..='\u{1F1FF}').contains(&c) {
            return char::from_u32('a' as u32 + (c as u32 - 0x1F1E6));
        }
        match c {
            '0' => Some('o'),
            '1' => Some('l'),
            '3' => Some('e'),
            '4' => Some('a'),
            c if c.is_alphabetic() => Some(c),
            _ => None,
        }
    };
    let squeezed: String = fold(&decoded.chars().filter_map(letter).collect::<String>());
    let mut found = Vec::new();
    for d in ["0612345678"] {
        if digits.contains(d) {
            found.push(format!("digits {d}"));
        }
    }
    for n in ["olivia", "bakker", "wrobel", "bram", "example"] {
        if squeezed.contains(&fold(n)) {
            found.push(n.to_string());
        }
    }
    found
}

/// A real daily review (`POST /api/review/run`, what `mrctl review run-now`
/// calls) of exchanges written in the encodings of issue 23, the scripted
/// judge quoting each user line back: the report is written and holds none
/// of them, by an independent check. On the code before, the redactor left
/// them as written and the gate passed them, so the report quoted them.
#[tokio::test]
async fn redaction_daily_review_of_encoded_identifiers_writes_none_of_them() {
    for text in ENCODED_EXCHANGES {
        assert!(
            !encoded_leaks(text).is_empty(),
            "the leak check misses {text:?}"
        );
    }
    let host = TestHost::start(options(judge_quoting("$2"))).await;
    let exchanges = seed_with(&host, ENCODED_EXCHANGES).await;
    let (st, summary) = host
        .owner(Method::POST, "/api/review/run", None, None)
        .await;
    assert_eq!(st, 200, "{summary}");
    assert_eq!(summary["status"], "done", "{summary:#}");
    assert_eq!(summary["exchanges_judged"], exchanges, "{summary:#}");
    assert_eq!(summary["findings"], exchanges, "{summary:#}");
    let dir = report_dir(&host, &summary);
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    let json = std::fs::read_to_string(dir.join("report.json")).unwrap();
    assert!(md.contains("- evidence: call me on [PHONE_"), "{md}");
    for (file, text) in [("report.md", &md), ("report.json", &json)] {
        let found = encoded_leaks(text);
        assert!(found.is_empty(), "{file} holds {found:?}:\n{text}");
    }
    host.stop().await;
}

/// The judge writing such a shape itself (the redactor could not have let
/// it through): the gate blocks the report and nothing is written.
#[tokio::test]
async fn redaction_judge_writing_an_encoded_identifier_gets_the_report_blocked() {
    for evidence in [
        "call 06|1234|5678",
        "mail bob&#64;example&#46;com",
        "ask 0l1v1a or O l i v i a",
    ] {
        let host = TestHost::start(options(judge_quoting(evidence))).await;
        seed_with(&host, &ENCODED_EXCHANGES[..1]).await;
        let (st, summary) = host
            .owner(Method::POST, "/api/review/run", None, None)
            .await;
        assert_eq!(st, 200, "{summary}");
        assert_eq!(summary["status"], "blocked", "{evidence:?}: {summary:#}");
        let dir = report_dir(&host, &summary);
        assert!(
            !dir.join("report.md").exists(),
            "{evidence:?}: report written"
        );
        assert!(
            !dir.join("report.json").exists(),
            "{evidence:?}: report written"
        );
        host.stop().await;
    }
}
