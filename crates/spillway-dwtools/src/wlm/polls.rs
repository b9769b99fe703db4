//! What Slurm polls every 30 s (`pools`, `show_instances`, `show_sessions`) and once at
//! start (`show_configurations`): the manager's lists, cut down to what Slurm reads
//! (spec §1.4) and printed as strict JSON with one top-level key and integer numbers.
//! Answered from the manager's database; nothing here waits on a storage server.

use serde_json::json;
use spillway_api::{ApiClient, ApiError};

pub(super) fn pools(api: &ApiClient) -> Result<String, ApiError> {
    let pools: Vec<_> = api
        .list_pools()?
        .iter()
        .map(|p| {
            json!({"id": p.id, "units": "bytes", "granularity": p.granularity,
                   "quantity": p.quantity, "free": p.free})
        })
        .collect();
    Ok(json!({ "pools": pools }).to_string())
}

pub(super) fn instances(api: &ApiClient) -> Result<String, ApiError> {
    let list: Vec<_> = api
        .list_instances()?
        .iter()
        .map(|i| {
            json!({"id": i.id, "capacity": {"bytes": i.capacity.bytes, "nodes": i.capacity.nodes},
                   "created": i.created, "links": {"session": i.links.session}})
        })
        .collect();
    Ok(json!({ "instances": list }).to_string())
}

pub(super) fn sessions(api: &ApiClient) -> Result<String, ApiError> {
    let list: Vec<_> = api
        .list_sessions()?
        .iter()
        .map(|s| {
            json!({"id": s.id, "created": s.created, "creator": s.creator,
                   "owner": s.owner, "token": s.token})
        })
        .collect();
    Ok(json!({ "sessions": list }).to_string())
}

pub(super) fn configurations(api: &ApiClient) -> Result<String, ApiError> {
    let list: Vec<_> = api
        .list_configurations()?
        .iter()
        .map(|c| json!({"id": c.id, "links": {"instance": c.links.instance}}))
        .collect();
    Ok(json!({ "configurations": list }).to_string())
}
