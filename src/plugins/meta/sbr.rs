//! sbr: source-based routing for the pod interface CNI_IFNAME another plugin made (a
//! Multus secondary network, typically), as the reference v1.9.1 does it. Each address
//! prevResult gives the interface gets a routing table of its own, the first free from
//! 100 up, and a rule `from <address> lookup <table>`; the table gets a default route via
//! the address's gateway and the interface's routes of the main table, which leave main.
//! A reply from an address of the interface then leaves through that interface, whatever
//! the pod's default route. With `table`, only the rules are added, to that table, whose
//! routes are the configuration's to provide (IPAM routes with a `table`).
//!
//! DEL removes the rules whose source is an address of the interface (the routes go with
//! the interface). The result is prevResult, unchanged. See docs/plugins/sbr.md.

use crate::cni::{CniResult, Code, Error, IpConfig, Plugin, Request};
use crate::netlink::{Netlink, Route, Rule, TableRoute, MAIN_TABLE};
use crate::plugins::pod_netns::{container_netns_for_del, open_netns};
use ipnet::IpNet;
use serde::Deserialize;
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub struct Sbr;

/// The first table tried (the reference's `firstTableID`).
const FIRST_TABLE: u32 = 100;

/// The plugin's one key.
#[derive(Debug, Default, Deserialize)]
struct Conf {
    /// Rules to this table only; no route moves (v1.9.1).
    #[serde(default)]
    table: Option<i64>,
}

impl Conf {
    /// `table`, a table id the kernel takes (the reference's Go `*int` takes any integer,
    /// and the kernel then refuses 0 for IPv6, or picks an empty table for IPv4).
    fn load(req: &Request) -> Result<Option<u32>, Error> {
        let conf: Conf = req.conf.typed()?;
        conf.table
            .map(|t| {
                u32::try_from(t).ok().filter(|t| *t > 0).ok_or_else(|| {
                    Error::invalid_config(format!(
                        "table {t} must be a routing table id between 1 and {}",
                        u32::MAX
                    ))
                })
            })
            .transpose()
    }
}

/// Chained only: the interface and its addresses come from the plugins before.
fn prev_result(req: &Request) -> Result<&CniResult, Error> {
    req.conf.prev_result.as_ref().ok_or_else(|| {
        Error::invalid_config(
            "sbr is a chained plugin: it needs prevResult from the plugin before it",
        )
    })
}

/// The addresses of prevResult on interface `ifname`: those that name it, and those that
/// name no interface (or one prevResult does not list), as the reference takes them.
fn interface_ips<'a>(prev: &'a CniResult, ifname: &str) -> Result<Vec<&'a IpConfig>, Error> {
    let ips: Vec<&IpConfig> = prev
        .ips
        .iter()
        .filter(|ip| {
            ip.interface
                .and_then(|i| prev.interfaces.get(i))
                .is_none_or(|iface| iface.name == ifname)
        })
        .collect();
    if ips.is_empty() {
        return Err(Error::invalid_config(format!(
            "prevResult has no IP address on interface {ifname}: source-based routing needs one"
        )));
    }
    Ok(ips)
}

/// `address` alone: the /32 or /128 a rule's source is.
fn host(address: IpAddr) -> IpNet {
    IpNet::from(address)
}

/// The first table from `from` up that no rule looks up and no route is in.
fn free_table(from: u32, rules: &[Rule], in_use: &BTreeSet<u32>) -> u32 {
    (from..=u32::MAX)
        .find(|t| !in_use.contains(t) && !rules.iter().any(|r| r.table == *t))
        .unwrap_or(u32::MAX)
}

/// Whether link route `r` belongs in the table of `ip`: its preferred source or its
/// gateway is in the address's subnet, or it names neither (the reference's rule).
fn belongs(r: &TableRoute, ip: &IpConfig) -> bool {
    let within = |a: Option<IpAddr>| a.is_some_and(|a| ip.address.contains(&a));
    within(r.prefsrc) || within(r.gateway) || (r.prefsrc.is_none() && r.gateway.is_none())
}

