//! Attaching the client's arena to a new connection (a part of `conn`; the protocol is
//! in `arena/door.rs` and docs/wire-protocol.md, "Shared-memory bulk"): ask the server
//! for an offer, check it is on this host, hand the memfd over at its door, and watch
//! the door socket, whose closing tells that the server no longer maps the arena.

use super::Conn;
use crate::arena::door::{peer_cred, send_token_and_fd, ArenaLink};
use crate::arena::host::HostId;
use crate::arena::Arena;
use crate::codec::Wire;
use crate::messages::{ArenaOfferReply, ArenaOfferReq, Call};
use spillway_types::Errno;
use std::io::{self, Read};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Attach `arena` to `conn` if its server is on this host and offers arenas; Err says
/// why not (the connection then carries bulk over the socket, as always).
pub(crate) fn attach(
    conn: &Conn,
    arena: &Arc<Arena>,
    timeout: Duration,
) -> Result<Arc<ArenaLink>, String> {
    let me = HostId::current().ok_or("this host's identity is unknown")?;
    let ticket = conn
        .send_raw(
            ArenaOfferReq::OP,
            &ArenaOfferReq {}.to_bytes(),
            &[],
            timeout,
        )
        .map_err(|e| format!("offer not sent: {e:?}"))?;
    let body = conn
        .wait_reply(&ticket, Instant::now() + timeout)
        .map_err(|e| format!("no offer: {e:?}"))?;
    let offer = ArenaOfferReply::from_bytes(&body).map_err(|e| format!("bad offer: {e}"))?;
    if offer.boot_id != me.boot_id || (offer.netns_dev, offer.netns_ino) != me.netns {
        return Err("the server is on another host".into());
    }
    let addr = SocketAddr::from_abstract_name(&offer.door).map_err(|e| e.to_string())?;
    let stream = UnixStream::connect_addr(&addr).map_err(|e| format!("door: {e}"))?;
    stream.set_read_timeout(Some(timeout)).ok();
    stream.set_write_timeout(Some(timeout)).ok();
    let (pid, uid) = peer_cred(&stream).map_err(|e| format!("door's peer: {e}"))?;
    // SAFETY: geteuid has no memory effects.
    let me_uid = unsafe { libc::geteuid() };
    if pid != offer.pid as i32 || (uid != 0 && uid != me_uid) {
        return Err(format!(
            "the door is held by pid {pid} uid {uid}, not the server (pid {})",
            offer.pid
        ));
    }
    send_token_and_fd(&stream, &offer.token, arena.fd()).map_err(|e| format!("door: {e}"))?;
    let mut answer = [0u8; 1];
    (&stream)
        .read_exact(&mut answer)
        .map_err(|e| format!("door's answer: {e}"))?;
    if answer[0] != 0 {
        return Err(format!("refused: {}", Errno(i32::from(answer[0]))));
    }
    let link = Arc::new(ArenaLink::new(arena.clone()));
    let watch = link.clone();
    std::thread::Builder::new()
        .name("arena-link".into())
        .spawn(move || {
            let _ = stream.set_read_timeout(None);
            let mut b = [0u8; 1];
            loop {
                match (&stream).read(&mut b) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            watch.closed();
        })
        .map_err(|e| e.to_string())?;
    Ok(link)
}
