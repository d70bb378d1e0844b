//! portmap: host port → container port DNAT. The nftables implementation is
//! tracked separately; until it lands, a call that asks for mappings fails
//! clearly instead of silently doing nothing, and a call without mappings
//! passes prevResult through (chained configs keep working).

use crate::cni::{CniResult, Code, Error, Plugin, Request};

pub struct Portmap;

fn has_mappings(req: &Request) -> bool {
    req.conf
        .runtime_config("portMappings")
        .and_then(|v| v.as_array())
        .is_some_and(|a| !a.is_empty())
}

fn unsupported() -> Error {
    Error::new(
        Code::UnsupportedField,
        "runtimeConfig.portMappings: port mappings are not implemented in this cnikit build yet",
    )
}

impl Plugin for Portmap {
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        if has_mappings(req) {
            return Err(unsupported());
        }
        Ok(req.conf.prev_result.clone().unwrap_or_default())
    }

    fn check(&self, _req: &Request) -> Result<(), Error> {
        Ok(())
    }

    /// Nothing was ever installed, so nothing to remove.
    fn del(&self, _req: &Request) -> Result<(), Error> {
        Ok(())
    }

    fn status(&self, _req: &Request) -> Result<(), Error> {
        Ok(())
    }

    fn gc(&self, _req: &Request) -> Result<(), Error> {
        Ok(())
    }
}
