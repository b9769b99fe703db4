//! Rows to the API's resources. Each list is a handful of queries grouped in memory,
//! never one query per row, so `dwstat sessions` stays fast with thousands of rows.

use super::{state_of, Db, DbError, DbResult, Viewer};
use rusqlite::params;
use spillway_api::*;
use std::collections::HashMap;

/// A node's usable capacity: the admin's limit if set, else what it reports.
pub(crate) const NODE_CAPACITY: &str =
    "CASE WHEN n.capacity_limit > 0 AND n.capacity_limit < n.reported_capacity \
     THEN n.capacity_limit ELSE n.reported_capacity END";

fn group<K: std::hash::Hash + Eq, V>(pairs: Vec<(K, V)>) -> HashMap<K, Vec<V>> {
    let mut m: HashMap<K, Vec<V>> = HashMap::new();
    for (k, v) in pairs {
        m.entry(k).or_default().push(v);
    }
    m
}

/// SQL condition on a session id column `col` that the viewer may see.
fn session_visible(v: Viewer, col: &str) -> String {
    match v {
        Viewer::Admin => "1".into(),
        Viewer::User(uid) => format!(
            "({col} IN (SELECT id FROM sessions WHERE owner = {uid}) \
             OR {col} IN (SELECT session FROM instances WHERE public = 1))"
        ),
    }
}

/// SQL condition on an instance id column that the viewer may see.
fn instance_visible(v: Viewer, col: &str) -> String {
    match v {
        Viewer::Admin => "1".into(),
        Viewer::User(uid) => format!(
            "{col} IN (SELECT i.id FROM instances i JOIN sessions s ON s.id = i.session \
             WHERE s.owner = {uid} OR i.public = 1)"
        ),
    }
}

/// What a user (`uid`) is told who may not change the object `what` `id` (a session,
/// instance, configuration or activation that exists): if they may see it, 403 without
/// naming its owner; if not, exactly what a missing one answers (404 `no {what} {id}`),
/// so that its existence is not revealed (docs/control-plane.md, "Security").
pub(crate) fn refusal(conn: &rusqlite::Connection, uid: u32, what: &str, id: u64) -> DbError {
    let v = Viewer::User(uid);
    let cond = match what {
        "session" => format!(
            "SELECT 1 FROM sessions WHERE id = ?1 AND {}",
            session_visible(v, "id")
        ),
        "instance" => format!(
            "SELECT 1 FROM instances WHERE id = ?1 AND {}",
            instance_visible(v, "id")
        ),
        "configuration" => format!(
            "SELECT 1 FROM configurations WHERE id = ?1 AND {}",
            instance_visible(v, "instance")
        ),
        "fragment" => format!(
            "SELECT 1 FROM fragments WHERE id = ?1 AND {}",
            instance_visible(v, "instance")
        ),
        // Activations (and anything else) are seen by their owner only.
        _ => return DbError::NotFound(format!("no {what} {id}")),
    };
    use rusqlite::OptionalExtension;
    match conn.query_row(&cond, [id as i64], |_| Ok(())).optional() {
        Ok(Some(())) => DbError::Forbidden(format!("{what} {id} belongs to another user")),
        Ok(None) => DbError::NotFound(format!("no {what} {id}")),
        Err(e) => e.into(),
    }
}

