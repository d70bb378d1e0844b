//! TAP links (the tap plugin's): a persistent tap made through `/dev/net/tun` in a
//! network namespace with the TUNSETIFF, TUNSETOWNER, TUNSETGROUP and TUNSETPERSIST
//! ioctls (what `ip tuntap add` and the reference's netlink library do: rtnetlink
//! cannot create one), and the tun details the kernel reports of a link of kind "tun".
use super::linkops::link_message;
use super::{Error, ErrorKind, NetNs, Netlink, Result};
use netlink_packet_core::Nla;
use netlink_packet_route::link::{InfoData, InfoTun, LinkAttribute, LinkInfo};
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, RawFd};

const TUN_DEVICE: &str = "/dev/net/tun";
/// IFLA_TUN_* in IFLA_INFO_DATA of kind "tun".
const IFLA_TUN_OWNER: u16 = 1;
const IFLA_TUN_GROUP: u16 = 2;
const IFLA_TUN_TYPE: u16 = 3;
const IFLA_TUN_VNET_HDR: u16 = 5;
const IFLA_TUN_PERSIST: u16 = 6;
const IFLA_TUN_MULTI_QUEUE: u16 = 7;

/// What a tap is made with.
#[derive(Debug, Clone, Default)]
pub struct TapSpec {
    pub name: String,
    /// IFF_MULTI_QUEUE: each opener of the device gets a queue of its own.
    pub multi_queue: bool,
    /// IFF_VNET_HDR (and packet information unless multi-queue) instead of IFF_NO_PI.
    pub vnet_hdr: bool,
    /// TUNSETOWNER: the user who may open the device without CAP_NET_ADMIN.
    pub owner: Option<u32>,
    /// TUNSETGROUP: the group whose members may.
    pub group: Option<u32>,
}

impl TapSpec {
    /// The TUNSETIFF flags. IFF_TUN_EXCL makes the create fail when the name is taken,
    /// where the kernel would otherwise attach to a tap of that name.
    fn flags(&self) -> libc::c_short {
        let mut flags = libc::IFF_TAP | libc::IFF_TUN_EXCL;
        if self.multi_queue {
            flags |= libc::IFF_MULTI_QUEUE;
        }
        if self.vnet_hdr {
            flags |= libc::IFF_VNET_HDR;
        }
        if !self.vnet_hdr || self.multi_queue {
            flags |= libc::IFF_NO_PI;
        }
        // Every flag is below 0x10000; the kernel reads the 16 bits of ifr_flags.
        flags as u16 as libc::c_short
    }
}

/// The tun details of a link of kind "tun" (`ip -d link`'s `tun type tap …`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TunInfo {
    /// IFLA_TUN_TYPE is IFF_TAP, not IFF_TUN.
    pub tap: bool,
    pub multi_queue: bool,
    pub vnet_hdr: bool,
    pub persist: bool,
    pub owner: Option<u32>,
    pub group: Option<u32>,
}

impl NetNs {
    /// Creates the persistent tap `spec.name` in this namespace, down, and returns its
    /// index. A name taken by any link there is `ErrorKind::AlreadyExists`; a kernel
    /// without TUN/TAP support is `ErrorKind::Unsupported`. A failure leaves no device:
    /// it only persists once every setting took.
    pub fn create_tap(&self, spec: &TapSpec) -> Result<u32> {
        // /dev/net/tun makes the device in the netns of the thread that opens it.
        self.run(|| create_here(spec))?
    }
}

fn create_here(spec: &TapSpec) -> Result<u32> {
    let what = format!("create tap {}", spec.name);
    let name = spec.name.as_bytes();
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(&0) {
        return Err(Error::new(
            ErrorKind::Other,
            format!("{what}: not a kernel interface name"),
        ));
    }
    let tun = OpenOptions::new()
        .read(true)
        .write(true)
        .open(TUN_DEVICE)
        .map_err(|e| open_error(&what, &e))?;
    let fd = tun.as_raw_fd();
    // SAFETY: a zeroed ifreq is valid; the name fits with its NUL (checked above).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in req.ifr_name.iter_mut().zip(name) {
        *slot = *byte as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = spec.flags();
    // SAFETY: TUNSETIFF reads and writes the ifreq we own.
    if unsafe { libc::ioctl(fd, libc::TUNSETIFF, &mut req as *mut libc::ifreq) } != 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EBUSY) {
            let mut e = Error::new(
                ErrorKind::AlreadyExists,
                format!("{what}: a link of that name already exists"),
            );
            e.errno = Some(libc::EBUSY);
            return Err(e);
        }
        return Err(Error::io(&what, &err));
    }
    if let Some(uid) = spec.owner {
        set(
            fd,
            libc::TUNSETOWNER,
            uid.into(),
            &format!("{what}: owner {uid}"),
        )?;
    }
    if let Some(gid) = spec.group {
        set(
            fd,
            libc::TUNSETGROUP,
            gid.into(),
            &format!("{what}: group {gid}"),
        )?;
    }
    // SAFETY: `name` is NUL-free (checked above) and the CString outlives the call.
    let cname = std::ffi::CString::new(name).expect("no NUL in the name");
    let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if index == 0 {
        return Err(Error::io(&what, &io::Error::last_os_error()));
    }
    // Closing the descriptor removes a device that is not persistent yet.
    set(fd, libc::TUNSETPERSIST, 1, &format!("{what}: persist"))?;
    Ok(index)
}

