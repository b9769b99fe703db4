//! The manager's SQLite schema (WAL). Version 1. Every object row carries `goal`
//! (`create`/`destroy`), `actualized`, a consecutive-failure count (the fuse) and the
//! last error; rows are deleted once a destroy goal is reached.

pub(super) const VERSION: i64 = 1;

pub(super) const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS pools (
    id          TEXT PRIMARY KEY,
    units       TEXT NOT NULL,
    granularity INTEGER NOT NULL CHECK (granularity > 0),
    created     INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS nodes (
    id                TEXT PRIMARY KEY,
    address           TEXT NOT NULL,
    pool              TEXT REFERENCES pools(id),
    drain             INTEGER NOT NULL DEFAULT 0,
    capacity_limit    INTEGER NOT NULL DEFAULT 0,
    reported_capacity INTEGER NOT NULL DEFAULT 0,
    online            INTEGER NOT NULL DEFAULT 0,
    health            TEXT NOT NULL DEFAULT 'unknown',
    last_heartbeat    INTEGER NOT NULL DEFAULT 0,
    created           INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    token        TEXT NOT NULL,
    owner        INTEGER NOT NULL,
    creator      TEXT NOT NULL,
    client_nodes TEXT NOT NULL,
    created      INTEGER NOT NULL,
    expiration   INTEGER NOT NULL,
    goal         TEXT NOT NULL,
    actualized   INTEGER NOT NULL DEFAULT 0,
    failures     INTEGER NOT NULL DEFAULT 0,
    last_error   TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS sessions_live_token ON sessions(token) WHERE goal = 'create';
CREATE TABLE IF NOT EXISTS instances (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    session     INTEGER NOT NULL REFERENCES sessions(id),
    pool        TEXT NOT NULL,
    bytes       INTEGER NOT NULL,
    requested   INTEGER NOT NULL,
    label       TEXT NOT NULL,
    public      INTEGER NOT NULL,
    policy      TEXT NOT NULL,
    ww_length   INTEGER NOT NULL,
    ww_mult     INTEGER NOT NULL,
    stripe_size INTEGER NOT NULL,
    secret      BLOB NOT NULL,
    root_uid    INTEGER NOT NULL,
    root_gid    INTEGER NOT NULL,
    created     INTEGER NOT NULL,
    expiration  INTEGER NOT NULL,
    goal        TEXT NOT NULL,
    actualized  INTEGER NOT NULL DEFAULT 0,
    failures    INTEGER NOT NULL DEFAULT 0,
    last_error  TEXT
);
CREATE TABLE IF NOT EXISTS fragments (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    instance   INTEGER NOT NULL REFERENCES instances(id),
    idx        INTEGER NOT NULL,
    node       TEXT NOT NULL REFERENCES nodes(id),
    bytes      INTEGER NOT NULL,
    goal       TEXT NOT NULL,
    actualized INTEGER NOT NULL DEFAULT 0,
    failures   INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    UNIQUE (instance, idx)
);
CREATE INDEX IF NOT EXISTS fragments_node ON fragments(node);
CREATE TABLE IF NOT EXISTS configurations (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    instance         INTEGER NOT NULL REFERENCES instances(id),
    type             TEXT NOT NULL,
    access_mode      TEXT NOT NULL,
    root_permissions INTEGER NOT NULL,
    grp              INTEGER NOT NULL,
    created          INTEGER NOT NULL,
    goal             TEXT NOT NULL,
    actualized       INTEGER NOT NULL DEFAULT 0,
    failures         INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT
);
CREATE TABLE IF NOT EXISTS activations (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    session       INTEGER NOT NULL REFERENCES sessions(id),
    configuration INTEGER NOT NULL REFERENCES configurations(id),
    mount         TEXT NOT NULL,
    created       INTEGER NOT NULL,
    goal          TEXT NOT NULL,
    actualized    INTEGER NOT NULL DEFAULT 0,
    failures      INTEGER NOT NULL DEFAULT 0,
    last_error    TEXT
);
CREATE TABLE IF NOT EXISTS activation_nodes (
    activation INTEGER NOT NULL REFERENCES activations(id),
    node       TEXT NOT NULL,
    status     TEXT NOT NULL,
    error      TEXT,
    PRIMARY KEY (activation, node)
);
CREATE TABLE IF NOT EXISTS agents (
    id        TEXT PRIMARY KEY,
    addresses TEXT NOT NULL,
    last_seen INTEGER NOT NULL
);
-- Staging (docs/staging.md). A stage outlives its instance's row (its final state stays
-- readable for a day), so `instance` is not a foreign key.
CREATE TABLE IF NOT EXISTS stages (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    instance      INTEGER NOT NULL,
    session       INTEGER NOT NULL,
    owner         INTEGER NOT NULL,
    direction     TEXT NOT NULL,
    type          TEXT NOT NULL,
    run_when      TEXT NOT NULL,
    source        TEXT NOT NULL,
    destination   TEXT NOT NULL,
    pairs         TEXT NOT NULL,
    state         TEXT NOT NULL,
    files_total   INTEGER NOT NULL DEFAULT 0,
    files_done    INTEGER NOT NULL DEFAULT 0,
    files_failed  INTEGER NOT NULL DEFAULT 0,
    bytes_total   INTEGER NOT NULL DEFAULT 0,
    bytes_done    INTEGER NOT NULL DEFAULT 0,
    enumerated    INTEGER NOT NULL DEFAULT 0,
    error_path    TEXT,
    error_errno   INTEGER,
    error_message TEXT,
    server        TEXT,
    -- the coordinator holds the stage (started there and not yet forgotten or lost)
    live          INTEGER NOT NULL DEFAULT 0,
    -- a cancel is to be sent to the coordinator (terminate, or a drop by hurry)
    cancel        INTEGER NOT NULL DEFAULT 0,
    -- where the watcher's next progress request starts
    cursor        INTEGER NOT NULL DEFAULT 0,
    created       INTEGER NOT NULL,
    started       INTEGER NOT NULL DEFAULT 0,
    finished      INTEGER NOT NULL DEFAULT 0
);
-- A list stage's pairs (`stages.pairs` is then `[]`), stored once, front-coded
-- (`db/stages/lists.rs`), and their count: max_stage_pairs_per_user adds them up.
-- Written with the stage and never updated (an update of a `stages` row rewrites it
-- whole), deleted with it.
CREATE TABLE IF NOT EXISTS stage_lists (
    stage INTEGER PRIMARY KEY,
    count INTEGER NOT NULL,
    list  BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS stages_instance ON stages(instance, state);
CREATE INDEX IF NOT EXISTS stages_state ON stages(state);
-- max_stages_per_user counts a user's unended stages at every post.
CREATE INDEX IF NOT EXISTS stages_owner ON stages(owner, state);
-- One record per file a stage enumerated: (instance, path) -> state; a newer stage of a
-- path replaces the older record.
CREATE TABLE IF NOT EXISTS stage_files (
    instance INTEGER NOT NULL,
    path     TEXT NOT NULL,
    stage    INTEGER NOT NULL,
    state    TEXT NOT NULL,
    errno    INTEGER NOT NULL DEFAULT 0,
    message  TEXT NOT NULL DEFAULT '',
    bytes    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (instance, path)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS stage_files_stage ON stage_files(stage);
-- A configuration of type cache: the PFS directory it caches and its policies, with
-- the defaults applied (docs/cache.md). A row goes with its configuration.
CREATE TABLE IF NOT EXISTS cache_configs (
    configuration      INTEGER PRIMARY KEY,
    pfs                TEXT NOT NULL,
    modified_threshold INTEGER NOT NULL,
    read_ahead         INTEGER NOT NULL,
    sync_on_close      INTEGER NOT NULL,
    sync_to_pfs        INTEGER NOT NULL
);
-- Per-instance stage concurrency (absent: the site default), already clamped.
CREATE TABLE IF NOT EXISTS stage_limits (
    instance    INTEGER PRIMARY KEY,
    concurrency INTEGER NOT NULL
);
"#;
