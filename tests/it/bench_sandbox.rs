//! `mercury bench sandbox` runs against the real engine, prints its medians
//! and ratios, and leaves none of its containers behind. Timings are
//! printed, never asserted.

use std::process::Command;

#[test]
fn bench_sandbox_prints_medians_and_ratios_and_leaves_no_container() {
    let out = Command::new(env!("CARGO_BIN_EXE_mercury"))
        .args(["bench", "sandbox", "--runs", "2"])
        .env("MERCURY_LOG", "warn")
        .output()
        .expect("run mercury bench sandbox");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    println!("{stdout}");
    assert!(stdout.contains("2 runs each"), "{stdout}");
    for line in [
        "bollard: start (create+start) + exec `true`",
        "bollard: claim a pooled container + exec `true`",
        "cli: docker run --rm IMAGE true",
        "cli: docker run --rm --network none IMAGE true",
        "ratio bollard / docker run: ",
        "ratio bollard / docker run --network none: ",
        "ratio pooled claim / docker run: ",
    ] {
        assert!(stdout.contains(line), "{line:?} missing from {stdout}");
    }
    let instance = stdout
        .split("instance ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the report names its instance");
    let left = Command::new("docker")
        .args(["ps", "-aq", "--filter"])
        .arg(format!("label=mercury.instance={instance}"))
        .output()
        .expect("docker ps");
    assert!(left.status.success());
    assert_eq!(
        String::from_utf8_lossy(&left.stdout).trim(),
        "",
        "bench containers left behind"
    );
}
