-- Named leader leases: work there must be only one of across replicas (the machine reaper
-- and reconcile) runs on the replica holding the lease. Times are the database's clock.
CREATE TABLE leaders (
    name        text        PRIMARY KEY,
    holder      text        NOT NULL,
    epoch       bigint      NOT NULL,
    expires_at  timestamptz NOT NULL
);
