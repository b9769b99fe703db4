//! What the metadata store's unit tests share: a fresh store in a temporary
//! directory, and the errno of a call expected to fail.

use super::{MetaStore, RootSpec};
use crate::error::StoreError;
use spillway_types::Errno;

/// A new store whose root directory is `root` (the directory lives as long as the
/// returned guard).
pub(super) fn store_with(root: RootSpec) -> (tempfile::TempDir, MetaStore) {
    let dir = tempfile::tempdir().unwrap();
    let m = MetaStore::init(&dir.path().join("meta.sqlite"), 2, Some(root)).unwrap();
    (dir, m)
}

pub(super) fn errno<T: std::fmt::Debug>(r: Result<T, StoreError>) -> Errno {
    r.expect_err("expected an error").errno()
}
