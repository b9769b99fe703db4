//! Test harness: real servers on 127.0.0.1 in this process, each on its own temp root,
//! an instance created on them through the admin role, and client connections (with a
//! capability, as a mounted client has) that route requests with the placement
//! functions as the real client does.
#![allow(dead_code)]

use spillway_placement::{dentry_server, Layout};
use spillway_server::{start_in_process, RunningServer};
use spillway_types::capability::{mint, Capability};
use spillway_types::descriptor::decode_hex;
use spillway_types::stage_ticket::{self, StageTicket};
use spillway_types::{Attr, Errno, FileKind, InodeNo, StripeIndex, Tunables, ROOT_INODE};
use spillway_wire::{
    AttrReply, Call, CreateReq, Endpoint, ExtendSizeReq, FragmentCreateReq, GetAttrReq, HelloReq,
    LinkCountReq, LookupReply, LookupReq, ReadDirReq, ReadReq, Role, StageDir, StageFileResult,
    StageFileSpec, StageFilesReq, StripeInfoReq, StripeLen, WriteReq,
};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub const INSTANCE: u64 = 42;
/// The instance secret: what the fragments are created with and peers present.
pub const SECRET: &[u8] = b"test-credential";
/// Where test clients connect from.
pub const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

/// A capability for `instance` keyed by `secret`, usable from `addrs` (empty: from
/// anywhere) until `expires` (unix seconds), as the manager would mint it.
pub fn mint_cap(secret: &[u8], instance: u64, addrs: &[IpAddr], expires: u64) -> Vec<u8> {
    mint(
        secret,
        &Capability {
            instance,
            node: "test-node".into(),
            addrs: addrs.to_vec(),
            expires,
        },
    )
}

/// A valid capability for the test instance, from 127.0.0.1, for an hour.
pub fn capability() -> Vec<u8> {
    mint_cap(SECRET, INSTANCE, &[LOOPBACK], unix_now() + 3600)
}

/// The hello of a client of the test instance.
pub fn client_hello() -> HelloReq {
    hello(Role::Client, INSTANCE, &capability())
}

pub fn tunables() -> Tunables {
    Tunables {
        rpc_deadline: Duration::from_secs(10),
        reconnect_window: Duration::from_secs(1),
        server_workers: 4,
        fd_cache_size: 64,
        ..Tunables::default()
    }
}

/// `role`: a `Role`, or any byte (a role no build knows, to see it refused).
pub fn hello(role: impl Into<u8>, instance: u64, credential: &[u8]) -> HelloReq {
    HelloReq {
        version_min: 1,
        version_max: 1,
        role: role.into(),
        instance,
        credential: credential.to_vec(),
        peer_name: "test".into(),
        mount: 0,
    }
}

pub fn endpoint(addr: SocketAddr, hello: HelloReq) -> Endpoint {
    Endpoint::new(
        addr.to_string(),
        hello,
        Duration::from_secs(10),
        Duration::from_secs(1),
    )
}

pub fn admin_key(root: &Path) -> Vec<u8> {
    let text = std::fs::read_to_string(root.join("admin.key")).expect("admin.key");
    decode_hex(text.trim()).expect("admin key is hex")
}

/// One server: its root and (while running) the server.
pub struct Node {
    pub root: PathBuf,
    pub addr: SocketAddr,
    pub server: Option<RunningServer>,
}

impl Node {
    pub fn start(root: PathBuf) -> Node {
        Node::start_on(root, TcpListener::bind("127.0.0.1:0").expect("bind"))
    }

    /// A server with the given tunables (production defaults, for measurements).
    pub fn start_tuned(root: PathBuf, t: Tunables) -> Node {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let server = start_in_process(&root, listener, t).expect("start server");
        Node {
            addr: server.addr(),
            root,
            server: Some(server),
        }
    }

    /// A server on a listener of the caller's choosing (another address family).
    pub fn start_on(root: PathBuf, listener: TcpListener) -> Node {
        let server = start_in_process(&root, listener, tunables()).expect("start server");
        Node {
            addr: server.addr(),
            root,
            server: Some(server),
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut s) = self.server.take() {
            s.stop();
        }
    }

    /// Start again on the same root and port.
    pub fn restart(&mut self) {
        self.stop();
        let listener = TcpListener::bind(self.addr).expect("rebind the same port");
        self.server =
            Some(start_in_process(&self.root, listener, tunables()).expect("restart server"));
    }

    pub fn admin(&self) -> Endpoint {
        self.admin_at(self.addr)
    }

    /// The admin role through another of the server's addresses (a wildcard listener).
    pub fn admin_at(&self, addr: SocketAddr) -> Endpoint {
        endpoint(addr, hello(Role::Admin, 0, &admin_key(&self.root)))
    }

    /// Purges of the test instance this server still owes, as an operator sees them
    /// (the server holds its database exclusively: nobody else may open it).
    pub fn pending_purges(&self) -> u64 {
        self.admin()
            .call(&spillway_wire::FragmentListReq {})
            .unwrap()
            .fragments
            .iter()
            .find(|f| f.instance == INSTANCE)
            .map_or(0, |f| f.pending_purges)
    }
}