impl Db {
    fn pairs(&self, sql: &str) -> DbResult<Vec<(u64, u64)>> {
        let mut st = self.conn().prepare_cached(sql)?;
        let rows = st
            .query_map([], |r| {
                Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    pub fn pools(&self) -> DbResult<Vec<Pool>> {
        let sql = format!(
            "SELECT p.id, p.units, p.granularity,
               COALESCE((SELECT SUM(({NODE_CAPACITY}) / p.granularity) FROM nodes n
                         WHERE n.pool = p.id AND n.online = 1 AND n.drain = 0), 0),
               COALESCE((SELECT SUM(MAX(({NODE_CAPACITY}) - COALESCE((SELECT SUM(f.bytes)
                             FROM fragments f WHERE f.node = n.id), 0), 0) / p.granularity)
                         FROM nodes n WHERE n.pool = p.id AND n.online = 1 AND n.drain = 0), 0)
             FROM pools p ORDER BY p.id"
        );
        let mut st = self.conn().prepare_cached(&sql)?;
        let rows = st
            .query_map([], |r| {
                Ok(Pool {
                    id: r.get(0)?,
                    units: r.get(1)?,
                    granularity: r.get::<_, i64>(2)? as u64,
                    quantity: r.get::<_, i64>(3)? as u64,
                    free: r.get::<_, i64>(4)? as u64,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    pub fn pool(&self, id: &str) -> DbResult<Pool> {
        self.pools()?
            .into_iter()
            .find(|p| p.id == id)
            .ok_or_else(|| DbError::NotFound(format!("no pool {}", crate::echo::quoted(id))))
    }

    pub fn nodes(&self) -> DbResult<Vec<Node>> {
        let frags: Vec<(String, u64, u64)> = {
            let mut st = self
                .conn()
                .prepare_cached("SELECT node, id, instance FROM fragments ORDER BY id")?;
            let rows = st
                .query_map([], |r| {
                    Ok((
                        r.get(0)?,
                        r.get::<_, i64>(1)? as u64,
                        r.get::<_, i64>(2)? as u64,
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            rows
        };
        let acts: Vec<(String, u64)> = {
            let mut st = self.conn().prepare_cached(
                "SELECT DISTINCT f.node, a.id FROM activations a
                 JOIN configurations c ON c.id = a.configuration
                 JOIN fragments f ON f.instance = c.instance ORDER BY a.id",
            )?;
            let rows = st
                .query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)))?
                .collect::<Result<Vec<_>, _>>()?;
            rows
        };
        let mut frag_by: HashMap<String, (Vec<u64>, Vec<u64>)> = HashMap::new();
        for (node, id, inst) in frags {
            let e = frag_by.entry(node).or_default();
            e.0.push(id);
            if !e.1.contains(&inst) {
                e.1.push(inst);
            }
        }
        let mut act_by = group(acts);
        let sql = format!(
            "SELECT n.id, n.address, n.pool, n.online, n.drain, {NODE_CAPACITY},
                    COALESCE((SELECT SUM(f.bytes) FROM fragments f WHERE f.node = n.id), 0),
                    COALESCE(p.granularity, 0), n.health, n.last_heartbeat
             FROM nodes n LEFT JOIN pools p ON p.id = n.pool ORDER BY n.id"
        );
        let mut st = self.conn().prepare_cached(&sql)?;
        let rows = st
            .query_map([], |r| {
                let capacity = r.get::<_, i64>(5)?.max(0) as u64;
                let used = r.get::<_, i64>(6)?.max(0) as u64;
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<String>>(2)?,
                    r.get::<_, bool>(3)?,
                    r.get::<_, bool>(4)?,
                    capacity,
                    capacity.saturating_sub(used),
                    r.get::<_, i64>(7)? as u64,
                    r.get::<_, String>(8)?,
                    r.get::<_, i64>(9)?,
                ))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows
            .into_iter()
            .map(
                |(id, address, pool, online, drain, capacity, free, gran, health, hb)| {
                    let (fragments, instances) = frag_by.remove(&id).unwrap_or_default();
                    let activations = act_by.remove(&id).unwrap_or_default();
                    Node {
                        id,
                        address,
                        pool,
                        online,
                        drain,
                        capacity,
                        free,
                        granularity: gran,
                        health,
                        last_heartbeat: hb,
                        links: NodeLinks {
                            fragments,
                            instances,
                            activations,
                        },
                    }
                },
            )
            .collect())
    }

    pub fn node(&self, id: &str) -> DbResult<Node> {
        self.nodes()?
            .into_iter()
            .find(|n| n.id == id)
            .ok_or_else(|| DbError::NotFound(format!("no node {}", crate::echo::quoted(id))))
    }

    pub fn sessions(&self, v: Viewer, only: Option<u64>) -> DbResult<Vec<Session>> {
        let insts = group(self.pairs("SELECT session, id FROM instances ORDER BY id")?);
        let acts = group(self.pairs("SELECT session, id FROM activations ORDER BY id")?);
        // Mixed: some instances or activations of the session reached the goal, others not.
        let mixed: HashMap<u64, bool> = self
            .pairs(
                "SELECT session, COUNT(DISTINCT actualized) FROM
                   (SELECT session, actualized FROM instances
                    UNION ALL SELECT session, actualized FROM activations) GROUP BY session",
            )?
            .into_iter()
            .map(|(s, n)| (s, n > 1))
            .collect();
        let sql = format!(
            "SELECT id, token, owner, creator, client_nodes, created, expiration, goal,
                    actualized, failures FROM sessions
             WHERE {} AND (?1 IS NULL OR id = ?1) ORDER BY id",
            session_visible(v, "id")
        );
        let now = super::now();
        let mut st = self.conn().prepare_cached(&sql)?;
        let rows = st
            .query_map(params![only.map(|i| i as i64)], |r| {
                let id = r.get::<_, i64>(0)? as u64;
                let nodes: String = r.get(4)?;
                let goal: String = r.get(7)?;
                let expiration: i64 = r.get(6)?;
                Ok(Session {
                    id,
                    token: r.get(1)?,
                    owner: r.get::<_, i64>(2)? as u32,
                    creator: r.get(3)?,
                    created: r.get(5)?,
                    expiration,
                    expired: expiration > 0 && expiration <= now,
                    links: SessionLinks {
                        client_nodes: serde_json::from_str(&nodes).unwrap_or_default(),
                        instances: insts.get(&id).cloned().unwrap_or_default(),
                        activations: acts.get(&id).cloned().unwrap_or_default(),
                    },
                    state: state_of(
                        &goal,
                        r.get(8)?,
                        r.get(9)?,
                        mixed.get(&id).copied().unwrap_or(false),
                    ),
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    pub fn session(&self, v: Viewer, id: u64) -> DbResult<Session> {
        self.sessions(v, Some(id))?
            .pop()
            .ok_or_else(|| DbError::NotFound(format!("no session {id}")))
    }

    pub fn instances(&self, v: Viewer, only: Option<u64>) -> DbResult<Vec<Instance>> {
        let confs = group(self.pairs("SELECT instance, id FROM configurations ORDER BY id")?);
        let frags = group(self.pairs("SELECT instance, id FROM fragments ORDER BY idx")?);
        // Intact: every fragment is on an online node.
        let broken: HashMap<u64, u64> = self
            .pairs(
                "SELECT f.instance, COUNT(*) FROM fragments f JOIN nodes n ON n.id = f.node
             WHERE n.online = 0 GROUP BY f.instance",
            )?
            .into_iter()
            .collect();
        let mixed: HashMap<u64, bool> = self
            .pairs("SELECT instance, COUNT(DISTINCT actualized) FROM fragments GROUP BY instance")?
            .into_iter()
            .map(|(i, n)| (i, n > 1))
            .collect();
        let sql = format!(
            "SELECT i.id, i.bytes, i.created, i.expiration, i.label, i.ww_length, i.ww_mult,
                    i.session, i.public, i.goal, i.actualized, i.failures, i.pool, i.policy,
                    i.requested, s.owner
             FROM instances i JOIN sessions s ON s.id = i.session
             WHERE {} AND (?1 IS NULL OR i.id = ?1) ORDER BY i.id",
            instance_visible(v, "i.id")
        );
        let now = super::now();
        let mut st = self.conn().prepare_cached(&sql)?;
        let rows = st
            .query_map(params![only.map(|i| i as i64)], |r| {
                let id = r.get::<_, i64>(0)? as u64;
                let expiration: i64 = r.get(3)?;
                let goal: String = r.get(9)?;
                let fragments = frags.get(&id).cloned().unwrap_or_default();
                let policy: String = r.get(13)?;
                Ok(Instance {
                    id,
                    capacity: Capacity {
                        bytes: r.get::<_, i64>(1)? as u64,
                        nodes: fragments.len() as u64,
                    },
                    created: r.get(2)?,
                    expiration,
                    expired: expiration > 0 && expiration <= now,
                    intact: !broken.contains_key(&id),
                    label: r.get(4)?,
                    limits: Limits {
                        write_window_length: r.get::<_, i64>(5)? as u64,
                        write_window_multiplier: r.get::<_, i64>(6)? as u64,
                    },
                    links: InstanceLinks {
                        session: r.get::<_, i64>(7)? as u64,
                        configurations: confs.get(&id).cloned().unwrap_or_default(),
                        fragments,
                    },
                    public: r.get(8)?,
                    state: state_of(
                        &goal,
                        r.get(10)?,
                        r.get(11)?,
                        mixed.get(&id).copied().unwrap_or(false),
                    ),
                    pool: r.get(12)?,
                    policy: Policy::parse(&policy).unwrap_or(Policy::Bandwidth),
                    requested_bytes: r.get::<_, i64>(14)? as u64,
                    owner: r.get::<_, i64>(15)? as u32,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    pub fn instance(&self, v: Viewer, id: u64) -> DbResult<Instance> {
        self.instances(v, Some(id))?
            .pop()
            .ok_or_else(|| DbError::NotFound(format!("no instance {id}")))
    }

    pub fn fragments(&self, v: Viewer, only: Option<u64>) -> DbResult<Vec<Fragment>> {
        let sql = format!(
            "SELECT id, bytes, node, idx, instance, goal, actualized, failures FROM fragments
             WHERE {} AND (?1 IS NULL OR id = ?1) ORDER BY instance, idx",
            instance_visible(v, "instance")
        );
        let mut st = self.conn().prepare_cached(&sql)?;
        let rows = st
            .query_map(params![only.map(|i| i as i64)], |r| {
                let goal: String = r.get(5)?;
                Ok(Fragment {
                    id: r.get::<_, i64>(0)? as u64,
                    capacity: r.get::<_, i64>(1)? as u64,
                    node: r.get(2)?,
                    index: r.get::<_, i64>(3)? as u32,
                    links: FragmentLinks {
                        instance: r.get::<_, i64>(4)? as u64,
                    },
                    state: state_of(&goal, r.get(6)?, r.get(7)?, false),
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    pub fn fragment(&self, v: Viewer, id: u64) -> DbResult<Fragment> {
        self.fragments(v, Some(id))?
            .pop()
            .ok_or_else(|| DbError::NotFound(format!("no fragment {id}")))
    }

    pub fn configurations(&self, v: Viewer, only: Option<u64>) -> DbResult<Vec<Configuration>> {
        let acts = group(self.pairs("SELECT configuration, id FROM activations ORDER BY id")?);
        let sql = format!(
            "SELECT id, type, access_mode, root_permissions, grp, instance, goal, actualized,
                    failures, k.pfs, k.modified_threshold, k.read_ahead, k.sync_on_close,
                    k.sync_to_pfs
             FROM configurations LEFT JOIN cache_configs k ON k.configuration = id
             WHERE {} AND (?1 IS NULL OR id = ?1) ORDER BY id",
            instance_visible(v, "instance")
        );
        let mut st = self.conn().prepare_cached(&sql)?;
        let rows = st
            .query_map(params![only.map(|i| i as i64)], |r| {
                let id = r.get::<_, i64>(0)? as u64;
                let kind: String = r.get(1)?;
                let mode: String = r.get(2)?;
                let goal: String = r.get(6)?;
                Ok(Configuration {
                    id,
                    kind: serde_json::from_value(serde_json::Value::String(kind))
                        .unwrap_or(ConfigType::Scratch),
                    access_mode: serde_json::from_value(serde_json::Value::String(mode))
                        .unwrap_or(AccessMode::Stripe),
                    root_permissions: r.get::<_, i64>(3)? as u32,
                    group: r.get::<_, i64>(4)? as u32,
                    pfs: r.get(9)?,
                    modified_threshold: r.get::<_, Option<i64>>(10)?.map(|v| v as u64),
                    read_ahead: r.get::<_, Option<i64>>(11)?.map(|v| v as u64),
                    sync_on_close: r.get(12)?,
                    sync_to_pfs: r.get(13)?,
                    links: ConfigurationLinks {
                        instance: r.get::<_, i64>(5)? as u64,
                        activations: acts.get(&id).cloned().unwrap_or_default(),
                    },
                    state: state_of(&goal, r.get(7)?, r.get(8)?, false),
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    pub fn configuration(&self, v: Viewer, id: u64) -> DbResult<Configuration> {
        self.configurations(v, Some(id))?
            .pop()
            .ok_or_else(|| DbError::NotFound(format!("no configuration {id}")))
    }

    pub fn activations(&self, v: Viewer, only: Option<u64>) -> DbResult<Vec<Activation>> {
        let mut nodes: HashMap<u64, Vec<ActivationNode>> = HashMap::new();
        {
            let mut st = self.conn().prepare_cached(
                "SELECT activation, node, status, error FROM activation_nodes ORDER BY node",
            )?;
            let rows = st.query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)? as u64,
                    ActivationNode {
                        node: r.get(1)?,
                        status: r.get(2)?,
                        error: r.get(3)?,
                    },
                ))
            })?;
            for row in rows {
                let (a, n) = row?;
                nodes.entry(a).or_default().push(n);
            }
        }
        let filter = match v {
            Viewer::Admin => "1".to_string(),
            Viewer::User(uid) => {
                format!("a.session IN (SELECT id FROM sessions WHERE owner = {uid})")
            }
        };
        let sql = format!(
            "SELECT a.id, a.mount, a.created, a.session, a.configuration, c.instance, a.goal,
                    a.actualized, a.failures
             FROM activations a JOIN configurations c ON c.id = a.configuration
             WHERE {filter} AND (?1 IS NULL OR a.id = ?1) ORDER BY a.id"
        );
        let mut st = self.conn().prepare_cached(&sql)?;
        let rows = st
            .query_map(params![only.map(|i| i as i64)], |r| {
                let id = r.get::<_, i64>(0)? as u64;
                let goal: String = r.get(6)?;
                let ns = nodes.remove(&id).unwrap_or_default();
                let settled = ns
                    .iter()
                    .filter(|n| n.status == "mounted" || n.status == "unmounted")
                    .count();
                let mixed = settled > 0 && settled < ns.len();
                Ok(Activation {
                    id,
                    mount: r.get(1)?,
                    created: r.get(2)?,
                    links: ActivationLinks {
                        session: r.get::<_, i64>(3)? as u64,
                        configuration: r.get::<_, i64>(4)? as u64,
                        instance: r.get::<_, i64>(5)? as u64,
                    },
                    nodes: ns,
                    state: state_of(&goal, r.get(7)?, r.get(8)?, mixed),
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    pub fn activation(&self, v: Viewer, id: u64) -> DbResult<Activation> {
        self.activations(v, Some(id))?
            .pop()
            .ok_or_else(|| DbError::NotFound(format!("no activation {id}")))
    }
}
