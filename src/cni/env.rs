//! The CNI_* environment of a plugin call, validated per verb as the spec lists.

use super::error::{Code, Error};
use std::ffi::OsString;
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Status,
    Gc,
}

impl Command {
    pub fn parse(s: &str) -> Option<Command> {
        Some(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "VERSION" => Command::Version,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Version => "VERSION",
            Command::Status => "STATUS",
            Command::Gc => "GC",
        }
    }

    /// Variables the spec marks required for this verb (besides CNI_COMMAND).
    fn required(self) -> &'static [&'static str] {
        match self {
            Command::Add | Command::Check => &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"],
            Command::Del => &["CNI_CONTAINERID", "CNI_IFNAME"],
            Command::Gc => &["CNI_PATH"],
            Command::Version | Command::Status => &[],
        }
    }
}

/// The validated environment of one call. Optional variables are empty strings
/// when absent, as the spec allows for DEL's CNI_NETNS.
#[derive(Debug, Clone)]
pub struct Env {
    pub command: Command,
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub args: String,
    pub path: Vec<PathBuf>,
}

impl Env {
    /// Read and validate from the process environment.
    pub fn from_process() -> Result<Env, Error> {
        Env::from_lookup(|k| std::env::var_os(k))
    }

    /// Validate from any variable source (tests pass a map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<OsString>) -> Result<Env, Error> {
        let var = |k: &str| -> Result<String, Error> {
            match get(k) {
                None => Ok(String::new()),
                Some(v) => v
                    .into_string()
                    .map_err(|_| Error::new(Code::InvalidEnv, format!("{k} is not valid UTF-8"))),
            }
        };
        let command_raw = var("CNI_COMMAND")?;
        let command = match Command::parse(&command_raw) {
            Some(c) => c,
            None if command_raw.is_empty() => {
                return Err(Error::new(Code::InvalidEnv, "CNI_COMMAND is not set"))
            }
            None => {
                return Err(Error::new(
                    Code::InvalidEnv,
                    format!(
                        "CNI_COMMAND {command_raw:?} is not one of ADD, DEL, CHECK, VERSION, STATUS, GC"
                    ),
                ))
            }
        };
        let env = Env {
            command,
            container_id: var("CNI_CONTAINERID")?,
            netns: var("CNI_NETNS")?,
            ifname: var("CNI_IFNAME")?,
            args: var("CNI_ARGS")?,
            path: std::env::split_paths(&get("CNI_PATH").unwrap_or_default())
                .filter(|p| !p.as_os_str().is_empty())
                .collect(),
        };
        env.validate(|k| get(k).is_some_and(|v| !v.is_empty()))?;
        Ok(env)
    }

    /// Collect every problem so the message names all culprits at once.
    fn validate(&self, is_set: impl Fn(&str) -> bool) -> Result<(), Error> {
        let mut problems: Vec<String> = self
            .command
            .required()
            .iter()
            .filter(|k| !is_set(k))
            .map(|k| format!("{k} is required for {}", self.command.as_str()))
            .collect();
        if !self.container_id.is_empty() {
            if let Err(why) = validate_container_id(&self.container_id) {
                problems.push(format!("CNI_CONTAINERID {:?} {why}", self.container_id));
            }
        }
        if !self.ifname.is_empty() {
            if let Err(why) = validate_ifname(&self.ifname) {
                problems.push(format!("CNI_IFNAME {:?} {why}", self.ifname));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::new(Code::InvalidEnv, problems.join("; ")))
        }
    }
}

/// The name rules are the attachment key's, kept with it in `ipamd` so the
/// lease store and the plugins check the same things.
pub use ipamd::attachment::{validate_container_id, validate_ifname, validate_network_name};

// The name rules themselves are tested where they live, in `ipamd::attachment`.
#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<Env, Error> {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        Env::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn add_requires_container_netns_ifname() {
        let e = env(&[("CNI_COMMAND", "ADD")]).unwrap_err();
        assert_eq!(e.code, 4);
        for k in ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"] {
            assert!(e.msg.contains(k), "{}", e.msg);
        }
    }

    #[test]
    fn del_does_not_need_netns() {
        let e = env(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "abc"),
            ("CNI_IFNAME", "eth0"),
        ])
        .unwrap();
        assert_eq!(e.netns, "");
    }

    #[test]
    fn gc_needs_path_version_needs_nothing() {
        assert_eq!(env(&[("CNI_COMMAND", "GC")]).unwrap_err().code, 4);
        assert!(env(&[("CNI_COMMAND", "VERSION")]).is_ok());
        assert!(env(&[("CNI_COMMAND", "STATUS")]).is_ok());
    }

    #[test]
    fn bad_command_and_names() {
        assert!(env(&[("CNI_COMMAND", "PUT")])
            .unwrap_err()
            .msg
            .contains("PUT"));
        let e = env(&[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "-bad"),
            ("CNI_NETNS", "/x"),
            ("CNI_IFNAME", "eth0:1"),
        ])
        .unwrap_err();
        assert!(e.msg.contains("CNI_CONTAINERID") && e.msg.contains("CNI_IFNAME"));
    }

    #[test]
    fn kernel_name_templates_and_nul_are_refused_with_code_4() {
        for bad in ["eth%d", "a\0b"] {
            let e = env(&[
                ("CNI_COMMAND", "ADD"),
                ("CNI_CONTAINERID", "abc"),
                ("CNI_NETNS", "/x"),
                ("CNI_IFNAME", bad),
            ])
            .unwrap_err();
            assert_eq!(e.code, 4, "{bad:?}");
            assert!(e.msg.contains("CNI_IFNAME"), "{}", e.msg);
        }
    }
}
