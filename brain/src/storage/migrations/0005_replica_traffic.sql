-- What replicas tell each other through the database.

-- Every statement that stores records tells the replicas listening on `tether_log` which task
-- grew and to what sequence number ("task:seq"), when its transaction commits. A replica that
-- shows the task to a watcher reads the new records then, not on a timer.
CREATE FUNCTION tether_log_appended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('tether_log', task::text || ':' || max(seq)::text)
    FROM appended GROUP BY task;
    RETURN NULL;
END
$$;

CREATE TRIGGER events_appended AFTER INSERT ON events
    REFERENCING NEW TABLE AS appended
    FOR EACH STATEMENT EXECUTE FUNCTION tether_log_appended();

-- A person's change to a task (approve, deny, cancel, move, resume, deliver) made through a
-- replica that does not drive the task, for the replica that does. Taken by one replica
-- (`taken_by`, and again by another only if the first has not answered within the grace),
-- answered once.
CREATE TABLE requests (
    id           bigserial   PRIMARY KEY,
    task         bigint      NOT NULL,
    body         bytea       NOT NULL,
    asked_by     text        NOT NULL,
    asked_at     timestamptz NOT NULL DEFAULT now(),
    taken_by     text,
    taken_at     timestamptz,
    answer       bytea,
    answered_at  timestamptz
);
CREATE INDEX requests_open ON requests (task) WHERE answer IS NULL;

-- Tasks a replica shows to watchers while another replica drives them: the driving replica
-- sends their live output (not logged) on `tether_live` while a row here is unexpired.
CREATE TABLE watches (
    task     bigint      NOT NULL,
    replica  text        NOT NULL,
    until    timestamptz NOT NULL,
    PRIMARY KEY (task, replica)
);

-- The replicas on this store: the protocol each speaks to the others (the requests, answers
-- and notifications above) and the oldest it still understands, its brain's version, and
-- when it last said it was alive. A replica that could not talk with a live one refuses to
-- start, naming which to upgrade.
CREATE TABLE replicas (
    name      text        PRIMARY KEY,
    protocol  integer     NOT NULL,
    oldest    integer     NOT NULL,
    version   text        NOT NULL,
    seen_at   timestamptz NOT NULL
);

-- Which replica each connected worker's session is on (a worker has one session at a time;
-- the replica it connected to last writes the row). A task follows its worker: the replica
-- holding the worker's session drives the worker's tasks.
CREATE TABLE sessions (
    worker   text        PRIMARY KEY,
    replica  text        NOT NULL,
    since    timestamptz NOT NULL DEFAULT now()
);
