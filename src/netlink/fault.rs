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

/// Counted like the store's injected failures (`ipamd::nth_add_call`), on a counter of
/// its own.
#[cfg(feature = "fault-injection")]
pub(crate) fn before_send() -> std::io::Result<()> {
    static SENT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    if let Some(n) = ipamd::nth_add_call(&SENT, "CNIKIT_FAULT_NETLINK") {
        return Err(std::io::Error::other(format!(
            "injected failure of netlink send {n} (CNIKIT_FAULT_NETLINK)"
        )));
    }
    Ok(())
}
