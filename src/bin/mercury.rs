//! `mercury`: the host (see `mercury::cli::mercury`).
fn main() -> std::process::ExitCode {
    mercury::cli::mercury::main()
}