/// The default route of `ip`'s family via its gateway, in `table`.
fn default_route(ip: &IpConfig, gateway: IpAddr, oif: u32, table: u32) -> Route {
    let any = match ip.address {
        IpNet::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpNet::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    let mut route = Route::new(IpNet::new(any, 0).expect("prefix 0 is valid"));
    route.gateway = Some(gateway);
    route.oif = Some(oif);
    route.table = Some(table);
    route
}

/// What an ADD changed so far, undone when a later step fails: a failed ADD leaves the
/// pod's rules and routes as it found them.
#[derive(Default)]
struct Changes {
    rules: Vec<(IpAddr, u32)>,
    /// The tables this ADD filled (free before it).
    tables: BTreeSet<u32>,
    /// Main-table routes deleted (moved).
    removed: Vec<TableRoute>,
}

impl Changes {
    fn undo(&self, nl: &mut Netlink) {
        let report = |e: crate::netlink::Error| eprintln!("cleanup after failed ADD: {e}");
        // Routes without a gateway first: a gateway must be reachable when its route is added.
        let (direct, via): (Vec<_>, Vec<_>) =
            self.removed.iter().partition(|r| r.gateway.is_none());
        for r in direct.into_iter().chain(via) {
            nl.restore_route(r).unwrap_or_else(report);
        }
        if !self.tables.is_empty() {
            match nl.all_routes() {
                Ok(routes) => routes
                    .iter()
                    .filter(|r| self.tables.contains(&r.table))
                    .for_each(|r| match nl.delete_table_route(r) {
                        Err(e) if !e.is_not_found() => report(e),
                        _ => {}
                    }),
                Err(e) => report(e),
            }
        }
        for (src, table) in self.rules.iter().rev() {
            match nl.del_source_rule(*src, *table) {
                Err(e) if !e.is_not_found() => report(e),
                _ => {}
            }
        }
    }
}

/// With `table`: a rule per address to it, nothing else.
fn rules_only(
    nl: &mut Netlink,
    ips: &[&IpConfig],
    table: u32,
    done: &mut Changes,
) -> Result<(), Error> {
    for ip in ips {
        let src = ip.address.addr();
        nl.add_source_rule(src, table)?;
        done.rules.push((src, table));
    }
    Ok(())
}

/// Without `table`: per address, in prevResult's order, a free table with its rule, the
/// default route via the address's gateway and the interface's main routes that belong
/// there; then those routes leave main (only then: two addresses of one subnet each need
/// the subnet route while their gateway route is added).
fn route_by_source(
    nl: &mut Netlink,
    ifname: &str,
    ips: &[&IpConfig],
    done: &mut Changes,
) -> Result<(), Error> {
    let rules = nl.rules()?;
    let routes = nl.all_routes()?;
    let in_use: BTreeSet<u32> = routes.iter().map(|r| r.table).collect();
    let link = nl.link_by_name(ifname)?.ok_or_else(|| {
        Error::new(
            Code::Kernel,
            format!("cannot find network interface {ifname}"),
        )
    })?;
    let link_routes: Vec<&TableRoute> = routes
        .iter()
        .filter(|r| r.table == MAIN_TABLE && r.oif == Some(link.index))
        .collect();
    let mut table = free_table(FIRST_TABLE, &rules, &in_use);
    for ip in ips {
        let src = ip.address.addr();
        nl.add_source_rule(src, table)?;
        done.rules.push((src, table));
        done.tables.insert(table);
        if let Some(gw) = ip.gateway {
            nl.add_route(&default_route(ip, gw, link.index, table))?;
        }
        for r in link_routes.iter().filter(|r| belongs(r, ip)) {
            // Replaced: the default route just added may be one of them.
            nl.replace_route(&r.in_table(table))?;
        }
        table = free_table(table.saturating_add(1), &rules, &in_use);
    }
    for r in link_routes {
        match nl.delete_table_route(r) {
            Ok(()) => done.removed.push(r.clone()),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

impl Plugin for Sbr {
    // reads_cni_args: false, as the reference, which never decodes CNI_ARGS.

    // ---------------------------------------------------------------- ADD
    /// Under the netns lock (as the reference): listing the tables in use and taking one
    /// must not interleave with another sbr's. A failure puts back what this call changed.
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let table = Conf::load(req)?;
        let prev = prev_result(req)?;
        let ips = interface_ips(prev, req.ifname())?;
        let ns = open_netns(req.netns())?;
        ns.lock_exclusive()?;
        let mut nl = Netlink::open_in(&ns)?;
        let mut done = Changes::default();
        let outcome = match table {
            Some(t) => rules_only(&mut nl, &ips, t, &mut done),
            None => route_by_source(&mut nl, req.ifname(), &ips, &mut done),
        };
        outcome.inspect_err(|_| done.undo(&mut nl))?;
        Ok(prev.clone())
    }

    // ---------------------------------------------------------------- CHECK
    /// The reference's CHECK checks nothing; this one that each address of the interface
    /// has its rule (to `table` when set).
    fn check(&self, req: &Request) -> Result<(), Error> {
        let table = Conf::load(req)?;
        let prev = prev_result(req)?;
        let ips = interface_ips(prev, req.ifname())?;
        let ns = open_netns(req.netns())?;
        let mut nl = Netlink::open_in(&ns)?;
        let rules = nl.rules()?;
        for ip in ips {
            let src = ip.address.addr();
            let ruled = rules
                .iter()
                .any(|r| r.src == Some(host(src)) && table.is_none_or(|t| r.table == t));
            if !ruled {
                let lookup = table.map(|t| format!(" lookup {t}")).unwrap_or_default();
                return Err(Error::check_failed(format_args!(
                    "no rule from {src}{lookup} for {}",
                    req.ifname()
                )));
            }
        }
        Ok(())
    }

    // ---------------------------------------------------------------- DEL
    /// The rules (of `table` when set) whose source is an address of the interface; a
    /// netns or interface that is gone is done, and a configuration DEL cannot use counts
    /// as no `table` (the rules of every table). Every rule is tried; failures are
    /// reported together.
    fn del(&self, req: &Request) -> Result<(), Error> {
        let table = req.conf_or_del_fallback(Conf::load, |_| None)?;
        let Some(ns) = container_netns_for_del(req.netns(), "its rules alone")? else {
            return Ok(());
        };
        ns.lock_exclusive()?;
        let mut nl = Netlink::open_in(&ns)?;
        let Some(link) = nl.link_by_name(req.ifname())? else {
            return Ok(());
        };
        let addresses: Vec<IpAddr> = nl.addresses(link.index)?.iter().map(IpNet::addr).collect();
        let ours: Vec<Rule> = nl
            .rules()?
            .into_iter()
            .filter(|r| table.is_none_or(|t| r.table == t))
            .filter(|r| r.src.is_some_and(|s| addresses.contains(&s.addr())))
            .collect();
        let steps: Vec<Result<(), Error>> = ours
            .iter()
            .map(|r| match nl.del_rule(r) {
                Err(e) if e.is_not_found() => Ok(()),
                other => other.map_err(Error::from),
            })
            .collect();
        Error::all(steps)
    }

    // ---------------------------------------------------------------- STATUS
    /// Nothing to be ready: the state lives in each pod's netns.
    fn status(&self, _req: &Request) -> Result<(), Error> {
        Ok(())
    }

    // ---------------------------------------------------------------- GC
    /// Nothing to collect: rules and tables go with the pod's netns.
    fn gc(&self, _req: &Request) -> Result<(), Error> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::Command;
    use crate::plugins::firewall_backend::test_request;
    use serde_json::json;

    #[test]
    fn conf_fields_are_known() {
        use crate::cni::gojson::{assert_known, struct_fields};
        assert_known(&[struct_fields::<Conf>()]);
    }

    fn request(command: Command, extra: serde_json::Value) -> Request {
        let mut conf = json!({"cniVersion": "1.0.0", "name": "n", "type": "sbr"});
        conf.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        test_request(command, conf)
    }

    #[test]
    fn table_is_a_kernel_table_id_and_go_matches_its_key() {
        let table = |v: serde_json::Value| Conf::load(&request(Command::Add, json!({"table": v})));
        assert_eq!(table(json!(100)).unwrap(), Some(100));
        assert_eq!(table(json!(4294967295u64)).unwrap(), Some(u32::MAX));
        assert_eq!(table(json!(null)).unwrap(), None);
        for bad in [
            json!(0),
            json!(-1),
            json!(4294967296u64),
            json!("100"),
            json!(1.5),
        ] {
            let e = table(bad.clone()).unwrap_err();
            assert_eq!(e.code, 7, "{bad}: {e:?}");
        }
        let folded = request(Command::Add, json!({"Table": 7}));
        assert_eq!(Conf::load(&folded).unwrap(), Some(7));
    }

    #[test]
    fn add_and_check_need_a_prev_result_with_an_address_on_the_interface() {
        for command in [Command::Add, Command::Check] {
            let e = Sbr.call(&request(command, json!({}))).unwrap_err();
            assert_eq!(e.code, 7, "{e:?}");
            assert!(e.msg.contains("prevResult"), "{}", e.msg);
            let prev = json!({"cniVersion": "1.0.0", "interfaces": [{"name": "eth0"}], "ips": []});
            let e = Sbr
                .call(&request(command, json!({"prevResult": prev})))
                .unwrap_err();
            assert!(
                e.msg.contains("no IP address on interface eth0"),
                "{}",
                e.msg
            );
        }
    }

    fn result(v: serde_json::Value) -> CniResult {
        CniResult::from_value(&v).unwrap()
    }

    #[test]
    fn the_interfaces_addresses_are_those_naming_it_or_no_listed_interface() {
        let prev = result(json!({"cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0"}, {"name": "net1"}],
            "ips": [{"address": "10.0.0.2/24", "interface": 0},
                    {"address": "10.1.0.2/24", "interface": 1},
                    {"address": "10.2.0.2/24"},
                    {"address": "10.3.0.2/24", "interface": 7}]}));
        let of = |ifname| {
            interface_ips(&prev, ifname).map(|ips| {
                ips.iter()
                    .map(|ip| ip.address.to_string())
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(
            of("net1").unwrap(),
            ["10.1.0.2/24", "10.2.0.2/24", "10.3.0.2/24"]
        );
        assert_eq!(
            of("eth0").unwrap(),
            ["10.0.0.2/24", "10.2.0.2/24", "10.3.0.2/24"]
        );
        let only_eth0 = result(
            json!({"cniVersion": "1.0.0", "interfaces": [{"name": "eth0"}],
            "ips": [{"address": "10.0.0.2/24", "interface": 0}]}),
        );
        assert_eq!(interface_ips(&only_eth0, "net1").unwrap_err().code, 7);
    }
}
