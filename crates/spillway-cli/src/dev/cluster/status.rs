//! `spillway cluster status`: the cluster's servers (running or not), the fragment
//! each holds (capacity, bytes used, inodes) and its mounts, as a table or JSON.

use super::admin;
use super::state::load;
use crate::sys::proc::alive;
use spillway_api::size::human;
use spillway_wire::messages::FragmentListReq;
use std::path::Path;

/// Print the cluster at `dir` (`--json`: as one JSON document).
pub fn status(dir: &Path, json: bool) -> Result<(), String> {
    let st = load(dir)?;
    let mut rows = Vec::new();
    for s in &st.servers {
        let running = s.pid.is_some_and(alive);
        let frag = if running {
            admin(s)
                .ok()
                .and_then(|ep| ep.call(&FragmentListReq {}).ok())
                .and_then(|r| r.fragments.into_iter().find(|f| f.instance == st.instance))
        } else {
            None
        };
        rows.push(serde_json::json!({
            "index": s.index,
            "listen": s.listen,
            "pid": s.pid,
            "running": running,
            "netns": s.netns,
            "capacity": frag.as_ref().map(|f| f.capacity),
            "used": frag.as_ref().map(|f| f.used),
            "inodes": frag.as_ref().map(|f| f.inodes),
        }));
    }
    if json {
        let doc =
            serde_json::json!({"instance": st.instance, "servers": rows, "mounts": st.mounts});
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    println!(
        "instance {}  capacity {}  stripe {}",
        st.instance,
        human(st.capacity),
        human(u64::from(st.stripe_size))
    );
    println!(
        "{:<6} {:<22} {:<8} {:>10} {:>10} {:>8}",
        "server", "address", "state", "capacity", "used", "inodes"
    );
    for r in rows {
        let n = |k: &str| r[k].as_u64().map(human).unwrap_or_else(|| "-".into());
        println!(
            "{:<6} {:<22} {:<8} {:>10} {:>10} {:>8}",
            r["index"],
            r["listen"].as_str().unwrap_or(""),
            if r["running"].as_bool() == Some(true) {
                "up"
            } else {
                "down"
            },
            n("capacity"),
            n("used"),
            r["inodes"]
                .as_u64()
                .map(|v| v.to_string())
                .unwrap_or_else(|| "-".into())
        );
    }
    for m in &st.mounts {
        println!("mount  {}", m.path.display());
    }
    Ok(())
}