/// An ioctl whose argument is the value itself.
fn set(fd: RawFd, request: libc::Ioctl, value: libc::c_ulong, what: &str) -> Result<()> {
    // SAFETY: these tun ioctls take an integer argument, no pointer.
    if unsafe { libc::ioctl(fd, request, value) } != 0 {
        return Err(Error::io(what, &io::Error::last_os_error()));
    }
    Ok(())
}

fn open_error(what: &str, err: &io::Error) -> Error {
    match err.raw_os_error() {
        Some(libc::ENOENT | libc::ENODEV | libc::ENXIO) => {
            let mut e = Error::new(
                ErrorKind::Unsupported,
                format!("{what}: this kernel has no TUN/TAP support (CONFIG_TUN, {TUN_DEVICE})"),
            );
            e.errno = err.raw_os_error();
            e
        }
        _ => Error::io(&format!("{what}: open {TUN_DEVICE}"), err),
    }
}

/// Whether `/dev/net/tun` opens here (which loads the tun module if need be), creating
/// nothing; Ok(false) when the kernel has no TUN/TAP support.
pub fn tap_supported() -> Result<bool> {
    match OpenOptions::new().read(true).write(true).open(TUN_DEVICE) {
        Ok(_) => Ok(true),
        Err(e) => match open_error("open", &e) {
            e if e.kind == ErrorKind::Unsupported => Ok(false),
            e => Err(e),
        },
    }
}

/// The SELinux context of the calling thread, None when SELinux is not enabled.
pub fn selinux_context() -> Option<String> {
    std::fs::metadata("/sys/fs/selinux/enforce").ok()?;
    let current = std::fs::read("/proc/thread-self/attr/current").ok()?;
    let text = String::from_utf8_lossy(&current);
    Some(text.trim_end_matches(['\0', '\n']).to_string())
}

impl Netlink {
    /// The tun details of link `index`; None when it is missing or not of kind "tun".
    pub fn tun_info(&mut self, index: u32) -> Result<Option<TunInfo>> {
        let raw = self
            .get_link(link_message(index, vec![]))
            .map_err(|f| f.context(&format!("read link index {index}")))?;
        let Some((_, attrs)) = raw else {
            return Ok(None);
        };
        let data = attrs
            .iter()
            .filter_map(|a| match a {
                LinkAttribute::LinkInfo(infos) => Some(infos),
                _ => None,
            })
            .flatten()
            .find_map(|info| match info {
                LinkInfo::Data(InfoData::Tun(data)) => Some(data),
                _ => None,
            });
        Ok(data.map(|d| tun_info(d)))
    }
}

fn tun_info(data: &[InfoTun]) -> TunInfo {
    let mut info = TunInfo::default();
    for item in data {
        let InfoTun::Other(nla) = item else {
            continue;
        };
        let mut value = vec![0u8; nla.value_len()];
        nla.emit_value(&mut value);
        let byte = value.first().copied().unwrap_or(0);
        let word = value
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_ne_bytes);
        match nla.kind() {
            IFLA_TUN_OWNER => info.owner = word,
            IFLA_TUN_GROUP => info.group = word,
            IFLA_TUN_TYPE => info.tap = i32::from(byte) == libc::IFF_TAP,
            IFLA_TUN_VNET_HDR => info.vnet_hdr = byte != 0,
            IFLA_TUN_PERSIST => info.persist = byte != 0,
            IFLA_TUN_MULTI_QUEUE => info.multi_queue = byte != 0,
            _ => {}
        }
    }
    info
}
