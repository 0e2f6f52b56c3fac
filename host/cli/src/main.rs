//! The `berth` binary: [`berth_cli::Berth`] with the built-in backend kinds.

fn main() -> std::process::ExitCode {
    berth_cli::Berth::new().main()
}
