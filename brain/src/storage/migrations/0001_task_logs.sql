-- Task logs, their snapshots and the per-task leases that fence them.

-- One row per record: the engine's event as JSON bytes; the record's envelope in columns.
CREATE TABLE events (
    task   bigint  NOT NULL,
    seq    bigint  NOT NULL CHECK (seq >= 1),
    v      integer NOT NULL,
    at_ms  bigint  NOT NULL,
    event  bytea   NOT NULL,
    PRIMARY KEY (task, seq)
);

-- The latest snapshot of a task's state, covering its records up to `upto`.
CREATE TABLE snapshots (
    task   bigint PRIMARY KEY,
    upto   bigint NOT NULL,
    state  bytea  NOT NULL
);

-- Who drives a task: the replica, the lease's epoch (raised each time the lease changes
-- hands) and when it lapses unless renewed. Times are the database's own clock.
CREATE TABLE leases (
    task        bigint      PRIMARY KEY,
    holder      text        NOT NULL,
    epoch       bigint      NOT NULL,
    expires_at  timestamptz NOT NULL
);

CREATE SEQUENCE task_ids;
