//! `berth` with one more backend kind, `test-dir` (see
//! `test_dir_backend.rs`), and one more snapshot kind, `test-copies` (see
//! `test_copies_snapshot.rs`), registered as an embedder would: the proof
//! that kinds from outside the library reach every front end.

fn main() -> std::process::ExitCode {
    berth_cli::Berth::new()
        .backend_provider(std::sync::Arc::new(
            berth_tests::test_dir_backend::DirProvider,
        ))
        .snapshot_provider(std::sync::Arc::new(
            berth_tests::test_copies_snapshot::CopiesProvider,
        ))
        .main()
}
