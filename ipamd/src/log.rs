//! Minimal leveled logging to stderr. The daemon's stderr goes to the journal under systemd
//! (which understands the `<N>` syslog prefixes), and a plugin's stderr ends up in the
//! runtime's log; a logging framework would be more weight than this needs.

use std::sync::atomic::{AtomicU8, Ordering};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Warn as u8);

impl Level {
    pub fn parse(s: &str) -> Option<Level> {
        match s.to_ascii_lowercase().as_str() {
            "error" => Some(Level::Error),
            "warn" | "warning" => Some(Level::Warn),
            "info" => Some(Level::Info),
            "debug" | "trace" => Some(Level::Debug),
            _ => None,
        }
    }

    fn syslog_prefix(self) -> &'static str {
        match self {
            Level::Error => "<3>",
            Level::Warn => "<4>",
            Level::Info => "<6>",
            Level::Debug => "<7>",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }
}

pub fn set_level(level: Level) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

pub fn enabled(level: Level) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

#[doc(hidden)]
pub fn write(level: Level, args: std::fmt::Arguments<'_>) {
    if !enabled(level) {
        return;
    }
    // journald sets JOURNAL_STREAM for services whose stderr it reads; only then are the
    // `<N>` priority prefixes interpreted instead of printed.
    if std::env::var_os("JOURNAL_STREAM").is_some() {
        eprintln!("{}{}", level.syslog_prefix(), args);
    } else {
        eprintln!("ipamd {}: {}", level.name(), args);
    }
}

#[macro_export]
#[doc(hidden)]
macro_rules! log_at {
    ($lvl:expr, $($arg:tt)*) => { $crate::log::write($lvl, format_args!($($arg)*)) };
}
