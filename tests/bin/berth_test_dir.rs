//! `berth` with one more backend kind, `test-dir` (see
//! `test_dir_backend.rs`), registered as an embedder would: the proof that
//! a kind from outside the library reaches every front end.

fn main() -> std::process::ExitCode {
    berth_cli::Berth::new()
        .backend_provider(std::sync::Arc::new(
            berth_tests::test_dir_backend::DirProvider,
        ))
        .main()
}
