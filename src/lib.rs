//! Workspace-level integration tests and benches live in `tests/` and `benches/`.
