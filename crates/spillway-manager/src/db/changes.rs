//! Changes asked for through the API: creates, updates and destroy goals. Each runs in
//! one transaction, checks who may do it, and leaves the servers' and agents' work to
//! the reconcile loop (nothing here waits on a server).

use super::views::{refusal, NODE_CAPACITY};
use super::{now, Db, DbError, DbResult, Viewer};
use crate::alloc::{self, Candidate};
use crate::echo::quoted;
use rusqlite::{params, OptionalExtension, Transaction};
use spillway_api::*;

/// Everything the API layer decided for a new instance besides the request itself.
pub struct NewInstancePlan {
    pub req: NewInstance,
    pub pool: String,
    pub policy: Policy,
    pub stripe_size: u32,
    /// The instance secret (capabilities are signed with it; peers present it).
    pub secret: Vec<u8>,
}

fn check_name(what: &str, s: &str) -> DbResult<()> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        && !s.starts_with('.')
        && !s.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(DbError::Invalid(format!(
            "invalid {what} {}: 1 to 64 characters of A-Z a-z 0-9 _ . - (not starting with . or -)",
            quoted(s)
        )))
    }
}

/// Changes to `what` `id` need its `goal` to be still "create": one being destroyed is
/// a Conflict.
pub(super) fn still_wanted(what: &str, id: u64, goal: &str) -> DbResult<()> {
    if goal == "create" {
        Ok(())
    } else {
        Err(DbError::Conflict(format!("{what} {id} is being destroyed")))
    }
}

