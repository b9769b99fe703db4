//! The client stubs of one instance: its servers (an `Endpoint` each) and one call per
//! server handler (`lookup` here ↔ `LookupReq` there), each sent to the server the
//! placement functions name. Used by the FUSE client (`spillway-client`) and by the
//! storage servers' stage coordinator, which walks and fills an instance's namespace as
//! a peer.

pub mod instance;
pub mod locks;
pub mod sparse;

pub use instance::Instance;
