//! `CNI_ARGS`: `K=V;K=V`. Like the reference plugins, a key nobody declared is
//! an error unless `IgnoreUnknown` is set to a true value.

use super::error::{Code, Error};

/// Keys any cnikit plugin understands. Interface plugins pass `IP` on to IPAM,
/// so they accept it too (the reference bridge would reject it without
/// IgnoreUnknown, a common stumbling block).
pub const KNOWN_KEYS: &[&str] = &["IgnoreUnknown", "IP", "MAC"];

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    pairs: Vec<(String, String)>,
}

impl CniArgs {
    pub fn parse(raw: &str) -> Result<CniArgs, Error> {
        let mut pairs = Vec::new();
        for item in raw.split(';').filter(|s| !s.is_empty()) {
            let Some((k, v)) = item.split_once('=') else {
                return Err(Error::new(
                    Code::InvalidEnv,
                    format!("CNI_ARGS: {item:?} is not KEY=VALUE"),
                ));
            };
            if k.is_empty() {
                return Err(Error::new(
                    Code::InvalidEnv,
                    format!("CNI_ARGS: {item:?} has an empty key"),
                ));
            }
            pairs.push((k.to_string(), v.to_string()));
        }
        let args = CniArgs { pairs };
        args.reject_unknown()?;
        Ok(args)
    }

    /// The well-formed `K=V` pairs, unknown keys allowed: for DEL, which must
    /// not fail on arguments it does not need.
    pub fn parse_lenient(raw: &str) -> CniArgs {
        let pairs = raw
            .split(';')
            .filter_map(|item| item.split_once('='))
            .filter(|(k, _)| !k.is_empty())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        CniArgs { pairs }
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn ignore_unknown(&self) -> bool {
        matches!(
            self.get("IgnoreUnknown")
                .map(str::to_ascii_lowercase)
                .as_deref(),
            Some("1" | "true")
        )
    }

    fn reject_unknown(&self) -> Result<(), Error> {
        if self.ignore_unknown() {
            return Ok(());
        }
        match self.pairs.iter().find(|(k, _)| !KNOWN_KEYS.contains(&k.as_str())) {
            None => Ok(()),
            Some((k, v)) => Err(Error::new(
                Code::InvalidEnv,
                format!(
                    "CNI_ARGS: unknown key {k:?} (value {v:?}); known keys are {}; set IgnoreUnknown=1 to ignore others",
                    KNOWN_KEYS.join(", ")
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pairs() {
        let a = CniArgs::parse("IP=10.0.0.5;MAC=0a:58:00:00:00:01").unwrap();
        assert_eq!(a.get("IP"), Some("10.0.0.5"));
        assert_eq!(a.get("MAC"), Some("0a:58:00:00:00:01"));
        assert_eq!(CniArgs::parse("").unwrap(), CniArgs::default());
    }

    #[test]
    fn unknown_keys_need_ignore_unknown() {
        let e = CniArgs::parse("K8S_POD_NAME=x").unwrap_err();
        assert!(e.msg.contains("K8S_POD_NAME"));
        assert!(CniArgs::parse("IgnoreUnknown=1;K8S_POD_NAME=x").is_ok());
        assert!(CniArgs::parse("IgnoreUnknown=true;K8S_POD_NAME=x").is_ok());
    }

    #[test]
    fn malformed() {
        assert!(CniArgs::parse("novalue").is_err());
        assert!(CniArgs::parse("=x").is_err());
    }
}
