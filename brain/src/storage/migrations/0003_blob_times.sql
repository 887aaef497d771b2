-- When each blob was stored, so the mirror's collector spares what a barrier in flight has
-- uploaded but no task's log names yet.
ALTER TABLE blobs ADD COLUMN stored_at timestamptz NOT NULL DEFAULT now();
