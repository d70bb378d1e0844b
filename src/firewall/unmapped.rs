//! DEL and GC of port mappings, and the conntrack entries of the UDP flows
//! the mappings they remove had DNATed (`conntrack.rs` says why those go).
//! The entries are told apart by where the flow went, the pod's address and
//! container port, which only the map elements hold: so they are read before
//! the batch removes them, and only when the attachment's record names a UDP
//! mapping. A TCP-only pod's DEL makes no extra kernel round trip.

use super::conntrack::{self, Dnated};
use super::index::{self, Keys};
use super::schema::{self, SetDef, Value, INET, PM4_ANY, PM4_IP, PM6_ANY, PM6_IP};
use super::sets::decode;
use super::store::{not_valid, owner_of, read, Nft};
use super::tag;
use super::{Gc, Result, Sockets};
use std::net::{IpAddr, SocketAddr};

const UDP: u8 = 17;

/// One UDP mapping an attachment holds: its key in a DNAT map.
struct UdpKey {
    owner: String,
    set: &'static SetDef,
    key: Vec<u8>,
    host: (Option<IpAddr>, u16),
}

/// Runs `release`, which removes the mappings of `owners` (each with the
/// keys the caller knows besides its record's), then deletes the conntrack
/// entries of the UDP flows they DNATed. Best effort past `release`: the
/// mappings are gone and a DEL must succeed once they are, so a failure is
/// reported on stderr and not returned.
pub(super) fn releasing(
    sockets: &Sockets,
    owners: &[(String, Keys)],
    release: impl FnOnce() -> Result<()>,
) -> Result<()> {
    let udp = udp_keys(owners);
    if udp.is_empty() {
        return release();
    }
    let flows = read(sockets, |nft| dnated(nft, &udp)).unwrap_or_else(|e| {
        eprintln!("portmap: keeping the conntrack entries of the unmapped udp ports: {e}");
        Vec::new()
    });
    release()?;
    if let Err(e) = conntrack::delete_dnated_udp(sockets, &flows) {
        eprintln!("portmap: {e}");
    }
    Ok(())
}

/// GC's owners: the recorded attachments of the network that are not valid
/// (those `Gc::run` removes).
pub(super) fn gc_owners(gc: &Gc) -> Vec<(String, Keys)> {
    let doomed = not_valid(&gc.network, &gc.valid);
    let prefix = tag::network_prefix(&gc.network);
    match index::owners(&schema::PORTMAP, &prefix) {
        Ok(owners) => owners.into_iter().filter(|(o, _)| doomed(o)).collect(),
        Err(e) => {
            eprintln!("portmap: keeping the conntrack entries of the unmapped udp ports: {e}");
            Vec::new()
        }
    }
}

/// The UDP mappings among the recorded and the known keys of `owners`.
fn udp_keys(owners: &[(String, Keys)]) -> Vec<UdpKey> {
    let mut out: Vec<UdpKey> = Vec::new();
    for (owner, known) in owners {
        // Unreadable: the release reads it too, and says so.
        let mut keys = index::recorded(&schema::PORTMAP, owner).unwrap_or_default();
        keys.extend(known.iter().cloned());
        for (set, key) in keys {
            let Some(set) = dnat_map(&set.name) else {
                continue;
            };
            let Some(host) = udp_host_port(set, &key) else {
                continue;
            };
            if !out.iter().any(|k| k.set.name == set.name && k.key == key) {
                let owner = owner.clone();
                out.push(UdpKey {
                    owner,
                    set,
                    key,
                    host,
                });
            }
        }
    }
    out
}

fn dnat_map(name: &str) -> Option<&'static SetDef> {
    [&PM4_ANY, &PM4_IP, &PM6_ANY, &PM6_IP]
        .into_iter()
        .find(|s| s.name == name)
}

/// The host address (None: any) and port of a DNAT map key, when UDP.
fn udp_host_port(set: &SetDef, key: &[u8]) -> Option<(Option<IpAddr>, u16)> {
    match decode(set.key, key)?.as_slice() {
        [Value::Proto(UDP), Value::Port(p)] => Some((None, *p)),
        [Value::Ip(ip), Value::Proto(UDP), Value::Port(p)] => Some((Some(*ip), *p)),
        _ => None,
    }
}

/// Where the elements of `udp` that their owners still hold send flows.
fn dnated(nft: &mut Nft, udp: &[UdpKey]) -> Result<Vec<Dnated>> {
    let mut out = Vec::new();
    for k in udp {
        let Some(elem) = nft.get(INET, k.set, &k.key)? else {
            continue;
        };
        if owner_of(&elem).as_deref() != Some(k.owner.as_str()) {
            continue;
        }
        let pod = elem.data.as_deref().and_then(|d| pod_of(k.set, d));
        if let Some(pod) = pod {
            let (dst, port) = k.host;
            out.push(Dnated { dst, port, pod });
        }
    }
    Ok(out)
}

/// A DNAT map value: the pod's address and container port.
fn pod_of(set: &SetDef, data: &[u8]) -> Option<SocketAddr> {
    match decode(set.data, data)?.as_slice() {
        [Value::Ip(ip), Value::Port(p)] => Some(SocketAddr::new(*ip, *p)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::firewall::schema::key;

    #[test]
    fn udp_mappings_are_read_back_from_their_keys() {
        let udp = key(&[Value::Proto(UDP), Value::Port(5353)]);
        assert_eq!(udp_host_port(&PM4_ANY, &udp), Some((None, 5353)));
        let tcp = key(&[Value::Proto(6), Value::Port(8080)]);
        assert_eq!(udp_host_port(&PM6_ANY, &tcp), None);
        let ip: IpAddr = "fd00::1".parse().unwrap();
        let on_ip = key(&[Value::Ip(ip), Value::Proto(UDP), Value::Port(53)]);
        assert_eq!(udp_host_port(&PM6_IP, &on_ip), Some((Some(ip), 53)));
        assert_eq!(udp_host_port(&PM4_IP, &on_ip), None, "a v6 key in a v4 map");
        let data = key(&[Value::Ip("10.1.0.2".parse().unwrap()), Value::Port(53)]);
        assert_eq!(pod_of(&PM4_ANY, &data), "10.1.0.2:53".parse().ok());
    }
}
