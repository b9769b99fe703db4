//! What the reconcile loop and the agents read and record: work toward each object's
//! goal, the outcome of each attempt, and the roll-ups and cascades that follow.

use super::{now, Db, DbResult, FUSE_LIMIT};
use rusqlite::params;
use spillway_api::{AccessMode, AgentMount, AgentReport, ConfigType, Goal};

/// Why a call to a server did not reach its goal. Only refusals count toward the fuse:
/// an unreachable server is retried for as long as it takes (it goes offline after the
/// node timeout and its work waits).
#[derive(Clone, Debug)]
pub enum CallError {
    Transient(String),
    Refused(String),
}

impl CallError {
    fn parts(&self) -> (&str, i64) {
        match self {
            CallError::Transient(m) => (m, 0),
            CallError::Refused(m) => (m, 1),
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.parts().0)
    }
}

#[derive(Clone, Debug)]
pub struct NodeProbe {
    pub id: String,
    pub address: String,
}

/// A fragment to build on its server.
#[derive(Clone, Debug)]
pub struct FragmentWork {
    pub fragment: u64,
    pub instance: u64,
    pub index: u16,
    pub address: String,
    /// Addresses of every fragment's server, in index order.
    pub peers: Vec<String>,
    pub capacity: u64,
    pub secret: Vec<u8>,
    pub stripe_size: u32,
    pub root_uid: u32,
    pub root_gid: u32,
}

#[derive(Clone, Debug)]
pub struct DestroyFragment {
    pub fragment: u64,
    pub instance: u64,
    pub address: String,
}

/// A configuration whose root directory attributes must be applied.
#[derive(Clone, Debug)]
pub struct ConfigWork {
    pub configuration: u64,
    pub instance: u64,
    pub peers: Vec<String>,
    pub secret: Vec<u8>,
    pub mode: u32,
    pub gid: u32,
    /// A cache configuration: what every server is told to cache, for whom.
    pub cache: Option<CacheWork>,
    /// A load-balanced configuration: every server is told to hold whole replicas
    /// (`LdbalConfigReq`, docs/cache.md §6) before anything else is applied.
    pub ldbal: bool,
}

/// The `CacheConfigReq` of a cache configuration.
#[derive(Clone, Debug)]
pub struct CacheWork {
    pub pfs: String,
    pub owner: u32,
    pub modified_threshold: u64,
    pub read_ahead: u64,
    pub sync_on_close: bool,
    pub sync_to_pfs: bool,
}

/// Everything an agent needs to mount one instance (the capability is minted by the
/// caller, who knows the node's addresses and the lifetime).
#[derive(Clone, Debug)]
pub struct MountWork {
    pub activation: u64,
    pub goal: Goal,
    pub mount: String,
    pub instance: u64,
    pub servers: Vec<String>,
    pub capacity: u64,
    pub stripe_size: u32,
    pub secret: Vec<u8>,
    /// The configuration's access mode is `private`: the node's mount shows its own
    /// directory of the instance (`spillway_api::private_root_dir`).
    pub private: bool,
    /// The configuration is a cache (its namespace is a PFS directory's).
    pub cache: bool,
    /// The configuration is load-balanced (read-only replicas, docs/cache.md §6).
    pub ldbal: bool,
    /// A load-balanced mount: the replica this node reads from first
    /// (`spillway_placement::replica_of_rank`, by its rank among the activation's nodes).
    pub replica: Option<u16>,
}

impl Db {
    fn peers(&self, instance: u64) -> DbResult<Vec<String>> {
        let mut st = self.conn().prepare_cached(
            "SELECT n.address FROM fragments f JOIN nodes n ON n.id = f.node
             WHERE f.instance = ?1 ORDER BY f.idx",
        )?;
        let rows = st
            .query_map([instance as i64], |r| r.get(0))?
            .collect::<Result<Vec<String>, _>>()?;
        Ok(rows)
    }