/// The session's owner, or NotFound / Forbidden for a viewer who may not change it
/// (`views::refusal`: NotFound, as for a missing one, if they may not even see it).
fn owned_session(tx: &Transaction, v: Viewer, id: u64) -> DbResult<(u32, String)> {
    let row: Option<(i64, String)> = tx
        .query_row(
            "SELECT owner, goal FROM sessions WHERE id = ?1",
            [id as i64],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let (owner, goal) = row.ok_or_else(|| DbError::NotFound(format!("no session {id}")))?;
    if let Viewer::User(uid) = v {
        if owner as u32 != uid {
            return Err(refusal(tx, uid, "session", id));
        }
    }
    Ok((owner as u32, goal))
}

/// Whether `v` may change `what` `id`, an object of `session`: its owner or an admin.
/// Anyone else gets `views::refusal` for the object itself (so a hidden instance answers
/// exactly as a missing instance does, not as its session).
fn owns_object(tx: &Transaction, v: Viewer, session: u64, what: &str, id: u64) -> DbResult<()> {
    let Viewer::User(uid) = v else {
        return Ok(());
    };
    let owner: Option<i64> = tx
        .query_row(
            "SELECT owner FROM sessions WHERE id = ?1",
            [session as i64],
            |r| r.get(0),
        )
        .optional()?;
    if owner.map(|o| o as u32) == Some(uid) {
        Ok(())
    } else {
        Err(refusal(tx, uid, what, id))
    }
}

/// Refuse (Conflict) a new session of `uid` when they already own `limit` sessions that
/// are not yet deleted. A session being torn down counts until its row is gone: it still
/// holds instances, fragments and the reconcile loop's work (a pending stage-out can keep
/// it for long), so a create/destroy loop must not grow the table past the limit.
fn user_session_limit(tx: &Transaction, uid: u32, limit: u32) -> DbResult<()> {
    let (held, leaving): (i64, i64) = tx.query_row(
        "SELECT COUNT(*), COALESCE(SUM(goal != 'create'), 0) FROM sessions WHERE owner = ?1",
        [uid as i64],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    if held < i64::from(limit) {
        return Ok(());
    }
    let leaving = if leaving > 0 {
        format!(" ({leaving} of them being destroyed: they count until they are gone)")
    } else {
        String::new()
    };
    Err(DbError::Conflict(format!(
        "uid {uid} already has {held} sessions{leaving}; max_sessions_per_user is {limit}: \
         destroy one first"
    )))
}

fn bump_failures_reset(
    tx: &Transaction,
    table: &str,
    cond: &str,
    arg: &dyn rusqlite::ToSql,
) -> DbResult<()> {
    tx.execute(
        &format!("UPDATE {table} SET failures = 0, last_error = NULL WHERE {cond}"),
        [arg],
    )?;
    Ok(())
}

impl Db {
    // ---------------------------------------------------------------- pools
    pub fn create_pool(&mut self, p: &NewPool) -> DbResult<Pool> {
        check_name("pool name", &p.id)?;
        if p.granularity == 0 || p.granularity > i64::MAX as u64 {
            return Err(DbError::Invalid(
                "granularity must be at least 1 byte".into(),
            ));
        }
        let units = p.units.clone().unwrap_or_else(|| "bytes".into());
        if units != "bytes" {
            return Err(DbError::Invalid(format!(
                "units {} not supported (only \"bytes\")",
                quoted(&units)
            )));
        }
        let n = self.conn().execute(
            "INSERT OR IGNORE INTO pools(id, units, granularity, created) VALUES (?1, ?2, ?3, ?4)",
            params![p.id, units, p.granularity as i64, now()],
        )?;
        if n == 0 {
            return Err(DbError::Conflict(format!("pool {} exists", quoted(&p.id))));
        }
        self.pool(&p.id)
    }

    pub fn delete_pool(&mut self, id: &str) -> DbResult<()> {
        let tx = self.conn_mut().transaction()?;
        let exists: bool = tx.query_row("SELECT COUNT(*) FROM pools WHERE id = ?1", [id], |r| {
            r.get(0)
        })?;
        if !exists {
            return Err(DbError::NotFound(format!("no pool {}", quoted(id))));
        }
        let nodes: i64 = tx.query_row("SELECT COUNT(*) FROM nodes WHERE pool = ?1", [id], |r| {
            r.get(0)
        })?;
        let insts: i64 = tx.query_row(
            "SELECT COUNT(*) FROM instances WHERE pool = ?1",
            [id],
            |r| r.get(0),
        )?;
        if nodes > 0 || insts > 0 {
            return Err(DbError::Conflict(format!(
                "pool {} still has {nodes} node(s) and {insts} instance(s)",
                quoted(id)
            )));
        }
        tx.execute("DELETE FROM pools WHERE id = ?1", [id])?;
        tx.commit()?;
        Ok(())
    }

    // ---------------------------------------------------------------- nodes
    pub fn create_node(&mut self, n: &NewNode) -> DbResult<Node> {
        check_name("node name", &n.id)?;
        check_address(&n.address)?;
        let tx = self.conn_mut().transaction()?;
        if let Some(p) = &n.pool {
            pool_exists(&tx, p)?;
        }
        let ins = tx.execute(
            "INSERT OR IGNORE INTO nodes(id, address, pool, capacity_limit, created)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                n.id,
                n.address,
                n.pool,
                n.capacity.unwrap_or(0) as i64,
                now()
            ],
        )?;
        if ins == 0 {
            return Err(DbError::Conflict(format!("node {} exists", quoted(&n.id))));
        }
        tx.commit()?;
        self.node(&n.id)
    }

    pub fn update_node(&mut self, id: &str, u: &NodeUpdate) -> DbResult<Node> {
        let tx = self.conn_mut().transaction()?;
        let exists: bool = tx.query_row("SELECT COUNT(*) FROM nodes WHERE id = ?1", [id], |r| {
            r.get(0)
        })?;
        if !exists {
            return Err(DbError::NotFound(format!("no node {}", quoted(id))));
        }
        if let Some(pool) = &u.pool {
            let live: i64 = tx.query_row(
                "SELECT COUNT(*) FROM fragments WHERE node = ?1",
                [id],
                |r| r.get(0),
            )?;
            let current: Option<String> =
                tx.query_row("SELECT pool FROM nodes WHERE id = ?1", [id], |r| r.get(0))?;
            let target = (!pool.is_empty()).then(|| pool.clone());
            if live > 0 && current != target {
                return Err(DbError::Conflict(format!(
                    "node {} holds {live} fragment(s): drain it and wait for them to go before moving it to another pool",
                    quoted(id)
                )));
            }
            if let Some(p) = &target {
                pool_exists(&tx, p)?;
            }
            tx.execute(
                "UPDATE nodes SET pool = ?2 WHERE id = ?1",
                params![id, target],
            )?;
        }
        if let Some(d) = u.drain {
            tx.execute("UPDATE nodes SET drain = ?2 WHERE id = ?1", params![id, d])?;
        }
        if let Some(c) = u.capacity {
            if c > i64::MAX as u64 {
                return Err(DbError::Invalid("capacity out of range".into()));
            }
            tx.execute(
                "UPDATE nodes SET capacity_limit = ?2 WHERE id = ?1",
                params![id, c as i64],
            )?;
        }
        if u.replace_fuse == Some(true) {
            bump_failures_reset(&tx, "fragments", "node = ?1", &id)?;
        }
        tx.commit()?;
        self.node(id)
    }

    pub fn delete_node(&mut self, id: &str) -> DbResult<()> {
        let tx = self.conn_mut().transaction()?;
        let exists: bool = tx.query_row("SELECT COUNT(*) FROM nodes WHERE id = ?1", [id], |r| {
            r.get(0)
        })?;
        if !exists {
            return Err(DbError::NotFound(format!("no node {}", quoted(id))));
        }
        let live: i64 = tx.query_row(
            "SELECT COUNT(*) FROM fragments WHERE node = ?1",
            [id],
            |r| r.get(0),
        )?;
        if live > 0 {
            return Err(DbError::Conflict(format!(
                "node {} still holds {live} fragment(s)",
                quoted(id)
            )));
        }
        tx.execute("DELETE FROM nodes WHERE id = ?1", [id])?;
        tx.commit()?;
        Ok(())
    }

    // ---------------------------------------------------------------- sessions
    pub fn create_session(
        &mut self,
        v: Viewer,
        caller_uid: u32,
        s: &NewSession,
    ) -> DbResult<Session> {
        check_name("token", &s.token)?;
        let owner = s.owner.unwrap_or(caller_uid);
        if let Viewer::User(uid) = v {
            if owner != uid {
                return Err(DbError::Forbidden(format!(
                    "only admins create sessions for another user (you are uid {uid})"
                )));
            }
        }
        let creator = s.creator.clone().unwrap_or_else(|| "CLI".into());
        // Plain characters: dwstat prints it in a column that scripts split on spaces.
        let plain = creator
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-@".contains(&b));
        if creator.is_empty() || creator.len() > 64 || !plain {
            return Err(DbError::Invalid(format!(
                "invalid creator {}",
                quoted(&creator)
            )));
        }
        for n in &s.client_nodes {
            check_name("client node", n)?;
        }
        let mut nodes = s.client_nodes.clone();
        nodes.sort();
        nodes.dedup();
        let expiration = s.expiration.unwrap_or(0);
        if expiration < 0 {
            return Err(DbError::Invalid(
                "expiration must be epoch seconds or 0".into(),
            ));
        }
        let limit = self.user_limits().sessions;
        // Immediate: the count below and the insert are one write transaction, so two
        // concurrent creates of one user (or another manager process on the same
        // database) cannot both pass the limit.
        let tx = self
            .conn_mut()
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let holder: Option<i64> = tx
            .query_row(
                "SELECT owner FROM sessions WHERE token = ?1 AND goal = 'create'",
                [&s.token],
                |r| r.get(0),
            )
            .optional()?;
        // Names are global, so the conflict must be told; whose it is need not be.
        if let Some(o) = holder {
            let whose = if v == Viewer::Admin || v == Viewer::User(o as u32) {
                format!(" (owner uid {o})")
            } else {
                String::new()
            };
            return Err(DbError::Conflict(format!(
                "token {} is in use{whose}: names of persistent instances are global",
                quoted(&s.token)
            )));
        }
        if let Viewer::User(uid) = v {
            user_session_limit(&tx, uid, limit)?;
        }
        tx.execute(
            "INSERT INTO sessions(token, owner, creator, client_nodes, created, expiration, goal, actualized)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'create', 1)",
            params![
                s.token,
                owner as i64,
                creator,
                serde_json::to_string(&nodes).unwrap_or_else(|_| "[]".into()),
                now(),
                expiration
            ],
        )?;
        let id = tx.last_insert_rowid() as u64;
        tx.commit()?;
        self.session(Viewer::Admin, id)
    }

    pub fn update_session(&mut self, v: Viewer, id: u64, u: &SessionUpdate) -> DbResult<Session> {
        let tx = self.conn_mut().transaction()?;
        let (_, goal) = owned_session(&tx, v, id)?;
        if let Some(nodes) = &u.client_nodes {
            still_wanted("session", id, &goal)?;
            for n in nodes {
                check_name("client node", n)?;
            }
            let mut nodes = nodes.clone();
            nodes.sort();
            nodes.dedup();
            tx.execute(
                "UPDATE sessions SET client_nodes = ?2 WHERE id = ?1",
                params![id as i64, serde_json::to_string(&nodes).unwrap_or_default()],
            )?;
            // Activations follow the session's nodes: new nodes get a pending mount;
            // nodes no longer listed unmount (kept until their agent reports).
            let acts: Vec<i64> = tx
                .prepare("SELECT id FROM activations WHERE session = ?1 AND goal = 'create'")?
                .query_map([id as i64], |r| r.get(0))?
                .collect::<Result<_, _>>()?;
            for a in acts {
                for n in &nodes {
                    tx.execute(
                        "INSERT OR IGNORE INTO activation_nodes(activation, node, status) VALUES (?1, ?2, 'pending')",
                        params![a, n],
                    )?;
                }
                tx.execute("UPDATE activations SET actualized = 0 WHERE id = ?1", [a])?;
            }
        }
        if u.replace_fuse == Some(true) {
            bump_failures_reset(&tx, "sessions", "id = ?1", &(id as i64))?;
            bump_failures_reset(&tx, "instances", "session = ?1", &(id as i64))?;
            bump_failures_reset(&tx, "activations", "session = ?1", &(id as i64))?;
            tx.execute(
                "UPDATE fragments SET failures = 0 WHERE instance IN (SELECT id FROM instances WHERE session = ?1)",
                [id as i64],
            )?;
            tx.execute(
                "UPDATE configurations SET failures = 0 WHERE instance IN (SELECT id FROM instances WHERE session = ?1)",
                [id as i64],
            )?;
        }
        tx.commit()?;
        self.session(Viewer::Admin, id)
    }

    /// Set the session's goal to destroy; the reconcile loop cascades it.
    pub fn destroy_session(&mut self, v: Viewer, id: u64) -> DbResult<Session> {
        let tx = self.conn_mut().transaction()?;
        owned_session(&tx, v, id)?;
        tx.execute(
            "UPDATE sessions SET goal = 'destroy', actualized = 0 WHERE id = ?1 AND goal = 'create'",
            [id as i64],
        )?;
        tx.commit()?;
        self.session(Viewer::Admin, id)
    }

    // ---------------------------------------------------------------- instances
    pub fn create_instance(&mut self, v: Viewer, plan: &NewInstancePlan) -> DbResult<Instance> {
        let req = &plan.req;
        if req.capacity == 0 {
            return Err(DbError::Invalid("capacity must be at least 1 byte".into()));
        }
        let label_given = req.label.clone();
        if let Some(l) = &label_given {
            if l.len() > 64 || l.contains(['\'', '"', '\n', '\0']) {
                return Err(DbError::Invalid(format!("invalid label {}", quoted(l))));
            }
        }
        let limits = req.limits.clone().unwrap_or_default();
        let expiration = req.expiration.unwrap_or(0);
        if expiration < 0 {
            return Err(DbError::Invalid(
                "expiration must be epoch seconds or 0".into(),
            ));
        }
        let tx = self
            .conn_mut()
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let (owner, goal) = owned_session(&tx, v, req.session)?;
        still_wanted("session", req.session, &goal)?;
        let token: String = tx.query_row(
            "SELECT token FROM sessions WHERE id = ?1",
            [req.session as i64],
            |r| r.get(0),
        )?;
        let granularity = pool_exists(&tx, &plan.pool)?;
        let granules = req.capacity.div_ceil(granularity);
        let bytes = granules
            .checked_mul(granularity)
            .filter(|b| *b <= i64::MAX as u64)
            .ok_or_else(|| DbError::Invalid("capacity out of range".into()))?;
        let candidates = candidates(&tx, &plan.pool, granularity)?;
        let placed = alloc::place(granules, &candidates, plan.policy).map_err(|short| {
            DbError::NoSpace(format!(
                "pool {:?} cannot hold {} ({} granule(s) of {}): {} free ({} granule(s) on {} usable node(s))",
                plan.pool,
                spillway_api::size::human(bytes),
                granules,
                spillway_api::size::human(granularity),
                spillway_api::size::human(short.free_granules.saturating_mul(granularity)),
                short.free_granules,
                short.usable_nodes
            ))
        })?;
        let public = req
            .public
            .unwrap_or(!token.bytes().all(|b| b.is_ascii_digit()));
        let created = now();
        tx.execute(
            "INSERT INTO instances(session, pool, bytes, requested, label, public, policy, ww_length,
                 ww_mult, stripe_size, secret, root_uid, root_gid, created, expiration, goal)
             VALUES (?1, ?2, ?3, ?4, '', ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, 'create')",
            params![
                req.session as i64,
                plan.pool,
                bytes as i64,
                req.capacity as i64,
                public,
                plan.policy.as_str(),
                limits.write_window_length as i64,
                limits.write_window_multiplier as i64,
                plan.stripe_size,
                plan.secret,
                owner as i64,
                crate::identity::primary_gid(owner) as i64,
                created,
                expiration
            ],
        )?;
        let id = tx.last_insert_rowid() as u64;
        let label = label_given.unwrap_or_else(|| format!("I{id}-0"));
        tx.execute(
            "UPDATE instances SET label = ?2 WHERE id = ?1",
            params![id as i64, label],
        )?;
        for (idx, (node, g)) in placed.iter().enumerate() {
            tx.execute(
                "INSERT INTO fragments(instance, idx, node, bytes, goal) VALUES (?1, ?2, ?3, ?4, 'create')",
                params![id as i64, idx as i64, node, (g * granularity) as i64],
            )?;
        }
        tx.execute(
            "UPDATE sessions SET actualized = 0 WHERE id = ?1",
            [req.session as i64],
        )?;
        tx.commit()?;
        self.instance(Viewer::Admin, id)
    }

    pub fn destroy_instance(&mut self, v: Viewer, id: u64) -> DbResult<Instance> {
        self.set_destroy(
            v,
            "instances",
            "SELECT session FROM instances WHERE id = ?1",
            id,
        )?;
        self.instance(Viewer::Admin, id)
    }

    /// Set the goal of row `id` of `table` to destroy, if `v` owns the session that
    /// `session_sql` (with `?1` = id) finds for it.
    fn set_destroy(&mut self, v: Viewer, table: &str, session_sql: &str, id: u64) -> DbResult<()> {
        let what = table.trim_end_matches('s');
        let tx = self.conn_mut().transaction()?;
        let session: i64 = tx
            .query_row(session_sql, [id as i64], |r| r.get(0))
            .optional()?
            .ok_or_else(|| DbError::NotFound(format!("no {what} {id}")))?;
        owns_object(&tx, v, session as u64, what, id)?;
        tx.execute(
            &format!(
                "UPDATE {table} SET goal = 'destroy', actualized = 0, failures = 0 WHERE id = ?1"
            ),
            [id as i64],
        )?;
        tx.commit()?;
        Ok(())
    }

    // ---------------------------------------------------------------- configurations
    pub fn create_configuration(
        &mut self,
        v: Viewer,
        c: &NewConfiguration,
    ) -> DbResult<Configuration> {
        let cache = cache_policy(c)?;
        let perms = c.root_permissions.unwrap_or(0o755);
        if perms > 0o7777 {
            return Err(DbError::Invalid(format!(
                "root_permissions {perms:o} is not a mode (at most 07777)"
            )));
        }
        let tx = self.conn_mut().transaction()?;
        let row: Option<(i64, String, i64, String)> = tx
            .query_row(
                "SELECT i.session, i.goal, i.root_gid, s.token
                 FROM instances i JOIN sessions s ON s.id = i.session WHERE i.id = ?1",
                [c.instance as i64],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()?;
        let (session, goal, root_gid, token) =
            row.ok_or_else(|| DbError::NotFound(format!("no instance {}", c.instance)))?;
        owns_object(&tx, v, session as u64, "instance", c.instance)?;
        // DataWarp's rule: a private namespace per compute node is for the nodes of one
        // job; a persistent instance (a named session) is shared by jobs.
        if c.access_mode == AccessMode::Private && !token.bytes().all(|b| b.is_ascii_digit()) {
            return Err(DbError::Invalid(format!(
                "access mode \"private\" is for job instances (numeric session tokens); \
                 instance {} is persistent ({token:?}): use stripe",
                c.instance
            )));
        }
        still_wanted("instance", c.instance, &goal)?;
        replicas_agree(&tx, c)?;
        let group = c.group.map(i64::from).unwrap_or(root_gid);
        tx.execute(
            "INSERT INTO configurations(instance, type, access_mode, root_permissions, grp, created, goal)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'create')",
            params![
                c.instance as i64,
                c.kind.as_str(),
                c.access_mode.as_str(),
                perms as i64,
                group,
                now()
            ],
        )?;
        let id = tx.last_insert_rowid() as u64;
        if let Some(p) = cache {
            tx.execute(
                "INSERT INTO cache_configs(configuration, pfs, modified_threshold, read_ahead,
                                           sync_on_close, sync_to_pfs)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    id as i64,
                    p.pfs,
                    p.modified_threshold as i64,
                    p.read_ahead as i64,
                    p.sync_on_close,
                    p.sync_to_pfs
                ],
            )?;
        }
        tx.commit()?;
        self.configuration(Viewer::Admin, id)
    }

    pub fn destroy_configuration(&mut self, v: Viewer, id: u64) -> DbResult<Configuration> {
        self.set_destroy(
            v,
            "configurations",
            "SELECT i.session FROM configurations c JOIN instances i ON i.id = c.instance WHERE c.id = ?1",
            id,
        )?;
        self.configuration(Viewer::Admin, id)
    }

    // ---------------------------------------------------------------- activations
    /// `mount_root`: where default mount points go, and the only place users may mount.
    pub fn create_activation(
        &mut self,
        v: Viewer,
        a: &NewActivation,
        mount_root: &str,
    ) -> DbResult<Activation> {
        let tx = self.conn_mut().transaction()?;
        let (_, goal) = owned_session(&tx, v, a.session)?;
        still_wanted("session", a.session, &goal)?;
        let row: Option<(String, i64, i64)> = tx
            .query_row(
                "SELECT c.goal, i.public, s.owner FROM configurations c
                 JOIN instances i ON i.id = c.instance JOIN sessions s ON s.id = i.session
                 WHERE c.id = ?1",
                [a.configuration as i64],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let (cgoal, public, cowner) =
            row.ok_or_else(|| DbError::NotFound(format!("no configuration {}", a.configuration)))?;
        if let Viewer::User(uid) = v {
            if public == 0 && cowner as u32 != uid {
                return Err(refusal(&tx, uid, "configuration", a.configuration));
            }
        }
        still_wanted("configuration", a.configuration, &cgoal)?;
        let dup: i64 = tx.query_row(
            "SELECT COUNT(*) FROM activations WHERE session = ?1 AND configuration = ?2 AND goal = 'create'",
            params![a.session as i64, a.configuration as i64],
            |r| r.get(0),
        )?;
        if dup > 0 {
            return Err(DbError::Conflict(format!(
                "session {} already activates configuration {}",
                a.session, a.configuration
            )));
        }
        let root = mount_root.trim_end_matches('/');
        let default = format!("{root}/s{}-c{}", a.session, a.configuration);
        let mount = match &a.mount {
            // Root (the agent) makes and mounts this directory: a user must never choose
            // where, or they pick a path that crosses their own instance (a symlink they
            // planted there) and get their files mounted over a root-owned directory.
            Some(_) if v != Viewer::Admin => {
                return Err(DbError::Forbidden(format!(
                    "only admins choose an activation's mount point: leave `mount` out                      (this one would be mounted at {default})"
                )))
            }
            Some(m) => check_mount(m, root)?,
            None => check_mount(&default, root)?,
        };
        // Never equal to, inside or above another activation's mount point while that
        // activation exists (whatever its goal: until every node has unmounted it, its
        // row stays): one mount must never hide, or be reached through, another.
        let mut st = tx.prepare("SELECT id, mount FROM activations")?;
        let others = st
            .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))?
            .collect::<Result<Vec<_>, _>>()?;
        drop(st);
        if let Some((id, other)) = others.iter().find(|(_, o)| mounts_overlap(&mount, o)) {
            let how = if *other == mount {
                "is in use by"
            } else if other.len() < mount.len() {
                "is inside the mount point of"
            } else {
                "contains the mount point of"
            };
            return Err(DbError::Conflict(format!(
                "mount point {mount} {how} activation {id} ({other})"
            )));
        }
        tx.execute(
            "INSERT INTO activations(session, configuration, mount, created, goal) VALUES (?1, ?2, ?3, ?4, 'create')",
            params![a.session as i64, a.configuration as i64, mount, now()],
        )?;
        let id = tx.last_insert_rowid();
        let nodes: String = tx.query_row(
            "SELECT client_nodes FROM sessions WHERE id = ?1",
            [a.session as i64],
            |r| r.get(0),
        )?;
        let nodes: Vec<String> = serde_json::from_str(&nodes).unwrap_or_default();
        for n in &nodes {
            tx.execute(
                "INSERT INTO activation_nodes(activation, node, status) VALUES (?1, ?2, 'pending')",
                params![id, n],
            )?;
        }
        tx.execute(
            "UPDATE sessions SET actualized = 0 WHERE id = ?1",
            [a.session as i64],
        )?;
        tx.commit()?;
        self.activation(Viewer::Admin, id as u64)
    }

    pub fn destroy_activation(&mut self, v: Viewer, id: u64) -> DbResult<Activation> {
        self.set_destroy(
            v,
            "activations",
            "SELECT session FROM activations WHERE id = ?1",
            id,
        )?;
        self.activation(Viewer::Admin, id)
    }
}

