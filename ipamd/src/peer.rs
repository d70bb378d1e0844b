//! Who is on the other end of a connection, from the kernel (SO_PEERCRED, SO_PEERGROUPS),
//! captured at connect time so it cannot be spoofed or raced by pid reuse.

use std::os::fd::AsRawFd;

use tokio::net::UnixStream;

/// SO_PEERGROUPS (Linux 4.13+): not exported by every libc version.
#[cfg(target_arch = "sparc64")]
const SO_PEERGROUPS: libc::c_int = 0x003d;
#[cfg(not(target_arch = "sparc64"))]
const SO_PEERGROUPS: libc::c_int = 59;

#[derive(Debug, Clone)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl Peer {
    pub(crate) fn of(stream: &UnixStream) -> std::io::Result<Peer> {
        let cred = stream.peer_cred()?;
        Ok(Peer {
            uid: cred.uid(),
            gid: cred.gid(),
            // Supplementary groups are best effort: on an old kernel only the primary group
            // counts.
            groups: peer_groups(stream.as_raw_fd()).unwrap_or_default(),
        })
    }

    /// root, or a member (primary or supplementary) of the configured group.
    pub fn allowed(&self, allowed_gid: Option<u32>) -> bool {
        self.uid == 0 || allowed_gid.is_some_and(|g| self.gid == g || self.groups.contains(&g))
    }
}

fn peer_groups(fd: std::os::fd::RawFd) -> std::io::Result<Vec<u32>> {
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: the buffer is valid for `len` bytes; the kernel writes at most that much.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / std::mem::size_of::<libc::gid_t>();
        if rc == 0 {
            groups.truncate(n);
            return Ok(groups);
        }
        let err = std::io::Error::last_os_error();
        // ERANGE: `len` now says how much room is needed.
        if err.raw_os_error() == Some(libc::ERANGE) && n > groups.len() && n <= 65536 {
            groups.resize(n, 0);
            continue;
        }
        return Err(err);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_rules() {
        let p = |uid, gid, groups: &[u32]| Peer {
            uid,
            gid,
            groups: groups.to_vec(),
        };
        assert!(p(0, 0, &[]).allowed(None));
        assert!(!p(1000, 1000, &[]).allowed(None));
        assert!(p(1000, 500, &[]).allowed(Some(500)));
        assert!(p(1000, 1000, &[27, 500]).allowed(Some(500)));
        assert!(!p(1000, 1000, &[27]).allowed(Some(500)));
    }
}
