//! The agents' side of the API (admin identity only: agents run as root): a long poll
//! for the mounts their node must hold, and reports of what they did.

use super::{ApiErr, AppState};
use crate::db::{unmount_item, MountWork};
use axum::extract::rejection::JsonRejection;
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::HeaderMap;
use axum::Json;
use serde_json::{json, Value};
use spillway_api::query::WorkQuery;
use spillway_api::{AgentHello, AgentMount, AgentReport, AgentWork, Goal};
use std::net::SocketAddr;
use std::time::Duration;

fn check_node(node: &str) -> Result<(), ApiErr> {
    let ok = !node.is_empty()
        && node.len() <= 64
        && node
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ApiErr::bad(format!(
            "invalid node name {}",
            super::quoted(node)
        )))
    }
}

fn agent_only(c: &crate::auth::Caller) -> Result<(), ApiErr> {
    if c.admin {
        Ok(())
    } else {
        Err(ApiErr::forbidden(
            "agent calls need an admin identity (agents run as root)",
        ))
    }
}

pub(super) async fn hello(
    State(st): State<AppState>,
    h: HeaderMap,
    Path(node): Path<String>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    b: Result<Json<AgentHello>, JsonRejection>,
) -> Result<Json<Value>, ApiErr> {
    check_node(&node)?;
    let hello = b.map(|Json(t)| t).map_err(|e| super::body_rejected(&e))?;
    // A capability binds at most this many addresses; a compute node has a few.
    if hello.addresses.len() > 16 {
        return Err(ApiErr::bad("at most 16 addresses per node"));
    }
    let mut addrs = Vec::new();
    for a in &hello.addresses {
        let ip: std::net::IpAddr = a
            .parse()
            .map_err(|_| ApiErr::bad(format!("{} is not an IP address", super::quoted(a))))?;
        addrs.push(ip.to_string());
    }
    if addrs.is_empty() {
        addrs.push(peer.ip().to_canonical().to_string());
    }
    st.change(&h, move |c, db| {
        agent_only(c)?;
        db.agent_hello(&node, &addrs)?;
        Ok(Json(json!({"node": node, "addresses": addrs})))
    })
    .await
}

pub(super) async fn work(
    State(st): State<AppState>,
    h: HeaderMap,
    Path(node): Path<String>,
    q: Result<Query<WorkQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<AgentWork>, ApiErr> {
    check_node(&node)?;
    let Query(q) = q.map_err(|e| ApiErr::bad(super::cut(&e.body_text())))?;
    // Authenticate before waiting, so an unauthenticated caller cannot hold a request.
    st.read(&h, |c, _| agent_only(c)).await?;
    let mut rx = st.version.subscribe();
    if let Some(v) = q.version {
        if *rx.borrow_and_update() == v {
            let wait = Duration::from_secs(q.wait.unwrap_or(0)).min(st.cfg.agent_wait_max);
            let _ = tokio::time::timeout(wait, rx.changed()).await;
        }
    }
    let version = *rx.borrow();
    let lifetime = st.cfg.capability_lifetime;
    let db = st.db.clone();
    let mounts = tokio::task::spawn_blocking(move || -> Result<Vec<AgentMount>, ApiErr> {
        let db = db.lock().unwrap_or_else(|e| e.into_inner());
        let addrs = db.agent_addresses(&node)?;
        let work = db.mount_work(&node)?;
        Ok(work
            .iter()
            .map(|w| describe(w, &node, &addrs, lifetime))
            .collect())
    })
    .await
    .map_err(|e| ApiErr::internal(e.to_string()))??;
    Ok(Json(AgentWork { version, mounts }))
}

/// The agent's item for one activation: for a mount, the descriptor with a capability
/// for this node.
///
/// A private configuration's mount shows the node's own directory of the instance,
/// `/.spillway-private/<node>` (the client creates it at mount). Without a valid node
/// name there is no such directory: the mount gets no descriptor (the agent reports a
/// failure) rather than the whole instance.
fn describe(w: &MountWork, node: &str, addrs: &[String], lifetime: Duration) -> AgentMount {
    if w.goal == Goal::Destroy {
        return unmount_item(w);
    }
    let root_dir = if w.private {
        match spillway_api::private_root_dir(node) {
            Some(d) => Some(d),
            None => {
                tracing::error!(
                    node,
                    activation = w.activation,
                    "no private directory for this node name"
                );
                return AgentMount {
                    activation: w.activation,
                    goal: w.goal,
                    mount: w.mount.clone(),
                    descriptor: None,
                    root_dir: None,
                };
            }
        }
    } else {
        None
    };
    let Some(credential) = crate::capability::credential(w, node, addrs, lifetime) else {
        tracing::error!(node, activation = w.activation, "cannot mint a capability");
        return AgentMount {
            activation: w.activation,
            goal: w.goal,
            mount: w.mount.clone(),
            descriptor: None,
            root_dir,
        };
    };
    let d = spillway_types::InstanceDescriptor {
        instance: w.instance,
        servers: w.servers.clone(),
        capacity: w.capacity,
        stripe_size: w.stripe_size,
        credential,
        cache: w.cache,
        ldbal: w.ldbal,
        replica: w.replica,
    };
    AgentMount {
        activation: w.activation,
        goal: w.goal,
        mount: w.mount.clone(),
        descriptor: Some(d.to_json()),
        root_dir,
    }
}

pub(super) async fn report(
    State(st): State<AppState>,
    h: HeaderMap,
    Path(node): Path<String>,
    b: Result<Json<AgentReport>, JsonRejection>,
) -> Result<Json<Value>, ApiErr> {
    check_node(&node)?;
    let r = b.map(|Json(t)| t).map_err(|e| super::body_rejected(&e))?;
    st.change(&h, move |c, db| {
        agent_only(c)?;
        if r.status == "failed" {
            tracing::warn!(node, activation = r.activation, error = ?r.error, "mount failed");
        }
        let known = db.agent_report(&node, &r)?;
        Ok(Json(json!({"recorded": known})))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(private: bool) -> MountWork {
        MountWork {
            activation: 3,
            goal: Goal::Create,
            mount: "/m".into(),
            instance: 9,
            servers: vec!["127.0.0.1:7000".into()],
            capacity: 1 << 30,
            stripe_size: 4096,
            secret: vec![5; 32],
            private,
            cache: false,
            ldbal: false,
            replica: None,
        }
    }

    #[test]
    fn private_mounts_get_the_nodes_directory_striped_ones_none() {
        let addrs = ["10.0.0.7".to_string()];
        let hour = Duration::from_secs(3600);
        let m = describe(&work(true), "c1", &addrs, hour);
        assert_eq!(m.root_dir.as_deref(), Some("/.spillway-private/c1"));
        assert!(m.descriptor.is_some());
        let m = describe(&work(false), "c1", &addrs, hour);
        assert_eq!(m.root_dir, None);
        assert!(m.descriptor.is_some());
        // A name that cannot be a directory gets no mount at all, never the instance.
        let m = describe(&work(true), ".hidden", &addrs, hour);
        assert_eq!((m.root_dir, m.descriptor), (None, None));
        // Unmounts need no root.
        let mut w = work(true);
        w.goal = Goal::Destroy;
        assert_eq!(describe(&w, "c1", &addrs, hour).root_dir, None);
    }
}
