//! A mounted client follows a capability its agent renews in the descriptor file: before
//! each connection it reads the file again. A real server judges what it presents.

use spillway_client::Instance;
use spillway_types::capability::{mint, Capability};
use spillway_types::descriptor::{decode_hex, encode_hex};
use spillway_types::{Errno, InstanceDescriptor, ServerIndex, Tunables, ROOT_INODE};
use spillway_wire::{Endpoint, FragmentCreateReq, HelloReq, Role, PROTOCOL_VERSION};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::Path;
use std::time::Duration;

const INSTANCE: u64 = 77;
const SECRET: &[u8] = b"renewal-test-secret";

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn capability(instance: u64, expires: u64) -> String {
    encode_hex(&mint(
        SECRET,
        &Capability {
            instance,
            node: "renewal-node".into(),
            addrs: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
            expires,
        },
    ))
}

/// Write a descriptor as an agent renewing it would: a new file renamed over the old.
fn write_descriptor(path: &Path, instance: u64, server: SocketAddr, credential: String) {
    let d = InstanceDescriptor {
        instance,
        servers: vec![server.to_string()],
        capacity: 1 << 20,
        stripe_size: 1 << 20,
        credential,
        cache: false,
        ldbal: false,
        replica: None,
    };
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, d.to_json()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn hello(role: Role, instance: u64, credential: Vec<u8>) -> HelloReq {
    HelloReq {
        version_min: PROTOCOL_VERSION,
        version_max: PROTOCOL_VERSION,
        role: role.into(),
        instance,
        credential,
        peer_name: "renewal-test".into(),
        mount: 0,
    }
}

#[test]
fn a_renewed_capability_is_used_from_the_next_connection_on() {
    let dir = tempfile::tempdir().unwrap();
    let tunables = Tunables {
        rpc_deadline: Duration::from_secs(10),
        reconnect_window: Duration::from_secs(1),
        server_workers: 2,
        ..Tunables::default()
    };
    let root = dir.path().join("s0");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut server = spillway_server::start_in_process(&root, listener, tunables.clone()).unwrap();
    let addr = server.addr();
    let key = std::fs::read_to_string(root.join("admin.key")).unwrap();
    let admin = Endpoint::new(
        addr.to_string(),
        hello(Role::Admin, 0, decode_hex(key.trim()).unwrap()),
        Duration::from_secs(10),
        Duration::from_secs(1),
    );
    admin
        .call(&FragmentCreateReq {
            instance: INSTANCE,
            index: 0,
            peers: vec![addr.to_string()],
            capacity: 1 << 20,
            credential: SECRET.to_vec(),
            stripe_size: 1 << 20,
            root_uid: 0,
            root_gid: 0,
            root_mode: 0o755,
        })
        .unwrap();

    let path = dir.path().join("instance.json");
    write_descriptor(&path, INSTANCE, addr, capability(INSTANCE, now() + 3600));
    let desc = InstanceDescriptor::load(&path).unwrap();
    let inst = Instance::renewing_from(desc.clone(), &path, &tunables, "renewal-test");
    let reconnect = || {
        inst.server(ServerIndex(0)).unwrap().disconnect();
        inst.getattr(ROOT_INODE).map(|_| ())
    };
    assert_eq!(inst.getattr(ROOT_INODE).map(|_| ()), Ok(()));

    // An expired capability in the file is what the next connection presents (and is
    // refused): the file is read again at reconnection.
    write_descriptor(&path, INSTANCE, addr, capability(INSTANCE, now() - 1));
    assert_eq!(reconnect(), Err(Errno::EACCES));
    // Renewed: connected again.
    write_descriptor(&path, INSTANCE, addr, capability(INSTANCE, now() + 3600));
    assert_eq!(reconnect(), Ok(()));

    // Gone, torn, or about another instance: the last credential is kept.
    std::fs::remove_file(&path).unwrap();
    assert_eq!(reconnect(), Ok(()), "descriptor removed");
    std::fs::write(&path, "{ \"instance\": ").unwrap();
    assert_eq!(reconnect(), Ok(()), "descriptor torn");
    write_descriptor(&path, INSTANCE + 1, addr, capability(INSTANCE + 1, 0));
    assert_eq!(reconnect(), Ok(()), "descriptor of another instance");

    // Without a descriptor file to follow, the credential is the one it started with.
    write_descriptor(&path, INSTANCE, addr, capability(INSTANCE, now() - 1));
    let fixed = Instance::new(desc, &tunables, "renewal-test");
    assert_eq!(fixed.getattr(ROOT_INODE).map(|_| ()), Ok(()));

    server.stop();
}