    pub fn nodes_to_probe(&self) -> DbResult<Vec<NodeProbe>> {
        let mut st = self
            .conn()
            .prepare_cached("SELECT id, address FROM nodes ORDER BY id")?;
        let rows = st
            .query_map([], |r| {
                Ok(NodeProbe {
                    id: r.get(0)?,
                    address: r.get(1)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    /// Record a heartbeat answer (`Ok(capacity)`) or failure. A node goes offline only
    /// after `timeout_secs` without an answer. Returns whether `online` changed.
    pub fn record_heartbeat(
        &mut self,
        id: &str,
        result: Result<u64, String>,
        timeout_secs: i64,
    ) -> DbResult<bool> {
        let t = now();
        let before: Option<bool> = self
            .conn()
            .query_row("SELECT online FROM nodes WHERE id = ?1", [id], |r| r.get(0))
            .ok();
        let Some(before) = before else {
            return Ok(false);
        };
        match result {
            Ok(capacity) => {
                self.conn().execute(
                    "UPDATE nodes SET online = 1, health = 'ok', reported_capacity = ?2,
                         last_heartbeat = ?3 WHERE id = ?1",
                    params![id, capacity.min(i64::MAX as u64) as i64, t],
                )?;
                Ok(!before)
            }
            Err(e) => {
                self.conn().execute(
                    "UPDATE nodes SET health = ?2,
                         online = CASE WHEN ?3 - last_heartbeat > ?4 THEN 0 ELSE online END
                     WHERE id = ?1",
                    params![id, e, t, timeout_secs],
                )?;
                let after: bool =
                    self.conn()
                        .query_row("SELECT online FROM nodes WHERE id = ?1", [id], |r| r.get(0))?;
                Ok(before != after)
            }
        }
    }

    pub fn fragment_work(&self) -> DbResult<Vec<FragmentWork>> {
        let mut rows: Vec<FragmentWork> = {
            let mut st = self.conn().prepare_cached(
                "SELECT f.id, f.instance, f.idx, n.address, f.bytes, i.secret, i.stripe_size,
                        i.root_uid, i.root_gid
                 FROM fragments f JOIN nodes n ON n.id = f.node JOIN instances i ON i.id = f.instance
                 WHERE f.goal = 'create' AND f.actualized = 0 AND f.failures < ?1
                   AND n.online = 1 AND i.goal = 'create'
                 ORDER BY f.instance, f.idx",
            )?;
            let rows = st
                .query_map([FUSE_LIMIT], |r| {
                    Ok(FragmentWork {
                        fragment: r.get::<_, i64>(0)? as u64,
                        instance: r.get::<_, i64>(1)? as u64,
                        index: r.get::<_, i64>(2)? as u16,
                        address: r.get(3)?,
                        peers: Vec::new(),
                        capacity: r.get::<_, i64>(4)? as u64,
                        secret: r.get(5)?,
                        stripe_size: r.get::<_, i64>(6)? as u32,
                        root_uid: r.get::<_, i64>(7)? as u32,
                        root_gid: r.get::<_, i64>(8)? as u32,
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            rows
        };
        for w in &mut rows {
            w.peers = self.peers(w.instance)?;
        }
        Ok(rows)
    }

    pub fn record_fragment(&mut self, id: u64, result: Result<(), CallError>) -> DbResult<()> {
        match result {
            Ok(()) => self.conn().execute(
                "UPDATE fragments SET actualized = 1, failures = 0, last_error = NULL WHERE id = ?1",
                [id as i64],
            )?,
            Err(e) => self.conn().execute(
                "UPDATE fragments SET failures = failures + ?3, last_error = ?2 WHERE id = ?1",
                params![id as i64, e.parts().0, e.parts().1],
            )?,
        };
        Ok(())
    }

    /// Fragments to destroy now. An instance's fragment 0 goes last, once its other
    /// fragments are gone: in a cache instance it holds the namespace, through which
    /// the others reach the PFS files they still write behind as they go.
    pub fn destroy_work(&self) -> DbResult<Vec<DestroyFragment>> {
        let mut st = self.conn().prepare_cached(
            "SELECT f.id, f.instance, n.address FROM fragments f JOIN nodes n ON n.id = f.node
             WHERE f.goal = 'destroy' AND f.failures < ?1 AND n.online = 1
               AND (f.idx <> 0 OR NOT EXISTS (
                    SELECT 1 FROM fragments o WHERE o.instance = f.instance AND o.idx <> 0))
             ORDER BY f.id",
        )?;
        let rows = st
            .query_map([FUSE_LIMIT], |r| {
                Ok(DestroyFragment {
                    fragment: r.get::<_, i64>(0)? as u64,
                    instance: r.get::<_, i64>(1)? as u64,
                    address: r.get(2)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    /// A fragment destroyed on its server is forgotten.
    pub fn record_destroyed(&mut self, id: u64, result: Result<(), CallError>) -> DbResult<()> {
        match result {
            Ok(()) => self
                .conn()
                .execute("DELETE FROM fragments WHERE id = ?1", [id as i64])?,
            Err(e) => self.conn().execute(
                "UPDATE fragments SET failures = failures + ?3, last_error = ?2 WHERE id = ?1",
                params![id as i64, e.parts().0, e.parts().1],
            )?,
        };
        Ok(())
    }

    pub fn config_work(&self) -> DbResult<Vec<ConfigWork>> {
        type Row = (u64, u64, Vec<u8>, u32, u32, Option<CacheWork>, bool);
        let rows: Vec<Row> = {
            let mut st = self.conn().prepare_cached(
                "SELECT c.id, c.instance, i.secret, c.root_permissions, c.grp,
                        k.pfs, s.owner, k.modified_threshold, k.read_ahead, k.sync_on_close,
                        k.sync_to_pfs, c.access_mode
                 FROM configurations c JOIN instances i ON i.id = c.instance
                 JOIN sessions s ON s.id = i.session
                 LEFT JOIN cache_configs k ON k.configuration = c.id
                 WHERE c.goal = 'create' AND c.actualized = 0 AND c.failures < ?1
                   AND i.goal = 'create' AND i.actualized = 1 ORDER BY c.id",
            )?;
            let rows = st
                .query_map([FUSE_LIMIT], |r| {
                    let cache = match r.get::<_, Option<String>>(5)? {
                        Some(pfs) => Some(CacheWork {
                            pfs,
                            owner: r.get::<_, i64>(6)? as u32,
                            modified_threshold: r.get::<_, i64>(7)? as u64,
                            read_ahead: r.get::<_, i64>(8)? as u64,
                            sync_on_close: r.get(9)?,
                            sync_to_pfs: r.get(10)?,
                        }),
                        None => None,
                    };
                    Ok((
                        r.get::<_, i64>(0)? as u64,
                        r.get::<_, i64>(1)? as u64,
                        r.get(2)?,
                        r.get::<_, i64>(3)? as u32,
                        r.get::<_, i64>(4)? as u32,
                        cache,
                        r.get::<_, String>(11)? == AccessMode::Ldbal.as_str(),
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            rows
        };
        rows.into_iter()
            .map(
                |(configuration, instance, secret, mode, gid, cache, ldbal)| {
                    Ok(ConfigWork {
                        configuration,
                        instance,
                        peers: self.peers(instance)?,
                        secret,
                        mode,
                        gid,
                        cache,
                        ldbal,
                    })
                },
            )
            .collect()
    }

    pub fn record_config(&mut self, id: u64, result: Result<(), CallError>) -> DbResult<()> {
        match result {
            Ok(()) => self.conn().execute(
                "UPDATE configurations SET actualized = 1, failures = 0, last_error = NULL WHERE id = ?1",
                [id as i64],
            )?,
            Err(e) => self.conn().execute(
                "UPDATE configurations SET failures = failures + ?3, last_error = ?2 WHERE id = ?1",
                params![id as i64, e.parts().0, e.parts().1],
            )?,
        };
        Ok(())
    }

    /// Roll-ups and cascades, in one transaction. Whether anything changed is told by
    /// comparing `fingerprint`s (UPDATEs count rows even when they write the same value).
    pub fn advance(&mut self) -> DbResult<()> {
        let tx = self.conn_mut().transaction()?;
        tx.execute_batch(
            "
            -- a destroy goal flows down: session -> activations, instances;
            -- instance -> configurations; configuration -> activations.
            UPDATE instances SET goal = 'destroy', actualized = 0
             WHERE goal = 'create' AND session IN (SELECT id FROM sessions WHERE goal = 'destroy');
            UPDATE configurations SET goal = 'destroy', actualized = 0
             WHERE goal = 'create' AND instance IN (SELECT id FROM instances WHERE goal = 'destroy');
            UPDATE activations SET goal = 'destroy', actualized = 0, failures = 0
             WHERE goal = 'create'
               AND (session IN (SELECT id FROM sessions WHERE goal = 'destroy')
                    OR configuration IN (SELECT id FROM configurations WHERE goal = 'destroy'));

            -- an activation is gone once no node may still have it mounted (an agent
            -- also unmounts what it holds that is no longer asked of it).
            DELETE FROM activation_nodes WHERE activation IN (
              SELECT a.id FROM activations a WHERE a.goal = 'destroy' AND NOT EXISTS (
                SELECT 1 FROM activation_nodes n WHERE n.activation = a.id
                  AND n.status IN ('mounted', 'failed')));
            DELETE FROM activations WHERE goal = 'destroy'
              AND NOT EXISTS (SELECT 1 FROM activation_nodes n WHERE n.activation = activations.id);
            -- a configuration goes when nothing activates it
            DELETE FROM configurations WHERE goal = 'destroy'
              AND NOT EXISTS (SELECT 1 FROM activations a WHERE a.configuration = configurations.id);
            DELETE FROM cache_configs
              WHERE configuration NOT IN (SELECT id FROM configurations);
            ",
        )?;
        // Staging's part of a teardown: deferred stage-outs activated, stage-ins ended.
        Db::stage_teardown(&tx)?;
        tx.execute_batch(&format!(
            "
            -- an instance's fragments go once no configuration uses it and no stage-out
            -- of it is pending (nor a stage its coordinator still holds)
            UPDATE fragments SET goal = 'destroy', actualized = 0, failures = 0
             WHERE goal = 'create' AND instance IN (
               SELECT i.id FROM instances i WHERE i.goal = 'destroy'
                 AND NOT EXISTS (SELECT 1 FROM configurations c WHERE c.instance = i.id)
                 AND {hold});
            ",
            hold = Db::stage_hold_sql("i.id")
        ))?;
        let gone: Vec<i64> = tx
            .prepare_cached(
                "SELECT id FROM instances WHERE goal = 'destroy'
                   AND NOT EXISTS (SELECT 1 FROM configurations c WHERE c.instance = instances.id)
                   AND NOT EXISTS (SELECT 1 FROM fragments f WHERE f.instance = instances.id)",
            )?
            .query_map([], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        Db::stage_forget_instances(&tx, &gone)?;
        tx.execute_batch(
            "
            DELETE FROM instances WHERE goal = 'destroy'
              AND NOT EXISTS (SELECT 1 FROM configurations c WHERE c.instance = instances.id)
              AND NOT EXISTS (SELECT 1 FROM fragments f WHERE f.instance = instances.id);
            DELETE FROM sessions WHERE goal = 'destroy'
              AND NOT EXISTS (SELECT 1 FROM instances i WHERE i.session = sessions.id)
              AND NOT EXISTS (SELECT 1 FROM activations a WHERE a.session = sessions.id);

            -- roll-ups of create goals
            UPDATE instances SET actualized = (
                EXISTS (SELECT 1 FROM fragments f WHERE f.instance = instances.id)
                AND NOT EXISTS (SELECT 1 FROM fragments f WHERE f.instance = instances.id
                                AND f.actualized = 0))
             WHERE goal = 'create';
            UPDATE configurations SET actualized = 0
             WHERE goal = 'create' AND actualized = 1
               AND instance IN (SELECT id FROM instances WHERE actualized = 0);
            UPDATE activations SET actualized = NOT EXISTS (
                SELECT 1 FROM activation_nodes n WHERE n.activation = activations.id
                  AND n.status <> 'mounted')
             WHERE goal = 'create';
            UPDATE sessions SET actualized = (
                NOT EXISTS (SELECT 1 FROM instances i WHERE i.session = sessions.id AND i.actualized = 0)
                AND NOT EXISTS (SELECT 1 FROM activations a WHERE a.session = sessions.id AND a.actualized = 0))
             WHERE goal = 'create';
            ",
        )?;
        tx.commit()?;
        Ok(())
    }

    /// A fingerprint of every goal and actualized flag, to tell whether a pass changed
    /// anything an agent or a waiting client could care about.
    pub fn fingerprint(&self) -> DbResult<String> {
        // COALESCE: group_concat of no rows is NULL, which would make the whole text
        // NULL (and every fingerprint equal) whenever one table is empty.
        let q = "SELECT
            COALESCE((SELECT group_concat(id || goal || actualized || failures, ',') FROM sessions), '') || '|' ||
            COALESCE((SELECT group_concat(id || goal || actualized || failures, ',') FROM instances), '') || '|' ||
            COALESCE((SELECT group_concat(id || goal || actualized || failures, ',') FROM fragments), '') || '|' ||
            COALESCE((SELECT group_concat(id || goal || actualized || failures, ',') FROM configurations), '') || '|' ||
            COALESCE((SELECT group_concat(id || goal || actualized || failures, ',') FROM activations), '') || '|' ||
            COALESCE((SELECT group_concat(activation || node || status, ',') FROM activation_nodes), '') || '|' ||
            COALESCE((SELECT group_concat(id || online || drain, ',') FROM nodes), '') || '|' ||
            COALESCE((SELECT group_concat(id || state || live || cancel, ',') FROM stages
              WHERE live = 1 OR state IN ('queued', 'deferred', 'running')), '')";
        Ok(self
            .conn()
            .query_row(q, [], |r| r.get::<_, Option<String>>(0))?
            .unwrap_or_default())
    }

    // ---------------------------------------------------------------- agents
    pub fn agent_hello(&mut self, node: &str, addresses: &[String]) -> DbResult<()> {
        self.conn().execute(
            "INSERT INTO agents(id, addresses, last_seen) VALUES (?1, ?2, ?3)
             ON CONFLICT(id) DO UPDATE SET addresses = ?2, last_seen = ?3",
            params![
                node,
                serde_json::to_string(addresses).unwrap_or_default(),
                now()
            ],
        )?;
        Ok(())
    }

    pub fn agent_addresses(&self, node: &str) -> DbResult<Vec<String>> {
        let s: Option<String> = self
            .conn()
            .query_row("SELECT addresses FROM agents WHERE id = ?1", [node], |r| {
                r.get(0)
            })
            .ok();
        Ok(s.and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or_default())
    }

    /// The mounts `node` must hold or drop.
    pub fn mount_work(&self, node: &str) -> DbResult<Vec<MountWork>> {
        let rows: Vec<(MountWork, bool)> = {
            let mut st = self.conn().prepare_cached(
                "SELECT a.id, a.goal, a.mount, i.id, i.bytes, i.stripe_size, i.secret,
                        (c.actualized = 1 AND i.actualized = 1 AND a.failures < ?2),
                        c.access_mode, c.type
                 FROM activations a JOIN activation_nodes n ON n.activation = a.id
                 JOIN configurations c ON c.id = a.configuration
                 JOIN instances i ON i.id = c.instance
                 WHERE n.node = ?1
                   AND ((a.goal = 'create') OR (a.goal = 'destroy' AND n.status <> 'unmounted'))
                 ORDER BY a.id",
            )?;
            let rows = st
                .query_map(params![node, FUSE_LIMIT], |r| {
                    let goal: String = r.get(1)?;
                    let mode: String = r.get(8)?;
                    Ok((
                        MountWork {
                            activation: r.get::<_, i64>(0)? as u64,
                            goal: super::goal_of(&goal),
                            mount: r.get(2)?,
                            instance: r.get::<_, i64>(3)? as u64,
                            servers: Vec::new(),
                            capacity: r.get::<_, i64>(4)? as u64,
                            stripe_size: r.get::<_, i64>(5)? as u32,
                            secret: r.get(6)?,
                            private: mode == AccessMode::Private.as_str(),
                            cache: r.get::<_, String>(9)? == ConfigType::Cache.as_str(),
                            ldbal: mode == AccessMode::Ldbal.as_str(),
                            replica: None,
                        },
                        r.get::<_, bool>(7)?,
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            rows
        };
        let mut out = Vec::new();
        for (mut w, ready) in rows {
            // A mount waits until its instance is built and its configuration applied.
            if w.goal == Goal::Create && !ready {
                continue;
            }
            w.servers = self.peers(w.instance)?;
            if w.ldbal && !w.servers.is_empty() {
                w.replica = Some(self.replica_of(w.activation, node, w.servers.len())?);
            }
            out.push(w);
        }
        Ok(out)
    }

    /// The replica `node` reads a load-balanced activation from first: by its rank
    /// among the activation's nodes (docs/placement.md, "Load-balanced replicas").
    fn replica_of(&self, activation: u64, node: &str, servers: usize) -> DbResult<u16> {
        // The nodes whose names sort before this one's (SQLite's BINARY collation:
        // bytewise, as docs/placement.md says).
        let rank: i64 = self.conn().query_row(
            "SELECT COUNT(*) FROM activation_nodes WHERE activation = ?1 AND node < ?2",
            params![activation as i64, node],
            |r| r.get(0),
        )?;
        let rank = rank as u64;
        let n = u16::try_from(servers).unwrap_or(u16::MAX);
        Ok(spillway_placement::replica_of_rank(rank, activation, n).0)
    }

    pub fn agent_report(&mut self, node: &str, r: &AgentReport) -> DbResult<bool> {
        let status = match r.status.as_str() {
            s @ ("mounted" | "unmounted" | "failed") => s,
            other => {
                return Err(super::DbError::Invalid(format!(
                    "status {} is not one of mounted, unmounted, failed",
                    crate::echo::quoted(other)
                )))
            }
        };
        let n = self.conn().execute(
            "UPDATE activation_nodes SET status = ?3, error = ?4 WHERE activation = ?1 AND node = ?2",
            params![r.activation as i64, node, status, r.error],
        )?;
        if n == 0 {
            return Ok(false);
        }
        if status == "failed" {
            self.conn().execute(
                "UPDATE activations SET failures = failures + 1, last_error = ?2 WHERE id = ?1",
                params![r.activation as i64, r.error],
            )?;
        }
        Ok(true)
    }
}

/// `AgentMount` without a descriptor (for destroy goals).
pub fn unmount_item(w: &MountWork) -> AgentMount {
    AgentMount {
        activation: w.activation,
        goal: w.goal,
        mount: w.mount.clone(),
        descriptor: None,
        root_dir: None,
    }
}