/// One file staged alone by the server behind `peer` (a peer connection): a
/// `StageFilesReq` of that file, which must be answered, and the file's result.
pub fn stage_one(
    peer: &Endpoint,
    direction: StageDir,
    ticket: Vec<u8>,
    file: StageFileSpec,
) -> StageFileResult {
    let files = vec![file];
    let r = peer
        .call(&StageFilesReq {
            direction,
            ticket,
            files,
        })
        .expect("StageFiles");
    r.results.into_iter().next().expect("one result per file")
}

/// `stage_one`, which must be done.
pub fn stage_one_done(peer: &Endpoint, direction: StageDir, ticket: Vec<u8>, file: StageFileSpec) {
    let x = stage_one(peer, direction, ticket, file);
    let done = spillway_wire::stage_file_outcome::DONE;
    assert_eq!(x.outcome, done, "{}", x.message);
}

/// A stage ticket for the test instance, signed with its secret as the manager signs
/// one: stage `stage`, as `uid`, `direction`, covering `pfs` and `inside`, for an hour.
pub fn ticket(stage: u64, uid: u32, direction: StageDir, pfs: &[&str], inside: &[&str]) -> Vec<u8> {
    ticket_for(
        SECRET,
        &StageTicket {
            instance: INSTANCE,
            stage,
            uid,
            direction: direction.into(),
            expires: unix_now() + 3600,
            pfs_paths: pfs.iter().map(|p| p.to_string()).collect(),
            instance_paths: inside.iter().map(|p| p.to_string()).collect(),
        },
    )
}

/// `t` signed with `secret`.
pub fn ticket_for(secret: &[u8], t: &StageTicket) -> Vec<u8> {
    stage_ticket::try_mint(secret, t).expect("a ticket within the format's limits")
}

/// An instance spread over `n` servers, with one client connection per server, and a
/// PFS directory (`pfs`) that is the servers' only PFS root.
pub struct Cluster {
    _dir: tempfile::TempDir,
    /// The servers' PFS root (their `pfs_roots` tunable), created before them.
    pub pfs: tempfile::TempDir,
    pub nodes: Vec<Node>,
    pub clients: Vec<Endpoint>,
    pub stripe_size: u32,
}

impl Cluster {
    pub fn start(n: usize, capacity: u64, stripe_size: u32) -> Cluster {
        Cluster::start_tuned(n, capacity, stripe_size, tunables())
    }

