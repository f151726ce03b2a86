//! `mrctl`: the Mercury API client (see `mercury::cli::mrctl`).
fn main() -> std::process::ExitCode {
    mercury::cli::mrctl::main()
}
