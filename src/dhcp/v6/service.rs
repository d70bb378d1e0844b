//! The service's DHCPv6 half of ADD: a lease for the attachment, recorded before the
//! plugin hears of it, then kept by a thread of its own.

use super::super::keep::{kept_or_given_back, Keeper};
use super::super::options::ClientOptions;
use super::super::Result;
use super::exchange::Client6;
use super::lease::{self, Record6, Terms6};
use super::maintain::Held6;
use super::message::Identity;
use super::socket::Socket6;
use ipamd::attachment::Attachment;
use std::path::Path;
use std::time::{Instant, SystemTime};

/// SOLICIT … REPLY in the pod's netns, on the attachment's interface. The link-local
/// address may take the whole exchange's time to leave DAD; the exchange gets what is
/// left of it.
pub fn acquire(
    keeper: &Keeper,
    attachment: &Attachment,
    netns: &Path,
    options: &ClientOptions,
) -> Result<(Terms6, Held6)> {
    let started = Instant::now();
    let path = keeper.host_path(netns);
    let socket = Socket6::open(&path, &attachment.ifname, keeper.timing.exchange)?;
    let id = Identity::new(socket.link().mac(), &options.client_id);
    let mut timing = keeper.timing;
    timing.exchange = timing.exchange.saturating_sub(started.elapsed());
    let client = Client6 {
        socket: &socket,
        id: &id,
        timing,
        cancel: None,
    };
    let granted = client.acquire(None)?;
    let bound_at = SystemTime::now();
    let kept = lease::terms(&granted, id.iaid).and_then(|terms| {
        let record = Record6::new(
            attachment.clone(),
            netns.to_path_buf(),
            &id,
            &granted,
            bound_at,
        )?;
        keeper.files.save(&record)?;
        Ok((terms, record))
    });
    let give_back = || client.release(&granted);
    let (terms, record) = kept_or_given_back(
        kept,
        give_back,
        attachment,
        granted
            .address(id.iaid)
            .map_or(String::new(), |a| a.to_string()),
        netns,
    )?;
    let held = Held6::start(keeper.clone(), socket, record, granted)?;
    Ok((terms, held))
}
