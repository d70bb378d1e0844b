//! Daemon and client tests: a daemon started in-process on a temp socket.

mod daemon;
mod peer;
mod scale;
