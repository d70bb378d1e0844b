//! Daemon and client tests: a daemon started in-process on a temp socket.

mod conns;
mod daemon;
mod files;
mod peer;
mod scale;