fn pool_exists(tx: &Transaction, id: &str) -> DbResult<u64> {
    tx.query_row("SELECT granularity FROM pools WHERE id = ?1", [id], |r| {
        r.get::<_, i64>(0)
    })
    .optional()?
    .map(|g| g as u64)
    .ok_or_else(|| DbError::NotFound(format!("no pool {}", quoted(id))))
}

/// Online, undrained nodes of the pool with their free granules.
fn candidates(tx: &Transaction, pool: &str, granularity: u64) -> DbResult<Vec<Candidate>> {
    let sql = format!(
        "SELECT n.id, MAX(({NODE_CAPACITY}) - COALESCE((SELECT SUM(f.bytes) FROM fragments f
                WHERE f.node = n.id), 0), 0)
         FROM nodes n WHERE n.pool = ?1 AND n.online = 1 AND n.drain = 0 ORDER BY n.id"
    );
    let mut st = tx.prepare(&sql)?;
    let rows = st
        .query_map([pool], |r| {
            Ok(Candidate {
                node: r.get(0)?,
                free_granules: r.get::<_, i64>(1)?.max(0) as u64 / granularity,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

fn check_address(a: &str) -> DbResult<()> {
    let ok = a.rsplit_once(':').is_some_and(|(h, p)| {
        !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0) && !h.contains(['/', ' '])
    });
    if ok {
        Ok(())
    } else {
        Err(DbError::Invalid(format!(
            "invalid address {}: expected host:port",
            quoted(a)
        )))
    }
}

/// A mount point the agent may make: an absolute, normalised path of plain characters
/// (no `.`, `..` or empty components) strictly below `mount_root` (compared by
/// component, so `/m` does not hold `/mx`).
fn check_mount(m: &str, mount_root: &str) -> DbResult<String> {
    let bad = || {
        DbError::Invalid(format!(
            "invalid mount point {}: an absolute path of A-Z a-z 0-9 _ . - / without . or .. components",
            quoted(m)
        ))
    };
    // Plain characters only: mount tables escape others, and the agent (root) must
    // find the mount again by its path.
    let plain = m
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"_.-/".contains(&b));
    if !m.starts_with('/') || m.len() > 1024 || !plain {
        return Err(bad());
    }
    let parts = components(m);
    if parts.is_empty()
        || parts
            .iter()
            .any(|p| p.is_empty() || *p == "." || *p == "..")
    {
        return Err(bad());
    }
    let root: Vec<&str> = components(mount_root)
        .into_iter()
        .filter(|p| !p.is_empty())
        .collect();
    if parts.len() <= root.len() || parts[..root.len()] != root[..] {
        return Err(DbError::Invalid(format!(
            "mount point {m} is not below the site's mount root {mount_root}"
        )));
    }
    Ok(m.to_string())
}

/// The components of an absolute path (`/a/b` → `a`, `b`; empty ones kept).
fn components(p: &str) -> Vec<&str> {
    p.strip_prefix('/').unwrap_or(p).split('/').collect()
}

/// Whether two checked mount points are equal or one lies below the other, by
/// component (`/m/a` and `/m/ab` do not overlap).
fn mounts_overlap(a: &str, b: &str) -> bool {
    let (a, b) = (components(a), components(b));
    let n = a.len().min(b.len());
    a[..n] == b[..n]
}

/// A load-balanced configuration makes every server of its instance hold whole
/// replicas (docs/cache.md §6), which the other access modes' placement does not
/// expect: an instance's configurations are all `ldbal` or none is (destroyed ones
/// count while the manager remembers them: the servers keep holding replicas).
fn replicas_agree(tx: &rusqlite::Transaction<'_>, c: &NewConfiguration) -> DbResult<()> {
    let modes: Vec<String> = tx
        .prepare_cached("SELECT DISTINCT access_mode FROM configurations WHERE instance = ?1")?
        .query_map([c.instance as i64], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let ldbal = AccessMode::Ldbal.as_str();
    let want = c.access_mode == AccessMode::Ldbal;
    match modes.iter().find(|m| (m.as_str() == ldbal) != want) {
        Some(other) => Err(DbError::Invalid(format!(
            "instance {} has a configuration of access mode {other:?}: a load-balanced \
             (ldbal) configuration holds whole replicas on every server and cannot share an \
             instance with {}",
            c.instance,
            if want { "another access mode" } else { "it" }
        ))),
        None => Ok(()),
    }
}

/// A cache configuration's directory and policies, defaults applied (`None` for
/// scratch); what this manager cannot build yet, refused with the reason.
pub(super) struct CacheSettings {
    pub pfs: String,
    pub modified_threshold: u64,
    pub read_ahead: u64,
    pub sync_on_close: bool,
    pub sync_to_pfs: bool,
}

fn cache_policy(c: &NewConfiguration) -> DbResult<Option<CacheSettings>> {
    let any_policy = c.modified_threshold.is_some()
        || c.read_ahead.is_some()
        || c.sync_on_close.is_some()
        || c.sync_to_pfs.is_some();
    match c.kind {
        ConfigType::Scratch => {
            if c.pfs.is_some() || any_policy {
                return Err(DbError::Invalid(
                    "pfs and the cache policies are for configurations of type cache; a scratch \
                     instance is staged instead"
                        .into(),
                ));
            }
            Ok(None)
        }
        ConfigType::Cache => {
            let Some(pfs) = &c.pfs else {
                return Err(DbError::Invalid(
                    "a configuration of type cache needs pfs: the PFS directory to cache".into(),
                ));
            };
            let p = std::path::Path::new(pfs);
            let normal = p.components().all(|x| {
                matches!(
                    x,
                    std::path::Component::RootDir | std::path::Component::Normal(_)
                )
            });
            if !p.is_absolute() || !normal || pfs.len() > 4096 || pfs.contains('\0') {
                return Err(DbError::Invalid(format!(
                    "pfs {} must be an absolute path without . or .. components",
                    crate::echo::quoted(pfs)
                )));
            }
            if c.access_mode == AccessMode::Private {
                return Err(DbError::Invalid(
                    "access mode \"private\" is not possible for a cache: a cache shows one \
                     PFS directory, which every node shares (use stripe or ldbal)"
                        .into(),
                ));
            }
            let ra = c
                .read_ahead
                .unwrap_or(spillway_api::model::cache_defaults::READ_AHEAD);
            if ra > 1 << 30 {
                return Err(DbError::Invalid(format!(
                    "read_ahead {ra} is more than 1 GiB"
                )));
            }
            let trimmed = pfs.trim_end_matches('/');
            Ok(Some(CacheSettings {
                pfs: if trimmed.is_empty() { "/" } else { trimmed }.to_string(),
                modified_threshold: c
                    .modified_threshold
                    .unwrap_or(spillway_api::model::cache_defaults::MODIFIED_THRESHOLD),
                read_ahead: ra,
                sync_on_close: c.sync_on_close.unwrap_or(false),
                sync_to_pfs: c.sync_to_pfs.unwrap_or(false),
            }))
        }
        ConfigType::Swap => Err(DbError::Invalid(format!(
            "configuration type {:?} is not supported yet (supported: scratch, cache)",
            c.kind.as_str()
        ))),
    }
}

#[cfg(test)]
mod mount_tests {
    use super::*;

    #[test]
    fn mount_points_lie_strictly_below_the_root() {
        let r = "/var/m";
        assert!(check_mount("/var/m/a", r).is_ok());
        assert!(check_mount("/var/m/batch/1_striped_scratch", r).is_ok());
        assert!(check_mount("/var/m/", "/var/m/").is_err());
        for bad in [
            "/var/m",
            "/var/mx/a",
            "/var",
            "/",
            "/etc/x",
            "var/m/a",
            "/var/m//a",
            "/var/m/./a",
            "/var/m/../a",
            "/var/m/a/..",
            "/var/m/a/",
            "/var/m/a b",
            "/var/m/\u{e9}",
        ] {
            assert!(check_mount(bad, r).is_err(), "{bad}");
        }
        assert!(check_mount("/var/m/a", "/var/m/").is_ok());
        assert!(check_mount("/x", "/").is_ok());
        assert!(check_mount("/", "/").is_err());
    }

    #[test]
    fn overlap_is_by_component() {
        assert!(mounts_overlap("/m/a", "/m/a"));
        assert!(mounts_overlap("/m/a", "/m/a/b"));
        assert!(mounts_overlap("/m/a/b/c", "/m/a"));
        assert!(!mounts_overlap("/m/a", "/m/ab"));
        assert!(!mounts_overlap("/m/ab/c", "/m/a"));
        assert!(!mounts_overlap("/m/a/b", "/m/a/c"));
    }
}
