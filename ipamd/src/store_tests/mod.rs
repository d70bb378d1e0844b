//! Tests of the lease store that go through more than the store: the client,
//! the daemon and fsck. They live beside `store` rather than inside it, so
//! `store` never imports the modules built on top of it.

mod commit;
mod integrity;
pub(crate) mod testkit;
