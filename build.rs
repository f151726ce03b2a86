//! Fixes the git revision the binary was built from (`SNAPSHOT.json` records
//! it); "unknown" outside a git checkout.
fn main() {
    let rev = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=MERCURY_GIT_REVISION={rev}");
}
