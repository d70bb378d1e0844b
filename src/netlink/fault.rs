//! Injected kernel failures for the fault-injection tests. Only the test
//! command builds them in (cargo feature `fault-injection`); otherwise
//! [`before_send`] is an empty inline function.
//!
//! With `CNIKIT_FAULT_NETLINK=N` in the environment of an ADD, the Nth
//! datagram this process sends to the kernel (a netlink request or an
//! nftables batch) fails with EIO before it is sent, as if the kernel had
//! refused it: the tests walk N over every send of a plugin's ADD and check
//! that each failure leaves nothing behind.

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub(crate) fn before_send() -> std::io::Result<()> {
    Ok(())
}

#[cfg(feature = "fault-injection")]
pub(crate) fn before_send() -> std::io::Result<()> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static SENT: AtomicU32 = AtomicU32::new(0);
    let n = SENT.fetch_add(1, Ordering::Relaxed) + 1;
    let at = std::env::var("CNIKIT_FAULT_NETLINK").ok();
    let adding = std::env::var("CNI_COMMAND").is_ok_and(|c| c == "ADD");
    if adding && at.and_then(|v| v.parse::<u32>().ok()) == Some(n) {
        return Err(std::io::Error::other(format!(
            "injected failure of netlink send {n} (CNIKIT_FAULT_NETLINK)"
        )));
    }
    Ok(())
}
