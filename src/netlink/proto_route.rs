//! Routes of one routing protocol number in the main table: the routes one owner keeps
//! (the ipamd daemon's `--route-blocks`), told apart from every other route by their
//! `proto` alone, so that the owner never touches a route it did not make.
use super::route::{Route, MAIN_TABLE};
use super::{Netlink, Result};
use ipnet::IpNet;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::route::{
    RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::RouteNetlinkMessage;
use std::net::IpAddr;

/// A unicast route of the main table with the owner's protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtoRoute {
    pub dst: IpNet,
    pub gateway: Option<IpAddr>,
}

impl Netlink {
    /// Every unicast route of the main table whose protocol is `proto`.
    pub fn routes_of_protocol(&mut self, proto: u8) -> Result<Vec<ProtoRoute>> {
        let ours = |payload: &[u8]| {
            let header = RouteHeader::parse(payload).ok()?;
            if header.protocol != RouteProtocol::from(proto) {
                return None;
            }
            let r = Route::decode(payload).filter(|r| r.table.is_none())?;
            Some(ProtoRoute {
                dst: r.dst,
                gateway: r.gateway,
            })
        };
        self.dump_routes("list routes", ours)
    }

    /// Adds `dst via gateway` with protocol `proto` to the main table. Never replaces:
    /// a route to `dst` with the same metric already there (anyone's) is
    /// `ErrorKind::AlreadyExists`.
    pub fn add_protocol_route(&mut self, proto: u8, route: &ProtoRoute) -> Result<()> {
        let (r, mut msg) = route.message(proto);
        msg.header.kind = RouteType::Unicast;
        msg.header.scope = match route.gateway {
            Some(_) => RouteScope::Universe,
            None => RouteScope::Link,
        };
        let flags = NLM_F_CREATE | NLM_F_EXCL;
        self.request(RouteNetlinkMessage::NewRoute(msg), flags)
            .map(drop)
            .map_err(|f| f.context(&format!("add route {r} proto {proto}")))
    }

    /// Deletes the route of protocol `proto` to `dst` via its gateway: the kernel matches
    /// the protocol too, so another owner's route to the same place stays.
    pub fn del_protocol_route(&mut self, proto: u8, route: &ProtoRoute) -> Result<()> {
        let (r, mut msg) = route.message(proto);
        msg.header.scope = RouteScope::NoWhere;
        self.request(RouteNetlinkMessage::DelRoute(msg), 0)
            .map(drop)
            .map_err(|f| f.context(&format!("delete route {r} proto {proto}")))
    }
}

impl ProtoRoute {
    /// The route as a main-table [`Route`] (for messages) and its message with `proto`.
    fn message(&self, proto: u8) -> (Route, RouteMessage) {
        let mut r = Route::new(self.dst);
        r.gateway = self.gateway;
        r.table = Some(MAIN_TABLE);
        let mut msg = r.message();
        msg.header.protocol = RouteProtocol::from(proto);
        (r, msg)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{host_and_pod, veth};
    use super::*;

    const PROTO: u8 = 203;

    /// Routes of the protocol are listed, added without replacing another's, and deleted
    /// without touching another protocol's route to the same place.
    #[test]
    fn protocol_routes_live_beside_others() {
        let Some((host, cont)) = host_and_pod("protocol_routes_live_beside_others", "pr") else {
            return;
        };
        let (mut nl, mut pod) = (host.netlink(), cont.netlink());
        let pair = nl.create_veth(veth("pra", "pra0", &cont.ns)).expect("veth");
        nl.set_up(pair.host_index).expect("up");
        pod.set_up(pair.peer_index).expect("up");
        nl.add_address(pair.host_index, "10.77.0.1/24".parse().unwrap())
            .expect("address");
        let link = pair.host_index;
        let via: IpAddr = "10.77.0.2".parse().unwrap();
        let ours = ProtoRoute {
            dst: "10.88.1.0/26".parse().unwrap(),
            gateway: Some(via),
        };
        nl.add_protocol_route(PROTO, &ours).expect("add");
        assert_eq!(nl.routes_of_protocol(PROTO).unwrap(), vec![ours.clone()]);
        let again = nl.add_protocol_route(PROTO, &ours).unwrap_err();
        assert_eq!(again.kind, super::super::ErrorKind::AlreadyExists);

        // Someone else's route (protocol boot) to another block is not listed, and an add
        // to its destination is refused, not replaced.
        let mut theirs = Route::new("10.88.2.0/26".parse().unwrap());
        theirs.gateway = Some(via);
        theirs.oif = Some(link);
        nl.add_route(&theirs).expect("add boot route");
        assert_eq!(nl.routes_of_protocol(PROTO).unwrap().len(), 1);
        let taken = ProtoRoute {
            dst: theirs.dst,
            gateway: Some(via),
        };
        let e = nl.add_protocol_route(PROTO, &taken).unwrap_err();
        assert_eq!(e.kind, super::super::ErrorKind::AlreadyExists);
        assert!(nl.del_protocol_route(PROTO, &taken).is_err());
        assert!(nl.routes().unwrap().iter().any(|r| r.dst == theirs.dst));

        nl.del_protocol_route(PROTO, &ours).expect("del");
        assert!(nl.routes_of_protocol(PROTO).unwrap().is_empty());
    }
}
