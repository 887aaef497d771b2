-- The brain's named key-value trees (registry, web credentials, sealed secrets, machines,
-- manifests), and the mirror's content blobs, addressed by their hash and stored once.

CREATE TABLE kv (
    tree   text  NOT NULL,
    key    bytea NOT NULL,
    value  bytea NOT NULL,
    PRIMARY KEY (tree, key)
);

CREATE TABLE blobs (
    hash  text  PRIMARY KEY,
    data  bytea NOT NULL
);
