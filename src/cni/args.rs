//! `CNI_ARGS`: `K=V;K=V`. The plugins whose reference counterparts read them
//! ([`Plugin::reads_cni_args`](crate::cni::Plugin::reads_cni_args)) refuse, as those do, a malformed pair and a key nobody
//! declared unless `IgnoreUnknown` is set to a true value; the others take any.

use super::env::Command;
use super::error::{Code, Error};

/// Keys any cnikit plugin understands. Interface plugins pass `IP` (and static's
/// `GATEWAY`, which goes with it) on to IPAM, so they accept them too (the reference
/// bridge would reject them without IgnoreUnknown, a common stumbling block); one list
/// for every strict plugin, so host-local and ipamd take `GATEWAY` and ignore it.
pub const KNOWN_KEYS: &[&str] = &["IgnoreUnknown", "IP", "MAC", "GATEWAY"];

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    pairs: Vec<(String, String)>,
}

impl CniArgs {
    /// `raw` as a plugin reads it for `command`: strictly on ADD and CHECK when
    /// the plugin is `strict` (it [reads CNI_ARGS](crate::cni::Plugin::reads_cni_args);
    /// those are the only verbs on which the reference plugins decode them);
    /// otherwise the well-formed pairs (DEL never fails on arguments it does not need).
    pub fn for_call(raw: &str, strict: bool, command: Command) -> Result<CniArgs, Error> {
        match command {
            Command::Add | Command::Check if strict => Self::parse(raw),
            _ => Ok(Self::parse_lenient(raw)),
        }
    }

    /// Strict: every pair `K=V`, every key one of [`KNOWN_KEYS`] unless
    /// `IgnoreUnknown` is true.
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

    /// The value of `key`; given twice, the last one, as the reference's
    /// `types.LoadArgs` sets the field once per pair.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
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
    fn a_key_given_twice_takes_the_last_value_as_the_reference() {
        let a = CniArgs::parse("IP=10.0.0.5;IgnoreUnknown=1;IP=10.0.0.6").unwrap();
        assert_eq!(a.get("IP"), Some("10.0.0.6"));
        assert_eq!(CniArgs::parse_lenient("MAC=a;MAC=b").get("MAC"), Some("b"));
    }

    #[test]
    fn unknown_keys_need_ignore_unknown() {
        let e = CniArgs::parse("K8S_POD_NAME=x").unwrap_err();
        assert!(e.msg.contains("K8S_POD_NAME"));
        assert!(CniArgs::parse("IgnoreUnknown=1;K8S_POD_NAME=x").is_ok());
        assert!(CniArgs::parse("IgnoreUnknown=true;K8S_POD_NAME=x").is_ok());
    }

    /// static's pair, `IP=a/24,b/24;GATEWAY=g`, passes every strict plugin on the way to it.
    #[test]
    fn static_gateway_is_known() {
        let a = CniArgs::parse("IP=10.10.0.1/24,11.11.0.1/24;GATEWAY=10.10.0.254").unwrap();
        assert_eq!(a.get("GATEWAY"), Some("10.10.0.254"));
        assert_eq!(CniArgs::parse("Gateway=10.10.0.254").unwrap_err().code, 4);
    }

    #[test]
    fn malformed() {
        assert!(CniArgs::parse("novalue").is_err());
        assert!(CniArgs::parse("=x").is_err());
    }

    #[test]
    fn strict_plugins_hold_cni_args_to_known_keys_on_add_and_check_only() {
        let k8s = "K8S_POD_NAME=x;K8S_POD_NAMESPACE=default;IP=10.0.0.5";
        for command in [Command::Add, Command::Check] {
            let e = CniArgs::for_call(k8s, true, command).unwrap_err();
            assert_eq!(e.code, 4);
            assert!(e.msg.contains("K8S_POD_NAME"), "{}", e.msg);
            assert!(CniArgs::for_call("novalue", true, command).is_err());
        }
        // Never on DEL, STATUS or GC, where the reference does not read them either.
        for command in [Command::Del, Command::Status, Command::Gc] {
            let a = CniArgs::for_call(k8s, true, command).unwrap();
            assert_eq!(a.get("IP"), Some("10.0.0.5"));
        }
        for command in [Command::Add, Command::Check, Command::Del] {
            let a = CniArgs::for_call(k8s, false, command).unwrap();
            // ipvlan hands IP= on to its IPAM plugin.
            assert_eq!(a.get("IP"), Some("10.0.0.5"));
            assert!(CniArgs::for_call("novalue;MAC=", false, command).is_ok());
        }
    }
}