    pub fn start_tuned(n: usize, capacity: u64, stripe_size: u32, mut t: Tunables) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let pfs = tempfile::tempdir().expect("tempdir");
        if t.pfs_roots.is_empty() {
            let root = pfs.path().canonicalize().expect("canonical PFS root");
            t.pfs_roots = vec![root.display().to_string()];
        }
        let nodes: Vec<Node> = (0..n)
            .map(|i| Node::start_tuned(dir.path().join(format!("s{i}")), t.clone()))
            .collect();
        let peers: Vec<String> = nodes.iter().map(|n| n.addr.to_string()).collect();
        for (i, node) in nodes.iter().enumerate() {
            node.admin()
                .call(&FragmentCreateReq {
                    instance: INSTANCE,
                    index: i as u16,
                    peers: peers.clone(),
                    capacity,
                    credential: SECRET.to_vec(),
                    stripe_size,
                    root_uid: 1000,
                    root_gid: 100,
                    root_mode: 0o40755,
                })
                .expect("create fragment");
        }
        let clients = nodes
            .iter()
            .map(|n| endpoint(n.addr, client_hello()))
            .collect();
        Cluster {
            _dir: dir,
            pfs,
            nodes,
            clients,
            stripe_size,
        }
    }

    /// Fresh client connections (after servers restarted).
    pub fn reconnect(&mut self) {
        self.clients = self
            .nodes
            .iter()
            .map(|n| endpoint(n.addr, client_hello()))
            .collect();
    }

    pub fn n(&self) -> u16 {
        self.nodes.len() as u16
    }

    /// The client connection to server `i`.
    pub fn at(&self, i: u16) -> &Endpoint {
        &self.clients[usize::from(i)]
    }

    /// A fresh connection to server `i` in the peer role (as another server of the
    /// instance: it presents the instance secret).
    #[allow(dead_code)]
    pub fn peer(&self, i: u16) -> Endpoint {
        endpoint(
            self.nodes[usize::from(i)].addr,
            hello(Role::Peer, INSTANCE, SECRET),
        )
    }

    pub fn entry_server(&self, parent: InodeNo, name: &[u8]) -> &Endpoint {
        self.at(dentry_server(parent, name, self.n()).0)
    }

    pub fn home(&self, ino: InodeNo) -> &Endpoint {
        self.at(ino.home().0)
    }

    pub fn call_entry<C: Call>(
        &self,
        parent: InodeNo,
        name: &[u8],
        req: &C,
    ) -> Result<C::Reply, Errno> {
        self.entry_server(parent, name).call(req)
    }

    pub fn create(&self, parent: InodeNo, name: &str, kind: FileKind) -> Result<Attr, Errno> {
        self.create_with(parent, name, kind, 0, 0)
    }

    pub fn create_with(
        &self,
        parent: InodeNo,
        name: &str,
        kind: FileKind,
        stripe_size: u32,
        stripe_width: u16,
    ) -> Result<Attr, Errno> {
        let req = CreateReq {
            stripe_size,
            stripe_width,
            ..CreateReq::new(parent, name.as_bytes(), kind, 0o644, 1000, 100)
        };
        self.call_entry(parent, name.as_bytes(), &req)
            .map(|r| r.attr)
    }

    pub fn lookup(&self, parent: InodeNo, name: &str) -> Result<LookupReply, Errno> {
        self.call_entry(
            parent,
            name.as_bytes(),
            &LookupReq {
                parent,
                name: name.as_bytes().to_vec(),
            },
        )
    }

    pub fn getattr(&self, ino: InodeNo) -> Result<Attr, Errno> {
        self.home(ino).call(&GetAttrReq { ino }).map(|r| r.attr)
    }

    fn layout(&self, a: &Attr) -> Layout {
        Layout::of(a.ino, a.stripe_size, a.stripe_width, self.n())
    }

    /// Write `data` at `offset` of the file, stripe by stripe, then report the size.
    pub fn write(&self, a: &Attr, offset: u64, data: &[u8]) -> Result<(), Errno> {
        let layout = self.layout(a);
        let mut pos = 0usize;
        for (stripe, within, len) in layout.pieces(offset, data.len() as u64) {
            let piece = &data[pos..pos + len as usize];
            let req = write_req(a.ino, stripe.0, within);
            let w = self.at(layout.server_of(stripe).0).call_bulk(&req, piece)?;
            assert_eq!(w.written, len);
            pos += len as usize;
        }
        self.home(a.ino).call(&ExtendSizeReq {
            ino: a.ino,
            size: offset + data.len() as u64,
            touch: true,
            sync: false,
        })?;
        Ok(())
    }

    pub fn read(&self, a: &Attr, offset: u64, len: u64) -> Result<Vec<u8>, Errno> {
        let layout = self.layout(a);
        let mut out = Vec::new();
        for (stripe, within, n) in layout.pieces(offset, len) {
            let mut got = self.at(layout.server_of(stripe).0).call(&ReadReq {
                ino: a.ino,
                stripe: stripe.0,
                offset: within,
                len: n,
            })?;
            got.resize(n as usize, 0);
            out.extend_from_slice(&got);
        }
        Ok(out)
    }

    pub fn stripes_on(&self, server: u16, ino: InodeNo) -> Vec<StripeLen> {
        self.at(server)
            .call(&StripeInfoReq { ino })
            .expect("stripe info")
            .stripes
    }

    pub fn server_of(&self, a: &Attr, stripe: u64) -> u16 {
        self.layout(a).server_of(StripeIndex(stripe)).0
    }

    /// Every entry of `dir` on every server, name-sorted, read in pages of `page`.
    pub fn read_dir_all(&self, dir: InodeNo, page: u32) -> Vec<Vec<u8>> {
        let mut names = Vec::new();
        for ep in &self.clients {
            let mut after = Vec::new();
            loop {
                let r = ep
                    .call(&ReadDirReq {
                        dir,
                        after: after.clone(),
                        max: page,
                        plus: true,
                    })
                    .expect("readdir");
                assert!(r.entries.len() <= page as usize);
                // READDIRPLUS: attributes come only for the inodes this server homes,
                // and they are that inode's.
                for e in &r.entries {
                    if let Some(a) = &e.attr {
                        assert_eq!(a.ino, e.entry.ino, "attributes of another inode");
                        assert_eq!(a.kind, e.entry.kind);
                    }
                }
                names.extend(r.entries.iter().map(|e| e.name.clone()));
                match r.entries.last() {
                    Some(last) if r.more => after = last.name.clone(),
                    _ => break,
                }
            }
        }
        names.sort();
        names
    }
}

/// Poll `f` until it holds or `within` passes.
pub fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if f() {
            return true;
        }
        if start.elapsed() > within {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A write at `offset` of stripe `stripe` that the client waits for: no space grant
/// spent (the server fits it into free space or refuses it), no sync. The data goes
/// as the bulk.
pub fn write_req(ino: InodeNo, stripe: u64, offset: u32) -> WriteReq {
    WriteReq {
        ino,
        stripe,
        offset,
        sync: false,
        grant_epoch: 0,
        charged: 0,
    }
}

/// LinkCount `delta` of `ino` at `home` (a server the inode is homed on).
pub fn link_count(home: &Endpoint, ino: InodeNo, delta: i32) -> Result<AttrReply, Errno> {
    home.call(&LinkCountReq { ino, delta })
}

pub fn root() -> InodeNo {
    ROOT_INODE
}
