//! The CNI protocol: environment, configuration, versions and result layouts,
//! error codes, delegation and the plugin runner. Nothing in here knows about
//! netlink; plugins receive a [`Request`] and return the current result model.

pub mod args;
mod call_report;
pub mod config;
pub mod delegate;
pub mod env;
pub mod error;
pub mod gojson;
pub mod log_file;
pub mod result;
pub mod runner;
pub mod version;

pub use env::Command;
pub use error::{Code, Error};
pub use ipamd::attachment::Attachment;
pub use result::{CniResult, Dns, Interface, IpConfig, Route};
pub use runner::{Builtins, Context, Plugin, Request};
pub use version::Version;
