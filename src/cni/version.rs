//! Spec versions this suite speaks, and the verbs each allows.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    V010,
    V020,
    V030,
    V031,
    V040,
    V100,
    V110,
}

impl Version {
    pub const ALL: [Version; 7] = [
        Version::V010,
        Version::V020,
        Version::V030,
        Version::V031,
        Version::V040,
        Version::V100,
        Version::V110,
    ];
    /// The newest version; what we answer in when the request names none we know.
    pub const LATEST: Version = Version::V110;
    /// A configuration without `cniVersion` means 0.2.0 (spec-upgrades).
    pub const DEFAULT: Version = Version::V020;

    pub fn parse(s: &str) -> Option<Version> {
        Version::ALL.into_iter().find(|v| v.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Version::V010 => "0.1.0",
            Version::V020 => "0.2.0",
            Version::V030 => "0.3.0",
            Version::V031 => "0.3.1",
            Version::V040 => "0.4.0",
            Version::V100 => "1.0.0",
            Version::V110 => "1.1.0",
        }
    }

    /// "0.1.0, 0.2.0, …" for help texts and error messages.
    pub fn all_joined() -> String {
        Version::ALL.map(Version::as_str).join(", ")
    }

    /// Results before 0.3.0 have one `ip4`/`ip6` block and no interfaces.
    pub fn has_legacy_result(self) -> bool {
        self < Version::V030
    }

    /// 0.3.x and 0.4.0 results tag each IP with `"version": "4"|"6"`.
    pub fn tags_ip_version(self) -> bool {
        (Version::V030..=Version::V040).contains(&self)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
